//! Prometheus metrics of the master, through the `metrics` facade (the host installs the
//! recorder and serves `/metrics`). Names are `moongate_master_*` (the store clients'
//! `moongate_store_*` are the client crate's).
//!
//! Counters are recorded where things happen (each REST operation, each eviction round);
//! gauges are published from [`crate::master::Master::stats`] by
//! [`crate::background::publish_gauges`], which the background task calls every tick and a
//! `/metrics` handler may call before rendering. A leaf module: the names and how each is
//! recorded, over plain numbers and the wire's errors.

use openapi::master::MasterError;

/// Gauge: bytes allocatable over mounted segments.
pub const CAPACITY_BYTES: &str = "moongate_master_capacity_bytes";
/// Gauge: bytes allocated to replicas.
pub const ALLOCATED_BYTES: &str = "moongate_master_allocated_bytes";
/// Gauge: bytes held by reservations for clients' next puts (part of the allocated bytes).
pub const RESERVED_BYTES: &str = "moongate_master_reserved_bytes";
/// Gauge: objects (complete and unfinished).
pub const KEYS: &str = "moongate_master_keys";
/// Gauge: known clients, by `status` (`ok`, `need_remount`).
pub const CLIENTS: &str = "moongate_master_clients";
/// Gauge: mounted segments.
pub const SEGMENTS: &str = "moongate_master_segments";
/// Gauge: entries in the transfer-metadata store.
pub const METADATA_ENTRIES: &str = "moongate_master_metadata_entries";
/// Counter: requests by `op`.
pub const REQUESTS: &str = "moongate_master_requests_total";
/// Counter: failed requests by `op` and `error` (Mooncake name).
pub const FAILURES: &str = "moongate_master_failures_total";
/// Counter: evicted objects.
pub const EVICTIONS: &str = "moongate_master_evictions_total";
/// Counter: bytes freed by eviction.
pub const EVICTED_BYTES: &str = "moongate_master_evicted_bytes_total";

/// Counter: disk-tier tasks of segment owners, by `kind` (`offload`: a value written to a
/// disk, on eviction or written through; `load`: read back) and `result` (`ok`, `failed`,
/// `timeout`: given up after `disk_task_timeout_ms`).
pub const DISK_TASKS: &str = "moongate_master_disk_tasks_total";
/// Counter: values on a disk copied back into their owner's memory because the owner kept
/// reading them (`disk_promote_after`).
pub const DISK_PROMOTIONS: &str = "moongate_master_disk_promotions_total";
/// Counter: disk records taken from owners' reports (after a restart of either side).
pub const DISK_ADOPTED: &str = "moongate_master_disk_records_adopted_total";
/// Gauge: bytes of segment memory that offloads in flight will free.
pub const DISK_OFFLOADING_BYTES: &str = "moongate_master_disk_offloading_bytes";

/// Counter: etcd transactions an HA leader committed (group commits).
pub const HA_COMMITS: &str = "moongate_master_ha_commits_total";
/// Counter: durable changes those transactions carried.
pub const HA_CHANGES: &str = "moongate_master_ha_changes_total";

/// Gauge: 1 while this HA master leads, 0 otherwise.
pub const HA_LEADER: &str = "moongate_master_ha_leader";
/// Gauge: the term of the leader this HA master knows (0: none).
pub const HA_TERM: &str = "moongate_master_ha_term";

/// Registers help texts (call once after the recorder is installed).
pub fn describe() {
    metrics::describe_counter!(
        DISK_TASKS,
        "Disk-tier tasks of segment owners by kind (offload, load) and result (ok, failed, timeout)"
    );
    metrics::describe_counter!(DISK_ADOPTED, "Disk records taken from owners' reports");
    metrics::describe_counter!(
        DISK_PROMOTIONS,
        "Values on disk copied back into their owner's memory after repeated reads"
    );
    metrics::describe_gauge!(
        DISK_OFFLOADING_BYTES,
        metrics::Unit::Bytes,
        "Segment bytes that offloads in flight will free"
    );
    metrics::describe_gauge!(HA_LEADER, "1 while this HA master leads, else 0");
    metrics::describe_gauge!(HA_TERM, "Term of the leader this HA master knows (0: none)");
    metrics::describe_counter!(HA_COMMITS, "etcd transactions committed by the HA leader");
    metrics::describe_counter!(HA_CHANGES, "Durable changes committed by the HA leader");
    metrics::describe_gauge!(
        CAPACITY_BYTES,
        metrics::Unit::Bytes,
        "Bytes allocatable over mounted segments"
    );
    metrics::describe_gauge!(
        ALLOCATED_BYTES,
        metrics::Unit::Bytes,
        "Bytes allocated to replicas"
    );
    metrics::describe_gauge!(
        RESERVED_BYTES,
        metrics::Unit::Bytes,
        "Bytes held by reservations for clients' next puts (part of the allocated bytes)"
    );
    metrics::describe_gauge!(KEYS, "Objects known to the master");
    metrics::describe_gauge!(CLIENTS, "Known store clients by status");
    metrics::describe_gauge!(SEGMENTS, "Mounted segments");
    metrics::describe_gauge!(METADATA_ENTRIES, "Entries in the transfer-metadata store");
    metrics::describe_counter!(REQUESTS, "Master API requests by operation");
    metrics::describe_counter!(
        FAILURES,
        "Failed master API requests by operation and error"
    );
    metrics::describe_counter!(EVICTIONS, "Objects evicted");
    metrics::describe_counter!(
        EVICTED_BYTES,
        metrics::Unit::Bytes,
        "Bytes freed by eviction"
    );
}

/// Publishes an HA master's role and the term it knows.
pub fn record_ha_role(leader: bool, term: i64) {
    metrics::gauge!(HA_LEADER).set(if leader { 1.0 } else { 0.0 });
    metrics::gauge!(HA_TERM).set(term as f64);
}

/// Counts one committed group transaction of `changes` changes (HA leader).
pub fn record_ha_commit(changes: usize) {
    metrics::counter!(HA_COMMITS).increment(1);
    metrics::counter!(HA_CHANGES).increment(changes as u64);
}

/// Counts one request of `op`, and its failure if it failed.
pub fn record_op(op: &'static str, error: Option<&MasterError>) {
    metrics::counter!(REQUESTS, "op" => op).increment(1);
    if let Some(e) = error {
        metrics::counter!(FAILURES, "op" => op, "error" => e.name()).increment(1);
    }
}

/// Counts many requests of `op` (the items of a batch) with one update of the request
/// counter, and each failure.
pub fn record_ops<'a>(
    op: &'static str,
    errors: impl ExactSizeIterator<Item = Option<&'a MasterError>>,
) {
    metrics::counter!(REQUESTS, "op" => op).increment(errors.len() as u64);
    for e in errors.flatten() {
        metrics::counter!(FAILURES, "op" => op, "error" => e.name()).increment(1);
    }
}

/// Counts one disk-tier task's outcome (`kind`: offload, load; `result`: ok, failed,
/// timeout).
pub fn record_disk_task(kind: &'static str, result: &'static str) {
    metrics::counter!(DISK_TASKS, "kind" => kind, "result" => result).increment(1);
}

/// Counts disk records taken from an owner's report.
pub fn record_disk_adopted(records: u64) {
    if records > 0 {
        metrics::counter!(DISK_ADOPTED).increment(records);
    }
}

/// Counts one eviction round that evicted `objects` objects of `bytes` bytes in all.
pub fn record_eviction(objects: u64, bytes: u64) {
    metrics::counter!(EVICTIONS).increment(objects);
    metrics::counter!(EVICTED_BYTES).increment(bytes);
}
