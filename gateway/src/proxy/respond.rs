//! Respond: relay the worker's response to the client as it arrives, frame by frame (SSE
//! included: each `data:` chunk is passed on when the worker sends it, and the stream ends
//! when the worker ends it, after `data: [DONE]`). Nothing is buffered unless the answer is
//! rewritten, and then only up to a bound.
//!
//! [`RelayBody`] is the one response body of both routers. It owns the request's
//! [`LoadGuard`]: the worker's in-flight count drops when the body ends, or when the client
//! goes away and the server drops the body. It also owns the request deadline: a body still
//! streaming at `--request-timeout-secs` is cut. A body the worker breaks counts against
//! its circuit breaker. On top of the plain relay it can
//! - rewrite the answer on its way ([`super::body`]: PD's logprob merge, the error
//!   envelope);
//! - drive a [`Companion`] alongside (PD: the prefill request, whose failure can end the
//!   answer with an error event), handed off to finish on its own when the answer ends;
//! - send bytes already read before the rest ([`RelayBody::queue`]).
//!
//! [`relay`] puts a worker's error answer that is not the OpenAI envelope into it
//! ([`super::envelope`]), so every documented error response holds.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, header};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use super::body::Rewrite;
use super::dispatch::is_hop_by_hop;
use super::envelope;
use crate::workers::{LoadGuard, Outcome, Worker};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The worker's body outlived `--request-timeout-secs`.
#[derive(Debug, thiserror::Error)]
#[error("worker response exceeded the request timeout")]
pub struct BodyTimeout;

/// Something driven while the answer is relayed (PD: the prefill request).
pub trait Companion: Send {
    /// Drives it as far as it goes without waiting: `Ready(Ok)` when it is done,
    /// `Ready(Err(Some(event)))` when it failed and the answer must end with `event`,
    /// `Ready(Err(None))` when it failed and the answer goes on.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Option<Bytes>>>;
    /// The answer ended first: it finishes on its own, until `until` at the latest.
    fn detach(self: Box<Self>, until: Instant);
}

/// The relayed body (see the module doc).
pub struct RelayBody {
    inner: Option<Incoming>,
    guard: Option<LoadGuard>,
    deadline: Pin<Box<Sleep>>,
    /// Bytes to send before anything else (then the end, when `inner` is gone).
    queued: Option<Bytes>,
    rewrite: Option<Box<dyn Rewrite>>,
    companion: Option<Box<dyn Companion>>,
    /// When the request started, and what to tell when the first frame arrives.
    first_frame: Option<(Instant, fn(Duration))>,
    /// How a broken body is charged to the worker.
    on_break: fn(&Worker),
}

impl std::fmt::Debug for RelayBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayBody")
            .field("open", &self.inner.is_some())
            .field("rewritten", &self.rewrite.is_some())
            .field("companion", &self.companion.is_some())
            .finish()
    }
}

fn charge_failure(w: &Worker) {
    w.record(Outcome::Failure);
}

impl RelayBody {
    /// `inner` relayed as it is, holding `guard` until it ends and cut at `deadline`.
    pub fn new(inner: Incoming, guard: LoadGuard, deadline: Pin<Box<Sleep>>) -> Self {
        Self {
            inner: Some(inner),
            guard: Some(guard),
            deadline,
            queued: None,
            rewrite: None,
            companion: None,
            first_frame: None,
            on_break: charge_failure,
        }
    }

    /// Rewrites the bytes with `rewrite`.
    pub fn rewrite(mut self, rewrite: Box<dyn Rewrite>) -> Self {
        self.rewrite = Some(rewrite);
        self
    }

    /// Drives `companion` alongside.
    pub fn companion(mut self, companion: Box<dyn Companion>) -> Self {
        self.companion = Some(companion);
        self
    }

    /// Sends `bytes` (already read from the worker's body) first.
    pub fn queue(mut self, bytes: Bytes) -> Self {
        self.queued = Some(bytes).filter(|b| !b.is_empty());
        self
    }

    /// Calls `report` with the time since `start` when the first frame arrives.
    pub fn on_first_frame(mut self, start: Instant, report: fn(Duration)) -> Self {
        self.first_frame = Some((start, report));
        self
    }

    /// Charges a broken body to the worker with `charge` (default: a failure).
    pub fn on_break(mut self, charge: fn(&Worker)) -> Self {
        self.on_break = charge;
        self
    }

    /// The worker's body is over (ended, broke or timed out): release what it held.
    fn ended(&mut self) {
        self.inner = None;
        self.guard = None;
        if let Some(c) = self.companion.take() {
            c.detach(self.deadline.deadline());
        }
    }
}

impl http_body::Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(c) = &mut this.companion {
            match c.poll(cx) {
                Poll::Ready(Ok(())) | Poll::Ready(Err(None)) => this.companion = None,
                Poll::Ready(Err(Some(event))) => {
                    // The answer cannot go on: stop the worker's body, send the event.
                    this.companion = None;
                    this.ended();
                    this.rewrite = None;
                    this.queued = Some(event);
                }
                Poll::Pending => {}
            }
        }
        if let Some(q) = this.queued.take() {
            return Poll::Ready(Some(Ok(Frame::data(q))));
        }
        loop {
            let Some(inner) = &mut this.inner else {
                return Poll::Ready(None);
            };
            match Pin::new(inner).poll_frame(cx) {
                Poll::Ready(None) => {
                    let rest = this.rewrite.as_mut().map(|r| r.finish());
                    this.ended();
                    return match rest {
                        Some(rest) if !rest.is_empty() => Poll::Ready(Some(Ok(Frame::data(rest)))),
                        _ => Poll::Ready(None),
                    };
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some((start, report)) = this.first_frame.take() {
                        report(start.elapsed());
                    }
                    // Output has begun: the worker is done prefilling this prompt.
                    if let Some(g) = this.guard.as_mut() {
                        g.prefill_done();
                    }
                    match (&mut this.rewrite, frame.into_data()) {
                        (Some(rw), Ok(data)) => {
                            let out = rw.push(&data);
                            // What the rewrite holds back comes out later.
                            if out.is_empty() {
                                continue;
                            }
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                        (None, Ok(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                        (_, Err(frame)) => return Poll::Ready(Some(Ok(frame))),
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    // The worker broke the answer: a failure for its breaker (the client has
                    // bytes already, so nothing is retried).
                    if let Some(g) = &this.guard {
                        (this.on_break)(g.worker());
                    }
                    tracing::debug!(error = %e, "worker response body failed");
                    this.ended();
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Pending => {
                    if this.deadline.as_mut().poll(cx).is_ready() {
                        this.ended();
                        return Poll::Ready(Some(Err(BodyTimeout.into())));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.queued.is_none()
            && match &self.inner {
                None => true,
                Some(i) => self.rewrite.is_none() && i.is_end_stream(),
            }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(i) if self.rewrite.is_none() && self.queued.is_none() => i.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

/// Removes the hop-by-hop headers of a worker's response (usually there are none).
pub fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    if headers.keys().any(is_hop_by_hop) {
        let names: Vec<_> = headers
            .keys()
            .filter(|n| is_hop_by_hop(n))
            .cloned()
            .collect();
        for n in names {
            headers.remove(n);
        }
    }
}

/// The client's response: the worker's status and end-to-end headers, and its body
/// relayed; an error answer that is not the OpenAI envelope is put into it.
pub fn relay(
    resp: http::Response<Incoming>,
    guard: LoadGuard,
    deadline: Pin<Box<Sleep>>,
) -> Response {
    let (mut parts, inner) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let mut body = RelayBody::new(inner, guard, deadline);
    if envelope::needs_wrapping(parts.status, &parts.headers) {
        body = body.rewrite(Box::new(envelope::rewrite(parts.status)));
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    Response::from_parts(parts, Body::new(body))
}
