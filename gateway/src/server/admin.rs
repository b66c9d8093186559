//! The worker API.
//!
//! - `POST /workers` -> 201 + `Location: /workers/{id}` + the record; 409 if the URL is
//!   registered; 400 for a bad URL or body.
//! - `GET /workers`, `GET /workers/{id}` (404 if unknown).
//! - `PATCH /workers/{id}`: labels (replaced), priority, api key (rotated; `null` removes).
//! - `DELETE /workers/{id}` -> 202 + the record with `draining: true`: no new requests go
//!   to it; it leaves the registry once its in-flight requests finish (at once if none).

use axum::Json;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use openapi::error::ErrorResponse;
use openapi::workers::{
    CreateWorkerRequest, UpdateWorkerRequest, WorkerInfo, WorkerList, WorkerStatus,
};
use serde::de::DeserializeOwned;

use super::AppState;
use crate::error::GatewayError;

/// axum's default body limit, which applies to these small JSON bodies.
const ADMIN_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// Parses a JSON body; errors become 400 with the parser's message.
fn parse<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, GatewayError> {
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => GatewayError::PayloadTooLarge {
            limit: ADMIN_BODY_LIMIT,
        },
        _ => GatewayError::ClientBody(e.body_text()),
    })?;
    // Every body is a JSON object: serde would also take a struct as an array of its fields
    // in order, which the document does not describe.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
                Ok(_) => GatewayError::InvalidRequest("the body must be a JSON object".into()),
                Err(e) => GatewayError::InvalidJson(e.to_string()),
            },
        );
    }
    serde_json::from_slice(&body).map_err(|e| {
        if e.is_data() {
            GatewayError::InvalidRequest(format!("invalid request: {e}"))
        } else {
            GatewayError::InvalidJson(e.to_string())
        }
    })
}

/// The `{id}` path segment.
fn worker_id(id: Result<Path<String>, PathRejection>) -> Result<String, GatewayError> {
    id.map(|Path(id)| id)
        .map_err(|e| GatewayError::InvalidRequest(e.body_text()))
}

/// Registers a worker.
#[utoipa::path(post, operation_id = openapi::routes::gateway::CreateWorker::OPERATION_ID,
    path = openapi::routes::gateway::CreateWorker::PATH, tag = "workers",
    request_body = CreateWorkerRequest,
    responses(
        (status = 201, description = "Registered (pending until its first health probe succeeds)", body = WorkerInfo,
            headers(("location" = String, description = "/workers/{id}"))),
        (status = 400, description = "Bad URL or body", body = ErrorResponse),
        (status = 409, description = "URL already registered", body = ErrorResponse),
    ))]
pub async fn create_worker(
    State(st): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GatewayError> {
    let req: CreateWorkerRequest = parse(body)?;
    let worker = st.workers().add(req)?;
    let location = HeaderValue::try_from(format!("/workers/{}", worker.id()))
        .map_err(|e| GatewayError::Internal(e.to_string()))?;
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(worker.info()),
    )
        .into_response())
}

/// Lists every worker.
#[utoipa::path(get, operation_id = openapi::routes::gateway::ListWorkers::OPERATION_ID,
    path = openapi::routes::gateway::ListWorkers::PATH, tag = "workers",
    responses((status = 200, description = "All workers", body = WorkerList)))]
pub async fn list_workers(State(st): State<AppState>) -> Json<WorkerList> {
    let workers: Vec<WorkerInfo> = st.registry().list().iter().map(|w| w.info()).collect();
    let ready = workers
        .iter()
        .filter(|w| w.status == WorkerStatus::Ready && !w.draining)
        .count();
    Json(WorkerList {
        total: workers.len(),
        ready,
        workers,
    })
}

/// One worker.
#[utoipa::path(get, operation_id = openapi::routes::gateway::GetWorker::OPERATION_ID,
    path = openapi::routes::gateway::GetWorker::PATH, tag = "workers",
    params(("id" = String, Path, description = "Worker id")),
    responses(
        (status = 200, description = "The worker", body = WorkerInfo),
        (status = 404, description = "No such worker", body = ErrorResponse),
    ))]
pub async fn get_worker(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<WorkerInfo>, GatewayError> {
    let id = worker_id(id)?;
    match st.registry().get(&id) {
        Some(w) => Ok(Json(w.info())),
        None => Err(GatewayError::WorkerNotFound(id)),
    }
}

/// Changes labels, priority or api key.
#[utoipa::path(patch, operation_id = openapi::routes::gateway::UpdateWorker::OPERATION_ID,
    path = openapi::routes::gateway::UpdateWorker::PATH, tag = "workers",
    params(("id" = String, Path, description = "Worker id")),
    request_body = UpdateWorkerRequest,
    responses(
        (status = 200, description = "Updated", body = WorkerInfo),
        (status = 400, description = "Bad body", body = ErrorResponse),
        (status = 404, description = "No such worker", body = ErrorResponse),
    ))]
pub async fn update_worker(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<WorkerInfo>, GatewayError> {
    let id = worker_id(id)?;
    let req: UpdateWorkerRequest = parse(body)?;
    match st.workers().update(&id, req)? {
        Some(w) => Ok(Json(w.info())),
        None => Err(GatewayError::WorkerNotFound(id)),
    }
}

/// Drains and removes a worker.
#[utoipa::path(delete, operation_id = openapi::routes::gateway::DeleteWorker::OPERATION_ID,
    path = openapi::routes::gateway::DeleteWorker::PATH, tag = "workers",
    params(("id" = String, Path, description = "Worker id")),
    responses(
        (status = 202, description = "Draining; removed when its in-flight requests finish", body = WorkerInfo),
        (status = 404, description = "No such worker", body = ErrorResponse),
    ))]
pub async fn delete_worker(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Json<WorkerInfo>), GatewayError> {
    let id = worker_id(id)?;
    match st.workers().remove(&id) {
        Some(w) => Ok((StatusCode::ACCEPTED, Json(w.info()))),
        None => Err(GatewayError::WorkerNotFound(id)),
    }
}
