//! Affinity over real sockets: a routing key header keeps a session on one worker under
//! `consistent_hashing` (and the keys spread), a key's worker going away moves only that
//! key, a target header reaches the worker it names under any policy or gets a 503 that
//! names it, and the header names are configurable.

use std::collections::{HashMap, HashSet};

use gateway::config::PolicyKind;
use moongate_tests::{Backend, get_json, get_text, start_regular_gateway};
use serde_json::{Value, json};

/// Which backend answered a chat request with these extra headers.
async fn answered_by(c: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    asked(c, url, headers, "hello").await
}

/// Which backend answered a chat request saying `content`, with these extra headers.
async fn asked(
    c: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    content: &str,
) -> (u16, Value) {
    let mut req = c.post(url).json(&json!({"model": "m", "messages": [
        {"role": "user", "content": content}]}));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn worker(v: &Value) -> String {
    v["worker"].as_str().expect("worker name").to_string()
}

#[tokio::test]
async fn a_routing_key_keeps_its_session_on_one_worker_and_keys_spread() {
    let ws = [
        Backend::start("a", "m").await,
        Backend::start("b", "m").await,
        Backend::start("c", "m").await,
    ];
    let gw = start_regular_gateway(&ws.iter().collect::<Vec<_>>(), |c| {
        c.policy = PolicyKind::ConsistentHashing;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let mut home = HashMap::new();
    for s in 0..30 {
        let key = format!("session-{s}");
        let (st, v) = answered_by(&c, &url, &[("x-smg-routing-key", &key)]).await;
        assert_eq!(st, 200);
        home.insert(key, worker(&v));
    }
    assert_eq!(
        home.values().collect::<HashSet<_>>().len(),
        3,
        "keys spread over the workers: {home:?}"
    );
    for _ in 0..3 {
        for (key, w) in &home {
            let (_, v) = answered_by(&c, &url, &[("x-smg-routing-key", key)]).await;
            assert_eq!(&worker(&v), w, "{key} stays on its worker");
        }
    }
    // One worker dies: its keys go elsewhere (after its failed try), the others stay.
    ws[1].kill();
    for (key, w) in &home {
        let (st, v) = answered_by(&c, &url, &[("x-smg-routing-key", key)]).await;
        assert_eq!(st, 200);
        if w != "b" {
            assert_eq!(&worker(&v), w, "{key} did not move");
        } else {
            assert_ne!(worker(&v), "b");
        }
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_target_header_reaches_the_named_worker_or_a_503_names_it() {
    let ws = [
        Backend::start("a", "m").await,
        Backend::start("b", "m").await,
    ];
    let gw = start_regular_gateway(&ws.iter().collect::<Vec<_>>(), |c| {
        c.policy = PolicyKind::RoundRobin;
        c.target_worker_header = "x-target".into();
        c.routing_key_header = "x-session".into();
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let b = ws[1].url();
    for _ in 0..4 {
        let (st, v) = answered_by(&c, &url, &[("x-target", &b)]).await;
        assert_eq!((st, worker(&v).as_str()), (200, "b"));
    }
    // By the id the worker API lists.
    let list = get_json(&c, &format!("{}/workers", gw.url())).await;
    let a_id = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| {
            w["url"].as_str().unwrap().trim_end_matches('/') == ws[0].url().trim_end_matches('/')
        })
        .expect("worker a listed")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (st, v) = answered_by(&c, &url, &[("x-target", &a_id)]).await;
    assert_eq!((st, worker(&v).as_str()), (200, "a"));
    // An unknown target: 503 in the OpenAI envelope, naming it; never another worker.
    let (st, v) = answered_by(&c, &url, &[("x-target", "http://127.0.0.1:9")]).await;
    assert_eq!(st, 503);
    assert_eq!(v["error"]["code"], "target_worker_unavailable");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("http://127.0.0.1:9")
    );
    // smg's default header names are not read once others are configured.
    let (st, _) = answered_by(&c, &url, &[("x-smg-target-worker", "http://127.0.0.1:9")]).await;
    assert_eq!(st, 200);
    gw.shutdown().await;
}

#[tokio::test]
async fn manual_keeps_each_session_where_its_first_request_went() {
    let ws = [
        Backend::start("a", "m").await,
        Backend::start("b", "m").await,
        Backend::start("c", "m").await,
    ];
    let gw = start_regular_gateway(&ws.iter().collect::<Vec<_>>(), |c| {
        c.policy = PolicyKind::Manual;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let mut home = HashMap::new();
    for s in 0..12 {
        // Each session opens with a prompt of its own: cache_aware spreads them.
        let key = format!("user-{s}");
        let opening = format!("{key} opens with its own long story. ").repeat(20);
        let (st, v) = asked(&c, &url, &[("x-smg-routing-key", &key)], &opening).await;
        assert_eq!(st, 200);
        home.insert(key, worker(&v));
    }
    assert!(
        home.values().collect::<HashSet<_>>().len() >= 2,
        "new sessions spread: {home:?}"
    );
    for _ in 0..3 {
        for (key, w) in &home {
            let (_, v) = answered_by(&c, &url, &[("x-smg-routing-key", key)]).await;
            assert_eq!(&worker(&v), w, "{key} stays with its worker");
        }
    }
    let m = get_text(&c, &format!("{}/metrics", gw.url())).await;
    assert!(
        m.contains(r#"moongate_gateway_sticky_decisions_total{decision="hit"} 36"#),
        "{m}"
    );
    gw.shutdown().await;
}
