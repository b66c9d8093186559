//! Which transport a request takes.

use crate::rdma::{RdmaPath, paths_for};
use crate::segment::{CudaIpcRegion, RegionDescriptor, SegmentDescriptor, ShmRegion};

/// How one request travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    Ipc(CudaIpcRegion),
    Shm(ShmRegion),
    Rdma(Vec<RdmaPath>),
    Tcp,
}

/// Picks the transport for a request into `region` of a peer: CUDA IPC when both run on
/// one host and the region is exported device memory, shared memory when the region is
/// shared, else RDMA when both have a device with a key for the region (`local_rdma` lists
/// the devices the local buffer is registered with), else TCP.
pub(crate) fn route(
    ipc_enabled: bool,
    shm_enabled: bool,
    same_host: bool,
    region: &RegionDescriptor,
    local_rdma: &[String],
    peer: &SegmentDescriptor,
) -> Route {
    if ipc_enabled
        && same_host
        && let Some(ipc) = &region.cuda_ipc
    {
        return Route::Ipc(ipc.clone());
    }
    if shm_enabled
        && same_host
        && let Some(shm) = &region.shm
    {
        return Route::Shm(shm.clone());
    }
    let paths = paths_for(local_rdma, &peer.endpoints.rdma, region);
    if !paths.is_empty() {
        return Route::Rdma(paths);
    }
    Route::Tcp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Location;
    use crate::segment::{DESCRIPTOR_VERSION, Endpoints};
    use crate::segment::{RdmaDeviceEndpoint, RdmaKey};

    fn region(shm: bool, keys: bool) -> RegionDescriptor {
        RegionDescriptor {
            id: 1,
            addr: 4096,
            len: 4096,
            token: 9,
            shm: shm.then(|| ShmRegion {
                pid: 1,
                fd: 3,
                name: "m".into(),
                data_offset: 4096,
                dev: 0,
                ino: 0,
            }),
            rdma: if keys {
                vec![RdmaKey {
                    device: "mlx5_0".into(),
                    rkey: 5,
                }]
            } else {
                vec![]
            },
            location: Location::Host,
            cuda_ipc: None,
        }
    }

    fn peer(rdma: bool) -> SegmentDescriptor {
        SegmentDescriptor {
            version: DESCRIPTOR_VERSION,
            name: "p:1".into(),
            host_id: "h".into(),
            engine_id: 1,
            generation: 1,
            endpoints: Endpoints {
                tcp: Some("127.0.0.1:1".into()),
                rdma: if rdma {
                    vec![RdmaDeviceEndpoint {
                        device: "mlx5_0".into(),
                        lid: 1,
                        gid: None,
                    }]
                } else {
                    vec![]
                },
            },
            regions: vec![],
        }
    }

    #[test]
    fn device_regions_route_through_ipc_on_one_host_else_over_the_network() {
        let local = vec!["mlx5_0".to_string()];
        let mut dev = region(false, false);
        dev.location = Location::Cuda(0);
        dev.cuda_ipc = Some(CudaIpcRegion {
            handle: "00".repeat(64),
            offset: 0,
            device_uuid: "GPU-x".into(),
            control: ShmRegion {
                pid: 1,
                fd: 3,
                name: "c".into(),
                data_offset: 4096,
                dev: 1,
                ino: 1,
            },
        });
        assert!(matches!(
            route(true, true, true, &dev, &local, &peer(true)),
            Route::Ipc(_)
        ));
        // IPC off, or another host: no shared memory for device regions; TCP (no RDMA keys:
        // the NIC cannot reach this device memory).
        assert_eq!(
            route(false, true, true, &dev, &local, &peer(true)),
            Route::Tcp
        );
        assert_eq!(
            route(true, true, false, &dev, &local, &peer(true)),
            Route::Tcp
        );
        // With GPUDirect the region has keys: RDMA, but only for a local buffer registered
        // with the NICs.
        dev.rdma = region(false, true).rdma;
        assert!(matches!(
            route(true, true, false, &dev, &local, &peer(true)),
            Route::Rdma(_)
        ));
        assert_eq!(route(true, true, false, &dev, &[], &peer(true)), Route::Tcp);
    }

    #[test]
    fn routing_prefers_shm_then_rdma_then_tcp() {
        let local = vec!["mlx5_0".to_string()];
        assert!(matches!(
            route(true, true, true, &region(true, true), &local, &peer(true)),
            Route::Shm(_)
        ));
        assert!(matches!(
            route(true, false, true, &region(true, true), &local, &peer(true)),
            Route::Rdma(_)
        ));
        assert!(matches!(
            route(true, true, false, &region(true, true), &local, &peer(true)),
            Route::Rdma(_)
        ));
        assert_eq!(
            route(true, true, false, &region(true, true), &[], &peer(true)),
            Route::Tcp
        );
        assert_eq!(
            route(true, true, false, &region(true, false), &local, &peer(true)),
            Route::Tcp
        );
        assert_eq!(
            route(
                true,
                true,
                true,
                &region(false, false),
                &local,
                &peer(false)
            ),
            Route::Tcp
        );
    }
}
