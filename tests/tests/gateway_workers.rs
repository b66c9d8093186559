//! The worker API, health-driven routing, dying workers, and load released on disconnect.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use moongate_tests::{Backend, eventually, fast_config, start_gateway, start_regular_gateway};
use serde_json::{Value, json};

async fn send_json(req: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let v = r.json().await.unwrap_or(Value::Null);
    (status, headers, v)
}

#[tokio::test]
async fn worker_api_create_list_get_patch_delete_duplicate() {
    let a = Backend::start("a", "model-a").await;
    let gw = start_gateway(fast_config()).await;
    let c = reqwest::Client::new();
    let base = gw.url();

    let (st, h, w) = send_json(c.post(format!("{base}/workers")).json(&json!({
        "url": a.url(), "labels": {"zone": "z1"}, "priority": 7, "api_key": "k1"
    })))
    .await;
    assert_eq!(st, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    assert_eq!(h["location"], format!("/workers/{id}").as_str());
    assert_eq!(w["url"], a.url());
    assert_eq!(w["worker_type"], "regular");
    assert_eq!(w["labels"]["zone"], "z1");
    assert_eq!(w["priority"], 7);
    assert_eq!(w["has_api_key"], true);
    assert!(w.get("api_key").is_none(), "keys are never echoed");

    // Duplicate URL (also with a trailing slash) -> 409; bad URLs -> 400.
    let (st, _, e) = send_json(
        c.post(format!("{base}/workers"))
            .json(&json!({"url": format!("{}/", a.url())})),
    )
    .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("worker_exists"))
    );
    for bad in ["127.0.0.1:9", "http://", "ftp://h:1", "", "http://h:1/?q=1"] {
        let (st, _, e) =
            send_json(c.post(format!("{base}/workers")).json(&json!({"url": bad}))).await;
        assert_eq!(
            (st, e["error"]["code"].as_str()),
            (400, Some("invalid_worker")),
            "{bad}: {e}"
        );
    }
    let (st, _, e) = send_json(
        c.post(format!("{base}/workers"))
            .body(r#"{"url": "http://x:1", "bogus": 1}"#),
    )
    .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{e}"
    );
    let (st, _, _) = send_json(c.post(format!("{base}/workers")).body("{nope")).await;
    assert_eq!(st, 400);
    let (st, _, e) = send_json(
        c.post(format!("{base}/workers"))
            .json(&json!({"url": "http://d:1", "worker_type": "decode", "bootstrap_port": 1})),
    )
    .await;
    assert_eq!(st, 400, "{e}");
    let (st, _, p) = send_json(c.post(format!("{base}/workers")).json(
        &json!({"url": "http://127.0.0.1:9", "worker_type": "prefill", "bootstrap_port": 8998}),
    ))
    .await;
    assert_eq!(
        (st, p["worker_type"].as_str(), p["bootstrap_port"].as_u64()),
        (201, Some("prefill"), Some(8998))
    );

    // The model is discovered and the worker becomes ready.
    eventually("discovered and ready", || {
        gw.state()
            .registry()
            .get(&id)
            .is_some_and(|w| w.info().status == openapi::workers::WorkerStatus::Ready)
    })
    .await;
    let (st, _, list) = send_json(c.get(format!("{base}/workers"))).await;
    assert_eq!(st, 200);
    assert_eq!(
        (list["total"].as_u64(), list["ready"].as_u64()),
        (Some(2), Some(1))
    );
    let (st, _, one) = send_json(c.get(format!("{base}/workers/{id}"))).await;
    assert_eq!(
        (st, one["model_id"].as_str(), one["status"].as_str()),
        (200, Some("model-a"), Some("ready"))
    );
    assert_eq!(one["load"], 0);

    // The worker's own key is sent; PATCH rotates it, null falls back to none.
    let chat = json!({"model": "model-a", "messages": []});
    c.post(format!("{base}/v1/chat/completions"))
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(
        a.seen().pop().unwrap().headers["authorization"],
        "Bearer k1"
    );
    let (st, _, w) = send_json(
        c.patch(format!("{base}/workers/{id}"))
            .json(&json!({"labels": {"zone": "z2"}, "priority": 9, "api_key": "k2"})),
    )
    .await;
    assert_eq!(
        (st, w["labels"]["zone"].as_str(), w["priority"].as_u64()),
        (200, Some("z2"), Some(9))
    );
    c.post(format!("{base}/v1/chat/completions"))
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(
        a.seen().pop().unwrap().headers["authorization"],
        "Bearer k2"
    );
    let (st, _, w) = send_json(
        c.patch(format!("{base}/workers/{id}"))
            .json(&json!({"api_key": null})),
    )
    .await;
    assert_eq!(
        (st, w["has_api_key"].as_bool(), w["priority"].as_u64()),
        (200, Some(false), Some(9))
    );
    c.post(format!("{base}/v1/chat/completions"))
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert!(
        a.seen()
            .pop()
            .unwrap()
            .headers
            .get("authorization")
            .is_none()
    );
    let (st, _, _) = send_json(
        c.patch(format!("{base}/workers/nope"))
            .json(&json!({"priority": 1})),
    )
    .await;
    assert_eq!(st, 404);
    let (st, _, _) = send_json(
        c.patch(format!("{base}/workers/{id}"))
            .json(&json!({"priority": "high"})),
    )
    .await;
    assert_eq!(st, 400);

    // DELETE: 202, then gone; the model leaves /v1/models; unknown ids are 404.
    let (st, _, w) = send_json(c.delete(format!("{base}/workers/{id}"))).await;
    assert_eq!((st, w["draining"].as_bool()), (202, Some(true)));
    let (st, _, e) = send_json(c.get(format!("{base}/workers/{id}"))).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (404, Some("worker_not_found"))
    );
    let (st, _, _) = send_json(c.delete(format!("{base}/workers/{id}"))).await;
    assert_eq!(st, 404);
    let (_, _, models) = send_json(c.get(format!("{base}/v1/models"))).await;
    assert_eq!(models["data"], json!([]));
    // Re-registering the URL works once it is gone.
    let (st, _, _) = send_json(
        c.post(format!("{base}/workers"))
            .json(&json!({"url": a.url()})),
    )
    .await;
    assert_eq!(st, 201);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_dying_worker_goes_not_ready_and_gets_no_more_traffic() {
    let a = Backend::start("a", "m").await;
    let b = Backend::start("b", "m").await;
    let gw = start_gateway(gateway::config::ServeConfig {
        policy: gateway::config::PolicyKind::RoundRobin,
        worker_urls: vec![a.url(), b.url()],
        ..fast_config()
    })
    .await;
    eventually("both ready", || gw.state().registry().counts().0 == 2).await;
    let c = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", gw.url());
    for _ in 0..4 {
        assert_eq!(
            c.post(&chat)
                .body(r#"{"model":"m"}"#)
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    assert_eq!((a.hits(), b.hits()), (2, 2));

    b.kill();
    // Requests keep succeeding: a refused connection is retried on the other worker.
    for _ in 0..6 {
        let r = c.post(&chat).body(r#"{"model":"m"}"#).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let registry = gw.state().registry().clone();
    eventually("b not ready", || {
        registry
            .list()
            .iter()
            .any(|w| w.info().status == openapi::workers::WorkerStatus::NotReady)
    })
    .await;
    let b_hits = b.hits();
    for _ in 0..10 {
        let r = c.post(&chat).body(r#"{"model":"m"}"#).send().await.unwrap();
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["worker"], "a");
    }
    assert_eq!(b.hits(), b_hits, "no traffic to the dead worker");
    let (_, _, list) = send_json(c.get(format!("{}/workers", gw.url()))).await;
    assert_eq!(list["ready"], 1);
    let dead = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == b.url())
        .unwrap()
        .clone();
    assert_eq!(dead["status"], "not_ready");
    assert!(
        dead["health"]["last_error"]
            .as_str()
            .unwrap()
            .contains("onnect"),
        "{dead}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_client_leaving_mid_stream_releases_the_workers_load() {
    let a = Backend::start("a", "m").await;
    a.knobs().chunks.store(100, Ordering::Relaxed);
    a.knobs().chunk_delay_ms.store(50, Ordering::Relaxed);
    let gw = start_gateway(gateway::config::ServeConfig {
        worker_urls: vec![a.url()],
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 1).await;
    let worker = gw.state().registry().list()[0].clone();

    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.url()))
        .body(r#"{"model":"m","stream":true}"#)
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    assert_eq!(worker.load(), 1, "counted while streaming");
    drop(body); // the client goes away mid-stream
    eventually("load released", || worker.load() == 0).await;

    // A request whose body is read to the end is released too; with delete the worker
    // drains: it stays until the in-flight stream ends, then goes.
    a.knobs().chunks.store(5, Ordering::Relaxed);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.url()))
        .body(r#"{"model":"m","stream":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(worker.load(), 1);
    gw.state().workers().remove(worker.id());
    assert!(
        gw.state().registry().get(worker.id()).is_some(),
        "kept while a request is in flight"
    );
    let text = r.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"));
    eventually("drained and removed", || {
        gw.state().registry().get(worker.id()).is_none()
    })
    .await;
    assert_eq!(worker.load(), 0);
    tokio::time::sleep(Duration::from_millis(10)).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn worker_api_bodies_are_json_objects_with_sendable_keys() {
    let w = Backend::start("w", "m").await;
    let gw = start_regular_gateway(&[&w], |_| {}).await;
    let c = reqwest::Client::new();
    let base = gw.url();
    let id = gw.state().registry().list()[0].id().to_string();
    let send = |method: reqwest::Method, path: String, body: &'static str| {
        c.request(method, format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for (method, path, body) in [
        // The struct's fields as an array: serde would take it, the document does not.
        (
            reqwest::Method::PATCH,
            format!("/workers/{id}"),
            "[null, null]",
        ),
        (
            reqwest::Method::POST,
            "/workers".to_string(),
            r#"["http://127.0.0.1:9"]"#,
        ),
        // A key that cannot be sent as a header value.
        (
            reqwest::Method::PATCH,
            format!("/workers/{id}"),
            r#"{"api_key": "two words"}"#,
        ),
        (
            reqwest::Method::POST,
            "/workers".to_string(),
            r#"{"url": "http://127.0.0.1:9", "api_key": "tab\tkey"}"#,
        ),
    ] {
        let r = send(method.clone(), path.clone(), body).await.unwrap();
        assert_eq!(r.status(), 400, "{method} {path} {body}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    assert_eq!(gw.state().registry().list().len(), 1, "nothing registered");
    gw.shutdown().await;
}
