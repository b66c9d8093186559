//! Priorities and tenants in admission, over real sockets: at twice the capacity of a
//! simulated worker, requests of a high class wait a fraction of what a low class waits,
//! and every low-class request is either served within the queue timeout or answered 408;
//! a tenant's concurrency and rate limits from the client keys file refuse its own excess
//! (429) and leave other tenants alone; `max_priority` caps the class a tenant may claim.

use std::time::{Duration, Instant};

use gateway::config::ServeConfig;
use moongate_tests::{Backend, eventually, fast_config, start_gateway};
use serde_json::json;
use sim::SimConfig;

/// The p-th percentile (0-100) of `xs` (sorted here).
fn percentile(xs: &mut [f64], p: f64) -> f64 {
    xs.sort_by(f64::total_cmp);
    let i = ((xs.len() as f64 - 1.0) * p / 100.0).round() as usize;
    xs[i]
}

#[tokio::test]
async fn under_twice_the_load_the_high_class_waits_a_fraction_of_the_low() {
    // One worker; each request takes about 50 ms, 4 at once: about 80 requests a second.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service = Duration::from_millis(50);
    let worker = sim::spawn(
        SimConfig {
            ttft: service,
            ..SimConfig::default()
        },
        l,
    )
    .await
    .unwrap();
    let queue_timeout = Duration::from_secs(2);
    let gw = start_gateway(ServeConfig {
        worker_urls: vec![worker.url()],
        max_concurrent_requests: 4,
        queue_size: 1000,
        queue_timeout_secs: queue_timeout.as_secs(),
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 1).await;
    let c = reqwest::Client::new();
    let url = format!("{}/generate", gw.url());
    // Twice the capacity for 3 s, alternating classes: 480 requests, bounded.
    let interval = Duration::from_micros(1_000_000 / 160);
    let mut tasks = Vec::new();
    let start = Instant::now();
    for i in 0..480u32 {
        let class = if i % 2 == 0 { "interactive" } else { "bulk" };
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let r = c
                .post(&url)
                .header("x-smg-priority", class)
                .json(&json!({"text": format!("request {i}"), "sampling_params": {"max_new_tokens": 1}}))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap();
            (class, status, body, sent.elapsed())
        }));
        tokio::time::sleep_until((start + interval * (i + 1)).into()).await;
    }
    let mut waits = std::collections::HashMap::<&str, Vec<f64>>::new();
    let mut timed_out = 0;
    for t in tasks {
        let (class, status, body, took) = t.await.unwrap();
        match status {
            200 => waits
                .entry(class)
                .or_default()
                .push(took.saturating_sub(service).as_secs_f64()),
            408 => {
                assert_eq!(body["error"]["code"], "queue_timeout", "{body}");
                assert!(took < queue_timeout + Duration::from_secs(2), "{took:?}");
                timed_out += 1;
            }
            other => panic!("{class}: {other} {body}"),
        }
        if class == "bulk" && status == 200 {
            assert!(
                took < queue_timeout + service * 4,
                "served past the timeout: {took:?}"
            );
        }
    }
    let high = percentile(waits.get_mut("interactive").unwrap(), 99.0);
    let low = percentile(waits.get_mut("bulk").unwrap(), 99.0);
    eprintln!(
        "p99 queue wait: interactive {:.0} ms, bulk {:.0} ms ({} bulk timed out)",
        high * 1e3,
        low * 1e3,
        timed_out
    );
    assert!(
        high <= 0.2 * low,
        "interactive p99 {high:.3}s vs bulk p99 {low:.3}s"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn tenants_are_held_to_their_own_limits() {
    let w = Backend::start("w", "m").await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(
        &keys,
        "k-one tenant=one concurrency=1\nk-slow tenant=slow rate=1\nk-low tenant=low max_priority=bulk\nk-free\n",
    )
    .unwrap();
    let gw = start_gateway(ServeConfig {
        worker_urls: vec![w.url()],
        client_api_keys_file: Some(keys),
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 1).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let send = |key: &'static str| {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let r = c
                .post(&url)
                .bearer_auth(key)
                .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let retry = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let v: serde_json::Value = r.json().await.unwrap();
            (
                status,
                v["error"]["code"].as_str().map(str::to_owned),
                retry,
            )
        }
    };
    // Tenant "one" holds its one request: its second is refused, others pass.
    w.hold();
    let first = tokio::spawn(send("k-one"));
    eventually("one in flight", || w.in_flight() == 1).await;
    let (st, code, retry) = send("k-one").await;
    assert_eq!(
        (st, code.as_deref()),
        (429, Some("tenant_concurrency_limited"))
    );
    assert_eq!(retry.as_deref(), Some("1"));
    let free = tokio::spawn(send("k-free"));
    eventually("another tenant passes", || w.in_flight() == 2).await;
    w.release();
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(free.await.unwrap().0, 200);
    assert_eq!(send("k-one").await.0, 200, "its slot came back");

    // Tenant "slow": one a second.
    assert_eq!(send("k-slow").await.0, 200);
    let (st, code, retry) = send("k-slow").await;
    assert_eq!((st, code.as_deref()), (429, Some("tenant_rate_limited")));
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(send("k-free").await.0, 200);

    // max_priority: the class claimed is capped (seen in the per-class counter).
    let state = gw.state();
    let admission = state.admission();
    let mut h = http::HeaderMap::new();
    h.insert("x-smg-priority", "system".parse().unwrap());
    let cap = state.auth().settings().tenants[2].max_priority;
    assert_eq!(admission.class_of(&h, cap), gateway::auth::Priority::Bulk);
    assert_eq!(
        admission.class_of(&h, None),
        gateway::auth::Priority::System
    );
    gw.shutdown().await;
}
