//! Model discovery: what model a worker serves, asked of the worker itself; with
//! `--dp-aware`, how many data-parallel ranks it runs ([`dp_size`]).
//!
//! `GET /v1/models` first (its first `data[].id` is the served name clients send); if that
//! fails, `GET /get_model_info` (`model_path`).

use std::time::Duration;

use openapi::openai::ModelList;
use openapi::sglang::server::{ModelInfo, ServerInfo};

use super::Worker;
use crate::client::HttpClient;

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
            Ok(info) if !info.model_path.is_empty() => return Ok(info.model_path),
            Ok(_) => "/get_model_info names no model".to_string(),
            Err(e) => format!("/get_model_info: {e}"),
        },
        Err(e) => e,
    };
    Err(format!("{first}; {second}"))
}

/// Asks `worker` how many data-parallel ranks it runs (`dp_size` of SGLang's
/// `/get_server_info`; absent means one).
pub async fn dp_size(
    client: &HttpClient,
    worker: &Worker,
    timeout: Duration,
) -> Result<u32, String> {
    let uri = worker
        .url()
        .join("/get_server_info")
        .map_err(|e| e.to_string())?;
    let (status, body) = client
        .get_small(uri, worker.bearer().as_deref(), timeout)
        .await?;
    if !status.is_success() {
        return Err(format!("/get_server_info answered {status}"));
    }
    let info: ServerInfo =
        serde_json::from_slice(&body).map_err(|e| format!("/get_server_info: {e}"))?;
    match info.dp_size {
        None => Ok(1),
        Some(0) => Err("/get_server_info says dp_size 0".into()),
        Some(n) if n > MAX_DP_SIZE => Err(format!(
            "/get_server_info says dp_size {n}, over the {MAX_DP_SIZE} ranks a worker may have"
        )),
        Some(n) => Ok(n),
    }
}

/// The most data-parallel ranks one worker may report: each becomes a registry entry,
/// so a worker's answer must not size the registry without a bound.
pub const MAX_DP_SIZE: u32 = 1024;
