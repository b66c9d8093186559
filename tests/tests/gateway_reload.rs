//! Configuration reload, in process (`gateway::reload`): what changes, what needs a
//! restart, an invalid configuration changing nothing, and requests in flight surviving it.
//! The SIGHUP path of a real `moongate serve` is `gateway/moongate/tests/reload_cli.rs`.

use std::sync::atomic::Ordering;

use gateway::config::{ConfigError, PolicyKind, Secret, ServeConfig};
use gateway::reload;
use moongate_tests::{Backend, eventually, get_json, get_text, sse_json, start_regular_gateway};
use serde_json::{Value, json};

fn chat(stream: bool) -> Value {
    json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

async fn infer(c: &reqwest::Client, base: &str, key: &str, stream: bool) -> reqwest::Response {
    c.post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat(stream))
        .send()
        .await
        .unwrap()
}

async fn status_of(c: &reqwest::Client, url: &str, key: &str) -> u16 {
    c.get(url)
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_policies_limits_keys_and_workers_without_dropping_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "old-key\n").unwrap();
    let a = Backend::start("a", "m").await;
    let b = Backend::start("b", "m").await;
    for w in [&a, &b] {
        w.knobs().chunks.store(5, Ordering::Relaxed);
        w.knobs().chunk_delay_ms.store(150, Ordering::Relaxed);
    }
    let gw = start_regular_gateway(&[&a], |c| {
        c.client_api_keys_file = Some(keys.clone());
        c.admin_api_key = Some(Secret::new("admin-1"));
        c.store_api_key = Some(Secret::new("st0re"));
    })
    .await;
    let base = gw.url();
    let c = reqwest::Client::new();

    // A stream in flight on the worker the reload removes.
    let stream = tokio::spawn({
        let (c, base) = (c.clone(), base.clone());
        async move {
            infer(&c, &base, "old-key", true)
                .await
                .text()
                .await
                .unwrap()
        }
    });
    eventually("the stream is in flight", || a.in_flight() == 1).await;

    std::fs::write(&keys, "# rotated\nnew-key\n").unwrap();
    let before = gw.state().applied_config();
    let new = ServeConfig {
        worker_urls: vec![b.url()],
        policy: PolicyKind::RoundRobin,
        max_concurrent_requests: 1,
        queue_size: 0,
        admin_api_key: Some(Secret::new("admin-2")),
        request_timeout_secs: before.request_timeout_secs + 1,
        ..before.clone()
    };
    let done = reload::reload(gw.state(), || Ok(new)).unwrap();
    let mut applied = done.applied.clone();
    applied.sort();
    assert_eq!(
        applied,
        [
            "admin_api_key",
            "client_api_keys",
            "max_concurrent_requests",
            "policy",
            "queue_size",
            "worker_urls"
        ]
    );
    assert_eq!(done.need_restart, ["request_timeout_secs"]);
    assert_eq!(done.workers_added, [b.url()]);
    assert_eq!(done.workers_removed, [a.url()]);
    assert!(done.problems.is_empty(), "{:?}", done.problems);
    let in_force = gw.state().applied_config();
    assert_eq!(in_force.request_timeout_secs, before.request_timeout_secs);
    assert_eq!(in_force.policy, PolicyKind::RoundRobin);

    // The stream admitted before the reload ends whole, on the removed worker.
    let text = stream.await.unwrap();
    assert_eq!(sse_json(&text).len(), 5, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    eventually("a gone, b ready", || {
        let list = gw.state().registry().list();
        list.len() == 1
            && list[0].url().as_str() == b.url()
            && gw.state().registry().counts().0 == 1
    })
    .await;

    // The new keys, the new policy, the new limits.
    assert_eq!(infer(&c, &base, "old-key", false).await.status(), 401);
    assert_eq!(infer(&c, &base, "new-key", false).await.status(), 200);
    assert_eq!(
        status_of(&c, &format!("{base}/workers"), "admin-1").await,
        401
    );
    assert_eq!(
        status_of(&c, &format!("{base}/workers"), "admin-2").await,
        200
    );
    assert_eq!(gw.state().router().policy().kind(), PolicyKind::RoundRobin);
    let held = tokio::spawn({
        let (c, base) = (c.clone(), base.clone());
        async move {
            infer(&c, &base, "new-key", true)
                .await
                .text()
                .await
                .unwrap()
        }
    });
    eventually("one request holds the only slot", || b.in_flight() == 1).await;
    let r = infer(&c, &base, "new-key", false).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_full", "{v}");
    held.await.unwrap();

    let metrics = get_text(&c, &format!("{base}/metrics")).await;
    assert!(
        metrics.contains("moongate_config_reloads_total{result=\"ok\"}"),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_configuration_changes_nothing_and_the_document_follows_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "k-1\n").unwrap();
    let w = Backend::start("w", "m").await;
    let gw = start_regular_gateway(&[&w], |c| {
        c.client_api_keys_file = Some(keys.clone());
        c.store_api_key = Some(Secret::new("st0re"));
    })
    .await;
    let (base, c) = (gw.url(), reqwest::Client::new());
    let start = gw.state().applied_config();

    // A keys file gone bad, a bad value, an unreadable file: refused, nothing changes.
    std::fs::write(&keys, "k-2\nsecret with spaces\n").unwrap();
    let err = reload::reload(gw.state(), || {
        Ok(ServeConfig {
            policy: PolicyKind::Random,
            ..start.clone()
        })
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("client_api_keys_file") && err.contains("line 2"),
        "{err}"
    );
    assert!(!err.contains("secret with spaces"), "{err}");
    let bad = ServeConfig {
        queue_timeout_secs: 0,
        policy: PolicyKind::Random,
        ..start.clone()
    };
    std::fs::write(&keys, "k-2\n").unwrap();
    let err = reload::reload(gw.state(), || Ok(bad))
        .unwrap_err()
        .to_string();
    assert!(err.contains("queue_timeout_secs"), "{err}");
    let err = reload::reload(gw.state(), || {
        Err(ConfigError::Parse {
            path: "moongate.toml".into(),
            message: "expected `=`".into(),
        })
    })
    .unwrap_err();
    assert!(err.to_string().contains("moongate.toml"), "{err}");
    assert_eq!(gw.state().applied_config(), start);
    assert_eq!(gw.state().router().policy().kind(), start.policy);
    assert_eq!(
        infer(&c, &base, "k-1", false).await.status(),
        200,
        "the old key still works"
    );
    assert_eq!(infer(&c, &base, "k-2", false).await.status(), 401);
    let metrics = get_text(&c, &format!("{base}/metrics")).await;
    assert!(
        metrics.contains("moongate_config_reloads_total{result=\"invalid\"}"),
        "{metrics}"
    );

    // Without the keys file inference is open, and the document says so; with it back, the
    // new keys are in force and documented.
    let doc_url = format!("{base}/api-docs/openapi.json");
    let doc_of = || get_json(&c, &doc_url);
    assert!(doc_of().await["paths"]["/v1/models"]["get"]["security"].is_array());
    reload::reload(gw.state(), || {
        Ok(ServeConfig {
            client_api_keys_file: None,
            ..start.clone()
        })
    })
    .unwrap();
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let doc = doc_of().await;
    assert!(
        doc["paths"]["/v1/models"]["get"]["security"].is_null(),
        "{}",
        doc["paths"]["/v1/models"]
    );
    assert!(doc["components"]["securitySchemes"]["client_api_key"].is_null());
    let done = reload::reload(gw.state(), || Ok(start.clone())).unwrap();
    assert_eq!(done.applied, ["client_api_keys_file"]);
    assert_eq!(infer(&c, &base, "k-2", false).await.status(), 200);
    assert_eq!(infer(&c, &base, "k-1", false).await.status(), 401);
    let doc = doc_of().await;
    assert_eq!(
        doc["paths"]["/v1/models"]["get"]["security"],
        json!([{"client_api_key": []}])
    );
    assert!(doc["paths"]["/v1/models"]["get"]["responses"]["401"].is_object());
    gw.shutdown().await;
}
