//! `moongate demo`: a gateway on 127.0.0.1:30000 in front of two in-process simulated
//! workers, with copy-paste curl examples for every route. Ctrl-C stops everything. The
//! workers cache prefixes, publish their KV events (the gateway routes on them) and keep
//! an L3 tier in the store of the KV master the gateway hosts (`--kv-store`), so one
//! worker loads what the other computed.
//!
//! `moongate demo --pd`: the gateway in PD mode in front of a simulated prefill and a
//! simulated decode worker that move real KV pages with the transfer engine; each room's
//! move (bytes, time, rate) is printed as it happens.

use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::config::{KvTransport, ModelShape, WritePolicy};
use crate::pd::KvEvent;
use crate::{SimConfig, SimHandle, SimMode};
use gateway::config::{PolicyKind, ServeConfig};
use gateway::launch::{self, Gateway};

/// `moongate demo` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct DemoConfig {
    /// Address the gateway binds.
    #[arg(long, default_value_t = DemoConfig::default().host)]
    pub host: String,
    /// Port the gateway binds (0: any free port).
    #[arg(long, default_value_t = DemoConfig::default().port)]
    pub port: u16,
    /// Simulated workers behind it.
    #[arg(long, default_value_t = DemoConfig::default().workers)]
    pub workers: usize,
    /// Model the simulated workers serve.
    #[arg(long, default_value_t = DemoConfig::default().model)]
    pub model: String,
    /// Simulated time per output token, so streams are visibly streamed (e.g. `30ms`).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30ms")]
    #[serde(skip)]
    pub tpot: Duration,
    /// Prefill/decode disaggregation: one prefill and one decode worker (`--workers` is
    /// ignored) moving real KV pages.
    #[arg(long)]
    pub pd: bool,
    /// With `--pd`: the model shape sizing the KV (bytes per token).
    #[arg(long, value_enum, default_value_t = DemoConfig::default().model_shape)]
    pub model_shape: ModelShape,
    /// With `--pd`: how the KV travels (`auto`: shared memory on one host; `tcp`: loopback TCP).
    #[arg(long, value_enum, default_value_t = DemoConfig::default().kv_transport)]
    pub kv_transport: KvTransport,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 30000,
            workers: 2,
            model: SimConfig::default().model,
            tpot: Duration::from_millis(30),
            pd: false,
            model_shape: SimConfig::default().model_shape,
            kv_transport: SimConfig::default().kv_transport,
        }
    }
}

/// Memory each demo worker contributes to the store.
pub const DEMO_STORE_SEGMENT: u64 = 64 << 20;

/// A running demo.
#[derive(Debug)]
pub struct Demo {
    gateway: Gateway,
    sims: Vec<SimHandle>,
    model: String,
    pd: bool,
}

impl Demo {
    /// Starts the workers and the gateway, and waits until every worker is ready.
    pub async fn start(cfg: DemoConfig) -> anyhow::Result<Self> {
        // Every worker caches prefixes, reports cached tokens and publishes its KV events
        // (loopback, any free port); the gateway routes on them (`kv_aware`).
        let sim = |mode| SimConfig {
            model: cfg.model.clone(),
            tpot: cfg.tpot,
            mode,
            model_shape: cfg.model_shape,
            kv_transport: cfg.kv_transport,
            bootstrap_port: 0,
            enable_cache_report: true,
            kv_events_config: Some(sglang::kv_events::KvEventsConfig {
                endpoint: format!("tcp://{}:0", cfg.host),
                replay_endpoint: Some(format!("tcp://{}:0", cfg.host)),
                ..sglang::kv_events::KvEventsConfig::default()
            }),
            ..SimConfig::default()
        };
        let (host, sim) = (cfg.host.as_str(), &sim);
        let spawn_sims = |modes: Vec<SimMode>, store: Option<String>| async move {
            let mut sims = Vec::with_capacity(modes.len());
            for mode in modes {
                let listener = TcpListener::bind((host, 0)).await?;
                let c = SimConfig {
                    kv_store: store.clone(),
                    kv_store_segment_size: DEMO_STORE_SEGMENT,
                    // Pages reach the store as they are computed, so the example needs
                    // no evictions.
                    kv_store_write_policy: WritePolicy::WriteThrough,
                    ..sim(mode)
                };
                sims.push(crate::spawn(c, listener).await?);
            }
            anyhow::Ok(sims)
        };
        let listener = TcpListener::bind((cfg.host.as_str(), cfg.port))
            .await
            .with_context(|| {
                format!(
                    "binding {}:{} (is another demo running?)",
                    cfg.host, cfg.port
                )
            })?;
        let mut serve_cfg = ServeConfig {
            host: cfg.host.clone(),
            port: cfg.port,
            policy: PolicyKind::KvAware,
            health_check_interval_secs: 5,
            shutdown_grace_period_secs: 5,
            ..ServeConfig::default()
        };
        let (gateway, sims) = if cfg.pd {
            let sims = spawn_sims(vec![SimMode::Prefill, SimMode::Decode], None).await?;
            let boot = sims[0].bootstrap_addr().map_or(0, |a| a.port());
            serve_cfg.pd_disaggregation = true;
            serve_cfg.prefill = vec![vec![sims[0].url(), boot.to_string()]];
            serve_cfg.decode = vec![sims[1].url()];
            serve_cfg.validate()?;
            (launch::spawn(serve_cfg, listener).await?, sims)
        } else {
            // The gateway first: the workers mount their L3 in the master it hosts.
            serve_cfg.validate()?;
            let gateway = launch::spawn(serve_cfg, listener).await?;
            let modes = vec![SimMode::Regular; cfg.workers];
            let sims = spawn_sims(modes, Some(gateway.url())).await?;
            let urls: Vec<String> = sims.iter().map(SimHandle::url).collect();
            gateway
                .state()
                .workers()
                .add_static(&urls)
                .map_err(|e| anyhow::anyhow!("registering the demo workers: {e}"))?;
            (gateway, sims)
        };
        for _ in 0..250 {
            if gateway.state().registry().counts().0 == sims.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self {
            gateway,
            sims,
            model: cfg.model,
            pd: cfg.pd,
        })
    }

    /// With `--pd`: every room the prefill moves from now on.
    pub fn kv_moves(&self) -> Option<tokio::sync::broadcast::Receiver<KvEvent>> {
        let prefill = self.sims.first().filter(|_| self.pd)?;
        Some(prefill.pd()?.subscribe())
    }

    /// The gateway.
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// What to try, as shell commands.
    pub fn instructions(&self) -> String {
        if self.pd {
            return self.pd_instructions();
        }
        let url = self.gateway.url();
        let m = &self.model;
        let workers = self.gateway.state().registry().list();
        let first = workers
            .first()
            .map(|w| w.id().to_string())
            .unwrap_or_else(|| "<id>".into());
        let sims: Vec<String> = self.sims.iter().map(SimHandle::url).collect();
        format!(
            r#"Moongate demo: gateway {url} -> {n} simulated SGLang workers ({sims}), model "{m}".

# Chat completion
curl -s {url}/v1/chat/completions -H 'content-type: application/json' \
  -d '{{"model":"{m}","messages":[{{"role":"user","content":"Tell me about the moon."}}],"max_tokens":16}}'

# Chat completion, streamed (server-sent events, ends with data: [DONE])
curl -sN {url}/v1/chat/completions -H 'content-type: application/json' \
  -d '{{"model":"{m}","messages":[{{"role":"user","content":"Tell me about the moon."}}],"max_tokens":16,"stream":true}}'

# Text completion
curl -s {url}/v1/completions -H 'content-type: application/json' \
  -d '{{"model":"{m}","prompt":"The gate opens at","max_tokens":8}}'

# SGLang native generation
curl -s {url}/generate -H 'content-type: application/json' \
  -d '{{"text":"The gate opens at","sampling_params":{{"max_new_tokens":8}}}}'

# Prefix caching: run this twice; the second answer reports meta_info.cached_tokens 32 (the
# workers' KV events tell the gateway (policy kv_aware) where the prefix is cached)
curl -s {url}/generate -H 'content-type: application/json' \
  -d '{{"input_ids":[{ids}],"sampling_params":{{"max_new_tokens":4}}}}'

# L3: each worker also writes the pages it computes to the store of the KV master the gateway
# hosts (SGLang HiCache's write-through). Empty both workers' GPU caches, run the prefix-caching
# example again: cached_tokens 32 once more, now loaded from the store ("store" counters)
curl -s -X POST {w0}/flush_cache; curl -s -X POST {w1}/flush_cache
curl -s {w0}/sim/prefix; echo; curl -s {w1}/sim/prefix; echo

# Models, readiness, metrics, OpenAPI document (Swagger UI: open {url}/docs in a browser)
curl -s {url}/v1/models
curl -s {url}/readiness
curl -s {url}/metrics | grep moongate_gateway
curl -s {url}/api-docs/openapi.json | head -c 300; echo

# The KV master the gateway hosts
curl -s {url}/api/v1/stats
curl -s {url}/api/v1/segments

# Worker API: list, inspect, relabel, drain and remove, register again
curl -s {url}/workers
curl -s {url}/workers/{first}
curl -s -X PATCH {url}/workers/{first} -H 'content-type: application/json' -d '{{"labels":{{"zone":"a"}},"priority":80}}'
curl -s -X DELETE {url}/workers/{first}
curl -si -X POST {url}/workers -H 'content-type: application/json' -d '{{"url":"{w0}"}}'

Ctrl-C stops the demo.
"#,
            n = self.sims.len(),
            sims = sims.join(", "),
            w0 = sims.first().cloned().unwrap_or_default(),
            w1 = sims.last().cloned().unwrap_or_default(),
            ids = (1000..1040)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        )
    }

    fn pd_instructions(&self) -> String {
        let url = self.gateway.url();
        let (p, d) = (self.sims[0].url(), self.sims[1].url());
        let boot = self.sims[0].bootstrap_addr().map_or(0, |a| a.port());
        let kv = self.sims[0].pd().map(|s| s.stats());
        let (shape, per_token) =
            kv.map_or((String::new(), 0), |s| (s.model_shape, s.bytes_per_token));
        format!(
            r#"Moongate PD demo: gateway {url} -> prefill {p} (bootstrap port {boot}) + decode {d}, model "{m}".
KV: {shape} shape, {kib} KiB per token, computed by the prefill from the token ids and written
into the decode's memory with the transfer engine; the decode checks every page, then generates.

# A request (its KV move is printed below)
curl -s {url}/generate -H 'content-type: application/json' \
  -d '{{"text":"The gate opens at dawn and the caravans move west","sampling_params":{{"max_new_tokens":16}}}}'

# Streamed chat
curl -sN {url}/v1/chat/completions -H 'content-type: application/json' \
  -d '{{"model":"{m}","messages":[{{"role":"user","content":"Tell me about the moon."}}],"max_tokens":16,"stream":true}}'

# A batch: one bootstrap room per prompt
curl -s {url}/v1/completions -H 'content-type: application/json' \
  -d '{{"model":"{m}","prompt":["The gate opens at","The river flows past"],"max_tokens":8}}'

# Prompt logprobs come from the prefill, merged into decode's answer
curl -s {url}/generate -H 'content-type: application/json' \
  -d '{{"text":"The gate opens","return_logprob":true,"logprob_start_len":0,"sampling_params":{{"max_new_tokens":4}}}}'

# Each side's KV pool and moves; the gateway's PD metrics; the bootstrap server
curl -s {p}/sim/kv; echo
curl -s {d}/sim/kv; echo
curl -s {url}/metrics | grep moongate_gateway_pd
curl -s 'http://127.0.0.1:{boot}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1'; echo

Ctrl-C stops the demo. KV moves:
"#,
            m = self.model,
            kib = per_token / 1024,
        )
    }

    /// Stops the workers (which unmount their L3 from the gateway's master), then the
    /// gateway.
    pub async fn shutdown(self) {
        for s in self.sims {
            s.shutdown_within(Duration::from_secs(1)).await;
        }
        self.gateway.shutdown().await;
    }
}

/// `moongate demo`: start, print the examples, run until Ctrl-C / SIGTERM.
pub async fn run(cfg: DemoConfig) -> anyhow::Result<()> {
    let stop = gateway::listen::shutdown_signal();
    let demo = Demo::start(cfg).await?;
    say(&demo.instructions());
    if let Some(mut moves) = demo.kv_moves() {
        tokio::spawn(async move {
            loop {
                match moves.recv().await {
                    Ok(e) => say(&describe(&e)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        say(&format!("({n} KV moves not shown)"))
                    }
                    Err(_) => return,
                }
            }
        });
    }
    stop.await;
    say("stopping");
    demo.shutdown().await;
    Ok(())
}

/// Prints `text` and a newline to stdout. A reader that went away (`moongate demo | head
/// -1`) does not stop the demo: `println!` would panic on the closed pipe.
fn say(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

/// One line about one room's KV move.
pub fn describe(e: &KvEvent) -> String {
    let secs = e.took.as_secs_f64();
    let rate = if secs > 0.0 {
        e.bytes as f64 / secs / 1e9
    } else {
        0.0
    };
    format!(
        "KV room {:>19}: {} tokens, {} pages, {:.2} MiB moved in {:.3} ms ({rate:.2} GB/s); computed in {:.3} ms",
        e.room,
        e.tokens,
        e.pages,
        e.bytes as f64 / (1 << 20) as f64,
        secs * 1e3,
        e.compute.as_secs_f64() * 1e3,
    )
}
