//! Clients and segments: mount, remount, unmount, ping; admin reads and totals.

use openapi::routes;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use openapi::master as wire;

use super::{
    ApiJson, ApiPath, ApiResult, MasterErrors, blocking, client, client_id, client_status, durable,
    observed,
};
use crate::master::Master;

/// Mount one segment for a client (idempotent for the same geometry).
#[utoipa::path(post, operation_id = routes::master::MountSegment::OPERATION_ID,
    path = routes::master::MountSegment::PATH, tag = super::TAG,
    params(("client_id" = String, Path, format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", description = "Client UUID")),
    request_body = wire::SegmentSpec,
    responses((status = 200, description = "Mounted", body = wire::Segment), MasterErrors))]
pub async fn mount_segment(
    State(m): State<Arc<Master>>,
    ApiPath(id): ApiPath<String>,
    ApiJson(spec): ApiJson<wire::SegmentSpec>,
) -> ApiResult<Json<wire::Segment>> {
    let r = client_id(&id).and_then(|c| m.mount_segment(c, spec));
    let r = durable(&m, r).await;
    observed("mount_segment", r).map(|v| Json(v.into()))
}

/// Remount every segment of a client after `need_remount`; the client is `ok` afterwards.
#[utoipa::path(post, operation_id = routes::master::Remount::OPERATION_ID,
    path = routes::master::Remount::PATH, tag = super::TAG,
    params(("client_id" = String, Path, format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", description = "Client UUID")),
    request_body = wire::RemountRequest,
    responses((status = 200, description = "Remounted", body = wire::Client), MasterErrors))]
pub async fn remount(
    State(m): State<Arc<Master>>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<wire::RemountRequest>,
) -> ApiResult<Json<wire::Client>> {
    let specs = req.segments.into_iter().collect();
    let r = match client_id(&id) {
        // A journaled master marks the client `ok` once the mounts are committed.
        Ok(c) => durable(&m, m.remount_segments(c, specs))
            .await
            .and_then(|_| m.client(c)),
        Err(e) => Err(e),
    };
    observed("remount", r).map(|v| Json(client(v)))
}

/// Unmount one of the client's segments; replicas on it are dropped.
#[utoipa::path(delete, operation_id = routes::master::UnmountSegment::OPERATION_ID,
    path = routes::master::UnmountSegment::PATH, tag = super::TAG,
    params(("client_id" = String, Path, format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", description = "Client UUID"),
           ("name" = String, Path, description = "Segment name")),
    responses((status = 204, description = "Unmounted"), MasterErrors))]
pub async fn unmount_segment(
    State(m): State<Arc<Master>>,
    ApiPath((id, name)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    let r = match client_id(&id) {
        Ok(c) => {
            let r = blocking(&m, move |m| m.unmount_segment(c, &name)).await;
            durable(&m, r.and_then(|r| r)).await
        }
        Err(e) => Err(e),
    };
    observed("unmount_segment", r).map(|()| StatusCode::NO_CONTENT)
}

/// Heartbeat (every second); answers whether the client must remount.
#[utoipa::path(post, operation_id = routes::master::Ping::OPERATION_ID,
    path = routes::master::Ping::PATH, tag = super::TAG,
    params(("client_id" = String, Path, format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", description = "Client UUID")),
    responses((status = 200, description = "Alive", body = wire::PingResponse), MasterErrors))]
pub async fn ping(
    State(m): State<Arc<Master>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<wire::PingResponse>> {
    let r = client_id(&id).map(|c| m.ping(c));
    observed("ping", r).map(|p| {
        Json(wire::PingResponse {
            view_version: p.view_version,
            status: client_status(p.status),
        })
    })
}

/// Every known client.
#[utoipa::path(get, operation_id = routes::master::ListClients::OPERATION_ID,
    path = routes::master::ListClients::PATH, tag = super::TAG,
    responses((status = 200, description = "Clients", body = wire::ClientList), MasterErrors))]
pub async fn list_clients(State(m): State<Arc<Master>>) -> ApiResult<Json<wire::ClientList>> {
    let clients = m.clients().into_iter().map(client).collect();
    observed("list_clients", Ok(Json(wire::ClientList { clients })))
}

/// One client.
#[utoipa::path(get, operation_id = routes::master::GetClient::OPERATION_ID,
    path = routes::master::GetClient::PATH, tag = super::TAG,
    params(("client_id" = String, Path, format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", description = "Client UUID")),
    responses((status = 200, description = "Client", body = wire::Client), MasterErrors))]
pub async fn get_client(
    State(m): State<Arc<Master>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<wire::Client>> {
    let r = client_id(&id).and_then(|c| m.client(c));
    observed("get_client", r).map(|v| Json(client(v)))
}

/// Forget a client and unmount all its segments (graceful shutdown of a store node).
#[utoipa::path(delete, operation_id = routes::master::RemoveClient::OPERATION_ID,
    path = routes::master::RemoveClient::PATH, tag = super::TAG,
    params(("client_id" = String, Path, format = "uuid", pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", description = "Client UUID")),
    responses((status = 204, description = "Removed"), MasterErrors))]
pub async fn remove_client(
    State(m): State<Arc<Master>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let r = match client_id(&id) {
        Ok(c) => {
            let r = blocking(&m, move |m| m.remove_client(c)).await;
            durable(&m, r.and_then(|r| r)).await
        }
        Err(e) => Err(e),
    };
    observed("remove_client", r).map(|()| StatusCode::NO_CONTENT)
}

/// Every mounted segment with capacity and usage.
#[utoipa::path(get, operation_id = routes::master::ListSegments::OPERATION_ID,
    path = routes::master::ListSegments::PATH, tag = super::TAG,
    responses((status = 200, description = "Segments", body = wire::SegmentList), MasterErrors))]
pub async fn list_segments(State(m): State<Arc<Master>>) -> ApiResult<Json<wire::SegmentList>> {
    let segments = m.segments().into_iter().map(Into::into).collect();
    observed("list_segments", Ok(Json(wire::SegmentList { segments })))
}

/// One segment.
#[utoipa::path(get, operation_id = routes::master::GetSegment::OPERATION_ID,
    path = routes::master::GetSegment::PATH, tag = super::TAG,
    params(("name" = String, Path, description = "Segment name")),
    responses((status = 200, description = "Segment", body = wire::Segment), MasterErrors))]
pub async fn get_segment(
    State(m): State<Arc<Master>>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<wire::Segment>> {
    observed("get_segment", m.segment(&name)).map(|v| Json(v.into()))
}

/// Totals: capacity, usage, keys, segments, clients, evictions.
#[utoipa::path(get, operation_id = routes::master::Stats::OPERATION_ID,
    path = routes::master::Stats::PATH, tag = super::TAG,
    responses((status = 200, description = "Totals", body = wire::MasterStats), MasterErrors))]
pub async fn stats(State(m): State<Arc<Master>>) -> ApiResult<Json<wire::MasterStats>> {
    observed("stats", Ok(Json(m.stats())))
}
