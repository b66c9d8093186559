//! The engine: registration (`register`), segments, batch submission and routing
//! (`route`), notifications, graceful shutdown.
//!
//! ```no_run
//! # async fn demo() -> transfer::Result<()> {
//! use transfer::{EngineConfig, TransferEngine, TransferRequest};
//! let engine = TransferEngine::new(EngineConfig::listening_on("127.0.0.1:0".parse().unwrap())).await?;
//! let local = engine.alloc(1 << 20)?;                 // registered, page aligned
//! local.write_at(0, b"hello")?;
//! let peer = engine.open_segment("10.0.0.2:7000").await?;  // fetch the peer's descriptor
//! let region = peer.regions()[0].clone();
//! let batch = engine.submit(vec![TransferRequest::write(&local, 0, &peer, region.addr, 5)]).await?;
//! batch.wait().await?;                                // acknowledged: in the peer's memory
//! engine.notify(&peer, b"5 bytes at region 0").await?;
//! # Ok(()) }
//! ```

mod builder;
mod mapped;
mod register;
mod route;

pub use builder::EngineBuilder;
use route::{Route, route};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::ClusterSecret;
use crate::config::EngineConfig;
use crate::copy::{Copies, CopyJob, CopyTarget};
use crate::device::{Devices, StagingStats};
use crate::error::{RemoteRange, Result, TransferError};
use crate::home::Home;
use crate::ipc::IpcMaps;
use crate::metadata::Metadata;
use crate::notify::{Notification, Notifications};
use crate::op::{Batch, BatchState, Segment, TransferRequest};
use crate::registry::LocalRegions;
use crate::segment::SegmentDescriptor;
use crate::shm::ShmMaps;
use crate::tcp::client::{TcpClient, status_error};
use crate::wire::{MAX_CONTROL_LEN, Opcode, Status};

/// Which transports an engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveTransports {
    /// Always on (data path to remote hosts, control path, peer-to-peer metadata).
    pub tcp: bool,
    /// Shared memory with same-host peers.
    pub shm: bool,
    /// RDMA (needs the `rdma` feature and a usable device).
    pub rdma: bool,
}

/// Requests and bytes this engine routed to each transport (as initiator), since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Requests submitted.
    pub requests: u64,
    /// Bytes sent or fetched over TCP.
    pub tcp_bytes: u64,
    /// Bytes copied through shared memory with same-host peers.
    pub shm_bytes: u64,
    /// Bytes copied within this engine's own segment.
    pub local_bytes: u64,
    /// Bytes moved over RDMA.
    pub rdma_bytes: u64,
    /// Bytes copied into or out of same-host peers' device memory through CUDA IPC.
    pub ipc_bytes: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    tcp: AtomicU64,
    shm: AtomicU64,
    local: AtomicU64,
    rdma: AtomicU64,
    ipc: AtomicU64,
}

struct Inner {
    config: EngineConfig,
    name: String,
    host_id: String,
    engine_id: u64,
    local_addr: SocketAddr,
    regions: Arc<LocalRegions>,
    metadata: Arc<dyn Metadata>,
    tcp: Arc<TcpClient>,
    segments: moka::future::Cache<String, Segment>,
    local_segment: Segment,
    notify_tx: mpsc::Sender<Notification>,
    notifications: Notifications,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    closing: AtomicBool,
    rdma: Option<Arc<crate::rdma::Transport>>,
    rdma_devices: Vec<String>,
    counters: Counters,
    secret: ClusterSecret,
    devices: Arc<Devices>,
    /// The runtime the engine was built on (`crate::home`).
    home: Home,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.tcp.close_all();
    }
}

/// Moves bytes between registered memory of this process and of peers. Cheap to clone
/// (clones share the engine); dropping the last clone stops it (use
/// [`TransferEngine::shutdown`] to drain first).
#[derive(Clone)]
pub struct TransferEngine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("segment", &self.inner.name)
            .field("listen", &self.inner.local_addr)
            .field("transports", &self.transports())
            .finish()
    }
}

impl TransferEngine {
    /// A builder (default configuration, peer-to-peer metadata).
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Builds an engine from `config`.
    pub async fn new(config: EngineConfig) -> Result<Self> {
        Self::builder().config(config).build().await
    }

    /// This engine's segment name (what peers pass to `open_segment`).
    pub fn segment_name(&self) -> &str {
        &self.inner.name
    }

    /// The bound TCP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// The configuration in use.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The transports this engine runs.
    pub fn transports(&self) -> ActiveTransports {
        ActiveTransports {
            tcp: true,
            shm: self.inner.config.shm,
            rdma: self.inner.rdma.is_some(),
        }
    }

    /// Requests and bytes routed per transport so far.
    pub fn stats(&self) -> TransferStats {
        let c = &self.inner.counters;
        TransferStats {
            requests: c.requests.load(Ordering::Relaxed),
            tcp_bytes: c.tcp.load(Ordering::Relaxed),
            shm_bytes: c.shm.load(Ordering::Relaxed),
            local_bytes: c.local.load(Ordering::Relaxed),
            rdma_bytes: c.rdma.load(Ordering::Relaxed),
            ipc_bytes: c.ipc.load(Ordering::Relaxed),
        }
    }

    /// The pinned staging pool device memory passes through on the TCP path (`None` until
    /// device memory was first used).
    pub fn staging_stats(&self) -> Option<StagingStats> {
        self.inner.devices.loaded().map(|c| c.staging.stats())
    }

    /// This engine's current descriptor.
    pub fn descriptor(&self) -> SegmentDescriptor {
        (*self.inner.local_segment.descriptor()).clone()
    }

    /// The cluster secret this engine authenticates peers with (e.g. to derive the store
    /// plane's key from it: [`ClusterSecret::store_api_key`]).
    pub fn secret(&self) -> &ClusterSecret {
        &self.inner.secret
    }

    /// Host identity used to decide when shared memory can be used.
    pub fn host_id(&self) -> &str {
        &self.inner.host_id
    }

    fn check_open(&self) -> Result<()> {
        if self.inner.closing.load(Ordering::Acquire) {
            Err(TransferError::Shutdown)
        } else {
            Ok(())
        }
    }

    /// Publishes the current descriptor to the metadata service now (a no-op with
    /// peer-to-peer metadata, where peers always get the live descriptor).
    pub async fn publish(&self) -> Result<()> {
        self.check_open()?;
        let (metadata, desc) = (self.inner.metadata.clone(), self.descriptor());
        self.inner
            .home
            .run(async move { metadata.publish(&desc).await })
            .await
    }

    /// The runtime this engine was built on: its connections are opened there and their
    /// tasks run there, whichever runtime submits transfers (one that runs only during its
    /// calls, such as a thread's own current-thread runtime, included). An engine built on
    /// a current-thread runtime opens them in place when called from another runtime.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        self.inner.home.handle()
    }

    /// Starts `task` where this engine runs its own background work: on
    /// [`TransferEngine::runtime`], or on the caller's runtime when the engine's is a
    /// current-thread runtime and the caller runs on another. For work that outlives a call
    /// made from a runtime that runs only during its calls.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.inner.home.spawn(task);
    }

    /// Number of regions currently registered.
    pub fn registered_regions(&self) -> usize {
        self.inner.regions.count()
    }

    /// This engine's own segment (what [`TransferEngine::open_segment`] answers for its own
    /// name, without the lookup).
    pub fn local_segment(&self) -> Segment {
        self.inner.local_segment.clone()
    }

    /// Opens segment `name`: this engine's own, a cached descriptor, or one fetched from
    /// the metadata service (from the peer itself with peer-to-peer metadata).
    pub async fn open_segment(&self, name: &str) -> Result<Segment> {
        self.check_open()?;
        if name == self.inner.name {
            return Ok(self.inner.local_segment.clone());
        }
        if let Some(seg) = self.inner.segments.get(name).await {
            if !seg.is_stale() {
                return Ok(seg);
            }
            return match self.refresh(&seg).await {
                Ok(()) => Ok(seg),
                Err(e) => {
                    self.inner.segments.invalidate(name).await;
                    Err(e)
                }
            };
        }
        let seg = Segment::remote(name, self.fetch(name).await?, &self.inner.host_id);
        self.inner
            .segments
            .insert(name.to_owned(), seg.clone())
            .await;
        Ok(seg)
    }

    /// Forgets the cached descriptor of `name` (the next `open_segment` fetches it again).
    pub async fn close_segment(&self, name: &str) {
        self.inner.segments.invalidate(name).await;
    }

    async fn fetch(&self, name: &str) -> Result<SegmentDescriptor> {
        // At home: a metadata client's pooled connections must not live on a caller's
        // runtime (`crate::home`).
        let (metadata, owned) = (self.inner.metadata.clone(), name.to_owned());
        self.inner
            .home
            .run(async move { metadata.fetch(&owned).await })
            .await?
            .ok_or_else(|| TransferError::UnknownSegment {
                segment: name.to_owned(),
                reason: format!(
                    "no descriptor published ({} metadata)",
                    self.inner.metadata.kind()
                ),
            })
    }

    async fn refresh(&self, seg: &Segment) -> Result<()> {
        let _guard = seg.state().refresh.lock().await;
        if !seg.is_stale() {
            return Ok(());
        }
        let desc = self.fetch(seg.name()).await?;
        seg.update(desc);
        Ok(())
    }

    fn check_local(&self, req: &TransferRequest) -> Result<()> {
        if req.local.engine_id() != Some(self.inner.engine_id) {
            return Err(TransferError::invalid(format!(
                "local buffer {} is not registered with this engine",
                req.local.id()
            )));
        }
        if req
            .local_offset
            .checked_add(req.len)
            .is_none_or(|end| end > req.local.len())
        {
            return Err(TransferError::invalid(format!(
                "local range [{}, +{}) is outside the {}-byte buffer",
                req.local_offset,
                req.len,
                req.local.len()
            )));
        }
        Ok(())
    }

    /// Submits a batch with the configured request timeout; see
    /// [`TransferEngine::submit_with_timeout`].
    pub async fn submit(&self, requests: Vec<TransferRequest>) -> Result<Batch> {
        self.submit_with_timeout(requests, self.inner.config.request_timeout)
            .await
    }

    /// Submits a batch: every request is checked (local range inside its buffer, buffer
    /// registered here; an error there rejects the whole batch), resolved against its
    /// segment's descriptor (refreshed once if the range is not in it) and handed to its
    /// transport. Returns once every request is queued (waiting for in-flight room when the
    /// lanes are full); each request then completes, fails or times out after `timeout`.
    pub async fn submit_with_timeout(
        &self,
        requests: Vec<TransferRequest>,
        timeout: Duration,
    ) -> Result<Batch> {
        self.check_open()?;
        for r in &requests {
            self.check_local(r)?;
        }
        self.inner
            .counters
            .requests
            .fetch_add(requests.len() as u64, Ordering::Relaxed);
        let state = BatchState::new(requests, timeout);
        let mut copies = Copies::default();
        for idx in 0..state.requests.len() {
            if let Some(job) = self.dispatch(&state, idx).await {
                copies.push(&state, job);
            }
        }
        copies
            .run(&state, &self.inner.devices, &self.inner.home)
            .await;
        Ok(Batch { state })
    }

    /// Routes request `idx`: returns a copy job for shared-memory and local requests, sends
    /// the others, completes it at once with an error if it cannot be resolved.
    async fn dispatch(&self, state: &Arc<BatchState>, idx: usize) -> Option<CopyJob> {
        let req = &state.requests[idx];
        if req.len == 0 {
            state.finish(idx, Ok(()));
            return None;
        }
        let seg = &req.segment;
        let len = req.len as u64;
        let c = &self.inner.counters;
        if seg.same(&self.inner.local_segment) {
            return match CopyTarget::local(&self.inner.regions, seg.name(), req.remote_addr, len) {
                Ok(target) => {
                    c.local.fetch_add(len, Ordering::Relaxed);
                    Some(CopyJob { idx, target })
                }
                Err(e) => {
                    state.finish(idx, Err(e));
                    None
                }
            };
        }
        if seg.is_stale()
            && let Err(e) = self.refresh(seg).await
        {
            state.finish(idx, Err(e));
            return None;
        }
        let mut desc = seg.descriptor();
        let region = match desc.find_region(req.remote_addr, len) {
            Ok(r) => r.clone(),
            Err(first) => {
                // The descriptor may predate the peer's registration of this range.
                seg.mark_stale();
                let found = match self.refresh(seg).await {
                    Ok(()) => {
                        desc = seg.descriptor();
                        desc.find_region(req.remote_addr, len)
                            .cloned()
                            .map_err(|_| first)
                    }
                    Err(e) => Err(e),
                };
                match found {
                    Ok(r) => r,
                    Err(e) => {
                        state.finish(idx, Err(e));
                        return None;
                    }
                }
            }
        };
        // A local buffer the NICs cannot reach (device memory without GPUDirect) goes over TCP.
        let local_rdma: &[String] = if req.local.entry().rdma_mrs.is_empty() {
            &[]
        } else {
            &self.inner.rdma_devices
        };
        match route(
            self.inner.config.device_ipc,
            self.inner.config.shm,
            seg.is_same_host(),
            &region,
            local_rdma,
            &desc,
        ) {
            Route::Ipc(ipc) => {
                let opened = self
                    .inner
                    .devices
                    .ctx()
                    .and_then(|ctx| seg.cache::<IpcMaps>().get(ctx, seg.name(), &region, &ipc));
                match opened {
                    Ok(mapping) => {
                        c.ipc.fetch_add(len, Ordering::Relaxed);
                        return Some(CopyJob {
                            idx,
                            target: CopyTarget::Ipc(mapping),
                        });
                    }
                    Err(e) => {
                        tracing::debug!(segment = seg.name(), error = %e, "CUDA IPC unusable; staging over TCP");
                    }
                }
            }
            Route::Shm(shm) => match seg.cache::<ShmMaps>().get(seg.name(), &region, &shm) {
                Ok(mapping) => {
                    c.shm.fetch_add(len, Ordering::Relaxed);
                    return Some(CopyJob {
                        idx,
                        target: CopyTarget::Peer(mapping),
                    });
                }
                Err(e) => {
                    tracing::debug!(segment = seg.name(), error = %e, "shared memory unusable; using TCP");
                }
            },
            Route::Rdma(paths) => {
                if let (Some(t), Ok(addr)) = (&self.inner.rdma, desc.tcp_addr()) {
                    let control = self.inner.tcp.peer(addr, seg.name());
                    c.rdma.fetch_add(len, Ordering::Relaxed);
                    t.submit(state, idx, paths, &desc, control).await;
                    return None;
                }
            }
            Route::Tcp => {}
        }
        match desc.tcp_addr() {
            Ok(addr) => {
                c.tcp.fetch_add(len, Ordering::Relaxed);
                self.inner
                    .tcp
                    .peer(addr, seg.name())
                    .send_request(state, idx, region.token)
                    .await
            }
            Err(e) => {
                state.finish(idx, Err(e));
            }
        }
        None
    }

    /// Submits one request and waits for it.
    pub async fn transfer(&self, request: TransferRequest) -> Result<()> {
        self.submit(vec![request]).await?.wait().await
    }

    /// Sends `message` to `segment`'s notification queue. Call it after the writes it
    /// announces completed: the peer then sees the message only once the bytes are in its
    /// memory. `Busy` when the peer's queue is full.
    pub async fn notify(&self, segment: &Segment, message: &[u8]) -> Result<()> {
        self.check_open()?;
        if message.len() as u64 > MAX_CONTROL_LEN {
            return Err(TransferError::invalid(format!(
                "notification of {} bytes exceeds the {MAX_CONTROL_LEN}-byte limit",
                message.len()
            )));
        }
        if segment.same(&self.inner.local_segment) {
            let n = Notification {
                from: self.inner.name.clone(),
                peer_addr: None,
                message: message.to_vec(),
            };
            return self
                .inner
                .notify_tx
                .try_send(n)
                .map_err(|_| TransferError::Busy {
                    segment: self.inner.name.clone(),
                    reason: "notification queue is full".into(),
                });
        }
        let addr = segment.descriptor().tcp_addr()?;
        let peer = self.inner.tcp.peer(addr, segment.name());
        let deadline = Instant::now() + self.inner.config.request_timeout;
        let (status, answer) = peer
            .call(Opcode::Notify, message.to_vec(), deadline)
            .await?;
        if status == Status::Ok {
            Ok(())
        } else {
            Err(status_error(
                status,
                segment.name(),
                RemoteRange::new(0, 0),
                &String::from_utf8_lossy(&answer),
            ))
        }
    }

    /// Notifications peers sent to this engine.
    pub fn notifications(&self) -> Notifications {
        self.inner.notifications.clone()
    }

    /// Graceful shutdown: refuses new work, waits (up to the drain timeout) for this
    /// engine's in-flight requests, stops accepting, lets the connections finish the
    /// requests they already received, closes everything and unpublishes the descriptor.
    pub async fn shutdown(&self) {
        if self.inner.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        let drain = self.inner.config.drain_timeout;
        self.inner.tcp.drain(drain).await;
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        if tokio::time::timeout(drain, self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(segment = %self.inner.name, "connections still busy after the drain timeout");
        }
        self.inner.tcp.close_all();
        if let Err(e) = self.inner.metadata.remove(&self.inner.name).await {
            tracing::warn!(error = %e, "unpublishing the segment descriptor failed");
        }
    }
}
