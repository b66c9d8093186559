//! A device for tests: device memory the CPU cannot touch, and copy engines that move bytes
//! into and out of it on their own threads, in order, as CUDA streams do.
//!
//! Each allocation is a memfd mapped twice: the **device view**, whose addresses are the
//! device pointers the engine sees, mapped `PROT_NONE` (a CPU load or store through a device
//! address faults: any path that touches device memory with the CPU crashes the test), and
//! a read-write **shadow** that only this fake's copy engines use. An IPC handle names the
//! memfd (the owner's pid and descriptor number); opening it, in this process or another,
//! maps a new device view of the same memory at another address, as a real open does.
//!
//! Tests steer the copy engines: `hold()` makes every copy wait until `release()` (to see
//! what is and is not acknowledged while copies are pending), `fail_copies(n)` makes the
//! next `n` copies fail, and the counters say how many copies ran and how many were pending
//! at most at once.
#![allow(dead_code)]

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

use tokio::sync::oneshot;
use transfer::device::{Allocation, CopyStream, DevicePointer, Fence};
use transfer::{DeviceBackend, TransferError};

/// One mapping of device memory (a view) and where its bytes really are.
#[derive(Clone, Copy)]
struct View {
    device: u32,
    /// Device address of the first byte (the PROT_NONE view).
    base: u64,
    len: usize,
    /// The read-write shadow of the same bytes.
    shadow: usize,
    /// The allocation (IPC handle) it maps.
    id: u64,
}

struct Memfd {
    fd: OwnedFd,
    len: usize,
    shadow: usize,
}

impl Drop for Memfd {
    fn drop(&mut self) {
        // SAFETY: the shadow mapping was made by `alloc_device` and is unmapped once, here.
        unsafe { libc::munmap(self.shadow as *mut libc::c_void, self.len) };
    }
}

#[derive(Default)]
struct Gate {
    held: bool,
}

/// The fake device runtime.
pub struct FakeDevice {
    me: Weak<FakeDevice>,
    devices: u32,
    uuid_prefix: String,
    views: Mutex<Vec<View>>,
    memfds: Mutex<HashMap<u64, Arc<Memfd>>>,
    next_id: AtomicUsize,
    gate: Mutex<Gate>,
    gate_cv: Condvar,
    fail: AtomicUsize,
    ipc_refused: AtomicBool,
    /// Copies enqueued and not yet done.
    pub pending: AtomicUsize,
    /// The most copies pending at once.
    pub max_pending: AtomicUsize,
    /// Copies done (by the copy engines).
    pub copies: AtomicUsize,
    /// Copies that touched memory no allocation holds (freed while the copy was queued).
    pub stray_copies: AtomicUsize,
    /// Fences refused from now on (counted down), as a broken context refuses them.
    pub fail_fences: AtomicUsize,
    /// Pinned buffers handed out.
    pub pinned: AtomicUsize,
    /// Handles opened.
    pub ipc_opens: AtomicUsize,
}

impl FakeDevice {
    /// A runtime with `devices` devices whose UUIDs start with `uuid_prefix`.
    pub fn new(devices: u32, uuid_prefix: &str) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            devices,
            uuid_prefix: uuid_prefix.to_owned(),
            views: Mutex::new(Vec::new()),
            memfds: Mutex::new(HashMap::new()),
            next_id: AtomicUsize::new(1),
            gate: Mutex::new(Gate::default()),
            gate_cv: Condvar::new(),
            fail: AtomicUsize::new(0),
            ipc_refused: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            max_pending: AtomicUsize::new(0),
            copies: AtomicUsize::new(0),
            stray_copies: AtomicUsize::new(0),
            fail_fences: AtomicUsize::new(0),
            pinned: AtomicUsize::new(0),
            ipc_opens: AtomicUsize::new(0),
        })
    }

    /// Copies wait from now until `release`.
    pub fn hold(&self) {
        self.gate.lock().unwrap().held = true;
    }

    /// Lets waiting and future copies run.
    pub fn release(&self) {
        self.gate.lock().unwrap().held = false;
        self.gate_cv.notify_all();
    }

    /// The next `n` copies fail.
    pub fn fail_copies(&self, n: usize) {
        self.fail.store(n, Ordering::SeqCst);
    }

    /// Opening IPC handles fails from now on.
    pub fn refuse_ipc(&self) {
        self.ipc_refused.store(true, Ordering::SeqCst);
    }

    /// The bytes at device address `addr` (read through the shadow, as a test's eyes).
    pub fn peek(&self, addr: u64, len: usize) -> Vec<u8> {
        let host = self.translate(addr, len).expect("a device address");
        let mut v = vec![0u8; len];
        // SAFETY: `host` is the shadow of `len` bytes of a live allocation.
        unsafe { std::ptr::copy_nonoverlapping(host as *const u8, v.as_mut_ptr(), len) };
        v
    }

    fn view_of(&self, addr: u64) -> Option<View> {
        self.views
            .lock()
            .unwrap()
            .iter()
            .find(|v| addr >= v.base && addr < v.base + v.len as u64)
            .copied()
    }

    /// The CPU address of `addr`: its shadow for device memory, itself for host memory.
    /// `None` for a device range that runs past its allocation.
    fn translate(&self, addr: u64, len: usize) -> Option<usize> {
        match self.view_of(addr) {
            Some(v) if addr + len as u64 <= v.base + v.len as u64 => {
                Some(v.shadow + (addr - v.base) as usize)
            }
            Some(_) => None,
            None => Some(addr as usize),
        }
    }

    fn copy_now(&self, dst: u64, src: u64, len: usize) -> Result<(), String> {
        let (Some(d), Some(s)) = (self.translate(dst, len), self.translate(src, len)) else {
            return Err(format!(
                "copy [{src:#x}, +{len}) -> {dst:#x} runs past an allocation"
            ));
        };
        // SAFETY: both sides are the caller's valid ranges (host) or shadows of live
        // allocations (device); `copy` tolerates overlap.
        unsafe { std::ptr::copy(s as *const u8, d as *mut u8, len) };
        Ok(())
    }

    fn map_view(&self, memfd: &Memfd, device: u32, id: u64) -> Result<u64, TransferError> {
        // SAFETY: a fresh mapping of our own memfd at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                memfd.len,
                libc::PROT_NONE,
                libc::MAP_SHARED,
                memfd.fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(TransferError::Device {
                reason: "fake: mmap device view".into(),
            });
        }
        self.views.lock().unwrap().push(View {
            device,
            base: p as u64,
            len: memfd.len,
            shadow: memfd.shadow,
            id,
        });
        Ok(p as u64)
    }

    fn unmap_view(&self, base: u64) {
        let mut views = self.views.lock().unwrap();
        if let Some(i) = views.iter().position(|v| v.base == base) {
            let v = views.swap_remove(i);
            // SAFETY: the view was mapped by `map_view` and is unmapped once, here.
            unsafe { libc::munmap(v.base as *mut libc::c_void, v.len) };
        }
    }
}

/// Unmaps a device view (and drops its memfd's last reference) when dropped.
struct ViewOwner {
    dev: Arc<FakeDevice>,
    base: u64,
    _memfd: Arc<Memfd>,
}

impl Drop for ViewOwner {
    fn drop(&mut self) {
        self.dev.unmap_view(self.base);
    }
}

/// Opens another process's fake device memory (its memfd through `/proc`), with a shadow
/// of our own.
fn open_peer_memfd(pid: u32, fd: i32, len: usize) -> Option<Arc<Memfd>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .ok()?;
    let fd = OwnedFd::from(file);
    // SAFETY: a fresh read-write mapping of a memfd we hold open.
    let shadow = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    (shadow != libc::MAP_FAILED).then(|| {
        Arc::new(Memfd {
            fd,
            len,
            shadow: shadow as usize,
        })
    })
}

enum Op {
    Copy { dst: u64, src: u64, len: usize },
    Fence(oneshot::Sender<Result<(), String>>),
    Sync(std::sync::mpsc::Sender<Result<(), String>>),
}

struct FakeStream {
    tx: std::sync::mpsc::Sender<Op>,
    dev: Arc<FakeDevice>,
}

impl FakeStream {
    fn start(dev: Arc<FakeDevice>) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<Op>();
        let worker = dev.clone();
        std::thread::spawn(move || {
            let mut failed: Option<String> = None;
            while let Ok(op) = rx.recv() {
                match op {
                    Op::Copy { dst, src, len } => {
                        {
                            let mut g = worker.gate.lock().unwrap();
                            while g.held {
                                g = worker.gate_cv.wait(g).unwrap();
                            }
                        }
                        let fail = worker
                            .fail
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok();
                        if fail {
                            failed.get_or_insert_with(|| "fake: injected copy failure".into());
                        } else if let Err(e) = worker.copy_now(dst, src, len) {
                            worker.stray_copies.fetch_add(1, Ordering::SeqCst);
                            failed.get_or_insert(e);
                        }
                        worker.copies.fetch_add(1, Ordering::SeqCst);
                        worker.pending.fetch_sub(1, Ordering::SeqCst);
                    }
                    Op::Fence(tx) => {
                        // Like a CUDA stream: an error is reported by the next fence.
                        let _ = tx.send(failed.take().map_or(Ok(()), Err));
                    }
                    Op::Sync(tx) => {
                        let _ = tx.send(failed.take().map_or(Ok(()), Err));
                    }
                }
            }
        });
        Self { tx, dev }
    }
}

impl CopyStream for FakeStream {
    unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> transfer::Result<()> {
        let now = self.dev.pending.fetch_add(1, Ordering::SeqCst) + 1;
        self.dev.max_pending.fetch_max(now, Ordering::SeqCst);
        self.tx
            .send(Op::Copy { dst, src, len })
            .map_err(|_| TransferError::Device {
                reason: "fake: stream gone".into(),
            })
    }

    fn fence(&self) -> transfer::Result<Fence> {
        let refused = self
            .dev
            .fail_fences
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if refused {
            return Err(TransferError::Device {
                reason: "fake: injected fence failure".into(),
            });
        }
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Op::Fence(tx))
            .map_err(|_| TransferError::Device {
                reason: "fake: stream gone".into(),
            })?;
        Ok(Fence::new(async move {
            match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(reason)) => Err(TransferError::Device { reason }),
                Err(_) => Err(TransferError::Device {
                    reason: "fake: stream gone".into(),
                }),
            }
        }))
    }

    fn synchronize(&self) -> transfer::Result<()> {
        let gone = || TransferError::Device {
            reason: "fake: stream gone".into(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        self.tx.send(Op::Sync(tx)).map_err(|_| gone())?;
        rx.recv()
            .map_err(|_| gone())?
            .map_err(|reason| TransferError::Device { reason })
    }
}

impl DeviceBackend for FakeDevice {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn device_count(&self) -> transfer::Result<u32> {
        Ok(self.devices)
    }

    fn locate(&self, addr: u64) -> transfer::Result<Option<DevicePointer>> {
        Ok(self.view_of(addr).map(|v| DevicePointer {
            device: v.device,
            base: v.base,
            size: v.len as u64,
        }))
    }

    fn stream(&self, _device: u32) -> transfer::Result<Arc<dyn CopyStream>> {
        Ok(Arc::new(FakeStream::start(self.me.upgrade().unwrap())))
    }

    unsafe fn copy_blocking(
        &self,
        _device: u32,
        dst: u64,
        src: u64,
        len: usize,
    ) -> transfer::Result<()> {
        self.copy_now(dst, src, len)
            .map_err(|reason| TransferError::Device { reason })
    }

    fn alloc_pinned(&self, len: usize) -> transfer::Result<Allocation> {
        self.pinned.fetch_add(1, Ordering::SeqCst);
        let mem = vec![0u8; len].into_boxed_slice();
        let addr = mem.as_ptr() as u64;
        Ok(Allocation::new(addr, len, mem))
    }

    fn alloc_device(&self, device: u32, len: usize) -> transfer::Result<Allocation> {
        assert!(device < self.devices, "no fake device {device}");
        let name = std::ffi::CString::new("fake-device").unwrap();
        // SAFETY: a valid C string; the result is checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0, "memfd_create");
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len as i64) }, 0);
        // SAFETY: a fresh read-write mapping of our own memfd.
        let shadow = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(shadow, libc::MAP_FAILED);
        let memfd = Arc::new(Memfd {
            fd,
            len,
            shadow: shadow as usize,
        });
        let id = self.next_id.fetch_add(1, Ordering::SeqCst) as u64;
        self.memfds.lock().unwrap().insert(id, memfd.clone());
        let base = self.map_view(&memfd, device, id)?;
        Ok(Allocation::new(
            base,
            len,
            ViewOwner {
                dev: self.me.upgrade().unwrap(),
                base,
                _memfd: memfd,
            },
        ))
    }

    fn ipc_export(&self, ptr: &DevicePointer) -> transfer::Result<Vec<u8>> {
        let v = self
            .view_of(ptr.base)
            .ok_or_else(|| TransferError::Device {
                reason: "fake: not device memory".into(),
            })?;
        let memfd = self.memfds.lock().unwrap().get(&v.id).cloned().unwrap();
        // Handle: pid, memfd descriptor, length, allocation id.
        let mut h = Vec::with_capacity(64);
        h.extend(std::process::id().to_le_bytes());
        h.extend(memfd.fd.as_raw_fd().to_le_bytes());
        h.extend((memfd.len as u64).to_le_bytes());
        h.extend(v.id.to_le_bytes());
        h.resize(64, 0);
        Ok(h)
    }

    fn ipc_open(&self, device: u32, handle: &[u8]) -> transfer::Result<Allocation> {
        if self.ipc_refused.load(Ordering::SeqCst) || handle.len() != 64 {
            return Err(TransferError::Device {
                reason: "fake: cannot open this IPC handle".into(),
            });
        }
        let pid = u32::from_le_bytes(handle[0..4].try_into().unwrap());
        let fd = i32::from_le_bytes(handle[4..8].try_into().unwrap());
        let len = u64::from_le_bytes(handle[8..16].try_into().unwrap()) as usize;
        let id = u64::from_le_bytes(handle[16..24].try_into().unwrap());
        let memfd = if pid == std::process::id() {
            self.memfds.lock().unwrap().get(&id).cloned()
        } else {
            open_peer_memfd(pid, fd, len)
        }
        .ok_or_else(|| TransferError::Device {
            reason: format!("fake: no allocation {id} of process {pid}"),
        })?;
        self.ipc_opens.fetch_add(1, Ordering::SeqCst);
        let base = self.map_view(&memfd, device, id)?;
        Ok(Allocation::new(
            base,
            memfd.len,
            ViewOwner {
                dev: self.me.upgrade().unwrap(),
                base,
                _memfd: memfd,
            },
        ))
    }

    fn device_uuid(&self, device: u32) -> transfer::Result<String> {
        Ok(format!("GPU-{}-{device}", self.uuid_prefix))
    }
}

/// An engine whose device backend is `fake`.
pub async fn dev_engine(
    fake: &Arc<FakeDevice>,
    cfg: transfer::EngineConfig,
) -> transfer::TransferEngine {
    transfer::TransferEngine::builder()
        .config(cfg)
        .device_backend(fake.clone())
        .build()
        .await
        .expect("engine starts")
}

/// Waits (bounded, ten seconds) until `cond` holds.
pub async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}
