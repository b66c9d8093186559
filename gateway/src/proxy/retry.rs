//! Retries: which failures are worth another attempt, and how long to wait before it.
//!
//! A request is retried only before any byte of its answer went to the client (the routers
//! decide at the response head), when its worker could not be reached, broke the
//! connection, or answered one of sglang-router's retryable statuses (408, 429, 500, 502,
//! 503, 504), and only while attempts (`--retry-max-retries`, the first included) and the
//! request deadline last. The wait before attempt `n + 1` is `initial * multiplier^(n-1)`,
//! capped at `max`, moved by a random `±jitter` fraction.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

use crate::config::ServeConfig;
use crate::select::{NoWorker, Pick, Policy, Want};
use crate::workers::Worker;
use crate::workers::registry::WorkerSet;

/// Retry settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// Wait before the first retry.
    pub initial_backoff: Duration,
    /// Longest wait.
    pub max_backoff: Duration,
    /// Growth of the wait per attempt.
    pub multiplier: f64,
    /// Random spread of each wait, as a fraction (0.0-1.0).
    pub jitter: f64,
}

impl From<&ServeConfig> for RetryPolicy {
    fn from(c: &ServeConfig) -> Self {
        Self {
            max_attempts: if c.disable_retries {
                1
            } else {
                c.retry_max_retries.max(1)
            },
            initial_backoff: Duration::from_millis(c.retry_initial_backoff_ms),
            max_backoff: Duration::from_millis(c.retry_max_backoff_ms),
            multiplier: c.retry_backoff_multiplier,
            jitter: c.retry_jitter_factor,
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn never() -> Self {
        Self {
            max_attempts: 1,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            multiplier: 1.0,
            jitter: 0.0,
        }
    }

    /// Whether another attempt may follow `attempts` made so far.
    #[inline]
    pub fn allows_another(&self, attempts: u32) -> bool {
        attempts < self.max_attempts
    }

    /// The wait before the attempt that follows `attempts` made so far (1: the first retry):
    /// the exponential, capped delay (backon's) moved by the `±jitter` fraction
    /// (sglang-router's `--retry-jitter-factor`, which backon's additive jitter is not).
    pub fn backoff(&self, attempts: u32) -> Duration {
        use backon::BackoffBuilder;
        let capped = backon::ExponentialBuilder::new()
            .with_min_delay(self.initial_backoff)
            .with_max_delay(self.max_backoff)
            .with_factor(self.multiplier as f32)
            .without_max_times()
            .build()
            .nth(attempts.saturating_sub(1).min(1000) as usize)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
            .as_secs_f64();
        let jitter = self.jitter.clamp(0.0, 1.0);
        let spread = if jitter > 0.0 {
            rand::random_range(-jitter..=jitter)
        } else {
            0.0
        };
        Duration::from_secs_f64((capped * (1.0 + spread)).max(0.0))
    }
}

impl RetryPolicy {
    /// Before another attempt: `false` when none may follow `attempts` (out of attempts,
    /// or the wait would reach the request `deadline`); else waits the backoff, counts the
    /// retry and returns `true`.
    pub async fn pause(&self, attempts: u32, deadline: Instant) -> bool {
        if !self.allows_another(attempts) {
            return false;
        }
        let wait = self.backoff(attempts);
        if Instant::now() + wait >= deadline {
            return false;
        }
        crate::metrics::retry();
        tokio::time::sleep(wait).await;
        true
    }
}

/// Which workers one request has been through, for the next selection: workers that
/// failed it are avoided while others are left (then tried again), workers whose breaker
/// refused it at the last moment are always avoided.
#[derive(Debug, Default)]
pub struct Tries {
    /// Attempts made.
    pub attempts: u32,
    tried: Vec<Arc<Worker>>,
    refused: Vec<Arc<Worker>>,
}

impl Tries {
    /// `worker` failed an attempt.
    pub fn failed(&mut self, worker: Arc<Worker>) {
        if !self.tried.iter().any(|w| Arc::ptr_eq(w, &worker)) {
            self.tried.push(worker);
        }
    }

    /// `worker`'s breaker refused the request when it was about to be sent.
    pub fn refused(&mut self, worker: Arc<Worker>) {
        self.refused.push(worker);
    }

    /// Selects with `policy` for `want` (whose `exclude` is replaced): a worker not tried
    /// yet if there is one, else any not refused.
    pub fn select(
        &self,
        policy: &Policy,
        set: &WorkerSet,
        want: Want<'_>,
    ) -> Result<Pick, NoWorker> {
        if self.tried.is_empty() && self.refused.is_empty() {
            return policy.pick(set, &want);
        }
        let both: Vec<Arc<Worker>> = self.tried.iter().chain(&self.refused).cloned().collect();
        match policy.pick(
            set,
            &Want {
                exclude: &both,
                ..want
            },
        ) {
            Err(NoWorker::NoneReady | NoWorker::CircuitOpen) if !self.tried.is_empty() => policy
                .pick(
                    set,
                    &Want {
                        exclude: &self.refused,
                        ..want
                    },
                ),
            other => other,
        }
    }
}

/// sglang-router's retryable statuses: 408, 429, 500, 502, 503, 504.
#[inline]
pub fn is_retryable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(jitter: f64) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(250),
            multiplier: 2.0,
            jitter,
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = policy(0.0);
        let waits: Vec<u128> = (1..=4).map(|n| p.backoff(n).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 250, 250]);
        assert_eq!(p.backoff(u32::MAX), Duration::from_millis(250));
        assert!(p.allows_another(4) && !p.allows_another(5));
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let p = policy(0.5);
        for _ in 0..200 {
            let ms = p.backoff(2).as_secs_f64() * 1000.0;
            assert!((100.0..=300.0).contains(&ms), "{ms}");
        }
    }

    #[test]
    fn retryable_statuses_are_sglang_routers() {
        let yes: Vec<u16> = (100..600)
            .filter(|&s| is_retryable_status(StatusCode::from_u16(s).unwrap()))
            .collect();
        assert_eq!(yes, vec![408, 429, 500, 502, 503, 504]);
    }

    #[test]
    fn from_config() {
        let c = ServeConfig::default();
        let p = RetryPolicy::from(&c);
        assert_eq!(p.max_attempts, 5);
        assert_eq!(p.initial_backoff, Duration::from_millis(50));
        let off = ServeConfig {
            disable_retries: true,
            ..c.clone()
        };
        assert_eq!(RetryPolicy::from(&off).max_attempts, 1);
        let zero = ServeConfig {
            retry_max_retries: 0,
            ..c
        };
        assert_eq!(RetryPolicy::from(&zero).max_attempts, 1);
    }
}
