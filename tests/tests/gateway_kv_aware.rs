//! `kv_aware` over real sockets: simulated workers publish SGLang KV events over ZMQ, the
//! gateway follows them (endpoints discovered from `/get_server_info`), and a prompt goes
//! to the worker that really holds its prefix, even one the gateway never sent it to.

use std::sync::Arc;

use gateway::config::PolicyKind;
use gateway::launch::Gateway;
use gateway::workers::Worker;
use moongate_tests::{eventually, fast_config, generate_ids as generate, start_gateway};
use serde_json::{Value, json};
use sglang::kv_events::KvEventsConfig;
use sim::{self, SimConfig, SimHandle};
use tokio::net::TcpListener;

/// A simulated worker of `mode` with a prefix cache (4-token pages) publishing its KV events
/// (and a replay socket) on loopback ports of its own.
async fn sim_with_events(mode: sim::SimMode) -> SimHandle {
    sim_with(mode, SimConfig::default()).await
}

/// [`sim_with_events`] with the rest of its configuration from `base`.
async fn sim_with(mode: sim::SimMode, base: SimConfig) -> SimHandle {
    let cfg = SimConfig {
        port: 0,
        model: "m".into(),
        mode,
        model_shape: sim::ModelShape::Tiny,
        page_size: 4,
        kv_pool_size: 4096 * 128,
        bootstrap_port: 0,
        kv_transport: sim::config::KvTransport::Tcp,
        kv_events_config: Some(KvEventsConfig {
            endpoint: "tcp://127.0.0.1:0".into(),
            replay_endpoint: Some("tcp://127.0.0.1:0".into()),
            ..KvEventsConfig::default()
        }),
        ..base
    };
    sim::spawn(cfg, TcpListener::bind("127.0.0.1:0").await.unwrap())
        .await
        .unwrap()
}

fn workers(gw: &Gateway) -> Vec<Arc<Worker>> {
    gw.state().registry().snapshot().iter().cloned().collect()
}

/// Sends generates straight to `sim` until the gateway's index holds events of `worker`.
async fn until_events(
    c: &reqwest::Client,
    kv: &gateway::select::kv_aware::KvAware,
    sim: &SimHandle,
    worker: &Worker,
) {
    for attempt in 0..50 {
        generate(c, &sim.url(), &[1, 2, 3, 4]).await;
        if kv.has_events(worker) {
            return;
        }
        assert!(attempt < 49, "events never arrived");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// POSTs `body` to the gateway's `/generate` in a task of its own.
fn generate_later(gw: &Gateway, body: Value) -> tokio::task::JoinHandle<reqwest::Response> {
    let url = format!("{}/generate", gw.url());
    tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&body)
            .send()
            .await
            .unwrap()
    })
}

/// `kv_aware`'s prompt tokens routed on events and those cached where they went (every
/// tier), from `/metrics` (0 before the first).
async fn kv_tokens(c: &reqwest::Client, base: &str) -> (u64, u64) {
    let text = moongate_tests::get_text(c, &format!("{base}/metrics")).await;
    // The sum of the series of `name` (cached tokens are labelled by tier).
    let read = |name: &str| -> u64 {
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|r| r.starts_with([' ', '{']))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    (
        read("moongate_gateway_kv_aware_prompt_tokens_total"),
        read("moongate_gateway_kv_aware_cached_tokens_total"),
    )
}

#[tokio::test]
async fn prompts_go_where_their_prefix_is_cached() {
    let sims = [
        sim_with_events(sim::SimMode::Regular).await,
        sim_with_events(sim::SimMode::Regular).await,
        sim_with_events(sim::SimMode::Regular).await,
    ];
    let cfg = gateway::config::ServeConfig {
        worker_urls: sims.iter().map(|s| s.url()).collect(),
        policy: PolicyKind::KvAware,
        ..fast_config()
    };
    let gw = start_gateway(cfg).await;
    eventually("workers ready", || gw.state().registry().counts().0 == 3).await;
    let router = gw.state().router();
    let kv = router.policy().kv_aware().expect("kv_aware");
    for _ in 0..10 {
        if kv.followed() == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert_eq!(
        kv.followed(),
        3,
        "the gateway follows every worker's events"
    );
    let c = reqwest::Client::new();
    // Each worker caches its own prompt, sent to it directly (not through the gateway).
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| (1000 * (i + 1)..1000 * (i + 1) + 64).collect())
        .collect();
    for attempt in 0..50 {
        for (s, p) in sims.iter().zip(&prompts) {
            generate(&c, &s.url(), p).await;
        }
        let ws = workers(&gw);
        if ws.iter().all(|w| kv.has_events(w)) {
            break;
        }
        assert!(attempt < 49, "events never arrived");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let ws = workers(&gw);
    let all: Vec<&Arc<Worker>> = ws.iter().collect();
    for p in &prompts {
        eventually("the index knows the prompt", || {
            kv.cached_tokens(&all, p).contains(&Some(64.0))
        })
        .await;
    }
    // Through the gateway each prompt (with a new tail) lands where it is cached.
    let before = kv_tokens(&c, &gw.url()).await;
    for (i, p) in prompts.iter().enumerate() {
        let mut q = p.clone();
        q.extend([7, 7, 7, 7, 7]);
        let r = generate(&c, &gw.url(), &q).await;
        assert_eq!(r["meta_info"]["cached_tokens"], 64, "prompt {i}: {r}");
    }
    // Counted as the policy's hits: 64 of each 69 tokens (the counters are the process's,
    // and other tests here route too, so at least that much).
    let after = kv_tokens(&c, &gw.url()).await;
    assert!(after.0 - before.0 >= 3 * 69, "{before:?} -> {after:?}");
    assert!(after.1 - before.1 >= 3 * 64, "{before:?} -> {after:?}");
    let metrics = moongate_tests::get_text(&c, &format!("{}/metrics", gw.url())).await;
    assert!(
        metrics.contains(r#"moongate_gateway_kv_aware_cached_tokens_total{tier="device"}"#),
        "cached tokens are counted by tier"
    );
    let (pages, applied) = kv.index_stats();
    assert!(pages >= 48 && applied >= 3, "{pages} {applied}");
}

#[tokio::test]
async fn a_prefill_backlog_lasts_until_the_first_token() {
    // 64 uncached tokens at 10 ms each: the first token comes 640 ms after the request,
    // then one every 200 ms.
    let s = sim_with(
        sim::SimMode::Regular,
        SimConfig {
            prefill_compute_per_token: std::time::Duration::from_millis(10),
            tpot: std::time::Duration::from_millis(200),
            ..SimConfig::default()
        },
    )
    .await;
    let cfg = gateway::config::ServeConfig {
        worker_urls: vec![s.url()],
        policy: PolicyKind::KvAware,
        ..fast_config()
    };
    let gw = start_gateway(cfg).await;
    eventually("worker ready", || gw.state().registry().counts().0 == 1).await;
    let router = gw.state().router();
    let kv = router.policy().kv_aware().unwrap();
    eventually("the gateway follows the worker's events", || {
        kv.followed() == 1
    })
    .await;
    let c = reqwest::Client::new();
    let w = workers(&gw).pop().unwrap();
    until_events(&c, kv, &s, &w).await;
    assert_eq!(w.prefill_backlog(), 0);
    let body = json!({"input_ids": (100..164).collect::<Vec<u32>>(),
        "sampling_params": {"max_new_tokens": 4}, "stream": true});
    let sent = generate_later(&gw, body);
    eventually("the request's prefill charged to the worker", || {
        w.prefill_backlog() == 64
    })
    .await;
    let mut resp = sent.await.unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().expect("a first event");
    assert!(first.starts_with(b"data: "), "{first:?}");
    // The gateway released the charge when it relayed the first token; the stream goes on.
    assert_eq!(w.prefill_backlog(), 0);
    assert_eq!(w.load(), 1);
    while resp.chunk().await.unwrap().is_some() {}
}

#[tokio::test]
async fn a_worker_that_answered_a_retryable_status_holds_no_prefill_charge_during_the_retry() {
    // s prefills at 10 ms a token; a answers every inference request 503.
    let s = sim_with(
        sim::SimMode::Regular,
        SimConfig {
            prefill_compute_per_token: std::time::Duration::from_millis(10),
            ..SimConfig::default()
        },
    )
    .await;
    let a = moongate_tests::Backend::start("a", "m").await;
    a.knobs()
        .status
        .store(503, std::sync::atomic::Ordering::Relaxed);
    let cfg = gateway::config::ServeConfig {
        worker_urls: vec![s.url(), a.url()],
        policy: PolicyKind::KvAware,
        ..fast_config()
    };
    let gw = start_gateway(cfg).await;
    eventually("workers ready", || gw.state().registry().counts().0 == 2).await;
    let router = gw.state().router();
    let kv = router.policy().kv_aware().unwrap();
    eventually("the gateway follows s's events", || kv.followed() == 1).await;
    let c = reqwest::Client::new();
    let by_url = |url: String| {
        workers(&gw)
            .into_iter()
            .find(|w| w.url().as_str() == url)
            .unwrap()
    };
    let (ws, wa) = (by_url(s.url()), by_url(a.url()));
    until_events(&c, kv, &s, &ws).await;
    // A backlog on s makes a the cheaper pick: the request goes to a first, is answered 503,
    // and is retried on s.
    let mut busy = gateway::workers::LoadGuard::new(ws.clone());
    busy.charge_prefill(10_000);
    let body = json!({"input_ids": (100..164).collect::<Vec<u32>>(),
        "sampling_params": {"max_new_tokens": 2}});
    let sent = generate_later(&gw, body);
    eventually("a answered and the request was retried on s", || {
        a.hits() == 1 && ws.load() == 2
    })
    .await;
    // s prefills for 640 ms; a's answer is kept in case s fails too, but a's prefill is over.
    assert_eq!(wa.prefill_backlog(), 0, "a still charged while s prefills");
    drop(busy);
    let resp = sent.await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(wa.prefill_backlog(), 0);
}

#[tokio::test]
async fn pd_skips_the_prefill_when_decode_has_the_prompt() {
    let p = sim_with_events(sim::SimMode::Prefill).await;
    let d = sim_with_events(sim::SimMode::Decode).await;
    let boot = p.bootstrap_addr().unwrap().port();
    let gw = moongate_tests::start_pd_gateway(&[(&p.url(), Some(boot))], &[&d.url()], |c| {
        c.prefill_policy = Some(PolicyKind::KvAware);
        c.decode_policy = Some(PolicyKind::KvAware);
        c.pd_min_uncached_tokens = 16;
    })
    .await;
    eventually("workers ready", || gw.state().registry().counts().0 == 2).await;
    let pd = gw.state().pd_router().unwrap();
    let decode_kv = pd.policies()[1].kv_aware().unwrap();
    for _ in 0..10 {
        if decode_kv.followed() == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let c = reqwest::Client::new();
    let prompt: Vec<u32> = (500..564).collect();
    // First time: nothing cached anywhere, so prefill and decode both take part.
    let first = generate(&c, &gw.url(), &prompt).await;
    assert_eq!(first["meta_info"]["prompt_tokens"], 64, "{first}");
    assert_eq!(p.pd().unwrap().stats().moves, 1);
    let ws = workers(&gw);
    let decode = ws.iter().find(|w| w.url().as_str() == d.url()).unwrap();
    eventually("decode's events arrive", || {
        decode_kv.cached_tokens(&[decode], &prompt)[0] == Some(64.0)
    })
    .await;
    // Again, with a short new tail: decode holds all but 3 tokens, so it answers alone.
    let mut again = prompt.clone();
    again.extend([1, 2, 3]);
    let r = generate(&c, &gw.url(), &again).await;
    assert_eq!(r["meta_info"]["cached_tokens"], 64, "{r}");
    assert_eq!(p.pd().unwrap().stats().moves, 1, "the prefill was skipped");
}

#[tokio::test]
async fn pd_charges_the_prefill_worker_the_tokens_it_computes() {
    // The prefill worker computes at 10 ms a token: a 64-token prompt takes 640 ms.
    let p = sim_with(
        sim::SimMode::Prefill,
        SimConfig {
            prefill_compute_per_token: std::time::Duration::from_millis(10),
            ..SimConfig::default()
        },
    )
    .await;
    let d = sim_with_events(sim::SimMode::Decode).await;
    let boot = p.bootstrap_addr().unwrap().port();
    let gw = moongate_tests::start_pd_gateway(&[(&p.url(), Some(boot))], &[&d.url()], |c| {
        c.prefill_policy = Some(PolicyKind::KvAware);
    })
    .await;
    eventually("workers ready", || gw.state().registry().counts().0 == 2).await;
    let pd = gw.state().pd_router().unwrap();
    let kv = pd.policies()[0].kv_aware().unwrap();
    eventually("the prefill worker's events followed", || {
        kv.followed() == 1
    })
    .await;
    let ws = workers(&gw);
    let prefill = ws.iter().find(|w| w.url().as_str() == p.url()).unwrap();
    let decode = ws.iter().find(|w| w.url().as_str() == d.url()).unwrap();
    // A first request through the gateway makes the prefill worker publish.
    let c = reqwest::Client::new();
    generate(&c, &gw.url(), &(1..9).collect::<Vec<u32>>()).await;
    eventually("the prefill worker's events", || kv.has_events(prefill)).await;
    let body = json!({"input_ids": (700..764).collect::<Vec<u32>>(),
        "sampling_params": {"max_new_tokens": 2}});
    let sent = generate_later(&gw, body);
    eventually("the prompt charged to the prefill worker", || {
        prefill.prefill_backlog() == 64
    })
    .await;
    assert_eq!(decode.prefill_backlog(), 0, "decode computes none of it");
    assert_eq!(sent.await.unwrap().status(), 200);
    eventually("released with the prefill's answer", || {
        prefill.prefill_backlog() == 0
    })
    .await;
}

/// The test tokenizer (a small byte-level BPE with a ChatML template; its golden ids come
/// from Hugging Face's own code, see `tests/fixtures/tokenizer/make.py`).
fn tokenizer_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tokenizer")
}

fn chat(turns: &[&str]) -> Value {
    let roles = ["user", "assistant"];
    let messages: Vec<Value> = turns
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"role": roles[i % 2], "content": t}))
        .collect();
    json!({"model": "m", "messages": messages, "max_tokens": 2})
}

async fn post_chat(c: &reqwest::Client, base: &str, body: &Value) -> Value {
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test]
async fn chat_prompts_are_routed_by_the_tokens_the_workers_cache() {
    // Workers and gateway tokenize with the same tokenizer and chat template, as a gateway
    // and SGLang workers serving one model do.
    let with_tokenizer = || SimConfig {
        tokenizer_path: Some(tokenizer_dir()),
        enable_cache_report: true,
        ..SimConfig::default()
    };
    let sims = [
        sim_with(sim::SimMode::Regular, with_tokenizer()).await,
        sim_with(sim::SimMode::Regular, with_tokenizer()).await,
        sim_with(sim::SimMode::Regular, with_tokenizer()).await,
    ];
    let cfg = gateway::config::ServeConfig {
        worker_urls: sims.iter().map(|s| s.url()).collect(),
        policy: PolicyKind::KvAware,
        tokenizer_path: Some(tokenizer_dir()),
        ..fast_config()
    };
    let gw = start_gateway(cfg).await;
    eventually("workers ready", || gw.state().registry().counts().0 == 3).await;
    let router = gw.state().router();
    let kv = router.policy().kv_aware().expect("kv_aware");
    let tok: &sglang::tokenizer::Tokenizer = router
        .policy()
        .tokenizer()
        .expect("the gateway loaded the tokenizer");
    eventually("the gateway follows every worker's events", || {
        kv.followed() == 3
    })
    .await;
    let c = reqwest::Client::new();
    // Each worker holds its own conversation, sent to it directly (the gateway never saw
    // these prompts, so only the workers' events can tell it where they are).
    let topics = [
        "Tell me about the quiet forest where tall trees grow near the river.",
        "Write a function that prints hello world and adds two numbers.",
        "What is the weather in Paris today, and should I take an umbrella?",
    ];
    let firsts: Vec<Value> = topics.iter().map(|t| chat(&[t])).collect();
    for attempt in 0..50 {
        for (s, body) in sims.iter().zip(&firsts) {
            post_chat(&c, &s.url(), body).await;
        }
        if workers(&gw).iter().all(|w| kv.has_events(w)) {
            break;
        }
        assert!(attempt < 49, "events never arrived");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let page = 4;
    for (i, (s, topic)) in sims.iter().zip(topics).enumerate() {
        // The conversation goes on: its rendered prompt extends the cached one.
        let next = chat(&[topic, "Sure.", "Tell me more, please."]);
        let key = gateway::proxy::prompt::routing_key(
            gateway::proxy::Endpoint::ChatCompletions,
            &serde_json::to_vec(&next).unwrap(),
            Some(tok),
        )
        .unwrap();
        assert_eq!(key[0], b'i', "a chat prompt becomes token ids");
        let ws = workers(&gw);
        let all: Vec<&Arc<Worker>> = ws.iter().collect();
        let (chosen, decision) = kv.decide(&all, Some(&key));
        assert_eq!(decision, gateway::outcome::KvDecision::Events);
        assert_eq!(chosen.url().as_str(), s.url(), "conversation {i}");
        // Through the gateway: the worker that holds it answers, from its cache.
        let first = tok
            .chat_ids(
                &sglang::tokenizer::ChatPrompt::from_body(&serde_json::to_vec(&firsts[i]).unwrap())
                    .unwrap(),
            )
            .unwrap();
        let r = post_chat(&c, &gw.url(), &next).await;
        let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert_eq!(
            cached as usize,
            first.len() / page * page,
            "conversation {i}: {r}"
        );
        let prompt_tokens = r["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
        assert_eq!(
            prompt_tokens,
            (key.len() - 1) / 4,
            "the worker counts the ids the gateway computed"
        );
    }
    // A text prompt through /generate is tokenized too.
    let body = json!({"text": topics[0], "sampling_params": {"max_new_tokens": 1}});
    let key = gateway::proxy::prompt::routing_key(
        gateway::proxy::Endpoint::Generate,
        &serde_json::to_vec(&body).unwrap(),
        Some(tok),
    )
    .unwrap();
    assert_eq!(
        &key[1..5],
        &tok.text_ids(topics[0]).unwrap()[0].to_le_bytes()
    );
}
