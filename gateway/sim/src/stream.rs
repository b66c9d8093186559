//! Pacing: when each token of a response is ready (time to first token, then time per
//! output token), and the server-sent-events body that releases a streamed response step
//! by step on that schedule. Uses tokio's clock, so paused-time tests see exact times.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use http_body::Frame;
use serde::Serialize;
use tokio::time::{Instant, Sleep};

use axum::http::StatusCode;
use openapi::openai::StreamOptions;

use super::config::SimMode;
use super::engine::Sequence;
use super::error::{SimError, json_bytes};
use super::model::Token;
use super::pd::KvItem;
use super::state::{Cached, InflightGuard, Rank, SimState};

/// Streams with no delays and at most this many steps are written as one buffer.
const ONE_SHOT_MAX_STEPS: usize = 64;

/// When the steps of one request are ready.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// When the request arrived.
    pub start: Instant,
    /// Time to first token.
    pub ttft: Duration,
    /// Time per output token after the first.
    pub tpot: Duration,
}

impl Clock {
    /// When token `step` (0-based) is ready (a century away if that overflows).
    pub fn at(&self, step: usize) -> Instant {
        let later = u32::try_from(step).unwrap_or(u32::MAX);
        let wait = self.ttft.saturating_add(self.tpot.saturating_mul(later));
        self.start
            .checked_add(wait)
            .unwrap_or_else(|| self.start + Duration::from_secs(100 * 365 * 86_400))
    }

    /// When a response of `steps` tokens is complete (the first token's time for none).
    pub fn done_at(&self, steps: usize) -> Instant {
        self.at(steps.saturating_sub(1))
    }

    fn is_instant(&self) -> bool {
        self.ttft.is_zero() && self.tpot.is_zero()
    }
}

/// A streamed response, rendered one step (one token of every sequence) at a time.
pub trait Steps: Send + Unpin + 'static {
    /// Number of steps: tokens of the longest sequence.
    fn steps(&self) -> usize;
    /// Appends the events of step `k`.
    fn step(&mut self, k: usize, out: &mut Vec<u8>);
    /// Appends the closing events (finish chunks, usage, `data: [DONE]`); written with
    /// the last step.
    fn finish(&mut self, out: &mut Vec<u8>);
}

/// A request turned into finished sequences, ready to be streamed or answered whole.
pub trait Answer: Steps + Sized {
    /// The whole (non-streamed) response body.
    type Whole: Serialize;
    /// Whether the client asked for a stream.
    fn is_stream(&self) -> bool;
    /// The whole response.
    fn whole(self) -> Self::Whole;
    /// PD: the KV to move before answering (one item per room; none for a regular worker).
    fn take_kv(&mut self) -> Vec<KvItem> {
        Vec::new()
    }
    /// The data-parallel rank the request names (`data_parallel_rank`), if any.
    fn dp_rank(&self) -> Option<u32> {
        None
    }
    /// The token ids of each prompt, for the prefix cache (filled only when the worker
    /// caches prefixes).
    fn prompt_ids(&self) -> &[Arc<[u32]>];
    /// How many tokens of each prompt the prefix cache held (and the store gave), and the
    /// clock once the prefill is scheduled.
    fn prefilled(&mut self, cached: Vec<Cached>, clock: Clock);
}

/// Runs a generation request: `prepare` parses it and runs the model; the answer is then
/// streamed, or sent whole once its last token is due. `error` renders failures in the
/// route's error shape. The request runs on the rank it names (or the next in turn) and
/// counts as in flight there until its response is done.
pub async fn respond<A: Answer>(
    st: &SimState,
    prepare: impl FnOnce(Clock) -> Result<A, SimError>,
    error: fn(SimError) -> Response,
) -> Response {
    let clock = Clock {
        start: Instant::now(),
        ttft: st.cfg.ttft,
        tpot: st.cfg.tpot,
    };
    let mut answer = match prepare(clock) {
        Ok(a) => a,
        Err(e) => return error(e),
    };
    let rank = match st.rank(answer.dp_rank()) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let mut guard = rank.enter();
    guard.charge(answer.prompt_ids().iter().map(|p| p.len() as u64).sum());
    let mut kv = answer.take_kv();
    let (clock, lane) = prefill(st, rank, &mut answer, clock, &mut guard, kv.is_empty()).await;
    if let (Some(done), SimMode::Prefill) = (lane, st.mode()) {
        // The lane computes the uncached part; the rooms wait for it, then move the KV.
        for item in &mut kv {
            item.lane_done = Some(done);
        }
    }
    if let (false, Some(pd)) = (kv.is_empty(), &st.pd) {
        // Prefill: compute and send the KV; decode: receive and check it (its pages are
        // held until the answer ends).
        match pd.exchange(kv).await {
            Ok(hold) => guard.hold(hold),
            Err(e) => return error(e),
        }
    }
    if answer.is_stream() {
        return sse_response(answer, clock, guard);
    }
    tokio::time::sleep_until(clock.done_at(answer.steps())).await;
    let mut bytes = Vec::with_capacity(1024);
    let written = serde_json::to_writer(&mut bytes, &answer.whole());
    drop(guard);
    match written {
        Ok(()) => json_bytes(StatusCode::OK, bytes),
        Err(e) => error(e.into()),
    }
}

/// Runs the answer's prompts through the prefix cache and the prefill lane (a regular
/// worker, a prefill worker, a decode worker computing a prompt itself when `local`): the
/// first token comes `ttft` after the uncached part of the prompts is computed. Returns
/// the clock and when the lane is done.
async fn prefill<A: Answer>(
    st: &SimState,
    rank: &Rank,
    answer: &mut A,
    clock: Clock,
    guard: &mut InflightGuard,
    local: bool,
) -> (Clock, Option<Instant>) {
    let ids = answer.prompt_ids();
    if ids.is_empty() {
        return (clock, None);
    }
    let (cached, hold, release) = st.admit(rank, ids).await;
    let total: u64 = ids.iter().map(|p| p.len() as u64).sum();
    let uncached = total.saturating_sub(cached.iter().map(|c| c.tokens).sum());
    if let Some(h) = hold {
        guard.hold(h);
    }
    let computes = st.mode() != SimMode::Decode || local;
    let done = st.prefill_done_at(rank, if computes { uncached } else { 0 });
    // The pages this prompt added are known to routers once they are computed.
    release.at(done);
    let compute = done.map_or(Duration::ZERO, |d| d.saturating_duration_since(clock.start));
    let clock = Clock {
        ttft: clock.ttft + compute,
        ..clock
    };
    answer.prefilled(cached, clock);
    (clock, done)
}

/// SGLang's `stream_options.continuous_usage_stats`: usage on every content chunk.
pub fn continuous_usage(opts: Option<&StreamOptions>) -> bool {
    opts.and_then(|o| o.continuous_usage_stats).unwrap_or(false)
}

/// Tokens of the longest sequence: the number of steps of a response.
pub fn longest(seqs: &[Sequence]) -> usize {
    seqs.iter().map(Sequence::len).max().unwrap_or(0)
}

/// Appends `data: <json>\n\n`.
pub fn push_event<T: Serialize>(out: &mut Vec<u8>, event: &T) {
    out.extend_from_slice(b"data: ");
    // Serializing plain structs into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, event);
    out.extend_from_slice(b"\n\n");
}

/// Appends `data: [DONE]\n\n`.
pub fn push_done(out: &mut Vec<u8>) {
    out.extend_from_slice(b"data: [DONE]\n\n");
}

/// Token `k` of `seq` and the text it adds (empty for end-of-sequence, for a stop token,
/// and past a matched stop string); `offset` tracks how much text was already sent.
/// `None` once the sequence has no token `k`.
pub fn advance(seq: &Sequence, k: usize, offset: &mut usize) -> Option<(Token, String)> {
    let token = *seq.tokens.get(k)?;
    let start = *offset;
    let end = (start + token.text().len()).min(seq.text.len());
    *offset = end;
    Some((token, seq.text[start..end].to_owned()))
}

/// An SSE response releasing `steps` on `clock`'s schedule. `guard` counts the request as
/// in flight until the body ends or the client goes away.
pub fn sse_response<S: Steps>(mut steps: S, clock: Clock, guard: InflightGuard) -> Response {
    let n = steps.steps();
    let body = if clock.is_instant() && n <= ONE_SHOT_MAX_STEPS {
        let mut out = Vec::with_capacity(512 * (n + 2));
        for k in 0..n {
            steps.step(k, &mut out);
        }
        steps.finish(&mut out);
        drop(guard);
        Body::from(out)
    } else {
        Body::new(Paced {
            sleep: Box::pin(tokio::time::sleep_until(clock.at(0))),
            steps,
            clock,
            next: 0,
            done: false,
            _guard: guard,
        })
    };
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// The body of a paced stream.
struct Paced<S> {
    steps: S,
    clock: Clock,
    sleep: Pin<Box<Sleep>>,
    next: usize,
    done: bool,
    _guard: InflightGuard,
}

impl<S: Steps> http_body::Body for Paced<S> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let deadline = this.clock.at(this.next);
        if this.sleep.deadline() != deadline {
            this.sleep.as_mut().reset(deadline);
        }
        ready!(this.sleep.as_mut().poll(cx));
        let total = this.steps.steps();
        let mut out = Vec::with_capacity(512);
        if this.next < total {
            this.steps.step(this.next, &mut out);
            this.next += 1;
        }
        if this.next >= total {
            this.steps.finish(&mut out);
            this.done = true;
        }
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimConfig;
    use crate::state::SimState;
    use http_body_util::BodyExt;

    struct Count(usize);
    impl Steps for Count {
        fn steps(&self) -> usize {
            self.0
        }
        fn step(&mut self, k: usize, out: &mut Vec<u8>) {
            push_event(out, &k);
        }
        fn finish(&mut self, out: &mut Vec<u8>) {
            push_done(out);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn paced_steps_arrive_on_schedule() {
        let state = SimState::new(SimConfig::default()).unwrap();
        let start = Instant::now();
        let clock = Clock {
            start,
            ttft: Duration::from_millis(100),
            tpot: Duration::from_millis(10),
        };
        let resp = sse_response(Count(3), clock, state.rank(None).unwrap().enter());
        assert_eq!(state.in_flight(), 1);
        let mut body = resp.into_body();
        let mut seen = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            seen.push((
                start.elapsed().as_millis(),
                String::from_utf8(data.to_vec()).unwrap(),
            ));
        }
        assert_eq!(
            seen,
            [
                (100, "data: 0\n\n".to_owned()),
                (110, "data: 1\n\n".to_owned()),
                (120, "data: 2\n\ndata: [DONE]\n\n".to_owned()),
            ]
        );
        drop(body);
        assert_eq!(state.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn empty_and_instant_streams() {
        let state = SimState::new(SimConfig::default()).unwrap();
        let start = Instant::now();
        let clock = Clock {
            start,
            ttft: Duration::from_millis(50),
            tpot: Duration::ZERO,
        };
        let body = sse_response(Count(0), clock, state.rank(None).unwrap().enter()).into_body();
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"data: [DONE]\n\n");
        assert_eq!(start.elapsed(), Duration::from_millis(50));

        let clock = Clock {
            start,
            ttft: Duration::ZERO,
            tpot: Duration::ZERO,
        };
        let resp = sse_response(Count(2), clock, state.rank(None).unwrap().enter());
        assert_eq!(state.in_flight(), 0, "an instant stream is done when built");
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"data: 0\n\ndata: 1\n\ndata: [DONE]\n\n");
    }
}
