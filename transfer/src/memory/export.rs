//! What a device region publishes for same-host peers (CUDA IPC): the driver's handle of the
//! allocation it is in, and a **control block**, a sealed one-page shared region whose
//! control page carries the registration's id, token and state (a shared region's control
//! page, without the data). The registration table puts both in the region's descriptor;
//! peers open them in `ipc`.

use std::sync::atomic::Ordering;

use super::{MemoryRegion, ShmControl, ShmLocation};
use crate::device::{DeviceCtx, DevicePointer};
use crate::error::Result;

/// What a device region publishes for same-host peers.
pub(crate) struct IpcExport {
    control: MemoryRegion,
    handle: Vec<u8>,
    offset: u64,
    uuid: String,
}

impl IpcExport {
    /// Exports the allocation `pointer` of a region of `len` bytes at `addr`.
    pub(crate) fn new(
        ctx: &DeviceCtx,
        pointer: &DevicePointer,
        addr: u64,
        len: usize,
    ) -> Result<Self> {
        let handle = ctx.backend.ipc_export(pointer)?;
        let uuid = ctx.uuid(pointer.device)?;
        let control = MemoryRegion::alloc_shared(1)?;
        let ctl = control
            .shm_control()
            .expect("a shared region has a control page");
        ctl.data_len.store(len as u64, Ordering::Release);
        Ok(Self {
            control,
            handle,
            offset: addr - pointer.base,
            uuid,
        })
    }

    /// The control page (registration id, token, state).
    pub(crate) fn control(&self) -> &ShmControl {
        self.control
            .shm_control()
            .expect("a shared region has a control page")
    }

    /// Where a same-host peer maps the control block.
    pub(crate) fn control_location(&self) -> Option<ShmLocation> {
        self.control.shm_location()
    }

    /// The driver's IPC handle of the allocation.
    pub(crate) fn handle(&self) -> &[u8] {
        &self.handle
    }

    /// Offset of the region's first byte from the start of the allocation.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// UUID of the device holding the allocation.
    pub(crate) fn device_uuid(&self) -> &str {
        &self.uuid
    }
}
