//! Building an engine: validate the configuration, open the transports, bind and serve,
//! publish the descriptor (and keep republishing it when a metadata service is used).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Counters, Inner, TransferEngine};
use crate::auth::ClusterSecret;
use crate::config::{EngineConfig, MetadataConfig};
use crate::device::{DeviceBackend, Devices};
use crate::error::{Result, TransferError};
use crate::home::Home;
use crate::metadata::{HttpMetadata, Metadata, P2pMetadata};
use crate::notify::Notifications;
use crate::op::{DescribeFn, Segment};
use crate::registry::LocalRegions;
use crate::segment::{DESCRIPTOR_VERSION, Endpoints, SegmentDescriptor, host_id};
use crate::tcp::client::{ClientConfig, TcpClient};
use crate::tcp::server::{ServerCtx, accept_loop};
use crate::transport::{Ipc, Local, Rdma, Shm, Tcp, Transport};

/// Builds a [`TransferEngine`].
#[derive(Default)]
pub struct EngineBuilder {
    config: EngineConfig,
    metadata: Option<Arc<dyn Metadata>>,
    secret: Option<ClusterSecret>,
    device_backend: Option<Arc<dyn DeviceBackend>>,
}

impl EngineBuilder {
    /// Uses `config` (replacing everything set so far).
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }

    /// Listens on `addr`.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.config.listen = addr;
        self
    }

    /// Uses this metadata service instead of the one `config.metadata` names (e.g. an
    /// `InMemoryMetadata` shared by engines of one process).
    pub fn metadata(mut self, metadata: Arc<dyn Metadata>) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// Authenticates peers with `secret` instead of the one `config.transfer_secret_file`
    /// (or its default) names: for processes that hold the secret already.
    pub fn secret(mut self, secret: ClusterSecret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// Reaches device memory through `backend` instead of the CUDA driver loaded on first
    /// need (another device runtime, or a test's).
    pub fn device_backend(mut self, backend: Arc<dyn DeviceBackend>) -> Self {
        self.device_backend = Some(backend);
        self
    }

    /// Validates the configuration, opens the transports, starts serving and publishes the
    /// descriptor. Must run inside a tokio runtime (the engine's tasks run on it).
    pub async fn build(self) -> Result<TransferEngine> {
        let config = self.config;
        config.validate()?;
        let secret = match self.secret {
            Some(s) => s,
            None => ClusterSecret::resolve(config.transfer_secret_file.as_deref())?,
        };
        let rdma = crate::rdma::start(&config)?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| TransferError::io(format!("bind {}", config.listen), &e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| TransferError::io("listener address", &e))?;
        let host = config
            .advertise_host
            .clone()
            .unwrap_or_else(|| advertise_ip(local_addr.ip()).to_string());
        let tcp_endpoint = join_host_port(&host, local_addr.port());
        let name = config
            .segment_name
            .clone()
            .unwrap_or_else(|| tcp_endpoint.clone());
        let engine_id = rand::random::<u64>() | 1;
        let host_id = host_id();
        let regions = LocalRegions::new(engine_id);
        let devices = Arc::new(Devices::new(
            self.device_backend,
            config.cuda_library.clone(),
            (
                config.device_staging_chunk,
                config.device_staging_per_peer,
                config.device_staging_total,
            ),
            config.device_ipc,
        ));
        let home = Home::current();
        let tcp = Arc::new(TcpClient::new(ClientConfig {
            devices: devices.clone(),
            secret: secret.clone(),
            local_name: Arc::from(name.as_str()),
            lanes: config.lanes_per_peer,
            slice_size: config.slice_size as u64,
            max_inflight: config.max_inflight_per_lane,
            connect_timeout: config.connect_timeout,
            io_timeout: config.io_timeout,
            home: home.clone(),
        }));
        let metadata: Arc<dyn Metadata> = match (self.metadata, &config.metadata) {
            (Some(m), _) => m,
            (None, MetadataConfig::P2p) => {
                Arc::new(P2pMetadata::new(tcp.clone(), config.request_timeout))
            }
            (
                None,
                MetadataConfig::Http {
                    url,
                    api_key,
                    ca_cert_file,
                },
            ) => Arc::new(HttpMetadata::for_engine(
                url,
                api_key.as_ref(),
                ca_cert_file.as_deref(),
                &secret,
                config.request_timeout,
            )?),
        };
        let transports = transports(&config, &regions, &devices, rdma.as_ref(), &tcp);
        let describe: DescribeFn = {
            let (name, host_id, regions) = (name.clone(), host_id.clone(), regions.clone());
            let rdma_endpoints = rdma.as_ref().map(|t| t.endpoints()).unwrap_or_default();
            Arc::new(move || SegmentDescriptor {
                version: DESCRIPTOR_VERSION,
                name: name.clone(),
                host_id: host_id.clone(),
                engine_id,
                generation: regions.generation(),
                endpoints: Endpoints {
                    tcp: Some(tcp_endpoint.clone()),
                    rdma: rdma_endpoints.clone(),
                },
                regions: regions.describe(),
            })
        };
        let (notify_tx, notify_rx) = mpsc::channel(config.notification_queue);
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let ctx = Arc::new(ServerCtx {
            regions: regions.clone(),
            describe: {
                let d = describe.clone();
                Box::new(move || d().to_json())
            },
            notifications: notify_tx.clone(),
            rdma: rdma.as_ref().map(|t| t.acceptor()),
            shutdown: shutdown.clone(),
            tracker: tracker.clone(),
            io_timeout: config.io_timeout,
            secret: secret.clone(),
            name: name.clone(),
            handshakes: crate::tcp::server::HandshakeLimits::new(),
            handshake_timeout: config.connect_timeout,
            devices: devices.clone(),
        });
        tokio::spawn(accept_loop(listener, ctx));
        metadata.publish(&describe()).await?;
        if metadata.kind() != "p2p" {
            tokio::spawn(publish_loop(
                regions.clone(),
                metadata.clone(),
                describe.clone(),
                shutdown.clone(),
            ));
        }
        tracing::info!(segment = %name, listen = %local_addr, metadata = metadata.kind(), rdma = rdma.is_some(), "transfer engine started");
        let segments = moka::future::Cache::builder()
            .time_to_live(config.descriptor_ttl)
            .max_capacity(65_536)
            .build();
        Ok(TransferEngine {
            inner: Arc::new(Inner {
                name,
                host_id,
                engine_id,
                local_addr,
                regions,
                metadata,
                tcp,
                segments,
                local_segment: Segment::local(describe),
                notify_tx,
                notifications: Notifications::new(notify_rx),
                shutdown,
                tracker,
                closing: AtomicBool::new(false),
                rdma,
                transports,
                counters: Counters::default(),
                secret,
                devices,
                home,
                config,
            }),
        })
    }
}

/// The transports of an engine with `config`, in preference order: copies within its own
/// segment, CUDA IPC and shared memory with same-host peers (where enabled), RDMA (where a
/// device is open), and TCP, which reaches every peer and is the fallback.
fn transports(
    config: &EngineConfig,
    regions: &Arc<LocalRegions>,
    devices: &Arc<Devices>,
    rdma: Option<&Arc<crate::rdma::Transport>>,
    tcp: &Arc<TcpClient>,
) -> Vec<Box<dyn Transport>> {
    let mut all: Vec<Box<dyn Transport>> = vec![Box::new(Local::new(regions.clone()))];
    if config.device_ipc {
        all.push(Box::new(Ipc::new(devices.clone())));
    }
    if config.shm {
        all.push(Box::new(Shm));
    }
    if let Some(rdma) = rdma {
        all.push(Box::new(Rdma::new(rdma.clone(), tcp.clone())));
    }
    all.push(Box::new(Tcp::new(tcp.clone())));
    all
}

/// Republishes the descriptor whenever registrations change (retrying failures each second).
async fn publish_loop(
    regions: Arc<LocalRegions>,
    metadata: Arc<dyn Metadata>,
    describe: DescribeFn,
    shutdown: CancellationToken,
) {
    let mut changes = regions.subscribe();
    let mut dirty = false;
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)), if dirty => {}
        }
        dirty = match metadata.publish(&describe()).await {
            Ok(()) => false,
            Err(e) => {
                tracing::warn!(error = %e, "publishing the segment descriptor failed; retrying");
                true
            }
        };
    }
}

/// The address to advertise for a listener bound to `ip`: itself, or for the unspecified
/// address this host's primary IP (found without sending anything), else loopback.
fn advertise_ip(ip: IpAddr) -> IpAddr {
    if !ip.is_unspecified() {
        return ip;
    }
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").and_then(|_| s.local_addr()))
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_formatting() {
        assert_eq!(join_host_port("10.0.0.1", 7), "10.0.0.1:7");
        assert_eq!(join_host_port("::1", 7), "[::1]:7");
        assert_eq!(
            advertise_ip(IpAddr::from([127, 0, 0, 1])),
            IpAddr::from([127, 0, 0, 1])
        );
        assert!(!advertise_ip(IpAddr::from([0, 0, 0, 0])).is_unspecified());
    }

    use crate::copy::Copies;
    use crate::device::Location;
    use crate::memory::MemoryRegion;
    use crate::op::{BatchState, TransferRequest};
    use crate::registry::LocalEntry;
    use crate::segment::{CudaIpcRegion, RegionDescriptor, ShmRegion};
    use crate::transport::{Kind, Offer, Offered, Target};

    fn shm_region(name: &str) -> ShmRegion {
        ShmRegion {
            pid: 1,
            fd: 3,
            name: name.into(),
            data_offset: 4096,
            dev: 1,
            ino: 1,
        }
    }

    fn region(shm: bool, device: bool) -> RegionDescriptor {
        RegionDescriptor {
            id: 1,
            addr: 4096,
            len: 4096,
            token: 9,
            shm: shm.then(|| shm_region("m")),
            rdma: vec![],
            location: if device {
                Location::Cuda(0)
            } else {
                Location::Host
            },
            cuda_ipc: device.then(|| CudaIpcRegion {
                handle: "00".repeat(64),
                offset: 0,
                device_uuid: "GPU-x".into(),
                control: shm_region("c"),
            }),
        }
    }

    /// Which of the transports of an engine with `shm` and `ipc` on or off takes a request
    /// into `region` of a peer on this host or not (into the engine's own segment where
    /// `region` is `None`): the first that does not pass it. (A region that does not map
    /// falls back to TCP, but it was taken by the transport that tried.)
    #[tokio::test]
    async fn requests_go_to_the_first_transport_that_takes_them() {
        let regions = LocalRegions::new(1);
        let buf = regions
            .insert(LocalEntry {
                id: regions.next_id(),
                token: 1,
                region: Arc::new(MemoryRegion::alloc(8192).unwrap()),
                rdma_keys: vec![],
                rdma_mrs: vec![],
            })
            .unwrap();
        let config = ClientConfig::for_tests();
        let devices = config.devices.clone();
        let tcp = Arc::new(TcpClient::new(config));
        let taker = |shm: bool, ipc: bool, same_host: bool, region: Option<RegionDescriptor>| {
            let config = EngineConfig {
                shm,
                device_ipc: ipc,
                ..EngineConfig::default()
            };
            let peer = SegmentDescriptor {
                version: DESCRIPTOR_VERSION,
                name: "p:1".into(),
                host_id: "h".into(),
                engine_id: 1,
                generation: 1,
                endpoints: Endpoints {
                    tcp: Some("127.0.0.1:1".into()),
                    rdma: vec![],
                },
                regions: region.iter().cloned().collect(),
            };
            let host = if same_host { "h" } else { "another" };
            let seg = Segment::remote("p:1", peer.clone(), host);
            let addr = region.as_ref().map_or(buf.addr(), |r| r.addr);
            let request = TransferRequest::write(&buf, 0, &seg, addr, 8);
            let batch = BatchState::new(vec![request], Duration::from_secs(1));
            let target = match &region {
                Some(region) => Target::Peer {
                    desc: &peer,
                    region,
                },
                None => Target::Own,
            };
            let offered = Offered {
                batch: &batch,
                idx: 0,
                target,
            };
            let mut copies = Copies::default();
            transports(&config, &regions, &devices, None, &tcp)
                .iter()
                .find(|t| !matches!(t.offer(&offered, &mut copies), Offer::Pass))
                .map(|t| t.kind())
        };
        let (dev, shared, plain) = (
            Some(region(false, true)),
            Some(region(true, false)),
            Some(region(false, false)),
        );
        // The engine's own segment: local copies.
        assert_eq!(taker(true, true, true, None), Some(Kind::Local));
        // A device region: CUDA IPC on one host; with IPC off, or on another host, TCP
        // (device regions have no shared memory).
        assert_eq!(taker(true, true, true, dev.clone()), Some(Kind::Ipc));
        assert_eq!(taker(true, false, true, dev.clone()), Some(Kind::Tcp));
        assert_eq!(taker(true, true, false, dev), Some(Kind::Tcp));
        // A shared region: shared memory on one host, where enabled; else TCP.
        assert_eq!(taker(true, true, true, shared.clone()), Some(Kind::Shm));
        assert_eq!(taker(false, true, true, shared.clone()), Some(Kind::Tcp));
        assert_eq!(taker(true, true, false, shared), Some(Kind::Tcp));
        assert_eq!(taker(true, true, true, plain), Some(Kind::Tcp));
    }
}
