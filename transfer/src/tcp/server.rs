//! Target side of the TCP transport: accepts connections, authenticates each peer with the
//! handshake of [`crate::auth::handshake`] (nothing else is read or sent before it
//! succeeded; at most [`MAX_HANDSHAKES`] run at once and each is bounded in time), then
//! serves the frames of `tcp::frame` (`wire`). Every Write and Read is checked against the registered regions and their
//! tokens before any byte of memory is touched; a refused request gets an error frame (its
//! payload, if any, is drained) and the connection stays usable. A header that does not
//! decode ends the connection (framing cannot be recovered), never the process.
//!
//! Writes are received straight into the target memory and acknowledged after the last byte
//! landed; reads are answered with the status header followed by the data, sent straight
//! from memory. Device memory goes through pinned staging buffers instead (`staged`): a
//! Write into it is acknowledged once the device copies completed. Responses are coalesced and flushed when no more complete request is
//! buffered. Shutdown stops reading new requests, finishes the ones already received,
//! flushes, and closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::ClusterSecret;
use crate::auth::handshake::{self, PeerIdentity};
use crate::memory::{MemoryRegion, SendPtr};
use crate::notify::Notification;
use crate::registry::LocalRegions;
use crate::tcp::io::{Conn, InBuf, IoPiece, read_payload, read_small};
use crate::tcp::staged;
use crate::wire::{
    FrameError, MAX_CONTROL_LEN, Opcode, REQUEST_HEADER_LEN, RequestHeader, ResponseHeader, Status,
};

const INBUF_LEN: usize = 64 << 10;
/// A write payload at least this large makes the next header read header-only, so the
/// following payload goes straight to memory.
const LARGE_PAYLOAD: u64 = 64 << 10;
/// Flush coalesced responses once this many bytes or pieces are waiting.
const FLUSH_BYTES: usize = 256 << 10;
const FLUSH_PIECES: usize = 512;
/// Connections authenticating at once at most (an unauthenticated peer holds at most a task
/// and a few hundred bytes, for at most the handshake timeout); more wait for a slot, up to
/// the handshake timeout.
pub(crate) const MAX_HANDSHAKES: usize = 1024;
/// Connections authenticating at once from one IP address at most; more are closed at once,
/// so one host cannot take every slot.
pub(crate) const MAX_HANDSHAKES_PER_IP: usize = 64;

/// Bounds on the handshakes in progress.
pub(crate) struct HandshakeLimits {
    all: Arc<Semaphore>,
    per_ip: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl HandshakeLimits {
    pub(crate) fn new() -> Self {
        Self {
            all: Arc::new(Semaphore::new(MAX_HANDSHAKES)),
            per_ip: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// A slot for a handshake from `ip`, if that address has fewer than
    /// [`MAX_HANDSHAKES_PER_IP`] in progress.
    fn per_ip(&self, ip: std::net::IpAddr) -> Option<IpSlot<'_>> {
        let mut m = self.per_ip.lock();
        let n = m.entry(ip).or_insert(0);
        if *n >= MAX_HANDSHAKES_PER_IP {
            return None;
        }
        *n += 1;
        Some(IpSlot { limits: self, ip })
    }
}

struct IpSlot<'a> {
    limits: &'a HandshakeLimits,
    ip: std::net::IpAddr,
}

impl Drop for IpSlot<'_> {
    fn drop(&mut self) {
        let mut m = self.limits.per_ip.lock();
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}
/// What a refused peer may still send, and for how long, before the socket closes (so it
/// reads the refusal instead of a reset).
const LINGER_BYTES: usize = 64 << 10;
const LINGER: Duration = Duration::from_millis(500);

/// Handles the RDMA handshake control request (present when RDMA is active).
pub(crate) trait RdmaAcceptor: Send + Sync {
    /// Answers a handshake payload from the authenticated `peer` (at `addr`) with the reply
    /// payload, or a refusal.
    fn accept(
        &self,
        peer: &PeerIdentity,
        addr: SocketAddr,
        payload: &[u8],
    ) -> Result<Vec<u8>, (Status, String)>;
}

/// What the server needs from its engine.
pub(crate) struct ServerCtx {
    pub(crate) regions: Arc<LocalRegions>,
    pub(crate) describe: Box<dyn Fn() -> Vec<u8> + Send + Sync>,
    pub(crate) notifications: mpsc::Sender<Notification>,
    pub(crate) rdma: Option<Arc<dyn RdmaAcceptor>>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) tracker: TaskTracker,
    pub(crate) io_timeout: Duration,
    /// The secret peers must prove they hold.
    pub(crate) secret: ClusterSecret,
    /// This node's segment name (declared in the handshake).
    pub(crate) name: String,
    /// Bounds the handshakes in progress.
    pub(crate) handshakes: HandshakeLimits,
    /// Time a peer has to complete the handshake.
    pub(crate) handshake_timeout: Duration,
    /// Device memory: staging buffers and copy streams.
    pub(crate) devices: Arc<crate::device::Devices>,
}

/// Accepts until shutdown; every connection runs in its own task on `ctx.tracker`.
pub(crate) async fn accept_loop(listener: TcpListener, ctx: Arc<ServerCtx>) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                ctx.tracker.spawn(serve_conn(stream, peer, ctx.clone()));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Responses waiting to be sent: header and small owned bytes, plus data pieces pointing
/// into registered memory (kept alive until sent).
struct Outbox {
    bytes: Vec<u8>,
    pieces: Vec<OutPiece>,
    keep: Vec<Arc<MemoryRegion>>,
    total: usize,
}

enum OutPiece {
    Own { start: usize, len: usize },
    Mem { ptr: SendPtr, len: usize },
}

impl Outbox {
    fn new() -> Self {
        Self {
            bytes: Vec::with_capacity(16 << 10),
            pieces: Vec::new(),
            keep: Vec::new(),
            total: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    fn push_own(&mut self, data: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(data);
        self.total += data.len();
        if let Some(OutPiece::Own { start: s, len }) = self.pieces.last_mut()
            && *s + *len == start
        {
            *len += data.len();
            return;
        }
        self.pieces.push(OutPiece::Own {
            start,
            len: data.len(),
        });
    }

    fn answer(&mut self, status: Status, request_id: u64, payload: &[u8]) {
        self.push_own(
            &ResponseHeader {
                status,
                request_id,
                len: payload.len() as u64,
            }
            .encode(),
        );
        self.push_own(payload);
    }

    fn refuse(&mut self, status: Status, request_id: u64, message: &str) {
        let msg = &message.as_bytes()[..message.len().min(MAX_CONTROL_LEN as usize)];
        self.answer(status, request_id, msg);
    }

    fn data(&mut self, request_id: u64, ptr: SendPtr, len: usize, region: Arc<MemoryRegion>) {
        self.push_own(
            &ResponseHeader {
                status: Status::Ok,
                request_id,
                len: len as u64,
            }
            .encode(),
        );
        self.pieces.push(OutPiece::Mem { ptr, len });
        self.keep.push(region);
        self.total += len;
    }

    fn should_flush(&self) -> bool {
        self.total >= FLUSH_BYTES || self.pieces.len() >= FLUSH_PIECES
    }

    async fn flush(&mut self, conn: &Conn, idle: Duration) -> std::io::Result<()> {
        let mut iov: Vec<IoPiece> = {
            let base = self.bytes.as_ptr();
            self.pieces
                .iter()
                .map(|p| match *p {
                    OutPiece::Own { start, len } => IoPiece {
                        ptr: base.wrapping_add(start),
                        len,
                    },
                    OutPiece::Mem { ptr, len } => IoPiece { ptr: ptr.0, len },
                })
                .collect()
        };
        // SAFETY: owned pieces point into `self.bytes`, which is not modified until the send
        // ends; memory pieces point into regions validated at lookup and kept alive by
        // `self.keep` until cleared below.
        let r = unsafe { conn.send_all(&mut iov, idle).await };
        self.bytes.clear();
        self.pieces.clear();
        self.keep.clear();
        self.total = 0;
        r
    }
}

fn describe_refusal(h: &RequestHeader, status: Status) -> String {
    let what = match status {
        Status::UnknownRegion => "no registered region contains the address",
        Status::OutOfBounds => "the range runs past the end of its region",
        Status::BadToken => "the access token does not match the region",
        _ => "refused",
    };
    format!("{:?} [{:#x}, +{}]: {what}", h.op, h.remote_addr, h.len)
}

/// Authenticates the peer, then serves the connection until end of stream, an I/O error, a
/// framing error or shutdown.
async fn serve_conn(mut stream: TcpStream, peer: SocketAddr, ctx: Arc<ServerCtx>) {
    let Some(identity) = authenticate(&mut stream, peer, &ctx).await else {
        return;
    };
    let conn = match Conn::new(stream) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "socket setup failed");
            return;
        }
    };
    if let Err(e) = serve_frames(&conn, peer, &identity, &ctx).await {
        tracing::debug!(%peer, error = %e, "connection ended");
    }
}

/// Runs the accepting side of the handshake; `None` (connection to be closed) on failure,
/// after the refusal had a moment to reach the peer.
async fn authenticate(
    stream: &mut TcpStream,
    peer: SocketAddr,
    ctx: &ServerCtx,
) -> Option<PeerIdentity> {
    let Some(_ip_slot) = ctx.handshakes.per_ip(peer.ip()) else {
        tracing::warn!(%peer, "{MAX_HANDSHAKES_PER_IP} transfer handshakes from this address already in progress; closing");
        return None;
    };
    let limit = ctx.handshake_timeout;
    let started = tokio::time::Instant::now();
    let _permit = tokio::select! {
        biased;
        _ = ctx.shutdown.cancelled() => return None,
        p = tokio::time::timeout(limit, ctx.handshakes.all.clone().acquire_owned()) => match p {
            Ok(Ok(p)) => p,
            _ => {
                tracing::warn!(%peer, "{MAX_HANDSHAKES} transfer handshakes in progress for {limit:?}; closing");
                return None;
            }
        },
    };
    let _ = stream.set_nodelay(true);
    let left = limit.saturating_sub(started.elapsed());
    let r = tokio::select! {
        biased;
        _ = ctx.shutdown.cancelled() => return None,
        r = handshake::accept(stream, &ctx.secret, &ctx.name, left) => r,
    };
    match r {
        Ok(id) => {
            tracing::debug!(%peer, name = %id.name, "transfer peer authenticated");
            Some(id)
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "transfer peer refused");
            linger_close(stream).await;
            None
        }
    }
}

/// Half-closes and drains what the peer still sends (bounded in bytes and time), so the
/// refusal already written is read rather than lost to a reset.
async fn linger_close(stream: &mut TcpStream) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let mut left = LINGER_BYTES;
    let _ = tokio::time::timeout(LINGER, async {
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

async fn serve_frames(
    conn: &Conn,
    peer: SocketAddr,
    identity: &PeerIdentity,
    ctx: &ServerCtx,
) -> std::io::Result<()> {
    let idle = ctx.io_timeout;
    let mut inbuf = InBuf::new(INBUF_LEN);
    let mut out = Outbox::new();
    let mut header_only = false;
    loop {
        while inbuf.available() < REQUEST_HEADER_LEN {
            if !out.is_empty() {
                out.flush(conn, idle).await?;
            }
            let max = if header_only {
                REQUEST_HEADER_LEN - inbuf.available()
            } else {
                INBUF_LEN
            };
            let n = if inbuf.available() == 0 {
                if ctx.shutdown.is_cancelled() {
                    return Ok(());
                }
                tokio::select! {
                    biased;
                    _ = ctx.shutdown.cancelled() => return Ok(()),
                    r = inbuf.fill(conn, max) => r?,
                }
            } else {
                match tokio::time::timeout(idle, inbuf.fill(conn, max)).await {
                    Ok(r) => r?,
                    Err(_) => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "peer stalled mid-header",
                        ));
                    }
                }
            };
            if n == 0 {
                return Ok(());
            }
        }
        let h = match RequestHeader::decode(&inbuf.bytes()[..REQUEST_HEADER_LEN]) {
            Ok(h) => h,
            Err(e) => {
                return refuse_frame(
                    conn,
                    peer,
                    &inbuf.bytes()[..REQUEST_HEADER_LEN],
                    e,
                    &mut out,
                    idle,
                )
                .await;
            }
        };
        inbuf.consume(REQUEST_HEADER_LEN);
        header_only = h.op.payload_len(h.len) >= LARGE_PAYLOAD;
        match h.op {
            Opcode::Write => match ctx.regions.lookup(h.remote_addr, h.len, h.token) {
                Ok(region) if region.is_device() => {
                    let device = region.location().device().unwrap_or_default();
                    let r = staged::recv_to_device(
                        conn,
                        &mut inbuf,
                        &ctx.devices,
                        device,
                        &identity.name,
                        &region,
                        h.remote_addr,
                        h.len as usize,
                        idle,
                    )
                    .await?;
                    drop(region);
                    match r {
                        Ok(()) => out.answer(Status::Ok, h.request_id, &[]),
                        Err(e) => {
                            tracing::warn!(%peer, error = %e, "device write failed");
                            out.refuse(Status::DeviceError, h.request_id, &e.to_string());
                        }
                    }
                }
                Ok(region) => {
                    let off = (h.remote_addr - region.addr()) as usize;
                    // SAFETY: lookup proved [remote_addr, +len) lies inside `region`, which
                    // this frame keeps alive until the payload is in; `off` is its offset.
                    unsafe {
                        read_payload(
                            conn,
                            &mut inbuf,
                            SendPtr(h.remote_addr as *mut u8),
                            h.len as usize,
                            idle,
                            Some((region.cpu(), off)),
                        )
                        .await?
                    };
                    drop(region);
                    out.answer(Status::Ok, h.request_id, &[]);
                }
                Err(status) => {
                    // SAFETY: a null destination only drains the payload.
                    unsafe {
                        read_payload(conn, &mut inbuf, SendPtr::NULL, h.len as usize, idle, None)
                            .await?
                    };
                    tracing::warn!(%peer, status = ?status, "{}", describe_refusal(&h, status));
                    out.refuse(status, h.request_id, &describe_refusal(&h, status));
                }
            },
            Opcode::Read => match ctx.regions.lookup(h.remote_addr, h.len, h.token) {
                Ok(region) if region.is_device() => {
                    // Answers go in request order: what is queued leaves first.
                    if !out.is_empty() {
                        out.flush(conn, idle).await?;
                    }
                    let device = region.location().device().unwrap_or_default();
                    staged::send_from_device(
                        conn,
                        &ctx.devices,
                        device,
                        &identity.name,
                        h.request_id,
                        &region,
                        h.remote_addr,
                        h.len as usize,
                        idle,
                    )
                    .await?;
                    drop(region);
                }
                Ok(region) => out.data(
                    h.request_id,
                    SendPtr(h.remote_addr as *mut u8),
                    h.len as usize,
                    region,
                ),
                Err(status) => {
                    tracing::warn!(%peer, status = ?status, "{}", describe_refusal(&h, status));
                    out.refuse(status, h.request_id, &describe_refusal(&h, status));
                }
            },
            Opcode::Descriptor => out.answer(Status::Ok, h.request_id, &(ctx.describe)()),
            Opcode::Notify => {
                let message = read_small(conn, &mut inbuf, h.len as usize, idle).await?;
                let n = Notification {
                    from: identity.name.clone(),
                    peer_addr: Some(peer),
                    message,
                };
                match ctx.notifications.try_send(n) {
                    Ok(()) => out.answer(Status::Ok, h.request_id, &[]),
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        out.refuse(Status::Busy, h.request_id, "notification queue is full")
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        out.refuse(Status::ShuttingDown, h.request_id, "node is shutting down")
                    }
                }
            }
            Opcode::RdmaConnect => {
                let payload = read_small(conn, &mut inbuf, h.len as usize, idle).await?;
                match &ctx.rdma {
                    Some(acceptor) => {
                        // Creating and connecting a queue pair are driver calls: off the
                        // async threads.
                        let (a, id) = (acceptor.clone(), identity.clone());
                        let r = tokio::task::spawn_blocking(move || a.accept(&id, peer, &payload))
                            .await
                            .unwrap_or_else(|e| {
                                Err((Status::Unsupported, format!("RDMA handshake failed: {e}")))
                            });
                        match r {
                            Ok(reply) => out.answer(Status::Ok, h.request_id, &reply),
                            Err((status, msg)) => out.refuse(status, h.request_id, &msg),
                        }
                    }
                    None => out.refuse(
                        Status::Unsupported,
                        h.request_id,
                        "RDMA is not enabled on this node; use TCP",
                    ),
                }
            }
        }
        if out.should_flush() {
            out.flush(conn, idle).await?;
        }
    }
}

/// Answers an undecodable header with an error frame, then ends the connection.
async fn refuse_frame(
    conn: &Conn,
    peer: SocketAddr,
    raw: &[u8],
    err: FrameError,
    out: &mut Outbox,
    idle: Duration,
) -> std::io::Result<()> {
    tracing::warn!(%peer, error = %err, "undecodable request header; closing connection");
    let id = u64::from_le_bytes(raw[8..16].try_into().expect("8 bytes"));
    let status = if matches!(err, FrameError::TooLong { .. }) {
        Status::TooLarge
    } else {
        Status::BadRequest
    };
    out.refuse(status, id, &err.to_string());
    out.flush(conn, idle).await
}
