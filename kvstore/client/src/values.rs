//! The copying `batch_get` (and so `get`) and the values it hands out: one allocation per big
//! batch, recycled once released; a value with a replica in memory the client's engine
//! maps (its own segment, or a same-host node's shared memory) is copied straight out of it
//! (one copy, no transfer, no copy-buffer slot). Through the copy buffer, a same-host
//! 16 MiB `get` copied every byte twice (4.0 GB/s where `get_into` ran at 10).
//!
//! A batch of many large values copied into one fresh vector each paid the kernel's first
//! touch of every 4 KiB page (zeroing, one fault each), while a loop of single `get`s reused
//! the same few vectors the allocator kept: a 64 x 1 MiB `batch_get` ran at 1.0-1.5 GB/s
//! where 64 `get`s ran at 2.6-3.0 GB/s. Small values lost the same way: a loop of
//! 64 x 4 KiB `batch_get`s, a vector per value, grew and trimmed the heap every batch and
//! so paid a first touch in one round in three (p99 8-17 ms against 1 ms).
//!
//! So the values of a batch of [`POOLED_MIN`] (64 KiB) or more in all, a `get` of one such value
//! included, share one buffer ([`transfer::memory::bulk_vec`]: whole huge pages where the kernel
//! offers them); they are [`Bytes`] views of it, and once the last view is dropped the buffer goes
//! back to the client's [`ValuePool`] for the next batch, as an allocator's cache would keep it.
//! Buffers under [`BULK_VEC_MIN`] form a class of their own (powers of two, at most 16 MiB idle),
//! so a small batch's value the caller keeps never holds a big buffer back from the next big batch
//! (a big one's does: the smallest idle big buffer that fits is taken, the warm one of the copy
//! buffer's size included). The pool keeps at most the copy buffer's size of idle big buffers, and
//! a client that faults its memory in ahead (`prefault`) starts it with one resident buffer of that
//! size, faulted in after the copy buffer and the segment: without it, the first big read of a
//! fresh client paid the first touch of all its pages, on this project's VMs 8-13 s a GiB (a 64 x 1
//! MiB `batch_get` 0.8-1.2 s where the next took 13 ms). Memory cost: the copy buffer's size
//! (`local_buffer_size`), resident from start, and at most 16 MiB of small buffers; a storage node,
//! which serves no copying reads, keeps no big buffer.

use std::ops::Range;
use std::sync::{Arc, Weak};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use transfer::memory::{BULK_VEC_MIN, bulk_vec};
use transfer::{Segment, TransferEngine};

use super::StoreClient;
use super::disk::{DiskError, DiskStore};
use super::error::{StoreError, StoreResult};
use super::io::{Opened, label, lease_check};
use super::read::Lookup;
use super::staging::{MAPPED_PART, STAGE_BYTES, parts};

/// Smallest batch (in bytes) whose values share one pooled buffer: below it, a vector per
/// value costs less than the pool's lock.
pub(crate) const POOLED_MIN: usize = 64 << 10;

/// Idle bytes the pool keeps in buffers smaller than [`BULK_VEC_MIN`], on top of its cap.
const SMALL_IDLE: usize = 4 * BULK_VEC_MIN;

/// Released batch buffers, kept for the next batches (bounded in bytes), in two classes:
/// big ones ([`BULK_VEC_MIN`] or more, at most the cap in all) and small ones (at most
/// [`SMALL_IDLE`] in all). A small batch never takes a big buffer: a value it hands out
/// would keep the whole buffer from the next big batch.
#[derive(Debug)]
pub(crate) struct ValuePool {
    big: Mutex<Vec<Vec<u8>>>,
    small: Mutex<Vec<Vec<u8>>>,
    cap: usize,
}

impl ValuePool {
    /// A pool keeping at most `cap` bytes of idle big buffers.
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            big: Mutex::new(Vec::new()),
            small: Mutex::new(Vec::new()),
            cap,
        })
    }

    /// A job for the client's background fault-in: one resident buffer of the pool's cap,
    /// given to the pool once made (dropped if the pool is gone by then).
    pub(crate) fn warm_job(self: &Arc<Self>) -> transfer::Warm<'static> {
        let pool = Arc::downgrade(self);
        let ready = move |v: Vec<u8>| {
            if let Some(pool) = pool.upgrade() {
                pool.give_back(v);
            }
        };
        transfer::Warm::Vec(self.cap, Box::new(ready))
    }

    /// Starts the pool with one resident buffer of its cap, made now.
    pub(crate) fn warm_now(&self) {
        self.give_back(transfer::memory::resident_bulk_vec(self.cap));
    }

    /// The idle buffers of the class of a buffer of `capacity` bytes, and that class's cap.
    fn class(&self, capacity: usize) -> (&Mutex<Vec<Vec<u8>>>, usize) {
        if capacity < BULK_VEC_MIN {
            (&self.small, SMALL_IDLE)
        } else {
            (&self.big, self.cap)
        }
    }

    /// An empty buffer with room for `len` bytes: the smallest idle one of its class that
    /// fits, else a new one (a small one rounded up to a power of two, so that batches of
    /// slightly different sizes reuse it).
    fn take(&self, len: usize) -> Vec<u8> {
        let size = match len.max(POOLED_MIN).checked_next_power_of_two() {
            Some(p) if p < BULK_VEC_MIN => p,
            _ => len,
        };
        let (class, _) = self.class(size);
        let mut idle = class.lock();
        let fit = idle
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        match fit {
            Some(i) => idle.swap_remove(i),
            None => {
                drop(idle);
                bulk_vec(size)
            }
        }
    }

    /// Keeps `v` for a later batch while the idle buffers of its class stay within their
    /// cap (dropping the smallest ones to make room for a bigger one).
    fn give_back(&self, mut v: Vec<u8>) {
        let (class, cap) = self.class(v.capacity());
        if v.capacity() > cap {
            return;
        }
        v.clear();
        let mut idle = class.lock();
        idle.push(v);
        idle.sort_unstable_by_key(|v| std::cmp::Reverse(v.capacity()));
        let mut kept = 0usize;
        let keep = idle
            .iter()
            .take_while(|v| {
                kept += v.capacity();
                kept <= cap
            })
            .count();
        let excess = idle.split_off(keep);
        // Unmapping the excess (megabytes) happens after the lock is let go.
        drop(idle);
        drop(excess);
    }

    /// Idle bytes held, both classes (tests).
    #[cfg(test)]
    fn idle_bytes(&self) -> usize {
        [&self.big, &self.small]
            .iter()
            .flat_map(|c| c.lock().iter().map(Vec::capacity).collect::<Vec<_>>())
            .sum()
    }
}

/// A value of a batch: a range of its shared buffer, or bytes of its own (read from this
/// client's own disk tier).
enum Span {
    Shared(Range<usize>),
    Own(Bytes),
}

/// A batch buffer that returns to its pool when the last value viewing it is dropped.
struct Recycled {
    bytes: Vec<u8>,
    pool: Weak<ValuePool>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.bytes));
        }
    }
}

/// Collects the values a `batch_get` copies out (of the copy buffer after a read, or of
/// memory the engine maps: the own segment, a same-host node's shared memory), in any
/// order, into the caller's values. The values of a batch of [`POOLED_MIN`] or more in all
/// share one buffer from the pool; otherwise each value gets a vector.
enum Gather {
    /// A big batch: one shared buffer, each value a range of it (by index).
    Bulk {
        all: Vec<u8>,
        spans: Vec<Option<StoreResult<Span>>>,
        pool: Arc<ValuePool>,
    },
    /// A vector per value (by index).
    Each(Vec<Option<StoreResult<Bytes>>>),
}

impl Gather {
    /// A gatherer for a batch of `n` keys, `count` of them readable, `total` bytes in all.
    fn new(pool: &Arc<ValuePool>, n: usize, count: usize, total: usize) -> Self {
        if count >= 1 && total >= POOLED_MIN {
            Self::Bulk {
                all: pool.take(total),
                spans: (0..n).map(|_| None).collect(),
                pool: pool.clone(),
            }
        } else {
            Self::Each((0..n).map(|_| None).collect())
        }
    }

    /// Value `i`, `len` bytes that `append` appends to a vector.
    fn copy(&mut self, i: usize, len: usize, append: impl FnOnce(&mut Vec<u8>) -> StoreResult<()>) {
        match self {
            Self::Bulk { all, spans, .. } => {
                let at = all.len();
                spans[i] = Some(append(all).map(|()| Span::Shared(at..all.len())));
            }
            Self::Each(out) => {
                let mut v = Vec::with_capacity(len);
                out[i] = Some(append(&mut v).map(|()| Bytes::from(v)));
            }
        }
    }

    /// Values `items` ((index, segment, address, length)) copied straight out of memory
    /// `engine` maps, all at once (spread over two threads); answers for each whether it
    /// was (otherwise nothing is recorded for it).
    fn copy_mapped(
        &mut self,
        engine: &TransferEngine,
        items: &[(usize, Segment, u64, usize)],
    ) -> Vec<bool> {
        match self {
            Self::Bulk { all, spans, .. } => {
                let ranges: Vec<(&Segment, u64, usize)> =
                    items.iter().map(|(_, s, a, l)| (s, *a, *l)).collect();
                let got = engine.append_mapped_batch(&ranges, all);
                got.into_iter()
                    .zip(items)
                    .map(|(r, (i, ..))| match r {
                        Some(Ok(r)) => {
                            spans[*i] = Some(Ok(Span::Shared(r)));
                            true
                        }
                        _ => false,
                    })
                    .collect()
            }
            Self::Each(out) => items
                .iter()
                .map(|(i, seg, addr, len)| {
                    let mut v = Vec::with_capacity(*len);
                    let done =
                        matches!(engine.append_mapped(seg, *addr, *len, &mut v), Some(Ok(())));
                    if done {
                        out[*i] = Some(Ok(Bytes::from(v)));
                    }
                    done
                })
                .collect(),
        }
    }

    /// Value `i`, bytes of its own (or its failure).
    fn put(&mut self, i: usize, r: StoreResult<Bytes>) {
        match self {
            Self::Bulk { spans, .. } => spans[i] = Some(r.map(Span::Own)),
            Self::Each(out) => out[i] = Some(r),
        }
    }

    /// Value `i` failed (its bytes, if copied already, are not handed out).
    fn fail(&mut self, i: usize, e: StoreError) {
        match self {
            Self::Bulk { spans, .. } => spans[i] = Some(Err(e)),
            Self::Each(out) => out[i] = Some(Err(e)),
        }
    }

    /// Every value, in batch order.
    fn finish(self) -> Vec<StoreResult<Bytes>> {
        let unread = || StoreError::setup("batch_get", "a value was neither read nor failed");
        match self {
            Self::Bulk { all, spans, pool } => {
                let all = Bytes::from_owner(Recycled {
                    bytes: all,
                    pool: Arc::downgrade(&pool),
                });
                spans
                    .into_iter()
                    .map(|s| {
                        s.unwrap_or_else(|| Err(unread())).map(|s| match s {
                            Span::Shared(r) => all.slice(r),
                            Span::Own(b) => b,
                        })
                    })
                    .collect()
            }
            Self::Each(out) => out
                .into_iter()
                .map(|v| v.unwrap_or_else(|| Err(unread())))
                .collect(),
        }
    }
}

impl StoreClient {
    /// The values of many keys: one lookup request, then a copy straight out of mapped
    /// memory (this client's own segment, a same-host node's shared memory) of the values
    /// that have a replica there, up to `MAPPED_PART` bytes at once spread over two
    /// threads, and for the others, per part of at most `STAGE_BYTES`, one transfer batch
    /// (more only for replicas that fail). The values of a batch of 64 KiB or more share one pooled allocation, which
    /// lives until the last of them is dropped.
    pub async fn batch_get<K: AsRef<str>>(&self, keys: &[K]) -> Vec<StoreResult<Bytes>> {
        if keys.is_empty() {
            return Vec::new();
        }
        let ks: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
        let granted = Instant::now();
        let looked = self.lookups(&ks).await;
        // Every lease is checked against the one lookup. The lengths the master answered
        // size the values' shared buffer only up to the larger of the copy buffer and the
        // own segment (a longer value is read through a buffer of its own, and its mapped
        // copy is skipped), so a wrong length cannot size the shared allocation past that.
        let most = usize::try_from(self.inner.config.local_buffer_size)
            .unwrap_or(usize::MAX)
            .max(self.inner.segment.as_ref().map_or(0, |(b, _)| b.len()));
        let own = self
            .inner
            .segment
            .as_ref()
            .map(|(_, spec)| spec.name.as_str());
        // Values on this client's own disk tier are read into buffers of their own (not
        // counted in the shared one).
        let lens: Vec<usize> = looked
            .iter()
            .map(|l| match l {
                Ok(l) if !l.on_own_disk(own) => {
                    usize::try_from(l.length).map_or(most, |len| len.min(most))
                }
                _ => 0,
            })
            .collect();
        let count = looked
            .iter()
            .filter(|l| matches!(l, Ok(l) if !l.on_own_disk(own)))
            .count();
        // The buffer grows past this if the batch really is bigger.
        let total = lens
            .iter()
            .fold(0usize, |a, &l| a.saturating_add(l))
            .min(most);
        let mut gather = Gather::new(&self.inner.values, ks.len(), count, total);
        // Values with a replica this client's engine maps (its own segment, a same-host
        // node's shared memory): copied straight out of it, many at once. The others (and
        // those whose mapped copy failed its checks) are read by transfers, which try every
        // replica and report what failed.
        let mut opened = Opened::default();
        let shm = self.inner.engine.config().shm;
        // Whether `len` bytes at `addr` lie in the own segment (the only memory of this
        // engine a value is copied straight out of, whatever else it has registered).
        let in_own = |addr: u64, len: u64| {
            self.inner.segment.as_ref().is_some_and(|(b, _)| {
                addr.checked_sub(b.addr())
                    .is_some_and(|off| off.checked_add(len).is_some_and(|e| e <= b.len() as u64))
            })
        };
        let mut far: Vec<Option<Lookup>> = Vec::with_capacity(ks.len());
        let mut direct = Vec::new();
        let mut own_disk = Vec::new();
        for (i, l) in looked.into_iter().enumerate() {
            let l = match l {
                Ok(l) => l,
                Err(e) => {
                    gather.fail(i, e);
                    far.push(None);
                    continue;
                }
            };
            if l.on_own_disk(own) {
                let len = l.length;
                let read = move |disk: &DiskStore, key: &str| {
                    // The master's answer and the record this disk holds agree, or it is
                    // a miss (the record went, or another took its key meanwhile).
                    if disk.length_of(key) != Some(len) {
                        return Err(DiskError::Missing(key.to_owned()));
                    }
                    disk.read_bytes(key)
                };
                own_disk.push((i, l.lease_ms, read));
                far.push(None);
                continue;
            }
            if lens[i] as u64 == l.length {
                let mine = own.and_then(|own| l.replicas.iter().find(|r| r.segment == own));
                if let Some(r) = mine.filter(|r| in_own(r.address, l.length)) {
                    // The own segment, found without opening anything (the common case of
                    // a client holding a segment).
                    direct.push((i, self.inner.engine.local_segment(), r.address, lens[i]));
                } else {
                    // Nearest first: the own segment, then same-host nodes.
                    let near = self.candidates(&mut opened, &l.replicas).await;
                    if let Some(Ok((seg, addr))) = near.into_iter().next()
                        && if seg.is_local() {
                            in_own(addr, l.length)
                        } else {
                            shm && seg.is_same_host()
                        }
                    {
                        direct.push((i, seg, addr, lens[i]));
                    }
                }
            }
            far.push(Some(l));
        }
        // In parts of at most MAPPED_PART bytes: the copies of a part hold the runtime's
        // thread (and their CPU stripes) until they are over.
        // Reads copied here of memory copies of values on disk: released once done (those
        // left to transfers are released by `read_looked`).
        let mut release = Vec::new();
        for range in parts(direct.iter().map(|d| d.3), MAPPED_PART) {
            let part = &direct[range];
            let copied = gather.copy_mapped(&self.inner.engine, part);
            for ((i, ..), done) in part.iter().zip(copied) {
                // Copied: no transfer for it; its lease still has to have held.
                if let Some(l) = far[*i].take_if(|_| done) {
                    if l.release {
                        release.push(ks[*i].to_owned());
                    }
                    if let Err(e) = lease_check(ks[*i], granted, l.lease_ms) {
                        gather.fail(*i, e);
                    }
                }
            }
            // Let the runtime's other tasks run between parts, as transfers do.
            tokio::task::yield_now().await;
        }
        // Parts of at most STAGE_BYTES, so the copy out of the copy buffer finds the bytes
        // still in cache (as `batch_put` stages them).
        let left: Vec<(usize, Lookup)> = far
            .into_iter()
            .enumerate()
            .filter_map(|(i, l)| Some((i, l?)))
            .collect();
        let mut left = left.into_iter();
        for range in parts(left.as_slice().iter().map(|(i, _)| lens[*i]), STAGE_BYTES) {
            let (far_at, far_keys, far): (Vec<usize>, Vec<&str>, Vec<_>) = left
                .by_ref()
                .take(range.len())
                .map(|(i, l)| (i, ks[i], Ok(l)))
                .collect();
            let got = self
                .read_looked(&far_keys, far, granted, |_, len| self.copy_side(len))
                .await;
            for (i, r) in far_at.into_iter().zip(got) {
                match r {
                    Ok((len, side)) => {
                        let slot = side.copy_slot();
                        gather.copy(i, len as usize, |out| slot.append_to(len as usize, out));
                    }
                    Err(e) => gather.fail(i, e),
                }
            }
        }
        for (i, r) in self.on_own_disk(&ks, own_disk, granted).await {
            gather.put(i, r);
        }
        self.release_reads(release).await;
        let out = gather.finish();
        crate::metrics::record_client_batch(label(keys.len(), "get", "batch_get"), &out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_buffers_are_reused_and_the_pool_stays_within_its_cap() {
        let pool = ValuePool::new(3 * BULK_VEC_MIN);
        let mut a = pool.take(BULK_VEC_MIN);
        a.extend_from_slice(&[7; 16]);
        let addr = a.as_ptr();
        pool.give_back(a);
        // Cleared and handed out again for a big batch that fits.
        let b = pool.take(BULK_VEC_MIN);
        assert_eq!((b.as_ptr(), b.len()), (addr, 0));
        pool.give_back(b);
        // Too big to keep: dropped.
        pool.give_back(Vec::with_capacity(4 * BULK_VEC_MIN));
        assert_eq!(pool.idle_bytes(), BULK_VEC_MIN);
        // Up to the cap, then over it: the smallest go first.
        pool.give_back(Vec::with_capacity(2 * BULK_VEC_MIN));
        assert_eq!(pool.idle_bytes(), 3 * BULK_VEC_MIN);
        pool.give_back(Vec::with_capacity(BULK_VEC_MIN + 1));
        assert_eq!(pool.idle_bytes(), 2 * BULK_VEC_MIN);
    }

    #[test]
    fn small_batches_reuse_small_buffers_and_leave_the_big_ones_alone() {
        let pool = ValuePool::new(4 * BULK_VEC_MIN);
        pool.give_back(Vec::with_capacity(4 * BULK_VEC_MIN));
        // Rounded up to a power of two, from the small class: the big buffer stays idle.
        let a = pool.take(100_000);
        assert_eq!(a.capacity(), 128 << 10);
        assert_eq!(pool.idle_bytes(), 4 * BULK_VEC_MIN);
        let addr = a.as_ptr();
        pool.give_back(a);
        let b = pool.take(70_000);
        assert_eq!(b.as_ptr(), addr);
        pool.give_back(b);
        // Just under the big class: its own length, still small.
        assert_eq!(pool.take(BULK_VEC_MIN - 1).capacity(), BULK_VEC_MIN - 1);
        // The small class keeps at most SMALL_IDLE bytes, the smallest going first.
        for _ in 0..5 {
            pool.give_back(Vec::with_capacity(BULK_VEC_MIN - 1));
        }
        let small = pool.idle_bytes() - 4 * BULK_VEC_MIN;
        assert_eq!(small, 4 * (BULK_VEC_MIN - 1));
    }

    #[test]
    fn a_warmed_pool_starts_with_one_buffer_of_its_cap() {
        let cap = 2 * BULK_VEC_MIN;
        let now = ValuePool::new(cap);
        now.warm_now();
        assert_eq!(now.idle_bytes(), cap);
        let later = ValuePool::new(cap);
        // The thread hands the buffer over before it ends: joining it is the wait (a spin
        // here could keep the idle-priority thread off the CPU).
        transfer::RegisteredBuffer::warm_in_background(vec![later.warm_job()])
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(later.idle_bytes(), cap);
        // A batch takes it (and the pool is empty until the batch's values are dropped).
        let v = later.take(BULK_VEC_MIN);
        assert_eq!((v.capacity(), later.idle_bytes()), (cap, 0));
    }

    #[test]
    fn a_batch_is_pooled_from_the_pooled_minimum_on() {
        let pool = ValuePool::new(4 * BULK_VEC_MIN);
        // One value or many, once they reach the minimum in all.
        for (n, count) in [(1, 1), (3, 2)] {
            assert!(matches!(
                Gather::new(&pool, n, count, POOLED_MIN),
                Gather::Bulk { .. }
            ));
            assert!(matches!(
                Gather::new(&pool, n, count, POOLED_MIN - 1),
                Gather::Each(_)
            ));
        }
        // None readable: nothing to share.
        assert!(matches!(
            Gather::new(&pool, 2, 0, BULK_VEC_MIN),
            Gather::Each(_)
        ));
    }

    #[test]
    fn a_buffer_returns_when_its_last_view_is_dropped() {
        let pool = ValuePool::new(4 * BULK_VEC_MIN);
        let mut v = pool.take(BULK_VEC_MIN);
        v.extend_from_slice(&vec![1; BULK_VEC_MIN]);
        let all = Bytes::from_owner(Recycled {
            bytes: v,
            pool: Arc::downgrade(&pool),
        });
        let (x, y) = (all.slice(0..10), all.slice(10..20));
        drop(all);
        drop(x);
        assert_eq!(pool.idle_bytes(), 0, "a view still holds it");
        assert_eq!(&y[..], &[1; 10]);
        drop(y);
        assert!(pool.idle_bytes() >= BULK_VEC_MIN);
    }
}
