//! Host memory copies of a batch (a same-host peer's shared memory, the engine's own
//! segment), spread over the runtime's worker threads.
//!
//! Why spread: one core's `memcpy` does not saturate the memory bus. On the 2-vCPU virtual
//! machines this project is measured on, copying 64 MiB took 4.2-4.9 GB/s on one thread
//! and 6.5-7.6 GB/s on two, and a store's batch read from its own segment (64 x 1 MiB)
//! was bound by the one thread at about 5-6 GB/s.
//!
//! How: a batch's requests are cut into pieces of at most [`CHUNK`] bytes, in order, and the
//! pieces into runs of about equal bytes, one per copier (`runs`). Each copier works
//! through its own run, then takes what is left of the others'. The copiers are one task per
//! runtime worker (at most [`MAX_TASKS`]), yielding between pieces so other tasks run and
//! cancellation and deadlines are seen. A current-thread runtime has one worker: one task
//! on its thread, plus helpers from its blocking pool, one per other CPU. The first error
//! of a request decides it (its other pieces are then skipped); the copier of a request's
//! last piece checks the peer's side once more and completes it. Small batches run inline
//! in `submit`.
//!
//! Each piece is a landing of its request (none once the request is decided) and holds the
//! CPU locks of the bytes it reads and writes in this process (`memory::cpu`), so pieces of
//! one request copied at once by two threads never touch the same bytes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::runtime::RuntimeFlavor;

use super::{CopyJob, CopyTarget};
use crate::error::{Result, TransferError};
use crate::memory::{Access, SendPtr, lock_all};
use crate::op::{BatchState, Op};

/// Copies up to this many bytes in total run inline in `submit`; bigger batches run in
/// tasks.
const INLINE_BYTES: u64 = 256 << 10;
/// Large copies are cut into pieces of this size (about a millisecond each) between which
/// other tasks run and cancellation and timeouts are seen.
pub(crate) const CHUNK: usize = 4 << 20;
/// Most tasks one batch's copies are spread over: past a few threads the memory bus, not
/// the cores, bounds a copy.
pub(crate) const MAX_TASKS: usize = 8;

/// `len` bytes from offset `off` of request `job` (an index into the batch's copy jobs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The request (an index into the batch's jobs or copies).
    pub(crate) job: usize,
    /// The piece's first byte in its request.
    pub(crate) off: usize,
    /// Bytes.
    pub(crate) len: usize,
}

/// The pieces of requests of `lens` bytes, in order (a request of 0 bytes is one empty
/// piece, so it is still checked and completed).
pub(crate) fn pieces(lens: &[usize]) -> Vec<Piece> {
    pieces_of(lens, CHUNK)
}

/// As [`pieces`], in pieces of at most `chunk` bytes.
pub(crate) fn pieces_of(lens: &[usize], chunk: usize) -> Vec<Piece> {
    let mut out = Vec::with_capacity(lens.len());
    for (job, &len) in lens.iter().enumerate() {
        let mut off = 0;
        loop {
            let n = chunk.min(len - off);
            out.push(Piece { job, off, len: n });
            off += n;
            if off >= len {
                break;
            }
        }
    }
    out
}

/// How many copiers share `pieces` pieces when `copiers` threads could.
pub(crate) fn tasks_for(pieces: usize, copiers: usize) -> usize {
    copiers.clamp(1, MAX_TASKS).min(pieces.max(1))
}

/// Where each of at most `tasks` runs of `pieces` starts (and the end), cut so that each run
/// holds about as many bytes (never empty, so fewer runs when a few pieces hold most bytes): each task works through a run of its own, far from the others'
/// (two tasks writing into one region then rarely wait for one lock stripe).
pub(crate) fn runs(pieces: &[Piece], tasks: usize) -> Vec<usize> {
    let total: usize = pieces.iter().map(|p| p.len).sum();
    let tasks = tasks.max(1);
    let mut bounds = vec![0];
    let mut acc = 0;
    for (i, p) in pieces.iter().enumerate() {
        let cut = bounds.len();
        // Cut before the piece whose middle passes the next boundary.
        if cut < tasks && i > 0 && (acc + p.len / 2) * tasks >= total * cut {
            bounds.push(i);
        }
        acc += p.len;
    }
    bounds.push(pieces.len());
    bounds
}

/// The CPUs this process may use, asked once (the standard library reads cgroup files to
/// answer).
pub(crate) fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// A batch's copies being spread over tasks.
struct Spread {
    batch: Arc<BatchState>,
    jobs: Vec<CopyJob>,
    pieces: Vec<Piece>,
    /// Where each task's run of pieces starts and ends (`runs`).
    bounds: Vec<usize>,
    /// The next piece of each run.
    next: Vec<AtomicUsize>,
    /// Pieces of each job not yet over.
    left: Vec<AtomicUsize>,
}

/// Runs memory-copy jobs: inline when small; otherwise spread over tasks of the current
/// runtime (see the module doc).
pub(crate) async fn run(batch: &Arc<BatchState>, jobs: Vec<CopyJob>) {
    if jobs.is_empty() {
        return;
    }
    let lens: Vec<usize> = jobs.iter().map(|j| batch.requests[j.idx].len).collect();
    let pieces = pieces(&lens);
    let mut left: Vec<usize> = vec![0; jobs.len()];
    for p in &pieces {
        left[p.job] += 1;
    }
    let inline = lens.iter().map(|&n| n as u64).sum::<u64>() <= INLINE_BYTES;
    let handle = tokio::runtime::Handle::current();
    let single = handle.runtime_flavor() == RuntimeFlavor::CurrentThread;
    let tasks = if inline {
        1
    } else if single {
        tasks_for(pieces.len(), cpus())
    } else {
        tasks_for(pieces.len(), handle.metrics().num_workers())
    };
    let bounds = runs(&pieces, tasks);
    let tasks = bounds.len() - 1; // fewer when a few pieces hold most of the bytes
    let spread = Arc::new(Spread {
        batch: batch.clone(),
        jobs,
        pieces,
        next: bounds[..tasks]
            .iter()
            .map(|&b| AtomicUsize::new(b))
            .collect(),
        bounds,
        left: left.into_iter().map(AtomicUsize::new).collect(),
    });
    if inline {
        while spread.step(0) {}
        return;
    }
    for task in 0..tasks {
        let s = spread.clone();
        if single && task > 0 {
            // A helper of a current-thread runtime: a thread of its blocking pool.
            tokio::task::spawn_blocking(move || while s.step(task) {});
        } else {
            tokio::spawn(async move {
                while s.step(task) {
                    tokio::task::yield_now().await;
                }
            });
        }
    }
}

impl Spread {
    /// The next piece not yet taken: of run `task`, else of the runs after it.
    fn take(&self, task: usize) -> Option<usize> {
        let n = self.next.len();
        (0..n).map(|k| (task + k) % n).find_map(|run| {
            let i = self.next[run].fetch_add(1, Ordering::Relaxed);
            (i < self.bounds[run + 1]).then_some(i)
        })
    }

    /// Copies the next piece (of run `task` first, see `take`); false when none was left.
    fn step(&self, task: usize) -> bool {
        let Some(i) = self.take(task) else {
            return false;
        };
        let piece = self.pieces[i];
        let job = &self.jobs[piece.job];
        if self.batch.is_live(job.idx)
            && let Err(e) = copy_piece(&self.batch, job, piece.off, piece.len)
        {
            self.batch.finish(job.idx, Err(e));
        }
        if self.left[piece.job].fetch_sub(1, Ordering::AcqRel) == 1 {
            // The request's last piece: unless an error or the deadline decided it
            // already, the peer's side is checked once more and it succeeds.
            self.batch.finish(job.idx, check_after(&self.batch, job));
        }
        true
    }
}

/// Copies `n` bytes at offset `off` of `job`'s request, after checking the peer's side.
/// A request decided meanwhile (cancelled, expired) is left alone: its status is set.
fn copy_piece(batch: &Arc<BatchState>, job: &CopyJob, off: usize, n: usize) -> Result<()> {
    let req = &batch.requests[job.idx];
    let seg = req.segment.name();
    let range = req.remote_range();
    let (remote, remote_lock, remote_off) = match &job.target {
        CopyTarget::Peer(m) => {
            m.check(seg, range)?;
            m.check_owner(seg)?;
            m.prefault(req.remote_addr + off as u64, n, req.op == Op::Write);
            (
                m.ptr_of(req.remote_addr),
                m.owner_lock.as_deref(),
                (req.remote_addr - m.region.addr) as usize,
            )
        }
        CopyTarget::Local(e) => {
            let at = (req.remote_addr - e.region.addr()) as usize;
            (
                SendPtr(e.region.as_ptr().wrapping_add(at)),
                Some(&**e.region.cpu()),
                at,
            )
        }
        CopyTarget::Ipc(_) => {
            return Err(TransferError::invalid(
                "a device copy reached the host copy path",
            ));
        }
    };
    if n == 0 {
        return Ok(());
    }
    if tokio::time::Instant::now() >= batch.deadline {
        return Err(TransferError::TimedOut {
            segment: seg.to_owned(),
            range,
            timeout: batch.timeout,
        });
    }
    let Some(landing) = batch.begin_landing(job.idx, None) else {
        return Ok(());
    };
    let local = SendPtr(req.local_ptr());
    let local_lock = &**req.local.region().cpu();
    let (src, dst, local_access) = if req.op == Op::Write {
        (local, remote, Access::Read)
    } else {
        (remote, local, Access::Write)
    };
    let remote_access = match local_access {
        Access::Read => Access::Write,
        Access::Write => Access::Read,
    };
    let local_part = (local_lock, req.local_offset + off, n, local_access);
    let held = match remote_lock {
        Some(l) => lock_all(&[local_part, (l, remote_off + off, n, remote_access)]),
        None => lock_all(&[local_part]),
    };
    let (s, d) = (src.add(off).0, dst.add(off).0);
    if overlapping(s, d, n) {
        // SAFETY: src and dst are inside registered memory validated for req.len bytes
        // (the local range at submit, the remote one against the descriptor and control
        // page or the registration table) and off + n <= req.len (`pieces`); both are kept
        // alive by the batch and the job; no other thread of this process copies them (the
        // stripes are held); `copy` tolerates the overlap (a buffer copied into itself on
        // the local segment).
        unsafe { std::ptr::copy(s, d, n) };
    } else {
        // SAFETY: as above, and the ranges do not overlap.
        unsafe { crate::memory::copy_nonoverlapping_part(s, d, n, req.len) };
    }
    drop(held);
    drop(landing);
    Ok(())
}

/// The check of a request's remote side after its bytes moved: a peer's region must still
/// be the one registered (a retired region's bytes are not reported as copied).
fn check_after(batch: &BatchState, job: &CopyJob) -> Result<()> {
    let req = &batch.requests[job.idx];
    match &job.target {
        CopyTarget::Peer(m) => m.check(req.segment.name(), req.remote_range()),
        _ => Ok(()),
    }
}

/// Whether `n` bytes at `a` and `n` bytes at `b` overlap.
pub(crate) fn overlapping(a: *const u8, b: *const u8, n: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a < b.wrapping_add(n) && b < a.wrapping_add(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_cut_into_chunks_in_order() {
        let p = |job, off, len| Piece { job, off, len };
        assert_eq!(
            pieces(&[0, 10, CHUNK, 2 * CHUNK + 1]),
            [
                p(0, 0, 0),
                p(1, 0, 10),
                p(2, 0, CHUNK),
                p(3, 0, CHUNK),
                p(3, CHUNK, CHUNK),
                p(3, 2 * CHUNK, 1),
            ]
        );
    }

    #[test]
    fn one_task_per_worker_bounded_by_the_pieces_and_the_cap() {
        assert_eq!(tasks_for(64, 1), 1, "a current-thread runtime");
        assert_eq!(tasks_for(64, 2), 2);
        assert_eq!(tasks_for(1, 16), 1, "one piece, one task");
        assert_eq!(tasks_for(64, 64), MAX_TASKS);
        assert_eq!(tasks_for(0, 0), 1);
    }

    #[test]
    fn runs_hold_about_equal_bytes() {
        let ps = pieces(&[1 << 20; 64]);
        assert_eq!(runs(&ps, 1), [0, 64]);
        assert_eq!(runs(&ps, 2), [0, 32, 64]);
        assert_eq!(runs(&ps, 3), [0, 21, 43, 64]);
        // One large request and small ones: the large one's chunks are split too.
        let ps = pieces(&[4 * CHUNK, 10, 10]);
        assert_eq!(runs(&ps, 2), [0, 2, 6]);
        assert_eq!(runs(&ps[..1], 2), [0, 1], "a run is never empty");
        let ps = pieces(&[10, 10, CHUNK]);
        assert_eq!(runs(&ps, 3), [0, 2, 3], "fewer runs than tasks");
    }

    #[test]
    fn overlap_is_detected_both_ways() {
        let b = [0u8; 16];
        let p = b.as_ptr();
        assert!(overlapping(p, p.wrapping_add(4), 8));
        assert!(overlapping(p.wrapping_add(4), p, 8));
        assert!(!overlapping(p, p.wrapping_add(8), 8));
    }
}
