//! Initiator side of the TCP transport: a pool of peers, each with several lanes (TCP
//! connections). A lane has a writer task (gathers queued frames into one `sendmsg`, payload
//! straight from registered memory) and a reader task (matches responses in order, read
//! data straight into registered memory). Requests larger than the slice size are cut into
//! slices spread over the lanes; the number of frames in flight per lane is bounded.
//!
//! Failure: any I/O error, end of stream, protocol violation, or a lane with requests
//! outstanding and no progress for the I/O timeout, kills the lane: its socket is shut
//! down and every frame queued or in flight on it fails with the cause. The next request
//! reconnects.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::auth::ClusterSecret;
use crate::auth::handshake;
use crate::device::Devices;
use crate::device::staging::StagingBuf;
use crate::error::{RemoteRange, Result, TransferError};
use crate::home::Home;
use crate::memory::SendPtr;
use crate::op::{Abort, BatchState, Completion, Landing, Op};
use crate::tcp::io::{Conn, InBuf, IoPiece, read_payload, read_small};
use crate::tcp::staged;
use crate::tcp::status::handshake_error;
pub(crate) use crate::tcp::status::status_error;
use crate::wire::{
    MAX_CONTROL_LEN, MAX_DESCRIPTOR_LEN, Opcode, REQUEST_HEADER_LEN, RESPONSE_HEADER_LEN,
    RequestHeader, ResponseHeader, Status,
};

/// Read-ahead buffer size of a lane reader.
const INBUF_LEN: usize = 64 << 10;
/// Frames gathered into one `sendmsg` at most.
const MAX_GATHER: usize = 256;
/// How long a failed connection attempt is remembered (requests fail at once meanwhile).
const FAILURE_MEMORY: Duration = Duration::from_secs(1);
/// Reads at least this large skip the read-ahead buffer entirely.
const DIRECT_READ_MIN: u64 = 32 << 10;

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

/// One data frame: a slice of a request.
pub(crate) struct DataSlice {
    op: Op,
    /// Where the payload is sent from or lands: the request's local buffer, or the staging
    /// buffer when the local buffer is device memory.
    local: SendPtr,
    remote_addr: u64,
    len: u64,
    token: u64,
    completion: Completion,
    /// The pinned buffer a device-memory slice passes through (a write's goes with its
    /// frame to the writer, which releases it once sent).
    staging: Option<StagingBuf>,
    /// A read into device memory: the device and address its staged bytes go to.
    land: Option<(u32, u64)>,
    _permit: OwnedSemaphorePermit,
}

type ControlReply = oneshot::Sender<Result<(Status, Vec<u8>)>>;

/// A control request (descriptor, notification, RDMA handshake).
pub(crate) struct ControlCall {
    op: Opcode,
    payload: Bytes,
    reply: ControlReply,
    _permit: OwnedSemaphorePermit,
}

enum Item {
    Data(DataSlice),
    Control(ControlCall),
}

impl Item {
    fn fail(self, err: TransferError) {
        match self {
            Item::Data(s) => s.completion.complete(Err(err)),
            Item::Control(c) => {
                let _ = c.reply.send(Err(err));
            }
        }
    }
}

/// One TCP connection to a peer.
struct Lane {
    conn: Conn,
    tx: mpsc::UnboundedSender<Item>,
    sem: Arc<Semaphore>,
    dead: AtomicBool,
    closed: Notify,
    pending: Mutex<VecDeque<(u64, Item)>>,
    peer: String,
    io_timeout: Duration,
    max_inflight: usize,
    devices: Arc<Devices>,
}

impl Lane {
    /// Dead: killed, or its tasks are gone (e.g. the runtime that ran them shut down).
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.tx.is_closed()
    }

    /// Kills the lane: shuts the socket, fails everything in flight with `err`.
    fn kill(&self, err: TransferError) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(peer = %self.peer, error = %err, "tcp lane closed");
        self.conn.shutdown();
        self.closed.notify_one();
        let drained: Vec<_> = self.pending.lock().drain(..).collect();
        for (_, item) in drained {
            item.fail(err.clone());
        }
    }

    fn idle(&self) -> bool {
        self.sem.available_permits() == self.max_inflight
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
        self.cfg
            .home
            .run(async move { me.establish(i).await })
            .await
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
        let (tx, rx) = mpsc::unbounded_channel();
        let lane = Arc::new(Lane {
            conn,
            tx,
            sem: Arc::new(Semaphore::new(self.cfg.max_inflight)),
            dead: AtomicBool::new(false),
            closed: Notify::new(),
            pending: Mutex::new(VecDeque::new()),
            peer: self.name.clone(),
            io_timeout: self.cfg.io_timeout,
            max_inflight: self.cfg.max_inflight,
            devices: self.cfg.devices.clone(),
        });
        tokio::spawn(write_loop(lane.clone(), rx));
        tokio::spawn(read_loop(lane.clone()));
        Ok(lane)
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
                Some(d) => match staged::stage(
                    &self.cfg.devices,
                    &self.name,
                    batch,
                    idx,
                    d,
                    base.add(off as usize).0 as u64,
                    l,
                )
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

fn header_for(item: &Item, id: u64) -> [u8; REQUEST_HEADER_LEN] {
    let h = match item {
        Item::Data(s) => RequestHeader {
            op: if s.op == Op::Write {
                Opcode::Write
            } else {
                Opcode::Read
            },
            request_id: id,
            remote_addr: s.remote_addr,
            len: s.len,
            token: s.token,
        },
        Item::Control(c) => RequestHeader {
            op: c.op,
            request_id: id,
            remote_addr: 0,
            len: c.payload.len() as u64,
            token: 0,
        },
    };
    h.encode()
}

/// Writer task: gathers queued frames, registers them as pending, sends them in one go.
async fn write_loop(lane: Arc<Lane>, mut rx: mpsc::UnboundedReceiver<Item>) {
    let mut items: Vec<Item> = Vec::with_capacity(MAX_GATHER);
    let mut hdrs: Vec<[u8; REQUEST_HEADER_LEN]> = Vec::with_capacity(MAX_GATHER);
    let mut pieces: Vec<IoPiece> = Vec::with_capacity(2 * MAX_GATHER);
    let mut keep: Vec<KeepAlive> = Vec::with_capacity(MAX_GATHER);
    let mut next_id: u64 = 1;
    loop {
        let first = tokio::select! {
            biased;
            _ = lane.closed.notified() => break,
            it = rx.recv() => match it { Some(it) => it, None => break },
        };
        items.push(first);
        while items.len() < MAX_GATHER {
            match rx.try_recv() {
                Ok(it) => items.push(it),
                Err(_) => break,
            }
        }
        if lane.is_dead() {
            break;
        }
        // Slices of cancelled or timed-out requests are not sent.
        items.retain(|it| !matches!(it, Item::Data(s) if !s.completion.is_live()));
        if items.is_empty() {
            continue;
        }
        hdrs.clear();
        pieces.clear();
        let first_id = next_id;
        for it in &mut items {
            hdrs.push(header_for(it, next_id));
            next_id += 1;
            keep.push(KeepAlive::of(it));
        }
        for (h, it) in hdrs.iter().zip(&items) {
            pieces.push(IoPiece {
                ptr: h.as_ptr(),
                len: REQUEST_HEADER_LEN,
            });
            match it {
                Item::Data(s) if s.op == Op::Write => pieces.push(IoPiece {
                    ptr: s.local.0,
                    len: s.len as usize,
                }),
                Item::Control(c) if !c.payload.is_empty() => pieces.push(IoPiece {
                    ptr: c.payload.as_ptr(),
                    len: c.payload.len(),
                }),
                _ => {}
            }
        }
        {
            let mut p = lane.pending.lock();
            for (i, it) in items.drain(..).enumerate() {
                p.push_back((first_id + i as u64, it));
            }
        }
        // SAFETY: headers live in `hdrs` (not touched until the send ends); write payloads
        // are registered memory kept alive by the batches in `keep`; control payloads are
        // `Bytes` clones in `keep`.
        let sent = unsafe { lane.conn.send_all(&mut pieces, lane.io_timeout).await };
        keep.clear();
        if let Err(e) = sent {
            lane.kill(TransferError::unreachable(&lane.peer, format!("send: {e}")));
            break;
        }
    }
    lane.kill(TransferError::unreachable(&lane.peer, "connection closed"));
    // Items still queued are dropped with `rx`: each fails its request.
}

/// What keeps a frame's payload memory alive while the writer sends it (the batch owns the
/// request's registered buffer; a write's staging buffer moves here from its slice, so it
/// is free again once sent, not once answered; a control payload is its own `Bytes`).
enum KeepAlive {
    Batch(
        #[allow(dead_code)] Arc<BatchState>,
        #[allow(dead_code)] Option<StagingBuf>,
    ),
    Bytes(#[allow(dead_code)] Bytes),
}

impl KeepAlive {
    fn of(item: &mut Item) -> Self {
        match item {
            Item::Data(s) => {
                let staging = if s.op == Op::Write {
                    s.staging.take()
                } else {
                    None
                };
                KeepAlive::Batch(s.completion.batch(), staging)
            }
            Item::Control(c) => KeepAlive::Bytes(c.payload.clone()),
        }
    }
}

/// Reader task: matches responses to pending frames in order and completes them.
async fn read_loop(lane: Arc<Lane>) {
    let mut inbuf = InBuf::new(INBUF_LEN);
    let abort: Abort = {
        let lane = Arc::downgrade(&lane);
        Arc::new(move || {
            if let Some(l) = lane.upgrade() {
                l.kill(TransferError::unreachable(
                    &l.peer,
                    "a read timed out or was cancelled while its data was arriving",
                ));
            }
        })
    };
    let err = loop {
        if let Err(e) = fill_header(&lane, &mut inbuf).await {
            break e;
        }
        let h = match ResponseHeader::decode(inbuf.bytes()) {
            Ok(h) => h,
            Err(e) => break TransferError::protocol(&lane.peer, e),
        };
        inbuf.consume(RESPONSE_HEADER_LEN);
        let Some((id, item)) = lane.pending.lock().pop_front() else {
            break TransferError::protocol(
                &lane.peer,
                format!("unsolicited response {}", h.request_id),
            );
        };
        if id != h.request_id {
            item.fail(TransferError::protocol(&lane.peer, "response out of order"));
            break TransferError::protocol(
                &lane.peer,
                format!(
                    "response for request {} while {id} was expected",
                    h.request_id
                ),
            );
        }
        if let Err(e) = handle_response(&lane, &mut inbuf, h, item, &abort).await {
            break e;
        }
    };
    lane.kill(err);
}

/// Fills `inbuf` until a response header is buffered. A lane with frames outstanding and
/// no bytes for the I/O timeout is declared stalled.
async fn fill_header(lane: &Lane, inbuf: &mut InBuf) -> Result<(), TransferError> {
    let tick = (lane.io_timeout / 2).max(Duration::from_millis(1));
    let mut quiet_ticks = 0;
    while inbuf.available() < RESPONSE_HEADER_LEN {
        // A large read's data goes straight to its destination: read only its header.
        let direct = matches!(lane.pending.lock().front(), Some((_, Item::Data(s))) if s.op == Op::Read && s.len >= DIRECT_READ_MIN);
        let max = if direct {
            RESPONSE_HEADER_LEN - inbuf.available()
        } else {
            INBUF_LEN
        };
        match tokio::time::timeout(tick, inbuf.fill(&lane.conn, max)).await {
            Ok(Ok(0)) => {
                return Err(TransferError::unreachable(
                    &lane.peer,
                    "connection closed by peer",
                ));
            }
            Ok(Ok(_)) => quiet_ticks = 0,
            Ok(Err(e)) => {
                return Err(TransferError::unreachable(
                    &lane.peer,
                    format!("receive: {e}"),
                ));
            }
            Err(_) => {
                if lane.is_dead() {
                    return Err(TransferError::unreachable(&lane.peer, "connection closed"));
                }
                if lane.pending.lock().is_empty() {
                    quiet_ticks = 0;
                } else {
                    quiet_ticks += 1;
                    if quiet_ticks >= 2 {
                        return Err(TransferError::unreachable(
                            &lane.peer,
                            format!(
                                "no response for {:?} with requests outstanding",
                                lane.io_timeout
                            ),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Copies a read slice's staged bytes to device memory and completes it once they are
/// there, without holding up the lane. The slice's landing moves from the socket (which a
/// timeout may kill) to the device copy (which nothing can stop, so it is waited for).
fn land_on_device(lane: &Lane, mut s: DataSlice, socket_landing: Landing, device: u32, to: u64) {
    let device_landing = s.completion.begin_landing(None);
    drop(socket_landing);
    let Some(landing) = device_landing else {
        s.completion.complete_landed(None); // decided meanwhile: nothing more lands
        return;
    };
    let devices = lane.devices.clone();
    tokio::spawn(async move {
        let staging = s
            .staging
            .take()
            .expect("a device read slice has a staging buffer");
        let deadline = s.completion.batch().deadline + crate::device::FENCE_GRACE;
        let keep = Box::new(s.completion.request().local.clone());
        match staged::land(
            &devices,
            staging,
            device,
            to,
            s.len as usize,
            deadline,
            keep,
        )
        .await
        {
            Ok(()) => s.completion.complete_landed(Some(landing)),
            Err(e) => {
                s.completion.complete(Err(e));
                drop(landing);
            }
        }
    });
}

async fn handle_response(
    lane: &Lane,
    inbuf: &mut InBuf,
    h: ResponseHeader,
    item: Item,
    abort: &Abort,
) -> Result<(), TransferError> {
    let io = |e: std::io::Error| TransferError::unreachable(&lane.peer, format!("receive: {e}"));
    match item {
        Item::Data(s) => {
            let range = RemoteRange::new(s.remote_addr, s.len);
            let segment = s.completion.request().segment.name().to_owned();
            if h.status != Status::Ok {
                let msg = read_small(&lane.conn, inbuf, h.len as usize, lane.io_timeout)
                    .await
                    .map_err(io)?;
                let msg = String::from_utf8_lossy(&msg);
                s.completion
                    .complete(Err(status_error(h.status, &segment, range, &msg)));
                return Ok(());
            }
            let expect = if s.op == Op::Read { s.len } else { 0 };
            if h.len != expect {
                let e = TransferError::protocol(
                    &segment,
                    format!("response carries {} bytes, expected {expect}", h.len),
                );
                s.completion.complete(Err(e.clone()));
                return Err(e);
            }
            if s.op == Op::Read {
                // Data of a request that is no longer wanted is drained, not delivered; while
                // it lands, a timeout or cancel of the request kills this lane.
                let landing = s.completion.begin_landing(Some(abort.clone()));
                let region = s.completion.request().local.region();
                let (dst, dest) = match (&landing, &s.staging) {
                    (None, _) => (SendPtr::NULL, None),
                    // A private staging buffer: no lock to hold.
                    (Some(_), Some(_)) => (s.local, None),
                    (Some(_), None) => {
                        let off = s.local.0 as usize - region.as_ptr() as usize;
                        (s.local, Some((&**region.cpu(), off)))
                    }
                };
                // SAFETY: `dst` points into the request's registered local buffer (bounds
                // checked at submit, len bytes) at offset `off` of `region`, kept alive by the
                // batch the completion holds; or into the slice's staging buffer of at least
                // `len` bytes, which the slice holds.
                unsafe {
                    read_payload(
                        &lane.conn,
                        inbuf,
                        dst,
                        s.len as usize,
                        lane.io_timeout,
                        dest,
                    )
                    .await
                }
                .map_err(io)?;
                match (landing, s.land) {
                    (Some(socket_landing), Some((device, to))) => {
                        land_on_device(lane, s, socket_landing, device, to)
                    }
                    (landing, _) => s.completion.complete_landed(landing),
                }
                return Ok(());
            }
            s.completion.complete_landed(None);
        }
        Item::Control(c) => {
            let limit = if c.op == Opcode::Descriptor {
                MAX_DESCRIPTOR_LEN
            } else {
                MAX_CONTROL_LEN
            };
            if h.len > limit {
                let e = TransferError::protocol(
                    &lane.peer,
                    format!("control answer of {} bytes", h.len),
                );
                let _ = c.reply.send(Err(e.clone()));
                return Err(e);
            }
            let payload = read_small(&lane.conn, inbuf, h.len as usize, lane.io_timeout)
                .await
                .map_err(io)?;
            let _ = c.reply.send(Ok((h.status, payload)));
        }
    }
    Ok(())
}
