//! The master's REST API: a self-contained, documented router the host mounts.
//!
//! Handlers only parse, call the [`Master`], and render. Every failure, including bad
//! JSON, bad query strings and bad path parameters, is a [`MasterError`] rendered once
//! here as `openapi::master::MasterErrorResponse` with the status from
//! [`MasterError::http_status`]. Each operation is counted in `moongate_master_*` metrics.
//!
//! # Planes
//! The routes come in two routers, one per plane, so the host can put each behind its own
//! key (this crate checks no key; `moongate serve` and `moongate master` do):
//! [`store_router`] is what storage nodes and store clients need to run (their segments,
//! their objects, the transfer metadata), [`admin_router`] is what an operator uses to look
//! at or clean up the whole cluster. [`router`] is both, unguarded (tests, benches, tools).
//!
//! | route | plane | why |
//! |---|---|---|
//! | `POST /api/v1/clients/{id}/segments` (mount) | store | a node mounts its own segment |
//! | `POST /api/v1/clients/{id}/remount` | store | a node remounts after `need_remount` |
//! | `POST /api/v1/clients/{id}/ping` | store | heartbeat |
//! | `DELETE /api/v1/clients/{id}/segments/{name}` | store | unmount: the master refuses a segment of another client (`ILLEGAL_CLIENT`) |
//! | `DELETE /api/v1/clients/{id}` | store | a node leaving (`StoreClient::close`) forgets itself |
//! | `POST /api/v1/objects/{key}/put-start`, `put-end`, `put-revoke` | store | writes; put-end and put-revoke only by the client that started the put |
//! | `GET /api/v1/objects/{key}/replicas`, `.../exists` | store | reads (they grant leases) |
//! | `DELETE /api/v1/objects/{key}[?force=true]` | store | `StoreClient::remove` (Mooncake's `remove(key, force)`) |
//! | `POST /api/v1/batch/{put-start,put-end,put-commit,put-revoke,replicas,exists,remove}` | store | the batch forms of the above |
//! | `POST /api/v1/batch/replica-descs` | store | replica descriptions (memory and disk; no lease, nothing read back) |
//! | `POST /api/v1/batch/release-reads` | store | a reader is done with memory copies of values on disk |
//! | `POST /api/v1/batch/replica-clear` | store | a client clears its own objects' replicas (on one segment or all) |
//! | `GET /api/v1/events` | store | routers follow what the store holds (every key, as it is stored, moved, removed) |
//! | `POST /api/v1/segments/{name}/tier` | store | a segment's owner takes its disk-tier tasks; the master refuses another client's segment (`ILLEGAL_CLIENT`) |
//! | `GET/PUT/DELETE /metadata?key=` | store | transfer engines publish and look up segment descriptors |
//! | `GET /api/v1/clients`, `GET /api/v1/clients/{id}` | admin | every client of the cluster |
//! | `GET /api/v1/segments`, `GET /api/v1/segments/{name}` | admin | every segment, with usage |
//! | `GET /api/v1/stats` | admin | cluster totals |
//! | `GET /api/v1/objects` (list keys), `GET /api/v1/objects/{key}` (object info) | admin | reads across every client, without a lease |
//! | `DELETE /api/v1/objects?all=true\|regex=` | admin | bulk removal (`StoreClient::remove_all` needs the admin key) |
//!
//! # Layout
//! - `cluster`: clients and segments (mount, remount, unmount, ping, admin reads, stats).
//! - `objects`: one object's lifecycle and reads, key listing, bulk removal.
//! - `batch`: batch forms of every object operation.
//! - `tier`: the disk tier: reads that wait for a value coming back from disk, and the
//!   segment owners' exchange of tasks.
//! - `events`: the object events routers follow (a snapshot, then changes, long-polled).
//! - `metadata`: the Mooncake-compatible transfer-metadata store at `/metadata`.
//! - [`mooncake`]: Mooncake's master HTTP service (its metrics port), a router of its own.

mod batch;
mod cluster;
mod events;
pub mod limits;
mod metadata;
pub mod mooncake;
mod objects;
mod tier;

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRef, FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use openapi::master as wire;
use serde::de::DeserializeOwned;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::master::{
    ClientId, ClientStatus, ClientView, Master, MasterError, MasterResult, ReplicaLocation,
    ReplicaSet, Segment,
};

/// Largest request body the master accepts.
pub const BODY_LIMIT: usize = 8 << 20;

/// OpenAPI tag of the master's operations.
pub const TAG: &str = "kv-master";

/// The master's REST API (`/api/v1/...` and `/metadata`) with its state applied, every
/// route described for the OpenAPI document, no key checked: [`store_router`] and
/// [`admin_router`] merged. Mount it with `Router::merge` (or `OpenApiRouter::merge` to
/// merge the documents too).
pub fn router(master: Arc<Master>) -> OpenApiRouter {
    store_router(master.clone()).merge(admin_router(master))
}

/// The store plane (see the module doc): what storage nodes and store clients call.
pub fn store_router(master: Arc<Master>) -> OpenApiRouter {
    let limits = master.config().clone();
    let mut router = OpenApiRouter::with_openapi(MasterApiDoc::openapi())
        .routes(routes!(cluster::mount_segment))
        .routes(routes!(cluster::remount))
        .routes(routes!(cluster::unmount_segment))
        .routes(routes!(cluster::ping))
        .routes(routes!(cluster::remove_client))
        .routes(routes!(objects::put_start))
        .routes(routes!(objects::put_end))
        .routes(routes!(objects::put_revoke))
        .routes(routes!(objects::get_replicas))
        .routes(routes!(objects::exists))
        .routes(routes!(objects::remove_object))
        .routes(routes!(batch::put_start))
        .routes(routes!(batch::put_end))
        .routes(routes!(batch::put_commit))
        .routes(routes!(batch::put_revoke))
        .routes(routes!(batch::replicas_of))
        .routes(routes!(tier::replica_descs))
        .routes(routes!(tier::release_reads))
        .routes(routes!(batch::exists))
        .routes(routes!(batch::remove))
        .routes(routes!(batch::replica_clear))
        .routes(routes!(tier::exchange))
        .routes(routes!(tier::detach))
        .routes(routes!(events::events))
        .routes(routes!(
            metadata::get_metadata,
            metadata::put_metadata,
            metadata::delete_metadata
        ))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(master);
    limits::constrain(router.get_openapi_mut(), &limits);
    router
}

/// The admin plane (see the module doc): cluster-wide reads and bulk removal.
pub fn admin_router(master: Arc<Master>) -> OpenApiRouter {
    let limits = master.config().clone();
    let mut router = OpenApiRouter::with_openapi(MasterApiDoc::openapi())
        .routes(routes!(cluster::list_clients))
        .routes(routes!(cluster::get_client))
        .routes(routes!(cluster::list_segments))
        .routes(routes!(cluster::get_segment))
        .routes(routes!(cluster::stats))
        .routes(routes!(objects::get_object))
        .routes(routes!(objects::list_objects, objects::remove_objects))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(master);
    limits::constrain(router.get_openapi_mut(), &limits);
    router
}

/// Schemas referenced by every route's error responses.
#[derive(utoipa::OpenApi)]
#[openapi(components(schemas(wire::MasterErrorResponse, wire::MasterErrorDetail)))]
struct MasterApiDoc;

/// The error answers any master route may give, for the OpenAPI document.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum MasterErrors {
    /// `INVALID_PARAMS` (bad JSON, query or sizes) or `INVALID_KEY`.
    #[response(status = 400)]
    BadRequest(wire::MasterErrorResponse),
    /// `ILLEGAL_CLIENT`: not the client that owns the put or segment.
    #[response(status = 403)]
    Forbidden(wire::MasterErrorResponse),
    /// `OBJECT_NOT_FOUND`, `SEGMENT_NOT_FOUND` or `CLIENT_NOT_FOUND`.
    #[response(status = 404)]
    NotFound(wire::MasterErrorResponse),
    /// `OBJECT_ALREADY_EXISTS`, `OBJECT_HAS_LEASE`, `REPLICA_IS_NOT_READY`,
    /// `SEGMENT_ALREADY_EXISTS` or `INVALID_WRITE`.
    #[response(status = 409)]
    Conflict(wire::MasterErrorResponse),
    /// `INTERNAL_ERROR`.
    #[response(status = 500)]
    Internal(wire::MasterErrorResponse),
    /// `NO_AVAILABLE_HANDLE`: no segment has room, even after eviction.
    #[response(status = 507)]
    NoSpace(wire::MasterErrorResponse),
}

/// A master error on its way to the client.
#[derive(Debug)]
pub struct ApiError(pub MasterError);

impl From<MasterError> for ApiError {
    fn from(e: MasterError) -> Self {
        Self(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        match &self.0 {
            // States, not faults, that every request meets while they last (between HA
            // leaders, behind a follower; a full store, segments held after a failover):
            // the HA node logs its role changes, and the failure counters (by error name)
            // count these.
            MasterError::Unavailable(_) | MasterError::NoAvailableHandle(_) => {
                tracing::debug!(error = %self.0, "master request refused")
            }
            _ if status.is_server_error() => {
                tracing::error!(error = %self.0, "master request failed")
            }
            _ => {}
        }
        (
            status,
            axum::Json(wire::MasterErrorResponse {
                error: detail(&self.0),
            }),
        )
            .into_response()
    }
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

/// Counts `op` (and its failure) and turns the error into a response.
fn observed<T>(op: &'static str, r: MasterResult<T>) -> ApiResult<T> {
    crate::metrics::record_op(op, r.as_ref().err());
    r.map_err(ApiError)
}

/// `r`, once every change the call made is durable: at once on a plain master; on a
/// journaled (HA) master when committed, or `UNAVAILABLE` (retryable) when that does not
/// happen in time. A refused call changed nothing and answers at once.
async fn durable<T>(m: &Master, r: MasterResult<T>) -> MasterResult<T> {
    let r = r?;
    m.durable().await?;
    Ok(r)
}

/// Runs a call that may scan every shard off the async workers.
async fn blocking<T: Send + 'static>(
    master: &Arc<Master>,
    f: impl FnOnce(&Master) -> T + Send + 'static,
) -> MasterResult<T> {
    let m = master.clone();
    tokio::task::spawn_blocking(move || f(&m))
        .await
        .map_err(|e| MasterError::InternalError(format!("background call failed: {e}")))
}

fn rejected(what: &str, text: String) -> ApiError {
    let e = MasterError::InvalidParams(format!("{what}: {text}"));
    crate::metrics::record_op("bad_request", Some(&e));
    ApiError(e)
}

/// JSON body whose rejection is a typed `INVALID_PARAMS`. Every list in it is bounded by the
/// master's `max_batch_items` while it is parsed ([`openapi::bounded`]): a longer one is
/// refused before more items are allocated, whatever the body holds.
pub struct ApiJson<T>(pub T);

/// Whether `headers` declare a JSON body (`application/json`, or `application/*+json`, with
/// any parameters), as axum's `Json` decides.
fn json_content_type(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, sub)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (sub.eq_ignore_ascii_case("json")
            || sub.len() > 5 && sub.as_bytes()[sub.len() - 5..].eq_ignore_ascii_case(b"+json"))
}

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
    Arc<Master>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bad = |e: JsonRejection| rejected("bad JSON body", e.body_text());
        if !json_content_type(req.headers()) {
            return Err(rejected(
                "bad JSON body",
                "Expected request with `Content-Type: application/json`".into(),
            ));
        }
        let limit = Arc::<Master>::from_ref(state).config().max_batch_items;
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| bad(JsonRejection::from(e)))?;
        // Every body is a JSON object: serde would also take a struct as an array of its
        // fields in order, which no document describes.
        if bytes.trim_ascii_start().first() != Some(&b'{') {
            return Err(rejected(
                "bad JSON body",
                "the body must be a JSON object".into(),
            ));
        }
        // Hot path: plain serde_json (axum's parser tracks paths for its error message,
        // twice the cost); only a body that fails is parsed again for that message.
        openapi::bounded::with_limit(limit, || match serde_json::from_slice(&bytes) {
            Ok(v) => Ok(Self(v)),
            Err(_) => axum::Json::<T>::from_bytes(&bytes)
                .map(|axum::Json(v)| Self(v))
                .map_err(bad),
        })
    }
}

/// Query string whose rejection is a typed `INVALID_PARAMS`.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| Self(v))
            .map_err(|e: QueryRejection| rejected("bad query string", e.body_text()))
    }
}

/// Path parameters whose rejection is a typed `INVALID_PARAMS`.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(v)| Self(v))
            .map_err(|e: PathRejection| rejected("bad path", e.body_text()))
    }
}

fn detail(e: &MasterError) -> wire::MasterErrorDetail {
    wire::MasterErrorDetail {
        message: e.to_string(),
        kind: e.name().to_string(),
        code: e.code(),
    }
}

fn client_id(s: &str) -> MasterResult<ClientId> {
    ClientId::parse_str(s)
        .map_err(|_| MasterError::InvalidParams(format!("client_id {s:?} is not a UUID")))
}

fn replica(l: &ReplicaLocation) -> wire::Replica {
    wire::Replica {
        segment: l.segment.name().to_string(),
        endpoint: l.segment.endpoint().to_string(),
        address: l.address,
        length: l.length,
        kind: wire::ReplicaKind::Memory,
    }
}

/// The `local_disk` replica of a value of `length` bytes on `seg`'s owner's disk tier.
fn disk_replica(seg: &Segment, length: u64) -> wire::Replica {
    wire::Replica {
        segment: seg.name().to_string(),
        endpoint: seg.endpoint().to_string(),
        address: 0,
        length,
        kind: wire::ReplicaKind::LocalDisk,
    }
}

fn replicas(ls: &[ReplicaLocation]) -> Vec<wire::Replica> {
    ls.iter().map(replica).collect()
}

/// The wire replicas of a read's answer: its memory replicas, or the reader's own disk.
fn set_replicas(set: &ReplicaSet) -> Vec<wire::Replica> {
    let mut out = replicas(&set.replicas);
    out.extend(set.own_disk.iter().map(|s| disk_replica(s, set.length)));
    out
}

/// The caller's `traceparent` header, when it sent one as text (a read passes it on to
/// the loads it starts: [`crate::master::with_reader_trace`]).
fn traceparent(headers: &http::HeaderMap) -> Option<&str> {
    headers.get("traceparent")?.to_str().ok()
}

/// The reader a read lookup names (`?reader=`), if any.
fn reader(q: &wire::ReplicasQuery) -> MasterResult<Option<ClientId>> {
    q.reader.as_deref().map(client_id).transpose()
}

/// Refuses a request whose `reserve` asks for what no reservation can be (a length outside
/// `1..=max_object_bytes`): a malformed request is refused whole, while a reservation the
/// master cannot make now is only left out ([`reserve`]).
fn check_reserve(m: &Master, ask: Option<&wire::ReserveRequest>) -> MasterResult<()> {
    match ask {
        Some(a) if a.length == 0 || a.length > m.config().max_object_bytes => {
            Err(MasterError::InvalidParams(format!(
                "reserve length {} is outside 1..={}",
                a.length,
                m.config().max_object_bytes
            )))
        }
        _ => Ok(()),
    }
}

/// The reservations a request's `reserve` asks for (none when it asks for none, or when
/// reserving fails: a put never fails for want of reservations).
fn reserve(
    m: &Master,
    client: ClientId,
    ask: Option<&wire::ReserveRequest>,
    cfg: &wire::ReplicateConfig,
) -> Vec<wire::Reservation> {
    let Some(ask) = ask else {
        return Vec::new();
    };
    let use_within_ms = m.use_within_ms();
    m.reserve(client, ask.length, cfg, ask.count)
        .unwrap_or_default()
        .into_iter()
        .map(|r| wire::Reservation {
            id: r.id,
            length: r.length,
            replicas: replicas(&r.replicas),
            use_within_ms,
        })
        .collect()
}

fn client_status(s: ClientStatus) -> wire::ClientStatus {
    match s {
        ClientStatus::Ok => wire::ClientStatus::Ok,
        ClientStatus::NeedRemount => wire::ClientStatus::NeedRemount,
    }
}

fn client(v: ClientView) -> wire::Client {
    wire::Client {
        client_id: v.client_id.to_string(),
        status: client_status(v.status),
        last_seen_ms_ago: v.last_seen_ms_ago,
        segments: v.segments,
    }
}
