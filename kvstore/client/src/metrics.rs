//! Prometheus metrics of store clients and storage nodes, through the `metrics` facade
//! (the host installs the recorder and serves `/metrics`): `moongate_store_*`.

use crate::StoreError;

/// Counter: store client operations by `op` (a batch counts each item).
pub const CLIENT_OPS: &str = "moongate_store_client_ops_total";
/// Counter: failed store client operations by `op` and `error` (Mooncake name).
pub const CLIENT_FAILURES: &str = "moongate_store_client_failures_total";
/// Counter: heartbeats by `result` (`ok`, `failed`).
pub const HEARTBEATS: &str = "moongate_store_heartbeats_total";
/// Counter: remounts after the master asked for one.
pub const REMOUNTS: &str = "moongate_store_remounts_total";

/// Registers the help texts of the client metrics.
pub fn describe_client() {
    metrics::describe_counter!(CLIENT_OPS, "Store client operations by operation");
    metrics::describe_counter!(
        CLIENT_FAILURES,
        "Failed store client operations by operation and error"
    );
    metrics::describe_counter!(HEARTBEATS, "Heartbeats to the master by result");
    metrics::describe_counter!(REMOUNTS, "Segment remounts the master asked for");
}

/// Counts one client operation, and its failure.
pub fn record_client_op(op: &'static str, error: Option<&StoreError>) {
    metrics::counter!(CLIENT_OPS, "op" => op).increment(1);
    if let Some(e) = error {
        metrics::counter!(CLIENT_FAILURES, "op" => op, "error" => e.name()).increment(1);
    }
}

/// Counts every item of a client batch.
pub fn record_client_batch<T>(op: &'static str, results: &[Result<T, StoreError>]) {
    metrics::counter!(CLIENT_OPS, "op" => op).increment(results.len() as u64);
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        metrics::counter!(CLIENT_FAILURES, "op" => op, "error" => e.name()).increment(1);
    }
}

/// Counts one heartbeat.
pub fn record_heartbeat(ok: bool) {
    metrics::counter!(HEARTBEATS, "result" => if ok { "ok" } else { "failed" }).increment(1);
}

/// Counts one remount.
pub fn record_remount() {
    metrics::counter!(REMOUNTS).increment(1);
}
