//! Simulated workers with SGLang HiCache's L3 on a Moongate store: what the store tests
//! share.

use sglang::kv_events::KvEventsConfig;
use sim::config::WritePolicy;
use sim::{SimConfig, SimHandle};
use tokio::net::TcpListener;

/// Tokens per page of [`store_sim`]'s workers.
pub const PAGE: usize = 4;
/// Pages [`store_sim`]'s GPU cache holds.
pub const POOL_PAGES: u64 = 8;

/// A worker whose prefix cache holds [`POOL_PAGES`] pages of [`PAGE`] tokens, with L3 on
/// `master` written with `policy`, publishing its KV events (with replay) on loopback.
pub fn store_sim(master: &str, policy: WritePolicy) -> SimConfig {
    SimConfig {
        port: 0,
        model: "m".into(),
        model_shape: sim::ModelShape::Tiny,
        page_size: PAGE as u32,
        kv_pool_size: POOL_PAGES * (PAGE as u64) * 128,
        kv_transport: sim::config::KvTransport::Tcp,
        kv_store: Some(master.to_owned()),
        kv_store_write_policy: policy,
        kv_store_segment_size: 1 << 20,
        kv_store_buffer_size: 1 << 20,
        kv_events_config: Some(KvEventsConfig {
            endpoint: "tcp://127.0.0.1:0".into(),
            replay_endpoint: Some("tcp://127.0.0.1:0".into()),
            ..KvEventsConfig::default()
        }),
        ..SimConfig::default()
    }
}

/// Starts a simulated worker configured `cfg` on 127.0.0.1.
pub async fn start_sim(cfg: SimConfig) -> SimHandle {
    sim::spawn(cfg, TcpListener::bind("127.0.0.1:0").await.expect("bind"))
        .await
        .expect("start the simulated worker")
}

/// Registers `sims` with the gateway `gw` (`POST /workers`) and waits until all are ready.
pub async fn register(c: &reqwest::Client, gw: &gateway::launch::Gateway, sims: &[&SimHandle]) {
    for s in sims {
        let r = c
            .post(format!("{}/workers", gw.url()))
            .json(&serde_json::json!({"url": s.url()}))
            .send()
            .await
            .expect("POST /workers");
        assert_eq!(r.status(), 201);
    }
    crate::eventually("workers ready", || {
        gw.state().registry().counts().0 == sims.len()
    })
    .await;
}
