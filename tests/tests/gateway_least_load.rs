//! `least_load` against two simulated SGLang workers: the gateway polls each worker's own
//! `/v1/loads`, so a worker busy with requests the gateway never saw (sent to it directly,
//! or through another gateway replica) gets none of the new ones while the other is free.

use std::sync::Arc;
use std::time::Duration;

use gateway::config::{PolicyKind, ServeConfig};
use moongate_tests::{eventually, fast_config, start_gateway};
use serde_json::json;
use sim::SimConfig;

#[tokio::test]
async fn work_goes_to_the_worker_whose_queue_clears_first() {
    let mut workers = Vec::new();
    for _ in 0..2 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cfg = SimConfig {
            ttft: Duration::from_secs(3),
            ..SimConfig::default()
        };
        workers.push(sim::spawn(cfg, l).await.unwrap());
    }
    let gw = start_gateway(ServeConfig {
        worker_urls: workers.iter().map(|w| w.url()).collect(),
        policy: PolicyKind::LeastLoad,
        load_poll_interval_secs: 1,
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 2).await;
    let c = reqwest::Client::new();
    let long = "the moon is far away and bright tonight ".repeat(300);
    // The first worker gets four long prompts straight, behind the gateway's back.
    let busy_url = workers[0].url();
    let mut direct = Vec::new();
    for i in 0..4 {
        let (c, url, text) = (
            c.clone(),
            format!("{busy_url}/generate"),
            format!("{i} {long}"),
        );
        direct.push(tokio::spawn(async move {
            c.post(url)
                .json(&json!({"text": text, "sampling_params": {"max_new_tokens": 1}}))
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    let state = gw.state().clone();
    let worker_of = |url: &str| {
        state
            .registry()
            .snapshot()
            .iter()
            .find(|w| w.url().as_str().trim_end_matches('/') == url)
            .cloned()
            .unwrap()
    };
    let (busy, free) = (worker_of(&workers[0].url()), worker_of(&workers[1].url()));
    eventually("the gateway reads the busy worker's report", || {
        busy.reported().is_some_and(|r| r.used_tokens > 4000)
    })
    .await;
    // Four through the gateway at once: all to the free worker.
    let mut via = Vec::new();
    for i in 0..4 {
        let (c, url) = (c.clone(), format!("{}/generate", gw.url()));
        via.push(tokio::spawn(async move {
            c.post(url)
                .json(&json!({"text": format!("short {i}"), "sampling_params": {"max_new_tokens": 1}}))
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    let (b, f) = (Arc::clone(&busy), Arc::clone(&free));
    eventually("four in flight on the free worker", move || f.load() == 4).await;
    assert_eq!(b.load(), 0, "none went to the busy worker");
    for t in direct.into_iter().chain(via) {
        assert_eq!(t.await.unwrap(), 200);
    }
    gw.shutdown().await;
}
