//! The `kv_aware` policy: route by what the workers really hold in their KV caches, as
//! their SGLang KV events ([`sglang::kv_events`]) report it (the approach of NVIDIA Dynamo's
//! KV router and llm-d's precise prefix-cache scorer).
//!
//! - **Events.** [`KvAware::sync`] (the gateway's upkeep task, every second) subscribes to
//!   each worker's events: the endpoint is `--kv-events-endpoint` with `{host}` the
//!   worker's host, or what the worker reports in `/get_server_info` (`kv_events_config`; a
//!   wildcard host becomes the worker's). One [`index::KvIndex`] holds every worker's pages;
//!   a worker gone is forgotten, a gap in its events is replayed or its pages forgotten
//!   until it reports them again ([`sglang::kv_events::subscribe`]).
//! - **Tokens.** The prompt's token ids come from the prompt key ([`crate::proxy::prompt`]):
//!   `/generate` and `/v1/completions` with token ids need no tokenizer; text and chat
//!   prompts get theirs from `--tokenizer-path` ([`sglang::tokenizer`], the worker's own
//!   tokenizer and chat template), and without one are routed by the fallback. Their page
//!   hashes come from a memo of the pages met before ([`hash::DigestMemo`]): a shared
//!   prefix is hashed once.
//! - **Score.** For each candidate, its cached prefix in pages (device pages, plus pages
//!   in host memory at `--kv-host-page-value` each, then pages of the store at
//!   `--kv-l3-page-value`, or `--kv-l3-disk-page-value` for those only on a disk tier:
//!   [`Tiers`]) gives the tokens left to
//!   prefill; cost = `--kv-overlap-weight` × (tokens to prefill + `--kv-backlog-weight` ×
//!   the worker's prefill backlog) + `--kv-load-weight` × requests in flight × mean prompt
//!   tokens (Dynamo's prefill-blocks-plus-decode-blocks cost, in tokens; the load term
//!   small by default, as a request past its prefill costs the next one little). A backlog weight below 1 makes a
//!   request's own uncached tokens dearer than the tokens queued before it: computing them
//!   also fills the worker's cache with pages another worker may already hold, so a
//!   prompt stays with its prefix through short queues. The backlog
//!   ([`Worker::prefill_backlog`]) is what the requests this gateway sent there still
//!   have to prefill: each request's tokens to prefill are charged when it is sent and
//!   released at its answer's first frame (a streamed answer's first token; an answer
//!   relayed whole holds them to its end), or when the answer is a retryable status kept
//!   while the request is retried. The
//!   cheapest wins (`--router-temperature` 0), or one is drawn with softmax(−cost / max
//!   cost / T).
//! - **Predicted pages.** A request routed on events predicts its prompt's pages on the
//!   worker it went to until it ends ([`predict`]): the requests sharing a new prefix that
//!   arrive before the worker's events find it there.
//! - **Store.** The pages that continue a candidate's cached prefix in the KV master's
//!   store (SGLang HiCache's L3, [`store`]) count `--kv-l3-page-value` each: any worker
//!   can load them. The master hosted here answers while it serves
//!   ([`KvAware::use_store`]); otherwise a view of the serving master's object events
//!   ([`follow`]).
//! - **Fallback.** A worker without events (none yet, no endpoint, more than
//!   [`index::MAX_SLOTS`] workers) is scored with its `cache_aware` tree's estimate
//!   instead, and said so once in the log; with no events at all, or no token ids,
//!   `cache_aware` decides. So it does for a request in a cache namespace (LoRA adapter,
//!   `cache_salt`, `extra_key`): its tree keeps namespaces apart, the index cannot.

pub mod follow;
pub mod index;
pub mod predict;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio_util::sync::CancellationToken;

use super::cache_aware::{CacheAware, CacheAwareConfig};
use crate::client::HttpClient;
use crate::config::ServeConfig;
use crate::metrics;
use crate::outcome::KvDecision;
pub use crate::outcome::Tiers;
use crate::workers::Worker;
use index::{KvIndex, MAX_SLOTS, SlotSet};
use predict::{Predicted, Prediction};
use sglang::kv_events::hash;
use sglang::kv_events::subscribe::{self, EventSink, Source};
use sglang::kv_events::wire::{EventBatch, KvEvent};
use store::{KeyFormat, Lookup, Probe, StoreSource};

/// How long `/get_server_info` may take when looking for a worker's events endpoint.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(2);

/// `kv_aware` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KvAwareConfig {
    /// Weight of a token to prefill against the tokens of the requests in flight.
    pub overlap_weight: f64,
    /// Weight of a token in a worker's prefill backlog against one of the request's own.
    pub backlog_weight: f64,
    /// Weight of a request in flight, in mean prompts.
    pub load_weight: f64,
    /// Predict routed requests' pages ([`predict`]).
    pub predict: bool,
    /// Softmax temperature (0: argmin).
    pub temperature: f64,
    /// Every worker's endpoint, `{host}` for the worker's host.
    pub events_endpoint: Option<String>,
    /// What a page in a worker's host memory is worth against one on its device.
    pub host_page_value: f64,
    /// What a page in the store is worth against one on the device (0: not looked at).
    pub l3_page_value: f64,
    /// What a page only on a disk tier of the store is worth.
    pub l3_disk_page_value: f64,
    /// How the store names a page.
    pub l3_keys: KeyFormat,
    /// The fallback's settings.
    pub fallback: CacheAwareConfig,
}

impl Default for KvAwareConfig {
    fn default() -> Self {
        Self::from(&ServeConfig::default())
    }
}

impl From<&ServeConfig> for KvAwareConfig {
    fn from(c: &ServeConfig) -> Self {
        KvAwareConfig {
            overlap_weight: c.kv_overlap_weight,
            backlog_weight: c.kv_backlog_weight,
            load_weight: c.kv_load_weight,
            predict: !c.kv_no_predictions,
            temperature: c.router_temperature,
            events_endpoint: c.kv_events_endpoint.clone(),
            host_page_value: c.kv_host_page_value,
            l3_page_value: c.kv_l3_page_value,
            l3_disk_page_value: c.kv_l3_disk_page_value,
            l3_keys: KeyFormat::new(&c.kv_l3_key_format),
            fallback: CacheAwareConfig::from(c),
        }
    }
}

/// What [`KvAware::scan`] found: each candidate's cached tokens and slot (`None`: no
/// events), and the prompt's page hashes per page size met.
struct Scan {
    cached: Vec<Option<f64>>,
    /// Each candidate's cached prefix by tier (default for one without events).
    tiers: Vec<Tiers>,
    slots: Vec<Option<usize>>,
    page_hashes: HashMap<u32, Vec<hash::BlockHash>>,
}

/// A decision: the worker, how it was made, its tokens to compute, its slot with the
/// prompt's page hashes there, and when events decided the prompt's tokens and what the
/// worker holds of them by tier (see [`KvAware::decide_charged`]).
type Decided<'a> = (
    &'a Arc<Worker>,
    KvDecision,
    u64,
    Option<(usize, Vec<hash::BlockHash>)>,
    Option<(u64, Tiers)>,
);

/// What the subscriber tasks share with the policy.
#[derive(Debug)]
struct Shared {
    index: RwLock<KvIndex>,
    /// Slots whose worker has sent events.
    live: AtomicU64,
    /// Each slot's page size (from its events).
    page_size: [AtomicU32; MAX_SLOTS],
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            index: RwLock::default(),
            live: AtomicU64::new(0),
            page_size: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

#[derive(Debug)]
struct Sub {
    slot: usize,
    stop: CancellationToken,
}

/// The policy's state.
#[derive(Debug)]
pub struct KvAware {
    cfg: KvAwareConfig,
    shared: Arc<Shared>,
    subs: RwLock<HashMap<u64, Sub>>,
    /// Workers whose endpoint could not be found (retried on every sync, logged once).
    no_events: Mutex<HashSet<u64>>,
    fallback: CacheAware,
    /// Mean tokens per prompt (an f64's bits, a moving average).
    mean_pages: AtomicU64,
    /// The store's index, when this process hosts the master.
    store: OnceLock<Arc<dyn StoreSource>>,
    /// Prompts' page digests met before.
    digests: hash::DigestMemo,
    /// Pages of the requests routed and still in flight, on the worker they went to.
    predicted: Arc<RwLock<Predicted>>,
}

struct Sink {
    shared: Arc<Shared>,
    slot: usize,
}

impl EventSink for Sink {
    fn apply(&self, batch: &EventBatch) {
        if let Some(KvEvent::BlockStored { block_size, .. }) = batch
            .events
            .iter()
            .find(|e| matches!(e, KvEvent::BlockStored { .. }))
        {
            self.shared.page_size[self.slot].store(*block_size, Ordering::Relaxed);
        }
        self.shared.index.write().apply_batch(self.slot, batch);
        self.shared.live.fetch_or(1 << self.slot, Ordering::Release);
    }

    fn resync(&self) {
        self.shared.index.write().remove_slot(self.slot);
    }
}

/// The token ids a prompt key carries (`i` keys: token-id prompts), if any.
pub fn key_tokens(key: &[u8]) -> Option<Vec<u32>> {
    let (&tag, ids) = super::namespace::prompt_of(key).split_first()?;
    if tag != b'i' || ids.is_empty() {
        return None;
    }
    Some(
        ids.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

impl KvAware {
    /// A policy with `cfg`.
    pub fn new(cfg: KvAwareConfig) -> Self {
        KvAware {
            fallback: CacheAware::new(cfg.fallback.clone()),
            cfg,
            shared: Arc::default(),
            subs: RwLock::default(),
            no_events: Mutex::default(),
            mean_pages: AtomicU64::new(0f64.to_bits()),
            store: OnceLock::new(),
            digests: hash::DigestMemo::default(),
            predicted: Arc::default(),
        }
    }

    /// Counts the pages `source`'s store holds (only the first call counts; nothing
    /// when `--kv-l3-page-value` is 0).
    pub fn use_store(&self, source: Arc<dyn StoreSource>) {
        if self.cfg.l3_page_value > 0.0 {
            let _ = self.store.set(source);
        }
    }

    /// The `cache_aware` fallback (its trees are kept by the same upkeep).
    pub fn fallback(&self) -> &CacheAware {
        &self.fallback
    }

    /// Pages indexed and events applied so far.
    pub fn index_stats(&self) -> (usize, u64) {
        let ix = self.shared.index.read();
        (ix.len(), ix.applied())
    }

    /// Workers whose events are followed.
    pub fn followed(&self) -> usize {
        self.subs.read().len()
    }

    /// Whether `worker` has sent events.
    pub fn has_events(&self, worker: &Worker) -> bool {
        self.slot_of(worker)
            .is_some_and(|s| self.live_slots() & (1 << s) != 0)
    }

    fn live_slots(&self) -> SlotSet {
        self.shared.live.load(Ordering::Acquire)
    }

    fn slot_of(&self, worker: &Worker) -> Option<usize> {
        self.subs.read().get(&worker.uid()).map(|s| s.slot)
    }

    /// How many of `tokens` each candidate holds cached (device pages; host pages at
    /// `--kv-host-page-value`; then pages in the store at `--kv-l3-page-value`, or
    /// `--kv-l3-disk-page-value` on a disk tier), `None` for
    /// a candidate without events.
    pub fn cached_tokens(&self, candidates: &[&Arc<Worker>], tokens: &[u32]) -> Vec<Option<f64>> {
        self.scan(candidates, tokens).cached
    }

    /// [`KvAware::cached_tokens`], with each candidate's slot and the prompt's page hashes
    /// per page size met (what a prediction on the chosen worker is made of).
    fn scan(&self, candidates: &[&Arc<Worker>], tokens: &[u32]) -> Scan {
        let live = self.live_slots();
        let slots: Vec<Option<usize>> = {
            let subs = self.subs.read();
            candidates
                .iter()
                .map(|w| {
                    subs.get(&w.uid())
                        .map(|s| s.slot)
                        .filter(|s| live & (1 << s) != 0)
                })
                .collect()
        };
        let mut out = vec![None; candidates.len()];
        let mut tiers = vec![Tiers::default(); candidates.len()];
        let mut page_hashes: HashMap<u32, Vec<hash::BlockHash>> = HashMap::new();
        // Workers may differ in page size: one match per page size.
        let mut sizes: Vec<u32> = slots
            .iter()
            .flatten()
            .map(|&s| self.shared.page_size[s].load(Ordering::Relaxed))
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        for ps in sizes {
            let mask = slots
                .iter()
                .flatten()
                .filter(|&&s| self.shared.page_size[s].load(Ordering::Relaxed) == ps)
                .fold(0u64, |m, &s| m | 1 << s);
            if ps == 0 {
                for (i, s) in slots.iter().enumerate() {
                    if s.is_some_and(|s| mask & (1 << s) != 0) {
                        out[i] = Some(0.0);
                    }
                }
                continue;
            }
            let digests = self.digests.page_digests(tokens, ps as usize);
            let hashes: &[hash::BlockHash] = page_hashes
                .entry(ps)
                .or_insert_with(|| digests.iter().map(hash::block_hash).collect());
            let o = {
                let predicted = self.predicted.read();
                self.shared
                    .index
                    .read()
                    .overlap(hashes, mask, MAX_SLOTS, |h| predicted.slots(h))
            };
            let lookup = self.store.get().and_then(|s| {
                s.master()
                    .map(Lookup::Master)
                    .or_else(|| s.view().map(Lookup::View))
            });
            let mut probe = lookup.map(|l| Probe::new(l, &self.cfg.l3_keys, &digests));
            let cfg = &self.cfg;
            for (i, s) in slots.iter().enumerate() {
                if let Some(s) = s.filter(|s| mask & (1 << s) != 0) {
                    let run = probe
                        .as_mut()
                        .map(|p| p.run_from((o.depth[s] + o.host[s]) as usize))
                        .unwrap_or_default();
                    let pages = f64::from(o.depth[s])
                        + cfg.host_page_value * f64::from(o.host[s])
                        + cfg.l3_page_value * f64::from(run.memory)
                        + cfg.l3_disk_page_value * f64::from(run.disk);
                    out[i] = Some(pages * f64::from(ps));
                    let tokens = |pages: u32| u64::from(pages) * u64::from(ps);
                    tiers[i] = Tiers {
                        device: tokens(o.depth[s]),
                        host: tokens(o.host[s]),
                        store: tokens(run.memory),
                        store_disk: tokens(run.disk),
                        estimated: 0,
                    };
                }
            }
        }
        Scan {
            cached: out,
            tiers,
            slots,
            page_hashes,
        }
    }

    /// Picks one of `candidates` (not empty) for the prompt `key`; also answers the prompt
    /// tokens the chosen worker is expected to compute (0 when `cache_aware` decided), and
    /// the prompt's pages predicted on it (when events decided) until the handle drops:
    /// keep it as long as the request runs.
    pub fn pick<'a>(
        &self,
        candidates: &[&'a Arc<Worker>],
        key: Option<&[u8]>,
    ) -> (&'a Arc<Worker>, u64, Option<Prediction>) {
        let (w, d, uncached, pages, held) = self.decide_charged(candidates, key);
        metrics::kv_aware_decision(d);
        if let Some((prompt, tiers)) = held {
            metrics::kv_aware_tokens(prompt, &tiers);
            tracing::debug!(
                worker = %w.url().as_str(),
                decision = d.as_str(),
                prompt,
                device = tiers.device,
                host = tiers.host,
                store = tiers.store,
                store_disk = tiers.store_disk,
                estimated = tiers.estimated,
                to_prefill = uncached,
                "kv_aware decision"
            );
        }
        let prediction = pages
            .filter(|(_, hashes)| self.cfg.predict && !hashes.is_empty())
            .map(|(slot, hashes)| Prediction::new(self.predicted.clone(), slot, hashes));
        (w, uncached, prediction)
    }

    /// Pages predicted now (on any worker).
    pub fn predicted_pages(&self) -> usize {
        self.predicted.read().len()
    }

    /// [`KvAware::pick`] without the metric and the tokens to prefill.
    pub fn decide<'a>(
        &self,
        candidates: &[&'a Arc<Worker>],
        key: Option<&[u8]>,
    ) -> (&'a Arc<Worker>, KvDecision) {
        let (w, d, ..) = self.decide_charged(candidates, key);
        (w, d)
    }

    /// The choice, how it was made, the tokens the chosen worker is expected to compute,
    /// and, when events decided and it sends them, its slot and the prompt's page hashes
    /// at its page size (the scan's own, for its prediction).
    fn decide_charged<'a>(
        &self,
        candidates: &[&'a Arc<Worker>],
        key: Option<&[u8]>,
    ) -> Decided<'a> {
        // A request in a cache namespace (a LoRA adapter, `cache_salt`, `extra_key`) is
        // placed by the fallback tree, which keeps namespaces apart: the index knows pages
        // by their token ids, and a worker's events do not name the namespace a page
        // belongs to in a form a request's fields map to (SGLang's `lora_id` is its own
        // adapter id), so a page of another namespace would look like a hit.
        let namespaced = key.is_some_and(|k| super::namespace::prompt_of(k).len() != k.len());
        let tokens = key.filter(|_| !namespaced).and_then(key_tokens);
        let live = self.live_slots();
        let (Some(tokens), true) = (tokens, live != 0) else {
            return (
                self.fallback.decide(candidates, key).0,
                KvDecision::Fallback,
                0,
                None,
                None,
            );
        };
        let Scan {
            mut cached,
            mut tiers,
            slots,
            mut page_hashes,
        } = self.scan(candidates, &tokens);
        let mixed = cached.iter().any(Option::is_none);
        if cached.iter().all(Option::is_none) {
            return (
                self.fallback.decide(candidates, key).0,
                KvDecision::Fallback,
                0,
                None,
                None,
            );
        }
        let key = key.unwrap_or_default();
        if mixed {
            self.warn_fallback(candidates, &cached);
            let est = self.fallback.estimate(candidates, key);
            for ((c, t), e) in cached.iter_mut().zip(&mut tiers).zip(est) {
                if c.is_none() {
                    let tokens = e * tokens.len() as f64;
                    *c = Some(tokens);
                    t.estimated = tokens as u64;
                }
            }
        }
        let n = tokens.len() as f64;
        let mean = f64::from_bits(self.mean_pages.load(Ordering::Relaxed));
        let mean = if mean == 0.0 { n } else { mean };
        self.mean_pages
            .store((mean * 0.99 + n * 0.01).to_bits(), Ordering::Relaxed);
        let uncached: Vec<f64> = cached
            .iter()
            .map(|c| (n - c.unwrap_or(0.0)).max(0.0))
            .collect();
        let costs: Vec<f64> = candidates
            .iter()
            .zip(&uncached)
            .map(|(w, u)| {
                let backlog = self.cfg.backlog_weight * w.prefill_backlog() as f64;
                self.cfg.overlap_weight * (u + backlog)
                    + self.cfg.load_weight * w.load() as f64 * mean
            })
            .collect();
        let i = choose(&costs, self.cfg.temperature, |i| candidates[i].load());
        let chosen = candidates[i];
        if mixed {
            self.fallback.record(chosen, key);
        }
        let pages = slots[i].and_then(|slot| {
            let ps = self.shared.page_size[slot].load(Ordering::Relaxed);
            Some((slot, page_hashes.remove(&ps)?))
        });
        (
            chosen,
            if mixed {
                KvDecision::Mixed
            } else {
                KvDecision::Events
            },
            uncached[i] as u64,
            pages,
            Some((tokens.len() as u64, tiers[i])),
        )
    }

    fn warn_fallback(&self, candidates: &[&Arc<Worker>], cached: &[Option<f64>]) {
        for (w, c) in candidates.iter().zip(cached) {
            if c.is_none() && self.no_events.lock().insert(w.uid()) {
                tracing::warn!(worker = %w.url().as_str(), "kv_aware: no KV events from this worker (yet); \
                    its cached prefix is estimated by cache_aware");
            }
        }
    }

    /// Subscribes to the events of `workers` not yet followed and drops the subscriptions
    /// of workers no longer among them.
    pub async fn sync(&self, workers: &[Arc<Worker>], client: &HttpClient) {
        let alive: HashSet<u64> = workers.iter().map(|w| w.uid()).collect();
        {
            let mut subs = self.subs.write();
            let gone: Vec<u64> = subs
                .keys()
                .filter(|u| !alive.contains(u))
                .copied()
                .collect();
            for uid in gone {
                if let Some(s) = subs.remove(&uid) {
                    s.stop.cancel();
                    self.shared.live.fetch_and(!(1 << s.slot), Ordering::AcqRel);
                    self.shared.index.write().remove_slot(s.slot);
                    self.predicted.write().remove_slot(s.slot);
                }
            }
        }
        for w in workers {
            if self.subs.read().contains_key(&w.uid()) || !w.is_available() {
                continue;
            }
            let Some(src) = self.source(w, client).await else {
                continue;
            };
            let mut subs = self.subs.write();
            let used: SlotSet = subs.values().fold(0, |m, s| m | 1 << s.slot);
            let Some(slot) = (0..MAX_SLOTS).find(|s| used & (1 << s) == 0) else {
                continue;
            };
            let stop = CancellationToken::new();
            tracing::info!(worker = %w.url().as_str(), endpoint = %src.endpoint, "kv_aware: following KV events");
            let sink = Arc::new(Sink {
                shared: self.shared.clone(),
                slot,
            });
            tokio::spawn(subscribe::run(src, sink, stop.clone()));
            subs.insert(w.uid(), Sub { slot, stop });
        }
    }

    /// Stops every subscription.
    pub fn stop(&self) {
        for s in self.subs.write().drain() {
            s.1.stop.cancel();
        }
    }

    /// Where `w` publishes its events: a data-parallel rank `r` of a worker (`--dp-aware`)
    /// on the worker's endpoints with their ports moved up by `r`, as SGLang binds them.
    async fn source(&self, w: &Worker, client: &HttpClient) -> Option<Source> {
        let base = self.worker_source(w, client).await?;
        let Some(dp) = w.dp_rank() else {
            return Some(base);
        };
        let moved = |e: &str| sglang::kv_events::offset_port(e, dp.rank);
        Some(Source {
            endpoint: moved(&base.endpoint)?,
            replay_endpoint: match base.replay_endpoint.as_deref() {
                Some(r) => Some(moved(r)?),
                None => None,
            },
            topic: base.topic,
        })
    }

    /// Where the worker `w` is an entry of says it publishes (its rank 0).
    async fn worker_source(&self, w: &Worker, client: &HttpClient) -> Option<Source> {
        let host = w.url().authority().host().to_owned();
        if let Some(t) = &self.cfg.events_endpoint {
            return Some(Source {
                endpoint: t.replace("{host}", &host),
                replay_endpoint: None,
                topic: String::new(),
            });
        }
        let uri = w.url().join("/get_server_info").ok()?;
        let (status, body) = client
            .get_small(uri, w.bearer().as_deref(), DISCOVERY_TIMEOUT)
            .await
            .ok()?;
        if !status.is_success() {
            return None;
        }
        let info: serde_json::Value = serde_json::from_slice(&body).ok()?;
        let cfg = info.get("kv_events_config")?.as_str()?;
        let cfg: serde_json::Value = serde_json::from_str(cfg).ok()?;
        if cfg.get("publisher").and_then(|p| p.as_str()) == Some("null") {
            return None;
        }
        let fix = |e: &str| {
            ["*", "0.0.0.0", "[::]"]
                .iter()
                .fold(e.to_owned(), |e, wild| {
                    e.replace(&format!("://{wild}:"), &format!("://{host}:"))
                })
        };
        Some(Source {
            endpoint: fix(cfg.get("endpoint")?.as_str()?),
            replay_endpoint: cfg.get("replay_endpoint").and_then(|r| r.as_str()).map(fix),
            topic: cfg
                .get("topic")
                .and_then(|t| t.as_str())
                .unwrap_or("")
                .to_owned(),
        })
    }
}

impl Drop for KvAware {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The index of the cheapest cost (ties: `load` then the first), or a softmax draw at
/// temperature `t` over the costs scaled by the largest.
pub fn choose(costs: &[f64], t: f64, load: impl Fn(usize) -> usize) -> usize {
    if t <= 0.0 || costs.len() < 2 {
        return (0..costs.len())
            .min_by(|&a, &b| {
                costs[a]
                    .total_cmp(&costs[b])
                    .then_with(|| load(a).cmp(&load(b)))
            })
            .unwrap_or(0);
    }
    let max = costs.iter().copied().fold(f64::MIN_POSITIVE, f64::max);
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let weights: Vec<f64> = costs.iter().map(|c| (-(c - min) / max / t).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut r = rand::random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        r -= w;
        if r <= 0.0 {
            return i;
        }
    }
    costs.len() - 1
}

#[cfg(test)]
mod tests;
