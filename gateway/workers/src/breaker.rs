//! The per-worker circuit breaker: `closed -> open -> half_open -> closed`.
//!
//! - **Closed**: traffic flows. Each failed request (connection refused or broken, no
//!   answer before the deadline, a 5xx) extends the current failure streak; a success ends
//!   it. A streak whose first failure is older than `window` starts over. When the streak
//!   reaches `failure_threshold` the breaker opens.
//! - **Open**: the worker gets no traffic (selection skips it) for `open_for`.
//! - **Half-open**: after `open_for`, up to `success_threshold` trial requests at a time are
//!   let through. `success_threshold` successes in a row close the breaker; one failure
//!   opens it again for another `open_for`.
//!
//! Outcomes are recorded by whoever learns them (the regular router at the response head,
//! the PD exchange for the side that failed, a relayed body that breaks). The request path
//! pays one atomic load to ask a closed breaker for admission and at most two to record a
//! success; everything else takes a small lock, and only on failures and state changes.
//! Time is tokio's clock, so tests drive it with paused time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use openapi::workers::{CircuitState, WorkerCircuit};
use parking_lot::Mutex;
use tokio::time::Instant;

/// Breaker settings (from `--cb-*`; shared by every worker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerConfig {
    /// `false` (`--disable-circuit-breaker`): always closed, outcomes ignored.
    pub enabled: bool,
    /// Failures in a row that open the breaker.
    pub failure_threshold: u32,
    /// Successes in a row (half-open) that close it; also the trial requests let through
    /// at a time while half-open.
    pub success_threshold: u32,
    /// How long an open breaker keeps the worker out.
    pub open_for: Duration,
    /// A failure streak older than this starts over.
    pub window: Duration,
}

impl Default for BreakerConfig {
    /// The defaults of [`settings::ServeConfig`] (sglang-router's).
    fn default() -> Self {
        Self::from(&settings::ServeConfig::default())
    }
}

impl From<&settings::ServeConfig> for BreakerConfig {
    fn from(c: &settings::ServeConfig) -> Self {
        Self {
            enabled: !c.disable_circuit_breaker,
            failure_threshold: c.cb_failure_threshold.max(1),
            success_threshold: c.cb_success_threshold.max(1),
            open_for: Duration::from_secs(c.cb_timeout_duration_secs),
            window: Duration::from_secs(c.cb_window_duration_secs),
        }
    }
}

/// What one request taught us about its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The worker answered (any status below 500).
    Success,
    /// Connection refused or broken, no answer before the deadline, or a 5xx.
    Failure,
}

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// One worker's breaker (see the module doc).
#[derive(Debug)]
pub struct Breaker {
    cfg: Arc<BreakerConfig>,
    /// `CLOSED`, `OPEN` or `HALF_OPEN`; an `OPEN` breaker whose time is up is half-open
    /// in effect and becomes so under the lock at the next look.
    state: AtomicU8,
    /// The failure streak (closed), readable without the lock.
    streak: AtomicU32,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    streak_started: Option<Instant>,
    opened_at: Option<Instant>,
    successes: u32,
    trials: u32,
    opened_total: u64,
}

impl Default for Breaker {
    fn default() -> Self {
        Self::new(Arc::new(BreakerConfig::default()))
    }
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: Arc<BreakerConfig>) -> Self {
        Self {
            cfg,
            state: AtomicU8::new(CLOSED),
            streak: AtomicU32::new(0),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// A closed breaker with the same settings.
    pub fn fresh(&self) -> Self {
        Self::new(self.cfg.clone())
    }

    /// The settings.
    pub fn config(&self) -> &BreakerConfig {
        &self.cfg
    }

    /// Whether a new request may be sent now (closed; or half-open with a free trial slot).
    /// Does not take the slot: see [`Breaker::try_acquire`].
    #[inline]
    pub fn admits(&self) -> bool {
        self.state.load(Ordering::Acquire) == CLOSED || self.admits_slow()
    }

    #[cold]
    fn admits_slow(&self) -> bool {
        let mut g = self.inner.lock();
        self.refresh(&mut g);
        match self.state.load(Ordering::Acquire) {
            CLOSED => true,
            HALF_OPEN => g.trials < self.cfg.success_threshold,
            _ => false,
        }
    }

    /// Takes the right to send one request: `Some(false)` when closed, `Some(true)` when a
    /// half-open trial slot was taken (give it back with [`Breaker::release_trial`]),
    /// `None` when the breaker refuses.
    #[inline]
    pub fn try_acquire(&self) -> Option<bool> {
        if self.state.load(Ordering::Acquire) == CLOSED {
            return Some(false);
        }
        self.try_acquire_slow()
    }

    #[cold]
    fn try_acquire_slow(&self) -> Option<bool> {
        let mut g = self.inner.lock();
        self.refresh(&mut g);
        match self.state.load(Ordering::Acquire) {
            CLOSED => Some(false),
            HALF_OPEN if g.trials < self.cfg.success_threshold => {
                g.trials += 1;
                Some(true)
            }
            _ => None,
        }
    }

    /// Gives back a trial slot taken by [`Breaker::try_acquire`].
    pub fn release_trial(&self) {
        let mut g = self.inner.lock();
        g.trials = g.trials.saturating_sub(1);
    }

    /// Records one request's outcome.
    #[inline]
    pub fn record(&self, outcome: Outcome) {
        if outcome == Outcome::Success
            && self.state.load(Ordering::Acquire) == CLOSED
            && self.streak.load(Ordering::Relaxed) == 0
        {
            return;
        }
        self.record_slow(outcome);
    }

    #[cold]
    fn record_slow(&self, outcome: Outcome) {
        if !self.cfg.enabled {
            return;
        }
        let now = Instant::now();
        let mut g = self.inner.lock();
        self.refresh(&mut g);
        match (self.state.load(Ordering::Acquire), outcome) {
            (CLOSED, Outcome::Success) => {
                self.streak.store(0, Ordering::Relaxed);
                g.streak_started = None;
            }
            (CLOSED, Outcome::Failure) => {
                let fresh = g
                    .streak_started
                    .is_none_or(|t| now.duration_since(t) > self.cfg.window);
                let streak = if fresh {
                    g.streak_started = Some(now);
                    1
                } else {
                    self.streak.load(Ordering::Relaxed) + 1
                };
                self.streak.store(streak, Ordering::Relaxed);
                if streak >= self.cfg.failure_threshold {
                    self.open(&mut g, now);
                }
            }
            (HALF_OPEN, Outcome::Success) => {
                g.successes += 1;
                if g.successes >= self.cfg.success_threshold {
                    self.close(&mut g);
                }
            }
            (HALF_OPEN, Outcome::Failure) => self.open(&mut g, now),
            // Open: answers of requests sent before it opened change nothing.
            _ => {}
        }
    }

    /// Open -> half-open once the open period is over.
    fn refresh(&self, g: &mut Inner) {
        if self.state.load(Ordering::Acquire) == OPEN
            && g.opened_at.is_none_or(|t| t.elapsed() >= self.cfg.open_for)
        {
            g.successes = 0;
            g.trials = 0;
            self.state.store(HALF_OPEN, Ordering::Release);
            crate::bump_epoch();
        }
    }

    fn open(&self, g: &mut Inner, now: Instant) {
        if self.state.load(Ordering::Acquire) != OPEN {
            g.opened_total += 1;
        }
        g.opened_at = Some(now);
        g.successes = 0;
        g.trials = 0;
        g.streak_started = None;
        self.streak.store(0, Ordering::Relaxed);
        self.state.store(OPEN, Ordering::Release);
        crate::bump_epoch();
    }

    fn close(&self, g: &mut Inner) {
        g.successes = 0;
        g.trials = 0;
        g.streak_started = None;
        g.opened_at = None;
        self.streak.store(0, Ordering::Relaxed);
        if self.state.swap(CLOSED, Ordering::AcqRel) != CLOSED {
            crate::bump_epoch();
        }
    }

    /// The current state.
    pub fn state(&self) -> CircuitState {
        if self.state.load(Ordering::Acquire) == CLOSED {
            return CircuitState::Closed;
        }
        let mut g = self.inner.lock();
        self.refresh(&mut g);
        match self.state.load(Ordering::Acquire) {
            CLOSED => CircuitState::Closed,
            OPEN => CircuitState::Open,
            _ => CircuitState::HalfOpen,
        }
    }

    /// Not open (closed or half-open): the worker counts as available for readiness.
    #[inline]
    pub fn is_usable(&self) -> bool {
        self.state.load(Ordering::Acquire) == CLOSED || self.state() != CircuitState::Open
    }

    /// The admin API view.
    pub fn info(&self) -> WorkerCircuit {
        let state = self.state();
        let g = self.inner.lock();
        let retry_in_ms = match (state, g.opened_at) {
            (CircuitState::Open, Some(t)) => Some(
                self.cfg
                    .open_for
                    .saturating_sub(t.elapsed())
                    .as_millis()
                    .try_into()
                    .unwrap_or(u64::MAX),
            ),
            _ => None,
        };
        WorkerCircuit {
            state,
            consecutive_failures: self.streak.load(Ordering::Relaxed),
            consecutive_successes: g.successes,
            opened_total: g.opened_total,
            retry_in_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn breaker(failures: u32, successes: u32) -> Breaker {
        Breaker::new(Arc::new(BreakerConfig {
            enabled: true,
            failure_threshold: failures,
            success_threshold: successes,
            open_for: Duration::from_secs(30),
            window: Duration::from_secs(60),
        }))
    }

    fn fail(b: &Breaker, n: u32) {
        for _ in 0..n {
            b.record(Outcome::Failure);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_the_threshold_and_a_success_resets_the_streak() {
        let b = breaker(3, 2);
        fail(&b, 2);
        assert_eq!(b.info().consecutive_failures, 2);
        b.record(Outcome::Success);
        fail(&b, 2);
        assert_eq!(b.state(), CircuitState::Closed);
        assert!(b.admits());
        b.record(Outcome::Failure);
        assert_eq!(b.state(), CircuitState::Open);
        assert!(!b.admits() && b.try_acquire().is_none() && !b.is_usable());
        let info = b.info();
        assert_eq!((info.opened_total, info.retry_in_ms), (1, Some(30_000)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_streak_older_than_the_window_starts_over() {
        let b = breaker(3, 1);
        fail(&b, 2);
        advance(Duration::from_secs(61)).await;
        fail(&b, 2);
        assert_eq!(b.state(), CircuitState::Closed, "2 + 2 across the window");
        b.record(Outcome::Failure);
        assert_eq!(b.state(), CircuitState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_lets_trials_through_and_closes_after_successes() {
        let b = breaker(1, 2);
        b.record(Outcome::Failure);
        advance(Duration::from_secs(29)).await;
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.info().retry_in_ms, Some(1_000));
        advance(Duration::from_secs(1)).await;
        assert_eq!(b.state(), CircuitState::HalfOpen);
        assert!(b.is_usable());
        // Two trial slots, then no more until one is given back.
        assert_eq!(b.try_acquire(), Some(true));
        assert_eq!(b.try_acquire(), Some(true));
        assert!(!b.admits() && b.try_acquire().is_none());
        b.release_trial();
        assert!(b.admits());
        b.record(Outcome::Success);
        assert_eq!(b.state(), CircuitState::HalfOpen);
        b.record(Outcome::Success);
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(b.try_acquire(), Some(false), "closed: no trial slot");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_trial_opens_it_again_for_a_full_period() {
        let b = breaker(1, 3);
        b.record(Outcome::Failure);
        advance(Duration::from_secs(30)).await;
        assert_eq!(b.try_acquire(), Some(true));
        b.record(Outcome::Success);
        b.record(Outcome::Failure);
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.info().opened_total, 2);
        advance(Duration::from_secs(29)).await;
        assert_eq!(b.state(), CircuitState::Open);
        advance(Duration::from_secs(1)).await;
        assert_eq!(b.state(), CircuitState::HalfOpen);
        assert_eq!(b.info().consecutive_successes, 0, "trial count starts over");
    }

    #[tokio::test(start_paused = true)]
    async fn answers_to_requests_sent_before_it_opened_change_nothing() {
        let b = breaker(1, 1);
        b.record(Outcome::Failure);
        b.record(Outcome::Success);
        b.record(Outcome::Failure);
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.info().opened_total, 1);
        assert_eq!(b.info().retry_in_ms, Some(30_000));
    }

    #[tokio::test(start_paused = true)]
    async fn disabled_never_opens() {
        let b = Breaker::new(Arc::new(BreakerConfig {
            enabled: false,
            failure_threshold: 1,
            ..BreakerConfig::default()
        }));
        fail(&b, 100);
        assert_eq!(b.state(), CircuitState::Closed);
        assert!(b.admits());
    }
}
