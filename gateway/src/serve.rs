//! `moongate serve`: bind, register the static workers, serve until Ctrl-C / SIGTERM, then
//! shut down gracefully (in-flight requests get `--shutdown-grace-period-secs`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::config::ServeConfig;
use crate::server::{self, AppState};

/// A running gateway (for `serve`, the demo and tests).
#[derive(Debug)]
pub struct Gateway {
    /// Where it listens.
    pub addr: SocketAddr,
    state: AppState,
    task: JoinHandle<std::io::Result<()>>,
    grace: Duration,
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

    /// Stops accepting, lets in-flight requests finish (up to the grace period), stops the
    /// health loops.
    pub async fn shutdown(self) {
        self.state.cancel_token().cancel();
        let mut task = self.task;
        if tokio::time::timeout(self.grace, &mut task).await.is_err() {
            tracing::warn!(
                grace_secs = self.grace.as_secs(),
                "in-flight requests cut at the end of the grace period"
            );
            task.abort();
        }
    }
}

/// Serves `cfg` on `listener` (its address wins over `cfg.host`/`cfg.port`) with the
/// static workers registered. Needs a tokio runtime.
pub async fn spawn(cfg: ServeConfig, listener: TcpListener) -> anyhow::Result<Gateway> {
    let grace = Duration::from_secs(cfg.shutdown_grace_period_secs);
    let state = AppState::new(cfg);
    state
        .add_static_workers()
        .context("registering --worker-urls")?;
    spawn_with(state, listener, grace).await
}

/// Serves an already-built state (for callers that mount extra routes themselves, use
/// [`server::app_with`] and their own listener instead).
pub async fn spawn_with(
    state: AppState,
    listener: TcpListener,
    grace: Duration,
) -> anyhow::Result<Gateway> {
    let addr = listener.local_addr()?;
    let app = server::app(state.clone());
    let stop = state.cancel_token().clone();
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    });
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
    })
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

/// `moongate serve`.
pub async fn run(cfg: ServeConfig) -> anyhow::Result<()> {
    let listener = TcpListener::bind((cfg.host.as_str(), cfg.port))
        .await
        .with_context(|| format!("binding {}:{}", cfg.host, cfg.port))?;
    let stop = shutdown_signal();
    let gw = spawn(cfg, listener).await?;
    tracing::info!(addr = %gw.addr, workers = gw.state().registry().list().len(), "moongate gateway listening");
    stop.await;
    tracing::info!("shutting down");
    gw.shutdown().await;
    Ok(())
}
