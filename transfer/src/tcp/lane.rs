//! One TCP connection of the initiator (a lane) and the two tasks that run it: a writer
//! (gathers queued frames into one `sendmsg`, payload straight from registered memory or a
//! staging buffer) and a reader (matches responses in order, read data straight into
//! registered memory; a read into device memory lands in its staging buffer and is copied
//! to the device without holding up the lane).
//!
//! Failure: any I/O error, end of stream, protocol violation, or a lane with requests
//! outstanding and no progress for the I/O timeout, kills the lane: its socket is shut
//! down and every frame queued or in flight on it fails with the cause.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::device::Devices;
use crate::device::staging::StagingBuf;
use crate::error::{RemoteRange, Result, TransferError};
use crate::memory::SendPtr;
use crate::op::{Abort, BatchState, Completion, Landing, Op};
use crate::tcp::io::{Conn, InBuf, IoPiece, read_payload, read_small};
use crate::tcp::staged;
use crate::tcp::status::status_error;
use crate::wire::{
    MAX_CONTROL_LEN, MAX_DESCRIPTOR_LEN, Opcode, REQUEST_HEADER_LEN, RESPONSE_HEADER_LEN,
    RequestHeader, ResponseHeader, Status,
};

/// Read-ahead buffer size of a lane reader.
const INBUF_LEN: usize = 64 << 10;
/// Frames gathered into one `sendmsg` at most.
const MAX_GATHER: usize = 256;
/// Reads at least this large skip the read-ahead buffer entirely.
const DIRECT_READ_MIN: u64 = 32 << 10;

/// One data frame: a slice of a request.
pub(crate) struct DataSlice {
    pub(crate) op: Op,
    /// Where the payload is sent from or lands: the request's local buffer, or the staging
    /// buffer when the local buffer is device memory.
    pub(crate) local: SendPtr,
    pub(crate) remote_addr: u64,
    pub(crate) len: u64,
    pub(crate) token: u64,
    pub(crate) completion: Completion,
    /// The pinned buffer a device-memory slice passes through (a write's goes with its
    /// frame to the writer, which releases it once sent).
    pub(crate) staging: Option<StagingBuf>,
    /// A read into device memory: the device and address its staged bytes go to.
    pub(crate) land: Option<(u32, u64)>,
    pub(crate) _permit: OwnedSemaphorePermit,
}

pub(crate) type ControlReply = oneshot::Sender<Result<(Status, Vec<u8>)>>;

/// A control request (descriptor, notification, RDMA handshake).
pub(crate) struct ControlCall {
    pub(crate) op: Opcode,
    pub(crate) payload: Bytes,
    pub(crate) reply: ControlReply,
    pub(crate) _permit: OwnedSemaphorePermit,
}

/// What a lane sends: a slice of a request, or a control request.
pub(crate) enum Item {
    /// A slice of a request.
    Data(DataSlice),
    /// A control request.
    Control(ControlCall),
}

impl Item {
    /// Fails the item with `err`.
    pub(crate) fn fail(self, err: TransferError) {
        match self {
            Item::Data(s) => s.completion.complete(Err(err)),
            Item::Control(c) => {
                let _ = c.reply.send(Err(err));
            }
        }
    }
}

/// One TCP connection to a peer.
pub(crate) struct Lane {
    conn: Conn,
    /// The writer's queue.
    pub(crate) tx: mpsc::UnboundedSender<Item>,
    /// Frames in flight on this lane: one permit each.
    pub(crate) sem: Arc<Semaphore>,
    dead: AtomicBool,
    closed: Notify,
    pending: Mutex<VecDeque<(u64, Item)>>,
    peer: String,
    io_timeout: Duration,
    max_inflight: usize,
    devices: Arc<Devices>,
}

impl Lane {
    /// A lane over `conn` to `peer`, its writer and reader tasks started on the current
    /// runtime.
    pub(crate) fn start(
        conn: Conn,
        peer: String,
        io_timeout: Duration,
        max_inflight: usize,
        devices: Arc<Devices>,
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let lane = Arc::new(Lane {
            conn,
            tx,
            sem: Arc::new(Semaphore::new(max_inflight)),
            dead: AtomicBool::new(false),
            closed: Notify::new(),
            pending: Mutex::new(VecDeque::new()),
            peer,
            io_timeout,
            max_inflight,
            devices,
        });
        tokio::spawn(write_loop(lane.clone(), rx));
        tokio::spawn(read_loop(lane.clone()));
        lane
    }

    /// Dead: killed, or its tasks are gone (e.g. the runtime that ran them shut down).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.tx.is_closed()
    }

    /// Kills the lane: shuts the socket, fails everything in flight with `err`.
    pub(crate) fn kill(&self, err: TransferError) {
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

    /// No frame in flight.
    pub(crate) fn idle(&self) -> bool {
        self.sem.available_permits() == self.max_inflight
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
