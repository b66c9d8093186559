//! One-sided RDMA (`crate::rdma`): a request whose region has a key on a device of the peer,
//! from a local buffer registered with this engine's devices (device memory the NICs cannot
//! reach is not: it goes over TCP). Queue pairs are connected over the peer's TCP control
//! connection.

use std::sync::Arc;

use super::{Kind, Offer, Offered, Target, Transport};
use crate::copy::Copies;
use crate::rdma::{RdmaPath, paths_for};
use crate::segment::{RegionDescriptor, SegmentDescriptor};
use crate::tcp::client::TcpClient;

/// RDMA WRITE and READ.
pub(crate) struct Rdma {
    rdma: Arc<crate::rdma::Transport>,
    /// The names of this engine's RDMA devices.
    devices: Vec<String>,
    /// Where the control connections come from.
    tcp: Arc<TcpClient>,
}

impl Rdma {
    /// RDMA over `rdma`'s devices, connected through `tcp`.
    pub(crate) fn new(rdma: Arc<crate::rdma::Transport>, tcp: Arc<TcpClient>) -> Self {
        Self {
            devices: rdma.device_names(),
            rdma,
            tcp,
        }
    }
}

/// The device pairs that reach `region` of `peer` from a local buffer registered with
/// `devices` (`registered`) or not.
fn paths(
    registered: bool,
    devices: &[String],
    peer: &SegmentDescriptor,
    region: &RegionDescriptor,
) -> Vec<RdmaPath> {
    // A local buffer the NICs cannot reach (device memory without GPUDirect) goes over TCP.
    let local: &[String] = if registered { devices } else { &[] };
    paths_for(local, &peer.endpoints.rdma, region)
}

impl Transport for Rdma {
    fn kind(&self) -> Kind {
        Kind::Rdma
    }

    fn offer<'a>(&'a self, req: &Offered<'a>, _: &mut Copies) -> Offer<'a> {
        let Target::Peer { desc, region } = req.target else {
            return Offer::Pass;
        };
        let r = req.request();
        let registered = !r.local.entry().rdma_mrs.is_empty();
        let paths = paths(registered, &self.devices, desc, region);
        if paths.is_empty() {
            return Offer::Pass;
        }
        let Ok(addr) = desc.tcp_addr() else {
            return Offer::Fallback;
        };
        let control = self.tcp.peer(addr, r.segment.name());
        let (batch, idx) = (req.batch, req.idx);
        Offer::Queue(Box::pin(async move {
            self.rdma.submit(batch, idx, paths, desc, control).await
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Location;
    use crate::segment::{DESCRIPTOR_VERSION, Endpoints, RdmaDeviceEndpoint, RdmaKey};

    #[test]
    fn only_a_buffer_registered_with_the_nics_takes_a_keyed_region_over_rdma() {
        let peer = SegmentDescriptor {
            version: DESCRIPTOR_VERSION,
            name: "p:1".into(),
            host_id: "h".into(),
            engine_id: 1,
            generation: 1,
            endpoints: Endpoints {
                tcp: Some("127.0.0.1:1".into()),
                rdma: vec![RdmaDeviceEndpoint {
                    device: "mlx5_0".into(),
                    lid: 1,
                    gid: None,
                }],
            },
            regions: vec![],
        };
        let mut region = RegionDescriptor {
            id: 1,
            addr: 4096,
            len: 4096,
            token: 9,
            shm: None,
            rdma: vec![RdmaKey {
                device: "mlx5_0".into(),
                rkey: 5,
            }],
            location: Location::Cuda(0),
            cuda_ipc: None,
        };
        let devices = vec!["mlx5_0".to_string()];
        assert_eq!(paths(true, &devices, &peer, &region).len(), 1);
        assert!(paths(false, &devices, &peer, &region).is_empty());
        region.rdma.clear();
        assert!(paths(true, &devices, &peer, &region).is_empty());
    }
}
