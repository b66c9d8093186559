//! `moongate demo`: a gateway on 127.0.0.1:30000 in front of two in-process simulated
//! workers, with copy-paste curl examples for every route. Ctrl-C stops everything.

use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::config::{PolicyKind, ServeConfig};
use crate::serve::{self, Gateway};
use crate::sim::{self, SimConfig, SimHandle};

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
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 30000,
            workers: 2,
            model: SimConfig::default().model,
            tpot: Duration::from_millis(30),
        }
    }
}

/// A running demo.
#[derive(Debug)]
pub struct Demo {
    gateway: Gateway,
    sims: Vec<SimHandle>,
    model: String,
}

impl Demo {
    /// Starts the workers and the gateway, and waits until every worker is ready.
    pub async fn start(cfg: DemoConfig) -> anyhow::Result<Self> {
        let mut sims = Vec::with_capacity(cfg.workers);
        for _ in 0..cfg.workers {
            let listener = TcpListener::bind((cfg.host.as_str(), 0)).await?;
            let sim_cfg = SimConfig {
                model: cfg.model.clone(),
                tpot: cfg.tpot,
                ..SimConfig::default()
            };
            sims.push(sim::spawn(sim_cfg, listener).await?);
        }
        let listener = TcpListener::bind((cfg.host.as_str(), cfg.port))
            .await
            .with_context(|| {
                format!(
                    "binding {}:{} (is another demo running?)",
                    cfg.host, cfg.port
                )
            })?;
        let serve_cfg = ServeConfig {
            host: cfg.host.clone(),
            port: cfg.port,
            worker_urls: sims.iter().map(SimHandle::url).collect(),
            policy: PolicyKind::PowerOfTwo,
            health_check_interval_secs: 5,
            shutdown_grace_period_secs: 5,
            ..ServeConfig::default()
        };
        serve_cfg.validate()?;
        let gateway = serve::spawn(serve_cfg, listener).await?;
        for _ in 0..250 {
            if gateway.state().registry().counts().0 == cfg.workers {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self {
            gateway,
            sims,
            model: cfg.model,
        })
    }

    /// The gateway.
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// What to try, as shell commands.
    pub fn instructions(&self) -> String {
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

# Models, readiness, metrics, OpenAPI document
curl -s {url}/v1/models
curl -s {url}/readiness
curl -s {url}/metrics | grep moongate_gateway
curl -s {url}/openapi.json | head -c 300; echo

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
        )
    }

    /// Stops the gateway, then the workers.
    pub async fn shutdown(self) {
        self.gateway.shutdown().await;
        for s in self.sims {
            s.shutdown_within(Duration::from_secs(1)).await;
        }
    }
}

/// `moongate demo`: start, print the examples, run until Ctrl-C / SIGTERM.
pub async fn run(cfg: DemoConfig) -> anyhow::Result<()> {
    let stop = serve::shutdown_signal();
    let demo = Demo::start(cfg).await?;
    println!("{}", demo.instructions());
    stop.await;
    println!("stopping");
    demo.shutdown().await;
    Ok(())
}
