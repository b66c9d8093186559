//! Respond: relay the worker's response to the client as it arrives, frame by frame (SSE
//! included: each `data:` chunk is passed on when the worker sends it, and the stream ends
//! when the worker ends it, after `data: [DONE]`). Nothing is buffered.
//!
//! The response body owns the request's [`LoadGuard`]: the worker's in-flight count drops
//! when the body ends, or when the client goes away and the server drops the body. It also
//! owns the request deadline: a body still streaming at `--request-timeout-secs` is cut. A
//! body the worker breaks counts against its circuit breaker.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

use super::dispatch::is_hop_by_hop;
use crate::workers::LoadGuard;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The relayed body (see the module doc).
pub struct RelayBody {
    inner: Incoming,
    guard: Option<LoadGuard>,
    deadline: Pin<Box<Sleep>>,
}

/// The worker's body outlived `--request-timeout-secs`.
#[derive(Debug, thiserror::Error)]
#[error("worker response exceeded the request timeout")]
pub struct BodyTimeout;

impl http_body::Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.guard = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(e))) => {
                // The worker broke the answer: a failure for its breaker (the client has
                // bytes already, so nothing is retried).
                if let Some(g) = this.guard.take() {
                    g.worker().record(crate::workers::Outcome::Failure);
                }
                tracing::debug!(error = %e, "worker response body failed");
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    this.guard = None;
                    return Poll::Ready(Some(Err(BodyTimeout.into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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

/// The client's response: the worker's status and end-to-end headers, and its body relayed.
pub fn relay(
    resp: http::Response<Incoming>,
    guard: LoadGuard,
    deadline: Pin<Box<Sleep>>,
) -> Response {
    let (mut parts, inner) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = RelayBody {
        inner,
        guard: Some(guard),
        deadline,
    };
    Response::from_parts(parts, Body::new(body))
}
