//! Background work of the master, as plain methods the host calls on a timer:
//! client expiry, release of zombie puts, and eviction.
//!
//! Eviction (Mooncake's BatchEvict, near-LRU): when allocated / capacity passes the high
//! watermark, or an allocation failed, free a share of the allocated bytes. Candidates
//! are complete objects without a live lease and not hard-pinned, oldest lease end first,
//! each shard giving up its proportional share. Soft-pinned objects are taken only in a
//! second pass, and only if the first pass fell short of the lower bound.

use std::sync::atomic::Ordering;

use super::Master;
use super::object::Object;

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
        self.evict_pass(start, target, total, now, Class::Unpinned, &mut report);
        if report.evicted_bytes < lower {
            let need = lower - report.evicted_bytes;
            let before = report.evicted_bytes;
            self.evict_pass(start, need, total, now, Class::Unpinned, &mut report);
            let got = report.evicted_bytes - before;
            if got < need && self.config.allow_evict_soft_pinned {
                self.evict_pass(
                    start,
                    need - got,
                    total,
                    now,
                    Class::SoftPinned,
                    &mut report,
                );
            }
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

    fn evict_pass(
        &self,
        start: usize,
        goal: u64,
        total: usize,
        now: u64,
        class: Class,
        report: &mut EvictReport,
    ) {
        let n = self.shards.len();
        let mut seen = 0usize;
        let mut freed = 0u64;
        for k in 0..n {
            let mut shard = self.lock_shard((start + k) % n);
            seen = (seen + shard.len()).min(total);
            let ideal = (u128::from(goal) * seen as u128).div_ceil(total as u128) as u64;
            let want = ideal.saturating_sub(freed);
            if want == 0 {
                continue;
            }
            let mut bytes = 0u64;
            let mut candidates: Vec<(u64, u32)> = shard
                .indices()
                .filter_map(|i| {
                    let o = shard.get(i);
                    evictable(o, now, class).then(|| {
                        bytes += o.footprint();
                        (o.lease_until, i)
                    })
                })
                .collect();
            // Only the oldest are taken: sort those (enough to free `want` at the
            // candidates' mean size, and a margin), the rest only if they fall short.
            let mut sorted = oldest_prefix(candidates.len(), want, bytes);
            if sorted < candidates.len() {
                candidates.select_nth_unstable(sorted);
            }
            candidates[..sorted].sort_unstable();
            let (mut got, mut next) = (0, 0);
            while got < want && next < candidates.len() {
                if next == sorted {
                    candidates[sorted..].sort_unstable();
                    sorted = candidates.len();
                }
                let (_, i) = candidates[next];
                next += 1;
                report.evicted_objects += 1;
                let o = shard.get_mut(i);
                if o.has_disk_copy() {
                    got += self.drop_to_disk(o);
                    continue;
                }
                if let Some(offloaded) = self.offload_on_evict(o) {
                    got += offloaded;
                    report.offloaded_objects += 1;
                    continue;
                }
                let hash = self.hash_bytes(shard.get(i).key.as_bytes());
                let obj = shard.remove(hash, i);
                got += obj.footprint();
                self.retire(obj);
            }
            freed += got;
        }
        report.evicted_bytes += freed;
    }
}

/// How many of `n` candidates holding `bytes` in all to sort first when `want` bytes are
/// to be freed: their share at the mean size, a quarter more and 16 over (objects differ
/// in size), or all of them.
fn oldest_prefix(n: usize, want: u64, bytes: u64) -> usize {
    if bytes <= want {
        return n;
    }
    let share = (u128::from(want) * n as u128).div_ceil(u128::from(bytes));
    usize::try_from(share)
        .map_or(n, |k| k.saturating_add(k / 4).saturating_add(16))
        .min(n)
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
