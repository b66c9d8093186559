//! Synchronous copies spread over the calling thread and one long-lived helper thread: the
//! engine's mapped copies (`engine::mapped`), which copy a caller's borrowed bytes and so must
//! be over when the call returns.
//!
//! Why a helper: one core's `memcpy` does not saturate the memory bus (see `hostcopy`), and a
//! batch of mapped copies (a store's 64 x 1 MiB `batch_put` into a same-host node) ran on the
//! caller's thread alone. Why long-lived: starting and joining a scoped thread per call cost
//! 200 µs on this project's VMs, as much as copying a megabyte.
//!
//! How: the copies are cut into pieces of [`PIECE`] bytes (`hostcopy::pieces_of`) and the
//! pieces into two runs of about equal bytes (`hostcopy::runs`). The caller queues the job
//! for the process's copier thread (started on first use), works through the first run, then
//! takes whatever of the second the copier has not started; the copier does the reverse. The
//! call returns once every piece is copied, so no piece is ever copied after it returns. A
//! busy or late copier costs the caller at most the piece it is copying: jobs of concurrent
//! callers queue, and each caller takes its own pieces back.
//!
//! The caller takes the CPU stripes (`memory::cpu`) of every byte the copies touch in this
//! process before the first piece and lets them go after the last, and the copier copies
//! under them (it takes no lock, so it never waits on one). Locking per piece made the two
//! threads take turns on a stripe (one stripe of a 3 GiB segment spans 12 MiB), each turn
//! a sleep and a wake: a 4 MiB part of a `batch_put` into the own segment took 3 ms.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use super::hostcopy::{Piece, cpus, overlapping, pieces_of, runs};
use crate::memory::{Access, CpuLock, SendPtr, lock_every};

/// Copies are cut into pieces of this size: small enough that a caller whose copier is late
/// waits little for the piece under way, big enough that a piece's bookkeeping is noise
/// (128 KiB to 512 KiB measured alike).
const PIECE: usize = 256 << 10;

/// Copies of this many bytes in all, or more, are spread; smaller ones run on the caller's
/// thread. Waking the copier takes tens of microseconds on this project's VMs: spreading a
/// single 1 MiB copy made a 1 MiB `put` to a same-host node 10-20% slower (p50 about 120
/// µs against 100), while a 4 MiB part of a `batch_put` and every bigger copy gained.
const SPREAD_MIN: usize = 2 << 20;

/// Where a copy's CPU stripes are: the lock of this process's region the copy touches, the
/// offset of the copy's first byte in it, and how the copy touches it.
pub(crate) trait Stripes {
    /// The lock, the offset of the copy's first byte in its region, and the access; `None`
    /// where the bytes are not this process's memory (nothing to lock).
    fn stripes(&self) -> Option<(&CpuLock, usize, Access)>;
}

/// One copy: `len` bytes from `src` to `dst`, under the stripes `owner` names (it also keeps
/// the mapping of the bytes alive while the copy is held).
pub(crate) struct MemCopy<T> {
    /// What the copy touches in this process, kept for its caller.
    pub(crate) owner: T,
    /// The first byte read.
    pub(crate) src: SendPtr,
    /// The first byte written.
    pub(crate) dst: SendPtr,
    /// Bytes.
    pub(crate) len: usize,
}

/// A job shared by the caller and the copier.
struct Job {
    /// (source, destination, length) of each copy.
    copies: Vec<(SendPtr, SendPtr, usize)>,
    pieces: Vec<Piece>,
    /// Where run 0 and run 1 start, and where run 1 ends.
    bounds: [usize; 3],
    /// The next piece of each run.
    next: [AtomicUsize; 2],
    /// Pieces not yet copied (a piece counts once its copy is over).
    left: AtomicUsize,
    /// Signalled when `left` reaches zero on the copier's side.
    done: (Mutex<()>, Condvar),
}

/// A closed run's cursor: far past any piece, and far from wrapping with the few failed
/// takes that may follow.
const CLOSED: usize = usize::MAX / 2;

/// What the copier thread runs: its share of one queued job.
type Work = Box<dyn FnOnce() + Send>;

/// The copier's queue; `None` where this process has one CPU or no thread could be started.
fn copier() -> Option<&'static Mutex<Sender<Work>>> {
    static COPIER: OnceLock<Option<Mutex<Sender<Work>>>> = OnceLock::new();
    COPIER
        .get_or_init(|| {
            if cpus() < 2 {
                return None;
            }
            let (tx, rx) = mpsc::channel::<Work>();
            std::thread::Builder::new()
                .name("moongate-copier".into())
                .spawn(move || {
                    while let Ok(work) = rx.recv() {
                        work();
                    }
                })
                .ok()?;
            Some(Mutex::new(tx))
        })
        .as_ref()
}

/// Whether some copy's destination overlaps another range of `copies` (a destination or a
/// source, its own source included): such copies must run in order, on one thread.
fn written_twice<T>(copies: &[MemCopy<T>]) -> bool {
    // (start, end, is a destination), by start; a range overlaps an earlier one iff it
    // starts before the furthest end so far, a destination iff before the furthest end of
    // the destinations so far.
    let mut spans: Vec<(usize, usize, bool)> = Vec::with_capacity(2 * copies.len());
    for c in copies.iter().filter(|c| c.len > 0) {
        for (at, dst) in [(c.src.0 as usize, false), (c.dst.0 as usize, true)] {
            spans.push((at, at.saturating_add(c.len), dst));
        }
    }
    spans.sort_unstable();
    let (mut end, mut dst_end) = (0usize, 0usize);
    for (start, stop, dst) in spans {
        if start < dst_end || (dst && start < end) {
            return true;
        }
        end = end.max(stop);
        if dst {
            dst_end = dst_end.max(stop);
        }
    }
    false
}

/// Runs `copies` (see the module doc); returns once every byte is copied.
///
/// # Safety
/// For every copy: `src` readable and `dst` writable for `len` bytes until this returns, and
/// no one else writing either meanwhile except under the stripes `owner` names. A copy whose
/// own source and destination overlap is copied as one `memmove`; copies of which one writes
/// what another reads or writes are copied one after the other, in order, on the calling
/// thread.
pub(crate) unsafe fn copy_all<T: Stripes>(copies: &[MemCopy<T>]) {
    let total = copies.iter().fold(0usize, |a, c| a.saturating_add(c.len));
    // An overlapping copy is one piece: its halves must run in memmove's order.
    let whole = |c: &MemCopy<T>| overlapping(c.src.0, c.dst.0, c.len);
    let lens: Vec<usize> = copies
        .iter()
        .map(|c| if whole(c) { 0 } else { c.len })
        .collect();
    let mut pieces = pieces_of(&lens, PIECE);
    for p in &mut pieces {
        if whole(&copies[p.job]) {
            p.len = copies[p.job].len;
        }
    }
    // Copies that write what another touches run in order on this thread: spread, two
    // threads would touch the same bytes at once, one writing.
    let two = total >= SPREAD_MIN && pieces.len() > 1 && !written_twice(copies);
    let bounds = match runs(&pieces, if two { 2 } else { 1 })[..] {
        [a, b, c] => [a, b, c],
        _ => [0, pieces.len(), pieces.len()],
    };
    // Every stripe the copies touch, taken before any piece is copied (here or on the
    // copier) and held until the last one is over.
    let _held = lock_every(copies.iter().filter_map(|c| {
        let (lock, off, access) = c.owner.stripes()?;
        Some((lock, off, c.len, access))
    }));
    let job = Arc::new(Job {
        next: [AtomicUsize::new(bounds[0]), AtomicUsize::new(bounds[1])],
        left: AtomicUsize::new(pieces.len()),
        copies: copies.iter().map(|c| (c.src, c.dst, c.len)).collect(),
        pieces,
        bounds,
        done: (Mutex::new(()), Condvar::new()),
    });
    // Dropped before `_held` (on return or unwind): no piece is taken after it, and it waits
    // for those taken to be over, so no piece is copied once this function is left.
    let _over = Finish(&job);
    if bounds[1] < bounds[2]
        && let Some(q) = copier()
    {
        let j = job.clone();
        let work: Work = Box::new(move || while j.step(1) {});
        // A copier gone leaves its run to this thread.
        let _ = q.lock().map(|tx| tx.send(work));
    }
    // For `step` here and on the copier: the caller's contract covers every piece, under
    // the stripes held above.
    while job.step(0) {}
}

impl Job {
    /// The next piece not yet taken: of run `run`, else of the other.
    fn take(&self, run: usize) -> Option<usize> {
        [run, 1 - run].into_iter().find_map(|r| {
            let i = self.next[r].fetch_add(1, Ordering::Relaxed);
            (i < self.bounds[r + 1]).then_some(i)
        })
    }

    /// Takes no more pieces, here or on the copier (a take after this fails), and counts the
    /// ones never taken as over.
    fn close(&self) {
        for r in 0..2 {
            let next = self.next[r].swap(CLOSED, Ordering::Relaxed);
            let untaken = self.bounds[r + 1].saturating_sub(next);
            if untaken > 0 {
                self.over(untaken);
            }
        }
    }

    /// Counts `n` pieces over, and wakes the caller after the last one.
    fn over(&self, n: usize) {
        if self.left.fetch_sub(n, Ordering::AcqRel) == n {
            let (m, cv) = &self.done;
            let _g = m.lock().unwrap_or_else(|p| p.into_inner());
            cv.notify_all();
        }
    }

    /// Copies the next piece (of run `run` first); false when none was left. A job is only
    /// made by [`copy_all`], whose contract the copies below rely on.
    fn step(&self, run: usize) -> bool {
        let Some(i) = self.take(run) else {
            return false;
        };
        // Counts the piece over even if its copy unwinds, so the caller never waits forever.
        let _over = Over(self);
        let p = self.pieces[i];
        let (src, dst, len) = self.copies[p.job];
        if p.len == 0 {
            return true;
        }
        let (s, d) = (src.0.wrapping_add(p.off), dst.0.wrapping_add(p.off));
        if overlapping(s, d, p.len) {
            // SAFETY: the piece is inside its copy (`pieces_of`), under `copy_all`'s contract
            // and the stripes its caller holds until every piece is over; an overlapping copy
            // is one piece, so this is the whole `memmove`.
            unsafe { std::ptr::copy(s, d, p.len) };
        } else {
            // SAFETY: as above, and the ranges do not overlap.
            unsafe { crate::memory::copy_nonoverlapping_part(s, d, p.len, len) };
        }
        true
    }
}

/// Counts a piece over when dropped (its copy done or unwound).
struct Over<'a>(&'a Job);

impl Drop for Over<'_> {
    fn drop(&mut self) {
        self.0.over(1);
    }
}

/// Closes a job when dropped and waits until every piece taken is over.
struct Finish<'a>(&'a Job);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        let job = self.0;
        job.close();
        let (m, cv) = &job.done;
        let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
        while job.left.load(Ordering::Acquire) > 0 {
            g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies of plain vectors: nothing to lock.
    struct Plain;

    impl Stripes for Plain {
        fn stripes(&self) -> Option<(&CpuLock, usize, Access)> {
            None
        }
    }

    fn pattern(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + seed) as u8).collect()
    }

    /// Copies from `srcs` into `dsts`, one each.
    fn plain_copies(srcs: &[Vec<u8>], dsts: &mut [Vec<u8>]) -> Vec<MemCopy<Plain>> {
        srcs.iter()
            .zip(dsts)
            .map(|(s, d)| MemCopy {
                owner: Plain,
                src: SendPtr(s.as_ptr().cast_mut()),
                dst: SendPtr(d.as_mut_ptr()),
                len: s.len(),
            })
            .collect()
    }

    /// Many copies of odd sizes, spread over both threads: every byte lands where a
    /// sequential copy would put it.
    #[test]
    fn spread_copies_land_like_sequential_ones() {
        let lens = [3 << 20, 1, 0, (1 << 20) + 7, 4096, PIECE + 1];
        let srcs: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(n, i))
            .collect();
        let mut dsts: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0u8; n]).collect();
        let copies = plain_copies(&srcs, &mut dsts);
        assert!(!written_twice(&copies));
        for _ in 0..3 {
            // SAFETY: every pointer is into a live vector of this test, valid for its
            // length; the destinations are distinct vectors.
            unsafe { copy_all(&copies) };
        }
        for (i, (s, d)) in srcs.iter().zip(&dsts).enumerate() {
            assert!(s == d, "copy {i} went wrong");
        }
    }

    /// A copy shifting bytes within one buffer is one `memmove`, next to other copies.
    #[test]
    fn a_copy_into_its_own_source_moves_like_memmove() {
        let srcs = vec![pattern(3 << 20, 5)];
        let mut dsts = vec![vec![0u8; 3 << 20]];
        let mut copies = plain_copies(&srcs, &mut dsts);
        // Shift the first 2 MiB of `shift` up by 4097 bytes, inside the vector.
        let mut shift = pattern(3 << 20, 99);
        let mut want = shift.clone();
        want.copy_within(0..2 << 20, 4097);
        let base = shift.as_mut_ptr();
        copies.push(MemCopy {
            owner: Plain,
            src: SendPtr(base),
            dst: SendPtr(base.wrapping_add(4097)),
            len: 2 << 20,
        });
        assert!(
            written_twice(&copies),
            "a copy into its own source runs in order"
        );
        // SAFETY: every pointer is into a live vector of this test, valid for its length;
        // the shift overlaps only its own source.
        unsafe { copy_all(&copies) };
        assert!(shift == want, "the memmove went wrong");
        assert!(dsts[0] == srcs[0]);
    }

    #[test]
    fn a_range_written_twice_is_found_whatever_else_it_overlaps() {
        let span = |src: usize, dst: usize, len: usize| MemCopy {
            owner: Plain,
            src: SendPtr(src as *mut u8),
            dst: SendPtr(dst as *mut u8),
            len,
        };
        // Disjoint, or sources read twice: spread.
        assert!(!written_twice(&[span(0, 100, 10), span(200, 300, 10)]));
        assert!(!written_twice(&[span(0, 100, 10), span(5, 300, 10)]));
        assert!(!written_twice(&[span(0, 100, 0), span(0, 100, 10)]));
        // Two destinations, a destination over another's source, over its own source.
        assert!(written_twice(&[span(0, 100, 10), span(200, 105, 10)]));
        assert!(written_twice(&[span(0, 100, 10), span(95, 300, 10)]));
        assert!(written_twice(&[span(0, 100, 10), span(105, 300, 10)]));
        assert!(written_twice(&[span(0, 5, 10)]));
        // Hidden behind a longer source that starts first.
        assert!(written_twice(&[
            span(0, 1000, 100),
            span(10, 2000, 5),
            span(3000, 12, 5)
        ]));
    }

    /// Two copies writing the same bytes are not spread: they run in order, the last one's
    /// bytes are what is left.
    #[test]
    fn copies_onto_the_same_bytes_run_in_order() {
        let (a, b) = (pattern(3 << 20, 1), pattern(3 << 20, 2));
        let mut dst = vec![0u8; 3 << 20];
        let d = SendPtr(dst.as_mut_ptr());
        let copies: Vec<MemCopy<Plain>> = [&a, &b]
            .iter()
            .map(|s| MemCopy {
                owner: Plain,
                src: SendPtr(s.as_ptr().cast_mut()),
                dst: d,
                len: s.len(),
            })
            .collect();
        assert!(written_twice(&copies));
        // SAFETY: the vectors live past the call; the sources are not written.
        unsafe { copy_all(&copies) };
        assert!(dst == b);
    }

    /// Callers on several threads at once share the copier: each returns with all of its
    /// own bytes copied.
    #[test]
    fn concurrent_callers_each_get_their_bytes() {
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for round in 0..16 {
                        let src = pattern(2 << 20, t * 100 + round);
                        let mut dst = vec![0u8; src.len()];
                        let copy = MemCopy {
                            owner: Plain,
                            src: SendPtr(src.as_ptr().cast_mut()),
                            dst: SendPtr(dst.as_mut_ptr()),
                            len: src.len(),
                        };
                        // SAFETY: both vectors live past the call and do not overlap.
                        unsafe { copy_all(&[copy]) };
                        assert!(src == dst, "thread {t} round {round}");
                    }
                });
            }
        });
    }
}
