//! The CPU access lock of a region: how copies made by threads of this process stay free of
//! data races.
//!
//! Registered memory is written by many hands: the kernel (`recv` into it, `sendmsg` out of
//! it), NICs (RDMA), peer processes (shared memory), and threads of this process (the safe
//! copies of [`super::MemoryRegion`], the engine's shared-memory and local copies, the TCP
//! transport's copy of a payload's first buffered bytes). The first three are outside the
//! Rust memory model, like DMA: what they race with is seen as bytes of unspecified value,
//! never as undefined behaviour. The last are Rust threads, and two of them touching the
//! same bytes at once with one writing would be a data race. So every in-process copy holds
//! this lock over the bytes it touches: shared for reading, exclusive for writing.
//!
//! The lock is striped (at most [`MAX_STRIPES`] stripes of at least [`MIN_STRIPE`] bytes),
//! so copies into different parts of one large region (a storage node's segment, a staging
//! area) still run in parallel. Copies that touch several regions (a local copy from one
//! region into another, or into itself) take all their stripes at once, in one global order
//! (the stripes' addresses), each stripe once: they cannot deadlock.

use std::ops::Range;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Most stripes per region.
pub(crate) const MAX_STRIPES: usize = 256;
/// Smallest stripe.
pub(crate) const MIN_STRIPE: usize = 64 << 10;

/// The striped CPU access lock of one region (offsets are from the region's first byte).
pub(crate) struct CpuLock {
    shift: u32,
    stripes: Box<[RwLock<()>]>,
}

impl std::fmt::Debug for CpuLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CpuLock({} x {} bytes)",
            self.stripes.len(),
            1usize << self.shift
        )
    }
}

/// What a copy does to a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reads it (shared).
    Read,
    /// Writes it (exclusive).
    Write,
}

pub(crate) enum Guard<'a> {
    Read(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Write(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// Stripes held for one copy; released on drop. One stripe (the common case: a copy of
/// less than a stripe) is held without allocating.
pub(crate) enum Held<'a> {
    /// Nothing (an empty range).
    Empty,
    /// One stripe.
    One(#[allow(dead_code)] Guard<'a>),
    /// Several stripes, in the order taken.
    Many(Vec<Guard<'a>>),
}

impl<'a> Held<'a> {
    fn take(&mut self, stripe: &'a RwLock<()>, access: Access) {
        let g = match access {
            Access::Read => Guard::Read(stripe.read()),
            Access::Write => Guard::Write(stripe.write()),
        };
        match std::mem::replace(self, Held::Empty) {
            Held::Empty => *self = Held::One(g),
            Held::One(first) => *self = Held::Many(vec![first, g]),
            Held::Many(mut v) => {
                v.push(g);
                *self = Held::Many(v);
            }
        }
    }

    /// Number of stripes held.
    #[cfg(test)]
    pub(crate) fn stripes(&self) -> usize {
        match self {
            Held::Empty => 0,
            Held::One(_) => 1,
            Held::Many(v) => v.len(),
        }
    }
}

impl CpuLock {
    /// The lock of a region of `len` bytes.
    pub(crate) fn new(len: usize) -> Self {
        let stripe = len
            .div_ceil(MAX_STRIPES)
            .max(MIN_STRIPE)
            .next_power_of_two();
        let n = len.div_ceil(stripe).max(1);
        Self {
            shift: stripe.trailing_zeros(),
            stripes: (0..n).map(|_| RwLock::new(())).collect(),
        }
    }

    fn span(&self, off: usize, len: usize) -> Range<usize> {
        if len == 0 {
            return 0..0;
        }
        let n = self.stripes.len();
        let first = (off >> self.shift).min(n);
        let last = (off.saturating_add(len - 1) >> self.shift).min(n - 1);
        first..(last + 1).max(first)
    }

    /// Holds `[off, off + len)` for `access` (stripes taken in ascending order).
    pub(crate) fn lock(&self, off: usize, len: usize, access: Access) -> Held<'_> {
        let span = self.span(off, len);
        let mut held = Held::Empty;
        for s in &self.stripes[span] {
            held.take(s, access);
        }
        held
    }
}

/// Holds the ranges `parts` (lock, offset, length, access) of one or more regions at once:
/// stripes in ascending address order, each once (exclusive if any part writes it).
pub(crate) fn lock_all<'a>(parts: &[(&'a CpuLock, usize, usize, Access)]) -> Held<'a> {
    let mut want: Vec<(usize, &'a RwLock<()>, Access)> = Vec::new();
    for &(l, off, len, access) in parts {
        for s in &l.stripes[l.span(off, len)] {
            want.push((s as *const RwLock<()> as usize, s, access));
        }
    }
    want.sort_by_key(|w| w.0);
    let mut held = Held::Empty;
    let mut i = 0;
    while i < want.len() {
        let mut access = want[i].2;
        let mut j = i + 1;
        while j < want.len() && want[j].0 == want[i].0 {
            if want[j].2 == Access::Write {
                access = Access::Write;
            }
            j += 1;
        }
        held.take(want[i].1, access);
        i = j;
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_cover_the_region_and_ranges_take_what_they_touch() {
        let small = CpuLock::new(4096);
        assert_eq!(small.stripes.len(), 1);
        assert_eq!(small.lock(0, 4096, Access::Write).stripes(), 1);
        assert_eq!(small.lock(0, 0, Access::Write).stripes(), 0);
        let big = CpuLock::new(1 << 30);
        assert_eq!(big.stripes.len(), MAX_STRIPES);
        let stripe = 1usize << big.shift;
        assert_eq!(big.lock(stripe - 1, 2, Access::Read).stripes(), 2);
        assert_eq!(big.lock(stripe, stripe, Access::Read).stripes(), 1);
        // Out-of-range offsets clamp (callers check bounds first; this must not panic).
        assert!(big.lock(usize::MAX - 1, 5, Access::Read).stripes() <= 1);
        let odd = CpuLock::new(3 * MIN_STRIPE + 1);
        assert_eq!(odd.stripes.len(), 4);
        assert_eq!(odd.lock(0, 3 * MIN_STRIPE + 1, Access::Read).stripes(), 4);
    }

    #[test]
    fn overlapping_parts_take_each_stripe_once_and_writes_win() {
        let l = CpuLock::new(4 * MIN_STRIPE);
        // A region copied into itself: the same stripes read and written.
        let held = lock_all(&[
            (&l, 0, 2 * MIN_STRIPE, Access::Read),
            (&l, MIN_STRIPE, 2 * MIN_STRIPE, Access::Write),
        ]);
        assert_eq!(held.stripes(), 3);
        assert!(
            l.stripes[1].try_read().is_none(),
            "written stripe is exclusive"
        );
        assert!(l.stripes[2].try_read().is_none());
        assert!(
            l.stripes[0].try_read().is_some(),
            "read-only stripe is shared"
        );
        assert!(
            l.stripes[3].try_write().is_some(),
            "untouched stripe is free"
        );
        drop(held);
        assert!(l.stripes.iter().all(|s| s.try_write().is_some()));
    }

    /// Two threads copying A->B and B->A at once, over and over: a lock order that depended
    /// on argument order would deadlock here.
    #[test]
    fn crossing_copies_do_not_deadlock() {
        let a = CpuLock::new(8 * MIN_STRIPE);
        let b = CpuLock::new(8 * MIN_STRIPE);
        std::thread::scope(|s| {
            for flip in [false, true] {
                let (a, b) = (&a, &b);
                s.spawn(move || {
                    for i in 0..20_000usize {
                        let off = (i % 4) * MIN_STRIPE;
                        let (src, dst) = if flip { (b, a) } else { (a, b) };
                        let _h = lock_all(&[
                            (src, off, 3 * MIN_STRIPE, Access::Read),
                            (dst, off, 3 * MIN_STRIPE, Access::Write),
                        ]);
                    }
                });
            }
        });
    }
}
