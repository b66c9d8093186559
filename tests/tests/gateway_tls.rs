//! `https://` workers: the gateway speaks TLS to them, verifies them against the system's
//! roots plus `--worker-ca-cert`, and never sends a byte of a request to a worker whose
//! certificate it cannot verify.

use gateway::config::ServeConfig;
use moongate_tests::tls::{TlsFront, fixture};
use moongate_tests::{Backend, eventually, fast_config, get_json, post, sse_json, start_gateway};
use serde_json::{Value, json};

fn chat(stream: bool) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_workers_verified_by_the_configured_ca_serve_traffic() {
    let b = Backend::start("tls", "m").await;
    let front = TlsFront::start(b.addr).await;
    let gw = start_gateway(ServeConfig {
        worker_urls: vec![front.url()],
        worker_ca_cert: Some(fixture("ca.pem")),
        ..fast_config()
    })
    .await;
    eventually("the https worker is ready", || {
        gw.state().registry().counts().0 == 1
    })
    .await;
    let c = reqwest::Client::new();
    let workers = get_json(&c, &format!("{}/workers", gw.url())).await;
    assert_eq!(workers["workers"][0]["url"], front.url(), "{workers}");
    assert_eq!(
        workers["workers"][0]["model_id"], "m",
        "discovered over TLS"
    );

    let r = post(
        &c,
        &format!("{}/v1/chat/completions", gw.url()),
        &chat(false),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["worker"], "tls", "{v}");
    let r = post(
        &c,
        &format!("{}/v1/chat/completions", gw.url()),
        &chat(true),
    )
    .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(!sse_json(&text).is_empty(), "{text}");
    assert_eq!(b.hits(), 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_worker_with_an_unknown_issuer_gets_nothing() {
    let b = Backend::start("tls", "m").await;
    let front = TlsFront::start(b.addr).await;
    // The test CA is not among the system's roots, and no --worker-ca-cert names it.
    let gw = start_gateway(ServeConfig {
        worker_urls: vec![front.url()],
        ..fast_config()
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/workers", gw.url());
    let mut last = Value::Null;
    for _ in 0..250 {
        last = get_json(&c, &url).await;
        // Settled: probed and failed enough to be not_ready (pending would still answer 503
        // for its undiscovered model; not_ready without a model answers 404 for "m").
        if last["workers"][0]["status"] == "not_ready" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let err = last["workers"][0]["health"]["last_error"]
        .as_str()
        .unwrap_or_else(|| panic!("no health error: {last}"));
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    assert_eq!(last["workers"][0]["status"], "not_ready", "{last}");
    assert!(
        last["workers"][0]["model_id"].is_null(),
        "nothing discovered: {last}"
    );
    let r = post(
        &c,
        &format!("{}/v1/chat/completions", gw.url()),
        &chat(false),
    )
    .await;
    assert_eq!(r.status(), 404, "the model was never discovered");
    let no_model = json!({"messages": [{"role": "user", "content": "hi"}]});
    let r = post(&c, &format!("{}/v1/chat/completions", gw.url()), &no_model).await;
    assert_eq!(r.status(), 503, "no ready worker");
    assert_eq!(b.hits(), 0, "no request reached an unverified worker");
    gw.shutdown().await;
}

#[test]
fn an_unreadable_or_empty_ca_file_is_refused_before_start() {
    let missing = ServeConfig {
        worker_ca_cert: Some("/nonexistent/ca.pem".into()),
        ..fast_config()
    };
    let err = missing.validate().unwrap_err().to_string();
    assert!(
        err.contains("worker_ca_cert") && err.contains("/nonexistent/ca.pem"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let cfg = ServeConfig {
        worker_ca_cert: Some(empty),
        ..fast_config()
    };
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("no PEM certificate"), "{err}");
}
