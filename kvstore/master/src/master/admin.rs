//! Read-only views for admins and metrics: keys (paged, prefix-filtered), one object with
//! its replicas and lease, segments with capacity and usage, totals. None of these grant
//! leases or change state.

use std::collections::BinaryHeap;
use std::sync::atomic::Ordering;

use super::object::{ObjectStatus, ReplicaLocation};
use super::segment::SegmentView;
use super::{ClientId, Master, MasterError, MasterResult};

/// One object as an admin sees it.
#[derive(Clone, Debug)]
pub struct ObjectView {
    /// Key.
    pub key: String,
    /// Length in bytes.
    pub length: u64,
    /// Lifecycle state.
    pub status: ObjectStatus,
    /// Client that started the put.
    pub client_id: ClientId,
    /// Replicas on mounted segments.
    pub replicas: Vec<ReplicaLocation>,
    /// Remaining read lease in ms (0: none).
    pub lease_remaining_ms: u64,
    /// Soft pin still in force.
    pub soft_pinned: bool,
    /// Hard-pinned.
    pub hard_pinned: bool,
    /// For an unfinished put: ms since its `put_start`.
    pub put_started_ms_ago: Option<u64>,
}

/// One page of keys, sorted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPage {
    /// Keys of this page, ascending.
    pub keys: Vec<String>,
    /// Pass as `after` to get the next page; `None` on the last page.
    pub next_after: Option<String>,
}

pub use openapi::master::MasterStats;

impl Master {
    /// One object without granting a lease.
    pub fn object(&self, key: &str) -> MasterResult<ObjectView> {
        self.check_key(key)?;
        let hash = self.hash(key);
        let now = self.clock.now_ms();
        let shard = self.lock_shard(self.shard_of(hash));
        let i = shard
            .find(hash, key)
            .ok_or_else(|| MasterError::ObjectNotFound(key.to_string()))?;
        let o = shard.get(i);
        Ok(ObjectView {
            key: key.to_string(),
            length: o.length,
            status: o.status(),
            client_id: o.client,
            replicas: o.locations(),
            lease_remaining_ms: o.lease_until.saturating_sub(now),
            soft_pinned: o.is_soft_pinned(now),
            hard_pinned: o.is_hard_pinned(),
            put_started_ms_ago: (!o.is_complete()).then(|| now.saturating_sub(o.put_started_at())),
        })
    }

    /// Keys starting with `prefix`, strictly after `after`, ascending, at most `limit`
    /// (capped by `list_max_limit`; `None` = `list_default_limit`). One pass over the
    /// shards keeping the `limit` smallest matches, so a page costs O(keys · log limit).
    pub fn list_keys(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> MasterResult<KeyPage> {
        let limit = limit.unwrap_or(self.config.list_default_limit);
        if limit == 0 || limit > self.config.list_max_limit {
            return Err(MasterError::InvalidParams(format!(
                "limit {limit} is outside 1..={}",
                self.config.list_max_limit
            )));
        }
        let mut best: BinaryHeap<String> = BinaryHeap::with_capacity(limit + 1);
        let mut more = false;
        for s in 0..self.shards.len() {
            let shard = self.lock_shard(s);
            for i in shard.indices() {
                let key = shard.get(i).key.as_str();
                if !key.starts_with(prefix) || after.is_some_and(|a| key <= a) {
                    continue;
                }
                if best.len() < limit {
                    best.push(key.to_string());
                } else if best.peek().is_some_and(|top| key < top.as_str()) {
                    best.pop();
                    best.push(key.to_string());
                    more = true;
                } else {
                    more = true;
                }
            }
        }
        let keys = best.into_sorted_vec();
        let next_after = if more { keys.last().cloned() } else { None };
        Ok(KeyPage { keys, next_after })
    }

    /// Every key, in no particular order (Mooncake's `GetAllKeys`): one pass over the shards,
    /// each locked in turn.
    pub fn all_keys(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in 0..self.shards.len() {
            let shard = self.lock_shard(s);
            out.extend(
                shard
                    .indices()
                    .map(|i| shard.get(i).key.as_str().to_string()),
            );
        }
        out
    }

    /// Every mounted segment, by name.
    pub fn segments(&self) -> Vec<SegmentView> {
        let mut out: Vec<_> = self.segments.read().list.iter().map(|s| s.view()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// One mounted segment.
    pub fn segment(&self, name: &str) -> MasterResult<SegmentView> {
        self.segments
            .read()
            .get(name)
            .map(|s| s.view())
            .ok_or_else(|| MasterError::SegmentNotFound(name.to_string()))
    }

    /// Totals, without taking any shard lock.
    pub fn stats(&self) -> MasterStats {
        let (capacity_bytes, allocated_bytes, segments) = {
            let table = self.segments.read();
            let (c, a) = table.usage();
            (c, a, table.list.len() as u64)
        };
        let (clients, clients_ok) = {
            let c = self.clients.lock();
            (c.len() as u64, c.alive() as u64)
        };
        let (reservations, reserved_bytes) = self.reserved();
        let [reads_from_memory, reads_from_disk, read_misses] = self.reads();
        let (disk_offloads, disk_loads) = self.tier_moves();
        MasterStats {
            capacity_bytes,
            allocated_bytes,
            keys: self
                .shards
                .iter()
                .map(|s| s.len.load(Ordering::Relaxed) as u64)
                .sum(),
            segments,
            clients,
            clients_ok,
            evicted_objects: self.evicted_objects.load(Ordering::Relaxed),
            evicted_bytes: self.evicted_bytes.load(Ordering::Relaxed),
            reservations: reservations as u64,
            reserved_bytes,
            reads_from_memory,
            reads_from_disk,
            read_misses,
            disk_offloads,
            disk_loads,
        }
    }

    /// Heap bytes of the shards' containers (slabs, hash tables, processing sets); with
    /// the objects' own key bytes and segment allocators this is the metadata footprint.
    pub fn container_bytes(&self) -> usize {
        (0..self.shards.len())
            .map(|s| self.lock_shard(s).container_bytes())
            .sum()
    }
}
