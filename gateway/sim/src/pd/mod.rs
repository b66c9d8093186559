//! Prefill/decode disaggregation for the simulated worker: a prefill worker computes a
//! prompt's KV pages and writes them into a decode worker's memory with Moongate's
//! transfer engine; the decode worker checks every page, then generates.
//!
//! # The protocol between the two sides
//! A prefill worker runs a transfer engine (its segment `host:port`, `--kv-listen`) and
//! SGLang's bootstrap server on `--bootstrap-port` ([`bootstrap`]), where it registers its
//! one rank (`PUT /route`, `rank_ip:rank_port` = its transfer segment, `page_size`). A
//! decode worker runs a transfer engine and a bounded pool of KV pages ([`pool`]).
//!
//! A request carrying `bootstrap_host` / `bootstrap_port` / `bootstrap_room` (one room per
//! item; the gateway sends it to both at once) goes:
//! 1. decode: looks the prefill up at `bootstrap_host:bootstrap_port` (`GET /route` with
//!    every rank `-1`: the page size must match; then rank 0: the prefill's segment), cached
//!    per address and watched from then on with `GET /health` heartbeats;
//! 2. decode: leases `ceil(tokens / page_size)` pages (waiting while the pool is full) and
//!    sends `REGISTER{room, tokens, page layout, destination pages}` to the prefill's
//!    segment (a transfer-engine notification; messages in [`wire`]);
//! 3. prefill: leases pages of its own pool, waits `--prefill-compute-per-token` × tokens,
//!    fills them with the prompt's KV (bytes derived from the token ids, [`kv`]);
//! 4. prefill: once the room's registration is there (it may come first or last), writes
//!    its pages into the decode's (runs contiguous on both sides in one request), waits for
//!    every write to be acknowledged (the bytes are in the decode's memory), and sends
//!    `DONE{room, checksums}`; on any failure `FAILED{room, reason}`;
//! 5. decode: on `DONE` checks every page (checksum, and each token slot's header against
//!    the chain of its own token ids), then generates; its pages go back to the pool when
//!    the response ends. The prefill answers its HTTP request with its one token.
//!
//! Faults: a prefill whose heartbeats fail `--heartbeat-max-failures` times in a row fails
//! every room waiting on it (within `interval × failures`, a few seconds); a decode that is
//! gone makes the prefill's writes fail, which ends (and frees) the room; a room given up
//! by the decode before `DONE` sends `ABORT` and quarantines its pages until the prefill
//! answers for it; registrations nobody claims are dropped after `--kv-timeout`. Pages
//! never leak: every lease is returned on every path ([`prefill`], [`decode`]).
//!
//! # Layout
//! - [`kv`]: model shapes, the deterministic KV bytes, page layout and checksums.
//! - [`pool`]: the bounded, registered page pool and its leases.
//! - [`wire`]: the messages between the sides.
//! - [`bootstrap`]: SGLang's bootstrap server, and the decode side's lookups and heartbeats.
//! - [`prefill`]: rooms met from both ends, compute, writes, `DONE`.
//! - [`decode`]: lookup, registration, wait, verification, quarantine.

pub mod bootstrap;
pub mod decode;
pub mod kv;
pub mod pool;
pub mod prefill;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use openapi::sglang::bootstrap::{KvStats, RegisterRank};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use transfer::{EngineConfig, TransferEngine};

use super::config::{DEFAULT_BOOTSTRAP_PORT, KvTransport, ModelShape, SimConfig, SimMode};
use super::error::SimError;
use bootstrap::{Heartbeat, Links};
use decode::Decode;
use gateway::client::HttpClient;
use kv::Layout;
use openapi::shapes::Routing;
use pool::{KvPool, PageLease};
use prefill::Prefill;

/// One item of a request that carries bootstrap fields: its room, the prefill's bootstrap
/// address and the prompt's token ids.
#[derive(Debug, Clone)]
pub struct KvItem {
    /// The room.
    pub room: u64,
    /// `host:port` of the prefill's bootstrap server.
    pub addr: String,
    /// The prompt's token ids.
    pub tokens: Arc<[u32]>,
    /// Prefill: when the worker's prefill lane has computed the prompt's uncached part (the
    /// room waits for that); none: the room computes every token
    /// (`--prefill-compute-per-token` each).
    pub lane_done: Option<tokio::time::Instant>,
}

/// The KV items of a request whose items have the prompts `prompts` (one per item: a
/// prompt of a batch, or a sample of a chat with `n > 1`), from its bootstrap fields.
pub fn items(routing: &Routing, prompts: &[Arc<[u32]>]) -> Result<Vec<KvItem>, SimError> {
    let k = prompts.len();
    let bad = |m: String| Err::<(), _>(SimError::BadRequest(m));
    let per_item = |name: &str, len: Option<usize>| match len {
        Some(n) if n != k => bad(format!(
            "{name} has {n} entries but the request has {k} items."
        )),
        None if k > 1 && name == "bootstrap_room" => bad(format!(
            "bootstrap_room must be a list with one room per item ({k} items)."
        )),
        _ => Ok(()),
    };
    let (Some(rooms), Some(hosts)) = (&routing.bootstrap_room, &routing.bootstrap_host) else {
        return Err(SimError::BadRequest(
            "bootstrap_room and bootstrap_host are required by a prefill or decode worker.".into(),
        ));
    };
    per_item("bootstrap_room", rooms.list_len())?;
    per_item("bootstrap_host", hosts.list_len())?;
    if let Some(p) = &routing.bootstrap_port {
        per_item("bootstrap_port", p.list_len())?;
    }
    Ok(prompts
        .iter()
        .enumerate()
        .map(|(i, tokens)| {
            let port = routing
                .bootstrap_port
                .as_ref()
                .and_then(|p| p.get(i).copied().flatten())
                .unwrap_or(DEFAULT_BOOTSTRAP_PORT);
            let host = hosts.get(i).map_or("", String::as_str);
            KvItem {
                room: rooms.get(i).copied().unwrap_or_default(),
                addr: bootstrap::address(host, port),
                tokens: tokens.clone(),
                lane_done: None,
            }
        })
        .collect())
}

/// One room's KV moved (prefill: written and acknowledged; decode: received and checked).
#[derive(Debug, Clone, PartialEq)]
pub struct KvEvent {
    /// The room.
    pub room: u64,
    /// Prompt tokens.
    pub tokens: usize,
    /// Pages.
    pub pages: usize,
    /// KV bytes.
    pub bytes: u64,
    /// Prefill: from the first write to the last acknowledgement; decode: from the request
    /// to `DONE`.
    pub took: Duration,
    /// Prefill: the compute time (simulated wait plus filling the pages).
    pub compute: Duration,
}

/// Counters behind `GET /sim/kv`.
#[derive(Debug, Default)]
pub struct Stats {
    moves: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    failures: AtomicU64,
    last: Mutex<Option<(u64, u64, f64)>>,
}

impl Stats {
    fn moved(&self, tokens: usize, bytes: u64, took: Duration) {
        self.moves.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        *self.last.lock() = Some((tokens as u64, bytes, took.as_secs_f64()));
    }

    fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
enum Side {
    Prefill(Arc<Prefill>),
    Decode(Arc<Decode>),
}

/// Why a room's KV could not be moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvFail {
    /// The request cannot be served as asked (it needs more pages than the pool holds).
    Refused(String),
    /// The move failed (the other side failed, is gone, or took too long).
    Failed(String),
}

impl From<String> for KvFail {
    fn from(s: String) -> Self {
        KvFail::Failed(s)
    }
}

impl From<&str> for KvFail {
    fn from(s: &str) -> Self {
        KvFail::Failed(s.to_owned())
    }
}

impl From<pool::PoolError> for KvFail {
    fn from(e: pool::PoolError) -> Self {
        match e {
            pool::PoolError::TooBig { .. } => KvFail::Refused(e.to_string()),
            pool::PoolError::Closed => KvFail::Failed(e.to_string()),
        }
    }
}

impl From<KvFail> for SimError {
    fn from(e: KvFail) -> Self {
        match e {
            KvFail::Refused(m) => SimError::BadRequest(m),
            KvFail::Failed(m) => SimError::Kv(m),
        }
    }
}

/// What both sides of a worker share: the transfer engine, the page pool and its layout,
/// the KV timeout, the counters and the event feed.
#[derive(Debug)]
pub struct Common {
    /// The transfer engine.
    pub engine: TransferEngine,
    /// The page pool.
    pub pool: Arc<KvPool>,
    /// How a prompt's KV is laid out in pages.
    pub layout: Layout,
    /// The bound on a room (see `--kv-timeout`).
    pub timeout: Duration,
    /// The counters behind `GET /sim/kv`.
    pub stats: Arc<Stats>,
    /// Every room moved.
    pub events: broadcast::Sender<KvEvent>,
}

#[cfg(test)]
impl Common {
    /// A loopback engine with a pool of `pages` pages of 4 tokens x 128 bytes, for the
    /// side tests (`timeout` bounds a room).
    pub(crate) async fn for_tests(pages: usize, timeout: Duration) -> Self {
        let engine = TransferEngine::new(transfer::EngineConfig::listening_on(
            "127.0.0.1:0".parse().unwrap(),
        ))
        .await
        .unwrap();
        let layout = Layout {
            bytes_per_token: 128,
            page_tokens: 4,
        };
        let pool = Arc::new(KvPool::new(&engine, layout.page_bytes(), pages).unwrap());
        Self {
            engine,
            pool,
            layout,
            timeout,
            stats: Arc::default(),
            events: broadcast::channel(4).0,
        }
    }
}

/// KV pages a decode answer holds until it ends.
#[derive(Debug, Default)]
pub struct KvHold(Vec<PageLease>);

impl KvHold {
    /// Pages held.
    pub fn pages(&self) -> usize {
        self.0.iter().map(|l| l.pages().len()).sum()
    }
}

/// The PD machinery of one simulated worker.
#[derive(Debug)]
pub struct PdState {
    side: Side,
    engine: TransferEngine,
    shape: ModelShape,
    layout: Layout,
    stats: Arc<Stats>,
    events: broadcast::Sender<KvEvent>,
    stop: CancellationToken,
    bootstrap: Option<SocketAddr>,
}

impl PdState {
    /// Starts the transfer engine, the page pool and (prefill) the bootstrap server and
    /// its rank registration. `http_port` is the worker's own port (reported to decoders).
    pub async fn start(cfg: &SimConfig, http_port: u16) -> anyhow::Result<Arc<Self>> {
        let listen = match cfg.kv_listen {
            Some(a) => a,
            None => SocketAddr::new(
                cfg.host
                    .parse()
                    .context("--host must be an IP address in PD mode")?,
                0,
            ),
        };
        let engine = TransferEngine::new(EngineConfig {
            shm: cfg.kv_transport == KvTransport::Auto,
            request_timeout: cfg.kv_timeout,
            transfer_secret_file: cfg.transfer_secret_file.clone(),
            ..EngineConfig::listening_on(listen)
        })
        .await
        .context("starting the KV transfer engine")?;
        let shape = cfg.model_shape;
        let layout = Layout {
            bytes_per_token: shape.bytes_per_token(),
            page_tokens: cfg.page_size as usize,
        };
        let pages = (cfg.kv_pool_size as usize / layout.page_bytes()).max(1);
        let pool = Arc::new(
            KvPool::new(&engine, layout.page_bytes(), pages).context("allocating the KV pool")?,
        );
        let stats = Arc::new(Stats::default());
        let (events, _) = broadcast::channel(1024);
        let stop = CancellationToken::new();
        let common = Common {
            engine: engine.clone(),
            pool,
            layout,
            timeout: cfg.kv_timeout,
            stats: stats.clone(),
            events: events.clone(),
        };
        let (side, bootstrap) = match cfg.mode {
            SimMode::Prefill => {
                let p = Arc::new(Prefill::new(common, cfg.prefill_compute_per_token));
                let addr = serve_bootstrap(cfg, &engine, http_port, &stop).await?;
                (Side::Prefill(p), Some(addr))
            }
            SimMode::Decode => {
                let heartbeat = Heartbeat {
                    interval: cfg.heartbeat_interval,
                    max_failures: cfg.heartbeat_max_failures,
                };
                let links = Arc::new(Links::new(HttpClient::new(), heartbeat, stop.clone()));
                (Side::Decode(Arc::new(Decode::new(common, links))), None)
            }
            SimMode::Regular => anyhow::bail!("a regular worker has no PD side"),
        };
        let me = Arc::new(Self {
            side,
            engine,
            shape,
            layout,
            stats,
            events,
            stop,
            bootstrap,
        });
        tokio::spawn(me.clone().listen());
        Ok(me)
    }

    /// The worker's transfer engine (its segment is where peers move KV pages).
    pub fn engine(&self) -> &TransferEngine {
        &self.engine
    }

    /// Dispatches the peers' messages and sweeps stale rooms, until stopped.
    async fn listen(self: Arc<Self>) {
        let inbox = self.engine.notifications();
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = sweep.tick() => match &self.side {
                    Side::Prefill(p) => p.sweep(),
                    Side::Decode(d) => d.sweep(),
                },
                n = inbox.recv() => {
                    let Some(n) = n else { return };
                    match wire::Message::decode(&n.message) {
                        Ok(msg) => match &self.side {
                            Side::Prefill(p) => p.on_message(n.from, msg),
                            Side::Decode(d) => d.on_message(msg),
                        },
                        Err(e) => tracing::warn!(from = %n.from, error = %e, "bad KV message"),
                    }
                }
            }
        }
    }

    /// Moves the KV of every item (prefill: computes and sends it; decode: receives and
    /// checks it) before the answer is generated.
    pub async fn exchange(&self, items: Vec<KvItem>) -> Result<KvHold, SimError> {
        match &self.side {
            Side::Prefill(p) => {
                let all = items.iter().map(|i| p.serve(i));
                futures::future::try_join_all(all).await?;
                Ok(KvHold::default())
            }
            Side::Decode(d) => {
                let all = items.iter().map(|i| d.receive(i));
                Ok(KvHold(futures::future::try_join_all(all).await?))
            }
        }
    }

    /// Where the bootstrap server listens (prefill).
    pub fn bootstrap_addr(&self) -> Option<SocketAddr> {
        self.bootstrap
    }

    /// The transfer engine's segment.
    pub fn segment(&self) -> &str {
        self.engine.segment_name()
    }

    /// What this worker's transfer engine moved so far, per transport (which one carried
    /// the KV pages: TCP, shared memory, RDMA).
    pub fn transfer_stats(&self) -> transfer::TransferStats {
        self.engine.stats()
    }

    /// Every room moved from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<KvEvent> {
        self.events.subscribe()
    }

    /// `GET /sim/kv`.
    pub fn stats(&self) -> KvStats {
        let (mode, pool, rooms) = match &self.side {
            Side::Prefill(p) => ("prefill", p.pool(), p.rooms_open()),
            Side::Decode(d) => ("decode", d.pool(), d.rooms_open()),
        };
        let s = &self.stats;
        KvStats {
            mode: mode.into(),
            model_shape: self.shape.name().into(),
            bytes_per_token: self.layout.bytes_per_token as u64,
            page_tokens: self.layout.page_tokens as u64,
            pool_pages: pool.pages() as u64,
            free_pages: pool.free_pages() as u64,
            rooms_open: rooms as u64,
            moves: s.moves.load(Ordering::Relaxed),
            bytes: s.bytes.load(Ordering::Relaxed),
            seconds: s.nanos.load(Ordering::Relaxed) as f64 / 1e9,
            failures: s.failures.load(Ordering::Relaxed),
            last: *s.last.lock(),
        }
    }

    /// Stops the bootstrap server, heartbeats and the message loop; closes the pool.
    pub fn stop(&self) {
        self.stop.cancel();
        match &self.side {
            Side::Prefill(p) => p.pool().close(),
            Side::Decode(d) => d.pool().close(),
        }
    }
}

/// Binds and serves the bootstrap server, and registers this worker's rank with it.
async fn serve_bootstrap(
    cfg: &SimConfig,
    engine: &TransferEngine,
    http_port: u16,
    stop: &CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind((cfg.host.as_str(), cfg.bootstrap_port))
        .await
        .with_context(|| {
            format!(
                "binding the bootstrap server on {}:{}",
                cfg.host, cfg.bootstrap_port
            )
        })?;
    let addr = listener.local_addr()?;
    let table = Arc::new(bootstrap::Table::default());
    // The rank's endpoint is the engine's advertised segment (`host:port`).
    let segment = engine.segment_name();
    let (rank_ip, rank_port) = segment
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']).to_owned(), p.parse().ok()?)))
        .context("the transfer engine's segment is not host:port")?;
    table
        .register(RegisterRank {
            prefill_http_port: Some(http_port),
            ..RegisterRank::single(rank_ip, rank_port, cfg.page_size, "bfloat16")
        })
        .map_err(|e| anyhow::anyhow!("registering this worker's rank: {e}"))?;
    let app = bootstrap::router(table);
    let stop = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    });
    Ok(addr)
}
