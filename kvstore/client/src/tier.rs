//! The owner's side of the disk tier: takes the master's tasks for this client's segment
//! and moves values between the segment and the disk ([`DiskStore`]), on blocking
//! threads, up to [`QUEUE_DEPTH`] at a time; then reports them with the next exchange.
//!
//! After a mount, a remount or a master change (its view version), the records the disk
//! holds are reported again, in chunks, so that a restarted node, a restarted master or a
//! new HA leader serves them without a re-put. Offloads are reported only once the
//! directory is synced: a record the master serves is durable.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use openapi::master::{DiskRecord, TierDone, TierExchange, TierTask, TierTaskKind};
use tokio_util::sync::CancellationToken;
use transfer::RegisteredBuffer;
use uuid::Uuid as ClientId;

use crate::disk::DiskStore;
use crate::heartbeat::HealthState;
use crate::rpc::MasterRpc;

pub use crate::disk::QUEUE_DEPTH;
/// Longest the master may hold an exchange back while it has no task for us.
const POLL_MS: u64 = 1000;
/// Records reported per exchange.
const REPORT_CHUNK: usize = 1024;
/// Rounds of tasks in a row whose offloads all failed, after which the disk counts as
/// failed and the node goes on without it (memory only). A full disk fails one round
/// (the bound drops to what is written) and makes room in the next, so it does not get
/// here.
const DEGRADE_AFTER: u32 = 3;

/// Counter: disk-tier tasks done by this owner, by `kind` and `result`.
pub const TASKS: &str = "moongate_store_disk_tasks_total";
/// Gauge: bytes of records on this owner's disk.
pub const DISK_BYTES: &str = "moongate_store_disk_bytes";
/// Gauge: records on this owner's disk.
pub const DISK_RECORDS: &str = "moongate_store_disk_records";
/// Counter: records that failed a checksum or were torn, and were removed.
pub const DISK_CORRUPT: &str = "moongate_store_disk_corrupt_total";
/// Gauge: 1 once the disk tier failed and the node went on without it.
pub const DISK_FAILED: &str = "moongate_store_disk_failed";

/// What the loop needs of the client.
pub(crate) struct Owner {
    pub(crate) rpc: MasterRpc,
    pub(crate) id: ClientId,
    pub(crate) segment: String,
    pub(crate) memory: RegisteredBuffer,
    pub(crate) disk: Arc<DiskStore>,
    pub(crate) health: Arc<HealthState>,
    pub(crate) retry: Duration,
    /// The specs the heartbeat remounts (the disk dropped from them if it fails).
    pub(crate) specs: Arc<parking_lot::Mutex<Vec<openapi::master::SegmentSpec>>>,
}

impl crate::StoreClient {
    /// Stops this client's disk tier (Mooncake's `unmount_local_disk_segment`): the task
    /// loop finishes the tasks under way and stops, remounts after this ask for no disk,
    /// and the master forgets the disk (`POST /api/v1/segments/{name}/tier/detach`): no
    /// value goes there any more, and the values that lived only there are gone. Then
    /// waits `grace`, for reads of the disk under way. The records stay in the directory
    /// (a client started on it later serves them again). Answers the objects the master
    /// dropped; 0 without a disk tier or once stopped.
    pub async fn unmount_disk(&self, grace: Duration) -> crate::StoreResult<u64> {
        let (Some((_, spec)), Some((stop, task))) =
            (&self.inner.segment, self.inner.tier.lock().take())
        else {
            return Ok(0);
        };
        stop.cancel();
        if let Err(e) = task.await {
            tracing::warn!(error = %e, "the disk tier's loop ended badly");
        }
        for s in self.inner.specs.lock().iter_mut() {
            s.disk_bytes = 0;
            s.disk_write_through = false;
        }
        let body = openapi::master::ClientRequest {
            client_id: self.inner.id.to_string(),
        };
        let dropped = self.inner.rpc.detach_disk(&spec.name, &body).await?.removed;
        tracing::info!(segment = %spec.name, dropped, "disk tier unmounted");
        tokio::time::sleep(grace).await;
        Ok(dropped)
    }
}

/// Runs the exchange until `stop`.
pub(crate) async fn run(owner: Owner, stop: CancellationToken) {
    let mut done: Vec<TierDone> = Vec::new();
    let mut dropped: Vec<String> = Vec::new();
    // Records still to report; filled after a mount, a remount or a master change.
    let mut report: Vec<DiskRecord> = owner.disk.records();
    let mut view = 0u64;
    let mut epoch = None;
    let mut remounts = owner.health.snapshot().remounts;
    // Rounds whose offloads all failed, since the last one written.
    let mut failing = 0u32;
    loop {
        let now_remounts = owner.health.snapshot().remounts;
        if now_remounts != remounts {
            remounts = now_remounts;
            report = owner.disk.records();
        }
        dropped.extend(owner.disk.take_lost());
        let chunk: Vec<DiskRecord> = report
            .drain(report.len().saturating_sub(REPORT_CHUNK)..)
            .collect();
        let quiet = done.is_empty() && dropped.is_empty() && chunk.is_empty();
        let body = TierExchange {
            client_id: owner.id.to_string(),
            done: std::mem::take(&mut done),
            dropped: std::mem::take(&mut dropped),
            records: chunk,
            wait_ms: if quiet { POLL_MS } else { 0 },
        };
        let answer = tokio::select! {
            _ = stop.cancelled() => return,
            a = owner.rpc.tier_exchange(&owner.segment, &body) => a,
        };
        let tasks = match answer {
            Ok(a) => {
                if view != 0 && a.view_version != view {
                    tracing::info!(segment = %owner.segment, "a new master: reporting the disk tier's records again");
                    report = owner.disk.records();
                }
                view = a.view_version;
                if epoch.is_some_and(|e| e != a.report_epoch) {
                    tracing::debug!(segment = %owner.segment, "the master forgot a segment's objects: reporting the disk tier's records again");
                    report = owner.disk.records();
                }
                epoch = Some(a.report_epoch);
                a.tasks
            }
            Err(e) => {
                // Not mounted yet, or the master is away: what was reported is lost with
                // it, so everything is reported again once it answers.
                tracing::debug!(segment = %owner.segment, error = %e, "disk tier exchange failed; retrying");
                done = body.done;
                dropped = body.dropped;
                report = owner.disk.records();
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(owner.retry) => {}
                }
                continue;
            }
        };
        if tasks.is_empty() {
            continue;
        }
        let (d, gone) = run_tasks(&owner, tasks).await;
        let offloaded = d
            .iter()
            .filter(|d| d.kind == TierTaskKind::Offload)
            .fold(None, |any_ok: Option<bool>, d| {
                Some(any_ok.unwrap_or(false) || d.ok)
            });
        match offloaded {
            Some(true) => failing = 0,
            Some(false) => failing += 1,
            None => {}
        }
        done = d;
        dropped = gone;
        if failing >= DEGRADE_AFTER {
            degrade(&owner, std::mem::take(&mut done), &stop).await;
            return;
        }
        let (bytes, records) = owner.disk.usage();
        metrics::gauge!(DISK_BYTES).set(bytes as f64);
        metrics::gauge!(DISK_RECORDS).set(records as f64);
        metrics::gauge!(DISK_CORRUPT)
            .set(owner.disk.counters().corrupt.load(Ordering::Relaxed) as f64);
    }
}

/// The disk failed every offload of `DEGRADE_AFTER` rounds in a row: reports them (the values stay in
/// memory), drops the disk from later remounts and has the master forget it, so the node
/// serves from memory alone instead of failing every eviction on a dead disk.
async fn degrade(owner: &Owner, done: Vec<TierDone>, stop: &CancellationToken) {
    tracing::error!(segment = %owner.segment, dir = %owner.disk.dir().display(), "the disk tier failed every write of {DEGRADE_AFTER} rounds in a row: going on without it (memory only)");
    metrics::gauge!(DISK_FAILED).set(1.0);
    for s in owner.specs.lock().iter_mut() {
        s.disk_bytes = 0;
        s.disk_write_through = false;
    }
    let body = TierExchange {
        client_id: owner.id.to_string(),
        done,
        dropped: Vec::new(),
        records: Vec::new(),
        wait_ms: 0,
    };
    let detach = openapi::master::ClientRequest {
        client_id: owner.id.to_string(),
    };
    // Until the master hears it (or the client stops).
    loop {
        let told = async {
            owner.rpc.tier_exchange(&owner.segment, &body).await?;
            owner.rpc.detach_disk(&owner.segment, &detach).await
        };
        let r = tokio::select! {
            _ = stop.cancelled() => return,
            r = told => r,
        };
        match r {
            // Told, or the master refused (it has no such segment or disk now): either
            // way the remounts to come ask for no disk.
            Ok(_) | Err(crate::StoreError::Master(_)) => return,
            Err(e) => {
                tracing::warn!(segment = %owner.segment, error = %e, "telling the master the disk failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(owner.retry) => {}
                }
            }
        }
    }
}

/// Runs `tasks`: the deletes first (a write of the same key may follow in the round),
/// then the rest, started in the master's order (loads before offloads); answers their
/// reports and the keys dropped to make room.
async fn run_tasks(owner: &Owner, tasks: Vec<TierTask>) -> (Vec<TierDone>, Vec<String>) {
    let (deletes, rest): (Vec<TierTask>, Vec<TierTask>) = tasks
        .into_iter()
        .partition(|t| t.kind == TierTaskKind::Delete);
    let mut results = run_concurrently(owner, deletes).await;
    results.extend(run_concurrently(owner, rest).await);
    let mut done = Vec::with_capacity(results.len());
    let mut dropped = Vec::new();
    for (d, gone) in results {
        dropped.extend(gone);
        done.push(d);
    }
    if done.iter().any(|d| d.ok && d.kind == TierTaskKind::Offload) {
        let disk = owner.disk.clone();
        let synced = tokio::task::spawn_blocking(move || disk.sync()).await;
        if !matches!(synced, Ok(Ok(()))) {
            tracing::warn!(segment = %owner.segment, "cannot sync the disk tier's directory: reporting this round's offloads as failed");
            for d in done.iter_mut().filter(|d| d.kind == TierTaskKind::Offload) {
                d.ok = false;
            }
        }
    }
    for d in &done {
        let kind = match d.kind {
            TierTaskKind::Offload => "offload",
            TierTaskKind::Load => "load",
            TierTaskKind::Delete => "delete",
        };
        let result = if d.ok { "ok" } else { "failed" };
        metrics::counter!(TASKS, "kind" => kind, "result" => result).increment(1);
    }
    (done, dropped)
}

/// Runs `tasks`, up to [`QUEUE_DEPTH`] at a time (started in order), each on a blocking
/// thread.
async fn run_concurrently(owner: &Owner, tasks: Vec<TierTask>) -> Vec<(TierDone, Vec<String>)> {
    futures::stream::iter(tasks)
        .map(|t| {
            let memory = owner.memory.clone();
            let disk = owner.disk.clone();
            async move {
                let (kind, key, id) = (t.kind, t.key.clone(), t.id);
                let span = load_span(&t);
                let (ok, gone) =
                    match tokio::task::spawn_blocking(move || one(&memory, &disk, t)).await {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::warn!(key, error = %e, "disk tier task failed");
                            (false, Vec::new())
                        }
                    };
                span.record("ok", ok);
                (TierDone { kind, key, ok, id }, gone)
            }
        })
        .buffer_unordered(QUEUE_DEPTH)
        .collect()
        .await
}

/// A load's span, for a process that exports traces (TRACE: otherwise a disabled
/// callsite's check): in its reader's trace when the read sent one (the master passes it
/// on in the task), so the reader sees the disk read its get waited for.
fn load_span(t: &TierTask) -> tracing::Span {
    if t.kind != TierTaskKind::Load {
        return tracing::Span::none();
    }
    let span = tracing::trace_span!(target: "kvclient::tier", "disk load", bytes = t.length,
        ok = tracing::field::Empty);
    if let Some(cx) = t
        .traceparent
        .as_deref()
        .and_then(|v| otlp::SpanContext::parse(v.as_bytes()))
    {
        otlp::set_remote_parent(&span, cx);
    }
    span
}

/// One task, on a blocking thread: whether it succeeded, and records dropped for room.
fn one(memory: &RegisteredBuffer, disk: &DiskStore, t: TierTask) -> (bool, Vec<String>) {
    let range = || -> Option<usize> {
        let offset = t.address.checked_sub(memory.addr())?;
        let end = offset.checked_add(t.length)?;
        (end <= memory.len() as u64).then_some(offset as usize)
    };
    match t.kind {
        TierTaskKind::Delete => {
            disk.delete(&t.key);
            (true, Vec::new())
        }
        TierTaskKind::Offload => {
            let Some(offset) = range() else {
                tracing::warn!(
                    key = t.key,
                    address = t.address,
                    length = t.length,
                    "an offload outside the segment: refused"
                );
                return (false, Vec::new());
            };
            match disk.write_from(&t.key, memory, offset, t.length as usize) {
                Ok(gone) => (true, gone),
                Err(e) => {
                    tracing::warn!(key = t.key, error = %e, "offload to disk failed; the value stays in memory");
                    (false, Vec::new())
                }
            }
        }
        TierTaskKind::Load => {
            let Some(offset) = range() else {
                tracing::warn!(
                    key = t.key,
                    address = t.address,
                    length = t.length,
                    "a load outside the segment: refused"
                );
                return (false, Vec::new());
            };
            match disk.read_into(&t.key, memory, offset, t.length as usize) {
                Ok(()) => (true, Vec::new()),
                Err(e) => {
                    tracing::warn!(key = t.key, error = %e, "reading back from disk failed: a miss");
                    (false, Vec::new())
                }
            }
        }
    }
}
