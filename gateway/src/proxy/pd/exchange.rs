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
//! Once decode's head is relayed, the response body ([`RelayBody`], with the prefill as its
//! [`Companion`]) keeps driving the prefill's body while it relays decode's: if the prefill
//! breaks during a stream, the stream ends with an error event (decode's request is
//! dropped); the prefill's load guard is released when its own body ends.
//!
//! What is held for a logprob merge is bounded by `--max-payload-size`: a prefill answer
//! over it is not merged (decode's answer is relayed as it is), and a whole decode answer
//! over it is relayed unmerged as it arrives.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::ResponseFuture;
use tokio::time::{Instant, Sleep};

use super::merge::{PrefillLogprobs, SseRewriter};
use crate::error::{GatewayError, PdFailure, PdSide};
use crate::metrics;
use crate::proxy::dispatch::DispatchError;
use crate::proxy::respond::{self, Companion, RelayBody, strip_hop_by_hop};
use crate::proxy::retry::is_retryable_status;
use crate::workers::{LoadGuard, Outcome, Worker};

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
    /// The most of the body kept.
    limit: usize,
}

impl PrefillSide {
    /// The prefill request `fut` on the worker `guard` counts on; `collect`: keep its body,
    /// up to `limit` bytes (a longer one is not kept at all).
    pub fn new(fut: ResponseFuture, guard: LoadGuard, collect: Option<usize>) -> Self {
        Self {
            state: State::Head(fut),
            worker: guard.worker().clone(),
            guard: Some(guard),
            collected: collect.map(|_| BytesMut::new()),
            limit: collect.unwrap_or(0),
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
                            if buf.len() + data.len() > self.limit {
                                tracing::warn!(
                                    worker = self.worker.url().as_str(),
                                    limit = self.limit,
                                    "prefill answer over --max-payload-size: its logprobs are not merged"
                                );
                                self.collected = None;
                            } else {
                                buf.extend_from_slice(&data);
                            }
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
    /// The most of an answer held for a merge (`--max-payload-size`).
    pub hold_limit: usize,
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
    let relay = |body, guard, deadline| {
        RelayBody::new(body, guard, deadline)
            .on_first_frame(started, metrics::pd_decode_first_byte)
            .on_break(charge_decode_break)
    };
    if !merging {
        let mut body = relay(body, decode_guard, reset(deadline));
        if !prefill.is_done() {
            body = body.companion(Box::new(PrefillCompanion {
                side: prefill,
                stream: plan.stream,
            }));
        }
        return Ok(Response::from_parts(parts, Body::new(body)));
    }
    parts.headers.remove(http::header::CONTENT_LENGTH);
    let logprobs = PrefillLogprobs::from_body(plan.merge, prefill.take_body(), plan.stream);
    if plan.stream {
        let body = relay(body, decode_guard, reset(deadline))
            .rewrite(Box::new(SseRewriter::new(logprobs)));
        return Ok(Response::from_parts(parts, Body::new(body)));
    }
    // A whole answer: read it before the head goes out (a decode breaking now can still be
    // retried), up to the bound.
    let held = tokio::select! {
        r = hold(body, plan.hold_limit) => r.map_err(SideError::Body),
        _ = deadline.as_mut() => Err(SideError::Dispatch(DispatchError::Timeout)),
    };
    match held.map_err(|e| fail(PdSide::Decode, &decode_worker, e))? {
        Held::Whole(whole) => {
            metrics::pd_decode_first_byte(started.elapsed());
            drop(decode_guard);
            let mut logprobs = logprobs;
            let merged = logprobs
                .merge_whole(&whole)
                .map(Bytes::from)
                .unwrap_or(whole);
            Ok(Response::from_parts(parts, Body::from(merged)))
        }
        Held::Over(first, rest) => {
            tracing::warn!(
                worker = decode_worker.url().as_str(),
                limit = plan.hold_limit,
                "decode answer over --max-payload-size: relayed without the merge"
            );
            let body = relay(rest, decode_guard, reset(deadline)).queue(first);
            Ok(Response::from_parts(parts, Body::new(body)))
        }
    }
}

/// A body read whole, or (over the bound) what was read and the rest.
enum Held {
    Whole(Bytes),
    Over(Bytes, Incoming),
}

/// Reads `body` whole if it fits in `limit` bytes.
async fn hold(mut body: Incoming, limit: usize) -> Result<Held, String> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        if buf.len() > limit {
            return Ok(Held::Over(buf.freeze(), body));
        }
    }
    Ok(Held::Whole(buf.freeze()))
}

/// Charges a decode body that broke mid-answer.
fn charge_decode_break(w: &Worker) {
    metrics::pd_failure(PdSide::Decode, Some(PdFailure::BadGateway));
    w.record_failure();
}

/// The deadline, moved out for the response body (the attempt is over).
fn reset(deadline: &mut Pin<Box<Sleep>>) -> Pin<Box<Sleep>> {
    let at = deadline.deadline();
    std::mem::replace(deadline, Box::pin(tokio::time::sleep_until(at)))
}

/// The prefill, driven while decode's answer is relayed (see the module doc).
struct PrefillCompanion {
    side: PrefillSide,
    /// The answer is a stream (a prefill failure ends it with an error event).
    stream: bool,
}

impl Companion for PrefillCompanion {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Option<Bytes>>> {
        let e = match std::task::ready!(self.side.poll(cx)) {
            Ok(()) => return Poll::Ready(Ok(())),
            Err(e) => e,
        };
        let failure = Failure::new(PdSide::Prefill, self.side.worker(), e, 0);
        failure.charge();
        tracing::warn!(worker = %self.side.worker().url().as_str(), cause = %failure.cause,
            "prefill failed while decode's answer was relayed");
        if !self.stream {
            return Poll::Ready(Err(None));
        }
        // Decode would wait for KV that is not coming: stop it and tell the client.
        let env = failure.into_error().envelope();
        let mut event = b"data: ".to_vec();
        let _ = serde_json::to_writer(&mut event, &env);
        event.extend_from_slice(b"\n\ndata: [DONE]\n\n");
        Poll::Ready(Err(Some(Bytes::from(event))))
    }

    fn detach(self: Box<Self>, until: Instant) {
        let mut side = self.side;
        tokio::spawn(async move {
            let _ = tokio::time::timeout_at(until, poll_fn(|cx| side.poll(cx))).await;
        });
    }
}
