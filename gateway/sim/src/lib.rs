//! A simulated SGLang worker (`moongate sim-worker`): the endpoints and response shapes of
//! an SGLang server, with a deterministic stand-in for the model, so the gateway can be
//! run, tested and benchmarked without GPUs.
//!
//! Endpoints: `/health`, `/health_generate`, `/get_server_info` (`/server_info`),
//! `/get_model_info` (`/model_info`), `/v1/models`, `/v1/models/{model}`, `/generate`,
//! `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/rerank`,
//! `/v1/classify`, `/v1/score`, `/v1/tokenize`, `/v1/detokenize`, `/v1/responses` (and a
//! response's `GET`, `DELETE`, `cancel`, `input_items`), `/flush_cache`,
//! `/get_load`, `/v1/loads`, `/metrics`, `/start_profile`, `/stop_profile` (and
//! `/sim/profile`, what it profiles).
//! Streaming and not, usage counts, finish reasons (`length` at the token limit, `stop` at
//! a stop string, stop token or the model's end-of-sequence after `output_tokens` words),
//! `n > 1`, batch `/generate`, logprobs, `rid`, data-parallel ranks (`--dp-size`, picked by
//! `data_parallel_rank`). Output text is a deterministic function of the prompt
//! (see [`model`]); the first token comes after `ttft` and each further one `tpot` later.
//! Bad input answers 400 in SGLang's error shapes, never a panic.
//!
//! With `--mode prefill` or `--mode decode` the worker takes part in PD disaggregation
//! ([`pd`]): requests must carry SGLang's bootstrap fields, a prefill computes the prompt's
//! KV and writes it into the decode's memory with Moongate's transfer engine (its answer
//! is one token), and the decode checks every page before it generates. `GET /sim/kv`
//! shows the pool and the moves so far.
//!
//! Around the worker, this crate runs it with gateways: [`demo`] (`moongate demo`) and
//! [`bench`](mod@bench) (`moongate bench-routing`, a Mooncake trace replayed through gateways
//! and simulated workers, per policy).
//!
//! # Layout
//! - [`config`]: [`SimConfig`], every default in one place.
//! - [`serve`]: the HTTP/1.1 accept loop and its bounded graceful shutdown.
//! - [`state`]: shared state: config, data-parallel ranks, request ids.
//! - [`rank`]: one data-parallel rank (`--dp-size`): its prefix cache, events, prefill
//!   lane and requests in flight.
//! - [`outbox`]: when a rank's KV events leave (once the prefill that made the pages has
//!   run, as SGLang publishes them).
//! - [`chat`], [`completions`], [`generate`]: the three generation APIs.
//! - [`embeddings`]: `/v1/embeddings`, as an embedding model answers it.
//! - [`pooling`]: rerank, classify, score, tokenize and detokenize.
//! - [`responses`]: the Responses API, its responses kept in this worker's memory
//!   ([`response_store`]).
//! - [`info`]: health, server / model info, models, load, cache flush.
//! - [`job`]: prompt accounting and running every sequence of a request.
//! - [`prefix`]: the prefix cache (a radix tree over KV pages, bounded, LRU) and its events.
//! - [`l3`]: its storage tier on Moongate's store (`--kv-store`), as SGLang HiCache's.
//! - [`engine`]: running one sequence to its limit, stop or end-of-sequence.
//! - [`model`]: the deterministic tokenizer, word generator and logprobs.
//! - [`stream`]: pacing on tokio's clock and the server-sent-events body.
//! - [`pd`]: prefill/decode roles: KV pages, the pool, the bootstrap server, the transfer.
//! - [`error`]: errors in SGLang's shapes.
//! - [`demo`]: `moongate demo`: a gateway and simulated workers in one process.
//! - [`bench`](mod@bench): `moongate bench-routing`: trace replay, per policy (hit rate,
//!   TTFT, throughput).

pub mod bench;
pub mod chat;
pub mod completions;
pub mod config;
pub mod demo;
pub mod embeddings;
pub mod engine;
pub mod error;
pub mod generate;
pub mod info;
pub mod job;
pub mod l3;
pub mod model;
pub mod outbox;
pub mod pd;
pub mod pooling;
pub mod prefix;
pub mod rank;
pub mod response_store;
pub mod responses;
pub mod serve;
pub mod state;
pub mod stream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{ModelShape, SimConfig, SimMode};

/// How long a graceful shutdown waits for open streams before it cuts them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The worker's routes, for `cfg` (a regular worker; PD roles need [`spawn`]). Fails when
/// its `--tokenizer-path` cannot be loaded.
pub fn router(cfg: SimConfig) -> anyhow::Result<Router> {
    Ok(router_with(state::SimState::new(cfg)?))
}

/// The worker's routes over an already built state.
pub fn router_with(st: Arc<state::SimState>) -> Router {
    let limit = st.cfg.max_body_bytes;
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
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/rerank", post(pooling::rerank).put(pooling::rerank))
        .route("/v1/classify", post(pooling::classify))
        .route("/v1/score", post(pooling::score))
        .route("/v1/tokenize", post(pooling::tokenize))
        .route("/v1/detokenize", post(pooling::detokenize))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route(
            "/flush_cache",
            get(info::flush_cache).post(info::flush_cache),
        )
        .route("/get_load", get(info::get_load))
        .route("/v1/loads", get(info::loads))
        .route("/metrics", get(info::metrics))
        .route("/start_profile", post(info::start_profile))
        .route("/stop_profile", post(info::stop_profile))
        .route("/sim/profile", get(info::profile_state))
        .route("/sim/kv", get(info::kv_stats))
        .route("/sim/prefix", get(info::prefix_stats))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(serve::traced))
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
    pd: Option<Arc<pd::PdState>>,
    events: Option<(String, Option<String>)>,
    l3: Option<Arc<l3::L3>>,
}

impl SimHandle {
    /// `http://ip:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The PD machinery (prefill and decode workers).
    pub fn pd(&self) -> Option<&Arc<pd::PdState>> {
        self.pd.as_ref()
    }

    /// Where the KV events PUB socket (and the replay socket) are bound.
    pub fn kv_events(&self) -> Option<(&str, Option<&str>)> {
        self.events
            .as_ref()
            .map(|(e, r)| (e.as_str(), r.as_deref()))
    }

    /// Where a prefill worker's bootstrap server listens.
    pub fn bootstrap_addr(&self) -> Option<SocketAddr> {
        self.pd.as_ref().and_then(|p| p.bootstrap_addr())
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
        if let Some(pd) = &self.pd {
            pd.stop();
        }
        if let Some(l3) = &self.l3 {
            l3.close().await;
        }
    }

    /// The L3 tier (`--kv-store`).
    pub fn l3(&self) -> Option<&Arc<l3::L3>> {
        self.l3.as_ref()
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(pd) = &self.pd {
            pd.stop();
        }
    }
}

/// Serves a worker configured by `cfg` on `listener` in a background task. The listener's
/// address replaces `cfg.host` / `cfg.port` (what `/get_server_info` reports); a prefill
/// worker's bootstrap server binds `cfg.bootstrap_port` (0: any free port, then reported).
pub async fn spawn(mut cfg: SimConfig, listener: TcpListener) -> anyhow::Result<SimHandle> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    let addr = listener.local_addr()?;
    cfg.host = addr.ip().to_string();
    cfg.port = addr.port();
    let pd = match cfg.mode {
        SimMode::Regular => None,
        _ => Some(pd::PdState::start(&cfg, addr.port()).await?),
    };
    if let Some(b) = pd.as_ref().and_then(|p| p.bootstrap_addr()) {
        cfg.bootstrap_port = b.port();
    }
    let mut events = Vec::new();
    if let Some(c) = cfg.kv_events_config.as_ref().filter(|c| c.enabled()) {
        for rank in 0..cfg.dp_size.max(1) {
            let mut c = c.clone();
            if rank > 0 {
                // Checked by `validate`: fixed ports, so the rank's are these plus `rank`.
                let moved = |e: &str| sglang::kv_events::offset_port(e, rank);
                c.endpoint = moved(&c.endpoint).context("kv events endpoint of a rank")?;
                c.replay_endpoint = match c.replay_endpoint.as_deref() {
                    Some(r) => Some(moved(r).context("kv events replay endpoint of a rank")?),
                    None => None,
                };
            }
            events.push(sglang::kv_events::publish::Publisher::start(&c).await?);
        }
    }
    let bound = events.first().map(|p| {
        (
            p.endpoint().to_owned(),
            p.replay_endpoint().map(str::to_owned),
        )
    });
    let l3 = match cfg.kv_store {
        Some(_) => Some(Arc::new(l3::L3::connect(&cfg).await?)),
        None => None,
    };
    let st = state::SimState::with_parts(cfg, pd.clone(), events, l3.clone())?;
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(serve::serve(listener, router_with(st), stopped));
    Ok(SimHandle {
        addr,
        stop: Some(stop),
        task,
        pd,
        events: bound,
        l3,
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
    let stop = gateway::listen::shutdown_signal();
    // One machine-readable line on stdout (scripts and tests read the bound ports from it).
    let mut ready = format!(
        "moongate sim-worker ready http {} mode {}",
        handle.addr,
        mode.as_str()
    );
    if let Some((e, r)) = handle.kv_events() {
        ready.push_str(&format!(" kv-events {e}"));
        if let Some(r) = r {
            ready.push_str(&format!(" kv-events-replay {r}"));
        }
    }
    match handle.pd() {
        Some(pd) => {
            ready.push_str(&format!(" kv {}", pd.segment()));
            if let Some(b) = pd.bootstrap_addr() {
                ready.push_str(&format!(" bootstrap {b}"));
            }
            tracing::info!(url = %handle.url(), %model, ?mode, kv_segment = pd.segment(),
                bootstrap = ?pd.bootstrap_addr(), "simulated SGLang worker ready");
        }
        None => tracing::info!(url = %handle.url(), %model, ?mode, "simulated SGLang worker ready"),
    }
    println!("{ready}");
    stop.await;
    tracing::info!("shutting down");
    handle.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}
