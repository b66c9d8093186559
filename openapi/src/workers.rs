//! Worker admin API types: `POST/GET /workers`, `GET/PATCH/DELETE /workers/{id}`.
//!
//! A worker is one SGLang server (or `moongate sim-worker`) behind the gateway. Its
//! `status` follows the health checker: `pending` until the first probe succeeds, then
//! `ready` and `not_ready` as probes cross the failure and success thresholds. Only
//! `ready`, non-draining workers receive traffic.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

/// The role a worker plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerType {
    /// Serves whole requests (prefill and decode in one server).
    #[default]
    Regular,
    /// Runs the prefill half of a disaggregated request and serves KV pages from its
    /// bootstrap server.
    Prefill,
    /// Runs the decode half of a disaggregated request.
    Decode,
}

impl WorkerType {
    /// The wire name (`regular`, `prefill`, `decode`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Regular => "regular",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

/// Where a worker is in its health life cycle: `pending -> ready <-> not_ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerStatus {
    /// Registered, no health probe has succeeded yet.
    Pending,
    /// Healthy: receives traffic.
    Ready,
    /// Failed `health_failure_threshold` probes in a row; back to ready after
    /// `health_success_threshold` successes in a row.
    NotReady,
}

impl WorkerStatus {
    /// The wire name (`pending`, `ready`, `not_ready`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Ready => "ready",
            Self::NotReady => "not_ready",
        }
    }
}

/// `POST /workers`: register a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkerRequest {
    /// Base URL with scheme (`http` or `https`) and host, e.g. `http://10.0.0.5:30001`
    /// (an optional path prefix; no query or fragment).
    #[schema(pattern = r"^[hH][tT][tT][pP][sS]?://[^/?#\s]+(/[^?#\s]*)?$")]
    pub url: String,
    /// `regular` (default), `prefill` or `decode`.
    #[serde(default)]
    pub worker_type: WorkerType,
    /// Prefill workers only: the port of the worker's bootstrap server (KV handoff);
    /// `null` when the worker does not run one.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 65535)]
    pub bootstrap_port: Option<u16>,
    /// The model this worker serves; discovered from the worker's `/v1/models` or
    /// `/get_model_info` when absent.
    #[serde(default)]
    #[schema(pattern = r"\S")]
    pub model_id: Option<String>,
    /// Sent to the worker as `Authorization: Bearer <api_key>` (visible ASCII, no spaces).
    /// Without one the worker gets no key: the gateway's `--api-key` goes only to the workers
    /// of its configuration. Never echoed back.
    #[serde(default)]
    #[schema(pattern = "^[!-~]+$")]
    pub api_key: Option<String>,
    /// Free-form labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Priority (higher is preferred by priority-aware policies); default 50.
    #[serde(default)]
    #[schema(format = Int64, minimum = 0, maximum = 4294967295_u64)]
    pub priority: Option<u32>,
}

/// `PATCH /workers/{id}`: change a worker's labels, priority or api key. Absent fields are
/// left as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateWorkerRequest {
    /// Replaces all labels.
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// New priority.
    #[serde(default)]
    #[schema(format = Int64, minimum = 0, maximum = 4294967295_u64)]
    pub priority: Option<u32>,
    /// A new api key (rotation; visible ASCII, no spaces); `null` removes the worker's own
    /// key: a worker of the configuration falls back to the gateway's `--api-key`, one
    /// registered through this API is left with none.
    #[serde(
        default,
        deserialize_with = "present_or_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, pattern = "^[!-~]+$")]
    pub api_key: Option<Option<String>>,
}

/// Distinguishes a field set to `null` (`Some(None)`) from an absent one (`None`).
fn present_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// Health probe details of a worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkerHealth {
    /// Failed probes in a row.
    pub consecutive_failures: u32,
    /// Successful probes in a row.
    pub consecutive_successes: u32,
    /// Why the last failed probe failed (cleared by a success).
    pub last_error: Option<String>,
    /// When the last probe finished, in milliseconds since the Unix epoch.
    pub last_checked_unix_ms: Option<u64>,
}

/// Where a worker's circuit breaker is: `closed -> open -> half_open -> closed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    /// Normal operation: the worker gets traffic.
    #[default]
    Closed,
    /// Tripped by `cb_failure_threshold` failures in a row (within `cb_window_duration_secs`):
    /// no traffic until `cb_timeout_duration_secs` have passed.
    Open,
    /// Trial: a few requests at a time (`cb_success_threshold`); that many successes in a
    /// row close it, one failure opens it again.
    HalfOpen,
}

impl CircuitState {
    /// The wire name (`closed`, `open`, `half_open`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// A worker's circuit breaker, fed by the outcomes of the requests sent to it (connection
/// failures, timeouts and server errors count against it; answers up to 4xx count for it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkerCircuit {
    /// Current state.
    pub state: CircuitState,
    /// Failed requests in a row (the current streak).
    pub consecutive_failures: u32,
    /// Successful trial requests in a row (half-open).
    pub consecutive_successes: u32,
    /// How many times the breaker opened since the worker was registered.
    pub opened_total: u64,
    /// Open: milliseconds until it lets trial requests through.
    pub retry_in_ms: Option<u64>,
}

/// A worker as the admin API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkerInfo {
    /// The gateway-assigned id (used in `/workers/{id}`).
    pub id: String,
    /// Base URL.
    pub url: String,
    /// `regular`, `prefill` or `decode`.
    pub worker_type: WorkerType,
    /// Prefill workers: bootstrap server port.
    pub bootstrap_port: Option<u16>,
    /// The served model (given at registration or discovered); `null` until known.
    pub model_id: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Priority.
    pub priority: u32,
    /// Health life-cycle state.
    pub status: WorkerStatus,
    /// Health probe details.
    pub health: WorkerHealth,
    /// Requests in flight on this worker right now (released when a response body ends
    /// or its client goes away).
    pub load: u64,
    /// Being removed: gets no new requests, in-flight ones finish first.
    pub draining: bool,
    /// The circuit breaker (an open breaker keeps the worker out of rotation).
    pub circuit: WorkerCircuit,
    /// Whether an api key is sent to this worker (the key itself is never shown).
    pub has_api_key: bool,
    /// With `--dp-aware`: the data-parallel rank this entry routes to (each rank of a
    /// worker is listed as its own entry, with the worker's URL); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    /// With `--dp-aware`: how many data-parallel ranks the worker has (its `dp_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_size: Option<u32>,
}

/// `GET /workers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkerList {
    /// Every registered worker, in registration order.
    pub workers: Vec<WorkerInfo>,
    /// Number of workers.
    pub total: usize,
    /// Number of `ready` workers.
    pub ready: usize,
}

/// `GET /health`, `GET /liveness` and `GET /readiness` (when ready).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HealthStatus {
    /// `alive` (liveness) or `ready` (readiness).
    pub status: String,
    /// Workers that are ready and not draining.
    pub ready_workers: usize,
    /// All registered workers.
    pub total_workers: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_defaults_and_rejects_unknown_fields() {
        let r: CreateWorkerRequest = serde_json::from_str(r#"{"url":"http://w:1"}"#).unwrap();
        assert_eq!(r.worker_type, WorkerType::Regular);
        assert!(r.labels.is_empty() && r.priority.is_none() && r.bootstrap_port.is_none());
        let r: CreateWorkerRequest = serde_json::from_str(
            r#"{"url":"http://p:1","worker_type":"prefill","bootstrap_port":8998}"#,
        )
        .unwrap();
        assert_eq!(
            (r.worker_type, r.bootstrap_port),
            (WorkerType::Prefill, Some(8998))
        );
        assert!(serde_json::from_str::<CreateWorkerRequest>(r#"{"url":"x","urll":"y"}"#).is_err());
        assert!(
            serde_json::from_str::<CreateWorkerRequest>(r#"{"url":"x","worker_type":"both"}"#)
                .is_err()
        );
    }

    #[test]
    fn update_tells_null_from_absent() {
        let u: UpdateWorkerRequest = serde_json::from_str(r#"{"priority":3}"#).unwrap();
        assert_eq!(u.api_key, None);
        let u: UpdateWorkerRequest = serde_json::from_str(r#"{"api_key":null}"#).unwrap();
        assert_eq!(u.api_key, Some(None));
        let u: UpdateWorkerRequest = serde_json::from_str(r#"{"api_key":"k2"}"#).unwrap();
        assert_eq!(u.api_key, Some(Some("k2".into())));
    }

    #[test]
    fn status_names() {
        assert_eq!(
            serde_json::to_string(&WorkerStatus::NotReady).unwrap(),
            r#""not_ready""#
        );
        assert_eq!(WorkerStatus::NotReady.as_str(), "not_ready");
        assert_eq!(WorkerType::Decode.as_str(), "decode");
    }
}

/// One worker a fan-out (`/flush_cache`, `/get_loads`) could not reach or that refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FanOutFailure {
    /// The worker's URL.
    pub worker: String,
    /// Why: its status and answer, or the connection error.
    pub error: String,
}

/// `POST /flush_cache`'s answer (smg's shape): 200 when every worker flushed, 206 when
/// some did not (then `successful` and `failed` list them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FlushCacheResult {
    /// `success` or `partial_success`.
    pub status: String,
    /// A line for people.
    pub message: String,
    /// Workers that flushed.
    pub workers_flushed: usize,
    /// Workers asked.
    pub total_workers: usize,
    /// URLs of the workers that flushed (only on partial success).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub successful: Vec<String>,
    /// The workers that did not (only on partial success).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FanOutFailure>,
}

/// One worker's load in `GET /get_loads`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkerLoad {
    /// The worker's URL.
    pub worker: String,
    /// `prefill` or `decode` (absent for regular workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_type: Option<WorkerType>,
    /// KV tokens held by its requests, summed over its data-parallel ranks; -1 when it did
    /// not answer.
    pub load: i64,
    /// Its `/get_load` answer, one entry per data-parallel rank (absent when it did not
    /// answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Vec<crate::sglang::server::LoadReport>>,
    /// Why it has no load (absent when it answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /get_loads`'s answer: every worker's load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkerLoads {
    /// One entry per worker.
    pub workers: Vec<WorkerLoad>,
}

/// `POST /start_profile` and `POST /stop_profile`: which worker (all when `url` is absent)
/// and, for a start, SGLang's profiling options (`output_dir`, `num_steps`, `activities`,
/// ...), passed to the workers as they came.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProfileRequest {
    /// Profile only the worker with this URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The options for the workers, unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub options: crate::openai::Extra,
}

/// `POST /start_profile`'s and `POST /stop_profile`'s answer (smg's shape): 200 when every
/// worker asked did it, 206 when some did not, 404 when `url` names no worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProfileResult {
    /// `success`, `partial_success` or `error`.
    pub status: String,
    /// A line for people.
    pub message: String,
    /// Workers that did it.
    pub workers_profiled: usize,
    /// Workers asked.
    pub total_workers: usize,
    /// URLs of the workers that did it (only on partial success).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub successful: Vec<String>,
    /// The workers that did not (only on partial success).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FanOutFailure>,
}
