//! `least_load` (smg's policy): the worker whose queue would clear first. Each worker's
//! score is the tokens it holds or waits for over the rate it generates, plus a term for
//! how full its KV cache is:
//!
//! `score = (reported tokens + gateway's prompt tokens to prefill) / throughput
//!          + kv_weight × k / (1 − k)`
//!
//! where the reported tokens (`num_used_tokens`, and `num_waiting_reqs` ×
//! [`MEAN_PREFILL_TOKENS`]), the throughput (`gen_throughput`, else
//! [`DEFAULT_THROUGHPUT`]) and `k` (`token_usage`, below 1) come from the worker's own
//! `/v1/loads`, polled every `--load-poll-interval-secs` ([`crate::workers::ReportedLoad`]).
//! The gateway's own part moves between polls: the prompt tokens of the requests it sent
//! the worker that have not had their first token yet ([`Worker::prefill_backlog`], each
//! request charged its prompt's size, [`prompt_tokens`]), so a burst right after a poll
//! spreads by what it weighs instead of herding onto the worker the last report favoured.
//! A worker without a fresh report (never answered, or not within three intervals) is
//! scored by that backlog alone; ties go to the fewest in flight.

use std::sync::Arc;
use std::time::Duration;

use crate::config::ServeConfig;
use crate::workers::Worker;

/// Prompt tokens assumed per request whose size is not known (smg's default).
pub const MEAN_PREFILL_TOKENS: f64 = 1024.0;
/// Tokens a second assumed of a worker that reports none (smg's default).
pub const DEFAULT_THROUGHPUT: f64 = 2000.0;

/// A request's prompt tokens, estimated from its prompt key: token ids are 4 bytes each,
/// and text is taken at 4 bytes a token; [`MEAN_PREFILL_TOKENS`] without a key. Keys stop
/// at [`crate::proxy::prompt::MAX_KEY_BYTES`], so longer prompts count as that long.
pub fn prompt_tokens(key: Option<&[u8]>) -> u64 {
    match key {
        Some(k) => (super::namespace::prompt_of(k).len().saturating_sub(1) / 4).max(1) as u64,
        None => MEAN_PREFILL_TOKENS as u64,
    }
}

/// The `least_load` policy.
#[derive(Debug, Clone)]
pub struct LeastLoad {
    kv_weight: f64,
    fresh: Duration,
}

impl Default for LeastLoad {
    fn default() -> Self {
        Self::from(&ServeConfig::default())
    }
}

impl From<&ServeConfig> for LeastLoad {
    fn from(c: &ServeConfig) -> Self {
        Self::new(
            c.least_load_kv_weight,
            Duration::from_secs(c.load_poll_interval_secs.max(1) * 3),
        )
    }
}

impl LeastLoad {
    /// With KV-pressure weight `kv_weight`; a report older than `fresh` is not used.
    pub fn new(kv_weight: f64, fresh: Duration) -> Self {
        Self {
            kv_weight: if kv_weight.is_finite() && kv_weight >= 0.0 {
                kv_weight
            } else {
                0.0
            },
            fresh,
        }
    }

    /// The score of `w` (lower is better).
    pub fn score(&self, w: &Worker) -> f64 {
        let backlog = w.prefill_backlog() as f64;
        match w.reported().filter(|r| r.at.elapsed() <= self.fresh) {
            Some(r) => {
                let throughput = if r.gen_throughput > 0.0 {
                    r.gen_throughput
                } else {
                    DEFAULT_THROUGHPUT
                };
                let tokens =
                    r.used_tokens as f64 + r.waiting_reqs as f64 * MEAN_PREFILL_TOKENS + backlog;
                let k = r.token_usage.clamp(0.0, 0.999);
                tokens / throughput + self.kv_weight * k / (1.0 - k)
            }
            None => backlog / DEFAULT_THROUGHPUT,
        }
    }

    /// The best of `all` (not empty).
    pub fn pick<'a>(&self, all: &[&'a Arc<Worker>]) -> &'a Arc<Worker> {
        let mut best = all[0];
        let mut best_score = self.score(best);
        for &w in &all[1..] {
            let s = self.score(w);
            if s < best_score || (s == best_score && w.load() < best.load()) {
                best = w;
                best_score = s;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::{LoadGuard, ReportedLoad};
    use tokio::time::Instant;
    use workers::testing::ready_workers;

    fn report(used: u64, waiting: u64, usage: f64) -> ReportedLoad {
        ReportedLoad {
            at: Instant::now(),
            used_tokens: used,
            waiting_reqs: waiting,
            gen_throughput: 0.0,
            token_usage: usage,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_queue_that_clears_first_wins() {
        let p = LeastLoad::new(0.15, Duration::from_secs(3));
        let ws = ready_workers(2);
        let (a, b) = (ws[0].clone(), ws[1].clone());
        // No reports: the prompt tokens the gateway sent decide.
        let mut g = LoadGuard::admit(a.clone()).unwrap();
        g.charge_prefill(prompt_tokens(Some(b"t0123456789abcdef")));
        assert_eq!(a.prefill_backlog(), 4);
        assert!(Arc::ptr_eq(p.pick(&[&a, &b]), &b));
        // a reports an empty queue, b a long one: a wins despite its request in flight.
        a.set_reported(report(0, 0, 0.0));
        b.set_reported(report(20_000, 4, 0.5));
        assert!(Arc::ptr_eq(p.pick(&[&a, &b]), &a));
        // KV pressure near full weighs in.
        a.set_reported(report(0, 0, 0.999));
        b.set_reported(report(1000, 0, 0.1));
        assert!(p.score(&a) > p.score(&b));
        // A stale report is not used.
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(p.score(&b), 0.0);
        assert!(p.score(&a) > 0.0, "scored by its backlog");
        assert_eq!(prompt_tokens(None), MEAN_PREFILL_TOKENS as u64);
    }
}
