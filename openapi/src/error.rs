//! The OpenAI error envelope: the body of every error response Moongate's HTTP side sends.
//!
//! ```json
//! {"error": {"message": "no worker serves model 'x'", "type": "not_found_error", "code": "model_not_found"}}
//! ```

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An error response body, shaped like OpenAI's: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorResponse {
    /// What went wrong.
    pub error: ErrorBody,
}

/// The inside of [`ErrorResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// A human-readable message, safe to show to the client (no internal details).
    pub message: String,
    /// The error class, e.g. `invalid_request_error`, `not_found_error`, `server_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A stable machine-readable code, e.g. `model_not_found`, `no_ready_worker`.
    pub code: Option<String>,
}

impl ErrorResponse {
    /// Builds an envelope from its three parts.
    pub fn new(
        message: impl Into<String>,
        kind: impl Into<String>,
        code: impl Into<String>,
    ) -> Self {
        Self {
            error: ErrorBody {
                message: message.into(),
                kind: kind.into(),
                code: Some(code.into()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_in_openai_shape() {
        let e = ErrorResponse::new("bad", "invalid_request_error", "invalid_json");
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"error":{"message":"bad","type":"invalid_request_error","code":"invalid_json"}}"#
        );
        let back: ErrorResponse =
            serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(back, e);
    }
}
