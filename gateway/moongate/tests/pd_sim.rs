//! PD end to end as users run it: `moongate serve --pd-disaggregation` in front of a
//! simulated prefill and a simulated decode worker that move real KV pages with the
//! transfer engine (over TCP, and over shared memory), on real sockets. The answers equal
//! a regular worker's byte for byte in meaning (logprob merges included, streamed or not),
//! every KV byte is checked by the decode, pools are full again after any load, and the
//! faults that need a real process to die run `moongate sim-worker` as a child process.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::SimProc;
use gateway::config::ServeConfig;
use gateway::launch::Gateway;
use serde_json::{Value, json};
use sim::config::{KvTransport, ModelShape};
use sim::{SimConfig, SimHandle, SimMode};

/// Bytes per token of the tiny shape.
const TOKEN_BYTES: u64 = 128;

fn pd_cfg(mode: SimMode) -> SimConfig {
    SimConfig {
        mode,
        model_shape: ModelShape::Tiny,
        page_size: 4,
        kv_pool_size: 64 * 4 * TOKEN_BYTES,
        bootstrap_port: 0,
        kv_transport: KvTransport::Tcp,
        kv_timeout: Duration::from_secs(5),
        heartbeat_interval: Duration::from_millis(200),
        heartbeat_max_failures: 2,
        ..SimConfig::default()
    }
}

async fn gateway(prefill: &[(String, u16)], decode: &[String]) -> Gateway {
    gateway_with(prefill, decode, false).await
}

/// `fault_test` turns health checks off (a dead worker stays in rotation) and retries off
/// (each failure reaches the client as it happened).
async fn gateway_with(prefill: &[(String, u16)], decode: &[String], fault_test: bool) -> Gateway {
    let cfg = ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        pd_disaggregation: true,
        prefill: prefill
            .iter()
            .map(|(u, p)| vec![u.clone(), p.to_string()])
            .collect(),
        decode: decode.to_vec(),
        health_check_interval_secs: 1,
        health_check_pending_interval_ms: 50,
        health_check_timeout_secs: 1,
        shutdown_grace_period_secs: 1,
        disable_health_check: fault_test,
        retry_max_retries: if fault_test {
            1
        } else {
            ServeConfig::default().retry_max_retries
        },
        ..ServeConfig::default()
    };
    cfg.validate().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = gateway::launch::spawn(cfg, listener).await.unwrap();
    let n = prefill.len() + decode.len();
    wait("workers ready", || gw.state().registry().counts().0 == n).await;
    gw
}

async fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

fn stats(h: &SimHandle) -> openapi::sglang::bootstrap::KvStats {
    h.pd().expect("a PD worker").stats()
}

fn idle(h: &SimHandle) -> bool {
    let s = stats(h);
    s.free_pages == s.pool_pages && s.rooms_open == 0
}

/// Drops what differs between two runs of the same request (ids, times).
fn normalize(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for k in ["id", "created", "e2e_latency"] {
                    m.remove(k);
                }
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

async fn answer(url: &str, body: &Value) -> Value {
    let r = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{url} {body}: {text}");
    let v = if body["stream"] == json!(true) {
        let events: Vec<Value> = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        Value::Array(events)
    } else {
        serde_json::from_str(&text).unwrap()
    };
    normalize(v)
}

/// The requests the end-to-end test sends, with the rooms each makes and its tokens.
fn requests() -> Vec<(&'static str, Value)> {
    let lp = json!({"return_logprob": true, "logprob_start_len": 0, "top_logprobs_num": 2});
    let mut gen_lp =
        json!({"text": "the moon is a harsh mistress", "sampling_params": {"max_new_tokens": 5}});
    gen_lp
        .as_object_mut()
        .unwrap()
        .extend(lp.as_object().unwrap().clone());
    let mut gen_batch = json!({"text": ["one two three", "four five six seven eight nine ten eleven twelve"],
        "sampling_params": {"max_new_tokens": 4}});
    gen_batch
        .as_object_mut()
        .unwrap()
        .extend(lp.as_object().unwrap().clone());
    let mut out = vec![
        (
            "/generate",
            json!({"text": "hello there", "sampling_params": {"max_new_tokens": 6}}),
        ),
        ("/generate", gen_lp.clone()),
        ("/generate", gen_batch.clone()),
        (
            "/generate",
            json!({"input_ids": [[5, 6, 7, 8, 9], [10, 11]], "sampling_params": {"max_new_tokens": 3, "n": 2}}),
        ),
        (
            "/v1/completions",
            json!({"prompt": ["x y z", "w"], "echo": true, "logprobs": 2, "max_tokens": 4, "n": 2}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [9, 10, 11, 12, 13], "echo": true, "logprobs": 0, "max_tokens": 3}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "tell me a story"}],
            "n": 3, "max_tokens": 4, "logprobs": true, "top_logprobs": 1}),
        ),
    ];
    let streamed: Vec<_> = out
        .iter()
        .map(|(p, b)| {
            let mut b = b.clone();
            b["stream"] = json!(true);
            (*p, b)
        })
        .collect();
    out.extend(streamed);
    out
}

async fn end_to_end(transport: KvTransport) {
    // Answers compared side by side, so no worker's prefix cache (which depends on what
    // each saw before) may change them.
    let no_cache = |c: SimConfig| SimConfig {
        disable_radix_cache: true,
        ..c
    };
    let regular = common::start(no_cache(SimConfig::default())).await;
    let p = common::start(no_cache(SimConfig {
        kv_transport: transport,
        ..pd_cfg(SimMode::Prefill)
    }))
    .await;
    let d = common::start(no_cache(SimConfig {
        kv_transport: transport,
        ..pd_cfg(SimMode::Decode)
    }))
    .await;
    let mut moved = p.pd().unwrap().subscribe();
    let boot = p.bootstrap_addr().unwrap().port();
    let gw = gateway(&[(p.url(), boot)], &[d.url()]).await;
    for (path, body) in requests() {
        let want = answer(&format!("{}{path}", regular.url()), &body).await;
        let got = answer(&format!("{}{path}", gw.url()), &body).await;
        assert_eq!(got, want, "{path} {body}");
    }
    // Every room's KV went prefill -> decode and was checked there: one room per item.
    let rooms = 1 + 1 + 2 + 2 + 2 + 1 + 3;
    let (ds, ps) = (stats(&d), stats(&p));
    assert_eq!(
        (ds.moves, ps.moves, ds.failures, ps.failures),
        (2 * rooms, 2 * rooms, 0, 0)
    );
    assert_eq!(
        ds.bytes, ps.bytes,
        "the decode checked every byte the prefill wrote"
    );
    let mut events = Vec::new();
    while let Ok(e) = moved.try_recv() {
        events.push(e);
    }
    assert_eq!(events.len() as u64, 2 * rooms);
    let total: u64 = events.iter().map(|e| e.bytes).sum();
    assert_eq!(total, ps.bytes);
    assert!(
        events
            .iter()
            .all(|e| e.bytes == e.tokens as u64 * TOKEN_BYTES)
    );
    // The pages went over the transport asked for: the prefill wrote them all, through
    // shared memory (same host) with `auto`, over TCP with `tcp`; none moved by the other.
    let t = p.pd().unwrap().transfer_stats();
    let (used, other) = match transport {
        KvTransport::Auto => (t.shm_bytes, t.tcp_bytes),
        KvTransport::Tcp => (t.tcp_bytes, t.shm_bytes),
    };
    assert_eq!(
        (used, other, t.rdma_bytes),
        (ps.bytes, 0, 0),
        "{transport:?}: {t:?}"
    );
    wait("pools full, rooms closed", || idle(&p) && idle(&d)).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn pd_answers_equal_a_regular_workers_and_the_kv_is_checked_over_tcp() {
    end_to_end(KvTransport::Tcp).await;
}

#[tokio::test]
async fn pd_over_shared_memory() {
    end_to_end(KvTransport::Auto).await;
}

#[tokio::test]
async fn no_page_leaks_after_a_thousand_requests() {
    // 12 pages of 4 tokens: most requests wait for pages; some are cancelled midway.
    let small = |mode| SimConfig {
        kv_pool_size: 12 * 4 * TOKEN_BYTES,
        ..pd_cfg(mode)
    };
    let p = common::start(small(SimMode::Prefill)).await;
    let d = common::start(small(SimMode::Decode)).await;
    let gw = Arc::new(gateway(&[(p.url(), p.bootstrap_addr().unwrap().port())], &[d.url()]).await);
    let client = reqwest::Client::new();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (c, url, next) = (client.clone(), gw.url(), next.clone());
            tokio::spawn(async move {
                let mut ok = 0u64;
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= 1000 {
                        return ok;
                    }
                    let words = "w ".repeat(k % 20);
                    let body = match k % 5 {
                        0 => json!({"text": [words.clone(), "a b"], "sampling_params": {"max_new_tokens": 2}}),
                        1 => json!({"text": words, "stream": true, "sampling_params": {"max_new_tokens": 2}}),
                        _ => json!({"text": words, "sampling_params": {"max_new_tokens": 2}}),
                    };
                    let req = c.post(format!("{url}/generate")).json(&body).send();
                    if k % 17 == 0 {
                        // The client goes away mid-request.
                        let _ = tokio::time::timeout(Duration::from_millis(1), req).await;
                        continue;
                    }
                    let r = req.await.unwrap();
                    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
                    r.bytes().await.unwrap();
                    ok += 1;
                }
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap();
    }
    assert!(ok > 900, "{ok} requests answered");
    wait("pools full, rooms closed", || idle(&p) && idle(&d)).await;
    assert!(stats(&d).moves >= ok, "every answered request moved its KV");
    Arc::try_unwrap(gw).unwrap().shutdown().await;
}

/// A `moongate sim-worker` child process with the pool and KV timeout of these tests.
fn sim_proc(mode: &str, extra: &[&str]) -> SimProc {
    let mut args = vec!["--kv-pool-size", "32K", "--kv-timeout", "5s"];
    args.extend_from_slice(extra);
    SimProc::start(mode, &args)
}

/// A generate request for a `tokens`-token prompt with the bootstrap fields of one room.
fn with_room(tokens: usize, boot: u16, room: u64) -> Value {
    json!({"input_ids": (100..100 + tokens as u32).collect::<Vec<_>>(),
           "sampling_params": {"max_new_tokens": 4},
           "bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": room})
}

#[tokio::test]
async fn a_killed_prefill_fails_the_decodes_wait_within_seconds() {
    // The prefill computes for 2 s; it dies after the decode registered its pages.
    let mut prefill = sim_proc("prefill", &["--prefill-compute-per-token", "100ms"]);
    let d = common::start(pd_cfg(SimMode::Decode)).await;
    let body = with_room(20, prefill.bootstrap.unwrap(), 42);
    let c = reqwest::Client::new();
    let to_prefill = tokio::spawn(
        c.post(format!("{}/generate", prefill.http))
            .json(&body)
            .send(),
    );
    let start = Instant::now();
    let to_decode = tokio::spawn(c.post(format!("{}/generate", d.url())).json(&body).send());
    wait("decode registered the room", || stats(&d).rooms_open == 1).await;
    prefill.kill();
    let r = to_decode.await.unwrap().unwrap();
    let elapsed = start.elapsed();
    assert_eq!(r.status(), 500);
    let v: Value = r.json().await.unwrap();
    // `rooms_open` counts the room before the decode has reached the prefill's KV endpoint:
    // a kill in between fails the registration (the endpoint is unreachable) instead of
    // the heartbeats. Either way the wait ends within seconds, naming the dead prefill.
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("stopped answering heartbeats")
            || msg.contains("prefill KV endpoint 127.0.0.1:") && msg.contains("unreachable"),
        "{v}"
    );
    assert!(elapsed < Duration::from_secs(3), "failed after {elapsed:?}");
    assert!(to_prefill.await.unwrap().is_err(), "the prefill is gone");
    wait("decode's pages back", || idle(&d)).await;
}

#[tokio::test]
async fn a_killed_decode_makes_the_prefill_free_the_room() {
    let p = common::start(SimConfig {
        prefill_compute_per_token: Duration::from_millis(50),
        ..pd_cfg(SimMode::Prefill)
    })
    .await;
    let mut decode = sim_proc("decode", &["--heartbeat-interval", "200ms"]);
    let body = with_room(20, p.bootstrap_addr().unwrap().port(), 7);
    let c = reqwest::Client::new();
    let to_decode = tokio::spawn(
        c.post(format!("{}/generate", decode.http))
            .json(&body)
            .send(),
    );
    let to_prefill = tokio::spawn(c.post(format!("{}/generate", p.url())).json(&body).send());
    wait("the prefill met the decode's registration", || {
        stats(&p).rooms_open == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    decode.kill();
    assert!(to_decode.await.unwrap().is_err());
    let r = to_prefill.await.unwrap().unwrap();
    assert_eq!(r.status(), 500, "the writes to a dead decode fail");
    wait("the prefill freed the room and its pages", || idle(&p)).await;
    assert_eq!(stats(&p).failures, 1);
}

#[tokio::test]
async fn through_the_gateway_a_dead_or_unreachable_decode_is_named_and_nothing_leaks() {
    let p = common::start(SimConfig {
        prefill_compute_per_token: Duration::from_millis(50),
        ..pd_cfg(SimMode::Prefill)
    })
    .await;
    let boot = p.bootstrap_addr().unwrap().port();
    let mut decode = sim_proc("decode", &["--heartbeat-interval", "200ms"]);
    let gw = gateway_with(&[(p.url(), boot)], &[decode.http.clone()], true).await;
    let c = reqwest::Client::new();
    let req = c
        .post(format!("{}/generate", gw.url()))
        .json(&json!({"input_ids": (100..120).collect::<Vec<u32>>(), "sampling_params": {"max_new_tokens": 4}}))
        .send();
    let pending = tokio::spawn(req);
    wait("the room is open", || stats(&p).rooms_open == 1).await;
    decode.kill();
    let r = pending.await.unwrap().unwrap();
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "decode_bad_gateway", "{v}");
    wait("the prefill's room closed", || idle(&p)).await;

    // Now nothing listens there: decode_unavailable, and the prefill's request is cancelled.
    let r = c
        .post(format!("{}/generate", gw.url()))
        .json(&json!({"text": "a b c"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "decode_unavailable", "{v}");
    wait("the prefill's room closed", || idle(&p)).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn the_pd_demo_serves_what_it_prints_and_reports_each_move() {
    let demo = sim::demo::Demo::start(sim::demo::DemoConfig {
        port: 0,
        tpot: Duration::ZERO,
        pd: true,
        model_shape: ModelShape::Tiny,
        kv_transport: KvTransport::Tcp,
        ..Default::default()
    })
    .await
    .unwrap();
    let text = demo.instructions();
    let url = demo.gateway().url();
    for needle in [
        "curl -s",
        "/generate",
        "/sim/kv",
        "prefill_dp_rank=-1",
        "tiny shape",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    let mut moves = demo.kv_moves().expect("a PD demo reports moves");
    let body = json!({"text": "The gate opens at dawn", "sampling_params": {"max_new_tokens": 4}});
    answer(&format!("{url}/generate"), &body).await;
    let e = moves.recv().await.unwrap();
    assert_eq!((e.tokens, e.bytes), (6, 6 * TOKEN_BYTES));
    let line = sim::demo::describe(&e);
    assert!(
        line.contains("6 tokens") && line.contains("MiB moved in"),
        "{line}"
    );
    demo.shutdown().await;
}

#[test]
fn moongate_demo_pd_prints_a_curl_and_each_kv_move() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moongate"))
        .args([
            "demo",
            "--pd",
            "--port",
            "0",
            "--model-shape",
            "tiny",
            "--kv-transport",
            "tcp",
        ])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn moongate demo --pd");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("the gateway's url")
        .to_owned();
    let curl = lines
        .by_ref()
        .map(|l| l.unwrap())
        .find(|l| l.starts_with("curl -s ") && l.contains("/generate"))
        .expect("a curl to try");
    assert!(curl.contains(&url), "{curl}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let body = json!({"text": "a b c", "sampling_params": {"max_new_tokens": 2}});
    rt.block_on(answer(&format!("{url}/generate"), &body));
    let moved = lines
        .map(|l| l.unwrap())
        .find(|l| l.starts_with("KV room"))
        .expect("the move is reported");
    assert!(
        moved.contains("4 tokens") && moved.contains("GB/s"),
        "{moved}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
