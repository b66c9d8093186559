//! A simulated SGLang worker (`moongate sim-worker`): the endpoints and response shapes of
//! an SGLang server, with a deterministic stand-in for the model, so the gateway can be
//! run, tested and benchmarked without GPUs.
//!
//! Endpoints: `/health`, `/health_generate`, `/get_server_info` (`/server_info`),
//! `/get_model_info` (`/model_info`), `/v1/models`, `/v1/models/{model}`, `/generate`,
//! `/v1/chat/completions`, `/v1/completions`, `/flush_cache`, `/get_load`, `/v1/loads`.
//! Streaming and not, usage counts, finish reasons (`length` at the token limit, `stop` at
//! a stop string, stop token or the model's end-of-sequence after `output_tokens` words),
//! `n > 1`, batch `/generate`, logprobs, `rid`. Output text is a deterministic function of the prompt
//! (see [`model`]); the first token comes after `ttft` and each further one `tpot` later.
//! Bad input answers 400 in SGLang's error shapes, never a panic.
//!
//! # Layout
//! - [`config`]: [`SimConfig`], every default in one place.
//! - [`model`]: the deterministic tokenizer, word generator and logprobs.
//! - [`engine`]: running one sequence to its limit, stop or end-of-sequence.
//! - [`job`]: prompt accounting and running every sequence of a request.
//! - [`chat`], [`completions`], [`generate`]: the three generation APIs.
//! - [`info`]: health, server / model info, models, load, cache flush.
//! - [`stream`]: pacing on tokio's clock and the server-sent-events body.
//! - [`state`]: shared state: config, requests in flight, request ids.
//! - [`serve`]: the HTTP/1.1 accept loop and its bounded graceful shutdown.
//! - [`error`]: errors in SGLang's shapes.

pub mod chat;
pub mod completions;
pub mod config;
pub mod engine;
pub mod error;
pub mod generate;
pub mod info;
pub mod job;
pub mod model;
pub mod serve;
pub mod state;
pub mod stream;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{SimConfig, SimMode};

/// How long a graceful shutdown waits for open streams before it cuts them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The worker's routes, for `cfg`.
pub fn router(cfg: SimConfig) -> Router {
    let limit = cfg.max_body_bytes;
    let st = state::SimState::new(cfg);
    Router::new()
        .route("/health", get(info::health))
        .route("/health_generate", get(info::health))
        .route("/get_server_info", get(info::server_info))
        .route("/server_info", get(info::server_info))
        .route("/get_model_info", get(info::model_info))
        .route("/model_info", get(info::model_info))
        .route("/v1/models", get(info::models))
        .route("/v1/models/{*model}", get(info::model))
        .route(
            "/generate",
            post(generate::generate).put(generate::generate),
        )
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route(
            "/flush_cache",
            get(info::flush_cache).post(info::flush_cache),
        )
        .route("/get_load", get(info::get_load))
        .route("/v1/loads", get(info::loads))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(st)
}

/// A running simulated worker. Dropping it cuts the worker at once;
/// [`SimHandle::shutdown`] drains it first.
#[derive(Debug)]
pub struct SimHandle {
    /// The address it listens on.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<Duration>>,
    task: JoinHandle<()>,
}

impl SimHandle {
    /// `http://ip:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting connections, lets open requests finish for up to
    /// [`SHUTDOWN_GRACE`], then cuts what is left.
    pub async fn shutdown(self) {
        self.shutdown_within(SHUTDOWN_GRACE).await;
    }

    /// [`shutdown`](Self::shutdown) with a grace period of `grace`.
    pub async fn shutdown_within(mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(grace);
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves a worker configured by `cfg` on `listener` in a background task. The listener's
/// address replaces `cfg.host` / `cfg.port` (what `/get_server_info` reports).
pub async fn spawn(mut cfg: SimConfig, listener: TcpListener) -> std::io::Result<SimHandle> {
    let addr = listener.local_addr()?;
    cfg.host = addr.ip().to_string();
    cfg.port = addr.port();
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(serve::serve(listener, router(cfg), stopped));
    Ok(SimHandle {
        addr,
        stop: Some(stop),
        task,
    })
}

/// `moongate sim-worker`: binds `cfg.host:cfg.port` and serves until Ctrl-C or SIGTERM.
pub async fn run(cfg: SimConfig) -> anyhow::Result<()> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    let bind = (cfg.host.clone(), cfg.port);
    let listener = TcpListener::bind(&bind)
        .await
        .with_context(|| format!("binding {}:{}", bind.0, bind.1))?;
    let (model, mode) = (cfg.model.clone(), cfg.mode);
    let handle = spawn(cfg, listener).await?;
    let stop = crate::serve::shutdown_signal();
    tracing::info!(url = %handle.url(), %model, ?mode, "simulated SGLang worker ready");
    stop.await;
    tracing::info!("shutting down");
    handle.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}
