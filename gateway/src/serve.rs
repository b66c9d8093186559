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
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use kvstore::Master;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;

use crate::auth::KeySet;
use crate::config::{ConfigError, ServeConfig};
use crate::hosting::HostedMaster;
use crate::server::{self, AppState, Front};

/// A running gateway (for `serve`, the demo and tests).
#[derive(Debug)]
pub struct Gateway {
    /// Where it listens.
    pub addr: SocketAddr,
    state: AppState,
    task: JoinHandle<std::io::Result<()>>,
    grace: Duration,
    master_task: Option<JoinHandle<()>>,
}

impl Gateway {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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
    if let Some(h) = &hosted {
        state.host_master(h.master().clone());
    }
    crate::auth::spawn_open_admin_warning(state.auth(), state.cancel_token().clone());
    let mut gw = spawn_with(state, extra, listener).await?;
    if let Some(h) = hosted {
        gw.master_task = Some(h.spawn_background(gw.state.cancel_token().clone()));
    }
    Ok(gw)
}

/// The master `cfg` asks to host, if any.
fn hosted_master(cfg: &ServeConfig) -> anyhow::Result<Option<HostedMaster>> {
    if cfg.disable_master {
        return Ok(None);
    }
    let hosted = HostedMaster::new(cfg.master.clone()).context("KV master settings")?;
    Ok(Some(hosted))
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
    let app = server::app_with(state.clone(), extra);
    let task = tokio::spawn(accept_loop(
        listener,
        app,
        state.cancel_token().clone(),
        grace,
    ));
    if let Some(port) = state.config().prometheus_port {
        let host = state.config().prometheus_host.clone();
        let metrics_listener = TcpListener::bind((host.as_str(), port))
            .await
            .with_context(|| format!("binding the Prometheus listener {host}:{port}"))?;
        let st = state.clone();
        let metrics_app = axum::Router::new()
            .route("/metrics", axum::routing::get(server::ops::metrics))
            .with_state(st.clone());
        tokio::spawn(async move {
            axum::serve(metrics_listener, metrics_app)
                .with_graceful_shutdown(st.cancel_token().clone().cancelled_owned())
                .await
        });
    }
    Ok(Gateway {
        addr,
        state,
        task,
        grace,
        master_task: None,
    })
}

/// Serves `svc` on `listener` (HTTP/1.1 keep-alive, or HTTP/2 with prior knowledge;
/// TCP_NODELAY on every connection) until `stop` fires; then stops accepting, asks every
/// connection to finish its current request and close, waits up to `grace` for that, and
/// aborts the connections still open. Connection tasks live in a [`JoinSet`], so none
/// outlives this function.
pub async fn accept_loop(
    listener: TcpListener,
    svc: Front,
    stop: CancellationToken,
    grace: Duration,
) -> std::io::Result<()> {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            // Reap finished connections so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let _ = tcp.set_nodelay(true);
        let conn = builder
            .serve_connection(
                TokioIo::new(tcp),
                TowerToHyperService::new(svc.for_peer(peer)),
            )
            .into_owned();
        let conn = graceful.watch(conn);
        conns.spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection closed with an error");
            }
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(grace, async {
        graceful.shutdown().await;
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = conns.len(),
            grace_secs = grace.as_secs(),
            "in-flight requests cut at the end of the grace period"
        );
        conns.shutdown().await;
    }
    Ok(())
}

/// A future that resolves when the process is asked to stop (Ctrl-C / SIGINT, or SIGTERM on
/// Unix). The handlers are installed when this is called, not when the future is first
/// polled, so call it before announcing readiness. Needs a tokio runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        let int = signal(SignalKind::interrupt()).ok();
        let term = signal(SignalKind::terminate()).ok();
        let recv = |s: Option<Signal>| async move {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        async move {
            tokio::select! {
                _ = recv(int) => {}
                _ = recv(term) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
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
