//! The disk tier over HTTP: reads that wait for a value to come back from disk, and the
//! owners' exchange of tasks (see `crate::master`'s `tier` module).

use openapi::routes;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use openapi::master as wire;
use tokio::time::Instant;

use super::{
    ApiJson, ApiPath, ApiResult, MasterErrors, client_id, detail, disk_replica, observed, replica,
};
use crate::master::{ClientId, Described, Lookup, Master, MasterError, MasterResult, ReplicaSet};

fn not_back(key: &str, wait: Duration) -> MasterError {
    MasterError::ReplicaIsNotReady(format!(
        "{key} is still being read back from disk after {} ms",
        wait.as_millis()
    ))
}

/// How often a read of a value on disk whose segment has no room looks again (room comes
/// back as offloads finish and read leases end).
const ROOM_POLL: Duration = Duration::from_millis(20);

/// One look: the replicas, or how long to wait before the next (`None`: until a load
/// finishes). No room on the disk's segment is waited out like a load, up to the deadline.
fn look(
    m: &Master,
    key: &str,
    reader: Option<ClientId>,
) -> MasterResult<Result<ReplicaSet, Option<Duration>>> {
    match m.lookup_as(key, reader) {
        Ok(Lookup::Ready(set)) => Ok(Ok(set)),
        Ok(Lookup::Loading) => Ok(Err(None)),
        Err(MasterError::NoAvailableHandle(_)) => Ok(Err(Some(ROOM_POLL))),
        Err(e) => Err(e),
    }
}

/// The replicas of `key`, waiting (up to `disk_load_wait_ms`) while it is read back from
/// a disk tier (unless it lies on the `reader`'s own disk: [`Master::lookup_as`]).
pub(super) async fn read(
    m: &Master,
    key: &str,
    reader: Option<ClientId>,
) -> MasterResult<ReplicaSet> {
    let mut out = read_batch(m, std::slice::from_ref(&key.to_owned()), reader).await?;
    out.pop()
        .unwrap_or_else(|| Err(not_back(key, Duration::ZERO)))
}

/// The replicas of each of `keys`, waiting (up to `disk_load_wait_ms`) for those read
/// back from a disk tier: every load starts at once, then the batch waits for them.
pub(super) async fn read_batch(
    m: &Master,
    keys: &[String],
    reader: Option<ClientId>,
) -> MasterResult<Vec<MasterResult<ReplicaSet>>> {
    let wait = Duration::from_millis(m.config().disk_load_wait_ms);
    let deadline = Instant::now() + wait;
    // Registered before each look, so a load finishing in between still wakes us.
    let woken = m.tier_changed().0.notified();
    tokio::pin!(woken);
    woken.as_mut().enable();
    let mut out: Vec<MasterResult<ReplicaSet>> = Vec::with_capacity(keys.len());
    let mut pending = Vec::new();
    let mut poll: Option<Duration> = None;
    for (i, r) in m.batch_lookup(keys, reader)?.into_iter().enumerate() {
        out.push(match r {
            Ok(Lookup::Ready(set)) => Ok(set),
            Ok(Lookup::Loading) => {
                pending.push(i);
                Err(not_back(&keys[i], wait))
            }
            Err(MasterError::NoAvailableHandle(_)) => {
                pending.push(i);
                poll = Some(ROOM_POLL);
                Err(not_back(&keys[i], wait))
            }
            Err(e) => Err(e),
        });
    }
    while !pending.is_empty() && Instant::now() < deadline {
        let until = poll.map_or(deadline, |p| deadline.min(Instant::now() + p));
        let _ = tokio::time::timeout_at(until, woken.as_mut()).await;
        woken.set(m.tier_changed().0.notified());
        woken.as_mut().enable();
        poll = None;
        pending.retain(|&i| match look(m, &keys[i], reader) {
            Ok(Err(p)) => {
                poll = poll.or(p);
                true
            }
            Ok(Ok(set)) => {
                out[i] = Ok(set);
                false
            }
            Err(e) => {
                out[i] = Err(e);
                false
            }
        });
    }
    Ok(out)
}

/// The disk tier's exchange with the owner of segment `name`: its finished tasks, dropped
/// records and disk records in; its next tasks out, held back up to `wait_ms` (at most
/// the master's `disk_load_wait_ms`) while there are none.
#[utoipa::path(post, operation_id = routes::master::TierExchangeRoute::OPERATION_ID,
    path = routes::master::TierExchangeRoute::PATH, tag = super::TAG,
    params(("name" = String, Path, description = "Segment name (percent-encoded)")),
    request_body = wire::TierExchange,
    responses((status = 200, description = "The next tasks", body = wire::TierTasks), MasterErrors))]
pub async fn exchange(
    State(m): State<Arc<Master>>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<wire::TierExchange>,
) -> ApiResult<Json<wire::TierTasks>> {
    let client = observed("tier_exchange", client_id(&req.client_id))?;
    let queued = m.tier_changed().1.notified();
    tokio::pin!(queued);
    queued.as_mut().enable();
    let r = m.tier_exchange(client, &name, &req.done, &req.dropped, &req.records);
    let (mut tasks, adopted) = observed("tier_exchange", r)?;
    let reported = !(req.done.is_empty() && req.dropped.is_empty() && req.records.is_empty());
    let wait = req.wait_ms.min(m.config().disk_load_wait_ms);
    if tasks.is_empty() && !reported && wait > 0 {
        let _ = tokio::time::timeout(Duration::from_millis(wait), queued).await;
        tasks = observed(
            "tier_exchange",
            m.tier_exchange(client, &name, &[], &[], &[]),
        )?
        .0;
    }
    Ok(Json(wire::TierTasks {
        tasks,
        adopted,
        view_version: m.view_version(),
        report_epoch: m.report_epoch(),
    }))
}

/// The owner of segment `name` stopped its disk tier: answers the objects that were
/// only on that disk, now gone.
#[utoipa::path(post, operation_id = routes::master::DetachDisk::OPERATION_ID,
    path = routes::master::DetachDisk::PATH, tag = super::TAG,
    params(("name" = String, Path, description = "Segment name (percent-encoded)")),
    request_body = wire::ClientRequest,
    responses((status = 200, description = "Objects dropped with the disk", body = wire::RemovedResponse), MasterErrors))]
pub async fn detach(
    State(m): State<Arc<Master>>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<wire::ClientRequest>,
) -> ApiResult<Json<wire::RemovedResponse>> {
    let r = client_id(&req.client_id).and_then(|c| m.detach_disk(c, &name));
    observed("detach_disk", r).map(|removed| Json(wire::RemovedResponse { removed }))
}

/// Readers are done with values their lookups answered with `release`.
#[utoipa::path(post, operation_id = routes::master::BatchReleaseReads::OPERATION_ID,
    path = routes::master::BatchReleaseReads::PATH, tag = super::TAG,
    request_body = wire::BatchKeysRequest,
    responses((status = 204, description = "Released"), MasterErrors))]
pub async fn release_reads(
    State(m): State<Arc<Master>>,
    ApiJson(req): ApiJson<wire::BatchKeysRequest>,
) -> ApiResult<axum::http::StatusCode> {
    observed("batch_release_reads", m.release_reads(&req.keys))
        .map(|()| axum::http::StatusCode::NO_CONTENT)
}

/// The wire form of a description: the memory replicas, then the disk one.
fn described(d: &Described) -> Vec<wire::Replica> {
    let mut out: Vec<wire::Replica> = d.memory.iter().map(replica).collect();
    out.extend(d.disk.iter().map(|s| disk_replica(s, d.length)));
    out
}

/// The replicas of many objects as they lie, memory and disk, without a lease and without
/// reading anything back from disk.
#[utoipa::path(post, operation_id = routes::master::BatchReplicaDescs::OPERATION_ID,
    path = routes::master::BatchReplicaDescs::PATH, tag = super::TAG,
    request_body = wire::BatchKeysRequest,
    responses((status = 200, description = "Per-key replicas or errors (no lease)", body = wire::BatchReplicasResponse), MasterErrors))]
pub async fn replica_descs(
    State(m): State<Arc<Master>>,
    ApiJson(req): ApiJson<wire::BatchKeysRequest>,
) -> ApiResult<Json<wire::BatchReplicasResponse>> {
    let results = observed("batch_replica_descs", m.batch_describe(&req.keys))?;
    let results = req
        .keys
        .into_iter()
        .zip(results)
        .map(|(key, r)| match r {
            Ok(d) => wire::BatchReplicasResult {
                key,
                length: Some(d.length),
                lease_ttl_ms: None,
                replicas: Some(described(&d)),
                release: false,
                error: None,
            },
            Err(e) => wire::BatchReplicasResult::failed(key, detail(&e)),
        })
        .collect();
    Ok(Json(wire::BatchReplicasResponse { results }))
}
