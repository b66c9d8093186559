//! The KV master hosted by this process: `moongate serve` mounts it next to the gateway's
//! routes (unless `--disable-master`), `moongate master` serves it alone.
//!
//! Either way the same pieces are used: [`HostedMaster`] builds the master from
//! [`kvmaster::MasterConfig`], hands out its REST routes, the store plane behind the store
//! key and the admin plane behind the admin key ([`HostedMaster::routes`]; refusals in the
//! master's error envelope, see `crate::auth`), and runs its background task (client TTL
//! sweep, zombie puts, eviction, gauges) until shutdown. Its metrics go to the process's one
//! Prometheus recorder and are served at `/metrics`.
//!
//! `moongate master` ([`spawn_master`], [`run_master`]) adds `/health`, `/metrics`, the
//! OpenAPI document and Swagger UI, and serves it all with `moongate serve`'s accept loop
//! ([`crate::listen::accept_loop`]: the same client limits, graceful shutdown, TLS with
//! `--tls-cert-file`).
//!
//! Either command serves Mooncake's master HTTP service on `--mooncake-http-port`
//! ([`mooncake`]), and publishes the store's object events on ZMQ in SGLang's KV-event
//! format on `--master-kv-events-endpoint` ([`kv_events`]).

pub mod kv_events;
pub mod mooncake;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Json;
use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use hyper::body::Incoming;
use kvmaster::{Master, MasterConfig};
use openapi::master::MasterError;
use openapi::master::MasterHealth;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa::openapi::OpenApi as Document;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::select::kv_aware::store::KeyFormat;

use crate::auth::{Auth, KeySet, Plane, Refusal, Rejection};
use crate::config::MasterHostConfig;
use crate::docs;
use crate::error::GatewayError;
use crate::listen::{ClientLimits, DeadlineBody};
use tower::ServiceExt;

/// A master this process hosts: alone, or as one master of an HA cluster on etcd
/// (`--ha`, cargo feature `etcd`), where the routes answer for the cluster's leader.
#[derive(Debug, Clone)]
pub struct HostedMaster {
    /// Alone: the master. With HA: only the shape of the routes (documentation); the
    /// leader's master is [`HostedMaster::current`].
    master: Arc<Master>,
    #[cfg(feature = "etcd")]
    ha: Option<kvmaster::ha::HaNode>,
}

impl HostedMaster {
    /// Builds the master from `config` (validated again here), as one of the HA cluster
    /// `ha` names when it is enabled, and registers its metrics on the process's
    /// Prometheus recorder. Starts nothing: [`HostedMaster::spawn_background`] does.
    pub fn new(config: MasterConfig, ha: &kvmaster::HaConfig) -> Result<Self, MasterError> {
        crate::metrics::install();
        kvmaster::metrics::describe();
        let mut problems = ha.problems();
        problems.extend(ha.feature_problem());
        if !problems.is_empty() {
            return Err(MasterError::InvalidParams(problems.join("; ")));
        }
        let master = Arc::new(Master::new(config.clone())?);
        #[cfg(feature = "etcd")]
        let ha = match ha.enabled {
            true => Some(kvmaster::ha::HaNode::new(ha.clone(), config)?),
            false => None,
        };
        let hosted = Self {
            master,
            #[cfg(feature = "etcd")]
            ha,
        };
        if !hosted.is_ha() {
            kvmaster::publish_gauges(&hosted.master);
        }
        Ok(hosted)
    }

    /// Whether this is one master of an HA cluster.
    pub fn is_ha(&self) -> bool {
        #[cfg(feature = "etcd")]
        return self.ha.is_some();
        #[cfg(not(feature = "etcd"))]
        false
    }

    /// The master serving now: the one alone, or this HA master's while it leads.
    pub fn current(&self) -> Option<Arc<Master>> {
        #[cfg(feature = "etcd")]
        if let Some(node) = &self.ha {
            return node.leader_master();
        }
        Some(self.master.clone())
    }

    /// Whether master calls get an answer here: alone, always; with HA, while this master
    /// leads or follows a known leader (a candidate answers 503).
    pub fn answers(&self) -> bool {
        #[cfg(feature = "etcd")]
        if let Some(node) = &self.ha {
            let status = node.status();
            return match status.role {
                // A leader whose lease lapsed answers 503 until it steps down.
                kvmaster::ha::Role::Leader => node.leader_master().is_some(),
                kvmaster::ha::Role::Follower => status.leader_url.is_some(),
                kvmaster::ha::Role::Candidate => false,
            };
        }
        true
    }

    /// This master alone (with HA: the documentation-only one; see [`HostedMaster::current`]).
    pub fn master(&self) -> &Arc<Master> {
        &self.master
    }

    /// The HA node, when this master is one of a cluster.
    #[cfg(feature = "etcd")]
    pub fn ha(&self) -> Option<&kvmaster::ha::HaNode> {
        self.ha.as_ref()
    }

    /// The master's REST API (`/api/v1/...`, `/metadata`): the store plane and the admin
    /// plane, each behind its key in `auth`, `GET /api/v1/ha` on the store plane. With HA,
    /// answered by the cluster's leader (a follower redirects there, a candidate answers
    /// 503), but for `/api/v1/ha`, which every master answers itself.
    pub fn routes(&self, auth: &Auth) -> OpenApiRouter {
        let store = kvmaster::rest::store_router(self.master.clone());
        let admin = kvmaster::rest::admin_router(self.master.clone());
        #[cfg(feature = "etcd")]
        let (store, admin, status) = match &self.ha {
            Some(node) => (
                kvmaster::ha::gated(store, node),
                kvmaster::ha::gated(admin, node),
                kvmaster::ha::status_router(node),
            ),
            None => (store, admin, kvmaster::ha::standalone_router()),
        };
        #[cfg(not(feature = "etcd"))]
        let status = kvmaster::ha::standalone_router();
        // `/api/v1/ha` is answered by every master itself (never forwarded to the leader).
        auth.guard(Plane::Store, store.merge(status), master_rejection())
            .merge(auth.guard(Plane::Admin, admin, master_rejection()))
    }

    /// Runs the background task (alone: the tick; with HA: following, campaigning and
    /// leading, the leader's tick included) until `stop` is cancelled.
    pub fn spawn_background(&self, stop: CancellationToken) -> JoinHandle<()> {
        #[cfg(feature = "etcd")]
        if let Some(node) = &self.ha {
            return node.spawn(stop);
        }
        tokio::spawn(kvmaster::run_background(
            self.master.clone(),
            stop.cancelled_owned(),
        ))
    }
}

/// How a master route refuses a request: 401 `UNAUTHORIZED` (key missing or wrong), 403
/// `FORBIDDEN` (admin plane, no admin key, caller not on loopback).
pub(crate) fn master_rejection() -> Rejection {
    Rejection {
        respond: |refusal| {
            let e = match refusal {
                Refusal::Unauthorized(_) => MasterError::Unauthorized(refusal.message()),
                Refusal::NotLoopback => MasterError::Forbidden(refusal.message()),
            };
            kvmaster::rest::ApiError(e).into_response()
        },
        schema: "MasterErrorResponse",
    }
}

/// The document of `moongate master` (info; paths come from the routes).
#[derive(OpenApi)]
#[openapi(info(
    title = "Moongate KV master",
    description = "The KV-cache master (Mooncake Store semantics) served alone: segments, \
                   objects, replicas, leases, eviction, and the transfer-metadata store.",
    license(name = "Apache-2.0")
))]
struct MasterAloneApi;

impl crate::select::kv_aware::store::StoreSource for HostedMaster {
    fn master(&self) -> Option<Arc<Master>> {
        self.current()
    }

    fn role(&self) -> (&'static str, Option<String>) {
        #[cfg(feature = "etcd")]
        if let Some(node) = &self.ha {
            let s = node.status();
            return (s.role.as_str(), s.leader_url);
        }
        ("alone", None)
    }
}

/// `moongate master`'s routes and the document it serves: the master behind `auth`'s keys,
/// `/health`, `/metrics`, the docs; unknown routes get a JSON 404.
pub fn master_app(hosted: &HostedMaster, auth: &Auth) -> (Router, Document) {
    let own = OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(liveness))
        .routes(routes!(readiness))
        .routes(routes!(metrics))
        .with_state(hosted.clone());
    let api = OpenApiRouter::with_openapi(MasterAloneApi::openapi())
        .merge(hosted.routes(auth))
        .merge(own);
    let (router, doc) = docs::documented(api, auth);
    // Each master call in its span: continuing the caller's trace when traces are on.
    let traced = tower_http::trace::TraceLayer::new_for_http()
        .make_span_with(crate::server::front::RequestSpan)
        .on_request(())
        .on_response(())
        .on_body_chunk(())
        .on_eos(())
        .on_failure(());
    (router.fallback(not_found).layer(traced), doc)
}

async fn not_found(req: Request) -> Response {
    GatewayError::RouteNotFound(format!("{} {}", req.method(), req.uri().path())).into_response()
}

/// The process is up.
#[utoipa::path(get, operation_id = openapi::routes::master_ops::Health::OPERATION_ID,
    path = openapi::routes::master_ops::Health::PATH, tag = "ops",
    responses((status = 200, description = "Alive", body = MasterHealth)))]
async fn health() -> Json<MasterHealth> {
    Json(MasterHealth {
        status: "alive".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

/// The process is up (the liveness probe; the same answer as `/health`).
#[utoipa::path(get, operation_id = openapi::routes::master_ops::Liveness::OPERATION_ID,
    path = openapi::routes::master_ops::Liveness::PATH, tag = "ops",
    responses((status = 200, description = "Alive", body = MasterHealth)))]
async fn liveness() -> Json<MasterHealth> {
    health().await
}

/// Whether this master answers master calls (the readiness probe): alone, always; in an HA
/// cluster, while it leads or follows a known leader (it redirects there), not while there
/// is no leader (every call would get 503).
#[utoipa::path(get, operation_id = openapi::routes::master_ops::Readiness::OPERATION_ID,
    path = openapi::routes::master_ops::Readiness::PATH, tag = "ops",
    responses((status = 200, description = "Serving or redirecting", body = MasterHealth),
              (status = 503, description = "No leader known yet", body = MasterHealth)))]
async fn readiness(State(hosted): State<HostedMaster>) -> Response {
    let (code, status) = match hosted.answers() {
        true => (StatusCode::OK, "ready"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "no_leader"),
    };
    let body = MasterHealth {
        status: status.into(),
        version: env!("CARGO_PKG_VERSION").into(),
    };
    (code, Json(body)).into_response()
}

/// Prometheus text exposition (`moongate_master_*`), gauges refreshed first.
#[utoipa::path(get, operation_id = openapi::routes::master_ops::Metrics::OPERATION_ID,
    path = openapi::routes::master_ops::Metrics::PATH, tag = "ops",
    responses((status = 200, description = "Prometheus metrics", content_type = "text/plain")))]
async fn metrics(State(hosted): State<HostedMaster>) -> Response {
    if let Some(master) = hosted.current() {
        kvmaster::publish_gauges(&master);
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        crate::metrics::install().render(),
    )
        .into_response()
}

/// The OpenAPI document `moongate master` with `cfg` serves at `/api-docs/openapi.json`
/// (the store key is not read: the document only says that one is required).
pub fn document(cfg: MasterHostConfig) -> anyhow::Result<Document> {
    let hosted = HostedMaster::new(cfg.master.clone(), &cfg.ha).context("KV master settings")?;
    let auth = Auth::new(cfg.auth_settings(KeySet::unresolved()));
    Ok(master_app(&hosted, &auth).1)
}

/// A running `moongate master`.
#[derive(Debug)]
pub struct MasterProcess {
    addr: std::net::SocketAddr,
    mooncake_addr: Option<std::net::SocketAddr>,
    kv_events_endpoint: Option<String>,
    mooncake: Option<JoinHandle<std::io::Result<()>>>,
    tls: bool,
    master: Arc<Master>,
    stop: CancellationToken,
    serving: JoinHandle<std::io::Result<()>>,
    background: JoinHandle<()>,
    grace: Duration,
    auth: Auth,
}

impl MasterProcess {
    /// `http://addr`, or `https://addr` with TLS.
    pub fn url(&self) -> String {
        format!("{}://{}", crate::tls::scheme(self.tls), self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Where the store's KV events are published (`--master-kv-events-endpoint`, its port
    /// resolved), if they are.
    pub fn kv_events_endpoint(&self) -> Option<&str> {
        self.kv_events_endpoint.as_deref()
    }

    /// Where Mooncake's master HTTP service listens (`--mooncake-http-port`), if it does.
    pub fn mooncake_addr(&self) -> Option<std::net::SocketAddr> {
        self.mooncake_addr
    }

    /// The master itself.
    pub fn master(&self) -> &Arc<Master> {
        &self.master
    }

    /// The keys in force.
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    /// Stops accepting, lets requests in flight finish (up to the grace period, then cuts
    /// them), stops the background task.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let mut serving = self.serving;
        // The accept loop bounds its own wait by the grace period; this is a backstop.
        let backstop = self.grace + Duration::from_secs(5);
        if tokio::time::timeout(backstop, &mut serving).await.is_err() {
            tracing::error!("the master's accept loop did not stop; aborting it");
            serving.abort();
        }
        if let Some(mut task) = self.mooncake
            && tokio::time::timeout(backstop, &mut task).await.is_err()
        {
            task.abort();
        }
        if let Err(e) = self.background.await {
            tracing::warn!(error = %e, "KV master background task failed");
        }
    }
}

/// Serves `cfg` on `listener` (its address wins over `cfg.host`/`cfg.port`), over TLS when
/// `cfg` names a certificate and key, with the same accept loop and client limits
/// ([`crate::listen`]) as `moongate serve`. Needs a tokio runtime.
pub async fn spawn_master(
    cfg: MasterHostConfig,
    listener: TcpListener,
) -> anyhow::Result<MasterProcess> {
    let hosted = HostedMaster::new(cfg.master.clone(), &cfg.ha).context("KV master settings")?;
    let auth = Auth::new(cfg.auth_settings(cfg.store_key()?));
    let tls = crate::tls::acceptor(cfg.tls_cert_file.as_deref(), cfg.tls_key_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    let (app, _) = master_app(&hosted, &auth);
    let addr = listener.local_addr().context("the master's listener")?;
    let grace = Duration::from_secs(cfg.shutdown_grace_period_secs);
    let stop = CancellationToken::new();
    let background = hosted.spawn_background(stop.clone());
    crate::auth::spawn_open_admin_warning(&auth, stop.clone());
    let (mooncake_addr, mooncake) = match cfg.mooncake_http_port {
        Some(port) => {
            let at = (cfg.mooncake_http_host.as_str(), port);
            let limits = ClientLimits::from(&cfg);
            let (a, t) = mooncake::spawn(&hosted, &auth, at, stop.clone(), grace, limits).await?;
            (Some(a), Some(t))
        }
        None => (None, None),
    };
    let kv_events_endpoint = match &cfg.master.kv_events_endpoint {
        Some(at) => {
            let keys = KeyFormat::new(&cfg.kv_l3_key_format);
            Some(kv_events::spawn(&hosted, at, keys, stop.clone()).await?.0)
        }
        None => None,
    };
    let svc = ServiceExt::<Request<DeadlineBody<Incoming>>>::boxed_clone(app);
    let serving = tokio::spawn(crate::listen::accept_loop(
        listener,
        tls.clone(),
        svc,
        stop.clone(),
        grace,
        ClientLimits::from(&cfg),
    ));
    tracing::info!(%addr, "KV master serving");
    Ok(MasterProcess {
        addr,
        mooncake_addr,
        kv_events_endpoint,
        mooncake,
        tls: tls.is_some(),
        master: hosted.master,
        stop,
        serving,
        background,
        grace,
        auth,
    })
}

/// `moongate master`: serve until Ctrl-C / SIGTERM, then shut down gracefully.
pub async fn run_master(cfg: MasterHostConfig) -> anyhow::Result<()> {
    let listener = TcpListener::bind((cfg.host.as_str(), cfg.port))
        .await
        .with_context(|| format!("binding {}:{}", cfg.host, cfg.port))?;
    let stop = crate::listen::shutdown_signal();
    let process = spawn_master(cfg, listener).await?;
    let s = process.auth().settings();
    tracing::info!(addr = %process.addr(), url = %process.url(), admin_key = s.admin.is_some(),
        open_admin = s.admin_is_open(), "moongate master listening");
    drop(s);
    stop.await;
    tracing::info!("shutting down");
    process.shutdown().await;
    Ok(())
}
