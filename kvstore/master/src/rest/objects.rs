//! One object's lifecycle and reads; key listing and bulk removal.
//!
//! Keys travel in the path, percent-encoded (a `/` in a key is `%2F`).

use openapi::routes;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use openapi::master as wire;

use super::{
    ApiJson, ApiPath, ApiQuery, ApiResult, MasterErrors, blocking, check_reserve, client_id,
    durable, observed, replicas, reserve, set_replicas,
};
use crate::master::{Master, MasterError, ObjectStatus};

/// Start a put: allocates replicas; the object stays invisible until put-end. With
/// `renew`, answers the replicas of the client's own unfinished put again (a new write
/// window), allocating nothing.
#[utoipa::path(post, operation_id = routes::master::PutStart::OPERATION_ID,
    path = routes::master::PutStart::PATH, tag = super::TAG,
    params(("key" = String, Path, description = "Object key (percent-encoded)")),
    request_body = wire::PutStartRequest,
    responses((status = 200, description = "Replicas to write", body = wire::PutStartResponse), MasterErrors))]
pub async fn put_start(
    State(m): State<Arc<Master>>,
    ApiPath(key): ApiPath<String>,
    ApiJson(req): ApiJson<wire::PutStartRequest>,
) -> ApiResult<Json<wire::PutStartResponse>> {
    let cfg = req.config;
    let r = check_reserve(&m, req.reserve.as_ref()).and_then(|()| client_id(&req.client_id));
    let r = r.and_then(|c| {
        match req.renew {
            true => m.renew_put(c, &key, req.length, req.put_id),
            false => m.put_start_with_id(c, &key, req.length, &cfg, req.put_id),
        }
        .map(|l| (c, l))
    });
    let (c, locs) = observed("put_start", r)?;
    // A renewal reserves nothing.
    let ask = req.reserve.as_ref().filter(|_| !req.renew);
    Ok(Json(wire::PutStartResponse {
        key,
        replicas: replicas(&locs),
        reservations: reserve(&m, c, ask, &cfg),
        write_within_ms: m.use_within_ms(),
    }))
}

/// End a put: the object becomes readable.
#[utoipa::path(post, operation_id = routes::master::PutEnd::OPERATION_ID,
    path = routes::master::PutEnd::PATH, tag = super::TAG,
    params(("key" = String, Path, description = "Object key (percent-encoded)")),
    request_body = wire::ClientRequest,
    responses((status = 204, description = "Readable"), MasterErrors))]
pub async fn put_end(
    State(m): State<Arc<Master>>,
    ApiPath(key): ApiPath<String>,
    ApiJson(req): ApiJson<wire::ClientRequest>,
) -> ApiResult<StatusCode> {
    let r = client_id(&req.client_id).and_then(|c| m.put_end(c, &key));
    let r = durable(&m, r).await;
    observed("put_end", r).map(|()| StatusCode::NO_CONTENT)
}

/// Revoke an unfinished put: its space is freed and the key is free again.
#[utoipa::path(post, operation_id = routes::master::PutRevoke::OPERATION_ID,
    path = routes::master::PutRevoke::PATH, tag = super::TAG,
    params(("key" = String, Path, description = "Object key (percent-encoded)")),
    request_body = wire::ClientRequest,
    responses((status = 204, description = "Revoked"), MasterErrors))]
pub async fn put_revoke(
    State(m): State<Arc<Master>>,
    ApiPath(key): ApiPath<String>,
    ApiJson(req): ApiJson<wire::ClientRequest>,
) -> ApiResult<StatusCode> {
    let r = client_id(&req.client_id).and_then(|c| m.put_revoke(c, &key));
    observed("put_revoke", r).map(|()| StatusCode::NO_CONTENT)
}

/// Replicas of a readable object; grants (or extends) a read lease.
#[utoipa::path(get, operation_id = routes::master::GetReplicas::OPERATION_ID,
    path = routes::master::GetReplicas::PATH, tag = super::TAG,
    params(("key" = String, Path, description = "Object key (percent-encoded)"), wire::ReplicasQuery),
    responses((status = 200, description = "Replicas and lease", body = wire::ReplicasResponse), MasterErrors))]
pub async fn get_replicas(
    State(m): State<Arc<Master>>,
    ApiPath(key): ApiPath<String>,
    ApiQuery(q): ApiQuery<wire::ReplicasQuery>,
    headers: http::HeaderMap,
) -> ApiResult<Json<wire::ReplicasResponse>> {
    let set = match super::reader(&q) {
        Ok(reader) => {
            let read = super::tier::read(&m, &key, reader);
            crate::master::with_reader_trace(super::traceparent(&headers), read).await
        }
        Err(e) => Err(e),
    };
    observed("get_replicas", set).map(|set| {
        Json(wire::ReplicasResponse {
            key,
            length: set.length,
            lease_ttl_ms: set.lease_ttl_ms,
            replicas: set_replicas(&set),
            release: set.release,
        })
    })
}

/// Whether a readable object exists; grants (or extends) a read lease if it does.
#[utoipa::path(get, operation_id = routes::master::Exists::OPERATION_ID,
    path = routes::master::Exists::PATH, tag = super::TAG,
    params(("key" = String, Path, description = "Object key (percent-encoded)")),
    responses((status = 200, description = "Existence", body = wire::ExistsResponse), MasterErrors))]
pub async fn exists(
    State(m): State<Arc<Master>>,
    ApiPath(key): ApiPath<String>,
) -> ApiResult<Json<wire::ExistsResponse>> {
    let ttl = m.config().lease_ttl_ms;
    observed("exists", m.exists(&key)).map(|exists| {
        Json(wire::ExistsResponse {
            key,
            exists,
            lease_ttl_ms: exists.then_some(ttl),
        })
    })
}

/// One object with its replicas, lease and pins (admin read; grants no lease).
#[utoipa::path(get, operation_id = routes::master::GetObject::OPERATION_ID,
    path = routes::master::GetObject::PATH, tag = super::TAG,
    params(("key" = String, Path, description = "Object key (percent-encoded)")),
    responses((status = 200, description = "Object", body = wire::ObjectInfo), MasterErrors))]
pub async fn get_object(
    State(m): State<Arc<Master>>,
    ApiPath(key): ApiPath<String>,
) -> ApiResult<Json<wire::ObjectInfo>> {
    observed("get_object", m.object(&key)).map(|o| {
        Json(wire::ObjectInfo {
            key: o.key,
            length: o.length,
            status: match o.status {
                ObjectStatus::Processing => wire::ObjectStatus::Processing,
                ObjectStatus::Complete => wire::ObjectStatus::Complete,
            },
            client_id: o.client_id.to_string(),
            replicas: replicas(&o.replicas),
            lease_remaining_ms: o.lease_remaining_ms,
            soft_pinned: o.soft_pinned,
            hard_pinned: o.hard_pinned,
            put_started_ms_ago: o.put_started_ms_ago,
        })
    })
}

/// Remove a readable object; refused while leased unless `force=true`.
#[utoipa::path(delete, operation_id = routes::master::Remove::OPERATION_ID,
    path = routes::master::Remove::PATH, tag = super::TAG,
    params(("key" = String, Path, description = "Object key (percent-encoded)"), wire::RemoveQuery),
    responses((status = 200, description = "Removed", body = wire::RemovedResponse), MasterErrors))]
pub async fn remove_object(
    State(m): State<Arc<Master>>,
    ApiPath(key): ApiPath<String>,
    ApiQuery(q): ApiQuery<wire::RemoveQuery>,
) -> ApiResult<Json<wire::RemovedResponse>> {
    let r = durable(&m, m.remove(&key, q.force.unwrap_or(false))).await;
    observed("remove", r).map(|()| Json(wire::RemovedResponse { removed: 1 }))
}

/// Keys, ascending, filtered by prefix, paged with `after` (admin read).
#[utoipa::path(get, operation_id = routes::master::ListObjects::OPERATION_ID,
    path = routes::master::ListObjects::PATH, tag = super::TAG,
    params(wire::ListObjectsQuery),
    responses((status = 200, description = "A page of keys", body = wire::KeyPage), MasterErrors))]
pub async fn list_objects(
    State(m): State<Arc<Master>>,
    ApiQuery(q): ApiQuery<wire::ListObjectsQuery>,
) -> ApiResult<Json<wire::KeyPage>> {
    let r = blocking(&m, move |m| {
        m.list_keys(
            q.prefix.as_deref().unwrap_or(""),
            q.after.as_deref(),
            q.limit,
        )
    })
    .await
    .and_then(|r| r);
    observed("list_objects", r).map(|p| {
        Json(wire::KeyPage {
            keys: p.keys,
            next_after: p.next_after,
        })
    })
}

/// Bulk removal of complete objects without a live lease: `all=true`, or `regex=...`.
#[utoipa::path(delete, operation_id = routes::master::RemoveObjects::OPERATION_ID,
    path = routes::master::RemoveObjects::PATH, tag = super::TAG,
    params(wire::DeleteObjectsQuery),
    responses((status = 200, description = "Removed", body = wire::RemovedResponse), MasterErrors))]
pub async fn remove_objects(
    State(m): State<Arc<Master>>,
    ApiQuery(q): ApiQuery<wire::DeleteObjectsQuery>,
) -> ApiResult<Json<wire::RemovedResponse>> {
    // An empty regex is refused, not read as no regex: the document requires one
    // character (and an empty regex would match every key: that is `all=true`).
    let (op, r) = match (q.all, q.regex) {
        (_, Some(re)) if re.is_empty() => (
            "remove_by_regex",
            Err(MasterError::InvalidParams("regex is empty".into())),
        ),
        (Some(true), None) => ("remove_all", blocking(&m, |m| Ok(m.remove_all())).await),
        (None | Some(false), Some(re)) => (
            "remove_by_regex",
            blocking(&m, move |m| m.remove_by_regex(&re)).await,
        ),
        _ => (
            "remove_all",
            Err(MasterError::InvalidParams(
                "give exactly one of all=true or a non-empty regex=...".into(),
            )),
        ),
    };
    let r = durable(&m, r.and_then(|r| r)).await;
    observed(op, r).map(|removed| Json(wire::RemovedResponse { removed }))
}
