//! The gateway's routes over real sockets: proxying (JSON and SSE), pass-through of the
//! body, request ids, api keys, and each error status in the OpenAI envelope.

use std::time::{Duration, Instant};

use futures::StreamExt;
use moongate_tests::{Backend, eventually, fast_config, start_gateway};
use serde_json::{Value, json};

async fn json_of(r: reqwest::Response) -> Value {
    r.json().await.expect("json body")
}

/// Asserts an OpenAI error envelope with `status` and `code`; returns the message.
async fn expect_error(r: reqwest::Response, status: u16, code: &str) -> String {
    assert_eq!(r.status().as_u16(), status);
    assert_eq!(r.headers()["content-type"], "application/json");
    let v = json_of(r).await;
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    v["error"]["message"].as_str().expect("message").to_string()
}

#[tokio::test]
async fn every_route_answers() {
    let a = Backend::start("a", "m").await;
    let gw = start_gateway(fast_config()).await;
    let c = reqwest::Client::new();
    let base = gw.url();

    // No worker yet: alive but not ready, inference is 503.
    assert_eq!(
        c.get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.get(format!("{base}/liveness"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    expect_error(
        c.get(format!("{base}/readiness")).send().await.unwrap(),
        503,
        "no_ready_worker",
    )
    .await;
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    expect_error(
        c.post(format!("{base}/v1/chat/completions"))
            .json(&chat)
            .send()
            .await
            .unwrap(),
        503,
        "no_ready_worker",
    )
    .await;

    let r = c
        .post(format!("{base}/workers"))
        .json(&json!({"url": a.url()}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    eventually("worker ready", || gw.state().registry().counts().0 == 1).await;

    let ready = json_of(c.get(format!("{base}/readiness")).send().await.unwrap()).await;
    assert_eq!(
        (
            ready["ready_workers"].as_u64(),
            ready["total_workers"].as_u64()
        ),
        (Some(1), Some(1))
    );
    for path in ["/v1/chat/completions", "/v1/completions", "/generate"] {
        let r = c
            .post(format!("{base}{path}"))
            .json(&chat)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(json_of(r).await["worker"], "a");
        assert_eq!(a.seen().last().unwrap().path, path);
    }
    let models = json_of(c.get(format!("{base}/v1/models")).send().await.unwrap()).await;
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "m");
    let metrics = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .contains(r#"moongate_gateway_requests_total{route="chat_completions",status="200"}"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("moongate_gateway_worker_in_flight"),
        "{metrics}"
    );
    let doc = json_of(c.get(format!("{base}/openapi.json")).send().await.unwrap()).await;
    for p in [
        "/v1/chat/completions",
        "/v1/completions",
        "/generate",
        "/v1/models",
        "/workers",
        "/workers/{id}",
        "/readiness",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} missing from openapi.json");
    }
    expect_error(
        c.get(format!("{base}/nope")).send().await.unwrap(),
        404,
        "route_not_found",
    )
    .await;
    expect_error(
        c.get(format!("{base}/v1/chat/completions"))
            .send()
            .await
            .unwrap(),
        405,
        "method_not_allowed",
    )
    .await;
    gw.shutdown().await;
}

#[tokio::test]
async fn sse_is_relayed_chunk_by_chunk_in_order() {
    let a = Backend::start("a", "m").await;
    a.knobs()
        .chunks
        .store(6, std::sync::atomic::Ordering::Relaxed);
    a.knobs()
        .chunk_delay_ms
        .store(100, std::sync::atomic::Ordering::Relaxed);
    let gw = start_gateway(fast_config()).await;
    gw.state().workers().add_static(&[a.url()]).unwrap();
    eventually("worker ready", || gw.state().registry().counts().0 == 1).await;

    let start = Instant::now();
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.url()))
        .json(&json!({"model": "m", "messages": [], "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut body = r.bytes_stream();
    let mut text = String::new();
    let mut first_at = None;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        first_at.get_or_insert_with(|| start.elapsed());
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    // The first chunk arrived long before the last was produced (6 x 100 ms): not buffered.
    assert!(
        first_at.unwrap() < Duration::from_millis(300),
        "first chunk after {:?}",
        first_at
    );
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let expected: Vec<String> = (0..6)
        .map(|i| format!("data: {{\"worker\":\"a\",\"i\":{i}}}"))
        .chain(["data: [DONE]".to_string()])
        .collect();
    assert_eq!(events, expected);
    eventually("load released", || {
        gw.state().registry().list()[0].load() == 0
    })
    .await;
    gw.shutdown().await;
}

#[tokio::test]
async fn body_reaches_the_worker_byte_for_byte_with_ids_and_keys() {
    let a = Backend::start("a", "m").await;
    let gw = start_gateway(gateway::config::ServeConfig {
        api_key: Some("gateway-key".into()),
        ..fast_config()
    })
    .await;
    gw.state().workers().add_static(&[a.url()]).unwrap();
    eventually("worker ready", || gw.state().registry().counts().0 == 1).await;
    let c = reqwest::Client::new();
    // Odd spacing, escapes, unknown and nested fields, number formats: all must survive.
    let body = "{ \"model\" : \"m\",\n \"messages\":[{\"role\":\"user\",\"content\":\"caf\\u00e9 \\\"q\\\"\"}],\
        \"regex\":\"[a-z]+\",\"json_schema\":null,\"separate_reasoning\":true,\"lora_path\":[\"a\",{\"b\":1.50e3}],\
        \"temperature\":0.70, \"x-custom\": {\"deep\": [1, 2, {\"z\": -0.0}]} }";
    let r = c
        .post(format!("{}/v1/chat/completions?trace=1", gw.url()))
        .header("content-type", "application/json")
        .header("authorization", "Bearer client-key")
        .header("x-request-id", "req-42")
        .header("x-custom-header", "kept")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "req-42");
    let seen = a.seen().pop().unwrap();
    assert_eq!(seen.body.as_ref(), body.as_bytes());
    assert_eq!(seen.path, "/v1/chat/completions?trace=1");
    assert_eq!(seen.headers["x-request-id"], "req-42");
    assert_eq!(seen.headers["x-custom-header"], "kept");
    assert_eq!(seen.headers["authorization"], "Bearer gateway-key");
    assert_eq!(
        seen.headers["content-length"],
        body.len().to_string().as_str()
    );

    // Without a client id, one is minted, forwarded and echoed.
    let r = c
        .post(format!("{}/generate", gw.url()))
        .body(r#"{"text":"x"}"#)
        .send()
        .await
        .unwrap();
    let minted = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(minted.len(), 36);
    assert_eq!(
        a.seen().pop().unwrap().headers["x-request-id"],
        minted.as_str()
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn error_statuses_use_the_openai_envelope() {
    let a = Backend::start("a", "m").await;
    let gw = start_gateway(gateway::config::ServeConfig {
        max_payload_size: 1024,
        request_timeout_secs: 1,
        retry_max_retries: 0,
        ..fast_config()
    })
    .await;
    gw.state().workers().add_static(&[a.url()]).unwrap();
    eventually("worker ready", || gw.state().registry().counts().0 == 1).await;
    let c = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", gw.url());

    let msg = expect_error(
        c.post(&chat).body("{\"model\": tru}").send().await.unwrap(),
        400,
        "invalid_json",
    )
    .await;
    assert!(msg.contains("line 1 column"), "parser message kept: {msg}");
    expect_error(
        c.post(&chat).body("").send().await.unwrap(),
        400,
        "invalid_json",
    )
    .await;
    expect_error(
        c.post(&chat).body("[1]").send().await.unwrap(),
        400,
        "invalid_request",
    )
    .await;
    expect_error(
        c.post(&chat).body(r#"{"model": 7}"#).send().await.unwrap(),
        400,
        "invalid_request",
    )
    .await;
    let big = format!(r#"{{"model":"m","pad":"{}"}}"#, "x".repeat(2000));
    expect_error(
        c.post(&chat).body(big.clone()).send().await.unwrap(),
        413,
        "payload_too_large",
    )
    .await;
    // Without Content-Length (chunked), the limit still holds.
    let chunked = reqwest::Body::wrap_stream(futures::stream::iter(
        big.into_bytes()
            .chunks(100)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    ));
    expect_error(
        c.post(&chat).body(chunked).send().await.unwrap(),
        413,
        "payload_too_large",
    )
    .await;
    let msg = expect_error(
        c.post(&chat)
            .body(r#"{"model":"other"}"#)
            .send()
            .await
            .unwrap(),
        404,
        "model_not_found",
    )
    .await;
    assert!(msg.contains("other"));

    // 504: the worker sends no response head within --request-timeout-secs.
    a.knobs()
        .head_delay_ms
        .store(3000, std::sync::atomic::Ordering::Relaxed);
    let t = Instant::now();
    expect_error(
        c.post(&chat).body(r#"{"model":"m"}"#).send().await.unwrap(),
        504,
        "worker_timeout",
    )
    .await;
    assert!(t.elapsed() < Duration::from_millis(2500));
    a.knobs()
        .head_delay_ms
        .store(0, std::sync::atomic::Ordering::Relaxed);

    // 502: a ready worker whose port refuses connections (health checks off so it stays ready).
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let gw2 = start_gateway(gateway::config::ServeConfig {
        disable_health_check: true,
        worker_urls: vec![dead_url],
        ..fast_config()
    })
    .await;
    let msg = expect_error(
        c.post(format!("{}/generate", gw2.url()))
            .body("{}")
            .send()
            .await
            .unwrap(),
        502,
        "worker_unreachable",
    )
    .await;
    assert!(
        !msg.contains("127.0.0.1"),
        "internal detail not shown: {msg}"
    );
    gw2.shutdown().await;

    // 503: workers exist, none ready.
    a.knobs()
        .healthy
        .store(false, std::sync::atomic::Ordering::Relaxed);
    eventually("worker not ready", || gw.state().registry().counts().0 == 0).await;
    expect_error(
        c.post(&chat).body(r#"{"model":"m"}"#).send().await.unwrap(),
        503,
        "no_ready_worker",
    )
    .await;
    gw.shutdown().await;
}

#[tokio::test]
async fn prometheus_port_serves_metrics_on_its_own_listener() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let gw = start_gateway(gateway::config::ServeConfig {
        prometheus_host: "127.0.0.1".into(),
        prometheus_port: Some(port),
        ..fast_config()
    })
    .await;
    let c = reqwest::Client::new();
    c.get(format!("{}/liveness", gw.url()))
        .send()
        .await
        .unwrap();
    let text = c
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("moongate_gateway_requests_total"), "{text}");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_workers_error_answers_are_put_into_the_envelope_with_status_and_message() {
    use moongate_tests::Reply;
    let a = Backend::start("a", "m").await;
    let gw = moongate_tests::start_regular_gateway(&[&a], |c| c.disable_retries = true).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let json_ct = "application/json".to_string();
    for (status, content_type, body, stream, want) in [
        // SGLang's OpenAI routes.
        (
            400,
            json_ct.clone(),
            r#"{"object":"error","message":"n must be at most 8","type":"BadRequestError","param":null,"code":400}"#,
            false,
            json!({"message": "n must be at most 8", "type": "BadRequestError", "code": "bad_request"}),
        ),
        // SGLang's native routes, answering a streamed request with JSON.
        (
            400,
            json_ct.clone(),
            r#"{"error":{"message":"prompt is too long"}}"#,
            true,
            json!({"message": "prompt is too long", "type": "invalid_request_error", "code": "bad_request"}),
        ),
        // A framework's plain text.
        (
            500,
            "text/plain".to_string(),
            "Internal Server Error",
            false,
            json!({"message": "Internal Server Error", "type": "server_error", "code": "internal_server_error"}),
        ),
        // FastAPI's validation error.
        (
            422,
            json_ct.clone(),
            r#"{"detail":[{"loc":["body","messages"],"msg":"field required"}]}"#,
            false,
            json!({"message": r#"[{"loc":["body","messages"],"msg":"field required"}]"#,
                   "type": "invalid_request_error", "code": "unprocessable_entity"}),
        ),
    ] {
        a.knobs()
            .status
            .store(status, std::sync::atomic::Ordering::Relaxed);
        a.reply(Reply {
            error: Some((content_type, body.to_string())),
            ..Reply::default()
        });
        let r = c
            .post(&url)
            .json(&json!({"model": "m", "messages": [], "stream": stream}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "the worker's status is kept");
        assert_eq!(r.headers()["content-type"], "application/json");
        let v = json_of(r).await;
        assert_eq!(v, json!({"error": want}), "{body}");
    }
    // An envelope already, or an event stream: relayed byte for byte.
    for (content_type, body) in [
        (
            "application/json",
            r#"{"error":{"message":"m","type":"t","code":"c"},"extra":true}"#,
        ),
        ("text/event-stream", "data: {\"error\":\"x\"}\n\n"),
    ] {
        a.reply(Reply {
            error: Some((content_type.into(), body.into())),
            ..Reply::default()
        });
        let r = c
            .post(&url)
            .json(&json!({"model": "m", "messages": []}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 422);
        assert_eq!(r.text().await.unwrap(), body);
    }
    gw.shutdown().await;
}
