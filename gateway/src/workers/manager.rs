//! The worker control plane: validates registrations, starts each worker's health loop,
//! applies updates, and drains then removes workers. The admin API and the static
//! `--worker-urls` both go through here.

use std::sync::Arc;

use openapi::workers::{CreateWorkerRequest, UpdateWorkerRequest, WorkerStatus, WorkerType};
use tokio_util::sync::CancellationToken;

use super::breaker::BreakerConfig;
use super::health::{self, HealthConfig, HttpProbe};
use super::registry::Duplicate;
use super::{DEFAULT_PRIORITY, Registry, UrlError, Worker, WorkerSpec, WorkerUrl};
use crate::client::HttpClient;
use crate::config::{PrefillSpec, ServeConfig};

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
    default_key: Option<String>,
    root: CancellationToken,
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
        Self {
            probe: Arc::new(HttpProbe::new(client, &health)),
            registry,
            health,
            breaker: Arc::new(BreakerConfig::from(cfg)),
            default_key: cfg.api_key.clone(),
            root,
        }
    }

    /// The registry managed.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Validates and registers a worker and starts probing it (must run inside a tokio
    /// runtime). It takes traffic once its first probe succeeds.
    pub fn add(&self, req: CreateWorkerRequest) -> Result<Arc<Worker>, AddError> {
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
        if req.api_key.as_deref().is_some_and(str::is_empty) {
            return Err(AddError::Invalid("api_key must not be empty".into()));
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
        let worker = Arc::new(
            Worker::new(spec, self.default_key.as_deref(), self.root.child_token())
                .with_breaker(self.breaker.clone()),
        );
        self.registry.insert(worker.clone())?;
        tracing::info!(
            id = worker.id(),
            url = worker.url().as_str(),
            kind = worker.worker_type().as_str(),
            "worker registered"
        );
        if self.health.disabled {
            worker.set_status(WorkerStatus::Ready);
            let (w, probe) = (worker.clone(), self.probe.clone());
            tokio::spawn(async move { probe.discover(&w).await });
        } else {
            tokio::spawn(health::run(
                worker.clone(),
                self.probe.clone(),
                self.health.clone(),
            ));
        }
        Ok(worker)
    }

    /// Applies a PATCH; `None` if there is no such worker.
    pub fn update(
        &self,
        id: &str,
        req: UpdateWorkerRequest,
    ) -> Result<Option<Arc<Worker>>, AddError> {
        if let Some(Some(k)) = &req.api_key
            && k.is_empty()
        {
            return Err(AddError::Invalid(
                "api_key must not be empty (use null to remove it)".into(),
            ));
        }
        let Some(worker) = self.registry.get(id) else {
            return Ok(None);
        };
        worker.update_admin(req.labels, req.priority);
        if let Some(key) = req.api_key {
            worker.set_api_key(key.as_deref(), self.default_key.as_deref());
        }
        Ok(Some(worker))
    }

    /// Starts removing a worker: it gets no new requests at once; it leaves the registry
    /// (and its health loop stops) when its in-flight requests have finished. `None` if
    /// there is no such worker.
    pub fn remove(&self, id: &str) -> Option<Arc<Worker>> {
        let worker = self.registry.get(id)?;
        let registry = self.registry.clone();
        let finish = move |w: &Worker| {
            registry.remove(w.id());
            w.cancel_token().cancel();
            tracing::info!(id = w.id(), url = w.url().as_str(), "worker removed");
        };
        let drain = {
            let w = worker.clone();
            async move { w.drain().await }
        };
        // Nothing in flight: remove now, so the id is gone when the caller returns.
        if worker.load() == 0 {
            futures::FutureExt::now_or_never(drain);
            finish(&worker);
        } else {
            let w = worker.clone();
            tokio::spawn(async move {
                drain.await;
                finish(&w);
            });
        }
        Some(worker)
    }

    /// Registers the static `--worker-urls` (regular workers).
    pub fn add_static(&self, urls: &[String]) -> Result<(), AddError> {
        for url in urls {
            self.add(static_worker(url, WorkerType::Regular, None))?;
        }
        Ok(())
    }

    /// Registers the static `--prefill` and `--decode` workers (PD mode).
    pub fn add_static_pd(
        &self,
        prefill: &[PrefillSpec],
        decode: &[String],
    ) -> Result<(), AddError> {
        for p in prefill {
            self.add(static_worker(&p.url, WorkerType::Prefill, p.bootstrap_port))?;
        }
        for url in decode {
            self.add(static_worker(url, WorkerType::Decode, None))?;
        }
        Ok(())
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
