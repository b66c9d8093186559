//! The `cache_aware` policy (sglang-router's default): send a prompt where its prefix was
//! sent before, so the worker's prefix (KV) cache is likely to hold it, unless that would
//! pile requests on one worker.
//!
//! Per model, an approximate radix tree ([`super::tree`]) of the prompt keys
//! ([`crate::proxy::prompt`]) each worker was sent. For a request, among the candidate
//! workers:
//! 1. **Imbalanced** load (busiest minus idlest > `--balance-abs-threshold` and busiest >
//!    idlest x `--balance-rel-threshold`): the least loaded worker (shortest queue).
//! 2. Otherwise the worker holding the longest prefix of the key, if that prefix is more
//!    than `--cache-threshold` of the key (among several, the least loaded).
//! 3. Otherwise the least loaded worker; ties go to the worker whose tree holds the least
//!    text, so new prefixes spread over the workers.
//!
//! The key is then recorded for the chosen worker. A periodic task
//! ([`CacheAware::maintain`]) evicts each worker's least recently used prompts beyond
//! `--max-tree-size` bytes and forgets workers that are gone.
//!
//! Each tree sits behind its own mutex, held for one match and one insert (a ~1 KiB key
//! costs a few microseconds, see `benches/cache_aware.rs`); the map of trees is read-locked.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::tree::{RadixTree, Tenant};
use crate::config::ServeConfig;
use crate::metrics;
use crate::workers::Worker;

/// `cache_aware` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheAwareConfig {
    /// Share of the key a match must exceed to win (0.0-1.0).
    pub cache_threshold: f64,
    /// Absolute load difference that makes the load imbalanced...
    pub balance_abs_threshold: usize,
    /// ... together with this ratio.
    pub balance_rel_threshold: f64,
    /// Bytes of keys each worker's tree keeps at most (checked by [`CacheAware::maintain`]).
    pub max_tree_bytes: usize,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        Self::from(&ServeConfig::default())
    }
}

impl From<&ServeConfig> for CacheAwareConfig {
    fn from(c: &ServeConfig) -> Self {
        Self {
            cache_threshold: c.cache_threshold,
            balance_abs_threshold: c.balance_abs_threshold,
            balance_rel_threshold: c.balance_rel_threshold,
            max_tree_bytes: c.max_tree_size,
        }
    }
}

/// The policy's state: a tree per model.
#[derive(Debug, Default)]
pub struct CacheAware {
    cfg: CacheAwareConfig,
    trees: RwLock<HashMap<String, Arc<Mutex<RadixTree>>>>,
}

pub use crate::outcome::Decision;

impl CacheAware {
    /// A policy with `cfg`.
    pub fn new(cfg: CacheAwareConfig) -> Self {
        Self {
            cfg,
            trees: RwLock::new(HashMap::new()),
        }
    }

    fn tree(&self, model: &str) -> Arc<Mutex<RadixTree>> {
        if let Some(t) = self.trees.read().get(model) {
            return t.clone();
        }
        self.trees
            .write()
            .entry(model.to_string())
            .or_default()
            .clone()
    }

    /// Picks one of `candidates` (not empty) for `key` (see the module doc) and records
    /// the key for it.
    pub fn pick<'a>(&self, candidates: &[&'a Arc<Worker>], key: Option<&[u8]>) -> &'a Arc<Worker> {
        let (w, decision) = self.decide(candidates, key);
        metrics::cache_aware_decision(decision);
        w
    }

    /// [`CacheAware::pick`] without the metric.
    pub fn decide<'a>(
        &self,
        candidates: &[&'a Arc<Worker>],
        key: Option<&[u8]>,
    ) -> (&'a Arc<Worker>, Decision) {
        let loads: Vec<usize> = candidates.iter().map(|w| w.load()).collect();
        let (min, max) = loads
            .iter()
            .fold((usize::MAX, 0), |(lo, hi), &l| (lo.min(l), hi.max(l)));
        let model = candidates[0].model();
        let tree = self.tree(model.as_deref().map_or("", |m| m.as_str()));
        let mut tree = tree.lock();
        let least_loaded = |tree: &RadixTree| {
            let i = (0..candidates.len())
                .min_by_key(|&i| (loads[i], tree.tenant_bytes(candidates[i].uid())))
                .unwrap_or(0);
            candidates[i]
        };
        let imbalanced = max - min > self.cfg.balance_abs_threshold
            && max as f64 > min as f64 * self.cfg.balance_rel_threshold;
        let key = key.filter(|k| !k.is_empty());
        let (chosen, decision) = match key {
            _ if imbalanced => (least_loaded(&tree), Decision::Balance),
            None => (least_loaded(&tree), Decision::NoKey),
            Some(k) => {
                let mut uids: Vec<Tenant> = candidates.iter().map(|w| w.uid()).collect();
                uids.sort_unstable();
                let eligible = |t: Tenant| uids.binary_search(&t).is_ok();
                let m = tree.match_prefix(k, eligible);
                let best = (m.matched as f64 / k.len() as f64 > self.cfg.cache_threshold)
                    .then(|| {
                        tree.tenants_at(&m)
                            .filter_map(|t| candidates.iter().position(|w| w.uid() == t))
                            .min_by_key(|&i| loads[i])
                    })
                    .flatten();
                match best {
                    Some(i) => (candidates[i], Decision::Hit),
                    None => (least_loaded(&tree), Decision::Miss),
                }
            }
        };
        if let Some(k) = key {
            tree.insert(k, chosen.uid());
        }
        (chosen, decision)
    }

    /// For `kv_aware`'s workers without events: the share of `key` (0.0-1.0) each candidate's
    /// tree holds (the workers at the deepest match get it, the others 0), and records `key`
    /// for `chosen` afterwards with [`CacheAware::record`].
    pub fn estimate(&self, candidates: &[&Arc<Worker>], key: &[u8]) -> Vec<f64> {
        let mut out = vec![0.0; candidates.len()];
        if key.is_empty() || candidates.is_empty() {
            return out;
        }
        let model = candidates[0].model();
        let tree = self.tree(model.as_deref().map_or("", |m| m.as_str()));
        let tree = tree.lock();
        let mut uids: Vec<Tenant> = candidates.iter().map(|w| w.uid()).collect();
        uids.sort_unstable();
        let m = tree.match_prefix(key, |t| uids.binary_search(&t).is_ok());
        let share = m.matched as f64 / key.len() as f64;
        for t in tree.tenants_at(&m) {
            if let Some(i) = candidates.iter().position(|w| w.uid() == t) {
                out[i] = share;
            }
        }
        out
    }

    /// Records `key` as sent to `worker`.
    pub fn record(&self, worker: &Worker, key: &[u8]) {
        if key.is_empty() {
            return;
        }
        let model = worker.model();
        let tree = self.tree(model.as_deref().map_or("", |m| m.as_str()));
        tree.lock().insert(key, worker.uid());
    }

    /// Periodic upkeep: forgets workers `alive` rejects, then evicts each worker's least
    /// recently used keys beyond the size limit. Returns the bytes evicted.
    pub fn maintain(&self, alive: impl Fn(Tenant) -> bool) -> usize {
        let trees: Vec<_> = self.trees.read().values().cloned().collect();
        let mut evicted = 0;
        for t in trees {
            let mut t = t.lock();
            t.retain_tenants(&alive);
            evicted += t.evict(self.cfg.max_tree_bytes);
        }
        evicted
    }

    /// Bytes of keys held for `worker` (its model's tree).
    pub fn held_bytes(&self, worker: &Worker) -> usize {
        let model = worker.model();
        let trees = self.trees.read();
        trees
            .get(model.as_deref().map_or("", |m| m.as_str()))
            .map_or(0, |t| t.lock().tenant_bytes(worker.uid()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::{LoadGuard, testing::ready_workers};

    fn workers(n: usize) -> Vec<Arc<Worker>> {
        ready_workers(n).into_iter().collect()
    }

    fn cfg() -> CacheAwareConfig {
        CacheAwareConfig {
            cache_threshold: 0.5,
            balance_abs_threshold: 4,
            balance_rel_threshold: 2.0,
            max_tree_bytes: 1 << 20,
        }
    }

    #[test]
    fn same_prefix_same_worker_and_new_prefixes_spread() {
        let ws = workers(3);
        let refs: Vec<&Arc<Worker>> = ws.iter().collect();
        let p = CacheAware::new(cfg());
        let sys = "You are a helpful assistant. ".repeat(10);
        let (first, d) = p.decide(&refs, Some(format!("{sys}question one").as_bytes()));
        assert_eq!(d, Decision::Miss);
        for q in ["question two", "another thing", "x"] {
            let (w, d) = p.decide(&refs, Some(format!("{sys}{q}").as_bytes()));
            assert_eq!(d, Decision::Hit);
            assert!(
                Arc::ptr_eq(w, first),
                "the shared prefix sticks to one worker"
            );
        }
        // Unrelated prompts go to the workers holding the least text: all three get some.
        let mut owners = std::collections::HashSet::new();
        owners.insert(first.uid());
        for i in 0..2 {
            let (w, d) = p.decide(
                &refs,
                Some(format!("unrelated prompt {i} {}", "z".repeat(50)).as_bytes()),
            );
            assert_eq!(d, Decision::Miss);
            owners.insert(w.uid());
        }
        assert_eq!(owners.len(), 3);
        assert!(p.held_bytes(first) >= sys.len());
    }

    #[test]
    fn imbalance_wins_over_the_cache_and_no_key_is_least_loaded() {
        let ws = workers(2);
        let refs: Vec<&Arc<Worker>> = ws.iter().collect();
        let p = CacheAware::new(cfg());
        let (w, _) = p.decide(&refs, Some(b"shared prefix"));
        let busy: Vec<LoadGuard> = (0..10).map(|_| LoadGuard::new(w.clone())).collect();
        let (w2, d) = p.decide(&refs, Some(b"shared prefix"));
        assert_eq!(d, Decision::Balance);
        assert!(!Arc::ptr_eq(w, w2));
        drop(busy);
        let _one = LoadGuard::new(ws[0].clone());
        let (w3, d) = p.decide(&refs, None);
        assert_eq!(d, Decision::NoKey);
        assert!(Arc::ptr_eq(w3, &ws[1]));
    }

    #[test]
    fn only_candidates_are_matched_and_gone_workers_are_forgotten() {
        let ws = workers(2);
        let p = CacheAware::new(cfg());
        let both: Vec<&Arc<Worker>> = ws.iter().collect();
        let (w, _) = p.decide(&both, Some(b"the prompt"));
        // The owner is not a candidate (excluded after a failure): the other one, a miss.
        let other: Vec<&Arc<Worker>> = ws.iter().filter(|x| !Arc::ptr_eq(x, w)).collect();
        let (w2, d) = p.decide(&other, Some(b"the prompt"));
        assert_eq!(d, Decision::Miss);
        assert!(!Arc::ptr_eq(w, w2));
        let gone = w.uid();
        p.maintain(|t| t != gone);
        assert_eq!(p.held_bytes(w), 0);
        assert!(p.held_bytes(w2) > 0);
    }

    #[test]
    fn concurrent_picks_keep_the_tree_consistent() {
        let ws = workers(4);
        let p = Arc::new(CacheAware::new(CacheAwareConfig {
            max_tree_bytes: 2_000,
            ..cfg()
        }));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (p, ws) = (p.clone(), ws.clone());
                std::thread::spawn(move || {
                    let refs: Vec<&Arc<Worker>> = ws.iter().collect();
                    for i in 0..500 {
                        let key = format!("tenant prefix {} / request {t}-{i}", i % 7);
                        let (w, _) = p.decide(&refs, Some(key.as_bytes()));
                        let _g = LoadGuard::new(w.clone());
                        if i % 100 == 0 {
                            p.maintain(|_| true);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        p.maintain(|_| true);
        let tree = p.tree("m");
        let tree = tree.lock();
        tree.check();
        for w in &ws {
            assert!(tree.tenant_bytes(w.uid()) <= 2_000);
            assert_eq!(w.load(), 0);
        }
    }
}
