//! The gateway in PD mode over real sockets, against scripted prefill and decode backends:
//! bootstrap injection (single and batch), decode's answer relayed (JSON and SSE), each
//! side's failure cancelling the other and naming the side, retries on a new pair with new
//! rooms, logprob merging in both shapes, readiness and the info routes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gateway::config::ServeConfig;
use gateway::launch::Gateway;
use moongate_tests::{Backend, Reply, eventually, get_text, post, sse_json, start_pd_gateway};
use serde_json::{Value, json};

/// A PD gateway in front of `prefill` (with bootstrap ports) and `decode` URLs.
async fn pd_gateway(
    prefill: &[(&str, Option<u16>)],
    decode: &[&str],
    tweak: impl FnOnce(&mut ServeConfig),
) -> Gateway {
    start_pd_gateway(prefill, decode, tweak).await
}

/// A scripted prefill (bootstrap port 8998) and decode behind a ready PD gateway.
async fn pair(
    tweak: impl FnOnce(&mut ServeConfig),
) -> (Backend, Backend, Gateway, reqwest::Client) {
    let p = Backend::start("prefill", "m").await;
    let d = Backend::start("decode", "m").await;
    let gw = pd_gateway(&[(&p.url(), Some(8998))], &[&d.url()], tweak).await;
    ready(&gw, 2).await;
    (p, d, gw, reqwest::Client::new())
}

async fn ready(gw: &Gateway, n: usize) {
    eventually("workers ready", || gw.state().registry().counts().0 == n).await;
}

fn sent(b: &Backend) -> Value {
    serde_json::from_slice(&b.seen().last().expect("a request").body).expect("JSON body")
}

/// Asserts an OpenAI error envelope with `status` and `code`.
async fn expect_error(r: reqwest::Response, status: u16, code: &str) -> Value {
    assert_eq!(r.status().as_u16(), status);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], code, "{v}");
    v
}

fn failures(gw: &Gateway, url: &str) -> u64 {
    let list = gw.state().registry().list();
    list.iter()
        .find(|w| w.url().as_str() == url)
        .expect("worker")
        .failures()
}

#[tokio::test]
async fn both_sides_get_the_bootstrap_fields_and_decode_answers() {
    let (p, d, gw, c) = pair(|_| {}).await;
    let base = gw.url();

    // The original bytes, with unknown fields and an escape, plus the three fields.
    let raw = r#"{"text":"hi \"you\"","sampling_params":{"max_new_tokens":4},"lora_path":"x"}"#;
    let r = c
        .post(format!("{base}/generate"))
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["worker"], "decode", "decode's answer is the client's");
    let (pb, db) = (
        p.seen().last().unwrap().body.clone(),
        d.seen().last().unwrap().body.clone(),
    );
    assert_eq!(pb, db, "both sides get the same body");
    assert!(
        pb.starts_with(&raw.as_bytes()[..raw.len() - 1]),
        "client bytes kept"
    );
    let sent = sent(&d);
    assert_eq!(sent["bootstrap_host"], "127.0.0.1");
    assert_eq!(sent["bootstrap_port"], 8998);
    assert!(sent["bootstrap_room"].as_u64().unwrap() < 1 << 63);
    assert_eq!(sent["text"], "hi \"you\"");

    // A second request gets a new room.
    let r = post(&c, &format!("{base}/generate"), &json!({"text": "x"})).await;
    assert_eq!(r.status(), 200);
    assert_ne!(super_room(&p, 0), super_room(&p, 1));

    // A stream: decode's events, in order, to [DONE].
    d.knobs().chunks.store(5, Ordering::Relaxed);
    let r = post(
        &c,
        &format!("{base}/v1/chat/completions"),
        &json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let expected: Vec<String> = (0..5)
        .map(|i| format!("data: {{\"worker\":\"decode\",\"i\":{i}}}"))
        .chain(["data: [DONE]".to_string()])
        .collect();
    assert_eq!(events, expected);

    // Loads are released on both sides; metrics count PD requests and first bytes.
    eventually("load released", || {
        gw.state().registry().list().iter().all(|w| w.load() == 0)
    })
    .await;
    let metrics = get_text(&c, &format!("{base}/metrics")).await;
    // (The recorder is shared by every test of this binary: counts are at least ours.)
    assert!(
        metrics.contains(r#"moongate_gateway_pd_requests_total{route="generate"}"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("moongate_gateway_pd_decode_first_byte_seconds"),
        "{metrics}"
    );
    gw.shutdown().await;
}

fn super_room(b: &Backend, i: usize) -> u64 {
    let v: Value = serde_json::from_slice(&b.seen()[i].body).unwrap();
    v["bootstrap_room"].as_u64().unwrap()
}

#[tokio::test]
async fn batches_get_one_room_per_item_with_the_same_host_and_port() {
    let p = Backend::start("prefill", "m").await;
    let d = Backend::start("decode", "m").await;
    let gw = pd_gateway(&[(&p.url(), None)], &[&d.url()], |_| {}).await;
    ready(&gw, 2).await;
    let c = reqwest::Client::new();
    let cases = [
        ("/generate", json!({"text": ["a", "b", "c"]}), Some(3)),
        ("/generate", json!({"input_ids": [[1, 2], [3]]}), Some(2)),
        ("/generate", json!({"input_ids": [1, 2, 3]}), None),
        (
            "/v1/completions",
            json!({"prompt": ["a", "b", "c", "d"], "n": 2}),
            Some(4),
        ),
        ("/v1/completions", json!({"prompt": [5, 6]}), None),
        (
            "/v1/chat/completions",
            json!({"messages": [], "n": 3}),
            Some(3),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [], "n": 1}),
            None,
        ),
    ];
    for (path, body, batch) in cases {
        let r = post(&c, &format!("{}{path}", gw.url()), &body).await;
        assert_eq!(r.status(), 200, "{path} {body}");
        let s = sent(&d);
        assert_eq!(sent(&p), s, "{path}: both sides get the same fields");
        match batch {
            None => {
                assert_eq!(s["bootstrap_host"], "127.0.0.1");
                assert!(s["bootstrap_port"].is_null(), "`none` is a null port");
                assert!(s["bootstrap_room"].is_u64());
            }
            Some(n) => {
                assert_eq!(
                    s["bootstrap_host"],
                    json!(vec!["127.0.0.1"; n]),
                    "{path} {body}"
                );
                assert_eq!(s["bootstrap_port"], json!(vec![Value::Null; n]));
                let rooms: std::collections::HashSet<u64> = s["bootstrap_room"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_u64().unwrap())
                    .collect();
                assert_eq!(rooms.len(), n, "{path}: distinct rooms");
            }
        }
    }
    // Fields the client sent are replaced, never duplicated.
    let raw = r#"{"text":"a","bootstrap_room":5,"bootstrap_host":"evil"}"#;
    c.post(format!("{}/generate", gw.url()))
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    let body = String::from_utf8(d.seen().last().unwrap().body.to_vec()).unwrap();
    assert_eq!(body.matches("bootstrap_room").count(), 1, "{body}");
    assert_eq!(sent(&d)["bootstrap_host"], "127.0.0.1");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_failing_prefill_cancels_decode_and_is_named() {
    // Two attempts: a 500 is retried (on the same pair: there is no other).
    let (p, d, gw, c) = pair(|c| c.retry_max_retries = 2).await;
    // Decode waits (for KV that will not come); prefill answers 500 at once.
    d.knobs().head_delay_ms.store(10_000, Ordering::Relaxed);
    p.knobs().status.store(500, Ordering::Relaxed);
    let start = Instant::now();
    let r = post(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
    let v = expect_error(r, 502, "prefill_bad_gateway").await;
    assert!(
        !v["error"]["message"].as_str().unwrap().contains("scripted"),
        "causes are not shown"
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "answered without waiting for decode"
    );
    eventually("decode's request cancelled", || d.in_flight() == 0).await;
    assert_eq!(p.hits(), 2, "retried once");
    assert_eq!(
        failures(&gw, &p.url()),
        2,
        "charged to prefill, each attempt"
    );
    assert_eq!(failures(&gw, &d.url()), 0, "not to decode");

    // A prefill client error is the client's: passed through, nobody charged.
    p.knobs().status.store(400, Ordering::Relaxed);
    let r = post(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["message"], "scripted 400");
    assert_eq!(p.hits(), 3, "a client error is not retried");
    assert_eq!(failures(&gw, &p.url()), 2);
    eventually("decode's request cancelled", || d.in_flight() == 0).await;

    let metrics = get_text(&c, &format!("{}/metrics", gw.url())).await;
    assert!(
        metrics
            .contains(r#"moongate_gateway_pd_failures_total{side="prefill",kind="bad_gateway"}"#),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_failing_decode_cancels_prefill_and_is_named() {
    let (p, d, gw, c) = pair(|c| c.disable_retries = true).await;
    p.knobs().head_delay_ms.store(10_000, Ordering::Relaxed);
    d.knobs().status.store(503, Ordering::Relaxed);
    let r = post(
        &c,
        &format!("{}/v1/completions", gw.url()),
        &json!({"prompt": "x"}),
    )
    .await;
    expect_error(r, 502, "decode_bad_gateway").await;
    eventually("prefill's request cancelled", || p.in_flight() == 0).await;
    assert_eq!((failures(&gw, &p.url()), failures(&gw, &d.url())), (0, 1));
    gw.shutdown().await;
}

#[tokio::test]
async fn unreachable_sides_are_named_and_retried_on_a_new_pair() {
    let p = Backend::start("prefill", "m").await;
    let d = Backend::start("decode", "m").await;
    let dead = Backend::start("dead", "m").await;
    let dead_url = dead.url();
    let gw = pd_gateway(&[(&p.url(), Some(1))], &[&d.url(), &dead_url], |c| {
        c.decode_policy = Some(gateway::config::PolicyKind::RoundRobin);
    })
    .await;
    ready(&gw, 3).await;
    dead.kill();
    dead.wait_refusing().await;
    let c = reqwest::Client::new();
    // Round robin sends one of the two requests to the dead decode first: it is retried on
    // the live one, with a new room; the client never sees the failure.
    for _ in 0..2 {
        let r = post(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().await.unwrap()["worker"], "decode");
    }
    assert_eq!(failures(&gw, &dead_url), 1);
    let rooms: std::collections::HashSet<u64> = (0..p.hits()).map(|i| super_room(&p, i)).collect();
    assert_eq!(rooms.len(), p.hits(), "every attempt had its own room");
    gw.shutdown().await;

    // With no other decode left the failure is reported, naming decode.
    let gw = pd_gateway(&[(&p.url(), Some(1))], &[&dead_url], |c| {
        c.disable_health_check = true
    })
    .await;
    ready(&gw, 2).await;
    let r = post(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
    expect_error(r, 502, "decode_unavailable").await;
    gw.shutdown().await;
    let gw = pd_gateway(&[(&dead_url, Some(1))], &[&d.url()], |c| {
        c.disable_health_check = true
    })
    .await;
    ready(&gw, 2).await;
    let r = post(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
    expect_error(r, 502, "prefill_unavailable").await;
    gw.shutdown().await;
}

#[tokio::test]
async fn timeouts_name_the_side_that_did_not_answer() {
    let p = Backend::start("prefill", "m").await;
    let d = Backend::start("decode", "m").await;
    let gw = pd_gateway(&[(&p.url(), Some(8998))], &[&d.url()], |c| {
        c.request_timeout_secs = 1
    })
    .await;
    ready(&gw, 2).await;
    let c = reqwest::Client::new();
    d.knobs().head_delay_ms.store(3_000, Ordering::Relaxed);
    let r = post(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
    expect_error(r, 504, "decode_timeout").await;
    p.knobs().head_delay_ms.store(3_000, Ordering::Relaxed);
    let r = post(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
    expect_error(r, 504, "prefill_timeout").await;
    eventually("both cancelled", || {
        p.in_flight() == 0 && d.in_flight() == 0
    })
    .await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_prefill_breaking_mid_stream_ends_decodes_stream_with_an_error_event() {
    let (p, d, gw, c) = pair(|_| {}).await;
    p.knobs().chunk_delay_ms.store(100, Ordering::Relaxed);
    p.knobs().break_after.store(2, Ordering::Relaxed);
    d.knobs().chunks.store(100, Ordering::Relaxed);
    d.knobs().chunk_delay_ms.store(50, Ordering::Relaxed);
    let start = Instant::now();
    let r = post(
        &c,
        &format!("{}/generate", gw.url()),
        &json!({"text": "x", "stream": true}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = body.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "not the 5 s decode stream"
    );
    assert!(text.contains(r#""code":"prefill_bad_gateway""#), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    eventually("decode's stream cancelled", || d.in_flight() == 0).await;
    assert_eq!(failures(&gw, &p.url()), 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn prompt_logprobs_come_from_the_prefill_in_both_shapes() {
    let (p, d, gw, c) = pair(|_| {}).await;
    let url = |path: &str| format!("{}{path}", gw.url());

    // SGLang meta_info, not streamed.
    let input = json!([[null, 1, null], [-0.5, 77, null]]);
    p.reply(Reply {
        json: Some(
            json!({"text": " a", "meta_info": {"id": "r", "input_token_logprobs": input,
            "output_token_logprobs": [[-0.1, 9, null]]}}),
        ),
        events: Some(vec![
            json!({"text": " a", "meta_info": {"id": "r", "input_token_logprobs": input}}),
        ]),
        ..Reply::default()
    });
    d.reply(Reply {
        json: Some(
            json!({"text": " a b", "meta_info": {"id": "r", "input_token_logprobs": [],
            "output_token_logprobs": [[-0.1, 9, null], [-0.2, 8, null]]}}),
        ),
        events: Some(vec![
            json!({"text": " a", "meta_info": {"id": "r", "input_token_logprobs": []}}),
            json!({"text": " a b", "meta_info": {"id": "r", "input_token_logprobs": []}}),
        ]),
        ..Reply::default()
    });
    let v: Value = post(
        &c,
        &url("/generate"),
        &json!({"text": "x", "return_logprob": true}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(v["meta_info"]["input_token_logprobs"], input);
    assert_eq!(
        v["meta_info"]["output_token_logprobs"][1],
        json!([-0.2, 8, null])
    );
    // Streamed: every event gets them.
    let text = post(
        &c,
        &url("/generate"),
        &json!({"text": "x", "return_logprob": true, "stream": true}),
    )
    .await
    .text()
    .await
    .unwrap();
    let events = sse_json(&text);
    assert_eq!(events.len(), 2);
    assert!(
        events
            .iter()
            .all(|e| e["meta_info"]["input_token_logprobs"] == input),
        "{text}"
    );
    // Without return_logprob decode's bytes pass untouched.
    let v: Value = post(&c, &url("/generate"), &json!({"text": "x"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["meta_info"]["input_token_logprobs"], json!([]));

    // OpenAI completions with echo: the prompt's entries in front, the shared token once.
    let plp = json!({"tokens": ["<s>", " x", " a"], "token_logprobs": [null, -1.5, -0.1],
        "top_logprobs": [null, null, null], "text_offset": [0, 0, 2]});
    let dlp = json!({"tokens": [" a", " b"], "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [null, null], "text_offset": [2, 4]});
    p.reply(Reply {
        json: Some(json!({"choices": [{"index": 0, "text": "x a", "logprobs": plp}]})),
        events: Some(vec![
            json!({"choices": [{"index": 0, "text": "x a", "logprobs": plp}]}),
        ]),
        ..Reply::default()
    });
    d.reply(Reply {
        json: Some(json!({"choices": [{"index": 0, "text": "x a b", "logprobs": dlp}]})),
        events: Some(vec![
            json!({"choices": [{"index": 0, "text": "x a", "logprobs": {"tokens": [" a"], "token_logprobs": [-0.1], "top_logprobs": [null], "text_offset": [2]}}]}),
            json!({"choices": [{"index": 0, "text": " b", "logprobs": {"tokens": [" b"], "token_logprobs": [-0.2], "top_logprobs": [null], "text_offset": [4]}}]}),
        ]),
        ..Reply::default()
    });
    let req = json!({"prompt": "x", "echo": true, "logprobs": 0});
    let v: Value = post(&c, &url("/v1/completions"), &req)
        .await
        .json()
        .await
        .unwrap();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["<s>", " x", " a", " b"]));
    assert_eq!(lp["token_logprobs"], json!([null, -1.5, -0.1, -0.2]));
    let mut stream_req = req.clone();
    stream_req["stream"] = json!(true);
    let text = post(&c, &url("/v1/completions"), &stream_req)
        .await
        .text()
        .await
        .unwrap();
    let chunks = sse_json(&text);
    assert_eq!(
        chunks[0]["choices"][0]["logprobs"]["tokens"],
        json!(["<s>", " x", " a"])
    );
    assert_eq!(chunks[1]["choices"][0]["logprobs"]["tokens"], json!([" b"]));
    gw.shutdown().await;
}

#[tokio::test]
async fn readiness_needs_both_sides_and_info_comes_from_a_prefill() {
    let p = Backend::start("prefill", "m").await;
    let d = Backend::start("decode", "m").await;
    let c = reqwest::Client::new();
    let gw = pd_gateway(&[(&p.url(), Some(8998))], &[], |_| {}).await;
    ready(&gw, 1).await;
    expect_error(
        c.get(format!("{}/readiness", gw.url()))
            .send()
            .await
            .unwrap(),
        503,
        "no_ready_decode_worker",
    )
    .await;
    let r = post(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
    expect_error(r, 503, "no_ready_decode_worker").await;
    let r = post(
        &c,
        &format!("{}/workers", gw.url()),
        &json!({"url": d.url(), "worker_type": "decode"}),
    )
    .await;
    assert_eq!(r.status(), 201);
    ready(&gw, 2).await;
    assert_eq!(
        c.get(format!("{}/readiness", gw.url()))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for path in ["/get_server_info", "/get_model_info"] {
        let v: Value = c
            .get(format!("{}{path}", gw.url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["worker"], "prefill", "{path}");
    }
    gw.shutdown().await;
    let gw = pd_gateway(&[], &[&d.url()], |_| {}).await;
    ready(&gw, 1).await;
    expect_error(
        c.get(format!("{}/readiness", gw.url()))
            .send()
            .await
            .unwrap(),
        503,
        "no_ready_prefill_worker",
    )
    .await;
    expect_error(
        c.get(format!("{}/get_server_info", gw.url()))
            .send()
            .await
            .unwrap(),
        503,
        "no_ready_prefill_worker",
    )
    .await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_decodes_error_answer_is_put_into_the_envelope() {
    let (p, d, gw, c) = pair(|c| c.disable_retries = true).await;
    d.knobs().status.store(400, Ordering::Relaxed);
    d.reply(Reply {
        error: Some((
            "application/json".into(),
            r#"{"error":{"message":"the prompt is too long"}}"#.into(),
        )),
        ..Reply::default()
    });
    for stream in [false, true] {
        let r = post(
            &c,
            &format!("{}/generate", gw.url()),
            &json!({"text": "x", "stream": stream}),
        )
        .await;
        let v = expect_error(r, 400, "bad_request").await;
        assert_eq!(
            v["error"],
            json!({"message": "the prompt is too long", "type": "invalid_request_error", "code": "bad_request"})
        );
    }
    // A client error is nobody's failure.
    assert_eq!((failures(&gw, &p.url()), failures(&gw, &d.url())), (0, 0));
    gw.shutdown().await;
}
