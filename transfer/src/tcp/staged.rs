//! TCP with device memory: payloads pass through pinned staging buffers.
//!
//! On the initiator, each slice of a request with a device buffer has a staging buffer of
//! its own ([`stage`]): a write's slice is copied out of the device before it is queued
//! (while the lanes send the slices before it), a read's slice lands in it and is copied to
//! the device ([`land`]) without holding up the lane.
//!
//! On the target, a frame goes chunk by chunk, with the device copy of one chunk
//! overlapping the socket I/O of the next.
//!
//! A Write into device memory receives chunk n into a staging buffer while the copies of
//! the chunks before it run; a buffer is reused only once its copy's fence resolved, and
//! the Write is acknowledged only after the last fence: its bytes are in device memory.
//! A Read copies up to [`RING`] chunks ahead into staging buffers and sends each as soon as
//! its copy is done. One frame holds at most `RING` buffers, taken at once from its peer's
//! share of the pool (`device::staging`).
//!
//! Failures: a device copy that fails leaves the payload drained and the request refused
//! (`Status::DeviceError`), the connection usable. A fence that does not come within the
//! I/O timeout abandons its buffer (never reused: the device may still use it). A Read whose
//! copy fails after its data began ends the connection (the frame cannot be finished).
//! Every enqueued copy is an `InFlight`: a request or connection that goes away while
//! copies run leaves them to finish, holding their buffers and the registration they
//! touch, before the buffers go back to the pool.

use std::any::Any;
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::device::staging::{InFlight, Role, StagingBuf};
use crate::device::{CopyStream, Devices};
use crate::error::{Result, TransferError};
use crate::memory::{MemoryRegion, SendPtr};
use crate::op::{BatchState, Op};
use crate::tcp::io::{Conn, InBuf, IoPiece, read_payload};
use crate::wire::{ResponseHeader, Status};

/// Staging buffers one frame keeps in flight at most.
pub(crate) const RING: usize = 4;

/// A staging buffer for a slice of `len` bytes at `at` in device memory of `device`, for
/// request `idx` of `batch` to `peer`: for a write, holding the slice's bytes (copied from
/// the device); for a read, empty, with where its bytes go. `None` when the deadline passed
/// first.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn stage(
    devices: &Devices,
    peer: &str,
    batch: &BatchState,
    idx: usize,
    device: u32,
    at: u64,
    len: u64,
) -> Result<Option<(StagingBuf, Option<(u32, u64)>)>> {
    let ctx = devices.ctx()?;
    let taken = ctx.staging.take(Role::Initiator, peer);
    let buf = match tokio::time::timeout_at(batch.deadline, taken).await {
        Ok(b) => b?,
        Err(_) => return Ok(None),
    };
    if batch.requests[idx].op == Op::Read {
        return Ok(Some((buf, Some((device, at)))));
    }
    let stream = ctx.stream(device)?;
    let dst = buf.addr();
    let keep = Box::new(batch.requests[idx].local.clone());
    // SAFETY: the source is the request's device buffer (checked at submit), whose
    // registration the in-flight copy holds; `buf` is a private pinned buffer of one chunk
    // >= len bytes, held by the in-flight copy until its fence resolved.
    let copy = unsafe { enqueue(&*stream, buf, dst, at, len as usize, keep)? };
    let within = until(batch.deadline + crate::device::FENCE_GRACE);
    let (buf, done) = copy.settle(within).await;
    done?;
    // A copy that completed hands its buffer back.
    Ok(buf.map(|b| (b, None)))
}

/// Copies a read slice's staged bytes (`len` of them) to `to` on `device` (in `keep`'s
/// registration), by `deadline`. A copy that never completes abandons the staging buffer.
pub(crate) async fn land(
    devices: &Devices,
    staging: StagingBuf,
    device: u32,
    to: u64,
    len: usize,
    deadline: Instant,
    keep: Box<dyn Any + Send>,
) -> Result<()> {
    let copy = {
        let stream = devices.ctx()?.stream(device)?;
        let src = staging.addr();
        // SAFETY: `to` is inside the request's device buffer (checked at submit), whose
        // registration the in-flight copy holds; the staging buffer holds the slice's bytes
        // and is held by the in-flight copy until its fence resolved.
        unsafe { enqueue(&*stream, staging, to, src, len, keep)? }
    };
    copy.settle(until(deadline)).await.1
}

/// Time left until `deadline`.
fn until(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Enqueues the copy of `len` bytes from `src` to `dst` and a fence after it: the copy in
/// flight, holding `buf` and `keep` until its fence. When the copy cannot be enqueued `buf`
/// goes back to its pool; when it was but no fence could follow, the stream is drained
/// first, and `buf` and `keep` are abandoned if even that fails.
///
/// # Safety
/// As [`CopyStream::copy`]; `buf` is the staging side, `keep` holds the device side's
/// registration.
unsafe fn enqueue(
    stream: &dyn CopyStream,
    buf: StagingBuf,
    dst: u64,
    src: u64,
    len: usize,
    keep: Box<dyn Any + Send>,
) -> Result<InFlight> {
    // SAFETY: forwarded caller contract.
    unsafe { stream.copy(dst, src, len)? };
    match stream.fence() {
        Ok(f) => Ok(InFlight::new(buf, f, Some(keep))),
        Err(e) => {
            if stream.synchronize().is_err() {
                buf.abandon();
                std::mem::forget(keep);
            }
            Err(e)
        }
    }
}

/// Reads and drops `len` payload bytes.
async fn drain(conn: &Conn, inbuf: &mut InBuf, len: usize, idle: Duration) -> io::Result<()> {
    // SAFETY: a null destination only drains the payload.
    unsafe { read_payload(conn, inbuf, SendPtr::NULL, len, idle, None).await }
}

/// Receives a Write's `len` payload bytes into device memory at `dst` (on `device`, in
/// `region`) for `peer`. `Ok(Ok(()))`: every byte is in device memory; `Ok(Err(_))`: the
/// payload was drained but did not reach the device (refuse the request); `Err(_)`: the
/// connection failed (copies already enqueued finish on their own, holding `region`).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn recv_to_device(
    conn: &Conn,
    inbuf: &mut InBuf,
    devices: &Devices,
    device: u32,
    peer: &str,
    region: &Arc<MemoryRegion>,
    dst: u64,
    len: usize,
    idle: Duration,
) -> io::Result<Result<()>> {
    if len == 0 {
        return Ok(Ok(()));
    }
    let ctx = match devices.ctx() {
        Ok(c) => c,
        Err(e) => {
            drain(conn, inbuf, len, idle).await?;
            return Ok(Err(e));
        }
    };
    let chunk = ctx.staging.chunk();
    let ring = RING.min(len.div_ceil(chunk)).max(1);
    let taken = ctx.staging.take_many(Role::Target, peer, ring);
    let taken = match tokio::time::timeout(idle, taken).await {
        Ok(r) => r,
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no staging buffer for a device write",
            ));
        }
    };
    let (mut free, stream) = match taken.and_then(|b| ctx.stream(device).map(|s| (b, s))) {
        Ok(x) => x,
        Err(e) => {
            drain(conn, inbuf, len, idle).await?;
            return Ok(Err(e));
        }
    };
    let mut busy: VecDeque<InFlight> = VecDeque::with_capacity(ring);
    let mut failed: Option<TransferError> = None;
    let mut off = 0;
    while off < len {
        let n = chunk.min(len - off);
        let buf = match free.pop() {
            Some(b) => Some(b),
            None => match busy.pop_front() {
                Some(copy) => {
                    let (b, r) = copy.settle(idle).await;
                    if let Err(e) = r {
                        failed.get_or_insert(e);
                    }
                    b
                }
                None => None,
            },
        };
        let Some(buf) = buf.filter(|_| failed.is_none()) else {
            // The device failed: the rest of the payload is drained.
            drain(conn, inbuf, len - off, idle).await?;
            break;
        };
        // SAFETY: `buf` is a private pinned buffer of `chunk >= n` bytes, held until here.
        unsafe { read_payload(conn, inbuf, SendPtr(buf.ptr()), n, idle, None).await? };
        let src = buf.addr();
        let keep = Box::new(region.clone());
        // SAFETY: `buf` holds the n bytes just received and is held by the in-flight copy
        // until its fence resolved; [dst + off, +n) lies in `region` (looked up by the
        // caller), which the in-flight copy holds.
        match unsafe { enqueue(&*stream, buf, dst + off as u64, src, n, keep) } {
            Ok(x) => busy.push_back(x),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
        off += n;
    }
    for copy in busy {
        if let (_, Err(e)) = copy.settle(idle).await {
            failed.get_or_insert(e);
        }
    }
    Ok(failed.map_or(Ok(()), Err))
}

/// Answers a Read of `len` bytes of device memory at `src` (on `device`, in `region`) for
/// `peer`: the status header, then the data, staged. A device failure before any data was
/// sent is answered as a refusal; after, it ends the connection (returned as an error).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn send_from_device(
    conn: &Conn,
    devices: &Devices,
    device: u32,
    peer: &str,
    request_id: u64,
    region: &Arc<MemoryRegion>,
    src: u64,
    len: usize,
    idle: Duration,
) -> io::Result<()> {
    let refuse = |e: TransferError| async move {
        let msg = e.to_string();
        let msg = &msg.as_bytes()[..msg.len().min(crate::wire::MAX_CONTROL_LEN as usize)];
        let h = ResponseHeader {
            status: Status::DeviceError,
            request_id,
            len: msg.len() as u64,
        }
        .encode();
        let mut iov = [
            IoPiece {
                ptr: h.as_ptr(),
                len: h.len(),
            },
            IoPiece {
                ptr: msg.as_ptr(),
                len: msg.len(),
            },
        ];
        // SAFETY: both pieces are locals of this future, alive until the send ends.
        unsafe { conn.send_all(&mut iov, idle).await }
    };
    if len == 0 {
        let h = ResponseHeader {
            status: Status::Ok,
            request_id,
            len: 0,
        }
        .encode();
        let mut iov = [IoPiece {
            ptr: h.as_ptr(),
            len: h.len(),
        }];
        // SAFETY: the header is a local of this future, alive until the send ends.
        return unsafe { conn.send_all(&mut iov, idle).await };
    }
    let ctx = match devices.ctx() {
        Ok(c) => c,
        Err(e) => return refuse(e).await,
    };
    let chunk = ctx.staging.chunk();
    let ring = RING.min(len.div_ceil(chunk)).max(1);
    let taken = ctx.staging.take_many(Role::Target, peer, ring);
    let taken = match tokio::time::timeout(idle, taken).await {
        Ok(r) => r,
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no staging buffer for a device read",
            ));
        }
    };
    let (free, stream) = match taken.and_then(|b| ctx.stream(device).map(|s| (b, s))) {
        Ok(x) => x,
        Err(e) => return refuse(e).await,
    };
    let mut pending: VecDeque<(InFlight, usize)> = VecDeque::with_capacity(ring);
    let mut next = 0usize;
    let mut failed: Option<TransferError> = None;
    // Copies ahead into every buffer.
    let issue = |buf: StagingBuf, next: &mut usize, pending: &mut VecDeque<_>| {
        let n = chunk.min(len - *next);
        let dst = buf.addr();
        let keep = Box::new(region.clone());
        // SAFETY: `buf` is a private pinned buffer of `chunk >= n` bytes, held by the
        // in-flight copy until its fence resolved; [src + next, +n) lies in `region` (looked
        // up by the caller), which the in-flight copy holds.
        let r = unsafe { enqueue(&*stream, buf, dst, src + *next as u64, n, keep) };
        *next += n;
        r.map(|copy| pending.push_back((copy, n)))
    };
    for buf in free {
        if next >= len {
            break;
        }
        if let Err(e) = issue(buf, &mut next, &mut pending) {
            failed = Some(e);
            break;
        }
    }
    let mut header_sent = false;
    while let Some((copy, n)) = pending.pop_front() {
        let (buf, r) = copy.settle(idle).await;
        if let Some(e) = failed.take().or(r.err()) {
            if header_sent {
                return Err(io::Error::other(e.to_string()));
            }
            for (copy, _) in pending.drain(..) {
                let _ = copy.settle(idle).await;
            }
            return refuse(e).await;
        }
        let buf = buf.expect("a settled fence keeps its buffer");
        let h = ResponseHeader {
            status: Status::Ok,
            request_id,
            len: len as u64,
        }
        .encode();
        let mut iov = [
            IoPiece {
                ptr: h.as_ptr(),
                len: if header_sent { 0 } else { h.len() },
            },
            IoPiece {
                ptr: buf.ptr(),
                len: n,
            },
        ];
        // SAFETY: the header is a local and `buf` (whose copy completed) is held until the
        // send ends.
        unsafe { conn.send_all(&mut iov, idle).await? };
        header_sent = true;
        if next < len
            && let Err(e) = issue(buf, &mut next, &mut pending)
        {
            failed = Some(e);
        }
    }
    match failed {
        None => Ok(()),
        Some(e) if !header_sent => refuse(e).await,
        // A copy could not be enqueued after the data began: the frame cannot be finished.
        Some(e) => Err(io::Error::other(e.to_string())),
    }
}
