//! Shared state of one simulated worker: its config, its data-parallel ranks (each with
//! its prefix cache and events, prefill lane and requests in flight: [`Rank`]), request
//! ids, and its L3 tier.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::config::{SimConfig, SimMode};
use super::error::SimError;
use super::l3::L3;
use super::model;
use super::outbox::Release;
use super::pd::PdState;
use super::prefix::PrefixStats;
pub use super::rank::{Cached, InflightGuard, PrefixHold, Rank};
use sglang::kv_events::publish::Publisher;
use sglang::tokenizer::Tokenizer;

/// State shared by every handler of one simulated worker.
#[derive(Debug)]
pub struct SimState {
    /// The worker's configuration.
    pub cfg: SimConfig,
    /// The PD machinery (prefill and decode modes).
    pub pd: Option<Arc<PdState>>,
    /// The data-parallel ranks (`--dp-size`; at least one).
    ranks: Vec<Rank>,
    /// The rank the next request that names none runs on.
    next_rank: AtomicUsize,
    /// `--kv-store`: evicted pages go to the store, and are loaded back from there.
    l3: Option<Arc<L3>>,
    /// `--tokenizer-path`: prompts tokenized as SGLang does (else the built-in tokenizer).
    tokenizer: Option<Arc<Tokenizer>>,
    /// The options of the profiling run in progress (`/start_profile`), if any.
    pub profiling: Mutex<Option<serde_json::Value>>,
    /// The Responses API's stored responses.
    pub responses: Mutex<super::response_store::ResponseStore>,
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
        Self::with_parts(cfg, pd, Vec::new(), None)
    }

    /// State with its PD machinery, the KV events publisher of each rank (none, or one
    /// per rank) and its L3 tier.
    pub fn with_parts(
        cfg: SimConfig,
        pd: Option<Arc<PdState>>,
        events: Vec<Publisher>,
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
        let mut events = events.into_iter();
        let ranks = (0..cfg.dp_size.max(1))
            .map(|r| Rank::new(r, &cfg, events.next(), l3.is_some()))
            .collect();
        Ok(Arc::new(SimState {
            cfg,
            pd,
            ranks,
            next_rank: AtomicUsize::new(0),
            l3,
            tokenizer,
            profiling: Mutex::new(None),
            responses: Mutex::default(),
            next_id: AtomicU64::new(0),
            id_base,
        }))
    }

    /// The tokenizer prompts go through, when `--tokenizer-path` gave one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_deref()
    }

    /// The KV events publisher of rank 0 (what `/get_server_info` reports; rank `r`
    /// publishes on its endpoints' ports + `r`).
    pub fn events(&self) -> Option<&Publisher> {
        self.ranks[0].events.as_deref()
    }

    /// Prompt tokens of the requests in flight, over every rank.
    pub fn prompt_tokens_in_flight(&self) -> u64 {
        self.ranks.iter().map(Rank::prompt_tokens_in_flight).sum()
    }

    /// Whether prompts go through the prefix cache (the handlers then tokenize them).
    pub fn caches_prefixes(&self) -> bool {
        self.ranks[0].caches_prefixes()
    }

    /// The rank a request runs on: the one it names (`data_parallel_rank`), or the next
    /// in turn. A rank the worker does not have is an error, as SGLang reports it.
    pub fn rank(&self, wanted: Option<u32>) -> Result<&Rank, SimError> {
        let n = self.ranks.len();
        match wanted {
            Some(r) => self.ranks.get(r as usize).ok_or_else(|| {
                SimError::BadRequest(format!(
                    "data_parallel_rank {r} is out of range: this worker has {n} data-parallel rank(s)"
                ))
            }),
            None => Ok(&self.ranks[self.next_rank.fetch_add(1, Ordering::Relaxed) % n]),
        }
    }

    /// Every rank, in order.
    pub fn ranks(&self) -> &[Rank] {
        &self.ranks
    }

    /// Runs `prompts` through `rank`'s prefix cache ([`Rank::admit`], with this worker's
    /// page size and L3 tier).
    pub async fn admit(
        &self,
        rank: &Rank,
        prompts: &[Arc<[u32]>],
    ) -> (Vec<Cached>, Option<PrefixHold>, Release) {
        rank.admit(self.cfg.page_size, self.l3.as_deref(), prompts)
            .await
    }

    /// Reserves `rank`'s prefill lane for `uncached` tokens ([`Rank::prefill_done_at`]).
    pub fn prefill_done_at(&self, rank: &Rank, uncached: u64) -> Option<Instant> {
        rank.prefill_done_at(self.cfg.prefill_compute_per_token, uncached)
    }

    /// `/flush_cache`: drops every cached page of every rank.
    pub fn flush_prefixes(&self) {
        self.ranks.iter().for_each(Rank::flush_prefixes);
    }

    /// The prefix caches' counters, summed over the ranks.
    pub fn prefix_stats(&self) -> Option<PrefixStats> {
        let mut all = self.ranks.iter().filter_map(Rank::prefix_stats);
        let mut s = all.next()?;
        for r in all {
            s.capacity_pages += r.capacity_pages;
            s.cached_pages += r.cached_pages;
            s.evicted_pages += r.evicted_pages;
        }
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

    /// Requests in flight over every rank (streams count until their body ends).
    pub fn in_flight(&self) -> u64 {
        self.ranks.iter().map(Rank::in_flight).sum()
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
        let g = s.rank(None).unwrap().enter();
        assert_eq!(s.in_flight(), 1);
        drop(g);
        assert_eq!(s.in_flight(), 0);
    }
}
