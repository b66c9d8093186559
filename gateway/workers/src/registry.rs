//! The registry: the current set of workers as an immutable snapshot swapped atomically on
//! every change. The request path loads the snapshot (no lock) and reads worker atomics;
//! only registration and removal take the writer lock.

use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};
use parking_lot::Mutex;

use openapi::workers::WorkerType;

use super::Worker;

/// The set of workers.
pub type WorkerSet = Vec<Arc<Worker>>;

/// Registering a worker whose URL is taken.
#[derive(Debug, Clone, thiserror::Error)]
#[error("worker {url} is already registered (id {id})")]
pub struct Duplicate {
    /// The URL.
    pub url: String,
    /// The id of the worker that has it.
    pub id: String,
}

/// The current set of workers (see the module doc).
#[derive(Debug, Default)]
pub struct Registry {
    set: ArcSwap<WorkerSet>,
    write: Mutex<()>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current snapshot (cheap; do not hold it across long awaits).
    #[inline]
    pub fn snapshot(&self) -> Guard<Arc<WorkerSet>> {
        self.set.load()
    }

    /// The current snapshot as an owned `Arc`.
    pub fn list(&self) -> Arc<WorkerSet> {
        self.set.load_full()
    }

    /// Adds a worker unless its URL is registered already.
    pub fn insert(&self, worker: Arc<Worker>) -> Result<(), Duplicate> {
        let _w = self.write.lock();
        let cur = self.set.load();
        if let Some(other) = cur.iter().find(|w| w.url() == worker.url()) {
            return Err(Duplicate {
                url: other.url().as_str().to_string(),
                id: other.id().to_string(),
            });
        }
        let mut next = WorkerSet::with_capacity(cur.len() + 1);
        next.extend(cur.iter().cloned());
        next.push(worker);
        self.set.store(Arc::new(next));
        Ok(())
    }

    /// Adds another data-parallel rank of a registered worker (`--dp-aware`) unless that
    /// rank of that URL is registered already; `false` when it was.
    pub fn insert_rank(&self, worker: Arc<Worker>) -> bool {
        let _w = self.write.lock();
        let cur = self.set.load();
        if cur
            .iter()
            .any(|w| w.url() == worker.url() && w.dp_rank() == worker.dp_rank())
        {
            return false;
        }
        let mut next = WorkerSet::with_capacity(cur.len() + 1);
        next.extend(cur.iter().cloned());
        next.push(worker);
        self.set.store(Arc::new(next));
        true
    }

    /// Every registered entry with `url` (a worker's data-parallel ranks; one entry
    /// without `--dp-aware`).
    pub fn ranks_of(&self, url: &super::WorkerUrl) -> Vec<Arc<Worker>> {
        self.set
            .load()
            .iter()
            .filter(|w| w.url() == url)
            .cloned()
            .collect()
    }

    /// One entry per worker URL, the first registered of each (`--dp-aware` lists a
    /// worker once per rank): what the routes that ask every worker once go to.
    pub fn one_per_url(&self) -> Vec<Arc<Worker>> {
        self.one_per_url_where(|_| true)
    }

    /// One entry per worker URL among the entries `keep` takes, the first registered of
    /// each (a worker whose first rank is not ready is still found through another).
    pub fn one_per_url_where(&self, keep: impl Fn(&Worker) -> bool) -> Vec<Arc<Worker>> {
        let snap = self.set.load();
        let mut seen = std::collections::HashSet::with_capacity(snap.len());
        snap.iter()
            .filter(|w| keep(w) && seen.insert(w.url().as_str()))
            .cloned()
            .collect()
    }

    /// The worker with this id.
    pub fn get(&self, id: &str) -> Option<Arc<Worker>> {
        self.set.load().iter().find(|w| w.id() == id).cloned()
    }

    /// Removes the worker with this id and returns it.
    pub fn remove(&self, id: &str) -> Option<Arc<Worker>> {
        let _w = self.write.lock();
        let cur = self.set.load();
        let gone = cur.iter().find(|w| w.id() == id).cloned()?;
        let next: WorkerSet = cur.iter().filter(|w| w.id() != id).cloned().collect();
        self.set.store(Arc::new(next));
        Some(gone)
    }

    /// The sorted, de-duplicated models of the available (ready, not draining) workers.
    pub fn models(&self) -> Vec<String> {
        let mut models: Vec<String> = self
            .snapshot()
            .iter()
            .filter(|w| w.is_available())
            .filter_map(|w| w.model().map(|m| m.to_string()))
            .collect();
        models.sort_unstable();
        models.dedup();
        models
    }

    /// The first usable worker of `worker_type` (ready, not draining, breaker not open).
    pub fn first_available(&self, worker_type: WorkerType) -> Option<Arc<Worker>> {
        self.snapshot()
            .iter()
            .find(|w| w.worker_type() == worker_type && w.is_usable())
            .cloned()
    }

    /// `(usable, total)` worker counts (usable: ready, not draining, breaker not open).
    pub fn counts(&self) -> (usize, usize) {
        let s = self.snapshot();
        (s.iter().filter(|w| w.is_usable()).count(), s.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::spec;
    use openapi::workers::WorkerStatus;
    use tokio_util::sync::CancellationToken;

    fn worker(url: &str) -> Arc<Worker> {
        Arc::new(Worker::new(spec(url), None, CancellationToken::new()))
    }

    #[test]
    fn insert_get_remove_and_duplicates() {
        let r = Registry::new();
        let a = worker("http://a:1");
        r.insert(a.clone()).unwrap();
        r.insert(worker("http://b:1")).unwrap();
        let dup = r.insert(worker("http://a:1/")).unwrap_err();
        assert_eq!(dup.id, a.id());
        assert_eq!(r.list().len(), 2);
        assert!(Arc::ptr_eq(&r.get(a.id()).unwrap(), &a));
        let before = r.snapshot();
        assert!(r.remove(a.id()).is_some());
        assert!(r.remove(a.id()).is_none());
        assert_eq!(before.len(), 2, "an old snapshot is unchanged");
        assert_eq!(r.list().len(), 1);
    }

    #[test]
    fn ranks_share_a_url_and_the_fan_outs_see_it_once() {
        let r = Registry::new();
        let lead = worker("http://a:1");
        lead.set_dp(Some(crate::DpRank { rank: 0, size: 3 }));
        r.insert(lead.clone()).unwrap();
        r.insert(worker("http://b:1")).unwrap();
        let sibling = |rank| Arc::new(lead.rank_sibling(rank, 3, CancellationToken::new()));
        assert!(r.insert_rank(sibling(1)) && r.insert_rank(sibling(2)));
        assert!(!r.insert_rank(sibling(2)), "a rank is registered once");
        assert!(r.insert(worker("http://a:1")).is_err(), "the URL is taken");
        assert_eq!(r.ranks_of(lead.url()).len(), 3);
        let once: Vec<String> = r
            .one_per_url()
            .iter()
            .map(|w| w.name().into_owned())
            .collect();
        assert_eq!(once, ["http://a:1@0", "http://b:1"]);
        let names: Vec<String> = r.list().iter().map(|w| w.name().into_owned()).collect();
        assert_eq!(names[2..], ["http://a:1@1", "http://a:1@2"]);
        let info = r.list()[3].info();
        assert_eq!((info.dp_rank, info.dp_size), (Some(2), Some(3)));
        assert_eq!(r.list()[1].info().dp_rank, None);
    }

    #[test]
    fn models_are_the_union_of_available_workers() {
        let r = Registry::new();
        for (url, m) in [
            ("http://a:1", "m1"),
            ("http://b:1", "m2"),
            ("http://c:1", "m1"),
            ("http://d:1", "m3"),
        ] {
            let w = worker(url);
            w.set_model(m.into());
            if m != "m3" {
                w.set_status(WorkerStatus::Ready);
            }
            r.insert(w).unwrap();
        }
        assert_eq!(r.models(), vec!["m1".to_string(), "m2".to_string()]);
        assert_eq!(r.counts(), (3, 4));
    }
}
