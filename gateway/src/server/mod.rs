//! The HTTP face of `moongate serve`: shared state, the route table with its OpenAPI
//! description, and the front door.
//!
//! - [`front`]: the one middleware stack (request id, metrics) and the inference fast path.
//! - [`inference`]: the proxied OpenAI/SGLang routes, `/v1/models`, and a worker's
//!   `/get_server_info` / `/get_model_info`.
//! - [`admin`]: the worker API (`/workers`), behind the admin key.
//! - [`console`]: the cluster at a glance (`/cluster`, admin key) and the page that draws
//!   it (`/console`).
//! - [`ops`]: `/health`, `/liveness`, `/readiness`, `/metrics`.
//! - [`fanout`]: what asks every worker (`/flush_cache`, `/get_loads`, `/engine_metrics`,
//!   whose merge is [`exposition`]'s, `/start_profile`, `/stop_profile`) or one pair
//!   (`/health_generate`).
//!
//! [`app`] builds the service for a state; [`app_with`] also mounts another component's
//! routes (the KV master's REST API) under the same front door and OpenAPI document, which
//! [`crate::docs`] serves with Swagger UI.

pub mod admin;
pub mod console;
pub mod exposition;
pub mod fanout;
pub mod front;
pub mod inference;
pub mod loads;
pub mod ops;
pub mod responses;
pub mod tasks;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use axum::Router;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::admission::tenants::Tenants;
use crate::admission::{Admission, AdmissionConfig};
use crate::auth::{Auth, KeySet, Plane, Rejection};
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
use crate::select::affinity::RoutingKey;
use crate::select::kv_aware::KvAwareConfig;
use crate::select::kv_aware::store::StoreSource;
use crate::select::least_load::LeastLoad;
use crate::select::responses::ResponseHomes;
use crate::select::sticky::StickyConfig;
use crate::workers::{Registry, WorkerManager};
pub use front::Front;
use kvmaster::Master;
use openapi::workers::WorkerType;
use sglang::tokenizer::Tokenizer;

/// Everything handlers share (cheap to clone).
#[derive(Clone, Debug)]
pub struct AppState(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    config: ServeConfig,
    auth: Auth,
    manager: Arc<WorkerManager>,
    router: ArcSwap<RegularRouter>,
    pd: Option<ArcSwap<PdRouter>>,
    dispatcher: Dispatcher,
    retry: RetryPolicy,
    client: HttpClient,
    admission: ArcSwap<Admission>,
    request_ids: Arc<RequestIds>,
    prometheus: PrometheusHandle,
    cancel: CancellationToken,
    master: OnceLock<Arc<Master>>,
    /// The store `kv_aware` looks at ([`AppState::use_store`]).
    store: OnceLock<Arc<dyn StoreSource>>,
    applied: Mutex<ServeConfig>,
    /// `--tokenizer-path`, loaded once (a reload keeps it).
    tokenizer: Option<Arc<Tokenizer>>,
    /// Which worker holds each response (the Responses API).
    homes: Arc<ResponseHomes>,
    /// The tenants' admission gates.
    tenants: Tenants,
    /// When the state was built (the console's uptime).
    started: std::time::Instant,
}

impl AppState {
    /// Builds the state for `config` (must run inside a tokio runtime; registers nothing
    /// yet: see [`AppState::add_static_workers`]). Fails when `--worker-ca-cert` or the
    /// client keys file cannot be read. The store key in force is `--store-api-key` if
    /// given; a host of the KV master puts the derived one in force
    /// ([`AppState::auth`]).
    pub fn new(config: ServeConfig) -> anyhow::Result<Self> {
        let roots = crate::client::worker_roots(config.worker_ca_cert.as_deref())
            .map_err(|e| anyhow::anyhow!("worker_ca_cert: {e}"))?;
        let explicit_store = config
            .store_api_key
            .as_ref()
            .map(|k| KeySet::single(k.expose()));
        let auth = Auth::new(config.auth_settings(explicit_store)?);
        let prometheus = metrics::install();
        let cancel = CancellationToken::new();
        let client = HttpClient::with_roots(roots);
        let registry = Arc::new(Registry::new());
        let manager = Arc::new(WorkerManager::new(
            registry.clone(),
            client.clone(),
            &config,
            cancel.clone(),
        ));
        let retry = RetryPolicy::from(&config);
        let dispatcher = Dispatcher::new(
            client.clone(),
            Duration::from_secs(config.request_timeout_secs),
        );
        let tokenizer = load_tokenizer(&config)?;
        let (router, pd) = routers(&config, &registry, &dispatcher, &retry, &tokenizer);
        let homes = Arc::new(ResponseHomes::from(&config));
        let state = Self(Arc::new(Inner {
            admission: ArcSwap::from_pointee(Admission::new(&AdmissionConfig::from(&config))),
            request_ids: Arc::new(RequestIds::new(&config.request_id_headers)),
            applied: Mutex::new(config.clone()),
            config,
            auth,
            manager,
            router: ArcSwap::from_pointee(router),
            pd: pd.map(ArcSwap::from_pointee),
            dispatcher,
            retry,
            client,
            prometheus,
            cancel,
            master: OnceLock::new(),
            store: OnceLock::new(),
            tokenizer,
            homes,
            tenants: Tenants::default(),
            started: std::time::Instant::now(),
        }));
        state.spawn_cache_upkeep();
        state.spawn_kv_upkeep();
        state.spawn_load_poll();
        Ok(state)
    }

    /// Puts the policies of `cfg` in force (`policy`, `prefill_policy`, `decode_policy` and
    /// the `cache_aware` settings): new routers over the same workers; requests already
    /// routed finish on the old ones. A `cache_aware` policy starts with empty trees.
    pub(crate) fn replace_policies(&self, cfg: &ServeConfig) {
        let (router, pd) = routers(
            cfg,
            self.registry(),
            &self.0.dispatcher,
            &self.0.retry,
            &self.0.tokenizer,
        );
        self.0.router.store(Arc::new(router));
        if let (Some(slot), Some(pd)) = (&self.0.pd, pd) {
            slot.store(Arc::new(pd));
        }
        if let Some(src) = self.0.store.get() {
            self.share_store(src);
        }
    }

    /// Lets the `kv_aware` policies count the prompt pages in `source`'s store (the KV
    /// master this process hosts). Only the first call counts; policies put in force by
    /// a reload keep it.
    pub fn use_store(&self, source: Arc<dyn StoreSource>) {
        if self.0.store.set(source).is_ok()
            && let Some(src) = self.0.store.get()
        {
            self.share_store(src);
        }
    }

    fn share_store(&self, src: &Arc<dyn StoreSource>) {
        let router = self.router();
        let pd = self.pd_router();
        let pd_policies = pd.as_ref().map(|p| p.policies()).into_iter().flatten();
        for p in std::iter::once(router.policy()).chain(pd_policies) {
            if let Some(k) = p.kv_aware() {
                k.use_store(src.clone());
            }
        }
    }

    /// Puts the admission limits of `cfg` in force for requests from now on; requests
    /// admitted (or queued) under the old limits finish under them.
    pub(crate) fn replace_admission(&self, cfg: &ServeConfig) {
        self.0
            .admission
            .store(Arc::new(Admission::new(&AdmissionConfig::from(cfg))));
    }

    /// The configuration last applied (at start, then by each valid reload).
    pub fn applied_config(&self) -> ServeConfig {
        self.0.applied.lock().clone()
    }

    /// Records `cfg` as applied; returns the one it replaces.
    pub(crate) fn set_applied(&self, cfg: ServeConfig) -> ServeConfig {
        std::mem::replace(&mut *self.0.applied.lock(), cfg)
    }

    /// Calls `f` with each `cache_aware` policy in use now (regular, or PD prefill and
    /// decode).
    pub fn for_each_cache_aware(&self, mut f: impl FnMut(&crate::select::cache_aware::CacheAware)) {
        if let Some(p) = self.router().policy().cache_aware() {
            f(p);
        }
        if let Some(pd) = self.pd_router() {
            pd.policies()
                .into_iter()
                .filter_map(Policy::cache_aware)
                .for_each(&mut f);
        }
    }

    /// Every `--eviction-interval-secs`, each `cache_aware` tree in use forgets removed
    /// workers and evicts beyond `--max-tree-size` (a reload may bring such a policy in, so
    /// the task runs whatever the policy at start).
    fn spawn_cache_upkeep(&self) {
        let every = Duration::from_secs(self.config().eviction_interval_secs.max(1));
        self.spawn_periodic(every, every, |st| async move {
            let mut alive: Option<std::collections::HashSet<u64>> = None;
            let mut evicted = 0;
            st.for_each_cache_aware(|p| {
                let alive = alive.get_or_insert_with(|| {
                    st.registry().snapshot().iter().map(|w| w.uid()).collect()
                });
                evicted += p.maintain(|t| alive.contains(&t));
            });
            if evicted > 0 {
                tracing::debug!(evicted, "cache_aware trees evicted");
            }
        });
    }

    /// Every `--load-poll-interval-secs`, the workers' `/v1/loads` while a policy in use
    /// reads them (`least_load`; a reload may switch it on or off).
    fn spawn_load_poll(&self) {
        let every = Duration::from_secs(self.config().load_poll_interval_secs.max(1));
        self.spawn_periodic(Duration::ZERO, every, |st| async move {
            let router = st.router();
            let pd = st.pd_router();
            let mut policies = vec![router.policy()];
            if let Some(pd) = &pd {
                policies.extend(pd.policies());
            }
            if policies.iter().any(|p| p.needs_loads()) {
                loads::poll_once(&st).await;
            }
        });
    }

    /// Every [`KV_SYNC_INTERVAL`], each `kv_aware` policy in use follows the KV events of
    /// the workers of its role (new workers subscribed, removed ones forgotten).
    fn spawn_kv_upkeep(&self) {
        self.spawn_periodic(Duration::ZERO, KV_SYNC_INTERVAL, |st| async move {
            let router = st.router();
            let pd = st.pd_router();
            let mut jobs: Vec<(&Policy, WorkerType)> = vec![(router.policy(), WorkerType::Regular)];
            if let Some(pd) = &pd {
                let [p, d] = pd.policies();
                jobs.push((p, WorkerType::Prefill));
                jobs.push((d, WorkerType::Decode));
            }
            for (policy, role) in jobs {
                if let Some(kv) = policy.kv_aware() {
                    let workers: Vec<Arc<crate::workers::Worker>> = st
                        .registry()
                        .snapshot()
                        .iter()
                        .filter(|w| w.worker_type() == role)
                        .cloned()
                        .collect();
                    kv.sync(&workers, st.client()).await;
                }
            }
        });
    }

    /// Runs `job` after `first`, then every `every`, until the gateway is cancelled. The
    /// task holds the state weakly: a gateway shut down is released at once, whether or not
    /// the task has seen the cancellation yet.
    fn spawn_periodic<F, Fut>(&self, first: Duration, every: Duration, job: F)
    where
        F: Fn(AppState) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let weak = Arc::downgrade(&self.0);
        let cancel = self.cancel_token().clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                job(AppState(inner)).await;
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

    /// Starts Kubernetes service discovery when `--service-discovery` asks for it: fails
    /// when this binary lacks the `kubernetes` feature or no Kubernetes API can be
    /// configured (in-cluster service account, `KUBECONFIG`, `~/.kube/config`).
    pub async fn start_discovery(&self) -> anyhow::Result<()> {
        let cfg = &self.0.config;
        if let Some(problem) = cfg.discovery.feature_problem() {
            anyhow::bail!(problem);
        }
        #[cfg(feature = "kubernetes")]
        if cfg.discovery.enabled {
            crate::workers::k8s::spawn(
                &cfg.discovery,
                cfg.pd_disaggregation,
                Arc::downgrade(&self.0.manager),
                self.cancel_token().clone(),
            )
            .await?;
        }
        Ok(())
    }

    /// The configuration the process started with (what a reload changed is in force in
    /// the pieces it changed: [`AppState::applied_config`]).
    pub fn config(&self) -> &ServeConfig {
        &self.0.config
    }

    /// The keys in force (client, store, admin).
    pub fn auth(&self) -> &Auth {
        &self.0.auth
    }

    /// The worker control plane.
    pub fn workers(&self) -> &WorkerManager {
        &self.0.manager
    }

    /// The worker registry.
    pub fn registry(&self) -> &Arc<Registry> {
        self.0.manager.registry()
    }

    /// The regular-mode router in force.
    pub fn router(&self) -> Arc<RegularRouter> {
        self.0.router.load_full()
    }

    /// The PD router in force, in PD mode (`--pd-disaggregation`).
    pub fn pd_router(&self) -> Option<Arc<PdRouter>> {
        self.0.pd.as_ref().map(ArcSwap::load_full)
    }

    /// The pooled upstream client (for routers added beside the regular one).
    pub fn client(&self) -> &HttpClient {
        &self.0.client
    }

    /// Which worker holds each response (the Responses API).
    pub fn homes(&self) -> &Arc<ResponseHomes> {
        &self.0.homes
    }

    /// The tenants' admission gates.
    pub fn tenants(&self) -> &Tenants {
        &self.0.tenants
    }

    /// Admission control for inference requests, with the limits in force.
    pub fn admission(&self) -> Arc<Admission> {
        self.0.admission.load_full()
    }

    /// Where request ids are read from.
    pub fn request_ids(&self) -> &Arc<RequestIds> {
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

    /// The KV master this process hosts, alone or as one of an HA cluster (what
    /// `kv_aware` looks at, [`AppState::use_store`]).
    pub fn store(&self) -> Option<&Arc<dyn StoreSource>> {
        self.0.store.get()
    }

    /// How long ago the state was built.
    pub fn uptime(&self) -> Duration {
        self.0.started.elapsed()
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

/// The proxied inference routes' documentation: the front door's one entry serves them
/// ([`front::Entry`]), the router has no handler for them.
#[derive(OpenApi)]
#[openapi(paths(
    inference::chat_completions,
    inference::completions,
    inference::embeddings,
    inference::generate,
    tasks::rerank,
    tasks::v1_rerank,
    tasks::classify,
    tasks::score,
    tasks::tokenize,
    tasks::detokenize,
    tasks::create_response
))]
struct ProxiedRoutes;

/// The inference routes (client plane), before the key check and state are applied.
pub fn inference_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ProxiedRoutes::openapi())
        .routes(routes!(inference::models))
        .routes(routes!(inference::server_info))
        .routes(routes!(inference::model_info))
        .routes(routes!(fanout::health_generate))
        .routes(routes!(responses::get_response, responses::delete_response))
        .routes(routes!(responses::cancel_response))
        .routes(routes!(responses::input_items))
}

/// The open routes: health, readiness, metrics.
pub fn ops_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(ops::health))
        .routes(routes!(ops::liveness))
        .routes(routes!(ops::readiness))
        .routes(routes!(ops::metrics))
        .routes(routes!(console::page))
}

/// The worker API (admin plane), before the key check and state are applied.
pub fn admin_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(admin::list_workers, admin::create_worker))
        .routes(routes!(
            admin::get_worker,
            admin::update_worker,
            admin::delete_worker
        ))
        .routes(routes!(fanout::flush_cache))
        .routes(routes!(fanout::get_loads))
        .routes(routes!(fanout::engine_metrics))
        .routes(routes!(fanout::start_profile))
        .routes(routes!(fanout::stop_profile))
        .routes(routes!(console::cluster))
}

/// How a gateway route refuses a request: 401 or 403, OpenAI envelope.
pub fn gateway_rejection() -> Rejection {
    Rejection {
        respond: |r| GatewayError::Refused(r).into_response(),
        schema: "ErrorResponse",
    }
}

/// How often `kv_aware` policies look for new workers' KV events (and forget removed ones).
pub const KV_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// The complete gateway service.
pub fn app(state: AppState) -> Front {
    app_with(state, OpenApiRouter::new())
}

/// The gateway service plus `extra` routes (e.g. the KV master's REST API), served behind
/// the same front door and described in the same `/openapi.json`.
pub fn app_with(state: AppState, extra: OpenApiRouter) -> Front {
    Front::new(state.clone(), router(state, extra))
}

/// `--tokenizer-path` with `--chat-template`, loaded (none when not given).
fn load_tokenizer(cfg: &ServeConfig) -> anyhow::Result<Option<Arc<Tokenizer>>> {
    let t = Tokenizer::from_flags(
        cfg.tokenizer_path.as_deref(),
        cfg.chat_template.as_deref(),
        cfg.tokenizer_cache_size,
    )
    .map_err(|e| anyhow::anyhow!("tokenizer_path: {e}"))?;
    let kv_aware =
        [cfg.policy, cfg.prefill_policy(), cfg.decode_policy()].contains(&PolicyKind::KvAware);
    if t.is_some() && !kv_aware {
        tracing::warn!("tokenizer_path is used by the kv_aware policy only, and none is in use");
    }
    Ok(t)
}

/// The regular router and, in PD mode, the PD router for `cfg`'s policies.
fn routers(
    cfg: &ServeConfig,
    registry: &Arc<Registry>,
    dispatcher: &Dispatcher,
    retry: &RetryPolicy,
    tokenizer: &Option<Arc<Tokenizer>>,
) -> (RegularRouter, Option<PdRouter>) {
    let policy = |kind: PolicyKind| {
        Policy::with_configs(kind, KvAwareConfig::from(cfg))
            .with_tokenizer(tokenizer.clone())
            .with_routing(RoutingKey::from(cfg))
            .with_sticky(StickyConfig::from(cfg))
            .with_least_load(LeastLoad::from(cfg))
    };
    let pd = cfg.pd_disaggregation.then(|| {
        PdRouter::new(
            registry.clone(),
            [policy(cfg.prefill_policy()), policy(cfg.decode_policy())],
            dispatcher.clone(),
            retry.clone(),
            crate::proxy::pd::Bounds::from(cfg),
        )
    });
    let regular = RegularRouter::new(
        registry.clone(),
        policy(cfg.policy),
        dispatcher.clone(),
        retry.clone(),
    );
    (regular, pd)
}

/// The route table (every route, the docs, JSON 404/405 fallbacks), without the front door.
pub fn router(state: AppState, extra: OpenApiRouter) -> Router {
    build(state, extra).0
}

/// The route table and the OpenAPI document it serves.
pub fn build(state: AppState, extra: OpenApiRouter) -> (Router, utoipa::openapi::OpenApi) {
    let auth = state.auth().clone();
    let api = OpenApiRouter::with_openapi(GatewayApi::openapi())
        .merge(auth.guard(Plane::Client, inference_routes(), gateway_rejection()))
        .merge(ops_routes())
        .merge(auth.guard(Plane::Admin, admin_routes(), gateway_rejection()))
        .with_state(state)
        .merge(extra);
    let (router, doc) = crate::docs::documented(api, &auth);
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
