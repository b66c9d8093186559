//! Batch forms of every object operation: one request, one result per item in request
//! order. A refused item carries `error`; the others still happen.

use openapi::routes;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use openapi::master as wire;

use super::{
    ApiJson, ApiQuery, ApiResult, MasterErrors, check_reserve, client_id, detail, durable,
    observed, replicas, reserve, set_replicas,
};
use crate::master::{Master, MasterResult};

/// Counts each item as one `op` request (the batch itself is counted as `batch_<op>`).
fn items<T>(op: &'static str, results: &[MasterResult<T>]) {
    crate::metrics::record_ops(op, results.iter().map(|r| r.as_ref().err()));
}

fn key_results(keys: Vec<String>, results: Vec<MasterResult<()>>) -> wire::BatchKeyResponse {
    let results = keys
        .into_iter()
        .zip(results)
        .map(|(key, r)| wire::BatchKeyResult {
            key,
            error: r.err().map(|e| detail(&e)),
        })
        .collect();
    wire::BatchKeyResponse { results }
}

/// Start puts of many objects with one placement config.
#[utoipa::path(post, operation_id = routes::master::BatchPutStart::OPERATION_ID,
    path = routes::master::BatchPutStart::PATH, tag = super::TAG,
    request_body = wire::BatchPutStartRequest,
    responses((status = 200, description = "Per-item replicas or errors", body = wire::BatchPutStartResponse), MasterErrors))]
pub async fn put_start(
    State(m): State<Arc<Master>>,
    ApiJson(req): ApiJson<wire::BatchPutStartRequest>,
) -> ApiResult<Json<wire::BatchPutStartResponse>> {
    let cfg = req.config;
    let pairs: Vec<(String, u64)> = req.items.into_iter().map(|i| (i.key, i.length)).collect();
    let r = check_reserve(&m, req.reserve.as_ref()).and_then(|()| client_id(&req.client_id));
    let r = r.and_then(|c| {
        match req.renew {
            true => m.batch_renew_put(c, &pairs, req.put_id),
            false => m.batch_put_start(c, &pairs, &cfg, req.put_id),
        }
        .map(|r| (c, r))
    });
    let (c, results) = observed("batch_put_start", r)?;
    items("put_start", &results);
    let results = pairs
        .into_iter()
        .zip(results)
        .map(|((key, _), r)| match r {
            Ok(locs) => wire::BatchPutStartResult {
                key,
                replicas: Some(replicas(&locs)),
                error: None,
            },
            Err(e) => wire::BatchPutStartResult {
                key,
                replicas: None,
                error: Some(detail(&e)),
            },
        })
        .collect();
    let ask = req.reserve.as_ref().filter(|_| !req.renew);
    Ok(Json(wire::BatchPutStartResponse {
        results,
        reservations: reserve(&m, c, ask, &cfg),
        write_within_ms: m.use_within_ms(),
    }))
}

/// Commit values written into reservations (see `reserve` on put-start): each becomes
/// readable as after put-start and put-end, in one request. A reservation that no longer
/// exists answers `RESERVATION_NOT_FOUND` for its item (put that value the two-request way).
#[utoipa::path(post, operation_id = routes::master::BatchPutCommit::OPERATION_ID,
    path = routes::master::BatchPutCommit::PATH, tag = super::TAG,
    request_body = wire::BatchPutCommitRequest,
    responses((status = 200, description = "Per-key results and new reservations", body = wire::BatchPutCommitResponse), MasterErrors))]
pub async fn put_commit(
    State(m): State<Arc<Master>>,
    ApiJson(req): ApiJson<wire::BatchPutCommitRequest>,
) -> ApiResult<Json<wire::BatchPutCommitResponse>> {
    let items_in: Vec<(&str, u64, u64)> = req
        .items
        .iter()
        .map(|i| (i.key.as_str(), i.reservation, i.length))
        .collect();
    // The placement of the new reservations is checked even when none is asked for: a
    // request the document calls invalid is refused whole.
    let r = m
        .check_config(&req.config)
        .and_then(|()| check_reserve(&m, req.reserve.as_ref()));
    let r = r
        .and_then(|()| client_id(&req.client_id))
        .and_then(|c| m.batch_put_commit(c, &items_in).map(|r| (c, r)));
    let (c, results) = observed("batch_put_commit", durable(&m, r).await)?;
    items("put_commit", &results);
    let keys = req.items.into_iter().map(|i| i.key).collect();
    Ok(Json(wire::BatchPutCommitResponse {
        results: key_results(keys, results).results,
        reservations: reserve(&m, c, req.reserve.as_ref(), &req.config),
    }))
}

/// End puts of many objects.
#[utoipa::path(post, operation_id = routes::master::BatchPutEnd::OPERATION_ID,
    path = routes::master::BatchPutEnd::PATH, tag = super::TAG,
    request_body = wire::BatchClientKeysRequest,
    responses((status = 200, description = "Per-key results", body = wire::BatchKeyResponse), MasterErrors))]
pub async fn put_end(
    State(m): State<Arc<Master>>,
    ApiJson(req): ApiJson<wire::BatchClientKeysRequest>,
) -> ApiResult<Json<wire::BatchKeyResponse>> {
    let r = client_id(&req.client_id).and_then(|c| m.batch_put_end(c, &req.keys));
    let r = durable(&m, r).await;
    let results = observed("batch_put_end", r)?;
    items("put_end", &results);
    Ok(Json(key_results(req.keys, results)))
}

/// Revoke unfinished puts of many objects.
#[utoipa::path(post, operation_id = routes::master::BatchPutRevoke::OPERATION_ID,
    path = routes::master::BatchPutRevoke::PATH, tag = super::TAG,
    request_body = wire::BatchClientKeysRequest,
    responses((status = 200, description = "Per-key results", body = wire::BatchKeyResponse), MasterErrors))]
pub async fn put_revoke(
    State(m): State<Arc<Master>>,
    ApiJson(req): ApiJson<wire::BatchClientKeysRequest>,
) -> ApiResult<Json<wire::BatchKeyResponse>> {
    let r = client_id(&req.client_id).and_then(|c| m.batch_put_revoke(c, &req.keys));
    let results = observed("batch_put_revoke", r)?;
    items("put_revoke", &results);
    Ok(Json(key_results(req.keys, results)))
}

/// Replicas of many objects, each granted a read lease.
#[utoipa::path(post, operation_id = routes::master::BatchGetReplicas::OPERATION_ID,
    path = routes::master::BatchGetReplicas::PATH, tag = super::TAG,
    params(wire::ReplicasQuery),
    request_body = wire::BatchKeysRequest,
    responses((status = 200, description = "Per-key replicas or errors", body = wire::BatchReplicasResponse), MasterErrors))]
pub async fn replicas_of(
    State(m): State<Arc<Master>>,
    ApiQuery(q): ApiQuery<wire::ReplicasQuery>,
    headers: http::HeaderMap,
    ApiJson(req): ApiJson<wire::BatchKeysRequest>,
) -> ApiResult<Json<wire::BatchReplicasResponse>> {
    let results = match super::reader(&q) {
        Ok(reader) => {
            let read = super::tier::read_batch(&m, &req.keys, reader);
            crate::master::with_reader_trace(super::traceparent(&headers), read).await
        }
        Err(e) => Err(e),
    };
    let results = observed("batch_get_replicas", results)?;
    items("get_replicas", &results);
    let results = req
        .keys
        .into_iter()
        .zip(results)
        .map(|(key, r)| match r {
            Ok(set) => wire::BatchReplicasResult {
                key,
                length: Some(set.length),
                lease_ttl_ms: Some(set.lease_ttl_ms),
                replicas: Some(set_replicas(&set)),
                release: set.release,
                error: None,
            },
            Err(e) => wire::BatchReplicasResult::failed(key, detail(&e)),
        })
        .collect();
    Ok(Json(wire::BatchReplicasResponse { results }))
}

/// Existence of many objects; each existing one is granted a read lease.
#[utoipa::path(post, operation_id = routes::master::BatchExists::OPERATION_ID,
    path = routes::master::BatchExists::PATH, tag = super::TAG,
    request_body = wire::BatchKeysRequest,
    responses((status = 200, description = "Per-key existence", body = wire::BatchExistsResponse), MasterErrors))]
pub async fn exists(
    State(m): State<Arc<Master>>,
    ApiJson(req): ApiJson<wire::BatchKeysRequest>,
) -> ApiResult<Json<wire::BatchExistsResponse>> {
    let results = observed("batch_exists", m.batch_exists(&req.keys))?;
    items("exists", &results);
    let ttl = m.config().lease_ttl_ms;
    let results = req
        .keys
        .into_iter()
        .zip(results)
        .map(|(key, r)| {
            let exists = *r.as_ref().unwrap_or(&false);
            wire::BatchExistsResult {
                key,
                exists,
                lease_ttl_ms: exists.then_some(ttl),
                error: r.err().map(|e| detail(&e)),
            }
        })
        .collect();
    Ok(Json(wire::BatchExistsResponse { results }))
}

/// Remove many objects; leased ones are refused unless `force`.
#[utoipa::path(post, operation_id = routes::master::BatchRemove::OPERATION_ID,
    path = routes::master::BatchRemove::PATH, tag = super::TAG,
    request_body = wire::BatchRemoveRequest,
    responses((status = 200, description = "Per-key results", body = wire::BatchKeyResponse), MasterErrors))]
pub async fn remove(
    State(m): State<Arc<Master>>,
    ApiJson(req): ApiJson<wire::BatchRemoveRequest>,
) -> ApiResult<Json<wire::BatchKeyResponse>> {
    let r = durable(&m, m.batch_remove(&req.keys, req.force)).await;
    let results = observed("batch_remove", r)?;
    items("remove", &results);
    Ok(Json(key_results(req.keys, results)))
}

/// Clear the replicas a client's own objects have on one segment (or all of them: the
/// objects go); read-leased and unfinished objects are left alone.
#[utoipa::path(post, operation_id = routes::master::BatchReplicaClear::OPERATION_ID,
    path = routes::master::BatchReplicaClear::PATH, tag = super::TAG,
    request_body = wire::ReplicaClearRequest,
    responses((status = 200, description = "The keys cleared", body = wire::ReplicaClearResponse), MasterErrors))]
pub async fn replica_clear(
    State(m): State<Arc<Master>>,
    ApiJson(req): ApiJson<wire::ReplicaClearRequest>,
) -> ApiResult<Json<wire::ReplicaClearResponse>> {
    let r = client_id(&req.client_id)
        .and_then(|c| m.replica_clear(c, &req.keys, req.segment.as_deref()));
    let r = durable(&m, r).await;
    observed("batch_replica_clear", r).map(|cleared| Json(wire::ReplicaClearResponse { cleared }))
}
