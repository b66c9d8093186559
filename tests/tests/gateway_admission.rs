//! Admission control and graceful shutdown over real sockets: a full queue is 429 and a
//! queue wait that times out 408, in the OpenAI envelope with `Retry-After`; a slot is held
//! until the answer's body ends or its client goes away; the rate limit; and a shutdown
//! that lets short requests finish but cuts a never-ending stream at the end of the grace
//! period.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use moongate_tests::{Backend, eventually, get_text, post, start_regular_gateway};
use serde_json::{Value, json};

fn chat() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
}

/// Asserts a 429 envelope with `code` and a `Retry-After` header.
async fn expect_429(r: reqwest::Response, code: &str) {
    expect_refusal(r, 429, code).await
}

/// Asserts a `status` envelope with `code` and a `Retry-After` header.
async fn expect_refusal(r: reqwest::Response, status: u16, code: &str) {
    assert_eq!(r.status(), status);
    let retry_after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn a_full_queue_is_429_and_a_queue_timeout_408() {
    let a = Backend::start("a", "m").await;
    let gw = start_regular_gateway(&[&a], |c| {
        c.max_concurrent_requests = 1;
        c.queue_size = 1;
        c.queue_timeout_secs = 2;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    // The worker holds every answer until released: the slot stays taken however slow
    // this machine is.
    a.hold();
    let first = tokio::spawn(post_status(c.clone(), url.clone()));
    eventually("first in flight", || a.in_flight() == 1).await;
    let second = tokio::spawn(post_status(c.clone(), url.clone()));
    eventually("second queued", || gw.state().admission().waiting() == 1).await;
    let start = Instant::now();
    expect_429(post(&c, &url, &chat()).await, "queue_full").await;
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "refused at once, not after a queue wait"
    );
    a.release();
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(
        second.await.unwrap(),
        200,
        "the queued one got the freed slot"
    );
    assert_eq!(a.hits(), 2);

    // Nobody frees the slot within the queue timeout.
    a.hold();
    let slow = tokio::spawn(post_status(c.clone(), url.clone()));
    eventually("slow in flight", || a.in_flight() == 1).await;
    let start = Instant::now();
    expect_refusal(post(&c, &url, &chat()).await, 408, "queue_timeout").await;
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(7),
        "refused at the queue timeout: {waited:?}"
    );
    a.release();
    assert_eq!(slow.await.unwrap(), 200);
    gw.shutdown().await;
}

async fn post_status(c: reqwest::Client, url: String) -> u16 {
    post(&c, &url, &chat()).await.status().as_u16()
}

#[tokio::test]
async fn the_slot_is_held_until_the_stream_ends_or_its_client_leaves() {
    let a = Backend::start("a", "m").await;
    a.knobs().chunks.store(40, Ordering::Relaxed);
    a.knobs().chunk_delay_ms.store(25, Ordering::Relaxed);
    let gw = start_regular_gateway(&[&a], |c| {
        c.max_concurrent_requests = 1;
        c.queue_size = 0;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let stream_body = json!({"model": "m", "messages": [], "stream": true});
    let r = post(&c, &url, &stream_body).await;
    assert_eq!(r.status(), 200);
    let mut s = r.bytes_stream();
    s.next().await.unwrap().unwrap();
    // The handler has returned; the stream still holds the only slot.
    expect_429(post(&c, &url, &chat()).await, "queue_full").await;
    // The client reads to the end: the slot is free again.
    while let Some(chunk) = s.next().await {
        chunk.unwrap();
    }
    assert_eq!(post(&c, &url, &chat()).await.status(), 200);

    // A client that leaves mid-stream frees it too.
    let r = post(&c, &url, &stream_body).await;
    let mut s = r.bytes_stream();
    s.next().await.unwrap().unwrap();
    expect_429(post(&c, &url, &chat()).await, "queue_full").await;
    drop(s);
    eventually("worker load released", || a.in_flight() == 0).await;
    eventually("the slot came back after the client left", || {
        gw.state().admission().free_slots() == Some(1)
    })
    .await;
    assert_eq!(post(&c, &url, &chat()).await.status(), 200);
    gw.shutdown().await;
}

#[tokio::test]
async fn over_the_rate_limit_is_429_with_retry_after() {
    let a = Backend::start("a", "m").await;
    let gw = start_regular_gateway(&[&a], |c| {
        c.rate_limit_tokens_per_second = Some(2);
        c.queue_size = 0;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    assert_eq!(post(&c, &url, &chat()).await.status(), 200);
    assert_eq!(post(&c, &url, &chat()).await.status(), 200);
    expect_429(post(&c, &url, &chat()).await, "rate_limited").await;
    assert_eq!(a.hits(), 2);
    // Health, metrics and the worker API are not rate limited.
    for path in ["/health", "/metrics", "/workers"] {
        assert_eq!(
            c.get(format!("{}{path}", gw.url()))
                .send()
                .await
                .unwrap()
                .status(),
            200,
            "{path}"
        );
    }
    let metrics = get_text(&c, &format!("{}/metrics", gw.url())).await;
    assert!(
        metrics.contains(
            r#"moongate_gateway_admission_total{outcome="rate_limited",class="default"}"#
        ),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_short_requests_finish_and_cuts_endless_streams() {
    let a = Backend::start("a", "m").await;
    let gw = start_regular_gateway(&[&a], |c| c.shutdown_grace_period_secs = 1).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());

    // A stream that would run for ~17 minutes.
    a.knobs().chunks.store(10_000, Ordering::Relaxed);
    a.knobs().chunk_delay_ms.store(100, Ordering::Relaxed);
    let r = post(&c, &url, &json!({"messages": [], "stream": true})).await;
    let mut endless = r.bytes_stream();
    endless.next().await.unwrap().unwrap();

    // A short request in flight when the shutdown starts.
    a.knobs().head_delay_ms.store(300, Ordering::Relaxed);
    let short = tokio::spawn(post_status(c.clone(), url.clone()));
    eventually("short in flight", || a.in_flight() == 2).await;

    let start = Instant::now();
    gw.shutdown().await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "bounded by the grace period: {took:?}"
    );
    assert_eq!(
        short.await.unwrap(),
        200,
        "finished within the grace period"
    );
    // The endless stream was cut: it ends (with an error) promptly.
    let ended = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(_)) = endless.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the stream was cut");
    eventually("the worker saw the connection go", || a.in_flight() == 0).await;
}
