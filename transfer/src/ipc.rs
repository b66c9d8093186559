//! Device regions between two processes of one host: CUDA IPC, behind the same checks as
//! shared memory.
//!
//! The owner exports an IPC handle of the allocation a device region is in, and gives the
//! region a **control block**: a sealed one-page memfd whose control page carries the
//! registration's id, token and state, locked by the owner for its life (exactly a shared
//! region's control page, without the data). Both go in the region's descriptor, which
//! only authenticated peers get (peer-to-peer, or from the master with the store key).
//! A peer on the same host maps the control block with every check shared memory makes
//! (`shm::PeerMapping::open_control`), opens the handle on its own ordinal of the device
//! (found by UUID), and copies device to device; before and after each copy it checks the
//! owner is alive and the registration unchanged, so a retired or re-registered region is
//! an error, not a write into memory that was given back. Two engines of one process use
//! the owner's address directly (a process cannot open its own handle), once the driver
//! confirms the region is device memory of that device.
//!
//! A handle is opened once per process and device (the driver maps an allocation once per
//! context), shared by every region and peer segment in that allocation, and closed with
//! the last mapping using it. A region's claimed offset and length are checked against the
//! size of the allocation the driver opened. Mappings of regions a peer retired are dropped
//! when its descriptor is next fetched (a refused request refetches it), closing handles
//! no region uses any more: an importer holding a handle keeps the owner's device memory
//! from being released.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;

use crate::device::{Allocation, DeviceCtx};
use crate::error::{RemoteRange, Result, TransferError};
use crate::op::PeerCache;
use crate::segment::{CudaIpcRegion, RegionDescriptor};
use crate::shm::PeerMapping;

/// Handles opened in this process: by backend instance, device ordinal and handle.
type Imports = HashMap<(usize, u32, String), Weak<Allocation>>;

static IMPORTS: LazyLock<Mutex<Imports>> = LazyLock::new(Default::default);

/// The allocation `handle` names, opened on `device` (once per process).
fn import(ctx: &DeviceCtx, device: u32, handle: &str) -> Result<Arc<Allocation>> {
    let key = (
        Arc::as_ptr(&ctx.backend).cast::<()>() as usize,
        device,
        handle.to_owned(),
    );
    let mut opened = IMPORTS.lock();
    if let Some(a) = opened.get(&key).and_then(Weak::upgrade) {
        return Ok(a);
    }
    let bytes = CudaIpcRegion::decode_handle(handle).ok_or_else(|| TransferError::Device {
        reason: "the CUDA IPC handle is not hex".into(),
    })?;
    let a = Arc::new(ctx.backend.ipc_open(device, &bytes)?);
    opened.retain(|_, w| w.strong_count() > 0);
    opened.insert(key, Arc::downgrade(&a));
    Ok(a)
}

/// A same-host peer's device region, opened in this process.
pub(crate) struct IpcMapping {
    control: PeerMapping,
    /// The opened handle (none when the owner is this very process), shared by the regions
    /// of one allocation.
    _import: Option<Arc<Allocation>>,
    /// This process's address of the region's first byte.
    base: u64,
    /// This process's ordinal of the device holding it.
    pub(crate) device: u32,
    region: RegionDescriptor,
}

impl IpcMapping {
    fn open(
        ctx: &DeviceCtx,
        segment: &str,
        region: &RegionDescriptor,
        ipc: &CudaIpcRegion,
    ) -> Result<Self> {
        let fail =
            |reason: String| TransferError::unreachable(segment, format!("CUDA IPC: {reason}"));
        let device = ctx.device_with_uuid(&ipc.device_uuid).ok_or_else(|| {
            fail(format!(
                "device {} is not visible to this process",
                ipc.device_uuid
            ))
        })?;
        let control = PeerMapping::open_control(segment, region, &ipc.control)?;
        let (import, base) = if ipc.control.pid == std::process::id() {
            // Another engine of this process: its address is ours, if it is what it claims.
            let end = region.addr.checked_add(region.len);
            match (ctx.backend.locate(region.addr)?, end) {
                (Some(p), Some(end)) if p.device == device && end <= p.base + p.size => {}
                _ => {
                    return Err(fail(format!(
                        "[{:#x}, +{}) is not memory of cuda:{device} in this process",
                        region.addr, region.len
                    )));
                }
            }
            (None, region.addr)
        } else {
            let a = import(ctx, device, &ipc.handle).map_err(|e| fail(e.to_string()))?;
            let fits = ipc
                .offset
                .checked_add(region.len)
                .is_some_and(|end| end <= a.len() as u64);
            if !fits {
                return Err(fail(format!(
                    "the region [{}, +{}) runs past the {}-byte allocation its handle opens",
                    ipc.offset,
                    region.len,
                    a.len()
                )));
            }
            (Some(a.clone()), a.addr() + ipc.offset)
        };
        Ok(Self {
            control,
            _import: import,
            base,
            device,
            region: region.clone(),
        })
    }

    /// This process's address of the peer's `addr` (inside the region, checked by the caller).
    pub(crate) fn addr_of(&self, addr: u64) -> u64 {
        self.base + (addr - self.region.addr)
    }

    /// The owner is alive and the registration is the one the descriptor names.
    pub(crate) fn check(&self, segment: &str, range: RemoteRange) -> Result<()> {
        self.control.check(segment, range)?;
        self.control.check_owner(segment)
    }
}

/// Opened IPC regions of one peer segment, by region id.
#[derive(Default)]
pub(crate) struct IpcMaps {
    maps: Mutex<HashMap<u64, Arc<IpcMapping>>>,
}

impl IpcMaps {
    /// The mapping of `region` (opened on first use).
    pub(crate) fn get(
        &self,
        ctx: &DeviceCtx,
        segment: &str,
        region: &RegionDescriptor,
        ipc: &CudaIpcRegion,
    ) -> Result<Arc<IpcMapping>> {
        // Opened under the lock, so a concurrent `retain` (a refetched descriptor) sees
        // the mapping or comes after it was inserted.
        let mut maps = self.maps.lock();
        if let Some(m) = maps.get(&region.id)
            && m.region == *region
        {
            return Ok(m.clone());
        }
        let m = Arc::new(IpcMapping::open(ctx, segment, region, ipc)?);
        m.check(segment, RemoteRange::new(region.addr, region.len))?;
        maps.insert(region.id, m.clone());
        Ok(m)
    }
}

/// What the CUDA IPC transport keeps for a peer segment.
impl PeerCache for IpcMaps {
    /// Closes everything (the peer re-registered or restarted).
    fn clear(&self) {
        self.maps.lock().clear();
    }

    /// Closes the regions whose id is not in `live` (the peer retired them).
    fn retain(&self, live: &HashSet<u64>) {
        self.maps.lock().retain(|id, _| live.contains(id));
    }
}
