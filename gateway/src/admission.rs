//! Admission control for inference requests: how many are handled at once, how many wait,
//! in which order, for how long, and (optionally) how many start per second, overall and
//! per tenant. A request that cannot be admitted is answered in the OpenAI error envelope
//! (429, or 408 for a wait past the queue timeout), never left hanging.
//!
//! - **Tenants** ([`tenants`]): a tenant's `rate` and `concurrency` from the client keys
//!   file, checked first; over either: 429 at once.
//! - **Concurrency** (`--max-concurrent-requests`): slots ([`slots`]). The [`Permit`] is
//!   held until the response body ends or the client goes away, so a long stream counts
//!   for as long as it runs.
//! - **Queue** (`--queue-size`, `--queue-timeout-secs`): requests that find every slot
//!   taken, or are over the rate, wait here; one more than `queue_size` waiting is refused
//!   (429), a wait past the timeout answers 408. A freed slot goes to the highest priority
//!   class waiting (`--priority-header`: `bulk`, `default`, `interactive`, `system`), a
//!   class rising by one for every `--priority-aging-secs` waited, so the lowest still
//!   moves. A client that disconnects while waiting leaves the queue.
//! - **Rate** (`--rate-limit-tokens-per-second R`): a token bucket holding at most R tokens
//!   (one second of burst), refilled at R per second, one token per request. A request over
//!   the rate reserves the next token and waits for it in the queue, unless that wait would
//!   outlast the queue timeout (then 429 at once).
//!
//! Unlike sglang-router, whose single token bucket mixes the two (tokens come back when a
//! request ends *and* refill over time, so the number in flight can exceed its limit),
//! the concurrency limit here is exact and the rate limit is separate and off by default.

pub mod slots;
pub mod tenants;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::auth::Priority;
use crate::config::ServeConfig;
use slots::{Slot, Slots};
use tenants::TenantPermit;

/// Why a request was not admitted (answered 429).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot taken and `queue_size` requests already waiting.
    QueueFull {
        /// The queue's size.
        queue_size: usize,
    },
    /// Waited the whole `queue_timeout` without getting a slot (408).
    QueueTimeout {
        /// The timeout.
        timeout: Duration,
    },
    /// Over `--rate-limit-tokens-per-second`, and waiting for a token is not possible
    /// (queue full, or the wait would outlast the queue timeout).
    RateLimited {
        /// The rate.
        per_second: u64,
        /// When the next token is due.
        retry_after: Duration,
    },
    /// The tenant already has its `concurrency` requests in flight.
    TenantBusy {
        /// Its limit.
        max: usize,
    },
    /// The tenant is over its `rate`.
    TenantRateLimited {
        /// Its rate.
        per_second: u64,
        /// When its next token is due.
        retry_after: Duration,
    },
}

impl Refusal {
    /// Seconds a client should wait before trying again (`Retry-After`), at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            Self::RateLimited { retry_after, .. } | Self::TenantRateLimited { retry_after, .. } => {
                retry_after.as_secs_f64().ceil().max(1.0) as u64
            }
            _ => 1,
        }
    }

    /// Its name (the metrics' `outcome`, the envelope's `code`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::QueueFull { .. } => "queue_full",
            Self::QueueTimeout { .. } => "queue_timeout",
            Self::RateLimited { .. } => "rate_limited",
            Self::TenantBusy { .. } => "tenant_concurrency_limited",
            Self::TenantRateLimited { .. } => "tenant_rate_limited",
        }
    }
}

/// Admission settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// Requests handled at once (`None`: no limit).
    pub max_concurrent: Option<usize>,
    /// Requests that may wait.
    pub queue_size: usize,
    /// Longest wait.
    pub queue_timeout: Duration,
    /// Requests admitted per second (`None`: no rate limit).
    pub rate_per_second: Option<u64>,
    /// A waiter's class rises by one every `aging` (zero: never).
    pub aging: Duration,
    /// The header naming a request's class.
    pub priority_header: http::HeaderName,
}

impl From<&ServeConfig> for AdmissionConfig {
    fn from(c: &ServeConfig) -> Self {
        Self {
            max_concurrent: usize::try_from(c.max_concurrent_requests)
                .ok()
                .filter(|&n| n > 0),
            queue_size: c.queue_size,
            queue_timeout: Duration::from_secs(c.queue_timeout_secs),
            rate_per_second: c.rate_limit_tokens_per_second.filter(|&r| r > 0),
            aging: Duration::from_secs(c.priority_aging_secs),
            // Checked by validate; a name that is not a header counts as none set.
            priority_header: http::HeaderName::try_from(c.priority_header.as_str())
                .unwrap_or(http::HeaderName::from_static("x-smg-priority")),
        }
    }
}

/// The admission gate (see the module doc). One per gateway.
#[derive(Debug)]
pub struct Admission {
    slots: Option<Arc<Slots>>,
    bucket: Option<TokenBucket>,
    queue_size: usize,
    queue_timeout: Duration,
    waiting: AtomicUsize,
    priority_header: http::HeaderName,
}

/// The right to be handled: keep it until the response is over (see [`Permit::attach`]).
#[derive(Debug, Default)]
pub struct Permit {
    slot: Option<Slot>,
    tenant: Option<TenantPermit>,
}

impl Admission {
    /// A gate with `cfg`'s limits.
    pub fn new(cfg: &AdmissionConfig) -> Self {
        Self {
            slots: cfg.max_concurrent.map(|n| Slots::new(n, cfg.aging)),
            bucket: cfg.rate_per_second.map(TokenBucket::new),
            queue_size: cfg.queue_size,
            queue_timeout: cfg.queue_timeout,
            waiting: AtomicUsize::new(0),
            priority_header: cfg.priority_header.clone(),
        }
    }

    /// Whether any limit is set (otherwise [`Admission::admit`] always succeeds at once).
    #[inline]
    pub fn is_active(&self) -> bool {
        self.slots.is_some() || self.bucket.is_some()
    }

    /// The class `headers` ask for (`--priority-header`; absent or unknown: `default`),
    /// capped at `max` (the tenant's `max_priority`).
    pub fn class_of(&self, headers: &http::HeaderMap, max: Option<Priority>) -> Priority {
        let asked = headers
            .get(&self.priority_header)
            .and_then(|v| v.to_str().ok())
            .and_then(Priority::parse)
            .unwrap_or_default();
        max.map_or(asked, |m| asked.min(m))
    }

    /// Requests waiting right now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Slots free right now (`None`: no concurrency limit).
    pub fn free_slots(&self) -> Option<usize> {
        self.slots.as_ref().map(|s| s.free())
    }

    /// Admits one request of class `class`, waiting in the queue if needed (see the module
    /// doc).
    pub async fn admit(&self, class: Priority) -> Result<Permit, Refusal> {
        let started = Instant::now();
        let result = self.admit_inner(class).await;
        match &result {
            Ok(_) => crate::metrics::admission("admitted", class, Some(started.elapsed())),
            Err(r) => crate::metrics::admission(r.label(), class, None),
        }
        result
    }

    async fn admit_inner(&self, class: Priority) -> Result<Permit, Refusal> {
        let deadline = Instant::now() + self.queue_timeout;
        if let Some(bucket) = &self.bucket {
            let wait = bucket.reserve();
            if !wait.is_zero() {
                let refuse = Refusal::RateLimited {
                    per_second: bucket.rate,
                    retry_after: wait,
                };
                if wait > self.queue_timeout {
                    bucket.refund();
                    return Err(refuse);
                }
                let Some(_queued) = self.enter_queue() else {
                    bucket.refund();
                    return Err(refuse);
                };
                crate::metrics::admission("queued", class, None);
                tokio::time::sleep(wait).await;
            }
        }
        let Some(slots) = &self.slots else {
            return Ok(Permit::default());
        };
        if let Some(slot) = slots.try_take() {
            return Ok(Permit::of(slot));
        }
        let Some(_queued) = self.enter_queue() else {
            return Err(Refusal::QueueFull {
                queue_size: self.queue_size,
            });
        };
        crate::metrics::admission("queued", class, None);
        match tokio::time::timeout_at(deadline, slots.wait(class).granted()).await {
            Ok(Some(slot)) => Ok(Permit::of(slot)),
            _ => Err(Refusal::QueueTimeout {
                timeout: self.queue_timeout,
            }),
        }
    }

    /// A place in the queue, if there is one (left when the returned guard drops).
    fn enter_queue(&self) -> Option<Queued<'_>> {
        let mut n = self.waiting.load(Ordering::Relaxed);
        loop {
            if n >= self.queue_size {
                return None;
            }
            match self
                .waiting
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(Queued(&self.waiting)),
                Err(now) => n = now,
            }
        }
    }
}

/// One request counted in the queue.
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Permit {
    fn of(slot: Slot) -> Self {
        Self {
            slot: Some(slot),
            tenant: None,
        }
    }

    /// This permit, also holding the tenant's count until the response is over.
    pub fn with_tenant(mut self, tenant: Option<TenantPermit>) -> Self {
        self.tenant = tenant;
        self
    }

    /// Makes `resp`'s body carry this permit, so the slot (and the tenant's count) is freed
    /// when the body ends or is dropped (client gone), not when the handler returns.
    /// Holding nothing, `resp` as is.
    pub fn attach(self, resp: Response) -> Response {
        if self.slot.is_none() && self.tenant.is_none() {
            return resp;
        }
        let (parts, inner) = resp.into_parts();
        Response::from_parts(
            parts,
            Body::new(PermitBody {
                inner,
                permit: Some(self),
            }),
        )
    }
}

/// A response body holding an admission permit until it ends.
struct PermitBody {
    inner: Body,
    permit: Option<Permit>,
}

impl http_body::Body for PermitBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.permit = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A token bucket with reservations: `reserve` always takes a token, possibly one not
/// there yet, and says how long until it is.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    rate: u64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    pub(crate) fn new(rate: u64) -> Self {
        Self {
            rate,
            state: Mutex::new((rate as f64, Instant::now())),
        }
    }

    /// Takes a token; returns how long until it is due (zero: now).
    pub(crate) fn reserve(&self) -> Duration {
        let rate = self.rate as f64;
        let now = Instant::now();
        let mut g = self.state.lock();
        let (tokens, last) = *g;
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * rate).min(rate) - 1.0;
        *g = (tokens, now);
        if tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-tokens / rate)
        }
    }

    /// Gives back a reserved token (its request was refused).
    pub(crate) fn refund(&self) {
        let mut g = self.state.lock();
        g.0 = (g.0 + 1.0).min(self.rate as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::future::Future;

    fn gate(max: Option<usize>, queue: usize, timeout_s: u64, rate: Option<u64>) -> Arc<Admission> {
        Arc::new(Admission::new(&AdmissionConfig {
            max_concurrent: max,
            queue_size: queue,
            queue_timeout: Duration::from_secs(timeout_s),
            rate_per_second: rate,
            aging: Duration::from_secs(5),
            priority_header: http::HeaderName::from_static("x-smg-priority"),
        }))
    }

    /// Polls `fut` once: `Some(output)` if it finished.
    fn poll_once<F: Future + Unpin>(fut: &mut F) -> Option<F::Output> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        match Pin::new(fut).poll(&mut cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_admits_at_once() {
        let g = gate(None, 0, 1, None);
        assert!(!g.is_active());
        for _ in 0..1000 {
            g.admit(Priority::Default).await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn full_queue_and_queue_timeout_are_refused() {
        let g = gate(Some(2), 1, 5, None);
        let a = g.admit(Priority::Default).await.unwrap();
        let _b = g.admit(Priority::Default).await.unwrap();
        // The third waits, the fourth finds the queue full.
        let g2 = g.clone();
        let mut third = Box::pin(async move { g2.admit(Priority::Default).await });
        assert!(poll_once(&mut third).is_none());
        assert_eq!(g.waiting(), 1);
        assert_eq!(
            g.admit(Priority::Default).await.unwrap_err(),
            Refusal::QueueFull { queue_size: 1 }
        );
        // A freed slot goes to the one waiting.
        drop(a);
        let _c = third.await.unwrap();
        assert_eq!(g.waiting(), 0);
        // Nobody frees a slot: the wait ends at the timeout, in paused time.
        let started = Instant::now();
        let err = g.admit(Priority::Default).await.unwrap_err();
        assert_eq!(
            err,
            Refusal::QueueTimeout {
                timeout: Duration::from_secs(5)
            }
        );
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(g.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_queue_refuses_at_once_and_a_gone_waiter_leaves_the_queue() {
        let g = gate(Some(1), 0, 5, None);
        let _a = g.admit(Priority::Default).await.unwrap();
        assert!(matches!(
            g.admit(Priority::Default).await,
            Err(Refusal::QueueFull { queue_size: 0 })
        ));
        let g = gate(Some(1), 1, 5, None);
        let _a = g.admit(Priority::Default).await.unwrap();
        let g2 = g.clone();
        let mut waiter = Box::pin(async move { g2.admit(Priority::Default).await });
        assert!(poll_once(&mut waiter).is_none());
        assert_eq!(g.waiting(), 1);
        drop(waiter);
        assert_eq!(g.waiting(), 0, "a client that went away left the queue");
    }

    #[tokio::test(start_paused = true)]
    async fn the_permit_lives_as_long_as_the_body() {
        let g = gate(Some(1), 0, 1, None);
        let p = g.admit(Priority::Default).await.unwrap();
        let resp = p.attach(Response::new(Body::from("hello")));
        assert!(
            g.admit(Priority::Default).await.is_err(),
            "held by the body"
        );
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes, "hello");
        assert!(
            g.admit(Priority::Default).await.is_ok(),
            "released at body end"
        );
        // Dropped without being read (client gone): released too.
        let p = g.admit(Priority::Default).await.unwrap();
        let resp = p.attach(Response::new(Body::from("x")));
        drop(resp);
        assert!(g.admit(Priority::Default).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_bursts_then_paces() {
        let g = gate(None, 10, 2, Some(4));
        assert!(g.is_active());
        let start = Instant::now();
        for _ in 0..4 {
            g.admit(Priority::Default).await.unwrap();
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "a second's worth of burst");
        g.admit(Priority::Default).await.unwrap();
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(250),
            "then one per 1/4 s"
        );
        // Eight more reservations queue up to 2 s; the next would wait longer: 429.
        let mut waits = Vec::new();
        for _ in 0..8 {
            let g2 = g.clone();
            waits.push(tokio::spawn(
                async move { g2.admit(Priority::Default).await },
            ));
        }
        tokio::task::yield_now().await;
        match g.admit(Priority::Default).await {
            Err(Refusal::RateLimited {
                per_second,
                retry_after,
            }) => {
                assert_eq!(per_second, 4);
                assert!(retry_after > Duration::from_secs(2), "{retry_after:?}");
            }
            other => panic!("{other:?}"),
        }
        for w in waits {
            w.await.unwrap().unwrap();
        }
        assert_eq!(start.elapsed(), Duration::from_millis(2250));
    }
}
