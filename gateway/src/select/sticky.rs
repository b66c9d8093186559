//! The `manual` policy's table (smg's name): sticky sessions. A routing key's first
//! request is assigned by `cache_aware` (so it goes where its prompt's prefix is likely
//! cached) and its next ones stay with that worker as long as it can take them; when it
//! cannot (gone, not ready, breaker open, failed this request), `cache_aware` reassigns
//! the key. Unlike `consistent_hashing`, a worker joining moves no session.
//!
//! Memory is bounded: at most `max_keys` keys (the least recently used is forgotten
//! first) of at most [`super::affinity::MAX_ROUTING_KEY_LEN`] bytes each, and a key idle
//! for `max_idle` is forgotten (treated as new) on its next request.

use std::time::Duration;

use hashlink::LruCache;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::ServeConfig;
use crate::outcome::StickyDecision;

/// `manual` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StickyConfig {
    /// Keys remembered at most.
    pub max_keys: usize,
    /// A key unused this long is forgotten.
    pub max_idle: Duration,
}

impl Default for StickyConfig {
    fn default() -> Self {
        Self::from(&ServeConfig::default())
    }
}

impl From<&ServeConfig> for StickyConfig {
    fn from(c: &ServeConfig) -> Self {
        Self {
            max_keys: c.sticky_max_keys.max(1),
            max_idle: Duration::from_secs(c.sticky_max_idle_secs),
        }
    }
}

/// Where a key was sent, and when last.
#[derive(Debug, Clone, Copy)]
struct Seat {
    uid: u64,
    used: Instant,
}

/// Routing key -> worker ([`crate::workers::Worker::uid`]), least recently used first out.
#[derive(Debug)]
pub struct Sticky {
    cfg: StickyConfig,
    seats: Mutex<LruCache<Box<[u8]>, Seat>>,
}

impl Sticky {
    /// An empty table.
    pub fn new(cfg: StickyConfig) -> Self {
        Self {
            cfg,
            seats: Mutex::new(LruCache::new(cfg.max_keys)),
        }
    }

    /// The worker `key` sits with, if it has one that has not idled out.
    pub fn seat(&self, key: &[u8]) -> Option<u64> {
        let now = Instant::now();
        let mut seats = self.seats.lock();
        let seat = seats.get_mut(key)?;
        if now.saturating_duration_since(seat.used) > self.cfg.max_idle {
            seats.remove(key);
            return None;
        }
        seat.used = now;
        Some(seat.uid)
    }

    /// Seats `key` with worker `uid` (a new key, or one whose worker could not take it).
    pub fn assign(&self, key: &[u8], uid: u64) {
        let seat = Seat {
            uid,
            used: Instant::now(),
        };
        self.seats.lock().insert(key.into(), seat);
    }

    /// Picks for `key` among workers with `uids`: its seat if one of them, else what
    /// `assign` chooses (its index), which becomes the key's seat.
    pub fn pick(
        &self,
        key: &[u8],
        uids: impl Iterator<Item = u64> + Clone,
        assign: impl FnOnce() -> (usize, u64),
    ) -> (usize, StickyDecision) {
        let had = self.seat(key);
        if let Some(uid) = had
            && let Some(i) = uids.clone().position(|u| u == uid)
        {
            return (i, StickyDecision::Hit);
        }
        let (i, uid) = assign();
        self.assign(key, uid);
        let decision = if had.is_some() {
            StickyDecision::Reassign
        } else {
            StickyDecision::Assign
        };
        (i, decision)
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.seats.lock().len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max_keys: usize) -> Sticky {
        Sticky::new(StickyConfig {
            max_keys,
            max_idle: Duration::from_secs(60),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_stays_seated_until_its_worker_is_gone_or_it_idles_out() {
        let t = table(8);
        let uids = [10, 20, 30];
        let (i, d) = t.pick(b"s1", uids.iter().copied(), || (1, 20));
        assert_eq!((i, d), (1, StickyDecision::Assign));
        // Later requests stay, whatever the assigner would say.
        for _ in 0..3 {
            let got = t.pick(b"s1", uids.iter().copied(), || unreachable!());
            assert_eq!(got, (1, StickyDecision::Hit));
        }
        // Its worker is not among the candidates: reassigned, and the new seat holds.
        let got = t.pick(b"s1", [10, 30].into_iter(), || (1, 30));
        assert_eq!(got, (1, StickyDecision::Reassign));
        assert_eq!(t.seat(b"s1"), Some(30));
        // Used within the idle limit, it stays; idle past it, it is new again.
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(t.seat(b"s1"), Some(30));
        tokio::time::advance(Duration::from_secs(61)).await;
        let got = t.pick(b"s1", uids.iter().copied(), || (0, 10));
        assert_eq!(got, (0, StickyDecision::Assign));
    }

    #[test]
    fn the_table_never_holds_more_than_its_bound_and_forgets_the_least_recent() {
        let t = table(100);
        for k in 0..10_000u32 {
            t.assign(format!("key-{k}").as_bytes(), u64::from(k % 3));
        }
        assert_eq!(t.len(), 100);
        assert_eq!(t.seat(b"key-9999"), Some(9999 % 3));
        assert_eq!(t.seat(b"key-0"), None);
    }
}
