//! Registration: host memory (allocated here, owned, or lent), and device memory found from
//! its pointer or allocated on a device, exported for same-host peers when IPC is on.

use std::sync::Arc;

use super::TransferEngine;
use crate::device::{DeviceAccess, Location};
use crate::error::{Result, TransferError};
use crate::memory::{AllocOptions, IpcExport, MemoryRegion};
use crate::registry::{LocalEntry, RegisteredBuffer};

impl TransferEngine {
    /// Registers `region`: peers can address it from now on, and it can be the local side
    /// of requests. Dropping every clone of the returned handle unregisters it.
    ///
    /// With peer-to-peer metadata peers see the region at once (they ask this engine).
    /// With a metadata service the descriptor is republished in the background; call
    /// [`TransferEngine::publish`] to know it is out before telling peers about the region.
    pub fn register(&self, mut region: MemoryRegion) -> Result<RegisteredBuffer> {
        self.check_open()?;
        if let Some(access) = region.device().cloned()
            && self.inner.config.device_ipc
        {
            let exported =
                self.inner.devices.ctx().and_then(|ctx| {
                    IpcExport::new(ctx, &access.pointer, region.addr(), region.len())
                });
            match exported {
                Ok(e) => region.set_export(e),
                Err(e) => tracing::info!(
                    error = %e,
                    "device memory registered without a CUDA IPC handle: peers on this host stage it over TCP"
                ),
            }
        }
        let (rdma_keys, rdma_mrs) = match &self.inner.rdma {
            Some(t) => t.register(&region)?,
            None => (Vec::new(), Vec::new()),
        };
        let entry = LocalEntry {
            id: self.inner.regions.next_id(),
            token: rand::random::<u64>() | 1,
            region: Arc::new(region),
            rdma_keys,
            rdma_mrs,
        };
        self.inner.regions.insert(entry)
    }

    /// Allocates and registers `len` zeroed, page-aligned bytes (shared memory when the
    /// shared-memory transport is enabled, so same-host peers can use it).
    pub fn alloc(&self, len: usize) -> Result<RegisteredBuffer> {
        self.alloc_with(
            len,
            AllocOptions {
                shared: self.inner.config.shm,
                ..AllocOptions::default()
            },
        )
    }

    /// Allocates (as `opts` says) and registers `len` bytes.
    pub fn alloc_with(&self, len: usize, opts: AllocOptions) -> Result<RegisteredBuffer> {
        self.register(MemoryRegion::alloc_with(len, opts)?)
    }

    /// Registers memory the caller manages; see [`MemoryRegion::from_raw_parts`].
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes until `keep_alive` is dropped (after
    /// the registration and every transfer using it ended), and must not be accessed through
    /// Rust references while transfers may touch it.
    pub unsafe fn register_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        keep_alive: impl std::any::Any + Send + Sync,
    ) -> Result<RegisteredBuffer> {
        // SAFETY: forwarded caller contract.
        let region = unsafe { MemoryRegion::from_raw_parts(ptr, len, keep_alive)? };
        self.register(region)
    }

    /// Registers memory the caller manages at `location`, as Mooncake's
    /// `registerLocalMemory` does: `Some(Location::Host)` is host memory;
    /// `Some(Location::Cuda(n))` must be device memory of device `n` (checked with the
    /// driver); `None` (Mooncake's `*`) asks the driver where the pointer is, and is host
    /// memory where no driver is installed. Device memory is registered whole within one
    /// device allocation; the CPU never touches it (see [`crate::device`]). A device
    /// location on a machine without a usable driver is refused with the reason.
    ///
    /// # Safety
    /// As [`TransferEngine::register_raw`], for whichever memory the range is.
    pub unsafe fn register_raw_at(
        &self,
        ptr: *mut u8,
        len: usize,
        location: Option<Location>,
        keep_alive: impl std::any::Any + Send + Sync,
    ) -> Result<RegisteredBuffer> {
        self.check_open()?;
        let addr = ptr as u64;
        let devices = &self.inner.devices;
        let found = match location {
            Some(Location::Host) => None,
            Some(Location::Cuda(n)) => {
                let ctx = devices.ctx()?;
                match ctx.backend.locate(addr)? {
                    Some(p) if p.device == n => Some((ctx, p)),
                    Some(p) => {
                        return Err(TransferError::Device {
                            reason: format!(
                                "{addr:#x} is memory of cuda:{}, not of the cuda:{n} it was registered as",
                                p.device
                            ),
                        });
                    }
                    None => {
                        return Err(TransferError::Device {
                            reason: format!(
                                "{addr:#x} was registered as cuda:{n} but is not device memory"
                            ),
                        });
                    }
                }
            }
            None => match devices.ctx() {
                Ok(ctx) => ctx.backend.locate(addr)?.map(|p| (ctx, p)),
                Err(e) => {
                    tracing::trace!(error = %e, "no device backend: {addr:#x} is host memory");
                    None
                }
            },
        };
        let region = match found {
            None => {
                // SAFETY: forwarded caller contract.
                unsafe { MemoryRegion::from_raw_parts(ptr, len, keep_alive)? }
            }
            Some((ctx, pointer)) => {
                let access = DeviceAccess {
                    backend: ctx.backend.clone(),
                    pointer,
                };
                // SAFETY: the driver says `ptr` is device memory of `pointer.device` (the
                // range is checked to lie in its allocation); the caller keeps it valid
                // until `keep_alive` is dropped.
                unsafe { MemoryRegion::from_device(ptr, len, access, keep_alive)? }
            }
        };
        self.register(region)
    }

    /// Allocates `len` bytes on CUDA device `device` and registers them (freed when the
    /// registration and every transfer using it ended).
    pub fn alloc_device(&self, device: u32, len: usize) -> Result<RegisteredBuffer> {
        self.check_open()?;
        if len == 0 {
            return Err(TransferError::invalid(
                "cannot allocate a zero-length region",
            ));
        }
        let ctx = self.inner.devices.ctx()?;
        let mem = ctx.backend.alloc_device(device, len)?;
        let access = DeviceAccess {
            backend: ctx.backend.clone(),
            pointer: crate::device::DevicePointer {
                device,
                base: mem.addr(),
                size: len as u64,
            },
        };
        let ptr = mem.addr() as *mut u8;
        // SAFETY: `mem` is `len` bytes of memory of `device`, freed only when it is dropped,
        // which is with the region.
        let region = unsafe { MemoryRegion::from_device(ptr, len, access, mem)? };
        self.register(region)
    }

    /// Where `addr` (an address in this process) points: device memory per the driver, or
    /// host memory (also where no driver is installed).
    pub fn locate(&self, addr: u64) -> Result<Location> {
        match self.inner.devices.ctx() {
            Ok(ctx) => Ok(ctx
                .backend
                .locate(addr)?
                .map(|p| Location::Cuda(p.device))
                .unwrap_or(Location::Host)),
            Err(_) => Ok(Location::Host),
        }
    }
}
