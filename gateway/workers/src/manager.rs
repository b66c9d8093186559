//! The worker control plane: validates registrations, starts each worker's health loop,
//! applies updates, and drains then removes workers. The admin API and the static
//! `--worker-urls` both go through here.
//!
//! With `--dp-aware` a worker is registered as one entry; once its probe learns that it
//! runs several data-parallel ranks, that entry becomes rank 0 and one entry per other
//! rank is registered beside it (by a task of the manager), each probed, counted and broken on its
//! own. Removing any of them removes the worker: every rank.
//!
//! The gateway's `--api-key` is the key of the static workers only (`--worker-urls`,
//! `--prefill`, `--decode`: the operator named those URLs); a worker registered through the
//! API has the key given with it or none, so the gateway's key never goes to a URL someone
//! registered.

use std::sync::Arc;

use openapi::workers::{CreateWorkerRequest, UpdateWorkerRequest, WorkerStatus, WorkerType};
use tokio_util::sync::CancellationToken;

use super::breaker::BreakerConfig;
use super::health::{self, HealthConfig, HttpProbe};
use super::registry::Duplicate;
use super::{DEFAULT_PRIORITY, Origin, Registry, UrlError, Worker, WorkerSpec, WorkerUrl};
use crate::client::HttpClient;
use settings::{PrefillSpec, ServeConfig};

/// Why a worker could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// Bad URL.
    #[error("invalid worker url {url:?}: {source}")]
    Url {
        /// As given.
        url: String,
        /// What is wrong with it.
        source: UrlError,
    },
    /// A field that does not fit the worker type, or an empty value.
    #[error("{0}")]
    Invalid(String),
    /// URL taken.
    #[error(transparent)]
    Duplicate(#[from] Duplicate),
}

/// See the module doc.
#[derive(Debug)]
pub struct WorkerManager {
    registry: Arc<Registry>,
    probe: Arc<HttpProbe>,
    health: HealthConfig,
    breaker: Arc<BreakerConfig>,
    default_key: parking_lot::Mutex<Option<String>>,
    /// Whether discovered workers get `default_key` (not when discovery watches every
    /// namespace).
    discovered_keyed: std::sync::atomic::AtomicBool,
    /// `--dp-aware`: the workers whose other ranks are to be registered, until the task
    /// that does it is started by the first registration.
    ranks: parking_lot::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Arc<Worker>>>>,
    root: CancellationToken,
}

/// What [`WorkerManager::sync_static`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StaticSync {
    /// URLs registered.
    pub added: Vec<String>,
    /// URLs removed (draining).
    pub removed: Vec<String>,
    /// Entries that could not be registered, and why.
    pub problems: Vec<String>,
}

impl WorkerManager {
    /// A manager over `registry`; `root` stops every health loop when cancelled.
    pub fn new(
        registry: Arc<Registry>,
        client: HttpClient,
        cfg: &ServeConfig,
        root: CancellationToken,
    ) -> Self {
        let health = HealthConfig::from(cfg);
        let mut probe = HttpProbe::new(client, &health);
        let mut ranks = None;
        if cfg.dp_aware {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            probe = probe.learning_ranks(tx);
            ranks = Some(rx);
        }
        Self {
            probe: Arc::new(probe),
            ranks: parking_lot::Mutex::new(ranks),
            registry,
            health,
            breaker: Arc::new(BreakerConfig::from(cfg)),
            default_key: parking_lot::Mutex::new(cfg.api_key.clone()),
            discovered_keyed: std::sync::atomic::AtomicBool::new(true),
            root,
        }
    }

    /// The registry managed.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Validates and registers a worker of the worker API ([`Origin::Api`]: its own key or
    /// none) and starts probing it (must run inside a tokio runtime). It takes traffic once
    /// its first probe succeeds.
    pub fn add(&self, req: CreateWorkerRequest) -> Result<Arc<Worker>, AddError> {
        self.register(req, Origin::Api)
    }

    fn register(&self, req: CreateWorkerRequest, origin: Origin) -> Result<Arc<Worker>, AddError> {
        let url = WorkerUrl::parse(&req.url).map_err(|source| AddError::Url {
            url: req.url.clone(),
            source,
        })?;
        if req.bootstrap_port.is_some() && req.worker_type != WorkerType::Prefill {
            return Err(AddError::Invalid(format!(
                "bootstrap_port applies to prefill workers only, not {}",
                req.worker_type.as_str()
            )));
        }
        if req.model_id.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return Err(AddError::Invalid("model_id must not be empty".into()));
        }
        if req
            .api_key
            .as_deref()
            .is_some_and(|k| !planes::keys::is_sendable(k))
        {
            return Err(AddError::Invalid(
                "api_key must be non-empty visible ASCII without spaces".into(),
            ));
        }
        let spec = WorkerSpec {
            url,
            worker_type: req.worker_type,
            bootstrap_port: req.bootstrap_port,
            model_id: req.model_id,
            api_key: req.api_key,
            labels: req.labels,
            priority: req.priority.unwrap_or(DEFAULT_PRIORITY),
        };
        let default_key = self.default_key_for(origin);
        let worker = Arc::new(
            Worker::new(spec, default_key.as_deref(), self.root.child_token())
                .with_origin(origin)
                .with_breaker(self.breaker.clone()),
        );
        self.registry.insert(worker.clone())?;
        tracing::info!(
            id = worker.id(),
            url = worker.url().as_str(),
            kind = worker.worker_type().as_str(),
            "worker registered"
        );
        if let Some(rx) = self.ranks.lock().take() {
            tokio::spawn(expand_ranks(
                rx,
                self.registry.clone(),
                self.probe.clone(),
                self.health.clone(),
                self.root.clone(),
            ));
        }
        if self.health.disabled {
            let (w, probe) = (worker.clone(), self.probe.clone());
            let retry = self.health.pending_interval;
            tokio::spawn(async move {
                // Ready once its ranks are known (at once without `--dp-aware`).
                while let Err(e) = probe.learn_ranks(&w).await {
                    tracing::warn!(worker = %w.url().as_str(), error = %e, "not taking requests yet");
                    tokio::select! {
                        _ = w.cancel_token().cancelled() => return,
                        _ = tokio::time::sleep(retry) => {}
                    }
                }
                w.set_status(WorkerStatus::Ready);
                probe.discover(&w).await
            });
        } else {
            tokio::spawn(health::run(
                worker.clone(),
                self.probe.clone(),
                self.health.clone(),
            ));
        }
        Ok(worker)
    }

    /// Applies a PATCH (with `--dp-aware`, to every rank of the worker); `None` if there
    /// is no such worker.
    pub fn update(
        &self,
        id: &str,
        req: UpdateWorkerRequest,
    ) -> Result<Option<Arc<Worker>>, AddError> {
        if let Some(Some(k)) = &req.api_key
            && !planes::keys::is_sendable(k)
        {
            return Err(AddError::Invalid(
                "api_key must be non-empty visible ASCII without spaces (null removes it)".into(),
            ));
        }
        let Some(worker) = self.registry.get(id) else {
            return Ok(None);
        };
        // With `--dp-aware` the change is the worker's: every rank of it takes it.
        let default_key = self.default_key_for(worker.origin());
        for w in self.registry.ranks_of(worker.url()) {
            w.update_admin(req.labels.clone(), req.priority);
            if let Some(key) = &req.api_key {
                w.set_api_key(key.as_deref(), default_key.as_deref());
            }
        }
        Ok(Some(worker))
    }

    /// The key a worker of `origin` without its own key uses.
    fn default_key_for(&self, origin: Origin) -> Option<String> {
        match origin {
            Origin::Static => self.default_key.lock().clone(),
            Origin::Discovered if self.discovered_keyed() => self.default_key.lock().clone(),
            Origin::Discovered | Origin::Api => None,
        }
    }

    /// Replaces the gateway's `--api-key` (a reload): static and discovered workers
    /// without their own key send the new one from their next request on.
    pub fn set_default_key(&self, key: Option<String>) {
        *self.default_key.lock() = key.clone();
        for w in self.registry.list().iter() {
            let keyed = match w.origin() {
                Origin::Static => true,
                Origin::Discovered => self.discovered_keyed(),
                Origin::Api => false,
            };
            if keyed {
                w.set_default_key(key.as_deref());
            }
        }
    }

    /// Starts removing a worker (with `--dp-aware`, every rank of it): it gets no new
    /// requests at once; it leaves the registry (and its health loop stops) when its
    /// in-flight requests have finished. `None` if there is no such worker.
    pub fn remove(&self, id: &str) -> Option<Arc<Worker>> {
        let worker = self.registry.get(id)?;
        for rank in self.registry.ranks_of(worker.url()) {
            if rank.id() != id {
                self.remove_entry(rank);
            }
        }
        self.remove_entry(worker.clone());
        Some(worker)
    }

    /// Drains one registry entry, then takes it out.
    fn remove_entry(&self, worker: Arc<Worker>) {
        let registry = self.registry.clone();
        let finish = move |w: &Worker| {
            registry.remove(w.id());
            w.cancel_token().cancel();
            tracing::info!(id = w.id(), url = w.url().as_str(), "worker removed");
        };
        let mut drain = {
            let w = worker.clone();
            Box::pin(async move { w.drain().await })
        };
        // Polled once here, so the worker is marked draining (no new requests) before this
        // returns; with nothing in flight that finishes it: the id is gone at once.
        if futures::FutureExt::now_or_never(&mut drain).is_some() {
            finish(&worker);
        } else {
            tokio::spawn(async move {
                drain.await;
                finish(&worker);
            });
        }
    }

    /// Whether discovered workers get the gateway's `--api-key`.
    fn discovered_keyed(&self) -> bool {
        self.discovered_keyed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Says whether workers found by service discovery get the gateway's `--api-key`
    /// (default yes: they are pods the operator's selector picks in the gateway's own
    /// namespace; no when discovery watches every namespace). Set before discovery starts.
    pub fn set_discovered_keyed(&self, keyed: bool) {
        self.discovered_keyed
            .store(keyed, std::sync::atomic::Ordering::Relaxed);
    }

    /// Registers a worker found by service discovery ([`Origin::Discovered`]) with
    /// `labels`, and starts probing it.
    pub fn add_discovered(
        &self,
        url: &str,
        worker_type: WorkerType,
        bootstrap_port: Option<u16>,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<Arc<Worker>, AddError> {
        let req = CreateWorkerRequest {
            labels,
            ..static_worker(url, worker_type, bootstrap_port)
        };
        self.register(req, Origin::Discovered)
    }

    /// Registers the static `--worker-urls` (regular workers).
    pub fn add_static(&self, urls: &[String]) -> Result<(), AddError> {
        for url in urls {
            self.register(
                static_worker(url, WorkerType::Regular, None),
                Origin::Static,
            )?;
        }
        Ok(())
    }

    /// Makes the static workers exactly `regular`, `prefill` and `decode` (a reload): the
    /// static workers no longer listed (or listed with another type or bootstrap port) are
    /// drained and removed, the new ones registered. Workers of the worker API are left
    /// alone; a listed URL that one of them holds is reported, not taken over.
    pub fn sync_static(
        &self,
        regular: &[String],
        prefill: &[PrefillSpec],
        decode: &[String],
    ) -> StaticSync {
        let mut wanted = Vec::new();
        let mut out = StaticSync::default();
        let listed = regular
            .iter()
            .map(|u| (u.as_str(), WorkerType::Regular, None))
            .chain(
                prefill
                    .iter()
                    .map(|p| (p.url.as_str(), WorkerType::Prefill, p.bootstrap_port)),
            )
            .chain(
                decode
                    .iter()
                    .map(|u| (u.as_str(), WorkerType::Decode, None)),
            );
        for (url, kind, port) in listed {
            match WorkerUrl::parse(url) {
                Ok(u) => wanted.push((u.as_str().to_string(), url, kind, port)),
                Err(e) => out.problems.push(format!("{url}: {e}")),
            }
        }
        let same = |w: &Worker, norm: &str, kind: WorkerType, port: Option<u16>| {
            w.url().as_str() == norm && w.worker_type() == kind && w.bootstrap_port() == port
        };
        let current = self.registry.list();
        let statics = || {
            current
                .iter()
                .filter(|w| w.origin() == Origin::Static && !w.is_draining())
        };
        for w in statics() {
            if !wanted
                .iter()
                .any(|(norm, _, kind, port)| same(w, norm, *kind, *port))
            {
                out.removed.push(w.url().as_str().to_string());
                self.remove(w.id());
            }
        }
        for (norm, url, kind, port) in wanted {
            if statics().any(|w| same(w, &norm, kind, port)) {
                continue;
            }
            match self.register(static_worker(url, kind, port), Origin::Static) {
                Ok(_) => out.added.push(norm),
                Err(e) => out.problems.push(e.to_string()),
            }
        }
        out
    }

    /// Registers the static `--prefill` and `--decode` workers (PD mode).
    pub fn add_static_pd(
        &self,
        prefill: &[PrefillSpec],
        decode: &[String],
    ) -> Result<(), AddError> {
        for p in prefill {
            self.register(
                static_worker(&p.url, WorkerType::Prefill, p.bootstrap_port),
                Origin::Static,
            )?;
        }
        for url in decode {
            self.register(static_worker(url, WorkerType::Decode, None), Origin::Static)?;
        }
        Ok(())
    }
}

/// Registers the other data-parallel ranks of each worker `rx` brings (rank 0 of several,
/// from [`HttpProbe::learn_ranks`]), each probed on its own (ready at once when probing is
/// off). A worker removed meanwhile gets none, or loses the ones just added.
async fn expand_ranks(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Arc<Worker>>,
    registry: Arc<Registry>,
    probe: Arc<HttpProbe>,
    health: HealthConfig,
    root: CancellationToken,
) {
    loop {
        let leader = tokio::select! {
            _ = root.cancelled() => return,
            w = rx.recv() => match w {
                Some(w) => w,
                None => return,
            },
        };
        let Some(dp) = leader.dp_rank() else { continue };
        let mut added = Vec::new();
        for rank in 1..dp.size {
            let w = Arc::new(leader.rank_sibling(rank, dp.size, root.child_token()));
            if !registry.insert_rank(w.clone()) {
                continue;
            }
            if health.disabled {
                w.set_status(WorkerStatus::Ready);
            } else {
                tokio::spawn(health::run(w.clone(), probe.clone(), health.clone()));
            }
            added.push(w);
        }
        if leader.is_draining() || registry.get(leader.id()).is_none() {
            for w in added {
                registry.remove(w.id());
                w.cancel_token().cancel();
            }
        }
    }
}

fn static_worker(
    url: &str,
    worker_type: WorkerType,
    bootstrap_port: Option<u16>,
) -> CreateWorkerRequest {
    CreateWorkerRequest {
        url: url.to_string(),
        worker_type,
        bootstrap_port,
        model_id: None,
        api_key: None,
        labels: Default::default(),
        priority: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(cfg: &ServeConfig) -> WorkerManager {
        let registry = Arc::new(Registry::new());
        let client = HttpClient::with_roots(rustls::RootCertStore::empty());
        WorkerManager::new(registry, client, cfg, CancellationToken::new())
    }

    fn urls(m: &WorkerManager, origin: Origin) -> Vec<(String, WorkerType, Option<u16>)> {
        let mut v: Vec<_> = m
            .registry()
            .list()
            .iter()
            .filter(|w| w.origin() == origin)
            .map(|w| {
                (
                    w.url().as_str().to_string(),
                    w.worker_type(),
                    w.bootstrap_port(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[tokio::test]
    async fn sync_static_adds_and_removes_static_workers_only() {
        let cfg = ServeConfig {
            disable_health_check: true,
            api_key: Some("gk".into()),
            ..ServeConfig::default()
        };
        let m = manager(&cfg);
        let p = |url: &str, port| PrefillSpec {
            url: url.into(),
            bootstrap_port: port,
        };
        m.add_static_pd(&[p("http://p1:1", Some(8998))], &["http://d1:1".into()])
            .unwrap();
        let api = m
            .add(static_worker("http://api:1", WorkerType::Decode, None))
            .unwrap();
        assert!(
            api.bearer().is_none(),
            "an API worker without a key has none"
        );
        assert_eq!(m.registry().get(api.id()).unwrap().origin(), Origin::Api);

        // p1's bootstrap port changes, d1 goes, d2 comes, api:1 is left alone and a listed
        // URL it holds is reported.
        let done = m.sync_static(
            &[],
            &[p("http://p1:1", Some(9000))],
            &["http://d2:1".into(), "http://api:1".into()],
        );
        assert_eq!(done.removed, ["http://p1:1", "http://d1:1"]);
        assert_eq!(done.added, ["http://p1:1", "http://d2:1"]);
        assert_eq!(done.problems.len(), 1, "{:?}", done.problems);
        assert!(
            done.problems[0].contains("already registered"),
            "{:?}",
            done.problems
        );
        assert_eq!(
            urls(&m, Origin::Static),
            [
                ("http://d2:1".to_string(), WorkerType::Decode, None),
                ("http://p1:1".to_string(), WorkerType::Prefill, Some(9000)),
            ]
        );
        assert_eq!(urls(&m, Origin::Api).len(), 1);
        // Static workers take the gateway's key, and a new one on reload.
        for w in m
            .registry()
            .list()
            .iter()
            .filter(|w| w.origin() == Origin::Static)
        {
            assert_eq!(w.bearer().unwrap().to_str().unwrap(), "Bearer gk");
        }
        m.set_default_key(Some("gk2".into()));
        for w in m.registry().list().iter() {
            let want = (w.origin() == Origin::Static).then_some("Bearer gk2");
            assert_eq!(
                w.bearer()
                    .map(|b| b.to_str().unwrap().to_string())
                    .as_deref(),
                want
            );
        }
        // Nothing changes when nothing changed.
        let again = m.sync_static(
            &[],
            &[p("http://p1:1", Some(9000))],
            &["http://d2:1".into()],
        );
        assert!(
            again.added.is_empty() && again.removed.is_empty(),
            "{again:?}"
        );
    }
}
