//! The engine: start-up (`builder`, which also picks its transports), registration
//! (`register`), opened segments, batch submission (each request checked, resolved against
//! its segment's descriptor and offered to the transports in preference order:
//! `crate::transport`), mapped reads and writes (`mapped`), notifications, graceful
//! shutdown.
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

pub use builder::EngineBuilder;

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
use crate::copy::Copies;
use crate::device::{Devices, StagingStats};
use crate::error::{RemoteRange, Result, TransferError};
use crate::home::Home;
use crate::metadata::Metadata;
use crate::notify::{Notification, Notifications};
use crate::op::{Batch, BatchState, Segment, TransferRequest};
use crate::registry::LocalRegions;
use crate::segment::{RegionDescriptor, SegmentDescriptor};
use crate::tcp::client::{TcpClient, status_error};
use crate::transport::{Kind, Offer, Offered, Target, Transport};
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
    /// Bytes per transport, by `Kind`.
    bytes: [AtomicU64; Kind::COUNT],
}

impl Counters {
    fn add(&self, kind: Kind, bytes: u64) {
        self.bytes[kind as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    fn bytes(&self, kind: Kind) -> u64 {
        self.bytes[kind as usize].load(Ordering::Relaxed)
    }
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
    /// The transports requests are offered to, in preference order; the last (TCP) is the
    /// fallback.
    transports: Vec<Box<dyn Transport>>,
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
            tcp_bytes: c.bytes(Kind::Tcp),
            shm_bytes: c.bytes(Kind::Shm),
            local_bytes: c.bytes(Kind::Local),
            rdma_bytes: c.bytes(Kind::Rdma),
            ipc_bytes: c.bytes(Kind::Ipc),
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
            self.dispatch(&state, idx, &mut copies).await;
        }
        copies
            .run(&state, &self.inner.devices, &self.inner.home)
            .await;
        Ok(Batch { state })
    }

    /// Routes request `idx`: resolves it (a request of 0 bytes completes at once, one that
    /// cannot be resolved fails at once) and offers it to the transports.
    async fn dispatch(&self, state: &Arc<BatchState>, idx: usize, copies: &mut Copies) {
        let req = &state.requests[idx];
        if req.len == 0 {
            state.finish(idx, Ok(()));
            return;
        }
        let seg = &req.segment;
        if seg.same(&self.inner.local_segment) {
            return self.route(state, idx, Target::Own, copies).await;
        }
        match self.resolve(seg, req.remote_addr, req.len as u64).await {
            Ok((desc, region)) => {
                let target = Target::Peer {
                    desc: &desc,
                    region: &region,
                };
                self.route(state, idx, target, copies).await;
            }
            Err(e) => {
                state.finish(idx, Err(e));
            }
        }
    }

    /// The descriptor of peer `seg` and its region that holds `[addr, +len)`: a stale
    /// descriptor is refetched first, and once more when the range is in none of its
    /// regions (the descriptor may predate the peer's registration of this range).
    async fn resolve(
        &self,
        seg: &Segment,
        addr: u64,
        len: u64,
    ) -> Result<(Arc<SegmentDescriptor>, RegionDescriptor)> {
        if seg.is_stale() {
            self.refresh(seg).await?;
        }
        let desc = seg.descriptor();
        let first = match desc.find_region(addr, len) {
            Ok(r) => {
                let region = r.clone();
                return Ok((desc, region));
            }
            Err(first) => first,
        };
        seg.mark_stale();
        self.refresh(seg).await?;
        let desc = seg.descriptor();
        let region = desc.find_region(addr, len).cloned().map_err(|_| first)?;
        Ok((desc, region))
    }

    /// Offers request `idx` to the transports in preference order (see `transport`): the
    /// first that does not pass it carries it, or hands it to the fallback (the last one)
    /// when it cannot, or fails it. Waits while a transport queues it.
    async fn route(
        &self,
        state: &Arc<BatchState>,
        idx: usize,
        target: Target<'_>,
        copies: &mut Copies,
    ) {
        let offered = Offered {
            batch: state,
            idx,
            target,
        };
        let len = state.requests[idx].len as u64;
        let transports = &self.inner.transports;
        let mut i = 0;
        while let Some(t) = transports.get(i) {
            match t.offer(&offered, copies) {
                Offer::Pass => i += 1,
                Offer::Fallback => i = (i + 1).max(transports.len() - 1),
                Offer::Failed(e) => {
                    state.finish(idx, Err(e));
                    return;
                }
                Offer::Collected => {
                    self.inner.counters.add(t.kind(), len);
                    state.carried_by(t.kind().as_str());
                    return;
                }
                Offer::Queue(queued) => {
                    self.inner.counters.add(t.kind(), len);
                    state.carried_by(t.kind().as_str());
                    queued.await;
                    return;
                }
            }
        }
        let seg = state.requests[idx].segment.name();
        state.finish(
            idx,
            Err(TransferError::unreachable(seg, "no transport reaches it")),
        );
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
