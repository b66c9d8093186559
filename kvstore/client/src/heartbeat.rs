//! The client's heartbeat: a ping every period; when the master answers `need_remount`
//! (it restarted, or expired this client after a silence longer than its TTL) the client
//! remounts every segment it has. The state is kept for [`ClientHealth`]. A storage node
//! whose segment is being faulted in mounts it once that is done ([`mount_when_warm`]),
//! then heartbeats.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use openapi::master::ClientStatus;
use parking_lot::Mutex;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::rpc::MasterRpc;
use openapi::master::SegmentSpec;
use uuid::Uuid as ClientId;

/// Heartbeat and mount state of a client, as reported by `/health` of a storage node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientHealth {
    /// Whether the client's segments are mounted as far as it knows (pure clients: false).
    pub mounted: bool,
    /// Pings answered.
    pub pings: u64,
    /// Pings that failed (master unreachable or refusing).
    pub ping_failures: u64,
    /// Pings failed since the last answered one.
    pub consecutive_failures: u64,
    /// Remounts done after `need_remount`.
    pub remounts: u64,
    /// View version of the master last seen (changes when the master restarts).
    pub view_version: u64,
    /// Time since the last answered ping, if any.
    pub last_ping_ok: Option<Duration>,
}

#[derive(Debug)]
pub(crate) struct HealthState {
    has_segments: bool,
    mounted: AtomicBool,
    pings: AtomicU64,
    failures: AtomicU64,
    consecutive: AtomicU64,
    remounts: AtomicU64,
    view_version: AtomicU64,
    last_ok: Mutex<Option<Instant>>,
    /// False while the segment is faulted in before its first mount ([`mount_when_warm`]);
    /// true once that mount was tried (or was not deferred).
    settled: tokio::sync::watch::Sender<bool>,
}

impl HealthState {
    pub(crate) fn new(mounted: bool) -> Self {
        Self {
            has_segments: mounted,
            mounted: AtomicBool::new(mounted),
            pings: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            consecutive: AtomicU64::new(0),
            remounts: AtomicU64::new(0),
            view_version: AtomicU64::new(0),
            last_ok: Mutex::new(None),
            settled: tokio::sync::watch::Sender::new(true),
        }
    }

    /// The first mount waits for the segment to be faulted in.
    pub(crate) fn defer_mount(&self) {
        self.settled.send_replace(false);
    }

    /// Waits until a deferred first mount was tried (at once when none is deferred).
    pub(crate) async fn settled(&self) {
        let _ = self.settled.subscribe().wait_for(|s| *s).await;
    }

    /// The master's view version as the last ping saw it (0 before the first).
    pub(crate) fn view_version(&self) -> u64 {
        self.view_version.load(Ordering::Relaxed)
    }

    pub(crate) fn set_mounted(&self, m: bool) {
        self.mounted
            .store(m && self.has_segments, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ClientHealth {
        ClientHealth {
            mounted: self.mounted.load(Ordering::Relaxed),
            pings: self.pings.load(Ordering::Relaxed),
            ping_failures: self.failures.load(Ordering::Relaxed),
            consecutive_failures: self.consecutive.load(Ordering::Relaxed),
            remounts: self.remounts.load(Ordering::Relaxed),
            view_version: self.view_version.load(Ordering::Relaxed),
            last_ping_ok: self.last_ok.lock().map(|t| t.elapsed()),
        }
    }
}

/// Pings every `period` until `stop`; remounts `segments` (as they are then: a disk tier
/// detached is no longer asked for) when told to (not once `stop` is set). A ping or remount under way when `stop` is set is finished, not dropped, so
/// that none reaches the master after the client has left it.
pub(crate) async fn run(
    rpc: MasterRpc,
    id: ClientId,
    segments: Arc<parking_lot::Mutex<Vec<SegmentSpec>>>,
    health: Arc<HealthState>,
    period: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match rpc.ping(id).await {
            Ok(p) => {
                health.pings.fetch_add(1, Ordering::Relaxed);
                health.consecutive.store(0, Ordering::Relaxed);
                *health.last_ok.lock() = Some(Instant::now());
                let old = health.view_version.swap(p.view_version, Ordering::Relaxed);
                if old != 0 && old != p.view_version {
                    tracing::warn!(client = %id, "the master restarted (view version changed)");
                }
                // Closing: the client is leaving the master, not coming back.
                if p.status == ClientStatus::NeedRemount && !stop.is_cancelled() {
                    health.set_mounted(false);
                    let specs = segments.lock().clone();
                    remount(&rpc, id, &specs, &health).await;
                }
                crate::metrics::record_heartbeat(true);
            }
            Err(e) => {
                health.failures.fetch_add(1, Ordering::Relaxed);
                let n = health.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
                if n == 1 || n.is_power_of_two() {
                    tracing::warn!(client = %id, failures = n, error = %e, "heartbeat failed");
                }
                crate::metrics::record_heartbeat(false);
            }
        }
    }
}

/// Waits for `warm` (the thread faulting the segment in) and mounts `segments`, unless
/// `stop` comes first. A first mount, not a remount: the master holds a remounted segment
/// back for a while (its owner may still write into space given out before), which a
/// segment never mounted does not need. A mount the master refuses is retried by the
/// heartbeat, as after a restart. Until then the master does not know this client, so it
/// hands out none of its memory: a node takes its first writes at the speed of resident
/// memory.
pub(crate) async fn mount_when_warm(
    warm: std::thread::JoinHandle<u64>,
    rpc: &MasterRpc,
    id: ClientId,
    segments: &parking_lot::Mutex<Vec<SegmentSpec>>,
    health: &HealthState,
    stop: &CancellationToken,
) {
    let started = Instant::now();
    let joined = tokio::task::spawn_blocking(move || warm.join());
    let bytes = tokio::select! {
        _ = stop.cancelled() => None,
        j = joined => Some(j.ok().and_then(Result::ok).unwrap_or(0)),
    };
    if let Some(bytes) = bytes {
        tracing::info!(client = %id, bytes, secs = started.elapsed().as_secs_f64(), "segment faulted in; mounting it");
        let specs = segments.lock().clone();
        let mut mounted = true;
        for spec in &specs {
            if let Err(e) = rpc.mount(id, spec).await {
                tracing::warn!(client = %id, error = %e, "mount failed; retrying at the next heartbeat");
                mounted = false;
                break;
            }
        }
        health.set_mounted(mounted);
    }
    health.settled.send_replace(true);
}

async fn remount(rpc: &MasterRpc, id: ClientId, segments: &[SegmentSpec], health: &HealthState) {
    match rpc.remount(id, segments).await {
        Ok(_) => {
            health.remounts.fetch_add(1, Ordering::Relaxed);
            health.set_mounted(true);
            crate::metrics::record_remount();
            tracing::info!(client = %id, segments = segments.len(), "remounted at the master");
        }
        Err(e) => {
            tracing::warn!(client = %id, error = %e, "remount failed; retrying at the next heartbeat")
        }
    }
}
