//! The gateway's resilience over real sockets, against scripted backends that fail on
//! demand: circuit breakers (open, half-open, closed; shown in the worker API and the
//! metrics), retries with backoff on retryable answers and unreachable workers (and never
//! once bytes reached the client), PD retries on a new pair, request ids from the
//! configured headers, and per-worker metric series leaving with their worker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gateway::config::PolicyKind;
use gateway::launch::Gateway;
use gateway::workers::Worker;
use moongate_tests::{
    Backend, eventually, get_json, get_text, post, start_regular_gateway, start_two_prefill_pd,
};
use serde_json::{Value, json};

fn chat() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
}

fn worker(gw: &Gateway, b: &Backend) -> Arc<Worker> {
    gw.state()
        .registry()
        .list()
        .iter()
        .find(|w| w.url().as_str() == b.url())
        .cloned()
        .expect("registered")
}

/// The worker API's record of `b`.
async fn info(c: &reqwest::Client, gw: &Gateway, b: &Backend) -> Value {
    let list = get_json(c, &format!("{}/workers", gw.url())).await;
    list["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .find(|w| w["url"] == b.url())
        .cloned()
        .expect("listed")
}

async fn status_of(c: &reqwest::Client, url: &str, body: &Value) -> u16 {
    post(c, url, body).await.status().as_u16()
}

#[tokio::test]
async fn a_failing_worker_trips_its_breaker_and_comes_back_through_half_open() {
    let a = Backend::start("a", "m").await;
    let b = Backend::start("b", "m").await;
    let gw = start_regular_gateway(&[&a, &b], |c| {
        c.policy = PolicyKind::RoundRobin;
        c.cb_failure_threshold = 2;
        c.cb_success_threshold = 1;
        // Long enough for the six requests below to see it open on a busy machine.
        c.cb_timeout_duration_secs = 2;
        c.disable_retries = true;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    a.knobs().status.store(500, Ordering::Relaxed);
    // Round robin alternates; a's 500s are relayed as it sent them (no retries here).
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(status_of(&c, &url, &chat()).await);
    }
    statuses.sort();
    assert_eq!(statuses, vec![200, 200, 500, 500]);
    let rec = info(&c, &gw, &a).await;
    assert_eq!(rec["circuit"]["state"], "open", "{rec}");
    assert_eq!(rec["circuit"]["opened_total"], 1);
    assert!(rec["circuit"]["retry_in_ms"].as_u64().unwrap() <= 2000);
    assert_eq!(
        rec["status"], "ready",
        "health probes still pass: only the breaker is open"
    );
    assert_eq!(info(&c, &gw, &b).await["circuit"]["state"], "closed");
    let metrics = get_text(&c, &format!("{}/metrics", gw.url())).await;
    let open_line = format!(
        "moongate_gateway_worker_circuit_state{{worker=\"{}\",worker_type=\"regular\"}} 1",
        a.url()
    );
    assert!(metrics.contains(&open_line), "{metrics}");

    // Open: everything goes to b.
    let a_hits = a.hits();
    for _ in 0..6 {
        assert_eq!(status_of(&c, &url, &chat()).await, 200);
    }
    assert_eq!(a.hits(), a_hits, "no traffic to an open breaker");

    // a recovers; after the open period a trial request reaches it and closes the breaker.
    a.knobs().status.store(200, Ordering::Relaxed);
    let w = worker(&gw, &a);
    eventually("the breaker half open after its open period", || {
        w.breaker().state() == openapi_state("half_open")
    })
    .await;
    for _ in 0..4 {
        assert_eq!(status_of(&c, &url, &chat()).await, 200);
    }
    assert!(a.hits() > a_hits, "a got trial traffic");
    assert_eq!(info(&c, &gw, &a).await["circuit"]["state"], "closed");
    gw.shutdown().await;
}

fn openapi_state(s: &str) -> openapi::workers::CircuitState {
    serde_json::from_value(json!(s)).expect("a circuit state")
}

#[tokio::test]
async fn every_breaker_open_is_503_circuit_open() {
    let a = Backend::start("a", "m").await;
    let gw = start_regular_gateway(&[&a], |c| {
        c.cb_failure_threshold = 1;
        c.disable_retries = true;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    a.knobs().status.store(502, Ordering::Relaxed);
    assert_eq!(status_of(&c, &url, &chat()).await, 502);
    let r = post(&c, &url, &chat()).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "circuit_open", "{v}");
    assert_eq!(a.hits(), 1);
    // Readiness follows: no usable worker.
    let r = c
        .get(format!("{}/readiness", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    gw.shutdown().await;
}

#[tokio::test]
async fn retryable_answers_are_retried_on_another_worker() {
    let a = Backend::start("a", "m").await;
    let b = Backend::start("b", "m").await;
    let gw = start_regular_gateway(&[&a, &b], |c| c.policy = PolicyKind::RoundRobin).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    a.knobs().status.store(503, Ordering::Relaxed);
    for _ in 0..6 {
        let r = post(&c, &url, &chat()).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().await.unwrap()["worker"], "b");
    }
    assert!(a.hits() >= 1, "a was tried");
    assert_eq!(
        worker(&gw, &a).failures() as usize,
        a.hits(),
        "each 503 charged to a"
    );
    assert_eq!(worker(&gw, &b).failures(), 0);
    let metrics = get_text(&c, &format!("{}/metrics", gw.url())).await;
    assert!(
        metrics.contains("moongate_gateway_retries_total"),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn retries_back_off_stop_at_max_attempts_and_relay_the_last_answer() {
    let a = Backend::start("a", "m").await;
    let gw = start_regular_gateway(&[&a], |c| {
        c.retry_max_retries = 3;
        c.retry_initial_backoff_ms = 100;
        c.retry_backoff_multiplier = 2.0;
        c.retry_jitter_factor = 0.0;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/generate", gw.url());
    for status in [503u16, 429] {
        a.knobs().status.store(status, Ordering::Relaxed);
        let before = a.hits();
        let start = Instant::now();
        let r = post(&c, &url, &json!({"text": "x"})).await;
        assert_eq!(r.status().as_u16(), status);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v["error"]["message"],
            format!("scripted {status}"),
            "the worker's answer"
        );
        assert_eq!(a.hits() - before, 3, "three attempts in all");
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "backoff 100 + 200 ms"
        );
    }
    // A client error is not retried.
    a.knobs().status.store(400, Ordering::Relaxed);
    let before = a.hits();
    assert_eq!(status_of(&c, &url, &json!({"text": "x"})).await, 400);
    assert_eq!(a.hits() - before, 1);
    gw.shutdown().await;

    // An unreachable worker: retried, then the gateway's 502 envelope.
    let gw = start_regular_gateway(&[&a], |c| {
        c.retry_max_retries = 2;
        c.disable_health_check = true;
    })
    .await;
    a.kill();
    a.wait_refusing().await;
    let r = post(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
    assert_eq!(r.status(), 502);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "worker_unreachable"
    );
    assert_eq!(worker(&gw, &a).failures(), 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn nothing_is_retried_once_bytes_reached_the_client() {
    let a = Backend::start("a", "m").await;
    let b = Backend::start("b", "m").await;
    let gw = start_regular_gateway(&[&a, &b], |c| c.policy = PolicyKind::RoundRobin).await;
    for x in [&a, &b] {
        x.knobs().chunks.store(5, Ordering::Relaxed);
        x.knobs().break_after.store(2, Ordering::Relaxed);
        // Paced, so the head and the first events reach the gateway before the break.
        x.knobs().chunk_delay_ms.store(50, Ordering::Relaxed);
    }
    let c = reqwest::Client::new();
    let r = post(
        &c,
        &format!("{}/v1/chat/completions", gw.url()),
        &json!({"stream": true, "messages": []}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let mut s = r.bytes_stream();
    let mut got = Vec::new();
    let mut broke = false;
    while let Some(chunk) = s.next().await {
        match chunk {
            Ok(b) => got.extend_from_slice(&b),
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    assert!(broke, "the client sees the stream break");
    let got = String::from_utf8_lossy(&got);
    assert_eq!(got.matches("data: ").count(), 2, "{got}");
    assert_eq!(a.hits() + b.hits(), 1, "not retried");
    let broken = if a.hits() == 1 { &a } else { &b };
    eventually("the break charged to its worker", || {
        worker(&gw, broken).failures() == 1
    })
    .await;
    gw.shutdown().await;
}

/// The bootstrap room of the `i`-th request a backend saw.
fn room(b: &Backend, i: usize) -> u64 {
    let v: Value = serde_json::from_slice(&b.seen()[i].body).expect("JSON body");
    v["bootstrap_room"].as_u64().expect("a room")
}

#[tokio::test]
async fn pd_retries_a_failing_prefill_on_a_new_pair_with_a_new_room() {
    let (p1, p2, d, gw) =
        start_two_prefill_pd(|c| c.prefill_policy = Some(PolicyKind::RoundRobin)).await;
    p1.knobs().status.store(503, Ordering::Relaxed);
    let c = reqwest::Client::new();
    for _ in 0..4 {
        let r = post(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().await.unwrap()["worker"], "decode");
    }
    assert!(p1.hits() >= 1);
    assert_eq!(p2.hits(), 4, "every request ended on p2");
    // Each attempt had its own room; the decode's last request carried p2's.
    let mut rooms: Vec<u64> = (0..p1.hits()).map(|i| room(&p1, i)).collect();
    rooms.extend((0..p2.hits()).map(|i| room(&p2, i)));
    let distinct: std::collections::HashSet<_> = rooms.iter().collect();
    assert_eq!(distinct.len(), rooms.len());
    assert_eq!(room(&d, d.hits() - 1), room(&p2, 3));
    assert_eq!(
        worker(&gw, &p1).failures() as usize,
        p1.hits(),
        "charged to p1 only"
    );
    assert_eq!(worker(&gw, &p2).failures(), 0);
    assert_eq!(worker(&gw, &d).failures(), 0);
    gw.shutdown().await;
}

#[tokio::test]
async fn request_ids_come_from_the_configured_headers() {
    let a = Backend::start("a", "m").await;
    let gw = start_regular_gateway(&[&a], |_| {}).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    // sglang-router's default list: x-correlation-id counts.
    let r = c
        .post(&url)
        .header("x-correlation-id", "corr-1")
        .json(&chat())
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "corr-1");
    assert_eq!(a.seen().last().unwrap().headers["x-request-id"], "corr-1");
    gw.shutdown().await;

    let gw = start_regular_gateway(&[&a], |c| {
        c.request_id_headers = vec!["X-Trace-Id".into()];
    })
    .await;
    let r = c
        .post(format!("{}/v1/chat/completions", gw.url()))
        .header("x-trace-id", "trace-7")
        .header("x-request-id", "ignored")
        .json(&chat())
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "trace-7");
    assert_eq!(a.seen().last().unwrap().headers["x-request-id"], "trace-7");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_removed_workers_series_leave_the_metrics() {
    let a = Backend::start("a", "m").await;
    let b = Backend::start("b", "m").await;
    let gw = start_regular_gateway(&[&a, &b], |_| {}).await;
    let c = reqwest::Client::new();
    assert_eq!(
        status_of(&c, &format!("{}/v1/chat/completions", gw.url()), &chat()).await,
        200
    );
    let series = |text: &str, b: &Backend| {
        text.lines()
            .filter(|l| {
                l.starts_with("moongate_gateway_worker_")
                    && l.contains(&format!("worker=\"{}\"", b.url()))
            })
            .count()
    };
    let metrics = get_text(&c, &format!("{}/metrics", gw.url())).await;
    assert_eq!(series(&metrics, &a), 5, "{metrics}");
    let id = worker(&gw, &a).id().to_string();
    let r = c
        .delete(format!("{}/workers/{id}", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    eventually("removed", || gw.state().registry().list().len() == 1).await;
    let metrics = get_text(&c, &format!("{}/metrics", gw.url())).await;
    assert_eq!(series(&metrics, &a), 0, "{metrics}");
    assert_eq!(series(&metrics, &b), 5);
    gw.shutdown().await;
}
