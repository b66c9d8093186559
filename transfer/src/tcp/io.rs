//! Socket I/O straight from and into registered memory: `recv` into raw pointers and
//! `sendmsg` of raw iovecs over a tokio `TcpStream`, so no Rust reference is ever made into
//! memory that peers write concurrently, and no intermediate buffer sits on the data path.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::memory::{Access, CpuLock, SendPtr};

/// Largest iovec count handed to one `sendmsg` (Linux `IOV_MAX`).
pub(crate) const MAX_IOV: usize = 1024;

/// A connected, non-blocking TCP socket shared by a reader and a writer task.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
}

/// One outgoing piece: a pointer and a length (an `iovec` whose validity the sender
/// guarantees until the send completes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct IoPiece {
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
}

// SAFETY: an IoPiece is an address and a length; whoever builds one guarantees the bytes
// stay readable until the send using it completes (see `Conn::send_all`), from any thread.
unsafe impl Send for IoPiece {}
// SAFETY: as above; sharing only exposes the address.
unsafe impl Sync for IoPiece {}

impl Conn {
    /// Wraps a connected stream and sets `TCP_NODELAY`.
    pub(crate) fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        Ok(Self { stream })
    }

    /// Receives at least one byte (or 0 at end of stream) into `ptr..ptr+len`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for writes until the returned future completes or is
    /// dropped.
    pub(crate) async unsafe fn recv_raw(&self, dst: SendPtr, len: usize) -> io::Result<usize> {
        let fd = self.stream.as_raw_fd();
        loop {
            self.stream.readable().await?;
            let r = self.stream.try_io(Interest::READABLE, || {
                // SAFETY: the caller guarantees dst..dst+len is writable for the call; recv
                // writes at most len bytes.
                let n = unsafe { libc::recv(fd, dst.0.cast(), len, 0) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match r {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Receives exactly `len` bytes into `ptr`; end of stream first is `UnexpectedEof`.
    /// Each wait for data is bounded by `idle` (then `TimedOut`).
    ///
    /// # Safety
    /// As [`Conn::recv_raw`].
    pub(crate) async unsafe fn recv_exact_raw(
        &self,
        dst: SendPtr,
        len: usize,
        idle: Duration,
    ) -> io::Result<()> {
        let mut done = 0;
        while done < len {
            // SAFETY: done < len, so dst+done..dst+len is inside the caller's valid range.
            let fut = unsafe { self.recv_raw(dst.add(done), len - done) };
            let n = match tokio::time::timeout(idle, fut).await {
                Ok(r) => r?,
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "peer stalled mid-frame",
                    ));
                }
            };
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-frame",
                ));
            }
            done += n;
        }
        Ok(())
    }

    /// Sends every byte of `pieces` (in order), `MAX_IOV` pieces per `sendmsg`, with
    /// `MSG_NOSIGNAL`. Each wait for buffer space is bounded by `idle`.
    ///
    /// # Safety
    /// Every piece must stay valid for reads until the returned future completes or is
    /// dropped.
    pub(crate) async unsafe fn send_all(
        &self,
        pieces: &mut [IoPiece],
        idle: Duration,
    ) -> io::Result<()> {
        let fd = self.stream.as_raw_fd();
        let mut first = 0;
        while first < pieces.len() {
            if pieces[first].len == 0 {
                first += 1;
                continue;
            }
            let end = (first + MAX_IOV).min(pieces.len());
            let batch = &pieces[first..end];
            let wrote = loop {
                match tokio::time::timeout(idle, self.stream.writable()).await {
                    Ok(r) => r?,
                    Err(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "peer stopped reading",
                        ));
                    }
                }
                let r = self.stream.try_io(Interest::WRITABLE, || {
                    let iov: Vec<libc::iovec> = batch
                        .iter()
                        .map(|p| libc::iovec {
                            iov_base: p.ptr as *mut libc::c_void,
                            iov_len: p.len,
                        })
                        .collect();
                    // SAFETY: msghdr is plain data; all-zero is valid before we fill it.
                    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
                    msg.msg_iovlen = iov.len();
                    // SAFETY: the iovecs point at memory the caller keeps readable for the
                    // call; sendmsg only reads from them.
                    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
                    if n < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(n as usize)
                    }
                });
                match r {
                    Ok(n) => break n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) =>
                    {
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            };
            // Advance past what was written.
            let mut left = wrote;
            while left > 0 && first < pieces.len() {
                let p = &mut pieces[first];
                if left >= p.len {
                    left -= p.len;
                    first += 1;
                } else {
                    p.ptr = p.ptr.wrapping_add(left);
                    p.len -= left;
                    left = 0;
                }
            }
        }
        Ok(())
    }

    /// Shuts both directions down so the other task sharing the socket wakes up with an
    /// error or end of stream.
    pub(crate) fn shutdown(&self) {
        // SAFETY: shutdown on our own descriptor has no memory-safety preconditions.
        unsafe { libc::shutdown(self.stream.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

/// A read-ahead buffer for headers and small payloads.
pub(crate) struct InBuf {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl InBuf {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            buf: vec![0u8; cap].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Buffered, unconsumed bytes.
    pub(crate) fn available(&self) -> usize {
        self.end - self.start
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub(crate) fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.available());
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Receives more bytes: at most `max` (so a large payload that follows can go straight
    /// to its destination). Returns 0 at end of stream.
    pub(crate) async fn fill(&mut self, conn: &Conn, max: usize) -> io::Result<usize> {
        if self.start > 0 && self.buf.len() - self.end < max {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = (self.buf.len() - self.end).min(max);
        debug_assert!(room > 0);
        // SAFETY: buf[end..end+room] is owned by self and not otherwise borrowed while the
        // future runs (we hold &mut self); end <= len so the pointer is in bounds.
        let dst = SendPtr(unsafe { self.buf.as_mut_ptr().add(self.end) });
        // SAFETY: as above; room bytes from dst are inside the buffer.
        let n = unsafe { conn.recv_raw(dst, room).await? };
        self.end += n;
        Ok(n)
    }

    /// Moves up to `len` buffered bytes to `dst` (or drops them if `dst` is null); returns
    /// how many were taken.
    ///
    /// # Safety
    /// A non-null `dst` must be valid for `len` bytes of writes.
    pub(crate) unsafe fn take_into(&mut self, dst: SendPtr, len: usize) -> usize {
        let n = len.min(self.available());
        if !dst.is_null() && n > 0 {
            // SAFETY: the source is inside our buffer; dst is valid for n <= len bytes per
            // the caller; a registered region never overlaps this private buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(self.buf.as_ptr().wrapping_add(self.start), dst.0, n)
            };
        }
        self.consume(n);
        n
    }
}

/// Where a payload lands in registered memory: the region's CPU lock and the offset of the
/// destination in it. The buffered head of the payload is copied by this thread, under the
/// lock (see `memory`); the rest is written by the kernel (`recv`).
pub(crate) type Dest<'a> = Option<(&'a CpuLock, usize)>;

/// Reads `len` payload bytes, taking the buffered part from `inbuf` and receiving the rest
/// straight into `dst` (or discarding everything if `dst` is null).
///
/// # Safety
/// A non-null `dst` must be valid for `len` bytes of writes until the future completes or is
/// dropped, and `dest`, when given, must be the lock of the region `dst` points into, with
/// `dst`'s offset in it.
pub(crate) async unsafe fn read_payload(
    conn: &Conn,
    inbuf: &mut InBuf,
    dst: SendPtr,
    len: usize,
    idle: Duration,
    dest: Dest<'_>,
) -> io::Result<()> {
    let took = {
        let head = len.min(inbuf.available());
        let _held = dest.map(|(lock, off)| lock.lock(off, head, Access::Write));
        // SAFETY: forwarded caller contract; the stripes written are held exclusively.
        unsafe { inbuf.take_into(dst, len) }
    };
    let rest = len - took;
    if rest == 0 {
        return Ok(());
    }
    if !dst.is_null() {
        // SAFETY: took <= len, so dst+took..dst+len is inside the caller's range.
        return unsafe { conn.recv_exact_raw(dst.add(took), rest, idle).await };
    }
    let mut scratch = vec![0u8; rest.min(1 << 20)];
    let mut left = rest;
    while left > 0 {
        let n = left.min(scratch.len());
        // SAFETY: scratch is a private buffer of at least n bytes.
        unsafe {
            conn.recv_exact_raw(SendPtr(scratch.as_mut_ptr()), n, idle)
                .await?
        };
        left -= n;
    }
    Ok(())
}

/// Reads a small payload (control data, error message) into a `Vec`.
pub(crate) async fn read_small(
    conn: &Conn,
    inbuf: &mut InBuf,
    len: usize,
    idle: Duration,
) -> io::Result<Vec<u8>> {
    let mut v = vec![0u8; len];
    // SAFETY: v is a private buffer of len bytes that outlives the call.
    unsafe { read_payload(conn, inbuf, SendPtr(v.as_mut_ptr()), len, idle, None).await? };
    Ok(v)
}
