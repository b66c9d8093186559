//! Selection: which worker gets a request.
//!
//! Candidates are the available (ready, not draining) workers of one [`WorkerType`] that
//! serve the requested model and whose circuit breaker lets a request through, minus any
//! that already failed this request. A [`Policy`] picks one of them; the simple policies do
//! so without allocating (count the candidates, take the n-th). The PD router uses the same
//! function twice (prefill, decode) with its own policies.
//!
//! - [`affinity`]: routing keys and direct targets from the request's headers, and the
//!   `consistent_hashing` policy's ring.
//! - [`namespace`]: cache namespaces (LoRA adapter, `cache_salt`, `extra_key`) scoping
//!   the prompt keys, so no two namespaces share a prefix.
//! - [`sticky`]: the `manual` policy's table of sticky sessions (routing key -> worker).
//! - [`turns`]: the `round_robin` policy's kept list of candidates.
//! - [`cache_aware`]: the `cache_aware` policy (prefix affinity with load balancing).
//! - [`tree`]: its approximate radix tree of prompt keys.
//! - [`kv_aware`]: the `kv_aware` policy (the workers' real caches, from their KV events).
//! - [`least_load`]: the `least_load` policy (the workers' own reports of their queues).
//! - [`bucket`]: the `bucket` policy (prompt-length ranges, one per worker).
//! - [`responses`]: where each Responses API response lives.

pub mod affinity;
pub mod bucket;
pub mod cache_aware;
pub mod kv_aware;
pub mod least_load;
pub mod namespace;
pub mod responses;
pub mod sticky;
pub mod tree;
pub mod turns;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use openapi::workers::{WorkerStatus, WorkerType};

use crate::config::PolicyKind;
use crate::workers::{LoadGuard, Worker, registry::WorkerSet};
use affinity::{Affinity, HashRing, RoutingKey};
use bucket::Bucket;
use cache_aware::{CacheAware, CacheAwareConfig};
use kv_aware::{KvAware, KvAwareConfig};
use least_load::LeastLoad;
use sglang::tokenizer::Tokenizer;
use sticky::{Sticky, StickyConfig};

/// Random draws from the whole worker set before `random`, `power_of_two` and
/// `consistent_hashing`'s fallback count the candidates instead (`Policy::pick_sampled`):
/// with half the set unable to take a request, 8 draws all miss one time in 256.
const SAMPLE_DRAWS: usize = 8;

/// A load-balancing policy with its state (the round-robin cursor, the prefix trees).
#[derive(Debug)]
pub struct Policy {
    kind: PolicyKind,
    cursor: AtomicUsize,
    cache: Option<CacheAware>,
    kv: Option<KvAware>,
    /// `consistent_hashing`'s ring.
    ring: Option<HashRing>,
    /// `manual`'s sticky sessions.
    sticky: Option<Sticky>,
    /// `round_robin`'s kept list of candidates.
    turns: turns::Turns,
    /// `least_load`'s scoring.
    least: Option<LeastLoad>,
    /// `bucket`'s ranges.
    bucket: Option<Bucket>,
    /// The headers of the routing key and the direct target.
    routing: RoutingKey,
    /// `kv_aware`'s tokenizer for text and chat prompts.
    tokenizer: Option<Arc<Tokenizer>>,
}

/// Why no worker was selected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoWorker {
    /// No registered worker of this type serves the model.
    UnknownModel(String),
    /// Workers serve it (or any model was asked) but none is available.
    NoneReady,
    /// Ready workers serve it, but every one's circuit breaker is open.
    CircuitOpen,
    /// The request names a worker (`--target-worker-header`) that does not exist or
    /// cannot take it (not ready, another model, breaker open, or it failed this request).
    TargetUnavailable(String),
}

/// A worker chosen by [`Policy::pick`], with what the policy expects of it.
#[derive(Debug)]
pub struct Pick {
    /// The worker.
    pub worker: Arc<Worker>,
    /// Prompt tokens the worker is expected to compute for the request (`kv_aware`: the
    /// part of the prompt it does not hold; 0 where the policy does not know), for its
    /// [`crate::workers::LoadGuard::charge_prefill`].
    pub prefill_tokens: u64,
    /// `kv_aware`: the prompt's pages predicted on the worker, until the request ends
    /// (keep it on the request's load guard).
    pub prediction: Option<kv_aware::predict::Prediction>,
}

impl Pick {
    /// Admits the request on the worker (`None` when its circuit refuses it) with what
    /// the policy expects: its tokens to prefill charged to the worker's backlog and its
    /// predicted pages kept, both until the guard's end (or its `prefill_done`).
    pub fn admit(self) -> Option<LoadGuard> {
        let mut guard = LoadGuard::admit(self.worker)?;
        guard.charge_prefill(self.prefill_tokens);
        if let Some(p) = self.prediction {
            guard.keep(Box::new(p));
        }
        Some(guard)
    }
}

/// What a request asks of selection.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    /// Worker role.
    pub worker_type: WorkerType,
    /// The request's `model`, if any.
    pub model: Option<&'a str>,
    /// Workers that already failed this request (retries skip them).
    pub exclude: &'a [Arc<Worker>],
    /// The prompt key ([`crate::proxy::prompt`]), for policies that route by it.
    pub key: Option<&'a [u8]>,
    /// The routing key and direct target the request's headers name
    /// ([`Policy::affinity`]).
    pub affinity: Affinity<'a>,
}

impl<'a> Want<'a> {
    /// Every check but the circuit breaker's.
    #[inline]
    fn fits(&self, w: &Arc<Worker>) -> bool {
        w.worker_type() == self.worker_type
            && w.is_available()
            && w.serves(self.model)
            && !self.exclude.iter().any(|x| Arc::ptr_eq(x, w))
    }

    #[inline]
    fn admits(&self, w: &Arc<Worker>) -> bool {
        self.fits(w) && w.breaker().admits()
    }
}

impl Policy {
    /// A fresh policy (`cache_aware` with sglang-router's default settings).
    pub fn new(kind: PolicyKind) -> Self {
        Self::with_cache_config(kind, CacheAwareConfig::default())
    }

    /// A fresh policy; `cache` configures `cache_aware` (ignored by the others).
    pub fn with_cache_config(kind: PolicyKind, cache: CacheAwareConfig) -> Self {
        Self::with_configs(
            kind,
            KvAwareConfig {
                fallback: cache,
                ..KvAwareConfig::default()
            },
        )
    }

    /// A fresh policy; `kv` configures `kv_aware` and (its fallback) `cache_aware`.
    pub fn with_configs(kind: PolicyKind, kv: KvAwareConfig) -> Self {
        let balance = (
            kv.fallback.balance_abs_threshold,
            kv.fallback.balance_rel_threshold,
        );
        Self {
            kind,
            cursor: AtomicUsize::new(0),
            cache: matches!(kind, PolicyKind::CacheAware | PolicyKind::Manual)
                .then(|| CacheAware::new(kv.fallback.clone())),
            kv: (kind == PolicyKind::KvAware).then(|| KvAware::new(kv)),
            ring: (kind == PolicyKind::ConsistentHashing).then(HashRing::default),
            sticky: (kind == PolicyKind::Manual).then(|| Sticky::new(StickyConfig::default())),
            turns: turns::Turns::default(),
            least: (kind == PolicyKind::LeastLoad).then(LeastLoad::default),
            bucket: (kind == PolicyKind::Bucket).then(|| Bucket::new(balance.0, balance.1)),
            routing: RoutingKey::default(),
            tokenizer: None,
        }
    }

    /// This policy with `manual`'s table sized by `cfg` (ignored by the others).
    pub fn with_sticky(mut self, cfg: StickyConfig) -> Self {
        if self.sticky.is_some() {
            self.sticky = Some(Sticky::new(cfg));
        }
        self
    }

    /// This policy scoring `least_load` with `least` (ignored by the others).
    pub fn with_least_load(mut self, least: LeastLoad) -> Self {
        if self.least.is_some() {
            self.least = Some(least);
        }
        self
    }

    /// Whether this policy reads the workers' load reports (the poll then runs).
    pub fn needs_loads(&self) -> bool {
        self.least.is_some()
    }

    /// `manual`'s table of sticky sessions.
    pub fn sticky(&self) -> Option<&Sticky> {
        self.sticky.as_ref()
    }

    /// This policy reading the routing key and the direct target from `routing`'s headers.
    pub fn with_routing(mut self, routing: RoutingKey) -> Self {
        self.routing = routing;
        self
    }

    /// What a request's `headers` ask of selection (its [`Want::affinity`]).
    #[inline]
    pub fn affinity<'h>(&self, headers: &'h http::HeaderMap) -> Affinity<'h> {
        self.routing.read(headers)
    }

    /// This policy with `tokenizer` for text and chat prompts (kept only by `kv_aware`,
    /// which matches token ids against the workers' KV events).
    pub fn with_tokenizer(mut self, tokenizer: Option<Arc<Tokenizer>>) -> Self {
        if self.kv.is_some() {
            self.tokenizer = tokenizer;
        }
        self
    }

    /// The tokenizer its prompt keys go through ([`Policy::with_tokenizer`]).
    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.tokenizer.as_ref()
    }

    /// Which policy this is.
    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// Whether this policy routes by the prompt (the caller then passes [`Want::key`]).
    #[inline]
    pub fn needs_key(&self) -> bool {
        self.cache.is_some() || self.kv.is_some() || self.bucket.is_some() || self.least.is_some()
    }

    /// The `cache_aware` state (also `kv_aware`'s fallback), for this policy's upkeep.
    pub fn cache_aware(&self) -> Option<&CacheAware> {
        self.cache
            .as_ref()
            .or_else(|| self.kv.as_ref().map(KvAware::fallback))
    }

    /// The `kv_aware` state, for its subscriptions.
    pub fn kv_aware(&self) -> Option<&KvAware> {
        self.kv.as_ref()
    }

    /// Picks a worker from `set` for `want`.
    pub fn select(&self, set: &WorkerSet, want: &Want<'_>) -> Result<Arc<Worker>, NoWorker> {
        self.pick(set, want).map(|p| p.worker)
    }

    /// Picks a worker from `set` for `want`, with the prompt tokens it is expected to
    /// compute.
    pub fn pick(&self, set: &WorkerSet, want: &Want<'_>) -> Result<Pick, NoWorker> {
        if let Some(target) = want.affinity.target
            && let Some(pick) = Self::pick_target(set, want, target)
        {
            return pick;
        }
        let mut turn = None;
        if let Some(pick) = self.pick_sampled(set, want, &mut turn) {
            return Ok(Pick {
                worker: pick.clone(),
                prefill_tokens: 0,
                prediction: None,
            });
        }
        let candidates = || set.iter().filter(|w| want.admits(w));
        let n = candidates().count();
        let mut prefill_tokens = 0;
        let mut prediction = None;
        let pick = match n {
            0 => None,
            1 if !self.needs_key() => candidates().next(),
            _ => match self.kind {
                PolicyKind::Random => candidates().nth(rand::random_range(0..n)),
                PolicyKind::RoundRobin => {
                    let turn = turn.unwrap_or_else(|| self.cursor.fetch_add(1, Ordering::Relaxed));
                    candidates().nth(turn % n)
                }
                PolicyKind::PowerOfTwo => Self::power_of_two(n, candidates),
                PolicyKind::CacheAware => match &self.cache {
                    Some(c) => {
                        let all: Vec<&Arc<Worker>> = candidates().collect();
                        (!all.is_empty()).then(|| c.pick(&all, want.key))
                    }
                    None => candidates().next(),
                },
                PolicyKind::ConsistentHashing => match (&self.ring, want.affinity.key) {
                    (Some(ring), Some(key)) => ring.pick(set, key, |w| want.admits(w)),
                    _ => Self::power_of_two(n, candidates),
                },
                PolicyKind::Manual => match &self.cache {
                    Some(c) => {
                        let all: Vec<&Arc<Worker>> = candidates().collect();
                        (!all.is_empty())
                            .then(|| Self::pick_sticky(self.sticky.as_ref(), c, &all, want))
                    }
                    None => candidates().next(),
                },
                PolicyKind::Bucket => match &self.bucket {
                    Some(b) => {
                        let all: Vec<&Arc<Worker>> = candidates().collect();
                        (!all.is_empty()).then(|| b.pick(&all, want.key.map_or(0, <[u8]>::len)))
                    }
                    None => candidates().next(),
                },
                PolicyKind::LeastLoad => match &self.least {
                    Some(l) => {
                        let all: Vec<&Arc<Worker>> = candidates().collect();
                        prefill_tokens = least_load::prompt_tokens(want.key);
                        (!all.is_empty()).then(|| l.pick(&all))
                    }
                    None => candidates().next(),
                },
                PolicyKind::KvAware => match &self.kv {
                    Some(k) => {
                        let all: Vec<&Arc<Worker>> = candidates().collect();
                        (!all.is_empty()).then(|| {
                            let (w, tokens, predicted) = k.pick(&all, want.key);
                            prefill_tokens = tokens;
                            prediction = predicted;
                            w
                        })
                    }
                    None => candidates().next(),
                },
            },
        };
        // The set can change between counting and picking; fall back to any candidate.
        if let Some(w) = pick.or_else(|| candidates().next()) {
            return Ok(Pick {
                worker: w.clone(),
                prefill_tokens,
                prediction,
            });
        }
        if set.iter().any(|w| want.fits(w)) {
            return Err(NoWorker::CircuitOpen);
        }
        // 503 if there is no worker of this type at all, or one is known to serve the
        // model, or might (still pending, model not yet discovered); 404 otherwise.
        let might_serve = |m: &str| {
            let mut of_type = set
                .iter()
                .filter(|w| w.worker_type() == want.worker_type)
                .peekable();
            of_type.peek().is_none()
                || of_type.any(|w| match w.model() {
                    Some(have) => have.as_str() == m,
                    None => w.status() == WorkerStatus::Pending,
                })
        };
        match want.model {
            Some(m) if !might_serve(m) => Err(NoWorker::UnknownModel(m.to_string())),
            _ => Err(NoWorker::NoneReady),
        }
    }

    /// The policies that need no view of every candidate, without counting them: at
    /// 10,000 workers a count is a pass over every worker's state, hundreds of µs a
    /// request.
    /// - `random` and `power_of_two` draw from the whole set until they meet candidates
    ///   (a draw kept only when it is a candidate is uniform over the candidates, as the
    ///   exact path's is).
    /// - `round_robin` takes its turn from the candidates' positions it keeps
    ///   ([`turns`]); `turn` says which turn, for the exact path when it has none.
    /// - `consistent_hashing` asks its ring.
    ///
    /// `None`: take the exact path (no candidate met in `SAMPLE_DRAWS` draws, or another
    /// policy).
    fn pick_sampled<'s>(
        &self,
        set: &'s WorkerSet,
        want: &Want<'_>,
        turn: &mut Option<usize>,
    ) -> Option<&'s Arc<Worker>> {
        let draw = |not: Option<usize>| {
            (0..SAMPLE_DRAWS).find_map(|_| {
                let i = rand::random_range(0..set.len());
                (Some(i) != not && want.admits(&set[i])).then_some(i)
            })
        };
        match self.kind {
            _ if set.is_empty() => None,
            PolicyKind::Random => draw(None).map(|i| &set[i]),
            PolicyKind::RoundRobin => {
                let t = self.cursor.fetch_add(1, Ordering::Relaxed);
                *turn = Some(t);
                self.turns.pick(set, want, t)
            }
            PolicyKind::PowerOfTwo => Self::two_drawn(set, draw),
            PolicyKind::ConsistentHashing => match (&self.ring, want.affinity.key) {
                (Some(ring), Some(key)) => ring.pick(set, key, |w| want.admits(w)),
                _ => Self::two_drawn(set, draw),
            },
            _ => None,
        }
    }

    /// Of two distinct candidates drawn, the one with fewer requests in flight (a set of
    /// one candidate goes to the exact path, which takes it).
    fn two_drawn(
        set: &WorkerSet,
        draw: impl Fn(Option<usize>) -> Option<usize>,
    ) -> Option<&Arc<Worker>> {
        let a = draw(None)?;
        let b = draw(Some(a))?;
        let (x, y) = (&set[a], &set[b]);
        Some(if y.load() < x.load() { y } else { x })
    }

    /// `manual`: the routing key's seat among `all` (not empty), else `cache_aware`'s
    /// choice, which becomes the key's seat; the prompt is recorded for the worker either way.
    fn pick_sticky<'s>(
        sticky: Option<&Sticky>,
        cache: &CacheAware,
        all: &[&'s Arc<Worker>],
        want: &Want<'_>,
    ) -> &'s Arc<Worker> {
        let (Some(sticky), Some(key)) = (sticky, want.affinity.key) else {
            crate::metrics::sticky_decision(crate::outcome::StickyDecision::NoKey);
            return cache.pick(all, want.key);
        };
        let (i, decision) = sticky.pick(key, all.iter().map(|w| w.uid()), || {
            let w = cache.pick(all, want.key);
            let i = all.iter().position(|x| Arc::ptr_eq(x, w)).unwrap_or(0);
            (i, w.uid())
        });
        crate::metrics::sticky_decision(decision);
        if decision == crate::outcome::StickyDecision::Hit
            && let Some(k) = want.key
        {
            cache.record(all[i], k);
        }
        all[i]
    }

    /// Two of the `n` candidates at random, the one with fewer requests in flight.
    fn power_of_two<'s, I>(n: usize, candidates: impl Fn() -> I) -> Option<&'s Arc<Worker>>
    where
        I: Iterator<Item = &'s Arc<Worker>>,
    {
        if n < 2 {
            return candidates().next();
        }
        let a = rand::random_range(0..n);
        let b = (a + 1 + rand::random_range(0..n - 1)) % n;
        match (candidates().nth(a), candidates().nth(b)) {
            (Some(x), Some(y)) => Some(if y.load() < x.load() { y } else { x }),
            (x, y) => x.or(y),
        }
    }

    /// The worker a request targets by name: `None` where the name is another role's
    /// worker (PD: the target is the other side's, this side is picked as usual), else
    /// that worker if it can take the request, or why not. A URL names every
    /// data-parallel rank of its worker (`--dp-aware`): the least loaded that can take
    /// the request is picked; `<url>@<rank>` names one.
    fn pick_target(
        set: &WorkerSet,
        want: &Want<'_>,
        target: &str,
    ) -> Option<Result<Pick, NoWorker>> {
        let named = |w: &&Arc<Worker>| affinity::is_target(w, target);
        let mut of_role = set
            .iter()
            .filter(named)
            .filter(|w| w.worker_type() == want.worker_type)
            .peekable();
        if of_role.peek().is_none() {
            return if set.iter().any(|w| named(&w)) {
                None
            } else {
                Some(Err(NoWorker::TargetUnavailable(target.to_owned())))
            };
        }
        match of_role.filter(|w| want.admits(w)).min_by_key(|w| w.load()) {
            Some(w) => Some(Ok(Pick {
                worker: w.clone(),
                prefill_tokens: 0,
                prediction: None,
            })),
            None => Some(Err(NoWorker::TargetUnavailable(target.to_owned()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::{
        LoadGuard,
        testing::{ready_workers, spec},
    };
    use tokio_util::sync::CancellationToken;

    fn set(n: usize) -> WorkerSet {
        ready_workers(n).into_iter().collect()
    }

    fn want(model: Option<&str>) -> Want<'_> {
        Want {
            worker_type: WorkerType::Regular,
            model,
            exclude: &[],
            key: None,
            affinity: Affinity::default(),
        }
    }

    #[test]
    fn round_robin_cycles_over_available_workers() {
        let s = set(3);
        s[1].set_status(WorkerStatus::NotReady);
        let p = Policy::new(PolicyKind::RoundRobin);
        let picks: Vec<String> = (0..4)
            .map(|_| p.select(&s, &want(Some("m"))).unwrap().id().to_string())
            .collect();
        assert_eq!(picks, vec![s[0].id(), s[2].id(), s[0].id(), s[2].id()]);
    }

    #[test]
    fn drawn_picks_take_only_candidates_and_spread_evenly_over_them() {
        // Two candidates among eight workers: most draws miss, and some picks go the
        // exact way after eight misses in a row.
        let s = set(8);
        for w in &s[1..7] {
            w.set_status(WorkerStatus::NotReady);
        }
        for kind in [
            PolicyKind::Random,
            PolicyKind::PowerOfTwo,
            PolicyKind::ConsistentHashing,
        ] {
            let p = Policy::new(kind);
            let mut first = 0;
            for _ in 0..2_000 {
                let w = p.select(&s, &want(Some("m"))).unwrap();
                assert!(Arc::ptr_eq(&w, &s[0]) || Arc::ptr_eq(&w, &s[7]), "{kind:?}");
                first += usize::from(Arc::ptr_eq(&w, &s[0]));
            }
            assert!((800..=1_200).contains(&first), "{kind:?}: {first} of 2000");
        }
        // One candidate: power_of_two's second draw cannot be met, the exact way takes it.
        s[7].set_status(WorkerStatus::NotReady);
        let p = Policy::new(PolicyKind::PowerOfTwo);
        assert!(Arc::ptr_eq(&p.select(&s, &want(Some("m"))).unwrap(), &s[0]));
    }

    #[test]
    fn power_of_two_prefers_the_less_loaded() {
        let s = set(2);
        let _busy: Vec<LoadGuard> = (0..5).map(|_| LoadGuard::new(s[0].clone())).collect();
        let p = Policy::new(PolicyKind::PowerOfTwo);
        for _ in 0..20 {
            assert!(Arc::ptr_eq(&p.select(&s, &want(None)).unwrap(), &s[1]));
        }
    }

    #[test]
    fn random_spreads_and_exclude_is_honoured() {
        let s = set(3);
        let p = Policy::new(PolicyKind::Random);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            seen.insert(p.select(&s, &want(None)).unwrap().id().to_string());
        }
        assert_eq!(seen.len(), 3);
        let exclude = [s[0].clone(), s[1].clone()];
        let w = Want {
            exclude: &exclude,
            ..want(None)
        };
        for _ in 0..20 {
            assert!(Arc::ptr_eq(&p.select(&s, &w).unwrap(), &s[2]));
        }
    }

    #[test]
    fn unknown_model_versus_none_ready() {
        let s = set(2);
        let p = Policy::new(PolicyKind::RoundRobin);
        assert_eq!(
            p.select(&s, &want(Some("other"))).unwrap_err(),
            NoWorker::UnknownModel("other".into())
        );
        for w in &s {
            w.set_status(WorkerStatus::NotReady);
        }
        assert_eq!(
            p.select(&s, &want(Some("m"))).unwrap_err(),
            NoWorker::NoneReady
        );
        assert_eq!(
            p.select(&WorkerSet::new(), &want(None)).unwrap_err(),
            NoWorker::NoneReady
        );
        let prefill = Want {
            worker_type: WorkerType::Prefill,
            ..want(Some("m"))
        };
        assert_eq!(
            p.select(&s, &prefill).unwrap_err(),
            NoWorker::NoneReady,
            "no prefill worker at all"
        );
        assert_eq!(
            p.select(&WorkerSet::new(), &want(Some("m"))).unwrap_err(),
            NoWorker::NoneReady
        );
        // A worker whose model is unknown: pending might serve it (503), not_ready does not (404).
        let unknown = Arc::new(Worker::new(
            spec("http://u:1"),
            None,
            CancellationToken::new(),
        ));
        let s2: WorkerSet = vec![unknown.clone()];
        assert_eq!(
            p.select(&s2, &want(Some("x"))).unwrap_err(),
            NoWorker::NoneReady
        );
        unknown.set_status(WorkerStatus::NotReady);
        assert_eq!(
            p.select(&s2, &want(Some("x"))).unwrap_err(),
            NoWorker::UnknownModel("x".into())
        );
        unknown.set_status(WorkerStatus::Ready);
        assert!(
            p.select(&s2, &want(Some("x"))).is_ok(),
            "an available worker of unknown model serves any"
        );
    }

    #[test]
    fn consistent_hashing_keeps_a_key_on_one_worker_until_it_cannot_take_it() {
        let s = set(4);
        let p = Policy::new(PolicyKind::ConsistentHashing);
        let keyed = |k: &'static [u8]| Want {
            affinity: Affinity {
                key: Some(k),
                target: None,
            },
            ..want(Some("m"))
        };
        let home = p.select(&s, &keyed(b"conversation-1")).unwrap();
        for _ in 0..20 {
            assert!(Arc::ptr_eq(
                &p.select(&s, &keyed(b"conversation-1")).unwrap(),
                &home
            ));
        }
        // Its worker not ready: the next on the ring; ready again: back home.
        home.set_status(WorkerStatus::NotReady);
        let next = p.select(&s, &keyed(b"conversation-1")).unwrap();
        assert!(!Arc::ptr_eq(&next, &home));
        home.set_status(WorkerStatus::Ready);
        assert!(Arc::ptr_eq(
            &p.select(&s, &keyed(b"conversation-1")).unwrap(),
            &home
        ));
        // Keys spread; requests without one are spread too (power of two).
        let mut seen = std::collections::HashSet::new();
        for k in 0..64u32 {
            let key = format!("k{k}").into_bytes();
            let w = Want {
                affinity: Affinity {
                    key: Some(&key),
                    target: None,
                },
                ..want(Some("m"))
            };
            seen.insert(p.select(&s, &w).unwrap().uid());
        }
        assert_eq!(seen.len(), 4);
        let _busy: Vec<LoadGuard> = (0..5).map(|_| LoadGuard::new(s[0].clone())).collect();
        for _ in 0..20 {
            assert!(!Arc::ptr_eq(
                &p.select(&s, &want(Some("m"))).unwrap(),
                &s[0]
            ));
        }
    }

    #[test]
    fn a_target_worker_is_taken_with_any_policy_or_refused_by_name() {
        let s = set(3);
        let p = Policy::new(PolicyKind::RoundRobin);
        let id = s[2].id().to_owned();
        let to = |t: &'static str| Want {
            affinity: Affinity {
                key: None,
                target: Some(t),
            },
            ..want(Some("m"))
        };
        let by_id = Want {
            affinity: Affinity {
                key: None,
                target: Some(&id),
            },
            ..want(Some("m"))
        };
        for _ in 0..5 {
            assert!(Arc::ptr_eq(&p.select(&s, &by_id).unwrap(), &s[2]));
            assert!(Arc::ptr_eq(
                &p.select(&s, &to("http://w1:1")).unwrap(),
                &s[1]
            ));
        }
        assert_eq!(
            p.select(&s, &to("http://nowhere:1")).unwrap_err(),
            NoWorker::TargetUnavailable("http://nowhere:1".into())
        );
        s[1].set_status(WorkerStatus::NotReady);
        assert_eq!(
            p.select(&s, &to("http://w1:1")).unwrap_err(),
            NoWorker::TargetUnavailable("http://w1:1".into()),
            "never another worker in its place"
        );
        // PD: a target of the other role leaves this side to the policy.
        let prefill = Want {
            worker_type: WorkerType::Prefill,
            ..to("http://w0:1")
        };
        assert_eq!(p.select(&s, &prefill).unwrap_err(), NoWorker::NoneReady);
    }

    #[test]
    fn manual_seats_a_key_where_cache_aware_sends_it_and_keeps_it_there() {
        let s = set(3);
        let p = Policy::new(PolicyKind::Manual);
        assert!(p.needs_key(), "its first pick is cache_aware's");
        let prompt = b"a long shared system prompt ".repeat(20);
        let req = |k: &'static [u8], prompt: &'static [u8]| Want {
            key: Some(prompt),
            affinity: Affinity {
                key: Some(k),
                target: None,
            },
            ..want(Some("m"))
        };
        let prompt: &'static [u8] = Box::leak(prompt.into_boxed_slice());
        // The prompt was sent to s[1] before: cache_aware seats a new key there.
        p.cache_aware().unwrap().record(&s[1], prompt);
        let first = p.select(&s, &req(b"user-1", prompt)).unwrap();
        assert!(Arc::ptr_eq(&first, &s[1]));
        // Its next requests stay, whatever their prompt and the load.
        let _busy: Vec<LoadGuard> = (0..3).map(|_| LoadGuard::new(s[1].clone())).collect();
        for other in [&b"something else entirely"[..], b"x"] {
            assert!(Arc::ptr_eq(
                &p.select(&s, &req(b"user-1", other)).unwrap(),
                &s[1]
            ));
        }
        // Its worker leaves: reassigned once, then sticky again.
        s[1].set_status(WorkerStatus::NotReady);
        let moved = p.select(&s, &req(b"user-1", prompt)).unwrap();
        assert!(!Arc::ptr_eq(&moved, &s[1]));
        s[1].set_status(WorkerStatus::Ready);
        for _ in 0..5 {
            assert!(Arc::ptr_eq(
                &p.select(&s, &req(b"user-1", prompt)).unwrap(),
                &moved
            ));
        }
        assert_eq!(p.sticky().unwrap().len(), 1);
    }
}
