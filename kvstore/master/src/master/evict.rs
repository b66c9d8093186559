//! Background work of the master, as plain methods the host calls on a timer:
//! client expiry, release of zombie puts, and eviction.
//!
//! Eviction (Mooncake's BatchEvict, near-LRU): when allocated / capacity passes the high
//! watermark, or an allocation failed, free a share of the allocated bytes. Candidates
//! are complete objects without a live lease and not hard-pinned, oldest lease end first
//! across all shards (to within 1% of their age: see `Master::age_cut`). Soft-pinned
//! objects are taken only in a second pass, and only if the first fell short of the lower
//! bound.

use std::sync::atomic::Ordering;

use hdrhistogram::Histogram;

use super::object::Object;
use super::{Master, ShardGuard};

/// What one eviction round freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvictReport {
    /// Objects evicted.
    pub evicted_objects: u64,
    /// Segment bytes freed by them (or, for offloads, to be freed once written).
    pub evicted_bytes: u64,
    /// Of `evicted_objects`, those being written to a disk tier instead of being lost.
    pub offloaded_objects: u64,
}

/// What one background tick did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Clients that expired (their segments were unmounted).
    pub expired_clients: usize,
    /// Unfinished puts (or taken-over put leftovers) whose space was released.
    pub released_puts: u64,
    /// Segment bytes those releases freed.
    pub released_bytes: u64,
    /// Reservations released unused at the end of their TTL.
    pub released_reservations: u64,
    /// The eviction round, if one ran.
    pub eviction: Option<EvictReport>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Unpinned,
    SoftPinned,
}

impl Master {
    /// One round of background work at the current time; the host calls this every
    /// `tick_interval_ms` (see `crate::run_background`).
    pub fn tick(&self) -> TickReport {
        let now = self.clock.now_ms();
        let expired_clients = self.expire_clients(now);
        let (released_puts, released_bytes) = self.release_expired(now);
        let released_reservations = self.release_expired_reservations(now);
        self.tier_tick(now);
        let eviction = self.eviction_target().map(|(target, lower)| {
            let _guard = self.evict_lock.lock();
            self.evict_locked(target, lower, self.clock.now_ms())
        });
        TickReport {
            expired_clients,
            released_puts,
            released_bytes,
            released_reservations,
            eviction,
        }
    }

    /// Runs one eviction round now, whatever the watermark says, freeing about
    /// `target_bytes` (at least `lower_bytes` if candidates allow).
    pub fn evict(&self, target_bytes: u64, lower_bytes: u64) -> EvictReport {
        let _guard = self.evict_lock.lock();
        self.evict_locked(target_bytes, lower_bytes, self.clock.now_ms())
    }

    /// Frees space after an allocation failed; returns whether trying again may succeed.
    pub(crate) fn evict_for_allocation(&self) -> bool {
        self.need_eviction.store(true, Ordering::Relaxed);
        let Some(_guard) = self.evict_lock.try_lock() else {
            // Another request is evicting right now; wait for it, then retry.
            drop(self.evict_lock.lock());
            return true;
        };
        let now = self.clock.now_ms();
        let (released, _) = self.release_expired(now);
        let (_, used) = self.segments.read().usage();
        let target = (used as f64 * self.config.eviction_ratio).ceil() as u64;
        // A round scans every object (those on disk too). Not again within a tick of one
        // that found nothing (leases end with time; completed puts say so), nor while
        // offloads in flight will free a round's worth: under a put stream faster than
        // the disk, every failed put would scan otherwise.
        if target == 0
            || now < self.evict_futile_until.load(Ordering::Relaxed)
            || self.offloading_bytes() >= target
        {
            return released > 0;
        }
        let report = self.evict_locked(target, target / 2, now);
        released > 0 || report.evicted_objects > 0
    }

    /// A put completed: the object may be evicted, so a failed allocation looks again.
    pub(crate) fn evictable_added(&self) {
        if self.evict_futile_until.load(Ordering::Relaxed) != 0 {
            self.evict_futile_until.store(0, Ordering::Relaxed);
        }
    }

    /// Notes whether a round at `now` found anything to take.
    fn note_round(&self, evicted: u64, now: u64) {
        let until = match evicted {
            0 => now.saturating_add(self.config.tick_interval_ms),
            _ => 0,
        };
        self.evict_futile_until.store(until, Ordering::Relaxed);
    }

    /// `(target, lower bound)` bytes to evict now, if eviction is due.
    fn eviction_target(&self) -> Option<(u64, u64)> {
        let (cap, used) = self.segments.read().usage();
        // Offloads in flight free their memory once written: count it as freed already.
        let used = used.saturating_sub(self.offloading_bytes());
        let ratio = self.config.eviction_ratio;
        if cap == 0 || used == 0 || ratio <= 0.0 {
            self.need_eviction.store(false, Ordering::Relaxed);
            return None;
        }
        let (usedf, capf) = (used as f64, cap as f64);
        let wm = self.config.eviction_high_watermark;
        let (target, lower) = if usedf > wm * capf {
            let target = (ratio * usedf).max(usedf - (wm - ratio) * capf);
            (target, (target / 2.0).max(usedf - wm * capf))
        } else if self.need_eviction.load(Ordering::Relaxed) {
            (ratio * usedf, ratio * usedf / 2.0)
        } else {
            return None;
        };
        Some((target.ceil() as u64, lower.ceil() as u64))
    }

    /// Releases the space of taken-over puts and of unfinished puts past the release
    /// timeout. Returns how many were released and the bytes freed.
    pub(crate) fn release_expired(&self, now: u64) -> (u64, u64) {
        let due: Vec<_> = {
            let mut list = self.discarded.lock();
            let (due, keep) = std::mem::take(&mut *list)
                .into_iter()
                .partition(|d| d.release_at <= now);
            *list = keep;
            due
        };
        let mut released = due.len() as u64;
        let mut bytes = 0;
        for d in due {
            bytes += d.aligned * d.replicas.len() as u64;
            for r in d.replicas {
                r.release();
            }
        }
        let timeout = self.config.put_start_release_timeout_ms;
        for s in 0..self.shards.len() {
            let mut shard = self.lock_shard(s);
            if shard.processing.is_empty() {
                continue;
            }
            let stale: Vec<u32> = shard
                .processing
                .iter()
                .copied()
                .filter(|&i| {
                    let o = shard.get(i);
                    // A journaled put_end in flight: its commit decides, not the timeout.
                    !o.is_ending() && now >= o.aux.saturating_add(timeout)
                })
                .collect();
            for i in stale {
                let hash = self.hash_bytes(shard.get(i).key.as_bytes());
                let obj = shard.remove(hash, i);
                bytes += obj.footprint();
                obj.release();
                released += 1;
            }
        }
        (released, bytes)
    }

    fn evict_locked(&self, target: u64, lower: u64, now: u64) -> EvictReport {
        let total: usize = self
            .shards
            .iter()
            .map(|s| s.len.load(Ordering::Relaxed))
            .sum();
        let mut report = EvictReport::default();
        if total == 0 || target == 0 {
            self.need_eviction.store(false, Ordering::Relaxed);
            return report;
        }
        let start = self.evict_cursor.fetch_add(1, Ordering::Relaxed) % self.shards.len();
        self.evict_pass(start, target, now, Class::Unpinned, &mut report);
        if report.evicted_bytes < lower && self.config.allow_evict_soft_pinned {
            let need = lower - report.evicted_bytes;
            self.evict_pass(start, need, now, Class::SoftPinned, &mut report);
        }
        self.note_round(report.evicted_objects, now);
        if report.evicted_objects > 0 {
            self.need_eviction.store(false, Ordering::Relaxed);
            self.evicted_objects
                .fetch_add(report.evicted_objects, Ordering::Relaxed);
            self.evicted_bytes
                .fetch_add(report.evicted_bytes, Ordering::Relaxed);
        }
        crate::metrics::record_eviction(report.evicted_objects, report.evicted_bytes);
        report
    }

    /// Frees about `goal` bytes of class `class`, oldest lease end first across every
    /// shard: a first scan finds the age that cuts `goal` bytes off the old end
    /// ([`Master::age_cut`]), a second takes every candidate older than it. Of the
    /// candidates in the cut's own bucket (ages within 1% of each other), each shard gives
    /// up its share, oldest first.
    fn evict_pass(
        &self,
        start: usize,
        goal: u64,
        now: u64,
        class: Class,
        report: &mut EvictReport,
    ) {
        let Some(cut) = self.age_cut(goal, now, class) else {
            return;
        };
        let n = self.shards.len();
        let (mut edge_seen, mut edge_freed) = (0u64, 0u64);
        let mut old = Vec::new();
        let mut edge = Vec::new();
        for k in 0..n {
            let mut shard = self.lock_shard((start + k) % n);
            old.clear();
            edge.clear();
            for i in shard.indices() {
                let o = shard.get(i);
                if !evictable(o, now, class) {
                    continue;
                }
                let age = now.saturating_sub(o.lease_until);
                if age >= cut.old_from {
                    old.push(i);
                } else if age >= cut.edge_from {
                    edge_seen += o.footprint();
                    edge.push((o.lease_until, i));
                }
            }
            for &i in &old {
                let freed = self.evict_one(&mut shard, i, report);
                report.evicted_bytes += freed;
            }
            if edge.is_empty() {
                continue;
            }
            // This shard's share of the edge: what the shards so far hold of it, in
            // proportion, less what they gave.
            let seen = edge_seen.min(cut.edge_bytes);
            let ideal = (u128::from(cut.edge_take) * u128::from(seen))
                .div_ceil(u128::from(cut.edge_bytes.max(1))) as u64;
            let want = ideal.saturating_sub(edge_freed);
            edge.sort_unstable();
            let mut got = 0;
            for &(_, i) in &edge {
                if got >= want {
                    break;
                }
                got += self.evict_one(&mut shard, i, report);
            }
            edge_freed += got;
            report.evicted_bytes += got;
        }
    }

    /// Where to cut `goal` bytes of evictable objects off the old end, from a histogram
    /// of the bytes they hold by age (ms since their lease ended), or `None` when there
    /// are none. A histogram keeps the scan's memory fixed (a few thousand buckets, not
    /// one entry per object) and its buckets within 1% of the age they hold.
    fn age_cut(&self, goal: u64, now: u64, class: Class) -> Option<AgeCut> {
        // Ages past 2^40 ms (35 years) count as that old.
        let mut ages = Histogram::<u64>::new_with_max(1 << 40, 2).expect("valid bounds");
        for s in 0..self.shards.len() {
            let shard = self.lock_shard(s);
            for i in shard.indices() {
                let o = shard.get(i);
                if evictable(o, now, class) {
                    ages.saturating_record_n(now.saturating_sub(o.lease_until), o.footprint());
                }
            }
        }
        if ages.is_empty() {
            return None;
        }
        let buckets: Vec<(u64, u64)> = ages
            .iter_recorded()
            .map(|b| (b.value_iterated_to(), b.count_at_value()))
            .collect();
        let mut older = 0u64;
        for &(age, bytes) in buckets.iter().rev() {
            if older.saturating_add(bytes) >= goal {
                return Some(AgeCut {
                    old_from: ages.next_non_equivalent(age),
                    edge_from: ages.lowest_equivalent(age),
                    edge_take: goal - older,
                    edge_bytes: bytes,
                });
            }
            older += bytes;
        }
        // Fewer bytes than the goal: all of them.
        Some(AgeCut {
            old_from: 0,
            edge_from: 0,
            edge_take: 0,
            edge_bytes: 0,
        })
    }

    /// Evicts object `i` of a locked shard: dropped to its disk copy, offloaded to disk,
    /// or removed. Returns the segment bytes it frees (now or once offloaded).
    fn evict_one(&self, shard: &mut ShardGuard<'_>, i: u32, report: &mut EvictReport) -> u64 {
        report.evicted_objects += 1;
        let o = shard.get_mut(i);
        if o.has_disk_copy() {
            return self.drop_to_disk(o);
        }
        if let Some(offloaded) = self.offload_on_evict(o) {
            report.offloaded_objects += 1;
            return offloaded;
        }
        let hash = self.hash_bytes(shard.get(i).key.as_bytes());
        let obj = shard.remove(hash, i);
        let freed = obj.footprint();
        self.retire(obj);
        freed
    }
}

/// A cut by age (ms since the lease ended): every candidate at least `old_from` old goes;
/// of those from `edge_from` up to it (one histogram bucket holding `edge_bytes`),
/// `edge_take` bytes, oldest first.
struct AgeCut {
    old_from: u64,
    edge_from: u64,
    edge_take: u64,
    edge_bytes: u64,
}

/// Eviction never takes an object with a live lease, a hard pin, an unfinished put, or
/// one moving between memory and disk (or on disk already); soft-pinned objects only in
/// their own (later) pass.
fn evictable(o: &Object, now: u64, class: Class) -> bool {
    o.is_complete()
        && !o.is_offloading()
        && !o.is_loading()
        && !o.is_on_disk()
        && !o.has_lease(now)
        && !o.is_hard_pinned()
        && (o.is_soft_pinned(now) == (class == Class::SoftPinned))
}
