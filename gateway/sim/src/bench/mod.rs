//! `moongate bench-routing`: replays a Mooncake-format trace ([`trace`]) through gateways
//! in front of simulated workers, once per policy with the same trace, and reports per
//! policy the prefix hit rate, TTFT, end-to-end latency, throughput and errors
//! ([`report`]).
//!
//! The simulated workers model one GPU each (the defaults below: an 8B model on one
//! H100-class GPU with an FP8 KV cache): prefill at [`DEFAULT_PREFILL_TOKENS_PER_SEC`]
//! tokens/s, one prefill at a time, for the uncached part of the prompt only;
//! [`DEFAULT_TPOT`] per decode step; a KV pool of [`DEFAULT_KV_POOL_TOKENS`] tokens in
//! [`DEFAULT_PAGE_SIZE`]-token pages. The conversation trace's working set (182,790
//! distinct 512-token blocks, 94 M tokens) is far larger than four such pools (4.2 M
//! tokens), so pages are evicted all along.
//!
//! `--speedup K` divides the trace's arrival times and the simulated compute (prefill per
//! token, time per output token) by K; latencies are reported multiplied back by K, on the
//! trace's clock. Requests are streamed `/generate` with the synthesized `input_ids`,
//! `ignore_eos` and `max_new_tokens` = the trace's output length, as SGLang's clients send
//! them; their TTFT is the time to the first event (the first token), and the gateways see
//! it too (a `kv_aware` worker's prefill backlog is released at the first token).
//!
//! `--kv-store` gives the workers SGLang HiCache's L3 on Moongate's store: the bench hosts
//! a KV master, each worker contributes `--kv-store-size` of memory to it, writes the
//! pages it evicts there and loads prefixes found there instead of computing them
//! ([`crate::l3`]); the gateways' `kv_aware` counts the pages the store holds: the first
//! gateway looks at the master in memory, the others (`--gateways`) follow its object
//! events over HTTP (`--kv-l3-master-url`).
//!
//! # Layout
//! - [`trace`]: the trace format, the token ids synthesized from its block hashes, and a
//!   trace's offered load.
//! - [`shapes`]: traces made by code (`moongate gen-trace`: agents, chats, bursts, long
//!   and short mixed).
//! - [`report`]: summaries, the table, `--json`, the TTFT CDF plot.
//! - [`chart`]: results across runs: `--csv` rows and the `--chart` SVG.

pub mod chart;
pub mod report;
pub mod shapes;
pub mod trace;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::{ModelShape, SimConfig, SimHandle, SimMode};
use gateway::client::HttpClient;
use gateway::config::{MasterHostConfig, PolicyKind, ServeConfig};
use gateway::launch::Gateway;
use gateway::master::MasterProcess;
use report::{Sample, Summary};
use sglang::kv_events::KvEventsConfig;
use trace::TraceRequest;

/// Default simulated workers.
pub const DEFAULT_WORKERS: usize = 4;
/// Default prefill throughput of one simulated worker, tokens/s.
pub const DEFAULT_PREFILL_TOKENS_PER_SEC: u64 = 16_000;
/// Default time per decode step.
pub const DEFAULT_TPOT: &str = "20ms";
/// Default KV pool of one worker, in tokens: 64 GiB of an 8B model's KV in FP8 (Llama 3
/// 8B: 32 layers x 8 KV heads x 128 x K and V = 64 KiB a token; 128 KiB in bf16), what an
/// 80 GB GPU leaves after the weights.
///
/// Smaller pools leave no policy room: with half this, one cache as large as all four
/// pools would hit 8.8% of the conversation trace's blocks, round robin hits 5.3%.
pub const DEFAULT_KV_POOL_TOKENS: u64 = 1024 * 1024;
/// Default tokens per KV page.
pub const DEFAULT_PAGE_SIZE: u32 = 64;
/// Default speedup (the trace's own pace).
pub const DEFAULT_SPEEDUP: f64 = 1.0;
/// Default policies compared.
pub const DEFAULT_POLICIES: &str = "round_robin,cache_aware,kv_aware";
/// Default gateway replicas (requests alternate between them).
pub const DEFAULT_GATEWAYS: usize = 1;
/// Default memory each worker contributes to the store with `--kv-store` (bytes; 4 GiB
/// over four workers holds 32 M tokens of the bench's 128-byte tokens, 7.6× their pools).
pub const DEFAULT_KV_STORE_SIZE: u64 = 1 << 30;
/// How long the workers and subscriptions may take to come up.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// `moongate bench-routing` settings.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchConfig {
    /// The Mooncake-format trace (JSON lines).
    #[arg(long)]
    pub trace: PathBuf,
    /// Regular simulated workers.
    #[arg(long, default_value_t = DEFAULT_WORKERS)]
    pub workers: usize,
    /// PD instead: `P,D` prefill and decode workers.
    #[arg(long, value_parser = parse_pd)]
    pub pd: Option<(usize, usize)>,
    /// Policies to compare (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_POLICIES)]
    pub policies: Vec<PolicyKind>,
    /// Compress the trace's time and the simulated compute by this factor.
    #[arg(long, default_value_t = DEFAULT_SPEEDUP)]
    pub speedup: f64,
    /// Replay only the first N requests.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Spread or squeeze the arrivals so the trace's offered load is this share of the
    /// workers' prefill capacity (1: the tokens an ideal shared cache leaves to compute
    /// keep every worker busy; see `trace::offered_load`). Unset: the trace's own pace.
    #[arg(long)]
    pub load: Option<f64>,
    /// Gateway replicas splitting the requests (each with its own policy state).
    #[arg(long, default_value_t = DEFAULT_GATEWAYS)]
    pub gateways: usize,
    /// Prefill throughput of a simulated worker, tokens/s.
    #[arg(long, default_value_t = DEFAULT_PREFILL_TOKENS_PER_SEC)]
    pub prefill_tokens_per_sec: u64,
    /// Time per decode step.
    #[arg(long, value_parser = humantime::parse_duration, default_value = DEFAULT_TPOT)]
    pub tpot: Duration,
    /// KV pool of a simulated worker, in tokens.
    #[arg(long, default_value_t = DEFAULT_KV_POOL_TOKENS)]
    pub kv_pool_tokens: u64,
    /// Tokens per KV page.
    #[arg(long, default_value_t = DEFAULT_PAGE_SIZE)]
    pub page_size: u32,
    /// PD: also run each policy with this `--pd-min-uncached-tokens` (disaggregate or not).
    #[arg(long)]
    pub pd_min_uncached_tokens: Option<u64>,
    /// `kv_aware`'s weight of the tokens to prefill against the requests in flight (the
    /// gateway's `--kv-overlap-weight`).
    #[arg(long, default_value_t = ServeConfig::default().kv_overlap_weight)]
    pub kv_overlap_weight: f64,
    /// `kv_aware`'s weight of a worker's prefill backlog against the request's own tokens
    /// to prefill (the gateway's `--kv-backlog-weight`).
    #[arg(long, default_value_t = ServeConfig::default().kv_backlog_weight)]
    pub kv_backlog_weight: f64,
    /// `kv_aware`'s weight of a request in flight, in mean prompts (the gateway's
    /// `--kv-load-weight`).
    #[arg(long, default_value_t = ServeConfig::default().kv_load_weight)]
    pub kv_load_weight: f64,
    /// `kv_aware` without predicted pages (the gateway's `--kv-no-predictions`).
    #[arg(long)]
    pub kv_no_predictions: bool,
    /// `kv_aware`'s value of a page in the store against one on the GPU (the gateway's
    /// `--kv-l3-page-value`; used with `--kv-store`).
    #[arg(long, default_value_t = ServeConfig::default().kv_l3_page_value)]
    pub kv_l3_page_value: f64,
    /// `kv_aware`'s value of a store page only on a disk tier (the gateway's
    /// `--kv-l3-disk-page-value`; used with `--kv-store-disk`).
    #[arg(long, default_value_t = ServeConfig::default().kv_l3_disk_page_value)]
    pub kv_l3_disk_page_value: f64,
    /// Give the workers an L3 tier on a KV master this bench hosts (SGLang HiCache's
    /// storage backend on Moongate's store).
    #[arg(long)]
    pub kv_store: bool,
    /// With `--kv-store`: memory each worker contributes to the store (suffixes K, M, G).
    #[arg(long, default_value_t = DEFAULT_KV_STORE_SIZE, value_parser = crate::config::parse_size)]
    pub kv_store_size: u64,
    /// With `--kv-store`: a disk tier of this many bytes below each worker's store memory
    /// (suffixes K, M, G; 0: none), in a private temporary directory (`$TMPDIR`) the run
    /// removes; pages evicted from memory are written there instead of being lost.
    #[arg(long, default_value = "0", value_parser = crate::config::parse_size, requires = "kv_store")]
    pub kv_store_disk: u64,
    /// Send each request's conversation as its routing key (`--routing-key-header`: the
    /// trace's first two block hashes, the shared system prompt and the conversation's
    /// first turn), for the affinity policies (`manual`, `consistent_hashing`).
    #[arg(long)]
    pub session_keys: bool,
    /// Write the summaries here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Append the summaries to this CSV (the trace, its offered load, one row per policy).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Draw every run of `--csv` as an SVG chart here (hit rate and TTFT against
    /// `cache_aware`'s, per trace and load).
    #[arg(long, requires = "csv")]
    pub chart: Option<PathBuf>,
    /// Draw the TTFT CDF of each policy here (PNG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

fn parse_pd(s: &str) -> Result<(usize, usize), String> {
    let (p, d) = s
        .split_once(',')
        .ok_or_else(|| format!("--pd takes P,D (got {s:?})"))?;
    let n = |x: &str| {
        x.trim()
            .parse::<usize>()
            .map_err(|e| format!("--pd {s:?}: {e}"))
    };
    match (n(p)?, n(d)?) {
        (0, _) | (_, 0) => Err("--pd needs at least one prefill and one decode worker".into()),
        pd => Ok(pd),
    }
}

impl BenchConfig {
    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.speedup.is_finite() && self.speedup >= 1e-3) {
            return Err("--speedup must be a positive number".into());
        }
        if self.workers == 0 && self.pd.is_none() {
            return Err("--workers must be at least 1".into());
        }
        if self.gateways == 0 || self.gateways > 8 {
            return Err("--gateways must be within 1..=8".into());
        }
        if self.prefill_tokens_per_sec == 0 || self.page_size == 0 || self.kv_pool_tokens == 0 {
            return Err(
                "--prefill-tokens-per-sec, --page-size and --kv-pool-tokens must be positive"
                    .into(),
            );
        }
        if self
            .load
            .is_some_and(|l| !(l.is_finite() && (1e-3..=100.0).contains(&l)))
        {
            return Err("--load must be within 0.001..=100".into());
        }
        if self.policies.is_empty() {
            return Err("--policies names no policy".into());
        }
        Ok(())
    }

    fn sim(&self, mode: SimMode, store: Option<&str>, disk: Option<&Path>) -> SimConfig {
        let shape = ModelShape::Tiny;
        let per_token =
            Duration::from_secs_f64(1.0 / self.prefill_tokens_per_sec as f64 / self.speedup);
        SimConfig {
            port: 0,
            mode,
            model: "bench".into(),
            model_shape: shape,
            page_size: self.page_size,
            kv_pool_size: self.kv_pool_tokens * shape.bytes_per_token() as u64,
            context_length: 1 << 21,
            prefill_compute_per_token: per_token,
            tpot: self.tpot.div_f64(self.speedup),
            bootstrap_port: 0,
            kv_timeout: Duration::from_secs(600),
            kv_events_config: Some(KvEventsConfig {
                endpoint: "tcp://127.0.0.1:0".into(),
                replay_endpoint: Some("tcp://127.0.0.1:0".into()),
                ..KvEventsConfig::default()
            }),
            kv_store: store.map(str::to_owned),
            kv_store_segment_size: self.kv_store_size,
            kv_store_disk_path: disk.map(Path::to_path_buf),
            kv_store_disk_capacity: self.kv_store_disk,
            ..SimConfig::default()
        }
    }
}

/// One run: a policy, and in PD mode its disaggregation threshold.
#[derive(Debug, Clone)]
struct Run {
    policy: PolicyKind,
    pd_min_uncached: u64,
    name: String,
}

/// Runs the benchmark; prints the table (and the legend of the plot) to stdout.
pub async fn run(cfg: BenchConfig) -> anyhow::Result<Vec<Summary>> {
    cfg.validate().map_err(anyhow::Error::msg)?;
    let mut reqs = trace::read(&cfg.trace, cfg.limit)?;
    anyhow::ensure!(!reqs.is_empty(), "{} has no requests", cfg.trace.display());
    let prefill_workers = cfg.pd.map_or(cfg.workers, |(p, _)| p);
    let capacity = (prefill_workers as u64 * cfg.prefill_tokens_per_sec) as f64;
    let native = trace::offered_load(&reqs, capacity);
    if let Some(want) = cfg.load.filter(|_| native.is_finite() && native > 0.0) {
        let stretch = native / want;
        for r in &mut reqs {
            r.timestamp = (r.timestamp as f64 * stretch) as u64;
        }
    }
    let load = trace::offered_load(&reqs, capacity);
    let reqs = Arc::new(reqs);
    let mut runs = Vec::new();
    for &p in &cfg.policies {
        let suffix = if cfg.gateways > 1 {
            format!(" x{}", cfg.gateways)
        } else {
            String::new()
        };
        runs.push(Run {
            policy: p,
            pd_min_uncached: 0,
            name: format!("{p}{suffix}"),
        });
        if let (Some(_), Some(t)) = (cfg.pd, cfg.pd_min_uncached_tokens.filter(|t| *t > 0)) {
            runs.push(Run {
                policy: p,
                pd_min_uncached: t,
                name: format!("{p}{suffix} +dis-or-not"),
            });
        }
    }
    let mut summaries = Vec::new();
    let mut cdfs = Vec::new();
    for run in &runs {
        let (summary, ttfts) = run_one(&cfg, run, reqs.clone())
            .await
            .with_context(|| format!("policy {}", run.name))?;
        summaries.push(summary);
        cdfs.push((run.name.clone(), ttfts));
    }
    println!(
        "{} requests of {}, offered load {load:.2} (the trace's own: {native:.2}), speedup {}, {}",
        reqs.len(),
        cfg.trace.display(),
        cfg.speedup,
        match cfg.pd {
            Some((p, d)) => format!("PD {p} prefill + {d} decode"),
            None => format!("{} workers", cfg.workers),
        }
    );
    print!("{}", report::table(&summaries));
    if let Some(path) = &cfg.json {
        std::fs::write(path, serde_json::to_vec_pretty(&summaries)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &cfg.csv {
        chart::append(path, &cfg.trace, load, &summaries)?;
        if let Some(svg) = &cfg.chart {
            let text = chart::svg(&chart::read(path)?);
            std::fs::write(svg, text).with_context(|| format!("writing {}", svg.display()))?;
        }
    }
    if let Some(path) = &cfg.plot {
        print!("{}", report::plot(path, &cdfs)?);
    }
    Ok(summaries)
}

/// Starts the workers; with a store and `--kv-store-disk`, each with its disk tier in one
/// of `disks`.
async fn start_sims(
    cfg: &BenchConfig,
    store: Option<&str>,
    disks: &[tempfile::TempDir],
) -> anyhow::Result<Vec<SimHandle>> {
    let modes: Vec<SimMode> = match cfg.pd {
        Some((p, d)) => std::iter::repeat_n(SimMode::Prefill, p)
            .chain(std::iter::repeat_n(SimMode::Decode, d))
            .collect(),
        None => vec![SimMode::Regular; cfg.workers],
    };
    let mut sims = Vec::with_capacity(modes.len());
    for (i, m) in modes.into_iter().enumerate() {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let disk = disks.get(i).map(tempfile::TempDir::path);
        sims.push(crate::spawn(cfg.sim(m, store, disk), l).await?);
    }
    Ok(sims)
}

fn gateway_config(cfg: &BenchConfig, run: &Run, sims: &[SimHandle]) -> ServeConfig {
    let mut sc = ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        policy: run.policy,
        disable_master: true,
        health_check_interval_secs: 1,
        health_check_pending_interval_ms: 50,
        request_timeout_secs: 3600,
        pd_min_uncached_tokens: run.pd_min_uncached,
        kv_overlap_weight: cfg.kv_overlap_weight,
        kv_backlog_weight: cfg.kv_backlog_weight,
        kv_load_weight: cfg.kv_load_weight,
        kv_no_predictions: cfg.kv_no_predictions,
        kv_l3_page_value: cfg.kv_l3_page_value,
        kv_l3_disk_page_value: cfg.kv_l3_disk_page_value,
        ..ServeConfig::default()
    };
    match cfg.pd {
        Some((p, _)) => {
            sc.pd_disaggregation = true;
            sc.prefill = sims[..p]
                .iter()
                .map(|s| {
                    let boot = s.bootstrap_addr().map_or(0, |a| a.port());
                    vec![s.url(), boot.to_string()]
                })
                .collect();
            sc.decode = sims[p..].iter().map(SimHandle::url).collect();
        }
        None => sc.worker_urls = sims.iter().map(SimHandle::url).collect(),
    }
    sc
}

/// Waits until every gateway has every worker ready and, for `kv_aware`, followed.
async fn ready(gws: &[Gateway], n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let ok = gws.iter().all(|g| {
            let st = g.state();
            let mut policies = vec![st.router().policy().kv_aware().map(|k| k.followed())];
            if let Some(pd) = st.pd_router() {
                policies = pd
                    .policies()
                    .iter()
                    .map(|p| p.kv_aware().map(|k| k.followed()))
                    .collect();
            }
            let followed: usize = policies.iter().flatten().sum();
            let want = if policies.iter().all(Option::is_none) {
                0
            } else {
                n
            };
            st.registry().counts().0 == n && followed >= want
        });
        if ok {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "workers not ready within {READY_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn run_one(
    cfg: &BenchConfig,
    run: &Run,
    reqs: Arc<Vec<TraceRequest>>,
) -> anyhow::Result<(Summary, Vec<f64>)> {
    let master = match cfg.kv_store {
        true => {
            let l = TcpListener::bind("127.0.0.1:0").await?;
            Some(gateway::master::spawn_master(MasterHostConfig::default(), l).await?)
        }
        false => None,
    };
    let url = master.as_ref().map(MasterProcess::url);
    let disks = match (&master, cfg.kv_store_disk) {
        (Some(_), 1..) => (0..cfg.pd.map_or(cfg.workers, |(p, d)| p + d))
            .map(|i| {
                tempfile::Builder::new()
                    .prefix(&format!("moongate-bench-disk-{i}-"))
                    .tempdir()
            })
            .collect::<Result<Vec<_>, _>>()
            .context("creating the workers' disk-tier directories")?,
        _ => Vec::new(),
    };
    let sims = start_sims(cfg, url.as_deref(), &disks).await?;
    let mut gws = Vec::with_capacity(cfg.gateways);
    for i in 0..cfg.gateways {
        let mut sc = gateway_config(cfg, run, &sims);
        // The first gateway looks at the master in memory, as one hosting it does; the
        // others follow its object events over HTTP, as replicas in other processes do.
        if i > 0 {
            sc.kv_l3_master_url = url.clone();
        }
        sc.validate()?;
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let gw = gateway::launch::spawn(sc, l).await?;
        if let Some(m) = master.as_ref().filter(|_| i == 0) {
            gw.state().use_store(Arc::new(m.master().clone()));
        }
        gws.push(gw);
    }
    ready(&gws, sims.len()).await?;
    // What kv_aware expected at routing (process-wide counts: this run's is the difference).
    let routed_before = gateway::metrics::kv_aware_token_counts();
    let urls: Vec<String> = gws
        .iter()
        .map(|g| format!("{}/generate", g.url()))
        .collect();
    let bar = if cfg.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(reqs.len() as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>24} [{bar:40}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(run.name.clone());
    let client = HttpClient::new();
    let samples = Arc::new(Mutex::new(Vec::with_capacity(reqs.len())));
    let errors = Arc::new(Mutex::new(0usize));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(reqs.len());
    for i in 0..reqs.len() {
        let at = start + Duration::from_secs_f64(reqs[i].timestamp as f64 / 1000.0 / cfg.speedup);
        tokio::time::sleep_until(at).await;
        let (reqs, client, samples, errors, bar) = (
            reqs.clone(),
            client.clone(),
            samples.clone(),
            errors.clone(),
            bar.clone(),
        );
        let url = urls[i % urls.len()].clone();
        let speedup = cfg.speedup;
        let session = cfg.session_keys.then(|| reqs[i].session()).flatten();
        tasks.push(tokio::spawn(async move {
            match one(&client, &url, &reqs[i], session.as_deref()).await {
                Ok(m) => {
                    let ms = |d: Duration| d.as_secs_f64() * 1000.0 * speedup;
                    samples.lock().push(Sample {
                        prompt: m.prompt,
                        cached: m.cached,
                        from_store: m.from_store,
                        ttft_ms: ms(m.ttft),
                        e2e_ms: ms(m.e2e),
                    });
                }
                Err(e) => {
                    tracing::debug!(error = %e, "bench request failed");
                    *errors.lock() += 1;
                }
            }
            bar.inc(1);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let secs = start.elapsed().as_secs_f64() * cfg.speedup;
    bar.finish_and_clear();
    for g in gws {
        g.shutdown().await;
    }
    let l3: Vec<crate::l3::L3Stats> = sims
        .iter()
        .filter_map(|s| s.l3())
        .map(|l| l.stats())
        .collect();
    let loaded: u64 = l3
        .iter()
        .map(|l| l.loaded_pages * u64::from(cfg.page_size))
        .sum();
    let (lookups, micros) = l3
        .iter()
        .fold((0, 0), |(n, t), l| (n + l.lookups, t + l.load_micros));
    for s in sims {
        s.shutdown_within(Duration::from_secs(1)).await;
    }
    let store = master.map(|m| {
        let (stats, tiers) = (m.master().stats(), m.master().tier_stats());
        (m, stats.evicted_objects, [tiers.offloads, tiers.loads])
    });
    let (evicted, disk) = match store {
        Some((m, e, d)) => {
            m.shutdown().await;
            (Some(e), (cfg.kv_store_disk > 0).then_some(d))
        }
        None => (None, None),
    };
    drop(disks);
    let samples = std::mem::take(&mut *samples.lock());
    let ttfts = samples.iter().map(|s| s.ttft_ms).collect();
    let errors = *errors.lock();
    let mut summary = Summary::of(run.name.clone(), &samples, errors, secs);
    summary.routed_on = routed_on(routed_before, gateway::metrics::kv_aware_token_counts());
    if cfg.kv_store {
        let prompt: u64 = samples.iter().map(|s| s.prompt).sum();
        summary.store_hit_rate = Some(loaded as f64 / prompt.max(1) as f64);
        summary.store_evicted = evicted;
        summary.store_lookup_ms = Some(micros as f64 / 1000.0 / lookups.max(1) as f64);
        summary.store_disk = disk;
        summary.ttft_by_tier = Some(report::ttft_by_tier(&samples));
    }
    Ok((summary, ttfts))
}

/// Each tier's share of the prompt tokens `kv_aware` routed on events between two
/// readings of its counts (none when it routed none).
fn routed_on(
    (p0, t0): (u64, gateway::outcome::Tiers),
    (p1, t1): (u64, gateway::outcome::Tiers),
) -> Option<std::collections::BTreeMap<String, f64>> {
    let prompt = p1.checked_sub(p0).filter(|&p| p > 0)? as f64;
    Some(
        t1.labelled()
            .iter()
            .zip(t0.labelled())
            .map(|((l, n1), (_, n0))| (l.to_string(), n1.saturating_sub(n0) as f64 / prompt))
            .collect(),
    )
}

/// What one request measured.
struct Measured {
    prompt: u64,
    cached: u64,
    from_store: u64,
    ttft: Duration,
    e2e: Duration,
}

/// Sends one streamed request: its prompt and cached tokens (from the last event's
/// `meta_info`), the time to its first event and to its end.
async fn one(
    client: &HttpClient,
    url: &str,
    r: &TraceRequest,
    session: Option<&str>,
) -> anyhow::Result<Measured> {
    let body = serde_json::to_vec(&serde_json::json!({
        "input_ids": r.tokens(),
        "sampling_params": {"max_new_tokens": r.output_length, "ignore_eos": true},
        "stream": true,
    }))?;
    let mut req = http::Request::post(url).header(http::header::CONTENT_TYPE, "application/json");
    if let Some(key) = session {
        req = req.header(ServeConfig::default().routing_key_header.as_str(), key);
    }
    let req = req.body(Full::new(Bytes::from(body)))?;
    let t = Instant::now();
    let resp = client.request(req).await?;
    let status = resp.status();
    let mut body = resp.into_body();
    let (mut ttft, mut bytes) = (None, Vec::new());
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if ttft.is_none() && !data.is_empty() {
                ttft = Some(t.elapsed());
            }
            bytes.extend_from_slice(&data);
        }
    }
    let e2e = t.elapsed();
    anyhow::ensure!(
        status.is_success(),
        "status {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    let text = std::str::from_utf8(&bytes)?;
    let last = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .last()
        .context("a stream without events")?;
    let v: serde_json::Value = serde_json::from_str(last)?;
    let meta = &v["meta_info"];
    Ok(Measured {
        prompt: meta["prompt_tokens"].as_u64().unwrap_or(r.input_length),
        cached: meta["cached_tokens"].as_u64().unwrap_or(0),
        from_store: meta["cached_tokens_details"]["storage"]
            .as_u64()
            .unwrap_or(0),
        ttft: ttft.unwrap_or(e2e),
        e2e,
    })
}
