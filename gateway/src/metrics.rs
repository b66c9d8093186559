//! Prometheus metrics: the process-wide recorder (shared with the hosted KV master's
//! `moongate_master_*` metrics) and the gateway's `moongate_gateway_*` series.
//!
//! Hot-path handles are registered once and cached (`OnceLock` per route and status), so
//! recording a request is two atomic operations and no lookup. Per-worker series
//! (`moongate_gateway_worker_*`: in flight, ready, failures, circuit breaker) are written
//! from the registry when `/metrics` is scraped, so a removed worker's series disappear
//! with it (they are not kept by the recorder). Routing decisions are counted in
//! [`decisions`], which the console reads too, and handed to the recorder the same way.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use openapi::workers::CircuitState;

pub mod decisions;

pub use decisions::{
    cache_aware_decision, kv_aware_decision, kv_aware_token_counts, kv_aware_tokens, pd_path,
    sticky_decision, tallies,
};

use crate::outcome::{PdFailure, PdSide};
use crate::workers::Registry;

/// Request duration buckets (seconds, to the response head).
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Installs the global Prometheus recorder once and returns its handle (later calls return
/// the same handle). Starts a thread that drains histogram samples every 5 s.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .expect("bucket list is not empty");
            let handle = match builder.install_recorder() {
                Ok(h) => h,
                // Another recorder is installed (e.g. by an embedding program): keep ours
                // local so `/metrics` still renders the gateway's view.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            };
            let upkeep = handle.clone();
            let _ = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_secs(5));
                        upkeep.run_upkeep();
                    }
                });
            handle
        })
        .clone()
}

/// A route label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Route {
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/completions`.
    Completions,
    /// `/generate`.
    Generate,
    /// `/v1/embeddings`.
    Embeddings,
    /// `/rerank`, `/v1/rerank`.
    Rerank,
    /// `/v1/classify`.
    Classify,
    /// `/v1/score`.
    Score,
    /// `/v1/tokenize`, `/v1/detokenize`.
    Tokenize,
    /// `/v1/responses` and a response's routes.
    Responses,
    /// `/v1/models`.
    Models,
    /// `/workers...`.
    Workers,
    /// `/health`, `/liveness`, `/readiness`, `/health_generate`.
    Health,
    /// `/metrics`, the console (`/console`, `/cluster`), and what asks every worker:
    /// `/flush_cache`, `/get_loads`, `/engine_metrics`.
    Ops,
    /// The hosted KV master: `/api/v1/...`, `/metadata`.
    Master,
    /// The OpenAPI document and Swagger UI: `/api-docs/...`, `/openapi.json`, `/docs...`.
    Docs,
    /// Anything else.
    Other,
}

const ROUTES: usize = 16;
const ROUTE_LABELS: [&str; ROUTES] = [
    "chat_completions",
    "completions",
    "generate",
    "embeddings",
    "rerank",
    "classify",
    "score",
    "tokenize",
    "responses",
    "models",
    "workers",
    "health",
    "ops",
    "master",
    "docs",
    "other",
];
const STATUSES: [u16; 20] = [
    200, 201, 202, 204, 303, 400, 401, 403, 404, 405, 409, 413, 422, 429, 500, 501, 502, 503, 504,
    507,
];
const STATUS_LABELS: [&str; 21] = [
    "200", "201", "202", "204", "303", "400", "401", "403", "404", "405", "409", "413", "422",
    "429", "500", "501", "502", "503", "504", "507", "other",
];

impl Route {
    /// The route of a request path.
    pub fn of(path: &str) -> Self {
        use openapi::routes::{docs, gateway as gw, master};
        match path {
            gw::ChatCompletions::PATH => Self::ChatCompletions,
            gw::Completions::PATH => Self::Completions,
            gw::Generate::PATH => Self::Generate,
            gw::Embeddings::PATH => Self::Embeddings,
            gw::Rerank::PATH | gw::V1Rerank::PATH => Self::Rerank,
            gw::Classify::PATH => Self::Classify,
            gw::Score::PATH => Self::Score,
            gw::Tokenize::PATH | gw::Detokenize::PATH => Self::Tokenize,
            gw::Responses::PATH => Self::Responses,
            gw::Models::PATH => Self::Models,
            gw::Health::PATH
            | gw::Liveness::PATH
            | gw::Readiness::PATH
            | gw::HealthGenerate::PATH => Self::Health,
            gw::Metrics::PATH
            | gw::FlushCache::PATH
            | gw::GetLoads::PATH
            | gw::EngineMetrics::PATH
            | gw::StartProfile::PATH
            | gw::StopProfile::PATH
            | gw::Cluster::PATH
            | gw::Console::PATH => Self::Ops,
            master::GetMetadata::PATH => Self::Master,
            docs::OpenapiJsonAlias::PATH | docs::SwaggerUiRoot::PATH => Self::Docs,
            p if p == "/workers" || p.starts_with("/workers/") => Self::Workers,
            p if p.starts_with("/api/v1/") => Self::Master,
            p if p.starts_with("/v1/responses/") => Self::Responses,
            p if p.starts_with("/docs/") || p.starts_with("/api-docs/") => Self::Docs,
            _ => Self::Other,
        }
    }
}

/// PD failure kinds (the `kind` label).
const PD_KINDS: [&str; 4] = ["unavailable", "bad_gateway", "timeout", "client_error"];

struct Handles {
    requests: [[OnceLock<Counter>; STATUS_LABELS.len()]; ROUTES],
    durations: [OnceLock<Histogram>; ROUTES],
    retries: OnceLock<Counter>,
    pd_requests: [OnceLock<Counter>; ROUTES],
    pd_failures: [[OnceLock<Counter>; PD_KINDS.len()]; 2],
    pd_first_byte: OnceLock<Histogram>,
}

static HANDLES: Handles = Handles {
    requests: [const { [const { OnceLock::new() }; STATUS_LABELS.len()] }; ROUTES],
    durations: [const { OnceLock::new() }; ROUTES],
    retries: OnceLock::new(),
    pd_requests: [const { OnceLock::new() }; ROUTES],
    pd_failures: [const { [const { OnceLock::new() }; PD_KINDS.len()] }; 2],
    pd_first_byte: OnceLock::new(),
};

/// Records one answered request: count by route and status, duration to the response head.
#[inline]
pub fn request(route: Route, status: u16, elapsed: Duration) {
    let r = route as usize;
    let s = STATUSES
        .iter()
        .position(|&x| x == status)
        .unwrap_or(STATUSES.len());
    HANDLES.requests[r][s]
        .get_or_init(|| {
            metrics::counter!("moongate_gateway_requests_total",
                "route" => ROUTE_LABELS[r], "status" => STATUS_LABELS[s])
        })
        .increment(1);
    HANDLES.durations[r]
        .get_or_init(|| metrics::histogram!("moongate_gateway_request_duration_seconds", "route" => ROUTE_LABELS[r]))
        .record(elapsed.as_secs_f64());
}

/// Records one retry (after its backoff was decided).
pub fn retry() {
    HANDLES
        .retries
        .get_or_init(|| metrics::counter!("moongate_gateway_retries_total"))
        .increment(1);
}

/// Records one request routed in PD mode (a prefill and a decode worker).
#[inline]
pub fn pd_request(route: Route) {
    let r = route as usize;
    HANDLES.pd_requests[r]
        .get_or_init(
            || metrics::counter!("moongate_gateway_pd_requests_total", "route" => ROUTE_LABELS[r]),
        )
        .increment(1);
}

/// Records a PD request that failed on `side`: `failure` is `None` for a client error the
/// worker answered (4xx, passed through).
pub fn pd_failure(side: PdSide, failure: Option<PdFailure>) {
    let s = side as usize;
    let k = match failure {
        Some(PdFailure::Unavailable) => 0,
        Some(PdFailure::BadGateway) => 1,
        Some(PdFailure::Timeout(_)) => 2,
        None => 3,
    };
    HANDLES.pd_failures[s][k]
        .get_or_init(|| {
            metrics::counter!("moongate_gateway_pd_failures_total",
                "side" => side.as_str(), "kind" => PD_KINDS[k])
        })
        .increment(1);
}

/// Records the time from dispatching a PD pair to the first byte of decode's answer.
#[inline]
pub fn pd_decode_first_byte(elapsed: Duration) {
    HANDLES
        .pd_first_byte
        .get_or_init(|| metrics::histogram!("moongate_gateway_pd_decode_first_byte_seconds"))
        .record(elapsed.as_secs_f64());
}

/// Records one admission decision of a request of class `class` (`admitted`, `queued`,
/// `queue_full`, `queue_timeout`, `rate_limited`, `tenant_...`), and an admitted request's
/// wait in `moongate_gateway_admission_wait_seconds{class}`.
pub fn admission(outcome: &'static str, class: crate::auth::Priority, waited: Option<Duration>) {
    metrics::counter!("moongate_gateway_admission_total", "outcome" => outcome, "class" => class.as_str())
        .increment(1);
    if let Some(w) = waited {
        metrics::histogram!("moongate_gateway_admission_wait_seconds", "class" => class.as_str())
            .record(w.as_secs_f64());
    }
}

/// Records one request of tenant `tenant` (a name from the client keys file): `admitted`,
/// or the refusal's label.
pub fn tenant_request(tenant: &str, outcome: &'static str) {
    metrics::counter!("moongate_gateway_tenant_requests_total", "tenant" => tenant.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// Renders all metrics: the recorder's, then the per-worker series of the workers in
/// `registry` now, and `extra` gauges (name, value) computed by the caller.
pub fn render(handle: &PrometheusHandle, registry: &Registry, extra: &[(&str, f64)]) -> String {
    let (ready, total) = registry.counts();
    metrics::gauge!("moongate_gateway_workers", "state" => "ready").set(ready as f64);
    metrics::gauge!("moongate_gateway_workers", "state" => "total").set(total as f64);
    for (name, v) in extra {
        metrics::gauge!(name.to_string()).set(*v);
    }
    decisions::publish();
    let mut out = handle.render();
    render_workers(&mut out, registry);
    out
}

/// Appends the `moongate_gateway_worker_*` series of every registered worker. They are
/// recorded, with the `metrics` crate's labels, into a recorder made for this rendering
/// alone, so a removed worker's series leave with it (the process's recorder keeps every
/// series it was ever given).
fn render_workers(out: &mut String, registry: &Registry) {
    let set = registry.snapshot();
    if set.is_empty() {
        return;
    }
    let recorder = PrometheusBuilder::new().build_recorder();
    metrics::with_local_recorder(&recorder, || {
        metrics::describe_gauge!(
            "moongate_gateway_worker_in_flight",
            "Requests in flight on the worker."
        );
        metrics::describe_gauge!(
            "moongate_gateway_worker_ready",
            "1 if the worker is ready and not draining."
        );
        metrics::describe_counter!(
            "moongate_gateway_worker_failures_total",
            "Requests charged to the worker as failed."
        );
        metrics::describe_gauge!(
            "moongate_gateway_worker_circuit_state",
            "Circuit breaker: 0 closed, 1 open, 2 half-open."
        );
        metrics::describe_counter!(
            "moongate_gateway_worker_circuit_opened_total",
            "Times the worker's circuit breaker opened."
        );
        for w in set.iter() {
            let labels = [
                ("worker", w.url().as_str().to_owned()),
                ("worker_type", w.worker_type().as_str().to_owned()),
            ];
            metrics::gauge!("moongate_gateway_worker_in_flight", &labels).set(w.load() as f64);
            metrics::gauge!("moongate_gateway_worker_ready", &labels)
                .set(f64::from(u8::from(w.is_available())));
            metrics::counter!("moongate_gateway_worker_failures_total", &labels)
                .absolute(w.failures());
            let state = match w.breaker().state() {
                CircuitState::Closed => 0.0,
                CircuitState::Open => 1.0,
                CircuitState::HalfOpen => 2.0,
            };
            metrics::gauge!("moongate_gateway_worker_circuit_state", &labels).set(state);
            metrics::counter!("moongate_gateway_worker_circuit_opened_total", &labels)
                .absolute(w.breaker().info().opened_total);
        }
    });
    out.push_str(&recorder.handle().render());
}
