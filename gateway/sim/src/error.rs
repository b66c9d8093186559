//! Errors of the simulated worker, rendered the way SGLang renders them: the OpenAI routes
//! answer `{"object": "error", "message", "type", "param", "code"}`, `/generate` answers
//! `{"error": {"message"}}`, unknown paths `{"detail": "Not Found"}`.

use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use openapi::sglang::server::{ErrorResponse, GenerateError};
use serde::Serialize;

/// What went wrong with a request.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The body is not valid JSON or not the expected shape.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// The request parses but asks for something invalid.
    #[error("{0}")]
    BadRequest(String),
    /// PD: the KV could not be moved (the other side failed, or is gone).
    #[error("KV transfer failed: {0}")]
    Kv(String),
}

impl From<sglang::tokenizer::TokenizerError> for SimError {
    fn from(e: sglang::tokenizer::TokenizerError) -> Self {
        SimError::BadRequest(e.to_string())
    }
}

impl SimError {
    /// The HTTP status: 400 for the client's faults, 500 for a failed KV transfer.
    pub fn status(&self) -> StatusCode {
        match self {
            SimError::Kv(_) => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The error as SGLang's OpenAI routes answer it.
    pub fn openai(self) -> Response {
        let status = self.status();
        let mut body = ErrorResponse::bad_request(self.to_string());
        body.code = status.as_u16();
        if status.is_server_error() {
            body.kind = "InternalServerError".to_owned();
        }
        json(status, &body)
    }

    /// The error as SGLang's `/generate` answers it.
    pub fn generate(self) -> Response {
        json(self.status(), &GenerateError::new(self.to_string()))
    }
}

/// A JSON response with `status`.
pub fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => json_bytes(status, bytes),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A response with `status` whose body is already serialized JSON.
pub fn json_bytes(status: StatusCode, bytes: Vec<u8>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        Bytes::from(bytes),
    )
        .into_response()
}

/// FastAPI's answer to an unknown path (logged at debug: shows what a router probes).
pub async fn not_found(method: Method, uri: Uri) -> Response {
    tracing::debug!(%method, path = uri.path(), "unknown path");
    detail(StatusCode::NOT_FOUND, "Not Found")
}

/// FastAPI's answer to a known path with the wrong method.
pub async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    tracing::debug!(%method, path = uri.path(), "method not allowed");
    detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
}

fn detail(status: StatusCode, msg: &'static str) -> Response {
    #[derive(Serialize)]
    struct Detail {
        detail: &'static str,
    }
    json(status, &Detail { detail: msg })
}
