//! A same-host peer's device region, opened through CUDA IPC (`crate::ipc`) and copied
//! device to device on this process's streams. A handle that does not open leaves the
//! request to TCP, which stages the region through the peer.

use std::sync::Arc;

use super::{Kind, Offer, Offered, Target, Transport};
use crate::copy::{Copies, CopyJob, CopyTarget};
use crate::device::Devices;
use crate::ipc::IpcMaps;

/// Copies into and out of same-host peers' device memory.
pub(crate) struct Ipc {
    devices: Arc<Devices>,
}

impl Ipc {
    /// Opens peers' handles with `devices`.
    pub(crate) fn new(devices: Arc<Devices>) -> Self {
        Self { devices }
    }
}

impl Transport for Ipc {
    fn kind(&self) -> Kind {
        Kind::Ipc
    }

    fn offer<'a>(&'a self, req: &Offered<'a>, copies: &mut Copies) -> Offer<'a> {
        let Target::Peer { region, .. } = req.target else {
            return Offer::Pass;
        };
        let seg = &req.request().segment;
        let Some(ipc) = region.cuda_ipc.as_ref().filter(|_| seg.is_same_host()) else {
            return Offer::Pass;
        };
        let opened = self
            .devices
            .ctx()
            .and_then(|ctx| seg.cache::<IpcMaps>().get(ctx, seg.name(), region, ipc));
        match opened {
            Ok(mapping) => {
                let (idx, target) = (req.idx, CopyTarget::Ipc(mapping));
                copies.push(req.batch, CopyJob { idx, target });
                Offer::Collected
            }
            Err(e) => {
                tracing::debug!(segment = seg.name(), error = %e, "CUDA IPC unusable; staging over TCP");
                Offer::Fallback
            }
        }
    }
}
