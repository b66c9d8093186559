//! The master's background task: the host spawns [`run_background`] next to the router.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;

use crate::master::Master;

/// Runs [`Master::tick`] every `tick_interval_ms` (client TTL sweep, zombie-put release,
/// watermark eviction) and publishes the gauges, until `shutdown` completes. Uses tokio
/// time, so paused-time tests drive it with `tokio::time::advance`.
pub async fn run_background(master: Arc<Master>, shutdown: impl Future<Output = ()>) {
    let period = Duration::from_millis(master.config().tick_interval_ms);
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = interval.tick() => {
                let m = master.clone();
                // A tick may scan every shard (sweeps, eviction): keep it off the workers.
                match tokio::task::spawn_blocking(move || m.tick()).await {
                    Ok(report) => {
                        if report.expired_clients > 0 || report.released_puts > 0 || report.eviction.is_some() {
                            tracing::info!(?report, "master background tick");
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "master tick failed"),
                }
                publish_gauges(&master);
            }
        }
    }
}

/// Sets the gauges (`crate::metrics`) from the master's current totals.
pub fn publish_gauges(master: &Master) {
    let s = master.stats();
    metrics::gauge!(crate::metrics::CAPACITY_BYTES).set(s.capacity_bytes as f64);
    metrics::gauge!(crate::metrics::ALLOCATED_BYTES).set(s.allocated_bytes as f64);
    metrics::gauge!(crate::metrics::RESERVED_BYTES).set(s.reserved_bytes as f64);
    metrics::gauge!(crate::metrics::KEYS).set(s.keys as f64);
    metrics::gauge!(crate::metrics::SEGMENTS).set(s.segments as f64);
    metrics::gauge!(crate::metrics::CLIENTS, "status" => "ok").set(s.clients_ok as f64);
    metrics::gauge!(crate::metrics::CLIENTS, "status" => "need_remount")
        .set((s.clients - s.clients_ok) as f64);
    metrics::gauge!(crate::metrics::METADATA_ENTRIES).set(master.metadata().len() as f64);
    metrics::gauge!(crate::metrics::DISK_OFFLOADING_BYTES).set(master.offloading_bytes() as f64);
}
