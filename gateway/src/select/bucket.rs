//! `bucket` (smg's policy): prompts of similar length go to the same worker, so a worker
//! serving short prompts is not held up behind long prefills. The candidates, in a stable
//! order, each own one contiguous range of prompt lengths; the ranges are cut so that each
//! worker gets an equal share of the prompt bytes of the last [`WINDOW`] requests, and are
//! recut every [`RECUT_EVERY`] requests as the traffic changes (more often while the window
//! fills). While the load is
//! imbalanced (`--balance-abs-threshold` and `--balance-rel-threshold`, as `cache_aware`)
//! the least loaded worker takes the request instead.
//!
//! A prompt's length is its prompt key's ([`crate::proxy::prompt`]: its text, or its token
//! ids), so the ranges are in key bytes; a request without a prompt counts as length 0.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::config::ServeConfig;
use crate::workers::Worker;

/// Requests whose lengths set the ranges.
pub const WINDOW: usize = 4096;
/// Requests between two recuts of the ranges.
pub const RECUT_EVERY: usize = 256;

#[derive(Debug, Default)]
struct State {
    /// The last [`WINDOW`] prompt lengths.
    recent: VecDeque<usize>,
    /// Requests since the last recut.
    since: usize,
    /// Upper bounds of the ranges (exclusive), one fewer than the workers they were cut for.
    bounds: Vec<usize>,
}

/// The `bucket` policy.
#[derive(Debug)]
pub struct Bucket {
    abs: usize,
    rel: f64,
    state: Mutex<State>,
}

impl Default for Bucket {
    fn default() -> Self {
        Self::from(&ServeConfig::default())
    }
}

impl From<&ServeConfig> for Bucket {
    fn from(c: &ServeConfig) -> Self {
        Self::new(c.balance_abs_threshold, c.balance_rel_threshold)
    }
}

impl Bucket {
    /// With the imbalance thresholds `abs` and `rel`.
    pub fn new(abs: usize, rel: f64) -> Self {
        Self {
            abs,
            rel,
            state: Mutex::default(),
        }
    }

    /// Cuts `n` ranges holding equal shares of the prompt bytes in `recent`.
    fn cut(recent: &VecDeque<usize>, n: usize) -> Vec<usize> {
        let mut lens: Vec<usize> = recent.iter().copied().collect();
        lens.sort_unstable();
        let total: usize = lens.iter().sum();
        let mut bounds = Vec::with_capacity(n.saturating_sub(1));
        let mut acc = 0usize;
        let mut next = 1;
        for &l in &lens {
            acc += l;
            while next < n && acc * n >= total * next {
                bounds.push(l + 1);
                next += 1;
            }
        }
        while bounds.len() + 1 < n {
            bounds.push(usize::MAX);
        }
        bounds
    }

    /// The worker of `all` (not empty) for a prompt of `len` key bytes.
    pub fn pick<'a>(&self, all: &[&'a Arc<Worker>], len: usize) -> &'a Arc<Worker> {
        let (min, max) = all.iter().fold((usize::MAX, 0), |(lo, hi), w| {
            (lo.min(w.load()), hi.max(w.load()))
        });
        if max - min > self.abs && max as f64 > self.rel * min as f64 {
            return all
                .iter()
                .min_by_key(|w| w.load())
                .copied()
                .unwrap_or(all[0]);
        }
        let mut sorted: Vec<&'a Arc<Worker>> = all.to_vec();
        sorted.sort_by_key(|w| w.uid());
        let mut s = self.state.lock();
        s.recent.push_back(len);
        if s.recent.len() > WINDOW {
            s.recent.pop_front();
        }
        s.since += 1;
        // Recut every RECUT_EVERY requests, and while the window fills as often as it has
        // doubled since the last cut.
        if s.bounds.len() + 1 != sorted.len() || s.since >= RECUT_EVERY.min(s.recent.len()) {
            s.bounds = Self::cut(&s.recent, sorted.len());
            s.since = 0;
        }
        let i = s.bounds.partition_point(|&b| b <= len);
        sorted[i.min(sorted.len() - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::LoadGuard;
    use workers::testing::ready_workers;

    #[test]
    fn ranges_share_the_bytes_equally() {
        let recent: VecDeque<usize> = [10, 10, 10, 10, 40, 40, 100].into_iter().collect();
        // 220 bytes: 110 each; the shorts and both 40s (120) make the first half.
        assert_eq!(Bucket::cut(&recent, 2), vec![41]);
        // Nothing seen yet: the first worker takes everything.
        assert_eq!(Bucket::cut(&VecDeque::new(), 3), vec![usize::MAX; 2]);
        assert!(Bucket::cut(&recent, 1).is_empty());
    }

    #[test]
    fn short_and_long_prompts_part_ways_unless_the_load_is_imbalanced() {
        let ws = ready_workers(2);
        let all: Vec<&Arc<Worker>> = ws.iter().collect();
        let b = Bucket::new(2, 1.5);
        // Lengths spread from 100 to 10,000: once cut, shorts go to one, longs to the other.
        for i in 0..RECUT_EVERY {
            b.pick(&all, 100 + (i * 7919) % 9_900);
        }
        let short = b.pick(&all, 100);
        let long = b.pick(&all, 10_000);
        assert!(!Arc::ptr_eq(short, long));
        assert!(Arc::ptr_eq(b.pick(&all, 90), short));
        // The short worker busy past the thresholds: the long one takes a short prompt.
        let _busy: Vec<_> = (0..4)
            .map(|_| LoadGuard::admit(short.clone()).unwrap())
            .collect();
        assert!(Arc::ptr_eq(b.pick(&all, 100), long));
    }
}
