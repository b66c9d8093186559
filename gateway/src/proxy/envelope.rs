//! A worker's error answer in the OpenAI envelope, so every error the gateway relays has the
//! documented shape `{"error":{"message","type","code"}}`, with the worker's status and
//! message kept.
//!
//! What workers send (SGLang's shapes first):
//! - `{"error": {"message": ...}}` (SGLang's `/generate` and other native routes), or any
//!   `error` object lacking `type` or `code`; `{"error": "..."}`;
//! - `{"object": "error", "message", "type", "param", "code": 400}` (SGLang's OpenAI
//!   routes: `ErrorResponse`);
//! - `{"detail": "..."}` or `{"detail": [...]}` (FastAPI's own errors);
//! - any other JSON (`{"message": ...}`, ...), plain text, or nothing.
//!
//! The message is the worker's (its text, or the JSON it sent when there is no message),
//! the type the worker's own when it gave one as a string, else the class of the status;
//! the code the worker's when it is a string, else named after the status
//! ([`crate::error::status_kind`]). An answer already in the envelope is relayed byte for
//! byte. A streamed answer (`text/event-stream`) is never touched: its errors are events.
//! Only the first [`MAX_ERROR_BODY`] bytes of an error answer are held (the rest is dropped).

use http::{HeaderMap, StatusCode, header};
use openapi::error::ErrorResponse;
use serde_json::Value;

use super::body::{Overflow, Whole};
use crate::error::status_kind;

/// The most of a worker's error answer the gateway holds to wrap it.
pub const MAX_ERROR_BODY: usize = 64 * 1024;

/// Whether an answer with `status` and `headers` is an error to put into the envelope: a
/// 4xx or 5xx that is not an event stream.
pub fn needs_wrapping(status: StatusCode, headers: &HeaderMap) -> bool {
    let sse = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().starts_with("text/event-stream"));
    (status.is_client_error() || status.is_server_error()) && !sse
}

/// The rewrite that wraps an error answer with `status` (see the module doc).
pub fn rewrite(status: StatusCode) -> Whole<impl FnOnce(&[u8]) -> Option<Vec<u8>> + Send> {
    Whole::new(MAX_ERROR_BODY, Overflow::Truncate, move |body: &[u8]| {
        wrap(status, body)
    })
}

/// The envelope for the error answer `body` with `status`; `None` when it is one already.
pub fn wrap(status: StatusCode, body: &[u8]) -> Option<Vec<u8>> {
    let parsed = serde_json::from_slice::<Value>(body).ok();
    if parsed.as_ref().is_some_and(is_envelope) {
        return None;
    }
    let (kind, code) = status_kind(status);
    let mut env = ErrorResponse::new(String::new(), kind, code);
    match parsed {
        Some(v) => {
            let (message, kind, code) = parts_of(&v);
            env.error.message = message.unwrap_or_else(|| compact(&v));
            if let Some(k) = kind {
                env.error.kind = k.to_owned();
            }
            if let Some(c) = code {
                env.error.code = Some(c.to_owned());
            }
        }
        None => env.error.message = String::from_utf8_lossy(body).trim().to_owned(),
    }
    if env.error.message.is_empty() {
        env.error.message = format!(
            "the worker answered {} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        )
        .trim_end()
        .to_owned();
    }
    serde_json::to_vec(&env).ok()
}

/// Whether `v` is the envelope: an `error` object with a string `message`, a string `type`,
/// and a `code` that is a string or `null`.
fn is_envelope(v: &Value) -> bool {
    let Some(e) = v.get("error").and_then(Value::as_object) else {
        return false;
    };
    e.get("message").is_some_and(Value::is_string)
        && e.get("type").is_some_and(Value::is_string)
        && e.get("code").is_some_and(|c| c.is_string() || c.is_null())
}

/// The message, type and code a worker's JSON error gives, where it gives them.
fn parts_of(v: &Value) -> (Option<String>, Option<&str>, Option<&str>) {
    let Some(obj) = v.as_object() else {
        return (v.as_str().map(str::to_owned), None, None);
    };
    // `{"error": {...}}`, `{"error": "..."}`, or the fields at the top (`object: error`).
    let inner = match obj.get("error") {
        Some(Value::Object(e)) => e,
        Some(Value::String(s)) => return (Some(s.clone()), None, None),
        _ => obj,
    };
    let text = |k: &str| inner.get(k).and_then(Value::as_str);
    let message = text("message")
        .map(str::to_owned)
        .or_else(|| match obj.get("detail") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(d @ (Value::Array(_) | Value::Object(_))) => Some(compact(d)),
            _ => None,
        });
    (message, text("type"), text("code"))
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A worker's small JSON answer, relayed: its status and body, an error put into the
/// envelope like every other.
pub fn small_answer(status: http::StatusCode, body: bytes::Bytes) -> axum::response::Response {
    let body = match status.is_success() {
        true => body,
        false => wrap(status, &body).map_or(body, bytes::Bytes::from),
    };
    let mut resp = axum::response::Response::new(axum::body::Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::body::Rewrite;
    use serde_json::json;

    fn wrapped(status: u16, body: &[u8]) -> Value {
        let out = wrap(StatusCode::from_u16(status).unwrap(), body).expect("wrapped");
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn sglang_and_other_shapes_become_the_envelope() {
        assert_eq!(
            wrapped(400, br#"{"error":{"message":"prompt too long"}}"#),
            json!({"error": {"message": "prompt too long", "type": "invalid_request_error", "code": "bad_request"}})
        );
        assert_eq!(
            wrapped(
                400,
                br#"{"object":"error","message":"n must be positive","type":"BadRequestError","param":null,"code":400}"#
            ),
            json!({"error": {"message": "n must be positive", "type": "BadRequestError", "code": "bad_request"}})
        );
        assert_eq!(
            wrapped(422, br#"{"detail":[{"loc":["body","n"],"msg":"bad"}]}"#)["error"]["message"],
            r#"[{"loc":["body","n"],"msg":"bad"}]"#
        );
        assert_eq!(
            wrapped(404, br#"{"detail":"Not Found"}"#)["error"],
            json!({"message": "Not Found", "type": "not_found_error", "code": "not_found"})
        );
        assert_eq!(
            wrapped(500, b"Internal Server Error\n")["error"],
            json!({"message": "Internal Server Error", "type": "server_error", "code": "internal_server_error"})
        );
        assert_eq!(
            wrapped(503, b"")["error"]["message"],
            "the worker answered 503 Service Unavailable"
        );
        assert_eq!(
            wrapped(429, br#"{"error":"slow down"}"#)["error"]["type"],
            "rate_limit_error"
        );
        assert_eq!(wrapped(400, br#"[1,2]"#)["error"]["message"], "[1,2]");
        assert_eq!(
            wrapped(400, br#"{"error":{"message":"m","code":"x_code"}}"#)["error"]["code"],
            "x_code"
        );
    }

    #[test]
    fn an_envelope_is_left_alone_and_streams_are_never_touched() {
        let env = br#"{"error":{"message":"m","type":"t","code":null},"extra":1}"#;
        assert_eq!(wrap(StatusCode::BAD_REQUEST, env), None);
        let mut h = HeaderMap::new();
        assert!(needs_wrapping(StatusCode::BAD_GATEWAY, &h));
        assert!(!needs_wrapping(StatusCode::OK, &h));
        h.insert(
            header::CONTENT_TYPE,
            "text/event-stream; charset=utf-8".parse().unwrap(),
        );
        assert!(!needs_wrapping(StatusCode::BAD_REQUEST, &h));
    }

    #[test]
    fn a_huge_error_body_is_cut_not_held() {
        let mut rw = rewrite(StatusCode::INTERNAL_SERVER_ERROR);
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..8 {
            assert!(rw.push(&chunk).is_empty());
        }
        let out: Value = serde_json::from_slice(&rw.finish()).unwrap();
        assert_eq!(
            out["error"]["message"].as_str().unwrap().len(),
            MAX_ERROR_BODY
        );
    }
}
