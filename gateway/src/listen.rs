//! What a client may hold on a listener (`moongate serve` and `moongate master`), and for
//! how long, so a slow or idle client cannot pin the process's resources:
//!
//! - **Connections** (`--max-connections`): the accept loop takes a slot before it accepts
//!   ([`ClientLimits::slots`]); at the cap it stops accepting, so new connections wait in
//!   the kernel's listen backlog until one closes (once the backlog is full the kernel
//!   refuses them). Waiting rather than refusing lets a burst be served as soon as a slot
//!   frees, and never answers a client that did nothing wrong with a reset.
//! - **Request heads** (`--client-header-timeout-secs`): a new connection must deliver its
//!   first request head within the timeout (this covers the HTTP/1 / HTTP/2 detection,
//!   which has no deadline of its own), and every later HTTP/1 head too (hyper's header read
//!   timeout, which also closes an idle keep-alive connection). An idle HTTP/2 connection is
//!   pinged at that interval and closed when its peer stops answering.
//! - **Request bodies** (`--client-body-timeout-secs`): from the first read of a body, the
//!   whole body must arrive within the timeout ([`DeadlineBody`]). A body still arriving
//!   then fails the read, and the request is answered 408 in the OpenAI envelope with
//!   `Connection: close`, whatever the handler made of the failed read: the request ends, and
//!   what it held (its admission slot, its worker load) is released with it. The clock
//!   starts at the first read, not at the head, so a request waiting in the admission queue
//!   is not charged for the wait.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, Request, header};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use kvmaster::busy_poll::BusyPoll;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::config::{MasterHostConfig, ServeConfig};
use crate::error::GatewayError;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The limits of one listener (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// Time to deliver a request head (and the longest idle keep-alive).
    pub header_timeout: Duration,
    /// Time to deliver a whole request body, from its first read.
    pub body_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// How long an answered connection polls for its next request before sleeping
    /// ([`kvmaster::busy_poll`]).
    pub busy_poll: Duration,
}

impl From<&ServeConfig> for ClientLimits {
    fn from(c: &ServeConfig) -> Self {
        Self::new(
            c.client_header_timeout_secs,
            c.client_body_timeout_secs,
            c.max_connections,
            c.busy_poll_us,
        )
    }
}

impl From<&MasterHostConfig> for ClientLimits {
    fn from(c: &MasterHostConfig) -> Self {
        Self::new(
            c.client_header_timeout_secs,
            c.client_body_timeout_secs,
            c.max_connections,
            c.busy_poll_us,
        )
    }
}

impl ClientLimits {
    fn new(header_secs: u64, body_secs: u64, max_connections: usize, busy_poll_us: u64) -> Self {
        Self {
            header_timeout: Duration::from_secs(header_secs.max(1)),
            body_timeout: Duration::from_secs(body_secs.max(1)),
            max_connections: max_connections.max(1),
            busy_poll: Duration::from_micros(busy_poll_us),
        }
    }

    /// The connection slots of one listener: the accept loop holds one per open connection.
    pub fn slots(&self) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(
            self.max_connections.min(Semaphore::MAX_PERMITS),
        ))
    }

    /// The HTTP/1 + HTTP/2 connection builder with these limits' timers.
    pub fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut b = auto::Builder::new(TokioExecutor::new());
        b.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        b.http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.header_timeout);
        b
    }
}

/// Serves one accepted connection with `svc` (HTTP/1.1 keep-alive, or HTTP/2 with prior
/// knowledge) under `limits`, watched by `graceful`; closes it when no request head arrives
/// within the header timeout. Resolves when the connection is closed.
pub fn serve_connection<I, S>(
    io: I,
    svc: S,
    limits: ClientLimits,
    builder: &auto::Builder<TokioExecutor>,
    watcher: Watcher,
) -> impl Future<Output = ()> + Send + 'static
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<Request<DeadlineBody<Incoming>>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Unpin + Send + 'static,
{
    let started = Arc::new(AtomicBool::new(false));
    let svc = Guarded {
        inner: svc,
        body_timeout: limits.body_timeout,
        started: started.clone(),
    };
    let conn = builder
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc))
        .into_owned();
    let conn = watcher.watch(conn);
    async move {
        tokio::pin!(conn);
        let first_head = tokio::time::sleep(limits.header_timeout);
        let done = tokio::select! {
            r = &mut conn => Some(r),
            _ = first_head => None,
        };
        let r = match done {
            Some(r) => r,
            None if !started.load(Ordering::Acquire) => {
                tracing::debug!(
                    secs = limits.header_timeout.as_secs(),
                    "connection closed: no request head in time (--client-header-timeout-secs)"
                );
                return;
            }
            None => conn.await,
        };
        if let Err(e) = r {
            tracing::debug!(error = %e, "connection closed with an error");
        }
    }
}

/// The per-connection service: marks that a request arrived, gives each request body its
/// deadline, and answers 408 for a request whose body missed it.
#[derive(Debug, Clone)]
struct Guarded<S> {
    inner: S,
    body_timeout: Duration,
    started: Arc<AtomicBool>,
}

impl<S> tower::Service<Request<Incoming>> for Guarded<S>
where
    S: tower::Service<Request<DeadlineBody<Incoming>>, Response = Response, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Answer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        self.started.store(true, Ordering::Release);
        let late = Arc::new(AtomicBool::new(false));
        let limit = self.body_timeout;
        let req = req.map(|b| DeadlineBody::new(b, limit, late.clone()));
        Answer {
            inner: self.inner.call(req),
            late,
            limit,
        }
    }
}

/// The answer to one request: the service's, or 408 when its body missed the deadline.
#[derive(Debug)]
pub struct Answer<F> {
    inner: F,
    late: Arc<AtomicBool>,
    limit: Duration,
}

impl<F> Future for Answer<F>
where
    F: Future<Output = Result<Response, Infallible>> + Unpin,
{
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let resp = std::task::ready!(Pin::new(&mut self.inner).poll(cx))?;
        if self.late.load(Ordering::Acquire) {
            return Poll::Ready(Ok(too_slow(self.limit)));
        }
        Poll::Ready(Ok(resp))
    }
}

/// The answer to a body that missed its deadline: 408, OpenAI envelope, connection closed.
fn too_slow(limit: Duration) -> Response {
    let mut resp = GatewayError::BodyTimeout {
        secs: limit.as_secs(),
    }
    .into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// The body did not arrive within `--client-body-timeout-secs`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyDeadlineMissed(pub Duration);

/// A request body with a deadline: the whole body must arrive within `limit` of its first
/// read, else the read fails (and the request is answered 408, see the module doc).
#[derive(Debug)]
pub struct DeadlineBody<B> {
    inner: B,
    limit: Duration,
    /// Set at the first read.
    deadline: Option<Instant>,
    /// Made only when a read has to wait.
    timer: Option<Pin<Box<Sleep>>>,
    late: Arc<AtomicBool>,
}

impl<B> DeadlineBody<B> {
    /// `inner` with `limit` from its first read; `late` is set when it is missed.
    pub fn new(inner: B, limit: Duration, late: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            limit,
            deadline: None,
            timer: None,
            late,
        }
    }
}

impl<B> http_body::Body for DeadlineBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.late.load(Ordering::Relaxed) {
            return Poll::Ready(None);
        }
        let deadline = *this
            .deadline
            .get_or_insert_with(|| Instant::now() + this.limit);
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(r) => Poll::Ready(r.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.as_mut().poll(cx).is_ready() {
                    this.late.store(true, Ordering::Release);
                    return Poll::Ready(Some(Err(BodyDeadlineMissed(this.limit).into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.late.load(Ordering::Relaxed) || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `svc` on `listener` (HTTP/1.1 keep-alive, or HTTP/2 with prior knowledge;
/// TCP_NODELAY on every connection; with `tls`, each connection's TLS handshake first,
/// bounded by [`crate::tls::HANDSHAKE_TIMEOUT`], then HTTP/1.1 or HTTP/2 by ALPN) under
/// `limits` (connection cap, header and body deadlines) until `stop`
/// fires; then stops accepting, asks every connection to finish its current request and
/// close, waits up to `grace` for that, and aborts the connections still open. Connection
/// tasks live in a [`JoinSet`], so none outlives this function.
pub async fn accept_loop<S>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    svc: S,
    stop: CancellationToken,
    grace: Duration,
    limits: ClientLimits,
) -> std::io::Result<()>
where
    S: tower::Service<
            http::Request<DeadlineBody<hyper::body::Incoming>>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Unpin + Send + 'static,
{
    let builder = limits.builder();
    let graceful = GracefulShutdown::new();
    let slots = limits.slots();
    let mut conns = JoinSet::new();
    loop {
        let (tcp, peer, slot) = tokio::select! {
            // Reap finished connections so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            // A slot first: at the cap, new connections wait in the listen backlog.
            r = accept_with_slot(&listener, &slots) => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let _ = tcp.set_nodelay(true);
        // Every request of the connection carries the caller's address (`ConnectInfo`):
        // the admin plane answers loopback callers only when no admin key is set.
        let (svc, builder, watcher, tls) = (
            WithPeer::new(svc.clone(), peer),
            builder.clone(),
            graceful.watcher(),
            tls.clone(),
        );
        conns.spawn(async move {
            match tls {
                None => {
                    let conn = BusyPoll::new(tcp, limits.busy_poll);
                    serve_connection(conn, svc, limits, &builder, watcher).await
                }
                Some(acceptor) => {
                    // The handshake counts against the header deadline's purpose too: it is
                    // bounded on its own (a TLS client that never finishes holds nothing).
                    if let Some(stream) = crate::tls::handshake(&acceptor, tcp).await {
                        let conn = BusyPoll::new(stream, limits.busy_poll);
                        serve_connection(conn, svc, limits, &builder, watcher).await;
                    }
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(grace, async {
        graceful.shutdown().await;
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = conns.len(),
            grace_secs = grace.as_secs(),
            "in-flight requests cut at the end of the grace period"
        );
        conns.shutdown().await;
    }
    Ok(())
}

/// The next connection, once a connection slot is free.
async fn accept_with_slot(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    // The semaphore is never closed.
    let slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(std::io::Error::other)?;
    let (tcp, peer) = listener.accept().await?;
    Ok((tcp, peer, slot))
}

/// A future that resolves when the process is asked to stop (Ctrl-C / SIGINT, or SIGTERM on
/// Unix). The handlers are installed when this is called, not when the future is first
/// polled, so call it before announcing readiness. Needs a tokio runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        let int = signal(SignalKind::interrupt()).ok();
        let term = signal(SignalKind::terminate()).ok();
        let recv = |s: Option<Signal>| async move {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        async move {
            tokio::select! {
                _ = recv(int) => {}
                _ = recv(term) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body that sends one byte per `every`, `n` bytes in all.
    fn trickle(n: usize, every: Duration) -> axum::body::Body {
        let s = futures::stream::unfold(0, move |i| async move {
            if i == n {
                return None;
            }
            tokio::time::sleep(every).await;
            Some((Ok::<_, std::io::Error>(Bytes::from_static(b"x")), i + 1))
        });
        axum::body::Body::from_stream(s)
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_fails_at_the_deadline_from_its_first_read() {
        let late = Arc::new(AtomicBool::new(false));
        let body = DeadlineBody::new(
            trickle(100, Duration::from_secs(1)),
            Duration::from_secs(10),
            late.clone(),
        );
        // Waiting before the first read costs nothing.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let start = Instant::now();
        let err = body.collect().await.unwrap_err();
        assert!(err.is::<BodyDeadlineMissed>(), "{err}");
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert!(late.load(Ordering::Relaxed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_in_time_is_untouched() {
        let late = Arc::new(AtomicBool::new(false));
        let body = DeadlineBody::new(
            trickle(9, Duration::from_secs(1)),
            Duration::from_secs(10),
            late.clone(),
        );
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"xxxxxxxxx");
        assert!(!late.load(Ordering::Relaxed));
    }
}

/// A service whose every request carries the connection's peer address as axum's
/// `ConnectInfo<SocketAddr>` (what `into_make_service_with_connect_info` would add), for any
/// service the accept loop serves.
#[derive(Clone)]
pub struct WithPeer<S> {
    inner: S,
    peer: std::net::SocketAddr,
}

impl<S> WithPeer<S> {
    /// `inner`, for the connection from `peer`.
    pub fn new(inner: S, peer: std::net::SocketAddr) -> Self {
        Self { inner, peer }
    }
}

impl<S, B> tower::Service<Request<B>> for WithPeer<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(self.peer));
        self.inner.call(req)
    }
}
