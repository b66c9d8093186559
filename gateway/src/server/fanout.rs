//! Routes that ask every worker (or one pair) and answer for all of them, as sglang-router
//! and smg serve them: `POST /flush_cache`, `GET /get_loads`, `GET /engine_metrics`,
//! `POST /start_profile`, `POST /stop_profile` (admin plane) and `GET /health_generate`
//! (client plane).
//!
//! Workers are asked at most [`FAN_OUT`] at a time, each call within
//! `--health-check-timeout-secs` and with the worker's own key; what a worker answers is
//! read up to a bound ([`LOAD_LIMIT`], [`METRICS_LIMIT`]), so a worker cannot make the
//! gateway hold more than that per call, and `/engine_metrics` keeps at most
//! [`METRICS_TOTAL_LIMIT`] of all answers together. Each worker is asked once, however
//! many data-parallel ranks `--dp-aware` lists it with.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, Method, StatusCode, header};
use openapi::error::ErrorResponse;
use openapi::sglang::server::LoadReport;
use openapi::workers::{
    FanOutFailure, FlushCacheResult, ProfileRequest, ProfileResult, WorkerLoad, WorkerLoads,
    WorkerType,
};

use super::AppState;
use super::exposition;
use crate::client::Call;
use crate::error::{GatewayError, PdSide};
use crate::workers::Worker;

/// Workers asked at once.
pub const FAN_OUT: usize = 32;
/// The most of a worker's `/get_load` answer read (its ranks' entries).
pub const LOAD_LIMIT: usize = 1024 * 1024;
/// The most of a worker's `/metrics` answer read (an SGLang worker's is tens of KiB).
pub const METRICS_LIMIT: usize = 4 * 1024 * 1024;
/// The most `/engine_metrics` holds of all workers' answers together: the workers beyond
/// it are left out (and logged), so a large fleet cannot make one scrape hold gigabytes.
pub const METRICS_TOTAL_LIMIT: usize = 64 * 1024 * 1024;

/// What one worker answered a fan-out call: its status and body, or why not.
pub(super) type Answer = Result<(StatusCode, Bytes), String>;

/// Calls `method path` on each of `workers` ([`FAN_OUT`] at a time), in their order.
async fn ask_all(
    st: &AppState,
    workers: &[Arc<Worker>],
    method: Method,
    path: &'static str,
    body: Bytes,
    limit: usize,
) -> Vec<Answer> {
    asking(st, workers, method, path, body, limit)
        .collect()
        .await
}

/// [`ask_all`]'s answers as they come, in the workers' order, for a caller that may stop
/// early (at most [`FAN_OUT`] calls are in flight).
pub(super) fn asking(
    st: &AppState,
    workers: &[Arc<Worker>],
    method: Method,
    path: &str,
    body: Bytes,
    limit: usize,
) -> impl futures::Stream<Item = Answer> + use<> {
    let timeout = Duration::from_secs(st.config().health_check_timeout_secs);
    let path: Arc<str> = path.into();
    let calls: Vec<_> = workers
        .iter()
        .map(|w| {
            let (st, w, method, body) = (st.clone(), w.clone(), method.clone(), body.clone());
            let path = path.clone();
            async move { ask(&st, &w, method, &path, body, timeout, limit).await }
        })
        .collect();
    futures::stream::iter(calls).buffered(FAN_OUT)
}

/// Calls `method path` on `worker` with its key (and `body`, JSON, when not empty).
pub(super) async fn ask(
    st: &AppState,
    worker: &Worker,
    method: Method,
    path: &str,
    body: Bytes,
    timeout: Duration,
    limit: usize,
) -> Answer {
    let uri = worker.url().join(path).map_err(|e| e.to_string())?;
    let bearer = worker.bearer();
    st.client()
        .call(Call {
            method,
            uri,
            bearer: bearer.as_deref(),
            body,
            timeout,
            limit,
        })
        .await
}

/// The URLs of the workers whose answer was a success, and the others with why.
fn tally(workers: &[Arc<Worker>], answers: Vec<Answer>) -> (Vec<String>, Vec<FanOutFailure>) {
    let mut successful = Vec::new();
    let mut failed = Vec::new();
    for (w, a) in workers.iter().zip(answers) {
        let url = w.url().as_str().to_owned();
        match a {
            Ok((s, _)) if s.is_success() => successful.push(url),
            Ok((s, body)) => failed.push(FanOutFailure {
                worker: url,
                error: failure(s, &body),
            }),
            Err(error) => failed.push(FanOutFailure { worker: url, error }),
        }
    }
    (successful, failed)
}

/// A worker's failing answer, as text.
fn failure(status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    format!("{status}: {}", text.trim())
}

/// Flushes every worker's prefix cache (SGLang's `/flush_cache`, which declines while
/// requests run: that worker then counts as failed).
#[utoipa::path(post, operation_id = openapi::routes::gateway::FlushCache::OPERATION_ID,
    path = openapi::routes::gateway::FlushCache::PATH, tag = "workers",
    responses(
        (status = 200, description = "Every worker flushed (or there is none)", body = FlushCacheResult),
        (status = 206, description = "Some workers did not flush: `successful` and `failed` name them", body = FlushCacheResult),
    ))]
pub async fn flush_cache(State(st): State<AppState>) -> Response {
    let workers = st.registry().one_per_url();
    let answers = ask_all(
        &st,
        &workers,
        Method::POST,
        "/flush_cache",
        Bytes::new(),
        LOAD_LIMIT,
    )
    .await;
    let (mut successful, failed) = tally(&workers, answers);
    let total = workers.len();
    let flushed = successful.len();
    let (status, code, message) = if failed.is_empty() {
        successful.clear();
        let m = format!("Successfully flushed cache on all {flushed} workers");
        (StatusCode::OK, "success", m)
    } else {
        let m = format!("Cache flush: {flushed} succeeded, {} failed", failed.len());
        (StatusCode::PARTIAL_CONTENT, "partial_success", m)
    };
    tracing::info!(flushed, total, "flush_cache");
    let body = FlushCacheResult {
        status: code.into(),
        message,
        workers_flushed: flushed,
        total_workers: total,
        successful,
        failed,
    };
    (status, Json(body)).into_response()
}

/// Every worker's load: its `/get_load` answer (one entry per data-parallel rank) and the
/// KV tokens they hold in all; -1 with the reason for a worker that did not answer.
#[utoipa::path(get, operation_id = openapi::routes::gateway::GetLoads::OPERATION_ID,
    path = openapi::routes::gateway::GetLoads::PATH, tag = "workers",
    responses((status = 200, description = "One entry per worker", body = WorkerLoads)))]
pub async fn get_loads(State(st): State<AppState>) -> Json<WorkerLoads> {
    let workers = st.registry().one_per_url();
    let answers = ask_all(
        &st,
        &workers,
        Method::GET,
        "/get_load",
        Bytes::new(),
        LOAD_LIMIT,
    )
    .await;
    let loads = workers
        .iter()
        .zip(answers)
        .map(|(w, a)| {
            let parsed = match a {
                Ok((s, body)) if s.is_success() => serde_json::from_slice::<Vec<LoadReport>>(&body)
                    .map_err(|e| format!("not a /get_load answer: {e}")),
                Ok((s, body)) => Err(failure(s, &body)),
                Err(e) => Err(e),
            };
            let worker_type = match w.worker_type() {
                WorkerType::Regular => None,
                t => Some(t),
            };
            let (load, details, error) = match parsed {
                Ok(ranks) => {
                    let tokens = ranks.iter().map(|r| r.num_tokens).sum::<u64>();
                    (i64::try_from(tokens).unwrap_or(i64::MAX), Some(ranks), None)
                }
                Err(e) => (-1, None, Some(e)),
            };
            WorkerLoad {
                worker: w.url().as_str().to_owned(),
                worker_type,
                load,
                details,
                error,
            }
        })
        .collect();
    Json(WorkerLoads { workers: loads })
}

/// The workers' own Prometheus metrics (each worker's `/metrics`, scraped once per URL),
/// merged into one exposition: each family once, each sample labelled
/// `worker_addr="<url>"`.
#[utoipa::path(get, operation_id = openapi::routes::gateway::EngineMetrics::OPERATION_ID,
    path = openapi::routes::gateway::EngineMetrics::PATH, tag = "ops",
    responses(
        (status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain"),
        (status = 503, description = "No worker, or none answered (`no_worker_metrics`)", body = ErrorResponse),
    ))]
pub async fn engine_metrics(State(st): State<AppState>) -> Response {
    let workers = st.registry().one_per_url();
    // Answers are taken as they come (FAN_OUT in flight), and asking stops once the
    // total bound is reached: in flight plus held stays bounded whatever the fleet.
    let mut answers = asking(
        &st,
        &workers,
        Method::GET,
        "/metrics",
        Bytes::new(),
        METRICS_LIMIT,
    )
    .zip(futures::stream::iter(workers.iter()));
    let mut held = 0usize;
    let mut texts: Vec<(String, String)> = Vec::new();
    while let Some((a, w)) = answers.next().await {
        match a {
            Ok((s, body)) if s.is_success() => {
                held += body.len();
                if held > METRICS_TOTAL_LIMIT {
                    tracing::warn!(
                        left_out = workers.len() - texts.len(),
                        "engine metrics over the total bound; the remaining workers left out"
                    );
                    break;
                }
                let text = String::from_utf8_lossy(&body).into_owned();
                texts.push((w.url().as_str().to_owned(), text));
            }
            Ok((s, _)) => tracing::debug!(worker = w.url().as_str(), %s, "engine metrics refused"),
            Err(e) => tracing::debug!(worker = w.url().as_str(), e, "engine metrics unreachable"),
        }
    }
    if texts.is_empty() {
        return GatewayError::NoWorkerMetrics.into_response();
    }
    let merged = exposition::merge(&texts, "worker_addr");
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        merged,
    )
        .into_response()
}

/// One short generation on a ready worker (SGLang's `/health_generate`); in PD mode on a
/// ready prefill and a ready decode worker at once. 200 when it (both) succeeded.
#[utoipa::path(get, operation_id = openapi::routes::gateway::HealthGenerate::OPERATION_ID,
    path = openapi::routes::gateway::HealthGenerate::PATH, tag = "ops",
    responses(
        (status = 200, description = "The worker (PD: both workers) generated", body = String, content_type = "text/plain"),
        (status = 503, description = "No ready worker (`no_ready_worker`, PD: `no_ready_prefill_worker` / `no_ready_decode_worker`), or the generation failed (`health_generate_failed`)", body = ErrorResponse),
    ))]
pub async fn health_generate(State(st): State<AppState>) -> Response {
    let pd = st.pd_router().is_some();
    let sides: &[(WorkerType, Option<PdSide>)] = if pd {
        &[
            (WorkerType::Prefill, Some(PdSide::Prefill)),
            (WorkerType::Decode, Some(PdSide::Decode)),
        ]
    } else {
        &[(WorkerType::Regular, None)]
    };
    let mut workers = Vec::new();
    for (kind, side) in sides {
        match st.registry().first_available(*kind) {
            Some(w) => workers.push(w),
            None => {
                return match side {
                    Some(side) => GatewayError::NoReadyPdWorker {
                        side: *side,
                        model: None,
                    },
                    None => GatewayError::NoReadyWorker { model: None },
                }
                .into_response();
            }
        }
    }
    // A generation takes longer than a probe: the request timeout bounds it.
    let timeout = Duration::from_secs(st.config().request_timeout_secs);
    let calls = workers.iter().map(|w| {
        ask(
            &st,
            w,
            Method::GET,
            "/health_generate",
            Bytes::new(),
            timeout,
            LOAD_LIMIT,
        )
    });
    let answers = futures::future::join_all(calls).await;
    let errors: Vec<String> = workers
        .iter()
        .zip(answers)
        .filter_map(|(w, a)| match a {
            Ok((s, _)) if s.is_success() => None,
            Ok((s, body)) => Some(format!("{}: {}", w.url().as_str(), failure(s, &body))),
            Err(e) => Some(format!("{}: {e}", w.url().as_str())),
        })
        .collect();
    if !errors.is_empty() {
        return GatewayError::HealthGenerateFailed(errors.join("; ")).into_response();
    }
    let urls: Vec<&str> = workers.iter().map(|w| w.url().as_str()).collect();
    (
        StatusCode::OK,
        format!("Health generate passed on {}", urls.join(" and ")),
    )
        .into_response()
}

/// Starts SGLang's profiler on every worker, or on the one `url` names; the other fields
/// of the body (`output_dir`, `num_steps`, `activities`, ...) reach the workers unchanged.
#[utoipa::path(post, operation_id = openapi::routes::gateway::StartProfile::OPERATION_ID,
    path = openapi::routes::gateway::StartProfile::PATH, tag = "workers",
    request_body(content = ProfileRequest, description = "`url` (optional) and SGLang's profiling options"),
    responses(
        (status = 200, description = "Every worker asked started", body = ProfileResult),
        (status = 206, description = "Some did not: `successful` and `failed` name them", body = ProfileResult),
        (status = 404, description = "`url` names no worker", body = ProfileResult),
        (status = 400, description = "The body is not a JSON object (`invalid_json`)", body = ErrorResponse),
    ))]
pub async fn start_profile(State(st): State<AppState>, body: Bytes) -> Response {
    profile(&st, "/start_profile", &body).await
}

/// Stops SGLang's profiler on every worker, or on the one `url` names.
#[utoipa::path(post, operation_id = openapi::routes::gateway::StopProfile::OPERATION_ID,
    path = openapi::routes::gateway::StopProfile::PATH, tag = "workers",
    request_body(content = ProfileRequest, description = "`url` (optional)"),
    responses(
        (status = 200, description = "Every worker asked stopped", body = ProfileResult),
        (status = 206, description = "Some did not: `successful` and `failed` name them", body = ProfileResult),
        (status = 404, description = "`url` names no worker", body = ProfileResult),
        (status = 400, description = "The body is not a JSON object (`invalid_json`)", body = ErrorResponse),
    ))]
pub async fn stop_profile(State(st): State<AppState>, body: Bytes) -> Response {
    profile(&st, "/stop_profile", &body).await
}

/// `path` on the workers `body`'s `url` picks (all without one), with the rest of `body`.
async fn profile(st: &AppState, path: &'static str, body: &[u8]) -> Response {
    let req: ProfileRequest = if body.iter().all(u8::is_ascii_whitespace) {
        ProfileRequest::default()
    } else {
        match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return GatewayError::InvalidJson(e.to_string()).into_response(),
        }
    };
    let workers: Vec<Arc<Worker>> = st
        .registry()
        .one_per_url()
        .into_iter()
        .filter(|w| {
            req.url
                .as_deref()
                .is_none_or(|u| crate::select::affinity::is_target(w, u))
        })
        .collect();
    let options = match serde_json::to_vec(&req.options) {
        Ok(o) => Bytes::from(o),
        Err(e) => return GatewayError::Internal(e.to_string()).into_response(),
    };
    let answers = ask_all(st, &workers, Method::POST, path, options, LOAD_LIMIT).await;
    let (mut successful, failed) = tally(&workers, answers);
    let total = workers.len();
    let done = successful.len();
    let what = path.trim_start_matches('/');
    let (status, word, message) = if total == 0 {
        let m = format!("no worker matches url {:?}", req.url.unwrap_or_default());
        (StatusCode::NOT_FOUND, "error", m)
    } else if failed.is_empty() {
        successful.clear();
        (
            StatusCode::OK,
            "success",
            format!("{what} on all {done} workers"),
        )
    } else {
        let m = format!("{what}: {done} succeeded, {} failed", failed.len());
        (StatusCode::PARTIAL_CONTENT, "partial_success", m)
    };
    tracing::info!(done, total, "{what}");
    let body = ProfileResult {
        status: word.into(),
        message,
        workers_profiled: done,
        total_workers: total,
        successful,
        failed,
    };
    (status, Json(body)).into_response()
}
