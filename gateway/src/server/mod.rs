//! The HTTP face of `moongate serve`: shared state, the route table with its OpenAPI
//! description, and the front door.
//!
//! - [`front`]: the one middleware stack (request id, metrics) and the inference fast path.
//! - [`inference`]: the proxied OpenAI/SGLang routes, `/v1/models`, and a worker's
//!   `/get_server_info` / `/get_model_info`.
//! - [`admin`]: the worker API (`/workers`), behind the admin key.
//! - [`ops`]: `/health`, `/liveness`, `/readiness`, `/metrics`.
//!
//! [`app`] builds the service for a state; [`app_with`] also mounts another component's
//! routes (the KV master's REST API) under the same front door and OpenAPI document, which
//! [`crate::docs`] serves with Swagger UI.

pub mod admin;
pub mod front;
pub mod inference;
pub mod ops;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::admission::{Admission, AdmissionConfig};
use crate::auth::{AdminKey, Rejection};
use crate::client::HttpClient;
use crate::config::{PolicyKind, ServeConfig};
use crate::error::GatewayError;
use crate::metrics;
use crate::proxy::RegularRouter;
use crate::proxy::dispatch::Dispatcher;
use crate::proxy::pd::PdRouter;
use crate::proxy::retry::RetryPolicy;
use crate::request_id::RequestIds;
use crate::select::Policy;
use crate::select::cache_aware::CacheAwareConfig;
use crate::workers::{Registry, WorkerManager};
pub use front::Front;
use kvstore::Master;

/// Everything handlers share (cheap to clone).
#[derive(Clone, Debug)]
pub struct AppState(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    config: ServeConfig,
    manager: WorkerManager,
    router: RegularRouter,
    pd: Option<PdRouter>,
    client: HttpClient,
    admission: Admission,
    request_ids: RequestIds,
    prometheus: PrometheusHandle,
    cancel: CancellationToken,
    master: OnceLock<Arc<Master>>,
}

impl AppState {
    /// Builds the state for `config` (must run inside a tokio runtime; registers nothing
    /// yet: see [`AppState::add_static_workers`]). Fails when `--worker-ca-cert` cannot be
    /// read.
    pub fn new(config: ServeConfig) -> anyhow::Result<Self> {
        let roots = crate::client::worker_roots(config.worker_ca_cert.as_deref())
            .map_err(|e| anyhow::anyhow!("worker_ca_cert: {e}"))?;
        let prometheus = metrics::install();
        let cancel = CancellationToken::new();
        let client = HttpClient::with_roots(roots);
        let registry = Arc::new(Registry::new());
        let manager = WorkerManager::new(registry.clone(), client.clone(), &config, cancel.clone());
        let retry = RetryPolicy::from(&config);
        let dispatcher = Dispatcher::new(
            client.clone(),
            Duration::from_secs(config.request_timeout_secs),
        );
        let policy =
            |kind: PolicyKind| Policy::with_cache_config(kind, CacheAwareConfig::from(&config));
        let pd = config.pd_disaggregation.then(|| {
            PdRouter::new(
                registry.clone(),
                [
                    policy(config.prefill_policy()),
                    policy(config.decode_policy()),
                ],
                dispatcher.clone(),
                retry.clone(),
                crate::proxy::pd::Bounds::from(&config),
            )
        });
        let router = RegularRouter::new(registry, policy(config.policy), dispatcher, retry);
        let state = Self(Arc::new(Inner {
            admission: Admission::new(&AdmissionConfig::from(&config)),
            request_ids: RequestIds::new(&config.request_id_headers),
            config,
            manager,
            router,
            pd,
            client,
            prometheus,
            cancel,
            master: OnceLock::new(),
        }));
        state.spawn_cache_upkeep();
        Ok(state)
    }

    /// The `cache_aware` policies in use (regular, or PD prefill and decode).
    pub fn cache_aware_policies(
        &self,
    ) -> impl Iterator<Item = &crate::select::cache_aware::CacheAware> {
        let pd = self.pd_router().into_iter().flat_map(|pd| pd.policies());
        std::iter::once(self.router().policy())
            .chain(pd)
            .filter_map(Policy::cache_aware)
    }

    /// Every `--eviction-interval-secs`, each `cache_aware` tree forgets removed workers
    /// and evicts beyond `--max-tree-size` (nothing is spawned without such a policy).
    fn spawn_cache_upkeep(&self) {
        if self.cache_aware_policies().next().is_none() {
            return;
        }
        let st = self.clone();
        let every = Duration::from_secs(self.config().eviction_interval_secs.max(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tokio::select! {
                    _ = st.cancel_token().cancelled() => return,
                    _ = tick.tick() => {}
                }
                let alive: std::collections::HashSet<u64> =
                    st.registry().snapshot().iter().map(|w| w.uid()).collect();
                let evicted: usize = st
                    .cache_aware_policies()
                    .map(|p| p.maintain(|t| alive.contains(&t)))
                    .sum();
                if evicted > 0 {
                    tracing::debug!(evicted, "cache_aware trees evicted");
                }
            }
        });
    }

    /// Registers the configured workers: `--worker-urls`, or in PD mode `--prefill` and
    /// `--decode`.
    pub fn add_static_workers(&self) -> Result<(), crate::workers::manager::AddError> {
        let cfg = &self.0.config;
        self.0.manager.add_static(&cfg.worker_urls)?;
        let mut prefill = Vec::with_capacity(cfg.prefill.len());
        for spec in cfg.prefill_specs() {
            prefill.push(spec.map_err(crate::workers::manager::AddError::Invalid)?);
        }
        self.0.manager.add_static_pd(&prefill, &cfg.decode)
    }

    /// The configuration.
    pub fn config(&self) -> &ServeConfig {
        &self.0.config
    }

    /// The worker control plane.
    pub fn workers(&self) -> &WorkerManager {
        &self.0.manager
    }

    /// The worker registry.
    pub fn registry(&self) -> &Arc<Registry> {
        self.0.manager.registry()
    }

    /// The regular-mode router.
    pub fn router(&self) -> &RegularRouter {
        &self.0.router
    }

    /// The PD router, in PD mode (`--pd-disaggregation`).
    pub fn pd_router(&self) -> Option<&PdRouter> {
        self.0.pd.as_ref()
    }

    /// The pooled upstream client (for routers added beside the regular one).
    pub fn client(&self) -> &HttpClient {
        &self.0.client
    }

    /// Admission control for inference requests.
    pub fn admission(&self) -> &Admission {
        &self.0.admission
    }

    /// Where request ids are read from.
    pub fn request_ids(&self) -> &RequestIds {
        &self.0.request_ids
    }

    /// The Prometheus handle.
    pub fn prometheus(&self) -> &PrometheusHandle {
        &self.0.prometheus
    }

    /// Records the KV master this gateway hosts (its gauges are refreshed when `/metrics` is
    /// scraped). Only the first call counts.
    pub fn host_master(&self, master: Arc<Master>) {
        let _ = self.0.master.set(master);
    }

    /// The hosted KV master, if any.
    pub fn master(&self) -> Option<&Arc<Master>> {
        self.0.master.get()
    }

    /// Cancelled at shutdown; stops every health loop.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.0.cancel
    }
}

/// The gateway's OpenAPI document (info; paths come from the routes, tags and the security
/// scheme from [`crate::docs`]).
#[derive(OpenApi)]
#[openapi(info(
    title = "Moongate",
    description = "OpenAI-compatible gateway for SGLang workers, with the KV-cache master it hosts.",
    license(name = "Apache-2.0")
))]
pub struct GatewayApi;

/// The gateway's open routes (inference, health, metrics) with their OpenAPI descriptions,
/// before state is applied.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(GatewayApi::openapi())
        .routes(routes!(inference::chat_completions))
        .routes(routes!(inference::completions))
        .routes(routes!(inference::generate))
        .routes(routes!(inference::models))
        .routes(routes!(inference::server_info))
        .routes(routes!(inference::model_info))
        .routes(routes!(ops::health))
        .routes(routes!(ops::liveness))
        .routes(routes!(ops::readiness))
        .routes(routes!(ops::metrics))
}

/// The worker API, before the admin key and state are applied.
pub fn admin_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(admin::list_workers, admin::create_worker))
        .routes(routes!(
            admin::get_worker,
            admin::update_worker,
            admin::delete_worker
        ))
}

/// How a gateway route refuses a request without the admin key: 401, OpenAI envelope.
pub fn gateway_rejection() -> Rejection {
    Rejection {
        respond: || GatewayError::Unauthorized.into_response(),
        schema: "ErrorResponse",
    }
}

/// The complete gateway service.
pub fn app(state: AppState) -> Front {
    app_with(state, OpenApiRouter::new())
}

/// The gateway service plus `extra` routes (e.g. the KV master's REST API), served behind
/// the same front door and described in the same `/openapi.json`.
pub fn app_with(state: AppState, extra: OpenApiRouter) -> Front {
    Front::new(state.clone(), router(state, extra))
}

/// The route table (every route, the docs, JSON 404/405 fallbacks), without the front door.
pub fn router(state: AppState, extra: OpenApiRouter) -> Router {
    build(state, extra).0
}

/// The route table and the OpenAPI document it serves.
pub fn build(state: AppState, extra: OpenApiRouter) -> (Router, utoipa::openapi::OpenApi) {
    let key = AdminKey::new(state.config().admin_api_key.as_ref());
    let api = api_routes()
        .merge(key.guard(admin_routes(), gateway_rejection()))
        .with_state(state)
        .merge(extra);
    let (router, doc) = crate::docs::documented(api);
    let router = router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    (router, doc)
}

async fn not_found(req: Request) -> Response {
    GatewayError::RouteNotFound(format!("{} {}", req.method(), req.uri().path())).into_response()
}

async fn method_not_allowed() -> Response {
    GatewayError::MethodNotAllowed.into_response()
}
