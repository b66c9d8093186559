//! Memory the engine can move bytes from and into: page-aligned anonymous buffers,
//! shared-memory buffers (a `memfd` a same-host peer can map), hugepage buffers, memory the
//! caller owns (moved in, or lent through an `unsafe` contract).
//!
//! A [`MemoryRegion`] is never touched through Rust references by the engine: the kernel
//! copies into it with `recv` and out of it with `sendmsg`, a NIC or a peer process writes it
//! directly (outside the Rust memory model, as DMA is: racing with them yields bytes of
//! unspecified value, never undefined behaviour), and every copy made by a thread of this
//! process, the callers' safe [`MemoryRegion::write_at`] / [`MemoryRegion::read_at`] /
//! [`MemoryRegion::to_vec`] included, holds the region's striped CPU access lock (`cpu`) over
//! the bytes it touches. So **the safe methods cannot cause a data race between Rust
//! threads**: this is the contract (it used to be only "byte-level races at worst", which
//! two threads copying at once did not meet). Borrowing the region as a slice stays
//! `unsafe`, under its documented contract. A same-host peer region that happens to live in
//! this process is copied under its owner's lock too (`shared_lock`).
//!
//! Lifetime: regions are held in `Arc`s. The engine's registration table, every in-flight
//! request using the region (as its local side) and every request being served into it (as
//! its remote side) hold a clone, so memory is released only when the last one finishes.

use std::any::Any;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;

use crate::device::{DeviceAccess, Location};
use crate::error::{Result, TransferError};

mod cpu;
mod export;
mod file;
mod idle;
pub mod offsets;
mod raw;

pub(crate) use cpu::{Access, CpuLock, lock_all, lock_every};
pub(crate) use export::IpcExport;
pub(crate) use idle::{Upkeep, spawn_idle};
pub use idle::{background_prefaults, wait_for_background_prefaults};
pub use offsets::{Allocation, OffsetAllocator};
use raw::populate_live;
#[cfg(test)]
pub(crate) use raw::resident_pages;
pub use raw::{BULK_VEC_MIN, bulk_vec, huge_page_size, page_size, resident_bulk_vec};
pub(crate) use raw::{
    Mapping, SendPtr, copy_nonoverlapping_part, lock_ofd, ofd_lock_held, populate,
};

/// Size of the control page in front of every shared-memory region.
pub(crate) const SHM_CONTROL_LEN: usize = 4096;
pub(crate) const SHM_MAGIC: u64 = 0x4d47_5348_4d31_0001; // "MGSHM1" + layout version
/// Control-page state: the region is registered and may be written by peers.
pub(crate) const SHM_STATE_REGISTERED: u64 = 1;
/// Control-page state: the region was unregistered; peers must not use it.
pub(crate) const SHM_STATE_RETIRED: u64 = 2;

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
    /// Device and inode of the memfd: the peer maps only this exact file.
    pub dev: u64,
    /// See `dev`.
    pub ino: u64,
}

/// The seals every published memfd carries, and every mapper requires: nobody can shrink
/// or grow it (so no mapper can be made to fault on a page past its end: no SIGBUS), and
/// the seals themselves cannot be changed.
pub(crate) const SHM_SEALS: libc::c_int =
    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// The memfd behind a shared region.
struct SharedFile {
    fd: OwnedFd,
    name: String,
    dev: u64,
    ino: u64,
}

enum Backing {
    /// Anonymous or memfd mapping owned by the region.
    Mapped {
        map: Mapping,
        shm: Option<SharedFile>,
    },
    /// Memory owned by a caller-supplied container, dropped with the region.
    Owned(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
    /// Memory lent by the caller; the keep-alive value is dropped with the region.
    Lent(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
    /// Device memory: only its backend's copies may touch it.
    Device {
        access: DeviceAccess,
        /// What same-host peers open it with (set at registration when IPC is on).
        export: Option<Box<IpcExport>>,
        _keep: Box<dyn Any + Send + Sync>,
    },
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
    cpu: Arc<CpuLock>,
    backing: Backing,
}

/// CPU locks of the shared regions alive in this process, by memfd (device, inode): a
/// mapping of a same-host peer that turns out to be in this process copies under them.
static SHARED_LOCKS: LazyLock<Mutex<SharedLocks>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// CPU locks by memfd (device, inode).
type SharedLocks = HashMap<(u64, u64), Weak<CpuLock>>;

/// The CPU lock of the shared region of this process backed by memfd `(dev, ino)`.
pub(crate) fn shared_lock(dev: u64, ino: u64) -> Option<Arc<CpuLock>> {
    SHARED_LOCKS.lock().get(&(dev, ino)).and_then(Weak::upgrade)
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if let Backing::Mapped { shm: Some(f), .. } = &self.backing {
            let mut locks = SHARED_LOCKS.lock();
            if locks
                .get(&(f.dev, f.ino))
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.cpu)))
            {
                locks.remove(&(f.dev, f.ino));
            }
        }
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("shared", &self.is_shared())
            .field("location", &self.location())
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
                cpu: Arc::new(CpuLock::new(len)),
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
        let mut mfd_flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
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
        // Sealed before anyone can learn of it: its size is fixed for good.
        // SAFETY: fcntl on our own open descriptor with integer arguments.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, SHM_SEALS) } < 0 {
            return Err(TransferError::memory(
                "fcntl(F_ADD_SEALS)",
                &std::io::Error::last_os_error(),
            ));
        }
        let meta = file
            .metadata()
            .map_err(|e| TransferError::memory("fstat(memfd)", &e))?;
        let (dev, ino) = (
            std::os::unix::fs::MetadataExt::dev(&meta),
            std::os::unix::fs::MetadataExt::ino(&meta),
        );
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
        let cpu = Arc::new(CpuLock::new(len));
        SHARED_LOCKS.lock().insert((dev, ino), Arc::downgrade(&cpu));
        Ok(Self {
            ptr: NonNull::new(data).expect("inside a non-null mapping"),
            len,
            cpu,
            backing: Backing::Mapped {
                map,
                shm: Some(SharedFile { fd, name, dev, ino }),
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
            cpu: Arc::new(CpuLock::new(len)),
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
            cpu: Arc::new(CpuLock::new(len)),
            backing: Backing::Lent(Box::new(keep_alive)),
        })
    }

    /// Device memory at `ptr` (inside the allocation `access.pointer` names), touched only
    /// through `access.backend`; `keep_alive` is dropped with the region.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be device memory of `access.pointer.device`, valid until
    /// `keep_alive` is dropped.
    pub(crate) unsafe fn from_device(
        ptr: *mut u8,
        len: usize,
        access: DeviceAccess,
        keep_alive: impl Any + Send + Sync,
    ) -> Result<Self> {
        let ptr = NonNull::new(ptr).ok_or_else(|| TransferError::invalid("null region pointer"))?;
        if len == 0 {
            return Err(TransferError::invalid("cannot register an empty buffer"));
        }
        if !access.pointer.contains(ptr.as_ptr() as u64, len as u64) {
            return Err(TransferError::invalid(format!(
                "[{:#x}, +{len}) is not inside one device allocation ({access:?})",
                ptr.as_ptr() as u64
            )));
        }
        Ok(Self {
            ptr,
            len,
            cpu: Arc::new(CpuLock::new(len)),
            backing: Backing::Device {
                access,
                export: None,
                _keep: Box::new(keep_alive),
            },
        })
    }

    /// Where the bytes live.
    pub fn location(&self) -> Location {
        match &self.backing {
            Backing::Device { access, .. } => Location::Cuda(access.pointer.device),
            _ => Location::Host,
        }
    }

    /// Whether this is device memory (the CPU must not touch it).
    pub fn is_device(&self) -> bool {
        matches!(self.backing, Backing::Device { .. })
    }

    /// The backend and device of device memory.
    pub(crate) fn device(&self) -> Option<&DeviceAccess> {
        match &self.backing {
            Backing::Device { access, .. } => Some(access),
            _ => None,
        }
    }

    /// Attaches what same-host peers open this device region with.
    pub(crate) fn set_export(&mut self, e: IpcExport) {
        if let Backing::Device { export, .. } = &mut self.backing {
            *export = Some(Box::new(e));
        }
    }

    /// What same-host peers open this device region with, if it was exported.
    pub(crate) fn export(&self) -> Option<&IpcExport> {
        match &self.backing {
            Backing::Device { export, .. } => export.as_deref(),
            _ => None,
        }
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
    /// responsibility; the region outlives it only while the region is alive. For device
    /// memory it is a device address, which the CPU must never dereference.
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
            Backing::Mapped { map, shm: Some(f) } => Some(ShmLocation {
                pid: std::process::id(),
                fd: f.fd.as_raw_fd(),
                name: f.name.clone(),
                data_offset: self.addr() - map.ptr() as u64,
                dev: f.dev,
                ino: f.ino,
            }),
            _ => None,
        }
    }

    /// Faults `len` bytes from `offset` in, as a first write would, without changing them
    /// (safe while the range is in use). Only memory this region mapped itself is touched:
    /// memory lent by the caller is the caller's to fault. `Ok(false)`: nothing was done (lent
    /// memory, or a kernel before 5.14 without `MADV_POPULATE_WRITE`).
    pub fn populate_range(&self, offset: usize, len: usize) -> Result<bool> {
        self.check(offset, len)?;
        if len == 0 || !matches!(self.backing, Backing::Mapped { .. }) {
            return Ok(false); // lent or device memory: not ours to fault
        }
        // SAFETY: the range was checked to lie inside this region, whose mapping lives as
        // long as `self` (borrowed for the call) and is read-write.
        unsafe { populate_live(self.as_ptr().wrapping_add(offset), len) }
            .map_err(|e| TransferError::memory("madvise(MADV_POPULATE_WRITE)", &e))
    }

    /// The CPU access lock every in-process copy into or out of the region holds.
    pub(crate) fn cpu(&self) -> &Arc<CpuLock> {
        &self.cpu
    }

    /// The control page of a shared region (of an exported device region: its control
    /// block's).
    pub(crate) fn shm_control(&self) -> Option<&ShmControl> {
        match &self.backing {
            // SAFETY: shared mappings always start with a control page and live as long as self.
            Backing::Mapped { map, shm: Some(_) } => Some(unsafe { ShmControl::at(map.ptr()) }),
            Backing::Device {
                export: Some(e), ..
            } => Some(e.control()),
            _ => None,
        }
    }

    /// Copies `len` bytes between this device region at `offset` and host memory, through the
    /// device's backend: into the region when `into`, else out of it.
    ///
    /// # Safety
    /// `host` must be valid for `len` bytes (writes when `!into`, reads when `into`) and
    /// not overlap the region; the range was bounds-checked.
    unsafe fn device_copy(
        &self,
        access: &DeviceAccess,
        offset: usize,
        host: *mut u8,
        len: usize,
        into: bool,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let dev = self.addr() + offset as u64;
        let (dst, src) = if into {
            (dev, host as u64)
        } else {
            (host as u64, dev)
        };
        // SAFETY: the device range is inside the registered region (checked by the caller);
        // the host range is the caller's; the copy returns once done.
        unsafe {
            access
                .backend
                .copy_blocking(access.pointer.device, dst, src, len)
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
        if let Some(access) = self.device() {
            // SAFETY: `src` is a distinct Rust slice, read for its length during the call.
            return unsafe {
                self.device_copy(access, offset, src.as_ptr().cast_mut(), src.len(), true)
            };
        }
        let _held = self.cpu.lock(offset, src.len(), Access::Write);
        // SAFETY: bounds checked above; `src` is a distinct Rust allocation so the ranges
        // cannot overlap; the region's bytes are valid for writes while self lives, and no
        // other thread of this process copies them while the stripes are held exclusively.
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
        if let Some(access) = self.device() {
            // SAFETY: `dst` is an exclusive Rust borrow, written for its length during the call.
            return unsafe { self.device_copy(access, offset, dst.as_mut_ptr(), dst.len(), false) };
        }
        let _held = self.cpu.lock(offset, dst.len(), Access::Read);
        // SAFETY: bounds checked above; `dst` is a distinct exclusive Rust borrow; no thread
        // of this process writes these bytes while the stripes are held shared.
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
        let mut v = Vec::with_capacity(len);
        self.append_to(offset, len, &mut v)?;
        Ok(v)
    }

    /// Appends `len` bytes at `offset` to `out` (bounds-checked; `out` grows as a `Vec`
    /// does, so one with room for them is not reallocated).
    pub fn append_to(&self, offset: usize, len: usize, out: &mut Vec<u8>) -> Result<()> {
        self.check(offset, len)?;
        out.reserve(len);
        let at = out.len();
        if let Some(access) = self.device() {
            // SAFETY: `reserve` left room for `len` bytes after `at`, a distinct allocation.
            unsafe {
                self.device_copy(
                    access,
                    offset,
                    out.as_mut_ptr().wrapping_add(at),
                    len,
                    false,
                )?
            };
            // SAFETY: the copy initialised the `len` bytes after `at`, within capacity.
            unsafe { out.set_len(at + len) };
            return Ok(());
        }
        let _held = self.cpu.lock(offset, len, Access::Read);
        // SAFETY: bounds checked above, so the source holds `len` readable bytes (not written
        // by a thread of this process while the stripes are held shared); `reserve` left room
        // for `len` more bytes after `at` in the vector, a distinct allocation, so the ranges
        // cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.as_ptr().wrapping_add(offset),
                out.as_mut_ptr().wrapping_add(at),
                len,
            )
        };
        // SAFETY: the copy above initialised the `len` bytes after `at`, within capacity.
        unsafe { out.set_len(at + len) };
        Ok(())
    }

    /// Borrows the whole region as a slice (zero-copy reads).
    ///
    /// # Safety
    /// No transfer may write into the region (as the local side of a read, or as the remote
    /// side of a peer's write) while the borrow lives.
    ///
    /// # Panics
    /// On device memory, which the CPU cannot read.
    pub unsafe fn as_slice(&self) -> &[u8] {
        assert!(
            !self.is_device(),
            "device memory cannot be borrowed by the CPU"
        );
        // SAFETY: valid for len bytes while self lives; the caller excludes writers.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    /// Borrows the whole region mutably (zero-copy fills).
    ///
    /// # Safety
    /// No other borrow of the region may exist, and no transfer may read or write it while
    /// this borrow lives.
    ///
    /// # Panics
    /// On device memory, which the CPU cannot write.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        assert!(
            !self.is_device(),
            "device memory cannot be borrowed by the CPU"
        );
        // SAFETY: valid for len bytes while self lives; the caller guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }
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
