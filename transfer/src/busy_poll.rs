//! Busy polling for request/answer traffic: the side that waits for the next message keeps
//! polling its socket for a short, bounded while instead of sleeping at once.
//!
//! Why: a store call is a chain of small request/answer pairs (put = put-start, write,
//! put-end). When the waiting process sleeps, the answer has to wake it, and on virtual
//! machines a wake-up across CPUs is an inter-processor interrupt through the hypervisor.
//! On the 2-vCPU virtual machines this project is measured on, a plain TCP ping-pong of
//! 200 bytes between two processes took 85-160 µs a round trip when both slept, 14 µs
//! with both pinned to one CPU, 21-27 µs when the asker polled and 8-10 µs when both did.
//! Bare metal pays less, but still several µs and a cooled cache per wake-up. Linux's
//! `SO_BUSY_POLL` does this for NIC queues only, not for loopback or for sockets polled
//! through epoll, hence this.
//!
//! How: a waiting task defers itself ([`tokio::task::yield_now`]'s deferral) instead of
//! only registering for readiness, so its runtime polls the I/O driver with a zero timeout
//! and polls the task again, until the message is there or the window is over; then it
//! parks as usual. The runtime thread stays busy for at most the window per wait, and
//! other tasks on it keep running in between.
//!
//! Spinning pays only when answers come within the window, so it adapts ([`Adaptive`]):
//! a wait that ends in time keeps spinning on; one that runs out skips the next 1, 2, 4,
//! ... up to [`MAX_SKIP`] waits before trying again. An idle or slow peer therefore costs
//! at most one window every `MAX_SKIP` waits.
//!
//! Nothing spins while this process is still faulting memory in on its idle-priority
//! threads ([`crate::memory::background_prefaults`]: its own segment or copy buffer
//! after start): the poll would take the idle CPU those threads run on, and the memory
//! would still be cold when the transfers reach it. Filling in the page tables of a peer's
//! mapping does not hold polling off: a copy does what is left at a minor fault per page.
//!
//! - [`spin`]: a client waiting for an answer (the store client's master calls).
//! - [`BusyPoll`]: a server's connection that, having answered, waits for the next
//!   request on it (the master's listeners).
//! - the KV master's listener for axum (`kvmaster::server::BusyListener`) makes every
//!   connection a [`BusyPoll`].

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Default window, µs, for both sides: how long a waiter polls before it sleeps. It covers
/// a small master call on a loaded 2-vCPU host even while the other side sleeps (85-100 µs
/// a round trip), so the two sides fall back into step after a miss; 100 µs did not.
/// A wait that needs longer sleeps after it.
pub const DEFAULT_BUSY_POLL_US: u64 = 200;

/// Largest window a setting may ask for, µs: beyond a few hundred µs a sleeping wait costs
/// less than the polling.
pub const MAX_BUSY_POLL_US: u64 = 10_000;

/// The problem with a window setting `name` of `us` µs, if any (above [`MAX_BUSY_POLL_US`]).
pub fn window_problem(name: &str, us: u64) -> Option<String> {
    (us > MAX_BUSY_POLL_US).then(|| {
        format!(
            "{name} must be at most {MAX_BUSY_POLL_US} (longer polls only burn a CPU), not {us}"
        )
    })
}

/// Most waits skipped after misses in a row (the backoff's cap).
pub const MAX_SKIP: u32 = 64;

/// Whether the next wait should spin: a miss skips the next 1, 2, 4, ... [`MAX_SKIP`] waits,
/// a hit resets. Shared by the concurrent calls of one client (atomics, no lock).
#[derive(Debug, Default)]
pub struct Adaptive {
    /// Waits still to skip.
    skip: AtomicU32,
    /// Skips after the next miss, doubled by each miss.
    backoff: AtomicU32,
}

impl Adaptive {
    /// Whether this wait spins (counts a skipped one down). Never while this process's
    /// memory is being faulted in in the background.
    pub fn should_spin(&self) -> bool {
        if memory_being_faulted_in() {
            return false;
        }
        self.skip
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| s.checked_sub(1))
            .is_err()
    }

    /// Waits still to skip before the next spin (0: the next wait spins).
    pub fn skipping(&self) -> u32 {
        self.skip.load(Ordering::Relaxed)
    }

    /// A spinning wait ended within its window.
    pub fn hit(&self) {
        self.backoff.store(0, Ordering::Relaxed);
        self.skip.store(0, Ordering::Relaxed);
    }

    /// A spinning wait ran out of its window.
    pub fn miss(&self) {
        let b = (self.backoff.load(Ordering::Relaxed) * 2).clamp(1, MAX_SKIP);
        self.backoff.store(b, Ordering::Relaxed);
        self.skip.store(b, Ordering::Relaxed);
    }
}

/// Whether this process's idle-priority threads are still faulting memory in.
#[cfg(not(test))]
fn memory_being_faulted_in() -> bool {
    crate::memory::background_prefaults() > 0
}

// Unit tests run beside others that start store clients (and their prefault threads) in
// the same process: here the count is this test thread's own setting.
#[cfg(test)]
thread_local! {
    static FAULTING_IN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn memory_being_faulted_in() -> bool {
    FAULTING_IN.with(|f| f.get())
}

/// Asks the runtime to poll the current task again after its next zero-timeout turn of
/// the I/O driver (what [`tokio::task::yield_now`] does on its first poll).
fn defer(cx: &mut Context<'_>) {
    let mut y = pin!(tokio::task::yield_now());
    let _ = y.as_mut().poll(cx);
}

/// Awaits `fut`, polling for up to `window` before letting the task sleep (when `adaptive`
/// says spinning pays). A zero window is a plain `.await`.
pub async fn spin<F: Future>(fut: F, window: Duration, adaptive: &Adaptive) -> F::Output {
    if window.is_zero() || !adaptive.should_spin() {
        return fut.await;
    }
    let mut fut = pin!(fut);
    let start = Instant::now();
    loop {
        if let Poll::Ready(v) = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
        {
            adaptive.hit();
            return v;
        }
        if start.elapsed() >= window {
            adaptive.miss();
            return fut.await;
        }
        tokio::task::yield_now().await;
    }
}

/// A server connection that, once it has answered, polls for the next request for up to
/// its window (see the module doc). Reads and writes go straight through.
#[derive(Debug)]
pub struct BusyPoll<T> {
    io: T,
    window: Duration,
    adaptive: Adaptive,
    /// When the last answer was written, while waiting for the next request.
    answered: Option<Instant>,
    /// A request was read and its answer not yet written.
    serving: bool,
    /// This wait for a request spins.
    spinning: bool,
}

impl<T> BusyPoll<T> {
    /// Wraps `io`; a zero `window` never spins.
    pub fn new(io: T, window: Duration) -> Self {
        Self {
            io,
            window,
            adaptive: Adaptive::default(),
            answered: None,
            serving: false,
            spinning: false,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    fn wrote(&mut self, cx: &mut Context<'_>) {
        self.answered = Some(Instant::now());
        if std::mem::take(&mut self.serving) {
            self.spinning = !self.window.is_zero() && self.adaptive.should_spin();
        }
        if self.spinning {
            // The server may not read again before the next readiness event: have it
            // polled, so the read below spins.
            defer(cx);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for BusyPoll<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        match &r {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                if std::mem::take(&mut self.spinning) {
                    self.adaptive.hit();
                }
                self.answered = None;
                self.serving = true;
            }
            Poll::Pending if self.spinning => match self.answered {
                Some(t) if t.elapsed() < self.window => defer(cx),
                _ => {
                    self.spinning = false;
                    self.adaptive.miss();
                }
            },
            _ => {}
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for BusyPoll<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.wrote(cx);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.wrote(cx);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
