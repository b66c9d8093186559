//! Time to first token and time per output token on tokio's paused clock (driving the
//! router in-process), the in-flight load a stream holds until it ends or its client goes
//! away, and graceful shutdown over real sockets.

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sim::{self, SimConfig};
use tokio::time::Instant;
use tower::ServiceExt;

fn paced(ttft_ms: u64, tpot_ms: u64) -> Router {
    sim::router(SimConfig {
        ttft: Duration::from_millis(ttft_ms),
        tpot: Duration::from_millis(tpot_ms),
        ..SimConfig::default()
    })
    .unwrap()
}

fn post(path: &str, body: Value) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// Each body frame with the milliseconds (on the paused clock) at which it arrived.
async fn frames(app: Router, req: Request<Body>) -> Vec<(u128, String)> {
    let start = Instant::now();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        out.push((
            start.elapsed().as_millis(),
            String::from_utf8(data.to_vec()).unwrap(),
        ));
    }
    out
}

async fn load(app: &Router) -> u64 {
    let resp = app
        .clone()
        .oneshot(Request::get("/get_load").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice::<Value>(&bytes).unwrap()[0]["num_reqs"]
        .as_u64()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn chat_stream_paces_first_token_then_each_next() {
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true});
    let got = frames(paced(200, 20), post("/v1/chat/completions", body)).await;
    let times: Vec<u128> = got.iter().map(|(t, _)| *t).collect();
    assert_eq!(times, [200, 220, 240, 260]);
    assert_eq!(
        got[0].1.matches("data: ").count(),
        2,
        "role chunk + first token"
    );
    assert!(
        got[3].1.ends_with("data: [DONE]\n\n"),
        "finish and [DONE] come with the last token"
    );
}

#[tokio::test(start_paused = true)]
async fn non_streamed_answers_wait_for_the_whole_output() {
    let start = Instant::now();
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    let resp = paced(100, 10)
        .oneshot(post("/v1/chat/completions", body))
        .await
        .unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(140),
        "ttft + 4 × tpot"
    );
    assert_eq!(resp.status(), StatusCode::OK);

    let start = Instant::now();
    let body = json!({"prompt": "x", "max_tokens": 0});
    paced(100, 10)
        .oneshot(post("/v1/completions", body))
        .await
        .unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(100),
        "nothing to write: just ttft"
    );

    let start = Instant::now();
    let body = json!({"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 6}]});
    let resp = paced(50, 10)
        .oneshot(post("/generate", body))
        .await
        .unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(100),
        "the longest item decides"
    );
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v[1]["meta_info"]["e2e_latency"], 0.1);
    assert_eq!(v[0]["meta_info"]["e2e_latency"], 0.06);
}

#[tokio::test(start_paused = true)]
async fn generate_and_completions_streams_are_paced() {
    let body = json!({"text": "go", "stream": true, "sampling_params": {"max_new_tokens": 3}});
    let times: Vec<u128> = frames(paced(30, 5), post("/generate", body))
        .await
        .iter()
        .map(|f| f.0)
        .collect();
    assert_eq!(times, [30, 35, 40]);
    let body = json!({"prompt": "go", "stream": true, "max_tokens": 2, "n": 2});
    let got = frames(paced(30, 5), post("/v1/completions", body)).await;
    assert_eq!(got.iter().map(|f| f.0).collect::<Vec<_>>(), [30, 35]);
    assert_eq!(
        got[0].1.matches("data: ").count(),
        2,
        "one chunk per choice per step"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_holds_load_until_it_ends_or_its_client_leaves() {
    let app = paced(1000, 100);
    assert_eq!(load(&app).await, 0);
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": true});
    let resp = app
        .clone()
        .oneshot(post("/v1/chat/completions", body.clone()))
        .await
        .unwrap();
    assert_eq!(
        load(&app).await,
        1,
        "streaming: counted while the body is open"
    );
    drop(resp); // the client goes away before the first token
    assert_eq!(load(&app).await, 0);

    let resp = app
        .clone()
        .oneshot(post("/v1/chat/completions", body))
        .await
        .unwrap();
    resp.into_body().collect().await.unwrap();
    assert_eq!(load(&app).await, 0, "released when the body ends");

    let waiting = tokio::spawn({
        let app = app.clone();
        async move {
            let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
            app.oneshot(post("/v1/chat/completions", body))
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(load(&app).await, 1, "non-streaming: counted while it waits");
    waiting.await.unwrap();
    assert_eq!(load(&app).await, 0);
}

#[tokio::test]
async fn shutdown_is_graceful_and_bounded() {
    // Idle: shutdown returns at once and the port stops answering.
    let w = common::start_default().await;
    let url = w.url();
    assert_eq!(common::get(&format!("{url}/health")).await.0, 200);
    w.shutdown().await;
    assert!(reqwest::get(format!("{url}/health")).await.is_err());

    // A stream that would take an hour: cut after the grace period.
    let w = common::start(SimConfig {
        ttft: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true});
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", w.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let started = std::time::Instant::now();
    w.shutdown_within(Duration::from_millis(200)).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert!(resp.text().await.is_err(), "the open stream was cut");
}
