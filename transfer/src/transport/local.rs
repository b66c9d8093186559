//! Requests into the engine's own segment: memory copies, checked against its registration
//! table (host memory spread over threads, device memory on its streams).

use std::sync::Arc;

use super::{Kind, Offer, Offered, Target, Transport};
use crate::copy::{Copies, CopyJob, CopyTarget};
use crate::registry::LocalRegions;

/// Copies within the engine's own segment.
pub(crate) struct Local {
    regions: Arc<LocalRegions>,
}

impl Local {
    /// Copies into and out of the regions of `regions`.
    pub(crate) fn new(regions: Arc<LocalRegions>) -> Self {
        Self { regions }
    }
}

impl Transport for Local {
    fn kind(&self) -> Kind {
        Kind::Local
    }

    fn offer<'a>(&'a self, req: &Offered<'a>, copies: &mut Copies) -> Offer<'a> {
        let Target::Own = req.target else {
            return Offer::Pass;
        };
        let r = req.request();
        let len = r.len as u64;
        match CopyTarget::local(&self.regions, r.segment.name(), r.remote_addr, len) {
            Ok(target) => {
                let idx = req.idx;
                copies.push(req.batch, CopyJob { idx, target });
                Offer::Collected
            }
            Err(e) => Offer::Failed(e),
        }
    }
}
