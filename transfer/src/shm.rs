//! Shared-memory transport for peers on the same host (and the engine's own segment).
//!
//! A peer's shared region is a memfd; this side opens it as `/proc/<pid>/fd/<fd>` (after
//! checking the link names the expected memfd, which guards against pid reuse), maps it,
//! and copies with `memcpy`. Before and after each copy it checks the region's control page
//! (same registration id and token, still registered) and, after the copy, that the owner
//! process still holds its lock on the memfd (it is alive): the same bounds and token
//! rules as the TCP target applies, and a dead or retired peer is an error, not silent
//! success. Requests into the engine's own segment are plain copies checked against the
//! registration table.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use crate::engine::batch::{BatchState, Op};
use crate::error::{RemoteRange, Result, TransferError};
use crate::memory::{Mapping, SHM_STATE_REGISTERED, ShmControl, ofd_lock_held};
use crate::registry::{LocalEntry, LocalRegions};
use crate::segment::{RegionDescriptor, ShmRegion};
use crate::tcp::io::SendPtr;

/// Copies up to this many bytes in total run inline in `submit`; bigger batches run in a
/// task.
const INLINE_BYTES: u64 = 256 << 10;
/// Copies at least this large prefault the peer's pages first.
const PREFAULT_MIN: usize = 1 << 20;
/// Prefaulting is remembered per this many bytes of a region.
const PREFAULT_UNIT: usize = 2 << 20;
/// Large copies are cut into chunks of this size (about a millisecond each) between which
/// other tasks run and cancellation and timeouts are seen.
const CHUNK: usize = 4 << 20;

/// A peer's shared region mapped into this process.
pub(crate) struct PeerMapping {
    map: Mapping,
    file: File,
    data_offset: usize,
    region: RegionDescriptor,
    populated: Box<[std::sync::atomic::AtomicBool]>,
}

impl PeerMapping {
    fn open(segment: &str, region: &RegionDescriptor, shm: &ShmRegion) -> Result<Self> {
        let fail = |reason: String| {
            TransferError::unreachable(segment, format!("shared memory: {reason}"))
        };
        let path = format!("/proc/{}/fd/{}", shm.pid, shm.fd);
        let link = std::fs::read_link(&path).map_err(|e| fail(format!("{path}: {e}")))?;
        if !link
            .to_string_lossy()
            .contains(&format!("memfd:{}", shm.name))
        {
            return Err(fail(format!(
                "{path} is not memfd {} (owner gone?)",
                shm.name
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| fail(format!("{path}: {e}")))?;
        let size = file
            .metadata()
            .map_err(|e| fail(format!("fstat {path}: {e}")))?
            .len();
        let need = shm
            .data_offset
            .checked_add(region.len)
            .ok_or_else(|| fail("region overflows".into()))?;
        if size < need || shm.data_offset < crate::memory::SHM_CONTROL_LEN as u64 {
            return Err(fail(format!(
                "memfd holds {size} bytes, the region needs {need}"
            )));
        }
        let map = Mapping::map(
            size as usize,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            "mmap(peer memfd)",
        )?;
        let m = Self {
            map,
            file,
            data_offset: shm.data_offset as usize,
            region: region.clone(),
            populated: (0..(region.len as usize).div_ceil(PREFAULT_UNIT))
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
        };
        m.check(segment, RemoteRange::new(region.addr, region.len))?;
        Ok(m)
    }

    fn control(&self) -> &ShmControl {
        // SAFETY: the mapping is at least data_offset >= SHM_CONTROL_LEN bytes (checked at
        // open), page aligned, and lives as long as self.
        unsafe { ShmControl::at(self.map.ptr()) }
    }

    /// The registration is the one the descriptor names and is still registered.
    fn check(&self, segment: &str, range: RemoteRange) -> Result<()> {
        let c = self.control();
        if c.region_id.load(Ordering::Acquire) != self.region.id
            || c.token.load(Ordering::Acquire) != self.region.token
        {
            return Err(TransferError::BadToken {
                segment: segment.to_owned(),
                range,
            });
        }
        if c.state.load(Ordering::Acquire) != SHM_STATE_REGISTERED {
            return Err(TransferError::OutOfBounds {
                segment: segment.to_owned(),
                range,
                reason: "the region was unregistered".into(),
            });
        }
        Ok(())
    }

    /// The owner process is alive (holds its lock on the memfd).
    fn check_owner(&self, segment: &str) -> Result<()> {
        match ofd_lock_held(self.file.as_raw_fd()) {
            Ok(true) => Ok(()),
            Ok(false) => Err(TransferError::unreachable(
                segment,
                "shared memory owner exited",
            )),
            Err(e) => Err(TransferError::unreachable(
                segment,
                format!("shared memory lock check: {e}"),
            )),
        }
    }

    /// Maps the page-table entries of a large range in one call instead of one fault per
    /// page (this process maps the peer's pages lazily), once per 2 MiB of the region.
    fn prefault(&self, addr: u64, len: usize, write: bool) {
        const MADV_POPULATE_READ: libc::c_int = 22;
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        if len < PREFAULT_MIN {
            return;
        }
        let off = (addr - self.region.addr) as usize;
        let (first, last) = (off / PREFAULT_UNIT, (off + len - 1) / PREFAULT_UNIT);
        let flags = &self.populated[first..=last.min(self.populated.len() - 1)];
        if flags.iter().all(|f| f.load(Ordering::Relaxed)) {
            return;
        }
        // Chunks wholly inside the range are populated below; edges may be partial.
        let inner_first = off.div_ceil(PREFAULT_UNIT);
        let inner_end = (off + len) / PREFAULT_UNIT;
        for f in self.populated.iter().take(inner_end).skip(inner_first) {
            f.store(true, Ordering::Relaxed);
        }
        let page = crate::memory::page_size();
        let start = self.ptr_of(addr).0 as usize;
        let aligned = start - start % page;
        let advice = if write {
            MADV_POPULATE_WRITE
        } else {
            MADV_POPULATE_READ
        };
        // SAFETY: the range lies inside our mapping (checked against the descriptor); the
        // advice only populates page tables (older kernels reject it: harmless).
        unsafe {
            libc::madvise(
                aligned as *mut libc::c_void,
                len + (start - aligned),
                advice,
            )
        };
    }

    fn ptr_of(&self, addr: u64) -> SendPtr {
        SendPtr(
            self.map
                .ptr()
                .wrapping_add(self.data_offset + (addr - self.region.addr) as usize),
        )
    }
}

/// Mappings of one peer segment's shared regions, by region id.
#[derive(Default)]
pub(crate) struct ShmMaps {
    maps: Mutex<HashMap<u64, Arc<PeerMapping>>>,
}

impl ShmMaps {
    /// The mapping of `region` (mapped on first use).
    pub(crate) fn get(
        &self,
        segment: &str,
        region: &RegionDescriptor,
        shm: &ShmRegion,
    ) -> Result<Arc<PeerMapping>> {
        if let Some(m) = self.maps.lock().get(&region.id)
            && m.region == *region
        {
            return Ok(m.clone());
        }
        let m = Arc::new(PeerMapping::open(segment, region, shm)?);
        self.maps.lock().insert(region.id, m.clone());
        Ok(m)
    }

    /// Unmaps everything (the peer re-registered or restarted).
    pub(crate) fn clear(&self) {
        self.maps.lock().clear();
    }
}

/// Where a memory-copy request's remote side is.
pub(crate) enum CopyTarget {
    /// A same-host peer's mapped region.
    Peer(Arc<PeerMapping>),
    /// A region of this engine.
    Local(Arc<LocalEntry>),
}

/// A request of a batch executed by memory copy.
pub(crate) struct CopyJob {
    pub(crate) idx: usize,
    pub(crate) target: CopyTarget,
}

/// Resolves a request into this engine's own segment.
pub(crate) fn local_target(
    regions: &LocalRegions,
    segment: &str,
    addr: u64,
    len: u64,
) -> Result<CopyTarget> {
    regions
        .entry_for(addr, len)
        .map(CopyTarget::Local)
        .ok_or_else(|| TransferError::OutOfBounds {
            segment: segment.to_owned(),
            range: RemoteRange::new(addr, len),
            reason: "not inside one registered region of this engine".into(),
        })
}

/// Copies one request, `CHUNK` bytes at a time, yielding between chunks when `yield_between`
/// (so other tasks of the runtime run and cancellation or the deadline is seen).
async fn run_one(batch: &BatchState, job: &CopyJob, yield_between: bool) -> Result<()> {
    let req = &batch.requests[job.idx];
    let seg = req.segment.name();
    let range = req.remote_range();
    let remote = match &job.target {
        CopyTarget::Peer(m) => {
            m.check(seg, range)?;
            m.prefault(req.remote_addr, req.len, req.op == Op::Write);
            m.ptr_of(req.remote_addr)
        }
        CopyTarget::Local(e) => SendPtr(
            e.region
                .as_ptr()
                .wrapping_add((req.remote_addr - e.region.addr()) as usize),
        ),
    };
    let local = SendPtr(req.local_ptr());
    let (src, dst) = if req.op == Op::Write {
        (local, remote)
    } else {
        (remote, local)
    };
    let mut done = 0;
    while done < req.len {
        if !batch.is_live(job.idx) {
            return Ok(()); // cancelled or expired: its status is already set
        }
        if tokio::time::Instant::now() >= batch.deadline {
            return Err(TransferError::TimedOut {
                segment: seg.to_owned(),
                range,
                timeout: batch.timeout,
            });
        }
        let n = CHUNK.min(req.len - done);
        let (s, d) = (src.add(done).0, dst.add(done).0);
        if overlapping(s, d, n) {
            // SAFETY: src and dst are inside registered memory validated for req.len bytes
            // (the local range at submit, the remote one against the descriptor and control
            // page or the registration table), kept alive by the batch and the job; `copy`
            // tolerates the overlap (a buffer copied into itself on the local segment).
            unsafe { std::ptr::copy(s, d, n) };
        } else {
            // SAFETY: as above, and the ranges do not overlap.
            unsafe { crate::memory::copy_nonoverlapping_large(s, d, n) };
        }
        done += n;
        if yield_between && done < req.len {
            tokio::task::yield_now().await;
        }
    }
    if let CopyTarget::Peer(m) = &job.target {
        m.check(seg, range)?;
        m.check_owner(seg)?;
    }
    Ok(())
}

fn overlapping(a: *const u8, b: *const u8, n: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a < b.wrapping_add(n) && b < a.wrapping_add(n)
}

/// Runs memory-copy jobs: inline when small; otherwise in a task of the current runtime
/// that copies chunk by chunk (on the submitting thread when the runtime is single-threaded:
/// no hand-off to another thread on the hot path).
pub(crate) async fn run(batch: &Arc<BatchState>, jobs: Vec<CopyJob>) {
    if jobs.is_empty() {
        return;
    }
    let bytes: u64 = jobs.iter().map(|j| batch.requests[j.idx].len as u64).sum();
    if bytes <= INLINE_BYTES {
        for job in &jobs {
            let r = run_one(batch, job, false).await;
            batch.finish(job.idx, r);
        }
        return;
    }
    let batch = batch.clone();
    tokio::spawn(async move {
        for job in &jobs {
            let r = run_one(&batch, job, true).await;
            batch.finish(job.idx, r);
        }
    });
}
