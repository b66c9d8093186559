//! One attempt of a PD request: both requests in flight at once, each side's failure
//! cancelling the other, and decode's answer relayed while the prefill's is driven to its
//! end.
//!
//! Before the client gets a response head, the attempt waits (until the request deadline)
//! for decode's head and the prefill's head (and the prefill's whole body when its
//! logprobs are merged). Whichever fails first decides: a connection refused, a server
//! error, a broken connection or the deadline is charged to that side's worker (its
//! failure count and circuit breaker), the other request is dropped (which closes its
//! connection: a decode waiting for KV that will never come stops at once), and the
//! client gets 502/504 naming the side. A worker's client error (4xx) is handed back as
//! the worker sent it, charged to nobody. The router may retry a [`Failure`] on a new
//! pair ([`Failure::retryable`]); nothing has reached the client yet. A side whose head
//! arrives with a success status is recorded as a success with its breaker.
//!
//! Once decode's head is relayed, [`PdBody`] keeps driving the prefill's body while it
//! relays decode's: if the prefill breaks during a stream, the stream ends with an error
//! event (decode's request is dropped); the prefill's load guard is released when its own
//! body ends.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::ResponseFuture;
use tokio::time::{Instant, Sleep};

use super::merge::{PrefillLogprobs, SseRewriter};
use crate::error::{GatewayError, PdFailure, PdSide};
use crate::metrics;
use crate::proxy::dispatch::DispatchError;
use crate::proxy::respond::{self, BodyTimeout, strip_hop_by_hop};
use crate::proxy::retry::is_retryable_status;
use crate::workers::{LoadGuard, Outcome, Worker};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why one side failed.
#[derive(Debug)]
pub enum SideError {
    /// The request failed before a response head (connection refused or broken).
    Dispatch(DispatchError),
    /// The worker answered a non-success status.
    Status(http::Response<Incoming>),
    /// The response body broke.
    Body(String),
}

/// A failed side: what the client is told and what the worker is charged with.
#[derive(Debug)]
pub struct Failure {
    /// Which side.
    pub side: PdSide,
    /// The worker that failed.
    pub worker: Arc<Worker>,
    /// How.
    pub failure: PdFailure,
    /// The cause, for the log.
    pub cause: String,
    /// Worth another attempt on a new pair (the worker could not be reached, broke the
    /// connection, or answered 408/429/500/502/503/504; not a timeout).
    pub retryable: bool,
    /// The worker's own answer, when it refused the request with a client error (4xx):
    /// relayed as it is unless the request is retried.
    pub answer: Option<http::Response<Incoming>>,
}

impl Failure {
    fn new(side: PdSide, worker: &Arc<Worker>, e: SideError, timeout_secs: u64) -> Self {
        let mut answer = None;
        let (failure, cause, retryable) = match e {
            SideError::Dispatch(DispatchError::Connect(c)) => (PdFailure::Unavailable, c, true),
            SideError::Dispatch(DispatchError::Failed(c)) => (PdFailure::BadGateway, c, true),
            SideError::Dispatch(DispatchError::Timeout) => (
                PdFailure::Timeout(timeout_secs),
                "no answer before the request deadline".into(),
                false,
            ),
            SideError::Dispatch(DispatchError::Build(c)) => (PdFailure::BadGateway, c, false),
            SideError::Status(r) => {
                let status = r.status();
                if status.is_client_error() {
                    answer = Some(r);
                }
                (
                    PdFailure::BadGateway,
                    format!("answered {status}"),
                    is_retryable_status(status),
                )
            }
            SideError::Body(c) => (
                PdFailure::BadGateway,
                format!("response body broke: {c}"),
                true,
            ),
        };
        Self {
            side,
            worker: worker.clone(),
            failure,
            cause,
            retryable,
            answer,
        }
    }

    /// Counts the failure in metrics and, unless the worker answered a client error,
    /// against its worker (failure count, circuit breaker, a health probe).
    pub fn charge(&self) {
        if self.answer.is_some() {
            metrics::pd_failure(self.side, None);
            return;
        }
        self.worker.record(Outcome::Failure);
        metrics::pd_failure(self.side, Some(self.failure));
    }

    /// What the client gets when the request is not retried: the worker's own answer
    /// (a client error, relayed until `deadline`), or the gateway's error.
    pub fn finish(self, deadline: &mut Pin<Box<Sleep>>) -> Result<Response, GatewayError> {
        match self.answer {
            Some(resp) => {
                let guard = LoadGuard::new(self.worker.clone());
                Ok(respond::relay(resp, guard, reset(deadline)))
            }
            None => Err(self.into_error()),
        }
    }

    /// The client-facing error.
    pub fn into_error(self) -> GatewayError {
        GatewayError::PdUpstream {
            side: self.side,
            failure: self.failure,
            worker: self.worker.url().as_str().to_string(),
            cause: self.cause,
        }
    }
}

enum State {
    Head(ResponseFuture),
    Body(Incoming),
    Done,
}

/// The prefill half of an exchange: its head, then its body, driven to the end (kept when
/// its logprobs are merged, else discarded). Its load guard is released at the end.
pub struct PrefillSide {
    state: State,
    worker: Arc<Worker>,
    guard: Option<LoadGuard>,
    collected: Option<BytesMut>,
}

impl PrefillSide {
    /// The prefill request `fut` on the worker `guard` counts on; `collect`: keep its body.
    pub fn new(fut: ResponseFuture, guard: LoadGuard, collect: bool) -> Self {
        Self {
            state: State::Head(fut),
            worker: guard.worker().clone(),
            guard: Some(guard),
            collected: collect.then(BytesMut::new),
        }
    }

    /// The worker.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// The head arrived (with a success status).
    pub fn head_ok(&self) -> bool {
        !matches!(self.state, State::Head(_))
    }

    /// The body ended.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The collected body.
    pub fn take_body(&mut self) -> Bytes {
        self.collected
            .take()
            .map(BytesMut::freeze)
            .unwrap_or_default()
    }

    /// Drives the prefill as far as it goes without waiting.
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SideError>> {
        loop {
            match &mut self.state {
                State::Head(fut) => match Pin::new(fut).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => {
                        self.finish();
                        return Poll::Ready(Err(SideError::Dispatch(DispatchError::from_client(
                            e,
                        ))));
                    }
                    Poll::Ready(Ok(resp)) if !resp.status().is_success() => {
                        self.finish();
                        return Poll::Ready(Err(SideError::Status(resp)));
                    }
                    Poll::Ready(Ok(resp)) => {
                        self.worker.record(Outcome::Success);
                        self.state = State::Body(resp.into_body());
                    }
                },
                State::Body(body) => match Pin::new(body).poll_frame(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(None) => {
                        self.finish();
                        return Poll::Ready(Ok(()));
                    }
                    Poll::Ready(Some(Err(e))) => {
                        self.finish();
                        return Poll::Ready(Err(SideError::Body(e.to_string())));
                    }
                    Poll::Ready(Some(Ok(frame))) => {
                        if let (Some(buf), Ok(data)) = (&mut self.collected, frame.into_data()) {
                            buf.extend_from_slice(&data);
                        }
                    }
                },
                State::Done => return Poll::Ready(Ok(())),
            }
        }
    }

    fn finish(&mut self) {
        self.state = State::Done;
        self.guard = None;
    }
}

/// What one attempt needs to know.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Logprobs to merge from the prefill.
    pub merge: super::fields::MergeKind,
    /// The client asked for a stream.
    pub stream: bool,
    /// The request timeout, for messages.
    pub timeout_secs: u64,
}

/// Runs one attempt: `prefill` and `decode` are both requests already built for their
/// workers. Returns the client's response, or the side that failed.
pub async fn run(
    prefill: PrefillSide,
    decode: ResponseFuture,
    decode_guard: LoadGuard,
    plan: Plan,
    deadline: &mut Pin<Box<Sleep>>,
) -> Result<Response, Failure> {
    let started = Instant::now();
    let mut prefill = prefill;
    let mut decode = decode;
    let mut head: Option<http::Response<Incoming>> = None;
    let merging = plan.merge != super::fields::MergeKind::None;
    let decode_worker = decode_guard.worker().clone();
    let fail = |side, worker: &Arc<Worker>, e| Failure::new(side, worker, e, plan.timeout_secs);

    // Phase 1: both heads (and the prefill's body when merging), or the first failure.
    let waited = poll_fn(|cx| {
        if !prefill.is_done()
            && let Poll::Ready(Err(e)) = prefill.poll(cx)
        {
            return Poll::Ready(Err((PdSide::Prefill, e)));
        }
        if head.is_none() {
            match Pin::new(&mut decode).poll(cx) {
                Poll::Ready(Ok(r)) => head = Some(r),
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Err((
                        PdSide::Decode,
                        SideError::Dispatch(DispatchError::from_client(e)),
                    )));
                }
                Poll::Pending => {}
            }
        }
        if let Some(h) = &head {
            let prefill_ready = if merging {
                prefill.is_done()
            } else {
                prefill.head_ok()
            };
            if !h.status().is_success() || prefill_ready {
                return Poll::Ready(Ok(()));
            }
        }
        if deadline.as_mut().poll(cx).is_ready() {
            // The prefill is upstream of decode: if it has not answered, it is the one stuck.
            let prefill_late = !prefill.head_ok() || (merging && !prefill.is_done());
            let side = if prefill_late {
                PdSide::Prefill
            } else {
                PdSide::Decode
            };
            return Poll::Ready(Err((side, SideError::Dispatch(DispatchError::Timeout))));
        }
        Poll::Pending
    })
    .await;

    if let Err((side, e)) = waited {
        let worker = match side {
            PdSide::Prefill => prefill.worker().clone(),
            PdSide::Decode => decode_worker,
        };
        return Err(fail(side, &worker, e));
    }
    let Some(head) = head else {
        unreachable!("phase 1 ends with decode's head or an error")
    };
    if !head.status().is_success() {
        return Err(fail(
            PdSide::Decode,
            &decode_worker,
            SideError::Status(head),
        ));
    }
    decode_worker.record(Outcome::Success);

    // Phase 2: decode's answer.
    let (mut parts, body) = head.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if !merging {
        let body = PdBody {
            decode: Some(body),
            guard: Some(decode_guard),
            prefill: Some(prefill).filter(|p| !p.is_done()),
            deadline: reset(deadline),
            started: Some(started),
            stream: plan.stream,
            rewriter: None,
            ending: None,
        };
        return Ok(Response::from_parts(parts, Body::new(body)));
    }
    let logprobs = PrefillLogprobs::from_body(plan.merge, &prefill.take_body(), plan.stream);
    if plan.stream {
        let body = PdBody {
            decode: Some(body),
            guard: Some(decode_guard),
            prefill: None,
            deadline: reset(deadline),
            started: Some(started),
            stream: true,
            rewriter: Some(SseRewriter::new(logprobs)),
            ending: None,
        };
        parts.headers.remove(http::header::CONTENT_LENGTH);
        return Ok(Response::from_parts(parts, Body::new(body)));
    }
    let whole = tokio::select! {
        r = body.collect() => r.map(|c| c.to_bytes()).map_err(|e| SideError::Body(e.to_string())),
        _ = deadline.as_mut() => Err(SideError::Dispatch(DispatchError::Timeout)),
    };
    let whole = whole.map_err(|e| fail(PdSide::Decode, &decode_worker, e))?;
    metrics::pd_decode_first_byte(started.elapsed());
    drop(decode_guard);
    let mut logprobs = logprobs;
    let merged = logprobs
        .merge_whole(&whole)
        .map(Bytes::from)
        .unwrap_or(whole);
    parts.headers.remove(http::header::CONTENT_LENGTH);
    Ok(Response::from_parts(parts, Body::from(merged)))
}

/// The deadline, moved out for the response body (the attempt is over).
fn reset(deadline: &mut Pin<Box<Sleep>>) -> Pin<Box<Sleep>> {
    let at = deadline.deadline();
    std::mem::replace(deadline, Box::pin(tokio::time::sleep_until(at)))
}

/// Decode's body relayed to the client (see the module doc).
pub struct PdBody {
    decode: Option<Incoming>,
    guard: Option<LoadGuard>,
    prefill: Option<PrefillSide>,
    deadline: Pin<Box<Sleep>>,
    started: Option<Instant>,
    stream: bool,
    rewriter: Option<SseRewriter>,
    /// An error event to send, then the end.
    ending: Option<Bytes>,
}

impl PdBody {
    /// The prefill broke while decode's answer was being relayed.
    fn prefill_failed(&mut self, e: SideError) {
        let Some(p) = self.prefill.take() else {
            return;
        };
        let failure = Failure::new(PdSide::Prefill, p.worker(), e, 0);
        failure.charge();
        tracing::warn!(worker = %p.worker().url().as_str(), cause = %failure.cause,
            "prefill failed while decode's answer was relayed");
        if self.stream {
            // Decode would wait for KV that is not coming: stop it and tell the client.
            self.decode = None;
            self.guard = None;
            let env = failure.into_error().envelope();
            let mut event = b"data: ".to_vec();
            let _ = serde_json::to_writer(&mut event, &env);
            event.extend_from_slice(b"\n\ndata: [DONE]\n\n");
            self.ending = Some(Bytes::from(event));
        }
    }

    /// Decode's body ended: the prefill, if still going, finishes in the background.
    fn decode_ended(&mut self) {
        self.guard = None;
        self.decode = None;
        if let Some(mut p) = self.prefill.take() {
            let until = self.deadline.deadline();
            tokio::spawn(async move {
                let _ = tokio::time::timeout_at(until, poll_fn(|cx| p.poll(cx))).await;
            });
        }
    }
}

impl http_body::Body for PdBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(p) = &mut this.prefill {
            match p.poll(cx) {
                Poll::Ready(Ok(())) => this.prefill = None,
                Poll::Ready(Err(e)) => this.prefill_failed(e),
                Poll::Pending => {}
            }
        }
        if let Some(event) = this.ending.take() {
            return Poll::Ready(Some(Ok(Frame::data(event))));
        }
        loop {
            let Some(decode) = &mut this.decode else {
                return Poll::Ready(None);
            };
            match Pin::new(decode).poll_frame(cx) {
                Poll::Ready(None) => {
                    let rest = this.rewriter.as_mut().map(SseRewriter::finish);
                    this.decode_ended();
                    return match rest {
                        Some(rest) if !rest.is_empty() => Poll::Ready(Some(Ok(Frame::data(rest)))),
                        _ => Poll::Ready(None),
                    };
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(t) = this.started.take() {
                        metrics::pd_decode_first_byte(t.elapsed());
                    }
                    match (&mut this.rewriter, frame.into_data()) {
                        (Some(rw), Ok(data)) => {
                            let out = rw.push(&data);
                            // A partial event is held back until it is complete.
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
                    tracing::debug!(error = %e, "decode response body failed");
                    metrics::pd_failure(PdSide::Decode, Some(PdFailure::BadGateway));
                    if let Some(g) = &this.guard {
                        g.worker().record_failure();
                    }
                    this.decode_ended();
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Pending => {
                    if this.deadline.as_mut().poll(cx).is_ready() {
                        this.decode_ended();
                        return Poll::Ready(Some(Err(BodyTimeout.into())));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decode.is_none() && self.ending.is_none()
    }
}
