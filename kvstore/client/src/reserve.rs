//! Space this client holds reserved at the master for its next puts (the master's
//! `reserve` module): a put of a length it holds a reservation for writes straight into it
//! and commits, one master request instead of two.
//!
//! A reservation is used only
//! - within its `use_within_ms` of the request that brought it being sent (the master
//!   releases it long after that, and a segment remounted since takes no new values for
//!   that long), and
//! - while the master that made it is the one calls go to and has not restarted since (the
//!   same HA index and view version), since no other master knows it.
//!
//! Everything else is dropped unused and left to the master's TTL. The pool is bounded by
//! `put_reserve_bytes`; values longer than a sixteenth of it are put the two-request way.

use std::time::{Duration, Instant};

use openapi::master as wire;
use parking_lot::Mutex;

use super::StoreClient;
use super::error::StoreResult;
use super::results::{fail_all, key_results};
use openapi::master::ReplicateConfig;

/// Which master made a reservation: its index in the client's master list, and its view
/// version as the heartbeat last saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Maker {
    pub(super) index: usize,
    pub(super) view: u64,
}

/// One reservation held.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) id: u64,
    pub(super) length: u64,
    pub(super) replicas: Vec<wire::Replica>,
    config: ReplicateConfig,
    maker: Maker,
    use_by: Instant,
}

impl Held {
    fn bytes(&self) -> u64 {
        self.length.saturating_mul(self.replicas.len() as u64)
    }
}

/// The reservations a client holds.
#[derive(Debug)]
pub(super) struct Pool {
    budget: u64,
    held: Mutex<Vec<Held>>,
}

impl Pool {
    /// A pool holding at most `budget` bytes (0: never reserves).
    pub(super) fn new(budget: u64) -> Self {
        Self {
            budget,
            held: Mutex::new(Vec::new()),
        }
    }

    /// Whether a value of `length` bytes is put through reservations.
    pub(super) fn eligible(&self, length: u64) -> bool {
        length > 0 && length.saturating_mul(16) <= self.budget
    }

    /// A usable reservation for a value of `length` placed as `config`, made by `maker`;
    /// drops every reservation that can no longer be used.
    pub(super) fn take(&self, length: u64, config: &ReplicateConfig, maker: Maker) -> Option<Held> {
        if !self.eligible(length) {
            return None;
        }
        let now = Instant::now();
        let mut held = self.held.lock();
        held.retain(|h| h.maker == maker && now < h.use_by);
        let at = held
            .iter()
            .position(|h| h.length == length && h.config == *config)?;
        Some(held.swap_remove(at))
    }

    /// What to ask the master for so that `want` values of `length` find a reservation next
    /// time (`None`: nothing, or not eligible).
    pub(super) fn ask(
        &self,
        length: u64,
        want: usize,
        config: &ReplicateConfig,
    ) -> Option<wire::ReserveRequest> {
        if !self.eligible(length) || want == 0 {
            return None;
        }
        let held = self.held.lock();
        let have = held
            .iter()
            .filter(|h| h.length == length && h.config == *config)
            .count();
        let used: u64 = held.iter().map(Held::bytes).sum();
        let each = length.saturating_mul(u64::from(config.replica_num.max(1)));
        let room = (self.budget.saturating_sub(used) / each) as usize;
        let count = want.saturating_sub(have).min(room);
        (count > 0).then(|| wire::ReserveRequest {
            length,
            count: count.min(u32::MAX as usize) as u32,
        })
    }

    /// Keeps `got`, made by `maker` for values placed as `config` in answer to a request
    /// sent at `asked`, within the budget (what does not fit, or carries no replica, is
    /// dropped and left to the master's TTL). Each is usable until `use_within_ms` after
    /// `asked`, not after its arrival: the master's promises (see the module doc) count
    /// from before it answered. A `use_within_ms` past what the clock can hold makes the
    /// reservation unusable, not a panic.
    pub(super) fn add(
        &self,
        got: Vec<wire::Reservation>,
        config: &ReplicateConfig,
        maker: Maker,
        asked: Instant,
    ) {
        if got.is_empty() {
            return;
        }
        let now = asked;
        let mut held = self.held.lock();
        let mut used: u64 = held.iter().map(Held::bytes).sum();
        for r in got {
            let h = Held {
                id: r.id,
                length: r.length,
                replicas: r.replicas,
                config: config.clone(),
                maker,
                use_by: now
                    .checked_add(Duration::from_millis(r.use_within_ms))
                    .unwrap_or(now),
            };
            let bytes = h.bytes();
            if h.replicas.is_empty() || used.saturating_add(bytes) > self.budget {
                continue;
            }
            used += bytes;
            held.push(h);
        }
    }

    /// Drops every reservation (a master said one is gone: the others likely are too).
    pub(super) fn clear(&self) {
        self.held.lock().clear();
    }

    /// Reservations held (tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.held.lock().len()
    }
}

impl StoreClient {
    /// Commits values written into reservations (`(key, reservation, length)`), one
    /// request, asking for `ask` more reservations (made by `maker`) along.
    pub(super) async fn put_commits(
        &self,
        items: &[(&str, u64, u64)],
        ask: Option<wire::ReserveRequest>,
        maker: Maker,
    ) -> Vec<StoreResult<()>> {
        if items.is_empty() {
            return Vec::new();
        }
        let body = wire::BatchPutCommitRequest {
            client_id: self.inner.id.to_string(),
            items: items
                .iter()
                .map(|(key, id, length)| wire::PutCommitItem {
                    key: (*key).to_owned(),
                    reservation: *id,
                    length: *length,
                })
                .collect(),
            reserve: ask,
            config: self.replicate.clone(),
        };
        let asked = Instant::now();
        match self.inner.rpc.batch_put_commit(&body).await {
            Ok(r) => {
                self.inner
                    .reserved
                    .add(r.reservations, &self.replicate, maker, asked);
                key_results(
                    items.len(),
                    Ok(wire::BatchKeyResponse { results: r.results }),
                )
            }
            Err(e) => fail_all(items.len(), e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(id: u64, length: u64, use_within_ms: u64) -> wire::Reservation {
        wire::Reservation {
            id,
            length,
            replicas: vec![wire::Replica {
                kind: wire::ReplicaKind::Memory,
                segment: "s".into(),
                endpoint: "e".into(),
                address: 4096 * id,
                length,
            }],
            use_within_ms,
        }
    }

    const M: Maker = Maker { index: 0, view: 7 };

    #[test]
    fn takes_only_matching_fresh_reservations_of_the_same_master() {
        let pool = Pool::new(64 << 20);
        let cfg = ReplicateConfig::default();
        pool.add(vec![reservation(1, 4096, 60_000)], &cfg, M, Instant::now());
        // Another length, another config, another master: none.
        assert!(pool.take(8192, &cfg, M).is_none());
        let pinned = ReplicateConfig {
            hard_pin: true,
            ..cfg.clone()
        };
        assert!(pool.take(4096, &pinned, M).is_none());
        assert_eq!(pool.len(), 1);
        assert!(pool.take(4096, &cfg, Maker { view: 8, ..M }).is_none());
        // That look dropped it: it was made by a master that has since restarted.
        assert_eq!(pool.len(), 0);
        pool.add(vec![reservation(2, 4096, 60_000)], &cfg, M, Instant::now());
        assert_eq!(pool.take(4096, &cfg, M).map(|h| h.id), Some(2));
        assert!(pool.take(4096, &cfg, M).is_none());
    }

    #[test]
    fn an_aged_reservation_is_never_used() {
        let pool = Pool::new(64 << 20);
        let cfg = ReplicateConfig::default();
        pool.add(vec![reservation(1, 4096, 0)], &cfg, M, Instant::now());
        assert!(pool.take(4096, &cfg, M).is_none());
        assert_eq!(pool.len(), 0);
    }

    #[test]
    fn the_use_window_counts_from_the_ask_not_the_arrival() {
        // An answer read 2 s after its request was sent (a slow or descheduled reader)
        // brings a reservation of 1 s that is already over: the master counted from before
        // it answered, and may have handed the space out again since a restart.
        let pool = Pool::new(64 << 20);
        let cfg = ReplicateConfig::default();
        let asked = Instant::now()
            .checked_sub(Duration::from_secs(2))
            .expect("the clock has run 2 s");
        pool.add(vec![reservation(1, 4096, 1000)], &cfg, M, asked);
        assert!(pool.take(4096, &cfg, M).is_none());
        pool.add(vec![reservation(2, 4096, 60_000)], &cfg, M, asked);
        assert_eq!(pool.take(4096, &cfg, M).map(|h| h.id), Some(2));
    }

    #[test]
    fn what_a_master_hands_out_is_kept_only_within_the_budget_and_the_clock() {
        let pool = Pool::new(1 << 20);
        let cfg = ReplicateConfig::default();
        // More than asked for, or than the budget holds: 256 of 4 KiB fit in 1 MiB.
        pool.add(
            (1..=1000).map(|i| reservation(i, 4096, 60_000)).collect(),
            &cfg,
            M,
            Instant::now(),
        );
        assert_eq!(pool.len(), 256);
        assert!(pool.ask(4096, 1, &cfg).is_none(), "no room left");
        // The longest use-by time a master can write: no panic.
        let pool = Pool::new(1 << 20);
        pool.add(
            vec![reservation(1, 4096, u64::MAX)],
            &cfg,
            M,
            Instant::now(),
        );
        assert_eq!(pool.len(), 1);
        // One length past the budget alone: dropped.
        pool.add(
            vec![reservation(2, 2 << 20, 60_000)],
            &cfg,
            M,
            Instant::now(),
        );
        assert_eq!(pool.len(), 1);
    }

    #[test]
    fn asks_within_its_budget_for_what_it_lacks() {
        let pool = Pool::new(1 << 20);
        let cfg = ReplicateConfig::default();
        // A sixteenth of the budget at most.
        assert!(pool.ask(128 << 10, 4, &cfg).is_none());
        assert_eq!(pool.ask(4096, 64, &cfg).map(|a| a.count), Some(64));
        pool.add(
            (1..=60).map(|i| reservation(i, 4096, 60_000)).collect(),
            &cfg,
            M,
            Instant::now(),
        );
        assert_eq!(pool.ask(4096, 64, &cfg).map(|a| a.count), Some(4));
        // The budget caps it: 1 MiB holds 256 values of 4 KiB, 60 are held.
        assert_eq!(pool.ask(4096, 1000, &cfg).map(|a| a.count), Some(196));
        let two = ReplicateConfig {
            replica_num: 2,
            ..cfg.clone()
        };
        assert_eq!(pool.ask(4096, 1000, &two).map(|a| a.count), Some(98));
        assert!(Pool::new(0).ask(4096, 1, &cfg).is_none());
    }
}
