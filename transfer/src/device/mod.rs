//! Device (GPU) memory as registered memory: where a region lives, the backend that copies
//! into and out of it, and the engine's per-device resources.
//!
//! A region is either host memory, which the CPU, the kernel (`recv`, `sendmsg`), NICs and
//! peer processes touch directly, or **device memory** (`cuda:N`), which nothing but the
//! device's copy engines may touch: a CPU load from a device pointer faults. So every path
//! that would copy with the CPU goes through a [`DeviceBackend`] instead:
//! - **TCP** stages: bytes are received into pinned host buffers and copied to the device
//!   (a Write is acknowledged only once its last copy completed), or copied from the device
//!   into pinned buffers and sent. Copies run on streams asynchronously and overlap the
//!   socket I/O of the neighbouring chunk; staging memory is bounded per peer (`staging`).
//! - **Same host**: a device region carries a CUDA IPC handle in the descriptor; a peer on
//!   the same host opens it and copies device to device (the crate's `ipc`), falling back to
//!   staged TCP when the handle cannot be opened.
//! - **Local copies** (the engine's own segment, a same-host peer's shared memory) are
//!   stream copies between the two addresses (unified addressing).
//! - **RDMA** registers device memory directly when the NIC can reach it (GPUDirect, the
//!   peer-memory kernel module), else the region gets no RDMA keys and peers stage over TCP.
//!
//! The CUDA backend ([`cuda`]) loads `libcuda.so.1` at run time: the crate builds, and every
//! host path runs, on machines with no CUDA at all; registering device memory there fails
//! with a clear error. Tests plug a backend of their own ([`DeviceBackend`] is public).
//!
//! Copies made by a device's copy engines are, for the Rust memory model, like the kernel's
//! `recv` into a buffer or a NIC's DMA: outside it. The host side of a device copy is either
//! a private staging buffer or registered memory, which the engine already treats so.

pub mod cuda;
pub(crate) mod staging;

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TransferError};

pub use staging::StagingStats;

/// How long after a request's deadline a device copy of it is still waited for: a copy
/// engine cannot be stopped, so a request's landing lasts until its fence, and a fence that
/// never comes (a hung device) is given up on this long after the deadline.
pub(crate) const FENCE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Where a region's bytes live, as Mooncake labels it (`cpu:0`, `cuda:1`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory (any NUMA node): the CPU may touch it.
    #[default]
    Host,
    /// Memory of CUDA device `N` (an ordinal of this process's CUDA view): only the
    /// device's copy engines may touch it.
    Cuda(u32),
}

impl Location {
    /// Parses a Mooncake location label: `cpu` or `cpu:N` (host memory, any node), `cuda:N`,
    /// or the wildcard `*` (or an empty label): `Ok(None)`, "find out from the pointer".
    pub fn parse_label(label: &str) -> Result<Option<Location>> {
        let label = label.trim();
        if label.is_empty() || label == "*" {
            return Ok(None);
        }
        let (kind, index) = match label.split_once(':') {
            Some((k, i)) => (k, Some(i)),
            None => (label, None),
        };
        let number = |i: Option<&str>| -> Result<Option<u32>> {
            match i {
                None => Ok(None),
                Some(i) => i.parse::<u32>().map(Some).map_err(|_| {
                    TransferError::invalid(format!(
                        "location {label:?}: {i:?} is not a device or node number"
                    ))
                }),
            }
        };
        match kind.to_ascii_lowercase().as_str() {
            "cpu" => number(index).map(|_| Some(Location::Host)),
            "cuda" | "gpu" => match number(index)? {
                Some(n) => Ok(Some(Location::Cuda(n))),
                None => Err(TransferError::invalid(format!(
                    "location {label:?} names no device (cuda:N)"
                ))),
            },
            _ => Err(TransferError::invalid(format!(
                "unknown location {label:?} (cpu:N, cuda:N or *)"
            ))),
        }
    }

    /// Whether this is host memory.
    pub fn is_host(&self) -> bool {
        matches!(self, Location::Host)
    }

    /// The device ordinal of device memory.
    pub fn device(&self) -> Option<u32> {
        match self {
            Location::Host => None,
            Location::Cuda(n) => Some(*n),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Host => f.write_str("cpu"),
            Location::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for Location {
    type Err = TransferError;
    /// A definite label (`cpu`, `cpu:N`, `cuda:N`); the wildcard is refused here.
    fn from_str(s: &str) -> Result<Self> {
        Location::parse_label(s)?.ok_or_else(|| {
            TransferError::invalid(format!("location {s:?} is a wildcard, not a location"))
        })
    }
}

impl Serialize for Location {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Location {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A device pointer as its backend sees it: the device and the allocation holding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePointer {
    /// Device ordinal.
    pub device: u32,
    /// First address of the allocation the pointer is in.
    pub base: u64,
    /// Size of that allocation.
    pub size: u64,
}

impl DevicePointer {
    /// Whether `[addr, addr + len)` lies inside the allocation.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base.saturating_add(self.size))
    }
}

/// Memory a backend handed out (pinned host memory, device memory, an opened IPC handle):
/// an address and a length, released when the owner value inside is dropped.
pub struct Allocation {
    addr: u64,
    len: usize,
    _owner: Box<dyn Any + Send + Sync>,
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Allocation({:#x}, {} bytes)", self.addr, self.len)
    }
}

impl Allocation {
    /// `len` bytes at `addr`, released when `owner` is dropped.
    pub fn new(addr: u64, len: usize, owner: impl Any + Send + Sync) -> Self {
        Self {
            addr,
            len,
            _owner: Box::new(owner),
        }
    }

    /// First address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Never releases the memory: for a buffer a device may still be copying into after
    /// its copy was given up on (a fence that never came), which must never be reused.
    pub fn leak(self) {
        std::mem::forget(self);
    }
}

/// Resolves once every copy enqueued on its stream before it was made has completed (or
/// one of them failed).
pub struct Fence(Pin<Box<dyn Future<Output = Result<()>> + Send + 'static>>);

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fence")
    }
}

impl Fence {
    /// A fence that resolves when `fut` does.
    pub fn new(fut: impl Future<Output = Result<()>> + Send + 'static) -> Self {
        Self(Box::pin(fut))
    }

    /// A fence already resolved.
    pub fn ready(r: Result<()>) -> Self {
        Self::new(std::future::ready(r))
    }
}

impl Future for Fence {
    type Output = Result<()>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.0.as_mut().poll(cx)
    }
}

/// An ordered queue of asynchronous copies on one device (a CUDA stream).
pub trait CopyStream: Send + Sync {
    /// Enqueues a copy of `len` bytes from `src` to `dst`. Either side is a host address of
    /// this process or a device address (unified addressing); the backend finds out which.
    ///
    /// # Safety
    /// `src` must stay valid for `len` bytes of reads and `dst` for `len` bytes of writes
    /// until a fence made after this call resolved, and no one else may write `dst` (or
    /// `src`) meanwhile.
    unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> Result<()>;

    /// A fence after every copy enqueued so far.
    fn fence(&self) -> Result<Fence>;

    /// Blocks the calling thread until every copy enqueued so far completed (or the stream
    /// failed): what an error path waits on when a copy was enqueued but no fence could
    /// follow it.
    fn synchronize(&self) -> Result<()>;
}

/// What the engine needs from a device runtime. The production one is CUDA ([`cuda::Cuda`]);
/// tests plug their own.
pub trait DeviceBackend: Send + Sync + 'static {
    /// Short name, for logs and errors (`cuda`).
    fn name(&self) -> &'static str;

    /// Devices this process sees.
    fn device_count(&self) -> Result<u32>;

    /// Where `addr` points: `Some` for device memory, `None` for memory the CPU may touch
    /// (ordinary host memory, pinned host memory, managed memory).
    fn locate(&self, addr: u64) -> Result<Option<DevicePointer>>;

    /// A new copy stream on `device`.
    fn stream(&self, device: u32) -> Result<Arc<dyn CopyStream>>;

    /// Copies `len` bytes from `src` to `dst` (host or device addresses) and returns once
    /// they are there.
    ///
    /// # Safety
    /// As [`CopyStream::copy`], for the duration of the call.
    unsafe fn copy_blocking(&self, device: u32, dst: u64, src: u64, len: usize) -> Result<()>;

    /// `len` bytes of pinned (page-locked) host memory the devices copy to and from at full
    /// speed; the CPU may touch it.
    fn alloc_pinned(&self, len: usize) -> Result<Allocation>;

    /// `len` bytes of memory on `device`.
    fn alloc_device(&self, device: u32, len: usize) -> Result<Allocation>;

    /// An inter-process handle of the allocation `ptr` is in, which another process on this
    /// host opens with [`DeviceBackend::ipc_open`].
    fn ipc_export(&self, ptr: &DevicePointer) -> Result<Vec<u8>>;

    /// Opens a handle another process exported, on `device`: the allocation's base address
    /// in this process, unmapped when the returned value is dropped.
    fn ipc_open(&self, device: u32, handle: &[u8]) -> Result<Allocation>;

    /// A stable identity of `device` (its UUID), the same in every process of the host
    /// whatever ordinal the device has there.
    fn device_uuid(&self, device: u32) -> Result<String>;
}

/// Streams per device an engine round-robins its copies over.
const STREAMS_PER_DEVICE: usize = 4;

/// A device's copy streams and the index of the last one handed out.
type StreamPool = (Vec<Arc<dyn CopyStream>>, usize);

/// The engine's device context, made on first use: the backend, its copy streams and the
/// staging pool.
pub(crate) struct DeviceCtx {
    pub(crate) backend: Arc<dyn DeviceBackend>,
    pub(crate) staging: Arc<staging::Staging>,
    streams: Mutex<HashMap<u32, StreamPool>>,
    uuids: Mutex<HashMap<u32, String>>,
}

impl DeviceCtx {
    /// A copy stream of `device` (round robin over a few).
    pub(crate) fn stream(&self, device: u32) -> Result<Arc<dyn CopyStream>> {
        let mut map = self.streams.lock();
        let (pool, next) = map.entry(device).or_insert_with(|| (Vec::new(), 0));
        if pool.len() < STREAMS_PER_DEVICE {
            let s = self.backend.stream(device)?;
            pool.push(s.clone());
            return Ok(s);
        }
        *next = (*next + 1) % pool.len();
        Ok(pool[*next].clone())
    }

    /// The UUID of `device` (cached).
    pub(crate) fn uuid(&self, device: u32) -> Result<String> {
        if let Some(u) = self.uuids.lock().get(&device) {
            return Ok(u.clone());
        }
        let u = self.backend.device_uuid(device)?;
        self.uuids.lock().insert(device, u.clone());
        Ok(u)
    }

    /// The ordinal in this process of the device with `uuid`, if this process sees it.
    pub(crate) fn device_with_uuid(&self, uuid: &str) -> Option<u32> {
        let n = self.backend.device_count().ok()?;
        (0..n).find(|d| self.uuid(*d).is_ok_and(|u| u == uuid))
    }
}

/// How an engine reaches devices: a backend plugged by the embedder, or CUDA loaded on first
/// need; and the staging settings.
pub(crate) struct Devices {
    plugged: Option<Arc<dyn DeviceBackend>>,
    library: Option<PathBuf>,
    staging_chunk: usize,
    staging_per_peer: usize,
    staging_total: usize,
    /// Whether device regions export CUDA IPC handles and same-host peers use them.
    pub(crate) ipc: bool,
    ctx: OnceLock<std::result::Result<Arc<DeviceCtx>, String>>,
}

impl fmt::Debug for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Devices")
            .field("plugged", &self.plugged.as_ref().map(|b| b.name()))
            .field("library", &self.library)
            .field("staging_chunk", &self.staging_chunk)
            .field("staging_per_peer", &self.staging_per_peer)
            .field("staging_total", &self.staging_total)
            .field("ipc", &self.ipc)
            .field("loaded", &self.loaded().is_some())
            .finish()
    }
}

impl Devices {
    pub(crate) fn new(
        plugged: Option<Arc<dyn DeviceBackend>>,
        library: Option<PathBuf>,
        staging: (usize, usize, usize),
        ipc: bool,
    ) -> Self {
        let (staging_chunk, staging_per_peer, staging_total) = staging;
        Self {
            plugged,
            library,
            staging_chunk,
            staging_per_peer,
            staging_total,
            ipc,
            ctx: OnceLock::new(),
        }
    }

    /// The device context, loading the backend on first call (CUDA unless one was plugged).
    /// An error says why devices cannot be used here.
    pub(crate) fn ctx(&self) -> Result<&Arc<DeviceCtx>> {
        let r = self.ctx.get_or_init(|| {
            let backend: Arc<dyn DeviceBackend> = match &self.plugged {
                Some(b) => b.clone(),
                None => cuda::Cuda::load(self.library.as_deref())? as Arc<dyn DeviceBackend>,
            };
            Ok(Arc::new(DeviceCtx {
                staging: staging::Staging::new(
                    backend.clone(),
                    self.staging_chunk,
                    self.staging_per_peer,
                    self.staging_total,
                ),
                backend,
                streams: Mutex::new(HashMap::new()),
                uuids: Mutex::new(HashMap::new()),
            }))
        });
        r.as_ref().map_err(|reason| TransferError::Device {
            reason: reason.clone(),
        })
    }

    /// The device context if it was made already (no loading).
    pub(crate) fn loaded(&self) -> Option<&Arc<DeviceCtx>> {
        self.ctx.get().and_then(|r| r.as_ref().ok())
    }

    /// The staging chunk size (bytes per pinned buffer).
    pub(crate) fn staging_chunk(&self) -> usize {
        self.staging_chunk
    }
}

/// The CPU's way into device memory, kept by a device region: its backend and device.
#[derive(Clone)]
pub(crate) struct DeviceAccess {
    pub(crate) backend: Arc<dyn DeviceBackend>,
    pub(crate) pointer: DevicePointer,
}

impl fmt::Debug for DeviceAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{} allocation {:#x}+{}",
            self.backend.name(),
            self.pointer.device,
            self.pointer.base,
            self.pointer.size
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_labels_parse_and_print() {
        assert_eq!(Location::parse_label("*").unwrap(), None);
        assert_eq!(Location::parse_label("").unwrap(), None);
        assert_eq!(
            Location::parse_label("cpu:0").unwrap(),
            Some(Location::Host)
        );
        assert_eq!(
            Location::parse_label("cpu:3").unwrap(),
            Some(Location::Host)
        );
        assert_eq!(Location::parse_label("cpu").unwrap(), Some(Location::Host));
        assert_eq!(
            Location::parse_label("cuda:2").unwrap(),
            Some(Location::Cuda(2))
        );
        assert_eq!(
            Location::parse_label(" CUDA:0 ").unwrap(),
            Some(Location::Cuda(0))
        );
        for bad in ["cuda", "cuda:x", "cuda:-1", "npu:0", "cpu:a"] {
            let e = Location::parse_label(bad).unwrap_err().to_string();
            assert!(e.contains(bad.trim()), "{bad}: {e}");
        }
        assert_eq!(Location::Cuda(7).to_string(), "cuda:7");
        assert_eq!(Location::Host.to_string(), "cpu");
        assert_eq!("cuda:7".parse::<Location>().unwrap(), Location::Cuda(7));
        assert!("*".parse::<Location>().is_err());
        let json = serde_json::to_string(&Location::Cuda(1)).unwrap();
        assert_eq!(json, "\"cuda:1\"");
        assert_eq!(
            serde_json::from_str::<Location>(&json).unwrap(),
            Location::Cuda(1)
        );
        assert!(serde_json::from_str::<Location>("\"tpu:1\"").is_err());
    }

    #[test]
    fn device_pointer_containment() {
        let p = DevicePointer {
            device: 0,
            base: 0x1000,
            size: 0x1000,
        };
        assert!(p.contains(0x1000, 0x1000));
        assert!(p.contains(0x1fff, 1));
        assert!(!p.contains(0x1fff, 2));
        assert!(!p.contains(0xfff, 1));
        assert!(!p.contains(u64::MAX, 2));
    }

    #[test]
    fn without_a_driver_devices_are_refused_with_the_reason() {
        let d = Devices::new(
            None,
            Some(PathBuf::from("/nonexistent/libcuda.so.1")),
            (1 << 20, 64 << 20, 1 << 30),
            true,
        );
        let e = d.ctx().err().expect("no driver there").to_string();
        assert!(e.contains("/nonexistent/libcuda.so.1"), "{e}");
        assert!(e.contains("CUDA driver"), "{e}");
        assert!(d.loaded().is_none());
    }
}
