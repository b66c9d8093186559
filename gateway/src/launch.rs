//! `moongate serve`: bind, register the static workers, mount the KV master (unless
//! `--disable-master`; its store key is `--store-api-key` or derived from the transfer
//! secret), serve until Ctrl-C / SIGTERM, then shut down gracefully: stop accepting, let
//! in-flight requests finish for up to `--shutdown-grace-period-secs`, then cut the
//! connections still open (a stream that never ends cannot hold the process), and stop the
//! master's background task. SIGHUP reloads the configuration ([`crate::reload`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kvmaster::Master;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use utoipa_axum::router::OpenApiRouter;

use crate::auth::KeySet;
use crate::config::{ConfigError, ServeConfig};
use crate::listen::{ClientLimits, DeadlineBody, accept_loop, shutdown_signal};
use crate::master::HostedMaster;
use crate::select::kv_aware::follow::FollowedStore;
use crate::select::kv_aware::store::{KeyFormat, StoreSource};
use crate::server::{self, AppState};

/// A running gateway (for `serve`, the demo and tests).
#[derive(Debug)]
pub struct Gateway {
    /// Where it listens.
    pub addr: SocketAddr,
    state: AppState,
    task: JoinHandle<std::io::Result<()>>,
    grace: Duration,
    master_task: Option<JoinHandle<()>>,
    /// Where Mooncake's master HTTP service listens (`--mooncake-http-port`), if it does.
    pub mooncake_addr: Option<SocketAddr>,
    /// Where the store's KV events are published (`--master-kv-events-endpoint`, its port
    /// resolved), if they are.
    pub kv_events_endpoint: Option<String>,
}

impl Gateway {
    /// `http://addr`, or `https://addr` with TLS.
    pub fn url(&self) -> String {
        let tls = self.state.config().tls_cert_file.is_some();
        format!("{}://{}", crate::tls::scheme(tls), self.addr)
    }

    /// The shared state (registry, workers, config).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The hosted KV master (`None` with `--disable-master`).
    pub fn master(&self) -> Option<&Arc<Master>> {
        self.state.master()
    }

    /// Stops accepting, lets in-flight requests finish (up to the grace period, then cuts
    /// them), stops the health loops and the master's background task. Returns within the
    /// grace period (plus a moment).
    pub async fn shutdown(self) {
        self.state.cancel_token().cancel();
        let mut task = self.task;
        // The accept loop bounds its own wait by the grace period; this is a backstop.
        let backstop = self.grace + Duration::from_secs(5);
        if tokio::time::timeout(backstop, &mut task).await.is_err() {
            tracing::error!("the accept loop did not stop; aborting it");
            task.abort();
        }
        if let Some(background) = self.master_task {
            // It stops at the token; a tick in progress finishes first.
            if let Err(e) = background.await {
                tracing::warn!(error = %e, "KV master background task failed");
            }
        }
    }
}

/// Serves `cfg` on `listener` (its address wins over `cfg.host`/`cfg.port`) with the
/// static workers registered and the KV master mounted (unless `cfg.disable_master`).
/// Needs a tokio runtime.
pub async fn spawn(cfg: ServeConfig, listener: TcpListener) -> anyhow::Result<Gateway> {
    let state = AppState::new(cfg)?;
    state
        .add_static_workers()
        .context("registering --worker-urls")?;
    let hosted = hosted_master(state.config())?;
    if hosted.is_some() {
        let store = state.config().store_key()?;
        state.auth().update(|s| s.store = Some(store));
    }
    let extra = master_routes(&state, hosted.as_ref());
    if let Some(h) = hosted.as_ref().filter(|h| !h.is_ha()) {
        // Alone, `/metrics` refreshes its gauges; an HA leader's tick does that instead.
        state.host_master(h.master().clone());
    }
    use_store(&state, hosted.as_ref())?;
    // Last before serving: its watch tasks stop with the gateway's token, which a failure
    // from here on cancels.
    let cancel = state.cancel_token().clone();
    let started = async {
        state
            .start_discovery()
            .await
            .context("Kubernetes service discovery")?;
        crate::auth::spawn_open_admin_warning(state.auth(), cancel.clone());
        spawn_with(state, extra, listener).await
    };
    let mut gw = match started.await {
        Ok(gw) => gw,
        Err(e) => {
            cancel.cancel();
            return Err(e);
        }
    };
    if let Some(h) = hosted {
        let cfg = gw.state.config();
        if let Some(port) = cfg.mooncake_http_port {
            let at = (cfg.mooncake_http_host.as_str(), port);
            let stop = gw.state.cancel_token().clone();
            let limits = ClientLimits::from(cfg);
            let spawned =
                crate::master::mooncake::spawn(&h, gw.state.auth(), at, stop, gw.grace, limits);
            match spawned.await {
                Ok((addr, _task)) => gw.mooncake_addr = Some(addr),
                Err(e) => {
                    gw.state.cancel_token().cancel();
                    return Err(e);
                }
            }
        }
        if let Some(at) = cfg.master.kv_events_endpoint.clone() {
            let keys = KeyFormat::new(&cfg.kv_l3_key_format);
            let stop = gw.state.cancel_token().clone();
            match crate::master::kv_events::spawn(&h, &at, keys, stop).await {
                Ok((bound, _task)) => gw.kv_events_endpoint = Some(bound),
                Err(e) => {
                    gw.state.cancel_token().cancel();
                    return Err(e);
                }
            }
        }
        gw.master_task = Some(h.spawn_background(gw.state.cancel_token().clone()));
    }
    Ok(gw)
}

/// The master `cfg` asks to host, if any.
fn hosted_master(cfg: &ServeConfig) -> anyhow::Result<Option<HostedMaster>> {
    if cfg.disable_master {
        return Ok(None);
    }
    let hosted = HostedMaster::new(cfg.master.clone(), &cfg.ha).context("KV master settings")?;
    Ok(Some(hosted))
}

/// Shows `kv_aware` the store: the hosted master's, and, without one answering here (an
/// HA member that follows, `--kv-l3-master-url`), the view a task keeps of the master
/// that answers ([`FollowedStore`]).
fn use_store(state: &AppState, hosted: Option<&HostedMaster>) -> anyhow::Result<()> {
    let cfg = state.config();
    let follows = cfg.kv_l3_master_url.is_some() || hosted.is_some_and(HostedMaster::is_ha);
    let hosted: Option<Arc<dyn StoreSource>> = hosted.map(|h| Arc::new(h.clone()) as _);
    if !follows || cfg.kv_l3_page_value <= 0.0 {
        if let Some(h) = hosted {
            state.use_store(h);
        }
        return Ok(());
    }
    let store = Arc::new(FollowedStore::new(hosted, cfg.kv_l3_master_url.clone()));
    let key = cfg
        .store_secret()
        .context("the store key, to follow the KV master's events")?;
    tokio::spawn(store.clone().run(
        state.client().clone(),
        KeyFormat::new(&cfg.kv_l3_key_format),
        key,
        state.cancel_token().clone(),
    ));
    state.use_store(store);
    Ok(())
}

/// The hosted master's routes behind the store and admin keys (none without a master).
fn master_routes(state: &AppState, hosted: Option<&HostedMaster>) -> OpenApiRouter {
    hosted.map_or_else(OpenApiRouter::new, |h| h.routes(state.auth()))
}

/// The OpenAPI document `moongate serve` with `cfg` serves at `/api-docs/openapi.json`
/// (built the way [`spawn`] builds the server, without listening, and without reading the
/// transfer secret: the document says a store key is needed, not which). Needs a tokio
/// runtime.
pub fn document(cfg: ServeConfig) -> anyhow::Result<utoipa::openapi::OpenApi> {
    let hosted = hosted_master(&cfg)?;
    let state = AppState::new(cfg)?;
    if hosted.is_some() {
        state.auth().update(|s| {
            s.store.get_or_insert_with(KeySet::unresolved);
        });
    }
    let extra = master_routes(&state, hosted.as_ref());
    Ok(server::build(state, extra).1)
}

/// Serves an already-built state plus `extra` routes (e.g. the KV master's REST API, mounted
/// behind the same front door and in the same `/openapi.json`).
pub async fn spawn_with(
    state: AppState,
    extra: OpenApiRouter,
    listener: TcpListener,
) -> anyhow::Result<Gateway> {
    let grace = Duration::from_secs(state.config().shutdown_grace_period_secs);
    let addr = listener.local_addr()?;
    let cfg = state.config();
    let tls = crate::tls::acceptor(cfg.tls_cert_file.as_deref(), cfg.tls_key_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    let app = server::app_with(state.clone(), extra);
    let task = tokio::spawn(accept_loop(
        listener,
        tls,
        app,
        state.cancel_token().clone(),
        grace,
        ClientLimits::from(state.config()),
    ));
    if let Some(port) = state.config().prometheus_port {
        let host = state.config().prometheus_host.clone();
        let metrics_listener = TcpListener::bind((host.as_str(), port))
            .await
            .with_context(|| format!("binding the Prometheus listener {host}:{port}"))?;
        let metrics_app = axum::Router::new()
            .route("/metrics", axum::routing::get(server::ops::metrics))
            .with_state(state.clone());
        let svc =
            tower::ServiceExt::<http::Request<DeadlineBody<hyper::body::Incoming>>>::boxed_clone(
                metrics_app,
            );
        tokio::spawn(accept_loop(
            metrics_listener,
            None,
            svc,
            state.cancel_token().clone(),
            grace,
            ClientLimits::from(state.config()),
        ));
    }
    Ok(Gateway {
        addr,
        state,
        task,
        grace,
        master_task: None,
        mooncake_addr: None,
        kv_events_endpoint: None,
    })
}

/// `moongate serve`: serve `cfg` until Ctrl-C / SIGTERM. On SIGHUP, `reread` (when given)
/// reads the configuration again (the same file, environment and flags) and what can change
/// at run time is applied ([`crate::reload`]).
pub async fn run(
    cfg: ServeConfig,
    reread: Option<Box<dyn Fn() -> Result<ServeConfig, ConfigError> + Send + Sync>>,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind((cfg.host.as_str(), cfg.port))
        .await
        .with_context(|| format!("binding {}:{}", cfg.host, cfg.port))?;
    let stop = shutdown_signal();
    let gw = spawn(cfg, listener).await?;
    if let Some(reread) = reread {
        crate::reload::spawn_on_sighup(gw.state().clone(), reread)?;
    }
    let auth = gw.state().auth().settings();
    tracing::info!(addr = %gw.addr, workers = gw.state().registry().list().len(),
        master = gw.master().is_some(), admin_key = auth.admin.is_some(),
        open_admin = auth.admin_is_open(), client_keys = auth.client.as_ref().map_or(0, KeySet::len),
        "moongate gateway listening");
    drop(auth);
    stop.await;
    tracing::info!("shutting down");
    gw.shutdown().await;
    Ok(())
}
