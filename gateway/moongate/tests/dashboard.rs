//! The Grafana dashboard (deploy/grafana/dashboards) queries only metrics Moongate really
//! exposes: a PD gateway hosting the KV master, with simulated prefill and decode workers,
//! a `moongate store` node and a store client, gets traffic (completions, streamed and not,
//! puts, gets, a miss, a refused admin call); then every name the dashboard queries must
//! be in the `/metrics` of the gateway or the storage node, as Prometheus would scrape
//! them. The HA master's metrics (`moongate_master_ha_*`) are checked the same way against
//! a real HA cluster in ha_master.rs (feature `etcd`).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gateway::config::ServeConfig;
use kvclient::{ClientConfig, StoreClient};
use serde_json::json;
use sim::config::{KvTransport, ModelShape};
use sim::{SimConfig, SimMode};

fn pd_cfg(mode: SimMode) -> SimConfig {
    SimConfig {
        mode,
        model_shape: ModelShape::Tiny,
        page_size: 4,
        bootstrap_port: 0,
        kv_transport: KvTransport::Tcp,
        ..SimConfig::default()
    }
}

/// A `moongate store` process, killed when dropped.
struct Node(Child, String);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn text(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

// Multi-threaded: the gateway answers the node while this thread waits for its ready line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exposed_after_traffic() {
    let prefill = common::start(pd_cfg(SimMode::Prefill)).await;
    let decode = common::start(pd_cfg(SimMode::Decode)).await;
    let boot = prefill.bootstrap_addr().unwrap().port();
    let cfg = ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        pd_disaggregation: true,
        prefill: vec![vec![prefill.url(), boot.to_string()]],
        decode: vec![decode.url()],
        health_check_pending_interval_ms: 50,
        // The disaggregate-or-not decider on (its paths are on the dashboard).
        pd_min_uncached_tokens: 1,
        admin_api_key: Some(gateway::config::Secret::new("dashboard-admin-key")),
        ..ServeConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = gateway::launch::spawn(cfg, listener).await.unwrap();
    let base = gw.url();
    let deadline = Instant::now() + Duration::from_secs(20);
    while gw.state().registry().counts().0 < 2 {
        assert!(Instant::now() < deadline, "workers never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A storage node mounted at the hosted master, with a disk tier written through (so a
    // put makes a disk-tier task).
    let disk = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_moongate"))
        .args(["store", "--master", &base, "--segment-size", "16M"])
        .args(["--disk-path", disk.path().join("tier").to_str().unwrap()])
        .args(["--disk-write-policy", "write-through"])
        .args(["--local-buffer-size", "4M", "--http-listen", "127.0.0.1:0"])
        .args(["--heartbeat-interval-ms", "200"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = common::ready_line(&mut child);
    let http = common::word_after(&line, "http").unwrap_or_else(|| panic!("{line:?}"));
    let node = Node(child, format!("http://{http}"));

    // Inference traffic, streamed and not.
    let c = reqwest::Client::new();
    for stream in [false, true, false] {
        let body = json!({"model": "moongate-sim", "prompt": "hello there", "max_tokens": 4,
                          "stream": stream});
        let r = c
            .post(format!("{base}/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        r.bytes().await.unwrap();
    }
    // A caller with a wrong admin key.
    let refused = c
        .get(format!("{base}/workers"))
        .bearer_auth("wrong-key")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    // Store traffic: puts land on the node's segment, a get, a miss.
    let client = StoreClient::connect(ClientConfig {
        local_buffer_size: 4 << 20,
        ..ClientConfig::local(&base, 0)
    })
    .await
    .unwrap();
    let value = common::value(7, 64 << 10);
    client.put("dash-a", &value).await.unwrap();
    assert_eq!(client.get("dash-a").await.unwrap(), value);
    assert!(client.get("dash-missing").await.is_err());

    // Wait (bounded) for the node's heartbeat and transfer gauges, then read both scrapes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (gw_metrics, node_metrics) = loop {
        let g = text(&format!("{base}/metrics")).await;
        let n = text(&format!("{}/metrics", node.1)).await;
        let ready = common::exposes(&n, "moongate_store_heartbeats_total")
            && common::exposes(&n, "moongate_store_disk_bytes")
            && common::exposes(&g, "moongate_master_disk_tasks_total");
        if ready || Instant::now() > deadline {
            break (g, n);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let queried = common::dashboard_metrics();
    assert!(queried.len() >= 20, "{queried:?}");
    let missing: Vec<&String> = queried
        .iter()
        .filter(|m| !m.starts_with("moongate_master_ha_"))
        .filter(|m| !common::exposes(&gw_metrics, m) && !common::exposes(&node_metrics, m))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics nothing exposes: {missing:?}\n--- gateway\n{gw_metrics}\n--- node\n{node_metrics}"
    );
    drop(client);
    gw.shutdown().await;
}
