//! The HA master: several masters of one cluster on etcd, one leader serving, every
//! durable change committed to etcd before it is acknowledged.
//!
//! # Contract
//! A `put_end`, `remove`, mount or unmount that was acknowledged survives the loss of any
//! one master (and of any minority of etcd members): the leader answers it only after the
//! etcd transaction carrying it committed (see `crate::master::journal` for the order of
//! memory and etcd per change, and `journal` for group commit). Mooncake's HA acknowledges
//! `PutEnd` before its op-log entry is durable; this one never does.
//!
//! # Layout
//! - `config`: [`HaConfig`], every setting and its default (always compiled).
//! - `layout` (feature `etcd`): the keys in etcd and a follower's copy of them.
//! - `journal` (feature `etcd`): the leader's fenced group commit.
//! - `node` (feature `etcd`): election, following, leading, stepping down (`HaNode`).
//! - here: how requests reach the leader (`gated`) and `GET /api/v1/ha`
//!   (`status_router`). How a client given `etcd://` finds the masters is the client's
//!   (the keys masters announce themselves under are `openapi::master::etcd`'s).
//!
//! # Recovery argument
//! 1. *Fencing.* Every write is a transaction guarded by
//!    `create_revision(<prefix>leader) == term`. The leader key lives on the leader's lease;
//!    once the lease is gone (expired, revoked) the key is gone, and a new leader's key has a
//!    higher create revision, so no write of an older term can commit after the new key
//!    exists, however long the old leader was frozen or partitioned.
//! 2. *Complete state.* The keyspace is the state (no log to replay). A new leader with
//!    term `T` waits until its copy (a full load, then a watch) has applied revision `T`.
//!    Every committed write of an older term has a revision below `T` (by 1), so the copy
//!    holds all of them; none can come after (by 1).
//! 3. *Nothing visible is lost.* A put turns readable only after its record committed; a
//!    removed object's space is reused only after its delete committed. So what a reader
//!    saw, or a writer was told, is in etcd; and no record in etcd points at bytes that a
//!    later put overwrote.
//! 4. *Leases and TTLs restart.* The new leader grants every object a fresh read lease (old
//!    readers may still be reading) and every client with segments a fresh TTL: live
//!    clients are answered `ok`, with a new view version, and need not remount.
//! 5. *Stale records* (objects whose every replica's mount has ended, overridden mounts)
//!    are not loaded; the new leader deletes them.
//!
//! Not durable (lost on failover, rebuilt by the clients): puts started and not ended
//! (their writer's `put_end` fails and it puts again), the transfer-metadata store (nodes
//! publish their descriptors again; peers default to fetching them peer-to-peer). Reserved
//! space would be lost the same way, and worse: a client writes into a reservation for up
//! to its `use_within_ms`, longer than a failover takes, while the new leader hands the
//! space out again; so a journaled master reserves nothing (`crate::master::reserve`).
//!
//! The space of a put started and not ended looks free to the new leader, while its writer
//! may still write into it. So a new leader keeps every restored segment (and any leader a
//! segment remounted after its client's TTL ran out) from taking new values for the write
//! window (`use_within_ms`, a tenth of `reservation_ttl_ms`: 3 s by
//! default), and a client starts writing a put-start's replicas only within that window of
//! sending the request, or revokes the put (`write_within_ms` in the answer). Reads are
//! served at once; puts answer `NO_AVAILABLE_HANDLE` until the window is over. Left: a
//! write begun inside the window and still landing after it (the window is counted from the
//! new leader's restore, so it would have to take longer than the failover itself).

mod config;
#[cfg(feature = "etcd")]
mod journal;
#[cfg(feature = "etcd")]
mod layout;
#[cfg(feature = "etcd")]
mod node;

pub use config::{HaConfig, MAX_TXN_BYTES, env};
#[cfg(feature = "etcd")]
pub use node::{HaNode, HaStatus, Role};

#[cfg(feature = "etcd")]
mod serve {
    use axum::extract::{Request, State};
    use axum::middleware::Next;
    use axum::response::{IntoResponse, Response};
    use axum::{Json, http};
    use openapi::master as wire;
    use tower::ServiceExt;
    use utoipa_axum::router::OpenApiRouter;
    use utoipa_axum::routes;

    use super::node::{HaNode, Route};
    use crate::master::MasterError;
    use crate::rest::ApiError;

    /// `router` (the master's routes, built on any master: only its documentation is
    /// used) answered by the leader: this master's current one while it leads, a
    /// `307 Temporary Redirect` to the leader (`Location` set) while it follows, 503
    /// `UNAVAILABLE` while no leader is known. Put the host's guards (keys) around it.
    pub fn gated(router: OpenApiRouter, node: &HaNode) -> OpenApiRouter {
        router.layer(axum::middleware::from_fn_with_state(node.clone(), gate))
    }

    async fn gate(State(node): State<HaNode>, req: Request, _next: Next) -> Response {
        match node.route() {
            Route::Serve(app) => match app.oneshot(fresh(req)).await {
                Ok(r) => r,
                Err(never) => match never {},
            },
            Route::Redirect(leader) => {
                let path = req
                    .uri()
                    .path_and_query()
                    .map_or("/", |p| p.as_str())
                    .to_owned();
                let location = format!("{}{path}", leader.trim_end_matches('/'));
                let mut resp = ApiError(MasterError::Unavailable(format!(
                    "this master follows; the leader is {leader}"
                )))
                .into_response();
                *resp.status_mut() = http::StatusCode::TEMPORARY_REDIRECT;
                if let Ok(v) = http::HeaderValue::from_str(&location) {
                    resp.headers_mut().insert(http::header::LOCATION, v);
                }
                resp
            }
            Route::Unavailable(why) => ApiError(MasterError::Unavailable(why)).into_response(),
        }
    }

    /// `req` without what the outer router left in its extensions (its path parameters
    /// would be read by the leader's router as its own), the peer's address kept.
    fn fresh(req: Request) -> Request {
        let (parts, body) = req.into_parts();
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .cloned();
        let mut out = Request::new(body);
        *out.method_mut() = parts.method;
        *out.uri_mut() = parts.uri;
        *out.version_mut() = parts.version;
        *out.headers_mut() = parts.headers;
        if let Some(peer) = peer {
            out.extensions_mut().insert(peer);
        }
        out
    }

    /// `GET /api/v1/ha`, answered by every master of the cluster itself (the host puts it
    /// on the store plane, next to the routes [`gated`] forwards).
    pub fn status_router(node: &HaNode) -> OpenApiRouter {
        OpenApiRouter::new()
            .routes(routes!(ha_status))
            .with_state(node.clone())
    }

    /// This master's role in its HA cluster, the leader's URL and term.
    #[utoipa::path(get, operation_id = openapi::routes::master::HaStatusRoute::OPERATION_ID,
    path = openapi::routes::master::HaStatusRoute::PATH, tag = crate::rest::TAG,
        responses((status = 200, description = "Role, leader and term", body = wire::HaStatus)))]
    async fn ha_status(State(node): State<HaNode>) -> Json<wire::HaStatus> {
        let s = node.status();
        Json(wire::HaStatus {
            role: s.role.as_str().to_owned(),
            leader_url: s.leader_url,
            term: s.term,
        })
    }
}

#[cfg(feature = "etcd")]
pub use serve::{gated, status_router};

/// `GET /api/v1/ha` of a master without HA: `{"role": "standalone", "leader_url": null,
/// "term": 0}`, so tools can ask any master the same question.
pub fn standalone_router() -> utoipa_axum::router::OpenApiRouter {
    utoipa_axum::router::OpenApiRouter::new().routes(utoipa_axum::routes!(standalone_status))
}

/// This master's role: it runs alone (no HA).
#[utoipa::path(get, operation_id = openapi::routes::master::HaStatusRoute::OPERATION_ID,
    path = openapi::routes::master::HaStatusRoute::PATH, tag = crate::rest::TAG,
    responses((status = 200, description = "Role, leader and term", body = openapi::master::HaStatus)))]
async fn standalone_status() -> axum::Json<openapi::master::HaStatus> {
    axum::Json(openapi::master::HaStatus {
        role: "standalone".to_owned(),
        leader_url: None,
        term: 0,
    })
}
