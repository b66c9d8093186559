//! The values `batch_get` hands out: one allocation per big batch, recycled once released.
//!
//! A batch of many large values copied into one fresh vector each paid the kernel's first
//! touch of every 4 KiB page (zeroing, one fault each), while a loop of single `get`s reused
//! the same few vectors the allocator kept: a 64 x 1 MiB `batch_get` ran at 1.0-1.5 GB/s
//! where 64 `get`s ran at 2.6-3.0 GB/s. So a big batch shares one buffer
//! ([`transfer::memory::bulk_vec`]: whole huge pages where the kernel offers them), its
//! values are [`Bytes`] views of it, and once the last view is dropped the buffer goes back
//! to the client's [`ValuePool`] for the next batch, as an allocator's cache would keep it.
//! The pool keeps at most the copy buffer's size of idle memory.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use transfer::memory::{BULK_VEC_MIN, bulk_vec};

use super::error::StoreResult;
use super::io::Side;

/// Released batch buffers, kept for the next batches (bounded in bytes).
#[derive(Debug)]
pub(crate) struct ValuePool {
    idle: Mutex<Vec<Vec<u8>>>,
    cap: usize,
}

impl ValuePool {
    /// A pool keeping at most `cap` bytes of idle buffers.
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::new(Vec::new()),
            cap,
        })
    }

    /// An empty buffer with room for `len` bytes: the smallest idle one that fits, else a
    /// new one.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut idle = self.idle.lock();
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
                bulk_vec(len)
            }
        }
    }

    /// Keeps `v` for a later batch while the idle buffers stay within the cap (dropping the
    /// smallest ones to make room for a bigger one).
    fn give_back(&self, mut v: Vec<u8>) {
        if v.capacity() > self.cap {
            return;
        }
        v.clear();
        let mut idle = self.idle.lock();
        idle.push(v);
        idle.sort_unstable_by_key(|v| std::cmp::Reverse(v.capacity()));
        let mut kept = 0usize;
        let keep = idle
            .iter()
            .take_while(|v| {
                kept += v.capacity();
                kept <= self.cap
            })
            .count();
        let excess = idle.split_off(keep);
        // Unmapping the excess (megabytes) happens after the lock is let go.
        drop(idle);
        drop(excess);
    }

    /// Idle bytes held (tests).
    #[cfg(test)]
    fn idle_bytes(&self) -> usize {
        self.idle.lock().iter().map(Vec::capacity).sum()
    }
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

/// Collects the values a `batch_get` read into the copy buffer, part after part, into the
/// caller's values. A batch of two or more values of [`BULK_VEC_MIN`] or more in all shares
/// one buffer from the pool; fewer or smaller values get a vector each.
pub(crate) enum Gather {
    /// A big batch: one shared buffer, each value a range of it.
    Bulk {
        all: Vec<u8>,
        spans: Vec<StoreResult<std::ops::Range<usize>>>,
        pool: Arc<ValuePool>,
    },
    /// A vector per value.
    Each(Vec<StoreResult<Bytes>>),
}

impl Gather {
    /// A gatherer for a batch of `count` readable values, `total` bytes in all.
    pub(crate) fn new(pool: &Arc<ValuePool>, count: usize, total: usize) -> Self {
        if count >= 2 && total >= BULK_VEC_MIN {
            Self::Bulk {
                all: pool.take(total),
                spans: Vec::with_capacity(count),
                pool: pool.clone(),
            }
        } else {
            Self::Each(Vec::with_capacity(count))
        }
    }

    /// Copies out what one part of the batch read (in batch order).
    pub(crate) fn add(&mut self, got: Vec<StoreResult<(u64, Side<'_>)>>) {
        for r in got {
            match self {
                Self::Bulk { all, spans, .. } => spans.push(r.and_then(|(len, side)| {
                    let at = all.len();
                    side.copy_slot().append_to(len as usize, all)?;
                    Ok(at..all.len())
                })),
                Self::Each(out) => out.push(r.and_then(|(len, side)| {
                    side.copy_slot().to_vec(len as usize).map(Bytes::from)
                })),
            }
        }
    }

    /// Every value, in batch order.
    pub(crate) fn finish(self) -> Vec<StoreResult<Bytes>> {
        match self {
            Self::Bulk { all, spans, pool } => {
                let all = Bytes::from_owner(Recycled {
                    bytes: all,
                    pool: Arc::downgrade(&pool),
                });
                spans.into_iter().map(|s| s.map(|r| all.slice(r))).collect()
            }
            Self::Each(out) => out,
        }
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
        // Cleared and handed out again for a batch that fits.
        let b = pool.take(BULK_VEC_MIN / 2);
        assert_eq!((b.as_ptr(), b.len()), (addr, 0));
        pool.give_back(b);
        // Too big to keep: dropped.
        pool.give_back(Vec::with_capacity(4 * BULK_VEC_MIN));
        assert_eq!(pool.idle_bytes(), BULK_VEC_MIN);
        // Over the cap: the smallest go first.
        pool.give_back(Vec::with_capacity(2 * BULK_VEC_MIN));
        pool.give_back(Vec::with_capacity(BULK_VEC_MIN / 4));
        assert_eq!(pool.idle_bytes(), 3 * BULK_VEC_MIN);
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
