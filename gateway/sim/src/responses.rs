//! The Responses API as an SGLang worker serves it: `POST /v1/responses` (JSON, or server-
//! sent `event:`/`data:` events from `response.created` to `response.completed`), and a
//! stored response's `GET`, `DELETE`, `cancel` and `input_items`. Responses live in this
//! worker's memory only (as SGLang's do), so a follow-up that names a
//! `previous_response_id` must reach this worker: a gateway that sends it elsewhere gets
//! a 404.
//!
//! With `background: true` the answer is `queued` at once and the response completes
//! after `--ttft` (it can be cancelled meanwhile). The store keeps at most
//! [`super::response_store::MAX_STORED`] responses, the oldest dropped first.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::error::json as json_response;
use super::model;
use super::response_store::Stored;
use super::state::{SimState, unix_now};

/// Words in an answer.
const ANSWER_WORDS: usize = 8;

/// An error in the Responses API's shape (`{"error": {...}}`).
fn error(status: StatusCode, message: &str, param: Option<&str>) -> Response {
    json_response(
        status,
        &json!({"error": {"message": message, "type": "invalid_request_error",
            "param": param, "code": null}}),
    )
}

fn not_found(id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("Response with id '{id}' not found."),
        Some("response_id"),
    )
}

/// The input as a list of items.
fn items_of(input: &Value) -> Vec<Value> {
    match input {
        Value::String(s) => vec![json!({"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": s}]})],
        Value::Array(a) => a.clone(),
        other => vec![other.clone()],
    }
}

/// The answer's words: a function of the whole conversation's text.
fn answer_text(conversation: &str) -> String {
    let mut g = model::Generator::new(model::hash_bytes(17, conversation.as_bytes()), None, 0);
    (0..ANSWER_WORDS)
        .map(|_| model::static_text(g.next_word().id))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `POST /v1/responses`.
pub async fn create(State(st): State<Arc<SimState>>, body: Bytes) -> Response {
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return error(StatusCode::BAD_REQUEST, "body must be a JSON object", None),
    };
    if req.get("input").is_none_or(Value::is_null) {
        return error(StatusCode::BAD_REQUEST, "input is required", Some("input"));
    }
    let mut conversation = String::new();
    let mut input = Vec::new();
    if let Some(prev) = req["previous_response_id"].as_str() {
        let store = st.responses.lock();
        let Some(p) = store.by_id.get(prev) else {
            return not_found(prev);
        };
        conversation.push_str(&p.object.to_string());
        input.extend(p.input.iter().cloned());
    }
    input.extend(items_of(&req["input"]));
    conversation.push_str(&req["input"].to_string());
    let id = format!("resp_{}", st.new_id().replace('-', ""));
    let text = answer_text(&conversation);
    let background = req["background"].as_bool().unwrap_or(false);
    let stored = req["store"].as_bool().unwrap_or(true) || background;
    let status = if background { "queued" } else { "completed" };
    let words = text.split(' ').count();
    let object = json!({
        "id": id, "object": "response", "created_at": unix_now(), "status": status,
        "model": req["model"].as_str().unwrap_or(&st.cfg.model),
        "previous_response_id": req["previous_response_id"],
        "output": [{"type": "message", "id": format!("msg_{}", &id[5..]), "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "text": text}]}],
        "usage": {"input_tokens": conversation.len() / 4, "output_tokens": words,
            "total_tokens": conversation.len() / 4 + words},
    });
    if stored {
        st.responses.lock().put(
            id.clone(),
            Stored {
                object: object.clone(),
                input,
            },
        );
    }
    if background {
        let (st, id) = (st.clone(), id.clone());
        tokio::spawn(async move {
            tokio::time::sleep(st.cfg.ttft).await;
            if let Some(s) = st.responses.lock().by_id.get_mut(&id)
                && s.object["status"] == "queued"
            {
                s.object["status"] = json!("completed");
            }
        });
    }
    if req["stream"].as_bool().unwrap_or(false) {
        return stream(&object, &text);
    }
    json_response(StatusCode::OK, &object)
}

/// The events of a streamed answer.
fn stream(object: &Value, text: &str) -> Response {
    let mut first = object.clone();
    first["status"] = json!("in_progress");
    first["output"] = json!([]);
    let mut events = vec![
        json!({"type": "response.created", "sequence_number": 0, "response": first}),
        json!({"type": "response.in_progress", "sequence_number": 1, "response": first}),
    ];
    for (i, w) in text.split(' ').enumerate() {
        let delta = if i == 0 {
            w.to_string()
        } else {
            format!(" {w}")
        };
        events.push(json!({"type": "response.output_text.delta",
            "sequence_number": events.len(), "output_index": 0, "content_index": 0,
            "delta": delta}));
    }
    events.push(
        json!({"type": "response.completed", "sequence_number": events.len(),
        "response": object}),
    );
    let mut body = String::new();
    for e in events {
        body.push_str(&format!(
            "event: {}\ndata: {e}\n\n",
            e["type"].as_str().unwrap_or("")
        ));
    }
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from(body))
        .unwrap_or_default()
}

/// `GET /v1/responses/{id}`.
pub async fn get(State(st): State<Arc<SimState>>, Path(id): Path<String>) -> Response {
    match st.responses.lock().by_id.get(&id) {
        Some(s) => json_response(StatusCode::OK, &s.object),
        None => not_found(&id),
    }
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(State(st): State<Arc<SimState>>, Path(id): Path<String>) -> Response {
    let removed = st.responses.lock().remove(&id);
    match removed {
        true => json_response(
            StatusCode::OK,
            &json!({"id": id, "object": "response.deleted", "deleted": true}),
        ),
        false => not_found(&id),
    }
}

/// `POST /v1/responses/{id}/cancel`.
pub async fn cancel(State(st): State<Arc<SimState>>, Path(id): Path<String>) -> Response {
    let mut store = st.responses.lock();
    let Some(s) = store.by_id.get_mut(&id) else {
        return not_found(&id);
    };
    if !matches!(s.object["status"].as_str(), Some("queued" | "in_progress")) {
        return error(
            StatusCode::BAD_REQUEST,
            "Cannot cancel a synchronous response.",
            None,
        );
    }
    s.object["status"] = json!("cancelled");
    json_response(StatusCode::OK, &s.object)
}

/// `GET /v1/responses/{id}/input_items`.
pub async fn input_items(State(st): State<Arc<SimState>>, Path(id): Path<String>) -> Response {
    match st.responses.lock().by_id.get(&id) {
        Some(s) => json_response(
            StatusCode::OK,
            &json!({"object": "list", "data": s.input, "has_more": false}),
        ),
        None => not_found(&id),
    }
}
