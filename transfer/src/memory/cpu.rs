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

use std::marker::PhantomData;
use std::ops::Range;

use parking_lot::RawRwLock;
use parking_lot::lock_api::RawRwLock as _;

/// Most stripes per region.
pub(crate) const MAX_STRIPES: usize = 256;
/// Smallest stripe.
pub(crate) const MIN_STRIPE: usize = 64 << 10;

/// The striped CPU access lock of one region (offsets are from the region's first byte).
pub(crate) struct CpuLock {
    shift: u32,
    stripes: Box<[RawRwLock]>,
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

/// A run of consecutive stripes of one lock, held in one mode.
struct Run<'a> {
    lock: &'a CpuLock,
    stripes: Range<usize>,
    access: Access,
}

/// Stripes held for one copy (at most two runs: one per region); released on drop. Holding
/// any number of stripes allocates nothing. Not `Send`: released by the thread that took
/// it (and never held across an await).
pub(crate) struct Held<'a> {
    runs: [Option<Run<'a>>; 2],
    _not_send: PhantomData<*const ()>,
}

impl<'a> Held<'a> {
    fn take(lock: &'a CpuLock, stripes: Range<usize>, access: Access) -> Run<'a> {
        for s in &lock.stripes[stripes.clone()] {
            match access {
                Access::Read => s.lock_shared(),
                Access::Write => s.lock_exclusive(),
            }
        }
        Run {
            lock,
            stripes,
            access,
        }
    }

    /// Number of stripes held.
    #[cfg(test)]
    pub(crate) fn stripes(&self) -> usize {
        self.runs.iter().flatten().map(|r| r.stripes.len()).sum()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for run in self.runs.iter().flatten() {
            for s in &run.lock.stripes[run.stripes.clone()] {
                match run.access {
                    // SAFETY: `take` locked exactly these stripes in this mode for this
                    // `Held`, which is dropped once, by the thread that took it (not Send).
                    Access::Read => unsafe { s.unlock_shared() },
                    // SAFETY: as above, exclusively.
                    Access::Write => unsafe { s.unlock_exclusive() },
                }
            }
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
            stripes: (0..n).map(|_| RawRwLock::INIT).collect(),
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
        Held {
            runs: [Some(Held::take(self, self.span(off, len), access)), None],
            _not_send: PhantomData,
        }
    }
}

/// Holds the ranges `parts` (lock, offset, length, access; at most two) of one or two
/// regions at once. Stripes are taken in one global order: by region (the address of its
/// stripes), then ascending; two parts of one region are taken as one run covering both,
/// exclusive if either writes (a region copied into itself). So copies that cross each
/// other cannot deadlock, and no stripe is taken twice.
pub(crate) fn lock_all<'a>(parts: &[(&'a CpuLock, usize, usize, Access)]) -> Held<'a> {
    assert!(parts.len() <= 2, "lock_all takes at most two ranges");
    let mut want: [Option<(&'a CpuLock, Range<usize>, Access)>; 2] = [None, None];
    for (i, &(l, off, len, access)) in parts.iter().enumerate() {
        want[i] = Some((l, l.span(off, len), access));
    }
    if let [Some(a), Some(b)] = &want
        && std::ptr::eq(a.0, b.0)
    {
        let merged = if a.1.is_empty() {
            b.1.clone()
        } else if b.1.is_empty() {
            a.1.clone()
        } else {
            a.1.start.min(b.1.start)..a.1.end.max(b.1.end)
        };
        let access = if a.2 == Access::Write || b.2 == Access::Write {
            Access::Write
        } else {
            Access::Read
        };
        want = [Some((a.0, merged, access)), None];
    }
    if let [Some(a), Some(b)] = &want
        && (b.0.stripes.as_ptr() as usize) < (a.0.stripes.as_ptr() as usize)
    {
        want.swap(0, 1);
    }
    let mut held = Held {
        runs: [None, None],
        _not_send: PhantomData,
    };
    for (slot, w) in held.runs.iter_mut().zip(want) {
        if let Some((l, span, access)) = w {
            *slot = Some(Held::take(l, span, access));
        }
    }
    held
}

/// Stripes held for a batch of copies (any number of ranges, of any regions); released on
/// drop. Not `Send`: released by the thread that took it.
pub(crate) struct HeldEvery<'a> {
    stripes: Vec<(&'a CpuLock, usize, Access)>,
    _not_send: PhantomData<*const ()>,
}

impl HeldEvery<'_> {
    /// Number of stripes held.
    #[cfg(test)]
    pub(crate) fn stripes(&self) -> usize {
        self.stripes.len()
    }
}

impl Drop for HeldEvery<'_> {
    fn drop(&mut self) {
        for &(lock, i, access) in &self.stripes {
            let s = &lock.stripes[i];
            match access {
                // SAFETY: `lock_every` locked exactly this stripe in this mode for this value,
                // which is dropped once, by the thread that took it (not Send).
                Access::Read => unsafe { s.unlock_shared() },
                // SAFETY: as above, exclusively.
                Access::Write => unsafe { s.unlock_exclusive() },
            }
        }
    }
}

/// Holds the ranges `parts` (lock, offset, length, access), of any number of regions, at
/// once: every stripe a part touches, once, exclusive if any part writes it, taken in the
/// global order of [`lock_all`] (by region, then ascending), so it cannot deadlock with it
/// or with itself.
pub(crate) fn lock_every<'a>(
    parts: impl IntoIterator<Item = (&'a CpuLock, usize, usize, Access)>,
) -> HeldEvery<'a> {
    let mut want: Vec<(&'a CpuLock, usize, Access)> = Vec::new();
    for (l, off, len, access) in parts {
        want.extend(l.span(off, len).map(|i| (l, i, access)));
    }
    want.sort_by_key(|&(l, i, _)| (l.stripes.as_ptr() as usize, i));
    let mut stripes: Vec<(&'a CpuLock, usize, Access)> = Vec::with_capacity(want.len());
    for (l, i, access) in want {
        match stripes.last_mut() {
            Some((hl, hi, ha)) if std::ptr::eq(*hl, l) && *hi == i => {
                if access == Access::Write {
                    *ha = Access::Write;
                }
            }
            _ => stripes.push((l, i, access)),
        }
    }
    for &(l, i, access) in &stripes {
        match access {
            Access::Read => l.stripes[i].lock_shared(),
            Access::Write => l.stripes[i].lock_exclusive(),
        }
    }
    HeldEvery {
        stripes,
        _not_send: PhantomData,
    }
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
    fn overlapping_parts_of_one_region_are_one_run_and_writes_win() {
        let l = CpuLock::new(4 * MIN_STRIPE);
        // A region copied into itself: the same stripes read and written.
        let held = lock_all(&[
            (&l, 0, 2 * MIN_STRIPE, Access::Read),
            (&l, MIN_STRIPE, 2 * MIN_STRIPE, Access::Write),
        ]);
        assert_eq!(held.stripes(), 3, "each stripe once");
        for i in 0..3 {
            assert!(!l.stripes[i].try_lock_shared(), "stripe {i} is exclusive");
        }
        assert!(
            l.stripes[3].try_lock_exclusive(),
            "the untouched stripe is free"
        );
        // SAFETY: taken just above by this thread.
        unsafe { l.stripes[3].unlock_exclusive() };
        drop(held);
        for s in l.stripes.iter() {
            assert!(s.try_lock_exclusive(), "released");
            // SAFETY: taken just above by this thread.
            unsafe { s.unlock_exclusive() };
        }
        // Reads of two regions are shared.
        let m = CpuLock::new(MIN_STRIPE);
        let held = lock_all(&[(&l, 0, 1, Access::Read), (&m, 0, 1, Access::Read)]);
        assert_eq!(held.stripes(), 2);
        assert!(l.stripes[0].try_lock_shared());
        // SAFETY: taken just above by this thread.
        unsafe { l.stripes[0].unlock_shared() };
        drop(held);
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

    #[test]
    fn every_stripe_of_a_batch_is_held_once_and_writes_win() {
        let a = CpuLock::new(8 * MIN_STRIPE);
        let b = CpuLock::new(2 * MIN_STRIPE);
        let held = lock_every([
            (&a, 0, 10, Access::Read),
            (&b, MIN_STRIPE, 1, Access::Write),
            (&a, 5 * MIN_STRIPE, 2 * MIN_STRIPE, Access::Write),
            (&a, 6 * MIN_STRIPE, 1, Access::Read),
            (&a, 0, 0, Access::Write),
        ]);
        assert_eq!(held.stripes(), 4, "a: 0, 5, 6; b: 1");
        assert!(a.stripes[0].try_lock_shared(), "read only: shared");
        // SAFETY: taken just above by this thread.
        unsafe { a.stripes[0].unlock_shared() };
        for i in [5, 6] {
            assert!(!a.stripes[i].try_lock_shared(), "stripe {i} is exclusive");
        }
        assert!(!b.stripes[1].try_lock_shared());
        assert!(
            a.stripes[1].try_lock_exclusive(),
            "untouched stripes stay free"
        );
        // SAFETY: taken just above by this thread.
        unsafe { a.stripes[1].unlock_exclusive() };
        drop(held);
        for (l, n) in [(&a, 8), (&b, 2)] {
            for i in 0..n {
                assert!(l.stripes[i].try_lock_exclusive(), "stripe {i} released");
            }
        }
    }
}
