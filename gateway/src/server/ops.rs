//! Operations routes: liveness, readiness, Prometheus metrics.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, header};
use openapi::error::ErrorResponse;
use openapi::workers::HealthStatus;

use super::AppState;
use crate::error::{GatewayError, PdSide};
use openapi::workers::WorkerType;

fn status(st: &AppState, word: &str) -> HealthStatus {
    let (ready, total) = st.registry().counts();
    HealthStatus {
        status: word.into(),
        ready_workers: ready,
        total_workers: total,
    }
}

/// The process is up (sglang-router's `/health`).
#[utoipa::path(get, operation_id = openapi::routes::gateway::Health::OPERATION_ID,
    path = openapi::routes::gateway::Health::PATH, tag = "ops",
    responses((status = 200, description = "Alive", body = HealthStatus)))]
pub async fn health(State(st): State<AppState>) -> Json<HealthStatus> {
    Json(status(&st, "alive"))
}

/// The process is up.
#[utoipa::path(get, operation_id = openapi::routes::gateway::Liveness::OPERATION_ID,
    path = openapi::routes::gateway::Liveness::PATH, tag = "ops",
    responses((status = 200, description = "Alive", body = HealthStatus)))]
pub async fn liveness(State(st): State<AppState>) -> Json<HealthStatus> {
    Json(status(&st, "alive"))
}

/// Ready when at least one worker is ready and its circuit breaker not open (in PD mode:
/// one prefill and one decode worker); 503 until then.
#[utoipa::path(get, operation_id = openapi::routes::gateway::Readiness::OPERATION_ID,
    path = openapi::routes::gateway::Readiness::PATH, tag = "ops",
    responses(
        (status = 200, description = "At least one worker is ready (PD: a prefill and a decode worker)", body = HealthStatus),
        (status = 503, description = "No ready worker (PD: `no_ready_prefill_worker` or `no_ready_decode_worker`)", body = ErrorResponse),
    ))]
pub async fn readiness(State(st): State<AppState>) -> Response {
    if st.pd_router().is_some() {
        for (side, kind) in [
            (PdSide::Prefill, WorkerType::Prefill),
            (PdSide::Decode, WorkerType::Decode),
        ] {
            if st.registry().first_available(kind).is_none() {
                return GatewayError::NoReadyPdWorker { side, model: None }.into_response();
            }
        }
    }
    let s = status(&st, "ready");
    if s.ready_workers == 0 {
        return GatewayError::NoReadyWorker { model: None }.into_response();
    }
    Json(s).into_response()
}

/// Prometheus text exposition (the gateway's and the hosted master's series).
#[utoipa::path(get, operation_id = openapi::routes::gateway::Metrics::OPERATION_ID,
    path = openapi::routes::gateway::Metrics::PATH, tag = "ops",
    responses((status = 200, description = "Prometheus metrics", content_type = "text/plain")))]
pub async fn metrics(State(st): State<AppState>) -> Response {
    if let Some(master) = st.master() {
        kvmaster::publish_gauges(master);
    }
    let extra = [(
        "moongate_gateway_admission_waiting",
        st.admission().waiting() as f64,
    )];
    let text = crate::metrics::render(st.prometheus(), st.registry(), &extra);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}
