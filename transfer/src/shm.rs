//! Shared memory of peers on the same host: their regions mapped into this process, and the
//! checks that make copying through a mapping safe (the copies themselves are `copy`'s).
//!
//! A peer's shared region is a memfd; this side opens it as `/proc/<pid>/fd/<fd>` and maps
//! it only once it checked that it is exactly the file the descriptor names (the link names
//! the memfd, guarding against pid reuse; its device and inode match), that it is sealed
//! against shrinking and growing (`memory::SHM_SEALS`: nobody can truncate it under the
//! mapping, so a copy never faults past its end), that it is large enough, and that its
//! control page carries the magic and the region's length. Then copies `memcpy` through it.
//! Before each copy the copier checks that the owner process is alive (it still holds its
//! lock on the memfd) and, before and after, the region's control page (same registration
//! id and token, still registered): the same bounds and token rules as the TCP target
//! applies, and a dead or retired peer is an error, not silent success.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use crate::error::{RemoteRange, Result, TransferError};
use crate::memory::{
    CpuLock, Mapping, SHM_MAGIC, SHM_SEALS, SHM_STATE_REGISTERED, SendPtr, ShmControl,
    ofd_lock_held, shared_lock,
};
use crate::op::PeerCache;
use crate::segment::{RegionDescriptor, ShmRegion};

/// Copies at least this large prefault the peer's pages first.
const PREFAULT_MIN: usize = 1 << 20;
/// Prefaulting is remembered per this many bytes of a region.
const PREFAULT_UNIT: usize = 2 << 20;
/// A fresh mapping is populated in the background this many bytes at a time: a host copy's
/// piece (`copy::hostcopy::CHUNK`), so a copy waits at most one step for the populating thread.
const POPULATE_STEP: usize = 4 << 20;

/// A peer's shared region mapped into this process.
pub(crate) struct PeerMapping {
    map: Mapping,
    /// The owner's CPU lock when the owner is this very process (two engines of one
    /// process): copies through this mapping then hold it like any in-process copy.
    pub(crate) owner_lock: Option<Arc<CpuLock>>,
    file: File,
    data_offset: usize,
    pub(crate) region: RegionDescriptor,
    populated: Box<[std::sync::atomic::AtomicBool]>,
}

impl PeerMapping {
    fn open(segment: &str, region: &RegionDescriptor, shm: &ShmRegion) -> Result<Self> {
        Self::open_with(segment, region, shm, true)
    }

    /// Maps the control page of a region whose bytes are not in the memfd (a device
    /// region's control block): every check of [`PeerMapping::open`] but the data's size.
    pub(crate) fn open_control(
        segment: &str,
        region: &RegionDescriptor,
        shm: &ShmRegion,
    ) -> Result<Self> {
        Self::open_with(segment, region, shm, false)
    }

    fn open_with(
        segment: &str,
        region: &RegionDescriptor,
        shm: &ShmRegion,
        data: bool,
    ) -> Result<Self> {
        let fail = |reason: String| {
            TransferError::unreachable(segment, format!("shared memory: {reason}"))
        };
        if shm.ino == 0 {
            return Err(fail("the descriptor names no memfd inode".into()));
        }
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
        let meta = file
            .metadata()
            .map_err(|e| fail(format!("fstat {path}: {e}")))?;
        {
            use std::os::unix::fs::MetadataExt;
            if (meta.dev(), meta.ino()) != (shm.dev, shm.ino) {
                return Err(fail(format!(
                    "{path} is not the memfd the descriptor names (inode {} instead of {})",
                    meta.ino(),
                    shm.ino
                )));
            }
        }
        // SAFETY: fcntl on our own open descriptor with integer arguments.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & SHM_SEALS != SHM_SEALS {
            return Err(fail(format!(
                "memfd {} is not sealed against resizing (seals {seals:#x}); refusing to map it",
                shm.name
            )));
        }
        let size = meta.len();
        let need = shm
            .data_offset
            .checked_add(if data { region.len } else { 0 })
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
        let mut m = Self {
            map,
            owner_lock: None,
            file,
            data_offset: shm.data_offset as usize,
            region: region.clone(),
            populated: (0..(if data { region.len as usize } else { 0 }).div_ceil(PREFAULT_UNIT))
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
        };
        let c = m.control();
        if c.magic.load(Ordering::Acquire) != SHM_MAGIC
            || c.data_len.load(Ordering::Acquire) != region.len
        {
            return Err(fail(format!(
                "memfd {} is not a region of {} bytes (bad control page)",
                shm.name, region.len
            )));
        }
        m.check(segment, RemoteRange::new(region.addr, region.len))?;
        m.check_owner(segment)?;
        if shm.pid == std::process::id() {
            m.owner_lock = Some(
                shared_lock(shm.dev, shm.ino)
                    .ok_or_else(|| fail("the region's owner in this process is gone".into()))?,
            );
        }
        Ok(m)
    }

    fn control(&self) -> &ShmControl {
        // SAFETY: the mapping is at least data_offset >= SHM_CONTROL_LEN bytes (checked at
        // open), page aligned, and lives as long as self.
        unsafe { ShmControl::at(self.map.ptr()) }
    }

    /// The registration is the one the descriptor names and is still registered.
    pub(crate) fn check(&self, segment: &str, range: RemoteRange) -> Result<()> {
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
    pub(crate) fn check_owner(&self, segment: &str) -> Result<()> {
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
    pub(crate) fn prefault(&self, addr: u64, len: usize, write: bool) {
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

    pub(crate) fn ptr_of(&self, addr: u64) -> SendPtr {
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
        populate_in_background(&m);
        Ok(m)
    }
}

/// What the shared-memory transport keeps for a peer segment.
impl PeerCache for ShmMaps {
    /// Unmaps everything (the peer re-registered or restarted).
    fn clear(&self) {
        self.maps.lock().clear();
    }

    /// Unmaps the regions whose id is not in `live` (the peer retired them).
    fn retain(&self, live: &std::collections::HashSet<u64>) {
        self.maps.lock().retain(|id, _| live.contains(id));
    }
}

/// Maps the page tables of a fresh peer mapping in on a background thread, a copy chunk at
/// a time, so that copies into a region the owner has already faulted in do not take a
/// minor fault per page on their path (this process maps the peer's pages lazily). Costs
/// page tables only (about 2 MiB per GiB mapped): the pages are the owner's. The thread
/// runs at idle priority, holds the mapping weakly and stops once it is unmapped.
fn populate_in_background(m: &Arc<PeerMapping>) {
    let weak = Arc::downgrade(m);
    let (base, len) = (m.region.addr, m.region.len as usize);
    let spawned = crate::memory::spawn_idle(
        "moongate-shm-populate",
        crate::memory::Upkeep::PeerPageTables,
        move || {
            let mut off = 0;
            while off < len {
                let Some(m) = weak.upgrade() else { return };
                let n = POPULATE_STEP.min(len - off);
                m.prefault(base + off as u64, n, true);
                off += n;
            }
        },
    );
    if let Err(e) = spawned {
        tracing::debug!(error = %e, "cannot populate a peer mapping ahead; copies fault its pages in");
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::memory::MemoryRegion;
    use crate::registry::{LocalEntry, LocalRegions};

    fn registered(len: usize) -> (Arc<LocalRegions>, crate::RegisteredBuffer, RegionDescriptor) {
        let regions = LocalRegions::new(1);
        let buf = regions
            .insert(LocalEntry {
                id: regions.next_id(),
                token: 77,
                region: Arc::new(MemoryRegion::alloc_shared(len).unwrap()),
                rdma_keys: vec![],
                rdma_mrs: vec![],
            })
            .unwrap();
        let desc = regions.describe().remove(0);
        (regions, buf, desc)
    }

    /// A memfd made by hand (as a hostile same-user process would), sealed or not.
    fn raw_memfd(len: u64, seal: bool) -> (File, ShmRegion) {
        let name = format!("moongate-test-{:08x}", rand::random::<u32>());
        let cname = std::ffi::CString::new(name.clone()).unwrap();
        // SAFETY: a valid C string; the result is checked.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor nobody else owns.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        file.set_len(len).unwrap();
        if seal {
            // SAFETY: fcntl on our own descriptor.
            let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, SHM_SEALS) };
            assert_eq!(rc, 0);
        }
        let meta = file.metadata().unwrap();
        let shm = ShmRegion {
            pid: std::process::id(),
            fd: file.as_raw_fd(),
            name,
            data_offset: 4096,
            dev: meta.dev(),
            ino: meta.ino(),
        };
        (file, shm)
    }

    #[test]
    fn a_fresh_peer_mapping_is_populated_in_the_background_and_keeps_the_bytes() {
        const LEN: usize = 16 << 20;
        let (_regions, buf, desc) = registered(LEN);
        buf.write_at(LEN - 10, b"owner").unwrap();
        let maps = ShmMaps::default();
        let m = maps.get("self", &desc, desc.shm.as_ref().unwrap()).unwrap();
        // Bounded wait on the condition: every 2 MiB unit marked populated.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !m.populated.iter().all(|f| f.load(Ordering::Relaxed)) {
            assert!(std::time::Instant::now() < deadline, "never populated");
            std::thread::yield_now();
        }
        let p = m.ptr_of(desc.addr + (LEN as u64) - 10);
        let mut got = [0u8; 5];
        // SAFETY: inside the mapped region (the descriptor's range).
        unsafe { std::ptr::copy_nonoverlapping(p.0, got.as_mut_ptr(), 5) };
        assert_eq!(&got, b"owner");
    }

    #[test]
    fn a_sealed_region_cannot_be_resized_and_its_mapper_lives_on() {
        let (_regions, buf, desc) = registered(8192);
        let shm = desc.shm.clone().unwrap();
        let m = PeerMapping::open("self", &desc, &shm).unwrap();
        // Another process of the same user opens the memfd and tries to truncate it.
        let peer = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", shm.fd))
            .unwrap();
        for len in [0, 4096, 1 << 30] {
            let e = peer.set_len(len).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "ftruncate({len})");
        }
        // SAFETY: fcntl on our own descriptor.
        let unseal =
            unsafe { libc::fcntl(peer.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) };
        assert_eq!(unseal, -1, "no more seals can be added or removed");
        // The mapping still works, both ways.
        let p = m.ptr_of(desc.addr + 100);
        // SAFETY: inside the mapped region (checked against the descriptor above).
        unsafe { std::ptr::copy_nonoverlapping(b"sealed".as_ptr(), p.0, 6) };
        assert_eq!(buf.to_vec(100, 6).unwrap(), b"sealed");
        m.check("self", RemoteRange::new(desc.addr, 1)).unwrap();
    }

    #[test]
    fn the_mapper_refuses_anything_but_the_exact_sealed_region() {
        let (_regions, _buf, desc) = registered(8192);
        let shm = desc.shm.clone().unwrap();
        let err = |shm: &ShmRegion, region: &RegionDescriptor| match PeerMapping::open(
            "self", region, shm,
        ) {
            Ok(_) => panic!("mapped {shm:?}"),
            Err(e) => e.to_string(),
        };
        // Another inode under the same name and fd.
        let e = err(
            &ShmRegion {
                ino: shm.ino + 1,
                ..shm.clone()
            },
            &desc,
        );
        assert!(e.contains("not the memfd"), "{e}");
        let e = err(
            &ShmRegion {
                ino: 0,
                ..shm.clone()
            },
            &desc,
        );
        assert!(e.contains("no memfd inode"), "{e}");
        // An unsealed memfd (a peer could shrink it under the mapping: SIGBUS).
        let (_f, raw) = raw_memfd(8192 + 4096, false);
        let doctored = RegionDescriptor {
            shm: Some(raw.clone()),
            ..desc.clone()
        };
        let e = err(&raw, &doctored);
        assert!(e.contains("not sealed"), "{e}");
        // Sealed, but not a Moongate region (no magic in its control page).
        let (_f, raw) = raw_memfd(8192 + 4096, true);
        let doctored = RegionDescriptor {
            shm: Some(raw.clone()),
            ..desc.clone()
        };
        let e = err(&raw, &doctored);
        assert!(e.contains("bad control page"), "{e}");
        // Sealed and too small for the region the descriptor claims.
        let (_f, raw) = raw_memfd(4096 + 4096, true);
        let doctored = RegionDescriptor {
            shm: Some(raw.clone()),
            ..desc.clone()
        };
        let e = err(&raw, &doctored);
        assert!(e.contains("needs"), "{e}");
        // The real one maps.
        PeerMapping::open("self", &desc, &shm).unwrap();
    }
}
