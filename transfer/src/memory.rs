//! Memory the engine can move bytes from and into: page-aligned anonymous buffers,
//! shared-memory buffers (a `memfd` a same-host peer can map), hugepage buffers, memory the
//! caller owns (moved in, or lent through an `unsafe` contract).
//!
//! A [`MemoryRegion`] is only ever touched through raw pointers by the engine (the kernel
//! copies into it with `recv`, out of it with `writev`; a peer maps it), never through Rust
//! references, so concurrent transfers into one region are byte-level races at worst, as
//! with DMA, never undefined behaviour in this crate. Callers read and write it with the
//! bounds-checked copies [`MemoryRegion::write_at`] / [`MemoryRegion::read_at`], or borrow it
//! as a slice under the documented `unsafe` contract.
//!
//! Lifetime: regions are held in `Arc`s. The engine's registration table, every in-flight
//! request using the region (as its local side) and every request being served into it (as
//! its remote side) hold a clone, so memory is released only when the last one finishes.

use std::any::Any;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, TransferError};

/// Size of the control page in front of every shared-memory region.
pub(crate) const SHM_CONTROL_LEN: usize = 4096;
const SHM_MAGIC: u64 = 0x4d47_5348_4d31_0001; // "MGSHM1" + layout version
/// Control-page state: the region is registered and may be written by peers.
pub(crate) const SHM_STATE_REGISTERED: u64 = 1;
/// Control-page state: the region was unregistered; peers must not use it.
pub(crate) const SHM_STATE_RETIRED: u64 = 2;

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

/// Default huge page size from `/proc/meminfo` (2 MiB when it cannot be read).
pub fn huge_page_size() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Hugepagesize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(2 << 20)
}

fn round_up(len: usize, to: usize) -> Result<usize> {
    len.checked_next_multiple_of(to)
        .ok_or_else(|| TransferError::invalid(format!("allocation of {len} bytes overflows")))
}

/// How [`MemoryRegion::alloc_with`] gets its memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocOptions {
    /// Back the memory with a `memfd` so a peer process on the same host can map it (the
    /// shared-memory transport). Costs nothing on the TCP/RDMA paths.
    pub shared: bool,
    /// Use huge pages (`MAP_HUGETLB` / `MFD_HUGETLB`). Fails with [`TransferError::Memory`]
    /// when the system has none reserved (`/proc/sys/vm/nr_hugepages`); never falls back.
    pub huge_pages: bool,
    /// Fault every page in now (`MAP_POPULATE`) instead of on first touch.
    pub populate: bool,
}

/// An owned `mmap` (unmapped on drop).
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is an address range plus its length; it is unmapped exactly once, in
// Drop, and all access to the bytes goes through raw pointers (see the module doc).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the address and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `mmap(NULL, len, RW, flags, fd, 0)`.
    pub(crate) fn map(len: usize, flags: libc::c_int, fd: libc::c_int, what: &str) -> Result<Self> {
        // SAFETY: a fresh mapping at a kernel-chosen address aliases no Rust object; the
        // arguments are plain integers and the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(TransferError::memory(
                what,
                &std::io::Error::last_os_error(),
            ));
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| TransferError::Memory {
            reason: format!("{what}: mmap returned null"),
        })?;
        Ok(Self { base, len })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len came from a successful mmap and are unmapped only here; every user
        // of the bytes holds (through an Arc) the owner of this Mapping.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The control page at the start of a shared-memory region: lets a peer that mapped the
/// region check it is the registration it expects and that it is still registered.
#[repr(C)]
pub(crate) struct ShmControl {
    pub(crate) magic: AtomicU64,
    pub(crate) region_id: AtomicU64,
    pub(crate) token: AtomicU64,
    pub(crate) state: AtomicU64,
    pub(crate) data_len: AtomicU64,
}

impl ShmControl {
    /// # Safety
    /// `base` must point at a live, page-aligned mapping of at least [`SHM_CONTROL_LEN`]
    /// bytes that outlives the returned reference.
    pub(crate) unsafe fn at<'a>(base: *mut u8) -> &'a ShmControl {
        // SAFETY: the caller guarantees a live, aligned mapping of >= 4096 bytes; the struct
        // is atomics only, so shared access from several processes is well defined.
        unsafe { &*base.cast::<ShmControl>() }
    }
}

/// Where a shared-memory region can be opened by a peer on the same host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmLocation {
    /// Process holding the memfd.
    pub pid: u32,
    /// Its file descriptor number (opened by the peer as `/proc/<pid>/fd/<fd>`).
    pub fd: i32,
    /// The memfd name, checked by the peer against the link target (guards pid reuse).
    pub name: String,
    /// Bytes before the data (the control page).
    pub data_offset: u64,
}

enum Backing {
    /// Anonymous or memfd mapping owned by the region.
    Mapped {
        map: Mapping,
        shm: Option<(OwnedFd, String)>,
    },
    /// Memory owned by a caller-supplied container, dropped with the region.
    Owned(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
    /// Memory lent by the caller; the keep-alive value is dropped with the region.
    Lent(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
}

/// A contiguous range of memory the engine may register and move bytes from and into.
///
/// Create one with [`MemoryRegion::alloc`], [`MemoryRegion::alloc_shared`],
/// [`MemoryRegion::alloc_with`], [`MemoryRegion::from_owner`] or (unsafe)
/// [`MemoryRegion::from_raw_parts`], then hand it to `TransferEngine::register`. Most callers
/// use `TransferEngine::alloc`, which does both.
pub struct MemoryRegion {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("shared", &self.is_shared())
            .finish()
    }
}

// SAFETY: the region is an address range; its bytes are only accessed through raw pointers
// (kernel copies, bounds-checked ptr copies) and the backing owners are Send + Sync.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above: `&MemoryRegion` gives no safe aliasing reference into the bytes.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Page-aligned, zeroed, anonymous private memory of `len` bytes.
    pub fn alloc(len: usize) -> Result<Self> {
        Self::alloc_with(len, AllocOptions::default())
    }

    /// Page-aligned, zeroed memory backed by a `memfd`, mappable by peers on the same host.
    pub fn alloc_shared(len: usize) -> Result<Self> {
        Self::alloc_with(
            len,
            AllocOptions {
                shared: true,
                ..AllocOptions::default()
            },
        )
    }

    /// Allocates `len` bytes (rounded up to the page or huge page size) as `opts` says.
    pub fn alloc_with(len: usize, opts: AllocOptions) -> Result<Self> {
        if len == 0 {
            return Err(TransferError::invalid(
                "cannot allocate a zero-length region",
            ));
        }
        let unit = if opts.huge_pages {
            huge_page_size()
        } else {
            page_size()
        };
        let data_len = round_up(len, unit)?;
        if !opts.shared {
            let flags = libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | if opts.huge_pages {
                    libc::MAP_HUGETLB
                } else {
                    0
                }
                | if opts.populate && opts.huge_pages {
                    libc::MAP_POPULATE
                } else {
                    0
                };
            let what = if opts.huge_pages {
                "mmap(MAP_HUGETLB)"
            } else {
                "mmap"
            };
            let map = Mapping::map(data_len, flags, -1, what)?;
            if !opts.huge_pages && data_len >= 2 << 20 {
                // Transparent huge pages where the system offers them on request: fewer TLB
                // misses when the kernel copies into and out of large buffers. Advisory only,
                // and before the first touch (MAP_POPULATE would fault 4 KiB pages first).
                // SAFETY: advising on our own fresh mapping; no memory is accessed.
                unsafe { libc::madvise(map.ptr().cast(), data_len, libc::MADV_HUGEPAGE) };
            }
            if opts.populate && !opts.huge_pages {
                populate(&map, data_len);
            }
            let ptr = NonNull::new(map.ptr()).expect("mapping is non-null");
            return Ok(Self {
                ptr,
                len,
                backing: Backing::Mapped { map, shm: None },
            });
        }
        let flags = if opts.populate { libc::MAP_POPULATE } else { 0 };
        // The control page must stay a whole (huge) page so the data stays aligned.
        let control = if opts.huge_pages {
            unit
        } else {
            SHM_CONTROL_LEN.max(page_size())
        };
        let total = data_len.checked_add(control).ok_or_else(|| {
            TransferError::invalid(format!("allocation of {len} bytes overflows"))
        })?;
        let name = format!("moongate-{:016x}", rand::random::<u64>());
        let cname = std::ffi::CString::new(name.clone()).expect("no interior NUL");
        let mut mfd_flags = libc::MFD_CLOEXEC;
        if opts.huge_pages {
            mfd_flags |= libc::MFD_HUGETLB;
        }
        // SAFETY: cname is a valid NUL-terminated string for the duration of the call.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), mfd_flags) };
        if raw < 0 {
            return Err(TransferError::memory(
                "memfd_create",
                &std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: raw is a freshly created descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = File::from(fd);
        file.set_len(total as u64)
            .map_err(|e| TransferError::memory("ftruncate(memfd)", &e))?;
        let fd = OwnedFd::from(file);
        let map = Mapping::map(
            total,
            flags | libc::MAP_SHARED,
            fd.as_raw_fd(),
            "mmap(memfd)",
        )?;
        // Liveness for peers: hold an open-file-description write lock on byte 0 for the
        // life of this descriptor; it is released by the kernel when the process dies.
        lock_ofd(fd.as_raw_fd()).map_err(|e| TransferError::memory("fcntl(F_OFD_SETLK)", &e))?;
        // SAFETY: the mapping is at least `control` (>= 4096) bytes and page aligned.
        let ctl = unsafe { ShmControl::at(map.ptr()) };
        ctl.magic.store(SHM_MAGIC, Ordering::Release);
        ctl.data_len.store(len as u64, Ordering::Release);
        // SAFETY: control < total, so the data pointer stays inside the mapping.
        let data = unsafe { map.ptr().add(control) };
        Ok(Self {
            ptr: NonNull::new(data).expect("inside a non-null mapping"),
            len,
            backing: Backing::Mapped {
                map,
                shm: Some((fd, name)),
            },
        })
    }

    /// Takes ownership of a caller container (`Vec<u8>`, `Box<[u8]>`, a `memmap2::MmapMut`...)
    /// and exposes its bytes as a region; the container is dropped when the region is
    /// released (after the last transfer using it). The container must return the same
    /// memory from every `as_mut` call (all std containers do).
    pub fn from_owner<T>(owner: T) -> Result<Self>
    where
        T: AsMut<[u8]> + Send + Sync + 'static,
    {
        let mut boxed = Box::new(owner);
        let slice = (*boxed).as_mut();
        if slice.is_empty() {
            return Err(TransferError::invalid("cannot register an empty buffer"));
        }
        let (ptr, len) = (
            NonNull::new(slice.as_mut_ptr()).expect("slice pointer"),
            slice.len(),
        );
        Ok(Self {
            ptr,
            len,
            backing: Backing::Owned(boxed),
        })
    }

    /// Exposes memory the caller manages (a hugepage pool, a pinned arena...) as a region.
    ///
    /// `keep_alive` is dropped when the region is released, i.e. after the registration is
    /// dropped **and** the last transfer touching the region finished: put whatever frees
    /// the memory in it (or `()` if the memory lives for the whole process).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes, and stay so until `keep_alive` is
    /// dropped. While the region is registered, peers and the kernel write into it at any
    /// time: the caller must not hold Rust references into it across transfers (use raw
    /// pointers, or the copies on this type).
    pub unsafe fn from_raw_parts(
        ptr: *mut u8,
        len: usize,
        keep_alive: impl Any + Send + Sync,
    ) -> Result<Self> {
        let ptr = NonNull::new(ptr).ok_or_else(|| TransferError::invalid("null region pointer"))?;
        if len == 0 {
            return Err(TransferError::invalid("cannot register an empty buffer"));
        }
        Ok(Self {
            ptr,
            len,
            backing: Backing::Lent(Box::new(keep_alive)),
        })
    }

    /// Length in bytes (as requested, not rounded up).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty regions cannot be created.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte's address in this process (the address peers use in requests).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Raw pointer to the first byte. Reading or writing through it is the caller's
    /// responsibility; the region outlives it only while the region is alive.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether a peer on the same host can map this region (it is memfd-backed).
    pub fn is_shared(&self) -> bool {
        matches!(&self.backing, Backing::Mapped { shm: Some(_), .. })
    }

    /// Where a same-host peer finds this region, if it is shared.
    pub fn shm_location(&self) -> Option<ShmLocation> {
        match &self.backing {
            Backing::Mapped {
                map,
                shm: Some((fd, name)),
            } => Some(ShmLocation {
                pid: std::process::id(),
                fd: fd.as_raw_fd(),
                name: name.clone(),
                data_offset: self.addr() - map.ptr() as u64,
            }),
            _ => None,
        }
    }

    /// The control page of a shared region.
    pub(crate) fn shm_control(&self) -> Option<&ShmControl> {
        match &self.backing {
            // SAFETY: shared mappings always start with a control page and live as long as self.
            Backing::Mapped { map, shm: Some(_) } => Some(unsafe { ShmControl::at(map.ptr()) }),
            _ => None,
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(TransferError::invalid(format!(
                "range [{offset}, +{len}) is outside the {}-byte region",
                self.len
            ))),
        }
    }

    /// Copies `src` into the region at `offset`.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: bounds checked above; `src` is a distinct Rust allocation so the ranges
        // cannot overlap; the region's bytes are valid for writes while self lives.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.as_ptr().wrapping_add(offset),
                src.len(),
            )
        };
        Ok(())
    }

    /// Copies `dst.len()` bytes from the region at `offset` into `dst`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        // SAFETY: bounds checked above; `dst` is a distinct exclusive Rust borrow.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.as_ptr().wrapping_add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    /// Copies `len` bytes at `offset` into a new `Vec` (one pass: the vector is not zeroed
    /// first).
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        self.check(offset, len)?;
        let mut v = Vec::with_capacity(len);
        // SAFETY: bounds checked above, so the source holds `len` readable bytes; the vector
        // has capacity `len` and is a distinct allocation, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().wrapping_add(offset), v.as_mut_ptr(), len)
        };
        // SAFETY: the copy above initialised the first `len` bytes, within capacity.
        unsafe { v.set_len(len) };
        Ok(v)
    }

    /// Borrows the whole region as a slice (zero-copy reads).
    ///
    /// # Safety
    /// No transfer may write into the region (as the local side of a read, or as the remote
    /// side of a peer's write) while the borrow lives.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: valid for len bytes while self lives; the caller excludes writers.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    /// Borrows the whole region mutably (zero-copy fills).
    ///
    /// # Safety
    /// No other borrow of the region may exist, and no transfer may read or write it while
    /// this borrow lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: valid for len bytes while self lives; the caller guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }
}

/// Copies of at least this many bytes use non-temporal stores.
pub(crate) const STREAM_COPY_MIN: usize = 1 << 20;

/// Copies `len` bytes from `src` to `dst`, which must not overlap. Large copies on x86-64
/// write with non-temporal (streaming) stores: the destination is not read first and not
/// left in this core's cache (the bytes are for another process, or too many to stay
/// cached anyway), which is what makes a big copy into cold memory fast.
///
/// # Safety
/// `src` must be valid for `len` bytes of reads, `dst` for `len` bytes of writes, and the
/// ranges must not overlap.
pub(crate) unsafe fn copy_nonoverlapping_large(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= STREAM_COPY_MIN {
        // SAFETY: forwarded caller contract.
        unsafe { stream_copy(src, dst, len) };
        return;
    }
    // SAFETY: forwarded caller contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Head: bring dst to a 16-byte boundary with an ordinary copy.
    let head = dst.align_offset(16).min(len);
    // SAFETY: head <= len; caller contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut off = head;
    while off + 64 <= len {
        for k in 0..4 {
            let at = off + 16 * k;
            let s = src.wrapping_add(at) as *const __m128i;
            let d = dst.wrapping_add(at) as *mut __m128i;
            // SAFETY: at + 16 <= len, so the unaligned 16-byte load stays inside src.
            let v = unsafe { _mm_loadu_si128(s) };
            // SAFETY: d is 16-byte aligned (dst + head is, and `at - head` is a multiple of
            // 16) and its 16 bytes are inside dst; SSE2 is part of the x86-64 baseline.
            unsafe { _mm_stream_si128(d, v) };
        }
        off += 64;
    }
    // SAFETY: the tail lies inside both ranges.
    unsafe {
        std::ptr::copy_nonoverlapping(src.wrapping_add(off), dst.wrapping_add(off), len - off)
    };
    // Streaming stores are weakly ordered: fence so later stores (and the caller's release of
    // the completion) are ordered after them.
    // SAFETY: sfence has no preconditions.
    unsafe { _mm_sfence() };
}

/// Faults every page of a fresh private mapping in (`MADV_POPULATE_WRITE`, or by touching
/// one byte per page where the kernel lacks it).
fn populate(map: &Mapping, len: usize) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: advising on our own mapping of `len` bytes.
    if unsafe { libc::madvise(map.ptr().cast(), len, MADV_POPULATE_WRITE) } == 0 {
        return;
    }
    let page = page_size();
    for off in (0..len).step_by(page) {
        // SAFETY: off < len, inside our fresh private mapping that nothing else uses yet.
        unsafe { map.ptr().wrapping_add(off).write_volatile(0) };
    }
}

/// Takes an OFD write lock on byte 0 of `fd` (released when every descriptor of this open
/// file description is closed, including by process death).
fn lock_ofd(fd: libc::c_int) -> std::io::Result<()> {
    let mut fl = ofd_flock(libc::F_WRLCK as libc::c_short);
    // SAFETY: fl is a valid flock for the duration of the call.
    let rc = unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether some other open file description holds the write lock taken by [`lock_ofd`]:
/// the owner of a shared region is alive.
pub(crate) fn ofd_lock_held(fd: libc::c_int) -> std::io::Result<bool> {
    let mut fl = ofd_flock(libc::F_WRLCK as libc::c_short);
    // SAFETY: fl is a valid flock for the duration of the call.
    let rc = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn ofd_flock(kind: libc::c_short) -> libc::flock {
    // SAFETY: flock is plain old data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    fl.l_pid = 0;
    fl
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_region_is_page_aligned_zeroed_and_bounds_checked() {
        let r = MemoryRegion::alloc(10_000).unwrap();
        assert_eq!(r.len(), 10_000);
        assert_eq!(r.addr() % page_size() as u64, 0);
        assert!(!r.is_shared());
        assert_eq!(r.to_vec(0, 10_000).unwrap(), vec![0u8; 10_000]);
        r.write_at(9_990, b"0123456789").unwrap();
        assert_eq!(r.to_vec(9_995, 5).unwrap(), b"56789");
        assert!(r.write_at(9_991, b"0123456789").is_err());
        assert!(r.read_at(usize::MAX, &mut [0u8; 2]).is_err());
        assert!(MemoryRegion::alloc(0).is_err());
    }

    #[test]
    fn shared_region_has_control_page_lock_and_location() {
        let r = MemoryRegion::alloc_shared(5000).unwrap();
        assert!(r.is_shared());
        assert_eq!(r.addr() % page_size() as u64, 0);
        let loc = r.shm_location().unwrap();
        assert_eq!(loc.pid, std::process::id());
        assert_eq!(loc.data_offset, SHM_CONTROL_LEN.max(page_size()) as u64);
        let ctl = r.shm_control().unwrap();
        assert_eq!(ctl.magic.load(Ordering::Acquire), SHM_MAGIC);
        assert_eq!(ctl.data_len.load(Ordering::Acquire), 5000);
        // Another open file description of the same memfd sees the owner's lock.
        let other = std::fs::File::open(format!("/proc/self/fd/{}", loc.fd)).unwrap();
        assert!(ofd_lock_held(other.as_raw_fd()).unwrap());
        let link = std::fs::read_link(format!("/proc/self/fd/{}", loc.fd)).unwrap();
        assert!(link.to_string_lossy().contains(&loc.name));
        r.write_at(0, b"shared").unwrap();
        drop(other);
        drop(r);
    }

    #[test]
    fn owned_and_lent_memory() {
        use std::sync::atomic::AtomicBool;
        let r = MemoryRegion::from_owner(vec![7u8; 33]).unwrap();
        assert_eq!(r.to_vec(0, 33).unwrap(), vec![7u8; 33]);
        let arr = MemoryRegion::from_owner([1u8; 16]).unwrap();
        assert_eq!(arr.to_vec(15, 1).unwrap(), vec![1]);
        assert!(MemoryRegion::from_owner(Vec::<u8>::new()).is_err());

        let dropped = std::sync::Arc::new(AtomicBool::new(false));
        struct Flag(std::sync::Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let mut backing = vec![0u8; 64];
        // SAFETY: `backing` outlives the region (dropped at the end of the test, after it).
        let lent = unsafe {
            MemoryRegion::from_raw_parts(backing.as_mut_ptr(), 64, Flag(dropped.clone()))
        }
        .unwrap();
        lent.write_at(1, &[9]).unwrap();
        drop(lent);
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(backing[1], 9);
    }

    #[test]
    fn large_copies_are_exact_at_every_alignment() {
        let len = STREAM_COPY_MIN + 777;
        let src: Vec<u8> = (0..len + 64).map(|i| (i * 31 % 251) as u8).collect();
        for (so, dof) in [(0usize, 0usize), (1, 0), (0, 3), (5, 11), (15, 1)] {
            let mut dst = vec![0u8; len + 64];
            let (s, d) = (
                src.as_ptr().wrapping_add(so),
                dst.as_mut_ptr().wrapping_add(dof),
            );
            // SAFETY: both vectors have len + 64 bytes; offsets are below 16; distinct vectors.
            unsafe { copy_nonoverlapping_large(s, d, len) };
            assert_eq!(
                &dst[dof..dof + len],
                &src[so..so + len],
                "src+{so} dst+{dof}"
            );
            assert!(dst[..dof].iter().all(|&b| b == 0) && dst[dof + len..].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn huge_pages_work_or_fail_with_a_memory_error() {
        match MemoryRegion::alloc_with(
            1,
            AllocOptions {
                huge_pages: true,
                ..Default::default()
            },
        ) {
            Ok(r) => {
                assert_eq!(r.addr() % huge_page_size() as u64, 0);
                r.write_at(0, &[1]).unwrap();
            }
            Err(e) => assert!(matches!(e, TransferError::Memory { .. }), "{e}"),
        }
    }
}
