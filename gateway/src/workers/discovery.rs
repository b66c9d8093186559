//! Model discovery: what model a worker serves, asked of the worker itself.
//!
//! `GET /v1/models` first (its first `data[].id` is the name clients send); if that fails,
//! `GET /get_model_info` (`served_model_name`, else `model_path`).

use std::time::Duration;

use serde::Deserialize;

use super::Worker;
use crate::client::HttpClient;

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
}

#[derive(Deserialize)]
struct ModelInfo {
    #[serde(default)]
    served_model_name: Option<String>,
    #[serde(default)]
    model_path: Option<String>,
}

/// Asks `worker` which model it serves. Errors name both attempts.
pub async fn discover(
    client: &HttpClient,
    worker: &Worker,
    timeout: Duration,
) -> Result<String, String> {
    let bearer = worker.bearer();
    let get = |path: &'static str| {
        let uri = worker.url().join(path);
        let bearer = bearer.clone();
        async move {
            let uri = uri.map_err(|e| e.to_string())?;
            let (status, body) = client.get_small(uri, bearer.as_deref(), timeout).await?;
            if !status.is_success() {
                return Err(format!("{path} answered {status}"));
            }
            Ok(body)
        }
    };
    let first = match get("/v1/models").await {
        Ok(body) => match serde_json::from_slice::<ModelList>(&body) {
            Ok(list) => match list.data.into_iter().next() {
                Some(m) => return Ok(m.id),
                None => "/v1/models lists no model".to_string(),
            },
            Err(e) => format!("/v1/models: {e}"),
        },
        Err(e) => e,
    };
    let second = match get("/get_model_info").await {
        Ok(body) => match serde_json::from_slice::<ModelInfo>(&body) {
            Ok(info) => match info.served_model_name.or(info.model_path) {
                Some(m) => return Ok(m),
                None => "/get_model_info names no model".to_string(),
            },
            Err(e) => format!("/get_model_info: {e}"),
        },
        Err(e) => e,
    };
    Err(format!("{first}; {second}"))
}
