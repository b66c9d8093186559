//! Memory copies: requests carried by copying bytes between memory this process maps (the
//! engine's own regions, a same-host peer's shared memory, a same-host peer's device memory
//! opened through CUDA IPC), and how they run.
//!
//! A transport that carries a request by copy resolves it to a [`CopyJob`] and collects it
//! into its batch's [`Copies`] while the batch is dispatched. Once every request of the
//! batch is dispatched, its copies run together ([`Copies::run`]): the host copies spread
//! over the runtime's worker threads as one set (`hostcopy`), the copies with device memory
//! on either side enqueued on device streams and waited for by one task (`devcopy`). The
//! synchronous copies of the engine's mapped reads and writes spread over the calling
//! thread and one copier thread (`copier`).

pub(crate) mod copier;
mod devcopy;
mod hostcopy;

use std::sync::Arc;

use crate::device::Devices;
use crate::error::{RemoteRange, Result, TransferError};
use crate::home::Home;
use crate::ipc::IpcMapping;
use crate::op::BatchState;
use crate::registry::{LocalEntry, LocalRegions};
use crate::shm::PeerMapping;

/// Where a memory-copy request's remote side is.
pub(crate) enum CopyTarget {
    /// A same-host peer's mapped region.
    Peer(Arc<PeerMapping>),
    /// A region of this engine.
    Local(Arc<LocalEntry>),
    /// A same-host peer's device region, opened through CUDA IPC.
    Ipc(Arc<IpcMapping>),
}

impl CopyTarget {
    /// Resolves a request into this engine's own segment (`segment`, as errors name it).
    pub(crate) fn local(
        regions: &LocalRegions,
        segment: &str,
        addr: u64,
        len: u64,
    ) -> Result<Self> {
        regions
            .entry_for(addr, len)
            .map(CopyTarget::Local)
            .ok_or_else(|| TransferError::OutOfBounds {
                segment: segment.to_owned(),
                range: RemoteRange::new(addr, len),
                reason: "not inside one registered region of this engine".into(),
            })
    }
}

/// A request of a batch executed by memory copy.
pub(crate) struct CopyJob {
    pub(crate) idx: usize,
    pub(crate) target: CopyTarget,
}

impl CopyJob {
    /// Whether either side is device memory (then a device copies it: `devcopy`).
    pub(crate) fn involves_device(&self, batch: &BatchState) -> bool {
        batch.requests[self.idx].local.region().is_device()
            || match &self.target {
                CopyTarget::Peer(_) => false,
                CopyTarget::Local(e) => e.region.is_device(),
                CopyTarget::Ipc(_) => true,
            }
    }
}

/// The memory copies of one batch, collected while it is dispatched and run once after.
#[derive(Default)]
pub(crate) struct Copies {
    /// Copies between host memory on both sides.
    host: Vec<CopyJob>,
    /// Copies with device memory on either side.
    device: Vec<CopyJob>,
}

impl Copies {
    /// Adds `job` (a request of `batch`).
    pub(crate) fn push(&mut self, batch: &BatchState, job: CopyJob) {
        if job.involves_device(batch) {
            self.device.push(job);
        } else {
            self.host.push(job);
        }
    }

    /// Runs the copies: the host ones spread over the current runtime's workers (inline when
    /// small), the device ones started on their devices' streams and completed from a task
    /// on the engine's `home` runtime.
    pub(crate) async fn run(self, batch: &Arc<BatchState>, devices: &Devices, home: &Home) {
        hostcopy::run(batch, self.host).await;
        devcopy::run(devices, home, batch, self.device);
    }
}
