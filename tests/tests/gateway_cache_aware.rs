//! The `cache_aware` policy over real sockets: requests sharing a long prefix stick to one
//! worker (chat, completions, token ids), unrelated prefixes spread over the workers, and
//! in PD mode the prefill side routes by prefix too; a cache namespace (`cache_salt`) is a
//! prefix of its own.

use std::collections::HashSet;

use gateway::config::PolicyKind;
use moongate_tests::{Backend, get_text, post, start_regular_gateway, start_two_prefill_pd};
use serde_json::{Value, json};

fn conversation(system: &str, question: &str) -> Value {
    json!({"model": "m", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]})
}

/// Which backend answered.
async fn answered_by(c: &reqwest::Client, url: &str, body: &Value) -> String {
    let r = post(c, url, body).await;
    assert_eq!(r.status(), 200);
    r.json::<Value>().await.unwrap()["worker"]
        .as_str()
        .expect("worker name")
        .to_string()
}

#[tokio::test]
async fn a_shared_prefix_sticks_to_one_worker_and_new_prefixes_spread() {
    let ws = [
        Backend::start("a", "m").await,
        Backend::start("b", "m").await,
        Backend::start("c", "m").await,
    ];
    let gw = start_regular_gateway(&ws.iter().collect::<Vec<_>>(), |c| {
        c.policy = PolicyKind::CacheAware;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    // Three families of conversations, each with its own ~1 KiB system prompt.
    let systems: Vec<String> = (0..3)
        .map(|i| format!("System prompt of tenant {i}: ") + &"be helpful and precise. ".repeat(40))
        .collect();
    let mut owner = Vec::new();
    for s in &systems {
        owner.push(answered_by(&c, &url, &conversation(s, "first question")).await);
    }
    assert_eq!(
        owner.iter().collect::<HashSet<_>>().len(),
        3,
        "new prefixes spread: {owner:?}"
    );
    for round in 0..5 {
        for (i, s) in systems.iter().enumerate() {
            let q = format!("question {round} about something else");
            assert_eq!(
                answered_by(&c, &url, &conversation(s, &q)).await,
                owner[i],
                "family {i} sticks to its worker"
            );
        }
    }
    // Completions and token-id prompts are keyed too.
    let curl = format!("{}/v1/completions", gw.url());
    let long = "Once upon a time in a land far away ".repeat(30);
    let first = answered_by(&c, &curl, &json!({"prompt": format!("{long} A")})).await;
    for tail in ["B", "C", "D"] {
        let p = json!({"prompt": format!("{long} {tail}")});
        assert_eq!(answered_by(&c, &curl, &p).await, first);
    }
    let gurl = format!("{}/generate", gw.url());
    let ids: Vec<u32> = (0..400).collect();
    let first = answered_by(&c, &gurl, &json!({"input_ids": ids})).await;
    for tail in [1000u32, 1001, 1002] {
        let mut more = ids.clone();
        more.push(tail);
        assert_eq!(
            answered_by(&c, &gurl, &json!({"input_ids": more})).await,
            first
        );
    }
    let metrics = get_text(&c, &format!("{}/metrics", gw.url())).await;
    assert!(
        metrics.contains(r#"moongate_gateway_cache_aware_decisions_total{decision="hit"}"#),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn pd_prefill_routes_by_prefix() {
    let (p1, p2, _d, gw) = start_two_prefill_pd(|c| {
        c.prefill_policy = Some(PolicyKind::CacheAware);
        c.decode_policy = Some(PolicyKind::PowerOfTwo);
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/generate", gw.url());
    let long = "The same long document, paragraph after paragraph. ".repeat(30);
    for i in 0..6 {
        let r = post(&c, &url, &json!({"text": format!("{long} question {i}")})).await;
        assert_eq!(r.status(), 200);
    }
    assert!(
        (p1.hits(), p2.hits()) == (6, 0) || (p1.hits(), p2.hits()) == (0, 6),
        "one prefill holds the prefix: {} / {}",
        p1.hits(),
        p2.hits()
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_cache_namespace_never_shares_a_prefix_with_another() {
    let ws = [
        Backend::start("a", "m").await,
        Backend::start("b", "m").await,
    ];
    let gw = start_regular_gateway(&ws.iter().collect::<Vec<_>>(), |c| {
        c.policy = PolicyKind::CacheAware;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let system = "One long system prompt that every tenant sends. ".repeat(30);
    let with = |field: Option<(&str, &str)>, q: &str| {
        let mut body = conversation(&system, q);
        if let Some((k, v)) = field {
            body[k] = json!(v);
        }
        body
    };
    let plain = answered_by(&c, &url, &with(None, "first")).await;
    // Same prompt, another tenant's salt: its prefix is not plain's, it goes elsewhere...
    let salted = answered_by(&c, &url, &with(Some(("cache_salt", "tenant-b")), "first")).await;
    assert_ne!(salted, plain, "a salted prompt is a new prefix");
    // ...and then sticks to its own worker, as plain does to its.
    for q in ["second", "third"] {
        assert_eq!(
            answered_by(&c, &url, &with(Some(("cache_salt", "tenant-b")), q)).await,
            salted
        );
        assert_eq!(answered_by(&c, &url, &with(None, q)).await, plain);
    }
    gw.shutdown().await;
}
