//! The transfer-metadata store, Mooncake's HTTP metadata server protocol:
//! `GET /metadata?key=K` answers 200 with exactly the bytes last stored (404 when absent),
//! `PUT /metadata?key=K` stores the request body, `DELETE /metadata?key=K` removes it
//! (404 when absent). A missing or empty `key`, or an empty body, is a 400. The stored bytes
//! are answered as `application/json` when they are a JSON object (transfer segment
//! descriptors are), else as `application/octet-stream`: the content type never claims what the bytes
//! are not.

use openapi::routes;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use openapi::master as wire;

use super::{ApiQuery, ApiResult, MasterErrors, observed};
use crate::master::{Master, MasterError};

fn key(q: &wire::MetadataQuery) -> &str {
    q.key.as_deref().unwrap_or("")
}

/// The bytes stored under `key`.
#[utoipa::path(get, operation_id = routes::master::GetMetadata::OPERATION_ID,
    path = routes::master::GetMetadata::PATH, tag = super::TAG, params(wire::MetadataQuery),
    responses((status = 200, description = "The stored bytes, unchanged: `application/json` when they are a JSON object, else `application/octet-stream`",
               content(
                   (Object = "application/json"),
                   (wire::MetadataValue = "application/octet-stream"),
               )), MasterErrors))]
pub async fn get_metadata(
    State(m): State<Arc<Master>>,
    ApiQuery(q): ApiQuery<wire::MetadataQuery>,
) -> ApiResult<impl IntoResponse> {
    let value = observed("metadata_get", m.metadata().get(key(&q)))?;
    let json = value.trim_ascii_start().first() == Some(&b'{')
        && serde_json::from_slice::<serde::de::IgnoredAny>(&value).is_ok();
    let kind = if json {
        "application/json"
    } else {
        "application/octet-stream"
    };
    Ok(([(header::CONTENT_TYPE, kind)], value))
}

/// Store the request body under `key` (replacing any previous value).
#[utoipa::path(put, operation_id = routes::master::PutMetadata::OPERATION_ID,
    path = routes::master::PutMetadata::PATH, tag = super::TAG, params(wire::MetadataQuery),
    request_body(content = wire::MetadataValue, content_type = "application/octet-stream"),
    responses((status = 200, description = "Stored", body = String, content_type = "text/plain"), MasterErrors))]
pub async fn put_metadata(
    State(m): State<Arc<Master>>,
    ApiQuery(q): ApiQuery<wire::MetadataQuery>,
    body: Bytes,
) -> ApiResult<&'static str> {
    // A missing key is reported first (Mooncake's INVALID_KEY), then an empty value.
    let r = if body.is_empty() && !key(&q).is_empty() {
        Err(MasterError::InvalidParams(
            "the metadata value is empty".into(),
        ))
    } else {
        m.metadata().put(key(&q), body)
    };
    observed("metadata_put", r).map(|()| "metadata updated")
}

/// Remove `key`.
#[utoipa::path(delete, operation_id = routes::master::DeleteMetadata::OPERATION_ID,
    path = routes::master::DeleteMetadata::PATH, tag = super::TAG, params(wire::MetadataQuery),
    responses((status = 200, description = "Removed", body = String, content_type = "text/plain"), MasterErrors))]
pub async fn delete_metadata(
    State(m): State<Arc<Master>>,
    ApiQuery(q): ApiQuery<wire::MetadataQuery>,
) -> ApiResult<&'static str> {
    observed("metadata_delete", m.metadata().delete(key(&q))).map(|()| "metadata deleted")
}
