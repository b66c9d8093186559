//! Shared state of one simulated worker: its config, the requests in flight, request ids,
//! the prefix cache and its events, its L3 tier, and the prefill lane (one prefill computes
//! at a time).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::config::{SimConfig, SimMode};
use super::l3::L3;
use super::model;
use super::pd::PdState;
use super::prefix::{Admission, PrefixCache, PrefixStats};
use sglang::kv_events::hash::{self, PageDigest};
use sglang::kv_events::publish::Publisher;
use sglang::tokenizer::Tokenizer;

/// State shared by every handler of one simulated worker.
#[derive(Debug)]
pub struct SimState {
    /// The worker's configuration.
    pub cfg: SimConfig,
    /// The PD machinery (prefill and decode modes).
    pub pd: Option<Arc<PdState>>,
    /// The KV events publisher (`--kv-events-config`).
    pub events: Option<Publisher>,
    prefix: Option<Arc<Mutex<PrefixCache>>>,
    /// `--kv-store`: evicted pages go to the store, and are loaded back from there.
    l3: Option<Arc<L3>>,
    /// `--tokenizer-path`: prompts tokenized as SGLang does (else the built-in tokenizer).
    tokenizer: Option<Arc<Tokenizer>>,
    /// When the prefill lane is free again.
    lane: Mutex<Instant>,
    /// The options of the profiling run in progress (`/start_profile`), if any.
    pub profiling: Mutex<Option<serde_json::Value>>,
    /// The Responses API's stored responses.
    pub responses: Mutex<super::response_store::ResponseStore>,
    in_flight: Arc<AtomicU64>,
    /// Prompt tokens of the requests in flight (what their KV holds, for `/v1/loads`).
    prompt_tokens: Arc<AtomicU64>,
    next_id: AtomicU64,
    id_base: u64,
}

impl SimState {
    /// State for a worker configured by `cfg` (regular mode). Fails when its
    /// `--tokenizer-path` cannot be loaded.
    pub fn new(cfg: SimConfig) -> anyhow::Result<Arc<Self>> {
        Self::with_pd(cfg, None)
    }

    /// State for a worker configured by `cfg`, with its PD machinery.
    pub fn with_pd(cfg: SimConfig, pd: Option<Arc<PdState>>) -> anyhow::Result<Arc<Self>> {
        Self::with_parts(cfg, pd, None, None)
    }

    /// State with its PD machinery, its KV events publisher and its L3 tier.
    pub fn with_parts(
        cfg: SimConfig,
        pd: Option<Arc<PdState>>,
        events: Option<Publisher>,
        l3: Option<Arc<L3>>,
    ) -> anyhow::Result<Arc<Self>> {
        let tokenizer =
            // No pieces cache: the worker's tokenizer manager encodes every prompt whole, as
            // SGLang's does.
            Tokenizer::from_flags(cfg.tokenizer_path.as_deref(), cfg.chat_template.as_deref(), 0)
                .map_err(|e| anyhow::anyhow!("tokenizer_path: {e}"))?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let id_base = model::mix(nanos as u64 ^ u64::from(std::process::id()) << 32);
        let prefix = (!cfg.disable_radix_cache).then(|| {
            let c = PrefixCache::new(cfg.page_size as usize, cfg.pool_pages());
            Arc::new(Mutex::new(match l3 {
                Some(_) => c.keep_for_store(cfg.kv_store_write_policy),
                None => c,
            }))
        });
        Ok(Arc::new(SimState {
            cfg,
            pd,
            events,
            prefix,
            l3,
            tokenizer,
            lane: Mutex::new(Instant::now()),
            profiling: Mutex::new(None),
            responses: Mutex::default(),
            in_flight: Arc::default(),
            prompt_tokens: Arc::default(),
            next_id: AtomicU64::new(0),
            id_base,
        }))
    }

    /// The tokenizer prompts go through, when `--tokenizer-path` gave one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_deref()
    }

    /// Counts a request as in flight until the guard drops.
    pub fn enter(&self) -> InflightGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InflightGuard {
            in_flight: self.in_flight.clone(),
            holds: Vec::new(),
            tokens: self.prompt_tokens.clone(),
            charged: 0,
        }
    }

    /// Prompt tokens of the requests in flight ([`InflightGuard::charge`]).
    pub fn prompt_tokens_in_flight(&self) -> u64 {
        self.prompt_tokens.load(Ordering::Relaxed)
    }

    /// Whether prompts go through the prefix cache (the handlers then tokenize them).
    pub fn caches_prefixes(&self) -> bool {
        self.prefix.is_some()
    }

    /// Runs `prompts` through the prefix cache: how many tokens of each were cached, and
    /// what holds their pages until the request ends. With L3, the pages that continue a
    /// prompt's cached prefix in the store are loaded first (the caller waits for them),
    /// and the pages computed (write-through) or evicted (write-back) are queued for
    /// it. Publishes what changed.
    pub async fn admit(&self, prompts: &[Arc<[u32]>]) -> (Vec<u64>, Option<PrefixHold>) {
        let Some(cache) = &self.prefix else {
            return (vec![0; prompts.len()], None);
        };
        let ps = self.cfg.page_size as usize;
        let digests: Vec<Vec<PageDigest>> =
            prompts.iter().map(|p| hash::page_digests(p, ps)).collect();
        let mut loaded = vec![0..0; prompts.len()];
        if let Some(l3) = &self.l3 {
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
        if let Some(p) = &self.events {
            // Published under the lock, so batches leave in the order the cache changed.
            p.publish(events);
        }
        let to_store = c.take_for_store();
        drop(c);
        if let Some(l3) = &self.l3 {
            l3.spill(to_store);
        }
        let cached = held.iter().map(|a| a.cached_tokens).collect();
        (cached, Some(PrefixHold(cache.clone(), held)))
    }

    /// Reserves the prefill lane for `uncached` tokens: when their prefill is done (none
    /// when there is nothing to compute). A worker computes one prefill at a time, in
    /// arrival order.
    pub fn prefill_done_at(&self, uncached: u64) -> Option<Instant> {
        let per = self.cfg.prefill_compute_per_token;
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
            if let Some(p) = &self.events {
                p.publish(events);
            }
        }
    }

    /// The prefix cache's counters.
    pub fn prefix_stats(&self) -> Option<PrefixStats> {
        let mut s = self.prefix.as_ref().map(|c| c.lock().stats())?;
        s.store = self.l3.as_ref().map(|l| l.stats());
        Some(s)
    }

    /// The L3 tier, with `--kv-store`.
    pub fn l3(&self) -> Option<&Arc<L3>> {
        self.l3.as_ref()
    }

    /// Whether a request with `routing` moves KV (PD). A decode worker given no bootstrap
    /// fields computes the prompt itself (the gateway chose not to disaggregate).
    pub fn moves_kv(&self, routing: &openapi::shapes::Routing) -> bool {
        self.pd.is_some()
            && !(self.cfg.mode == SimMode::Decode
                && routing.bootstrap_room.is_none()
                && routing.bootstrap_host.is_none())
    }

    /// This worker's role.
    pub fn mode(&self) -> SimMode {
        self.cfg.mode
    }

    /// A request's token limit as this worker applies it: a prefill worker writes one token
    /// (its prefill forward), the decode worker the rest.
    pub fn cap_output(&self, max: u32) -> u32 {
        match self.cfg.mode {
            SimMode::Prefill => max.min(1),
            _ => max,
        }
    }

    /// Whether this worker computes prompt logprobs (a decode worker did not see the
    /// prompt's forward pass: the prefill did, and the router merges them in).
    pub fn prompt_logprobs(&self) -> bool {
        self.cfg.mode != SimMode::Decode
    }

    /// Requests in flight (streams count until their body ends).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// A fresh id in UUID form (`8-4-4-4-12` hex digits), unique within this process.
    pub fn new_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let hi = model::mix(self.id_base ^ n);
        let lo = model::mix(hi ^ n.rotate_left(32));
        let v = u128::from(hi) << 64 | u128::from(lo);
        let mut id = String::with_capacity(36);
        for (i, shift) in (0..32).rev().map(|d| d * 4).enumerate() {
            if matches!(i, 8 | 12 | 16 | 20) {
                id.push('-');
            }
            let digit = ((v >> shift) & 0xf) as u32;
            id.push(char::from_digit(digit, 16).unwrap_or('0'));
        }
        id
    }

    /// A fresh 32-hex-digit id (SGLang's `/generate` request id form).
    pub fn new_rid(&self) -> String {
        self.new_id().replace('-', "")
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

/// Holds one request in the in-flight count (and what it keeps until it ends, such as the
/// KV pages of a decode answer).
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

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_shaped() {
        let s = SimState::new(SimConfig::default()).unwrap();
        let a = s.new_id();
        let b = s.new_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
        assert_eq!(s.new_rid().len(), 32);
        let g = s.enter();
        assert_eq!(s.in_flight(), 1);
        drop(g);
        assert_eq!(s.in_flight(), 0);
    }
}
