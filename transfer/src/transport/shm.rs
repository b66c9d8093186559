//! A same-host peer's shared region, mapped (`crate::shm`) and copied with the CPU. A region
//! that does not map leaves the request to TCP.

use super::{Kind, Offer, Offered, Target, Transport};
use crate::copy::{Copies, CopyJob, CopyTarget};
use crate::shm::ShmMaps;

/// Copies into and out of same-host peers' shared memory.
pub(crate) struct Shm;

impl Transport for Shm {
    fn kind(&self) -> Kind {
        Kind::Shm
    }

    fn offer<'a>(&'a self, req: &Offered<'a>, copies: &mut Copies) -> Offer<'a> {
        let Target::Peer { region, .. } = req.target else {
            return Offer::Pass;
        };
        let seg = &req.request().segment;
        let Some(shm) = region.shm.as_ref().filter(|_| seg.is_same_host()) else {
            return Offer::Pass;
        };
        match seg.cache::<ShmMaps>().get(seg.name(), region, shm) {
            Ok(mapping) => {
                let (idx, target) = (req.idx, CopyTarget::Peer(mapping));
                copies.push(req.batch, CopyJob { idx, target });
                Offer::Collected
            }
            Err(e) => {
                tracing::debug!(segment = seg.name(), error = %e, "shared memory unusable; using TCP");
                Offer::Fallback
            }
        }
    }
}
