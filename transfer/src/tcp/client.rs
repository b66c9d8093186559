//! Initiator side of the TCP transport: a pool of peers, each with several lanes (TCP
//! connections, `lane`), connected lazily on the engine's home runtime. Requests larger
//! than the slice size are cut into slices spread over the lanes (a request with a device
//! buffer into staging chunks, `staged`); the number of frames in flight per lane is
//! bounded. A lane that failed is replaced by the next request that needs it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tokio::time::Instant;

use crate::auth::ClusterSecret;
use crate::auth::handshake;
use crate::device::Devices;
use crate::error::{Result, TransferError};
use crate::home::Home;
use crate::memory::SendPtr;
use crate::op::BatchState;
use crate::tcp::io::Conn;
use crate::tcp::lane::{ControlCall, DataSlice, Item, Lane};
use crate::tcp::staged;
use crate::tcp::status::handshake_error;
pub(crate) use crate::tcp::status::status_error;
use crate::wire::{Opcode, Status};

/// How long a failed connection attempt is remembered (requests fail at once meanwhile).
const FAILURE_MEMORY: Duration = Duration::from_secs(1);

/// Tuning of the TCP initiator (from `EngineConfig`).
#[derive(Debug, Clone)]
pub(crate) struct ClientConfig {
    /// The secret this side proves it holds (and checks the target holds).
    pub(crate) secret: ClusterSecret,
    /// This engine's segment name, declared in the handshake.
    pub(crate) local_name: Arc<str>,
    pub(crate) lanes: usize,
    pub(crate) slice_size: u64,
    pub(crate) max_inflight: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) io_timeout: Duration,
    /// Device memory: staging buffers and copy streams.
    pub(crate) devices: Arc<Devices>,
    /// Where connections are opened and their lanes' tasks run (`crate::home`).
    pub(crate) home: Home,
}

#[cfg(test)]
impl ClientConfig {
    /// A small initiator for unit tests: one lane, 1 MiB slices, one-second timeouts, no devices.
    pub(crate) fn for_tests() -> Self {
        Self {
            secret: ClusterSecret::from_bytes(b"0123456789abcdef-cluster").unwrap(),
            local_name: Arc::from("me"),
            lanes: 1,
            slice_size: 1 << 20,
            max_inflight: 4,
            connect_timeout: Duration::from_secs(1),
            io_timeout: Duration::from_secs(1),
            devices: Arc::new(Devices::new(None, None, (1 << 20, 4 << 20, 8 << 20), true)),
            home: Home::current(),
        }
    }
}

/// A peer: its lanes, connected lazily.
pub(crate) struct Peer {
    addr: SocketAddr,
    name: String,
    cfg: ClientConfig,
    slots: Vec<ArcSwapOption<Lane>>,
    connecting: Vec<tokio::sync::Mutex<()>>,
    cursor: Mutex<(usize, u64)>,
    last_failure: Mutex<Option<(Instant, TransferError)>>,
}

impl Peer {
    fn new(addr: SocketAddr, name: &str, cfg: ClientConfig) -> Self {
        let lanes = cfg.lanes.max(1);
        Self {
            addr,
            name: name.to_owned(),
            slots: (0..lanes).map(|_| ArcSwapOption::empty()).collect(),
            connecting: (0..lanes).map(|_| tokio::sync::Mutex::new(())).collect(),
            cursor: Mutex::new((0, 0)),
            last_failure: Mutex::new(None),
            cfg,
        }
    }

    /// Picks a lane for `bytes`: consecutive frames share a lane until a slice's worth of
    /// payload went to it, so small frames coalesce and large ones spread.
    fn pick(&self, bytes: u64) -> usize {
        let mut c = self.cursor.lock();
        if c.1 >= self.cfg.slice_size {
            c.0 = (c.0 + 1) % self.slots.len();
            c.1 = 0;
        }
        c.1 += bytes.max(1);
        c.0
    }

    /// Lane `i`, connected first if it is not up. Connecting runs on the engine's home
    /// runtime (`crate::home`), whichever runtime asks, and to its end there: the lane
    /// is in its slot even if the caller stopped waiting.
    async fn lane(self: &Arc<Self>, i: usize) -> Result<Arc<Lane>> {
        if let Some(l) = self.slots[i].load_full()
            && !l.is_dead()
        {
            return Ok(l);
        }
        let me = self.clone();
        // Boxed: connecting (a handshake) is rare, and inline it would make every request's
        // future as large as a handshake's, and the transport boxes that once per request.
        Box::pin(self.cfg.home.run(async move { me.establish(i).await })).await
    }

    /// The slow path of [`Peer::lane`]: one connection attempt per slot at a time.
    async fn establish(&self, i: usize) -> Result<Arc<Lane>> {
        let _guard = self.connecting[i].lock().await;
        if let Some(l) = self.slots[i].load_full()
            && !l.is_dead()
        {
            return Ok(l);
        }
        // A peer that just refused or timed out a connection fails at once for a moment, so
        // a batch of many requests to a dead host costs one connect timeout, not one each.
        if let Some((when, err)) = &*self.last_failure.lock()
            && when.elapsed() < FAILURE_MEMORY
        {
            return Err(err.clone());
        }
        match self.connect().await {
            Ok(lane) => {
                *self.last_failure.lock() = None;
                self.slots[i].store(Some(lane.clone()));
                Ok(lane)
            }
            Err(e) => {
                *self.last_failure.lock() = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    async fn connect(&self) -> Result<Arc<Lane>> {
        let mut stream =
            match tokio::time::timeout(self.cfg.connect_timeout, TcpStream::connect(self.addr))
                .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return Err(TransferError::unreachable(
                        &self.name,
                        format!("connect {}: {e}", self.addr),
                    ));
                }
                Err(_) => {
                    return Err(TransferError::unreachable(
                        &self.name,
                        format!(
                            "connect {} timed out after {:?}",
                            self.addr, self.cfg.connect_timeout
                        ),
                    ));
                }
            };
        let _ = stream.set_nodelay(true);
        if let Err(e) = handshake::initiate(
            &mut stream,
            &self.cfg.secret,
            &self.cfg.local_name,
            self.cfg.connect_timeout,
        )
        .await
        {
            return Err(handshake_error(&self.name, self.addr, e));
        }
        let conn = Conn::new(stream)
            .map_err(|e| TransferError::unreachable(&self.name, format!("socket setup: {e}")))?;
        Ok(Lane::start(
            conn,
            self.name.clone(),
            self.cfg.io_timeout,
            self.cfg.max_inflight,
            self.cfg.devices.clone(),
        ))
    }

    async fn permit(&self, lane: &Lane, deadline: Instant) -> Option<OwnedSemaphorePermit> {
        match tokio::time::timeout_at(deadline, lane.sem.clone().acquire_owned()).await {
            Ok(Ok(p)) => Some(p),
            _ => None,
        }
    }

    /// Cuts request `idx` of `batch` into slices and queues them on the lanes. A request
    /// whose local buffer is device memory is cut to staging chunks: each slice of a write
    /// is copied into a pinned buffer before it is queued (while the lanes send the slices
    /// before it), each slice of a read lands in one and is copied to the device.
    pub(crate) async fn send_request(
        self: &Arc<Self>,
        batch: &Arc<BatchState>,
        idx: usize,
        token: u64,
    ) {
        let req = &batch.requests[idx];
        let len = req.len as u64;
        let device = req.local.region().location().device();
        let mut slice = self.cfg.slice_size.max(1);
        if device.is_some() {
            slice = slice.min(self.cfg.devices.staging_chunk() as u64);
        }
        let n = len.div_ceil(slice);
        batch.set_slices(idx, n as u32);
        let base = SendPtr(req.local_ptr());
        for k in 0..n {
            if !batch.is_live(idx) {
                return;
            }
            let off = k * slice;
            let l = slice.min(len - off);
            let (local, staging, land) = match device {
                None => (base.add(off as usize), None, None),
                // Boxed, as connecting is: only device memory stages.
                Some(d) => match Box::pin(staged::stage(
                    &self.cfg.devices,
                    &self.name,
                    batch,
                    idx,
                    d,
                    base.add(off as usize).0 as u64,
                    l,
                ))
                .await
                {
                    Ok(Some((buf, land))) => (SendPtr(buf.ptr()), Some(buf), land),
                    Ok(None) => return, // the deadline passed: the batch reports TimedOut
                    Err(e) => {
                        batch.finish(idx, Err(e));
                        return;
                    }
                },
            };
            let lane = match tokio::time::timeout_at(batch.deadline, self.lane(self.pick(l))).await
            {
                Ok(Ok(lane)) => lane,
                Ok(Err(e)) => {
                    batch.finish(idx, Err(e));
                    return;
                }
                Err(_) => return, // the deadline passed while connecting: TimedOut
            };
            let Some(permit) = self.permit(&lane, batch.deadline).await else {
                return; // the deadline passed: the batch reports TimedOut
            };
            let item = Item::Data(DataSlice {
                op: req.op,
                local,
                remote_addr: req.remote_addr + off,
                len: l,
                token,
                completion: batch.completion(idx),
                staging,
                land,
                _permit: permit,
            });
            // A closed queue hands the item back; dropping it fails the request.
            let _ = lane.tx.send(item);
        }
    }

    /// Sends a control request and waits for its answer (status and payload).
    pub(crate) async fn call(
        self: &Arc<Self>,
        op: Opcode,
        payload: Vec<u8>,
        deadline: Instant,
    ) -> Result<(Status, Vec<u8>)> {
        let lane = self.lane(self.pick(payload.len() as u64)).await?;
        let permit = self.permit(&lane, deadline).await.ok_or_else(|| {
            TransferError::unreachable(&self.name, "no answer before the deadline")
        })?;
        let (tx, rx) = oneshot::channel();
        let item = Item::Control(ControlCall {
            op,
            payload: Bytes::from(payload),
            reply: tx,
            _permit: permit,
        });
        if let Err(mpsc::error::SendError(item)) = lane.tx.send(item) {
            item.fail(TransferError::unreachable(&self.name, "connection closed"));
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(TransferError::unreachable(&self.name, "connection closed")),
            Err(_) => Err(TransferError::unreachable(
                &self.name,
                "no answer before the deadline",
            )),
        }
    }

    fn close(&self, err: &TransferError) {
        for s in &self.slots {
            if let Some(l) = s.swap(None) {
                l.kill(err.clone());
            }
        }
    }

    fn idle(&self) -> bool {
        self.slots
            .iter()
            .all(|s| s.load().as_ref().is_none_or(|l| l.is_dead() || l.idle()))
    }
}

/// The pool of peers of one engine.
pub(crate) struct TcpClient {
    cfg: ClientConfig,
    peers: Mutex<HashMap<SocketAddr, Arc<Peer>>>,
}

impl TcpClient {
    pub(crate) fn new(cfg: ClientConfig) -> Self {
        Self {
            cfg,
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// The peer at `addr` (created on first use; `name` names it in errors).
    pub(crate) fn peer(&self, addr: SocketAddr, name: &str) -> Arc<Peer> {
        self.peers
            .lock()
            .entry(addr)
            .or_insert_with(|| Arc::new(Peer::new(addr, name, self.cfg.clone())))
            .clone()
    }

    /// Closes every connection, failing whatever is still in flight.
    pub(crate) fn close_all(&self) {
        let peers: Vec<_> = self.peers.lock().drain().map(|(_, p)| p).collect();
        for p in peers {
            p.close(&TransferError::Shutdown);
        }
    }

    /// Waits (up to `limit`) until no frame is in flight on any lane.
    pub(crate) async fn drain(&self, limit: Duration) {
        let until = Instant::now() + limit;
        loop {
            let busy = self.peers.lock().values().any(|p| !p.idle());
            if !busy || Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
