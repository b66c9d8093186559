//! One data-parallel rank of a simulated worker (`--dp-size`; one rank by default), as an
//! SGLang scheduler of a DP group: its own prefix cache and KV events, its own prefill lane,
//! and its own counts. A request runs on the rank its `data_parallel_rank` names, or on the
//! next one in turn (SGLang's `round_robin` balancing) when it names none.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::config::SimConfig;
use super::l3::L3;
use super::outbox::{Outbox, Release};
use super::prefix::{Admission, PrefixCache, PrefixStats};
use sglang::kv_events::hash::{self, PageDigest};
use sglang::kv_events::publish::Publisher;

/// A prompt's cached tokens, and how many of them were loaded from the store (L3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cached {
    /// Prompt tokens not computed (found in the prefix cache or loaded).
    pub tokens: u64,
    /// Of those, tokens loaded from the store; `None` without one (`--kv-store`).
    pub from_store: Option<u64>,
}

/// One rank (see the module doc).
#[derive(Debug)]
pub struct Rank {
    /// Its index (`data_parallel_rank`).
    pub index: u32,
    prefix: Option<Arc<Mutex<PrefixCache>>>,
    /// Its KV events publisher (`--kv-events-config`; rank `r` on the endpoint's port + `r`).
    pub events: Option<Arc<Publisher>>,
    /// What its events wait in until their prefill has run.
    outbox: Option<Outbox>,
    /// When its prefill lane is free again.
    lane: Mutex<Instant>,
    in_flight: Arc<AtomicU64>,
    /// Prompt tokens of its requests in flight (what their KV holds, for `/v1/loads`).
    prompt_tokens: Arc<AtomicU64>,
    /// Requests it has taken since the worker started.
    served: AtomicU64,
}

impl Rank {
    /// Rank `index` of a worker configured by `cfg`, publishing on `events` (which needs
    /// a tokio runtime).
    pub fn new(index: u32, cfg: &SimConfig, events: Option<Publisher>, l3: bool) -> Self {
        let events = events.map(Arc::new);
        let prefix = (!cfg.disable_radix_cache).then(|| {
            let c = PrefixCache::new(cfg.page_size as usize, cfg.pool_pages());
            Arc::new(Mutex::new(if l3 {
                c.keep_for_store(cfg.kv_store_write_policy)
            } else {
                c
            }))
        });
        Rank {
            index,
            prefix,
            outbox: events.clone().map(Outbox::new),
            events,
            lane: Mutex::new(Instant::now()),
            in_flight: Arc::default(),
            prompt_tokens: Arc::default(),
            served: AtomicU64::new(0),
        }
    }

    /// Whether prompts go through a prefix cache.
    pub fn caches_prefixes(&self) -> bool {
        self.prefix.is_some()
    }

    /// Counts a request as in flight on this rank until the guard drops.
    pub fn enter(&self) -> InflightGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.served.fetch_add(1, Ordering::Relaxed);
        InflightGuard {
            in_flight: self.in_flight.clone(),
            holds: Vec::new(),
            tokens: self.prompt_tokens.clone(),
            charged: 0,
        }
    }

    /// Requests in flight (streams count until their body ends).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Prompt tokens of the requests in flight ([`InflightGuard::charge`]).
    pub fn prompt_tokens_in_flight(&self) -> u64 {
        self.prompt_tokens.load(Ordering::Relaxed)
    }

    /// Requests this rank has taken.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Runs `prompts` through the prefix cache: how many tokens of each were cached, and
    /// what holds their pages until the request ends. With L3, the pages that continue a
    /// prompt's cached prefix in the store are loaded first (the caller waits for them),
    /// and the pages computed (write-through) or evicted (write-back) are queued for
    /// it. Queues what changed for publication: it leaves when the returned [`Release`]
    /// says (the end of the prefill), as SGLang publishes a prompt's pages.
    pub async fn admit(
        &self,
        page_size: u32,
        l3: Option<&L3>,
        prompts: &[Arc<[u32]>],
    ) -> (Vec<Cached>, Option<PrefixHold>, Release) {
        let Some(cache) = &self.prefix else {
            return (
                vec![Cached::default(); prompts.len()],
                None,
                Release::none(),
            );
        };
        let digests: Vec<Vec<PageDigest>> = prompts
            .iter()
            .map(|p| hash::page_digests(p, page_size as usize))
            .collect();
        let mut loaded = vec![0..0; prompts.len()];
        if let Some(l3) = l3 {
            for (d, range) in digests.iter().zip(&mut loaded) {
                let hit = cache.lock().cached_pages(d);
                *range = hit..hit + l3.load(&d[hit..]).await;
            }
        }
        let mut c = cache.lock();
        let held: Vec<Admission> = prompts
            .iter()
            .zip(&digests)
            .zip(loaded)
            .map(|((p, d), l)| c.admit_pages(p, d, l))
            .collect();
        let events = c.take_events();
        // Queued under the lock, so batches leave in the order the cache changed.
        let release = match &self.outbox {
            Some(o) => o.queue(events),
            None => Release::none(),
        };
        let to_store = c.take_for_store();
        drop(c);
        if let Some(l3) = l3 {
            l3.spill(to_store);
        }
        let cached = held
            .iter()
            .map(|a| Cached {
                tokens: a.cached_tokens,
                from_store: l3.map(|_| a.loaded_tokens),
            })
            .collect();
        (cached, Some(PrefixHold(cache.clone(), held)), release)
    }

    /// Reserves the prefill lane for `uncached` tokens at `per` each: when their prefill
    /// is done (none when there is nothing to compute). A rank computes one prefill at a
    /// time, in arrival order.
    pub fn prefill_done_at(&self, per: Duration, uncached: u64) -> Option<Instant> {
        let now = Instant::now();
        if per.is_zero() || uncached == 0 {
            return None;
        }
        let work = per.saturating_mul(u32::try_from(uncached).unwrap_or(u32::MAX));
        let mut lane = self.lane.lock();
        let start = (*lane).max(now);
        *lane = start + work.min(Duration::from_secs(3600));
        Some(*lane)
    }

    /// `/flush_cache`: drops every cached page (published as `AllBlocksCleared`).
    pub fn flush_prefixes(&self) {
        if let Some(cache) = &self.prefix {
            let mut c = cache.lock();
            c.clear();
            let events = c.take_events();
            if let Some(o) = &self.outbox {
                // Behind the batches already queued, and at once.
                o.queue(events).at(None);
            }
        }
    }

    /// The prefix cache's counters.
    pub fn prefix_stats(&self) -> Option<PrefixStats> {
        self.prefix.as_ref().map(|c| c.lock().stats())
    }
}

/// The pages a request holds in the prefix cache, released when it drops.
pub struct PrefixHold(Arc<Mutex<PrefixCache>>, Vec<Admission>);

impl std::fmt::Debug for PrefixHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixHold")
            .field("prompts", &self.1.len())
            .finish()
    }
}

impl Drop for PrefixHold {
    fn drop(&mut self) {
        let mut c = self.0.lock();
        for a in self.1.drain(..) {
            c.release(a);
        }
    }
}

/// Holds one request in its rank's in-flight count (and what it keeps until it ends, such
/// as the KV pages of a decode answer).
#[derive(Debug)]
pub struct InflightGuard {
    in_flight: Arc<AtomicU64>,
    holds: Vec<Box<dyn std::fmt::Debug + Send + Sync>>,
    tokens: Arc<AtomicU64>,
    charged: u64,
}

impl InflightGuard {
    /// Keeps `hold` until the request ends.
    pub fn hold(&mut self, hold: impl std::fmt::Debug + Send + Sync + 'static) {
        self.holds.push(Box::new(hold));
    }

    /// Counts `tokens` prompt tokens as held by this request until it ends.
    pub fn charge(&mut self, tokens: u64) {
        self.tokens.fetch_add(tokens, Ordering::Relaxed);
        self.charged += tokens;
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.tokens.fetch_sub(self.charged, Ordering::Relaxed);
    }
}
