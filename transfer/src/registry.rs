//! The engine's table of registered regions, and the RAII handle callers hold.
//!
//! Registration gives a region an id and a random access token and publishes it in the
//! segment descriptor. Dropping the last [`RegisteredBuffer`] clone unregisters it: peers
//! get "unknown region" from then on, and a shared region's control page is marked retired.
//! The memory itself lives on while any transfer still holds it (see `memory`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::RwLock;
use tokio::sync::watch;

use crate::error::{Result, TransferError};
use crate::memory::{MemoryRegion, SHM_STATE_REGISTERED, SHM_STATE_RETIRED, ShmLocation};
use crate::segment::{CudaIpcRegion, RdmaKey, RegionDescriptor, ShmRegion};
use crate::wire::Status;

/// One registered region.
pub(crate) struct LocalEntry {
    pub(crate) id: u64,
    pub(crate) token: u64,
    /// The memory (possibly shared with in-flight transfers); outlives `rdma_mrs` (see Drop).
    pub(crate) region: Arc<MemoryRegion>,
    /// Remote keys published for RDMA (empty without RDMA).
    pub(crate) rdma_keys: Vec<RdmaKey>,
    /// Memory-region registrations with each RDMA device (deregistered on drop).
    pub(crate) rdma_mrs: Vec<NicRegistration>,
}

/// The registration of a region's memory with one RDMA device (made by `rdma`): the
/// device's index in the engine's list, the local key work requests name the memory with,
/// and the driver's registration, released when this is dropped.
pub(crate) struct NicRegistration {
    /// Index of the device in the engine's RDMA device list.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) device: usize,
    /// Local key of the registration.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) lkey: u32,
    /// Deregisters the memory when dropped (a driver call).
    _mr: Box<dyn std::any::Any + Send + Sync>,
}

impl NicRegistration {
    /// The registration `mr` (deregistered when dropped) of device `device`, key `lkey`.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn new(device: usize, lkey: u32, mr: impl std::any::Any + Send + Sync) -> Self {
        Self {
            device,
            lkey,
            _mr: Box::new(mr),
        }
    }
}

impl Drop for LocalEntry {
    fn drop(&mut self) {
        // The NICs' registrations of the memory end before the memory can be unmapped (the
        // fields would drop `region` first, and it may be the last reference). Deregistering
        // is a driver call: off the async threads.
        let mrs = std::mem::take(&mut self.rdma_mrs);
        if mrs.is_empty() {
            return;
        }
        crate::home::run_blocking(move || drop(mrs));
    }
}

/// The registration table of one engine.
pub(crate) struct LocalRegions {
    pub(crate) engine_id: u64,
    table: RwLock<BTreeMap<u64, Arc<LocalEntry>>>,
    next_id: AtomicU64,
    generation: watch::Sender<u64>,
}

impl LocalRegions {
    pub(crate) fn new(engine_id: u64) -> Arc<Self> {
        Arc::new(Self {
            engine_id,
            table: RwLock::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            generation: watch::Sender::new(1),
        })
    }

    /// Current registration generation (bumped on every change).
    pub(crate) fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Watches generation changes (used by the metadata publisher).
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Inserts a prepared entry; refuses overlap with an existing registration.
    pub(crate) fn insert(self: &Arc<Self>, entry: LocalEntry) -> Result<RegisteredBuffer> {
        let entry = Arc::new(entry);
        let (addr, len) = (entry.region.addr(), entry.region.len() as u64);
        {
            let mut table = self.table.write();
            let below = table.range(..addr.saturating_add(len)).next_back();
            if let Some((_, e)) = below
                && e.region.addr() + e.region.len() as u64 > addr
            {
                return Err(TransferError::invalid(format!(
                    "region [{addr:#x}, +{len}) overlaps registered region {} at {:#x}",
                    e.id,
                    e.region.addr()
                )));
            }
            if let Some(ctl) = entry.region.shm_control() {
                ctl.region_id.store(entry.id, Ordering::Release);
                ctl.token.store(entry.token, Ordering::Release);
                ctl.state.store(SHM_STATE_REGISTERED, Ordering::Release);
            }
            table.insert(addr, entry.clone());
        }
        self.generation.send_modify(|g| *g += 1);
        Ok(RegisteredBuffer {
            inner: Arc::new(Registration {
                entry,
                table: Arc::downgrade(self),
            }),
        })
    }

    fn remove(&self, entry: &LocalEntry) {
        let removed = {
            let mut table = self.table.write();
            match table.get(&entry.region.addr()) {
                Some(e) if e.id == entry.id => table.remove(&entry.region.addr()).is_some(),
                _ => false,
            }
        };
        if let Some(ctl) = entry.region.shm_control() {
            ctl.state.store(SHM_STATE_RETIRED, Ordering::Release);
        }
        if removed {
            self.generation.send_modify(|g| *g += 1);
        }
    }

    /// Target-side check of an incoming request: the region containing
    /// `[addr, addr + len)` if the token matches.
    pub(crate) fn lookup(
        &self,
        addr: u64,
        len: u64,
        token: u64,
    ) -> std::result::Result<Arc<MemoryRegion>, Status> {
        let table = self.table.read();
        let Some((_, e)) = table.range(..=addr).next_back() else {
            return Err(Status::UnknownRegion);
        };
        let start = e.region.addr();
        let end = start + e.region.len() as u64;
        if addr >= end {
            return Err(Status::UnknownRegion);
        }
        if addr.checked_add(len).is_none_or(|req_end| req_end > end) {
            return Err(Status::OutOfBounds);
        }
        if e.token != token {
            return Err(Status::BadToken);
        }
        Ok(e.region.clone())
    }

    /// Like [`LocalRegions::lookup`] but returns the entry (for local copies and RDMA keys).
    pub(crate) fn entry_for(&self, addr: u64, len: u64) -> Option<Arc<LocalEntry>> {
        let table = self.table.read();
        let (_, e) = table.range(..=addr).next_back()?;
        let end = e.region.addr() + e.region.len() as u64;
        (addr.checked_add(len).is_some_and(|req_end| req_end <= end)).then(|| e.clone())
    }

    /// Descriptor entries for every registered region, sorted by address.
    pub(crate) fn describe(&self) -> Vec<RegionDescriptor> {
        self.table
            .read()
            .values()
            .map(|e| RegionDescriptor {
                id: e.id,
                addr: e.region.addr(),
                len: e.region.len() as u64,
                token: e.token,
                shm: e.region.shm_location().map(shm_region),
                rdma: e.rdma_keys.clone(),
                location: e.region.location(),
                cuda_ipc: e.region.export().and_then(|x| {
                    Some(CudaIpcRegion {
                        control: shm_region(x.control_location()?),
                        handle: CudaIpcRegion::encode_handle(x.handle()),
                        offset: x.offset(),
                        device_uuid: x.device_uuid().to_owned(),
                    })
                }),
            })
            .collect()
    }

    /// Number of registered regions.
    pub(crate) fn count(&self) -> usize {
        self.table.read().len()
    }
}

/// The descriptor entry of a shared-memory location.
fn shm_region(l: ShmLocation) -> ShmRegion {
    ShmRegion {
        pid: l.pid,
        fd: l.fd,
        name: l.name,
        data_offset: l.data_offset,
        dev: l.dev,
        ino: l.ino,
    }
}

struct Registration {
    entry: Arc<LocalEntry>,
    table: Weak<LocalRegions>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(t) = self.table.upgrade() {
            t.remove(&self.entry);
        } else if let Some(ctl) = self.entry.region.shm_control() {
            ctl.state.store(SHM_STATE_RETIRED, Ordering::Release);
        }
    }
}

/// A region registered with a `TransferEngine`: what requests use as their local side, and
/// what peers address as the remote side (by [`RegisteredBuffer::addr`]).
///
/// Cheap to clone; the registration ends when the last clone (including those held by
/// in-flight requests) is dropped.
#[derive(Clone)]
pub struct RegisteredBuffer {
    inner: Arc<Registration>,
}

impl std::fmt::Debug for RegisteredBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredBuffer")
            .field("id", &self.id())
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

impl RegisteredBuffer {
    /// The memory.
    pub fn region(&self) -> &MemoryRegion {
        &self.inner.entry.region
    }

    /// Address of the first byte (what a peer puts in `remote_addr`).
    pub fn addr(&self) -> u64 {
        self.inner.entry.region.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.entry.region.len()
    }

    /// Always false (regions are never empty).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The access token peers must present (published in the descriptor).
    pub fn token(&self) -> u64 {
        self.inner.entry.token
    }

    /// Region id within the engine.
    pub fn id(&self) -> u64 {
        self.inner.entry.id
    }

    /// Copies `src` into the buffer at `offset` (bounds-checked).
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.region().write_at(offset, src)
    }

    /// Copies bytes at `offset` into `dst` (bounds-checked).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.region().read_at(offset, dst)
    }

    /// Reads `len` bytes of `file` at `file_offset` straight into the buffer at `offset`
    /// (see [`MemoryRegion::read_file_at`]). The outer error: the range; the inner: the I/O.
    pub fn read_file_at(
        &self,
        offset: usize,
        len: usize,
        file: &std::fs::File,
        file_offset: u64,
    ) -> Result<std::io::Result<()>> {
        self.region().read_file_at(offset, len, file, file_offset)
    }

    /// Writes `len` bytes of the buffer at `offset` straight to `file` at `file_offset`
    /// (see [`MemoryRegion::write_file_at`]).
    pub fn write_file_at(
        &self,
        offset: usize,
        len: usize,
        file: &std::fs::File,
        file_offset: u64,
    ) -> Result<std::io::Result<()>> {
        self.region().write_file_at(offset, len, file, file_offset)
    }

    /// Runs `f` on the buffer's bytes at `offset` (see [`MemoryRegion::with_bytes`]).
    pub fn with_bytes<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        self.region().with_bytes(offset, len, f)
    }

    /// Copies `len` bytes at `offset` into a new `Vec`.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        self.region().to_vec(offset, len)
    }

    /// Appends `len` bytes at `offset` to `out` (bounds-checked).
    pub fn append_to(&self, offset: usize, len: usize, out: &mut Vec<u8>) -> Result<()> {
        self.region().append_to(offset, len, out)
    }

    /// Faults `buffers` in, one after the other, on one background thread,
    /// `PREFAULT_CHUNK` bytes at a time, so that the first transfers into them do not pay the
    /// kernel's first touch (zeroing and mapping every page) on their path. Nothing is
    /// written: transfers may run meanwhile. The thread runs at idle priority
    /// (`SCHED_IDLE`), so it takes no CPU the data path wants. It holds the memory only weakly and
    /// skips a buffer once it is dropped. Costs the buffers' size in resident memory, at a
    /// few GB/s. The thread answers the bytes faulted in (0 where the kernel cannot do it
    /// without writing: before Linux 5.14, or memory the caller lent).
    pub fn prefault_in_background(
        buffers: &[&RegisteredBuffer],
    ) -> std::io::Result<std::thread::JoinHandle<u64>> {
        Self::warm_in_background(buffers.iter().map(|b| Warm::Buffer(b)).collect())
    }

    /// [`RegisteredBuffer::prefault_in_background`] for registered buffers and new vectors
    /// alike, one after the other in the order given (the one the data path needs first,
    /// first: two such threads at once would share the same idle CPU). A vector is made
    /// resident by writing a byte of each page ([`resident_bulk_vec`](crate::memory::resident_bulk_vec)).
    /// The thread answers the bytes faulted in.
    pub fn warm_in_background(
        warm: Vec<Warm<'_>>,
    ) -> std::io::Result<std::thread::JoinHandle<u64>> {
        enum Job {
            Region(std::sync::Weak<MemoryRegion>, usize),
            Vec(usize, Box<dyn FnOnce(Vec<u8>) + Send>),
        }
        let jobs: Vec<Job> = warm
            .into_iter()
            .map(|w| match w {
                Warm::Buffer(b) => Job::Region(Arc::downgrade(&b.inner.entry.region), b.len()),
                Warm::Vec(len, ready) => Job::Vec(len, ready),
            })
            .collect();
        crate::memory::spawn_idle(
            "moongate-prefault",
            crate::memory::Upkeep::Prefault,
            move || {
                jobs.into_iter()
                    .map(|job| match job {
                        Job::Region(r, len) => prefault_weak(&r, len),
                        Job::Vec(len, ready) => {
                            let v = crate::memory::resident_bulk_vec(len);
                            let bytes = v.capacity() as u64;
                            ready(v);
                            bytes
                        }
                    })
                    .sum()
            },
        )
    }

    pub(crate) fn engine_id(&self) -> Option<u64> {
        self.inner.table.upgrade().map(|t| t.engine_id)
    }

    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn entry(&self) -> &Arc<LocalEntry> {
        &self.inner.entry
    }
}

/// Memory for [`RegisteredBuffer::warm_in_background`] to fault in.
pub enum Warm<'a> {
    /// A registered buffer, held weakly (skipped once dropped).
    Buffer(&'a RegisteredBuffer),
    /// A new empty vector with room for this many bytes, all of them resident, handed to the
    /// function on the background thread.
    Vec(usize, Box<dyn FnOnce(Vec<u8>) + Send>),
}

impl std::fmt::Debug for Warm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Buffer(b) => f.debug_tuple("Buffer").field(&b.len()).finish(),
            Self::Vec(len, _) => f.debug_tuple("Vec").field(len).finish(),
        }
    }
}

/// Bytes faulted in per step of [`RegisteredBuffer::prefault_in_background`]: large enough
/// that the system calls cost nothing (512 a GiB), small enough that a dropped buffer is let
/// go quickly, and that the idle-priority thread holds the process's memory-map lock only
/// briefly. `MADV_POPULATE_WRITE` holds it (shared) for a whole step, and a thread at idle
/// priority can be preempted inside one; the runtime's own `mmap` and `madvise` calls then wait.
/// With 64 MiB steps, store-bench's client (heartbeat and bench on one thread) missed its
/// heartbeats for the master's 10 s TTL in every round of a `py_bench.sh` run and lost its
/// segment; with 4 MiB steps, in none.
const PREFAULT_CHUNK: usize = 4 << 20;

fn prefault_weak(region: &std::sync::Weak<MemoryRegion>, len: usize) -> u64 {
    let started = std::time::Instant::now();
    let mut done = 0;
    while done < len {
        let Some(r) = region.upgrade() else { break };
        let n = PREFAULT_CHUNK.min(len - done);
        match r.populate_range(done, n) {
            Ok(true) => done += n,
            Ok(false) => {
                tracing::debug!(
                    "this memory cannot be faulted in ahead (kernel before 5.14, or lent memory)"
                );
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "faulting memory in ahead failed; first transfers pay the page faults");
                break;
            }
        }
    }
    tracing::debug!(
        bytes = done,
        ms = started.elapsed().as_millis() as u64,
        "memory faulted in"
    );
    done as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(regions: &LocalRegions, region: MemoryRegion, token: u64) -> LocalEntry {
        LocalEntry {
            id: regions.next_id(),
            token,
            region: Arc::new(region),
            rdma_keys: vec![],
            rdma_mrs: vec![],
        }
    }

    #[test]
    fn lookup_checks_region_bounds_and_token_and_drop_unregisters() {
        let regions = LocalRegions::new(1);
        let g0 = regions.generation();
        let buf = regions
            .insert(entry(&regions, MemoryRegion::alloc(8192).unwrap(), 77))
            .unwrap();
        assert!(regions.generation() > g0);
        let a = buf.addr();
        assert!(regions.lookup(a, 8192, 77).is_ok());
        assert!(regions.lookup(a + 8191, 1, 77).is_ok());
        assert_eq!(
            regions.lookup(a + 8191, 2, 77).unwrap_err(),
            Status::OutOfBounds
        );
        assert_eq!(
            regions.lookup(a + 8192, 1, 77).unwrap_err(),
            Status::UnknownRegion
        );
        assert_eq!(
            regions.lookup(a - 1, 1, 77).unwrap_err(),
            Status::UnknownRegion
        );
        assert_eq!(regions.lookup(a, 1, 78).unwrap_err(), Status::BadToken);
        assert_eq!(
            regions.lookup(a, u64::MAX, 77).unwrap_err(),
            Status::OutOfBounds
        );
        assert_eq!(regions.describe().len(), 1);
        let clone = buf.clone();
        drop(buf);
        assert!(
            regions.lookup(a, 1, 77).is_ok(),
            "a clone keeps the registration"
        );
        let g1 = regions.generation();
        drop(clone);
        assert_eq!(regions.lookup(a, 1, 77).unwrap_err(), Status::UnknownRegion);
        assert!(regions.generation() > g1);
        assert_eq!(regions.count(), 0);
    }

    #[test]
    fn overlapping_registration_is_refused() {
        let regions = LocalRegions::new(1);
        let mut backing = vec![0u8; 4096];
        let p = backing.as_mut_ptr();
        // SAFETY: `backing` outlives both regions (dropped at the end of the test).
        let r1 = unsafe { MemoryRegion::from_raw_parts(p, 2048, ()) }.unwrap();
        // SAFETY: as above; the overlap is the point of the test.
        let r2 = unsafe { MemoryRegion::from_raw_parts(p.wrapping_add(1024), 2048, ()) }.unwrap();
        let _b1 = regions.insert(entry(&regions, r1, 1)).unwrap();
        assert!(matches!(
            regions.insert(entry(&regions, r2, 2)),
            Err(TransferError::InvalidRequest { .. })
        ));
        drop(_b1);
        drop(backing);
    }

    #[test]
    fn shared_region_control_page_follows_registration() {
        let regions = LocalRegions::new(1);
        let buf = regions
            .insert(entry(
                &regions,
                MemoryRegion::alloc_shared(4096).unwrap(),
                5,
            ))
            .unwrap();
        let region = buf.entry().region.clone();
        let ctl = region.shm_control().unwrap();
        assert_eq!(ctl.state.load(Ordering::Acquire), SHM_STATE_REGISTERED);
        assert_eq!(ctl.token.load(Ordering::Acquire), 5);
        assert!(regions.describe()[0].shm.is_some());
        drop(buf);
        assert_eq!(ctl.state.load(Ordering::Acquire), SHM_STATE_RETIRED);
    }

    /// Pages of `r` resident in memory.
    fn resident_pages(r: &MemoryRegion) -> usize {
        crate::memory::resident_pages(r.as_ptr(), r.len())
    }

    #[test]
    fn a_vector_warmed_in_the_background_arrives_empty_and_resident_after_the_buffer_before_it() {
        const LEN: usize = 4 << 20;
        let regions = LocalRegions::new(1);
        let region = MemoryRegion::alloc(LEN).unwrap();
        let buf = regions.insert(entry(&regions, region, 1)).unwrap();
        let len = 3 * crate::memory::BULK_VEC_MIN + 123;
        let (tx, rx) = std::sync::mpsc::channel();
        let (at, in_buf) = (buf.addr() as usize, buf.len());
        let ready = move |v: Vec<u8>| {
            // The buffer ahead of it in the list is resident already.
            tx.send((v, crate::memory::resident_pages(at as *const u8, in_buf)))
                .unwrap();
        };
        let jobs = vec![Warm::Buffer(&buf), Warm::Vec(len, Box::new(ready))];
        let t = RegisteredBuffer::warm_in_background(jobs).unwrap();
        let (v, before) = rx.recv().unwrap();
        assert_eq!(before, LEN / crate::memory::page_size());
        assert!(v.is_empty() && v.capacity() >= len);
        // The vector's pages, and those its ends share with neighbours: all resident.
        let page = crate::memory::page_size();
        let pages =
            (v.as_ptr() as usize + v.capacity()).div_ceil(page) - v.as_ptr() as usize / page;
        assert_eq!(
            crate::memory::resident_pages(v.as_ptr(), v.capacity()),
            pages
        );
        assert_eq!(t.join().unwrap(), (LEN + v.capacity()) as u64);
    }

    #[test]
    fn background_prefault_faults_everything_in_and_changes_no_byte() {
        const LEN: usize = 8 << 20;
        for shared in [false, true] {
            let regions = LocalRegions::new(1);
            let region = MemoryRegion::alloc_with(
                LEN,
                crate::AllocOptions {
                    shared,
                    ..Default::default()
                },
            )
            .unwrap();
            let buf = regions.insert(entry(&regions, region, 1)).unwrap();
            buf.write_at(12_345, b"before").unwrap();
            assert!(resident_pages(buf.region()) < LEN / crate::memory::page_size() / 2);
            let t = RegisteredBuffer::prefault_in_background(&[&buf]).unwrap();
            // Writes while the thread runs are kept.
            for i in 0..64 {
                buf.write_at(i * (LEN / 64) + 7, b"during").unwrap();
            }
            assert_eq!(t.join().unwrap(), LEN as u64, "shared={shared}");
            assert_eq!(
                resident_pages(buf.region()),
                LEN / crate::memory::page_size()
            );
            assert_eq!(buf.to_vec(12_345, 6).unwrap(), b"before");
            for i in 0..64 {
                assert_eq!(buf.to_vec(i * (LEN / 64) + 7, 6).unwrap(), b"during");
            }
        }
    }

    #[test]
    fn background_prefault_lets_a_dropped_buffer_go() {
        let regions = LocalRegions::new(1);
        let buf = regions
            .insert(entry(&regions, MemoryRegion::alloc(1 << 20).unwrap(), 1))
            .unwrap();
        let weak = Arc::downgrade(&buf.entry().region);
        let t = RegisteredBuffer::prefault_in_background(&[&buf]).unwrap();
        drop(buf);
        let done = t.join().unwrap();
        assert!(done == 0 || done == 1 << 20);
        assert!(weak.upgrade().is_none(), "the thread keeps nothing alive");
    }
}
