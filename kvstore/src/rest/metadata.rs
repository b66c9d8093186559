//! The transfer-metadata store, Mooncake's HTTP metadata server protocol:
//! `GET /metadata?key=K` answers 200 with exactly the bytes last stored (404 when absent),
//! `PUT /metadata?key=K` stores the request body, `DELETE /metadata?key=K` removes it
//! (404 when absent). A missing or empty `key` is a 400.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use openapi::master as wire;

use super::{ApiQuery, ApiResult, MasterErrors, observed};
use crate::master::Master;

fn key(q: &wire::MetadataQuery) -> &str {
    q.key.as_deref().unwrap_or("")
}

/// The bytes stored under `key`.
#[utoipa::path(get, operation_id = "master_get_metadata", path = "/metadata", tag = super::TAG, params(wire::MetadataQuery),
    responses((status = 200, description = "The stored bytes, unchanged", body = wire::MetadataValue,
               content_type = "application/json"), MasterErrors))]
pub async fn get_metadata(
    State(m): State<Arc<Master>>,
    ApiQuery(q): ApiQuery<wire::MetadataQuery>,
) -> ApiResult<impl IntoResponse> {
    let value = observed("metadata_get", m.metadata().get(key(&q)))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], value))
}

/// Store the request body under `key` (replacing any previous value).
#[utoipa::path(put, operation_id = "master_put_metadata", path = "/metadata", tag = super::TAG, params(wire::MetadataQuery),
    request_body(content = wire::MetadataValue, content_type = "application/octet-stream"),
    responses((status = 200, description = "Stored", body = String, content_type = "text/plain"), MasterErrors))]
pub async fn put_metadata(
    State(m): State<Arc<Master>>,
    ApiQuery(q): ApiQuery<wire::MetadataQuery>,
    body: Bytes,
) -> ApiResult<&'static str> {
    observed("metadata_put", m.metadata().put(key(&q), body)).map(|()| "metadata updated")
}

/// Remove `key`.
#[utoipa::path(delete, operation_id = "master_delete_metadata", path = "/metadata", tag = super::TAG, params(wire::MetadataQuery),
    responses((status = 200, description = "Removed", body = String, content_type = "text/plain"), MasterErrors))]
pub async fn delete_metadata(
    State(m): State<Arc<Master>>,
    ApiQuery(q): ApiQuery<wire::MetadataQuery>,
) -> ApiResult<&'static str> {
    observed("metadata_delete", m.metadata().delete(key(&q))).map(|()| "metadata deleted")
}
