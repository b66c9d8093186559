//! The simulated worker's prefix cache over real sockets: cached tokens in both APIs'
//! answers, prefill time proportional to the uncached part, eviction when the pool is full,
//! and SGLang's KV events read by a real ZMQ subscriber (ours) and replayed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Value, json};
use sglang::kv_events::KvEventsConfig;
use sglang::kv_events::hash;
use sglang::kv_events::subscribe::{self, EventSink, Source};
use sglang::kv_events::wire::{EventBatch, KvEvent};
use sim::SimConfig;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

mod common;

use common::{get_json, post, start};

async fn generate(url: &str, ids: &[u32]) -> Value {
    let body = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 2}});
    common::post(&format!("{url}/generate"), &body).await.1
}

fn ids(from: u32, n: u32) -> Vec<u32> {
    (from..from + n).collect()
}

#[tokio::test]
async fn repeated_prompts_report_cached_tokens() {
    let w = common::start(SimConfig {
        port: 0,
        page_size: 4,
        enable_cache_report: true,
        ..SimConfig::default()
    })
    .await;
    let first = generate(&w.url(), &ids(300, 10)).await;
    assert_eq!(first["meta_info"]["cached_tokens"], 0);
    let second = generate(&w.url(), &ids(300, 10)).await;
    assert_eq!(
        second["meta_info"]["cached_tokens"], 8,
        "two whole pages of four"
    );
    // Without a store (HiCache off), SGLang gives no breakdown.
    assert!(
        second["meta_info"].get("cached_tokens_details").is_none(),
        "{second}"
    );
    let chat = json!({"messages": [{"role": "user", "content": "one two three four five six"}]});
    let mut cached = Vec::new();
    for _ in 0..2 {
        let (status, r) = common::post(&format!("{}/v1/chat/completions", w.url()), &chat).await;
        assert_eq!(status, 200, "{r}");
        cached.push(
            r["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(cached[0], 0);
    assert!(cached[1] >= 8, "{cached:?}");
    let stats = common::get_json(&format!("{}/sim/prefix", w.url())).await;
    assert_eq!(stats["page_size"], 4);
}

#[tokio::test]
async fn prefill_time_follows_the_uncached_tokens() {
    let w = common::start(SimConfig {
        port: 0,
        page_size: 16,
        prefill_compute_per_token: Duration::from_millis(5),
        ..SimConfig::default()
    })
    .await;
    let prompt = ids(1000, 400);
    let t = Instant::now();
    generate(&w.url(), &prompt).await;
    let cold = t.elapsed();
    let t = Instant::now();
    let warm = generate(&w.url(), &prompt).await;
    let hot = t.elapsed();
    assert_eq!(warm["meta_info"]["cached_tokens"], 400);
    // 400 tokens x 5 ms = 2 s cold; warm computes nothing.
    assert!(cold >= Duration::from_secs(2), "{cold:?}");
    assert!(hot < cold / 2, "cold {cold:?} hot {hot:?}");
}

#[derive(Default)]
struct Collect {
    batches: Mutex<Vec<EventBatch>>,
    resyncs: Mutex<usize>,
    up: Notify,
    got: Notify,
}

impl EventSink for Collect {
    fn apply(&self, b: &EventBatch) {
        self.batches.lock().push(b.clone());
        self.got.notify_one();
    }
    fn resync(&self) {
        *self.resyncs.lock() += 1;
    }
    fn connected(&self, up: bool) {
        if up {
            self.up.notify_one();
        }
    }
}

impl Collect {
    async fn wait_for(&self, n: usize) -> Vec<EventBatch> {
        loop {
            let notified = self.got.notified();
            if self.batches.lock().len() >= n {
                return self.batches.lock().clone();
            }
            tokio::time::timeout(Duration::from_secs(10), notified)
                .await
                .expect("events did not arrive");
        }
    }
}

/// Events (and their replay socket) on loopback ports of their own.
fn loopback_events() -> KvEventsConfig {
    KvEventsConfig {
        endpoint: "tcp://127.0.0.1:0".into(),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        topic: "kv-events".into(),
        ..KvEventsConfig::default()
    }
}

#[tokio::test]
async fn events_tell_what_is_cached_and_evicted() {
    // Two pages of 4 tokens fit: the third prompt page evicts the oldest.
    let cfg = SimConfig {
        port: 0,
        page_size: 4,
        kv_pool_size: 2 * 4 * 131_072,
        kv_events_config: Some(loopback_events()),
        ..SimConfig::default()
    };
    let w = common::start(cfg).await;
    let (endpoint, replay) = w.kv_events().unwrap();
    assert!(endpoint.starts_with("tcp://127.0.0.1:"), "{endpoint}");
    assert!(replay.is_some(), "a replay socket was asked for");
    // One request before anyone listens: the subscriber gets it through the replay socket.
    generate(&w.url(), &ids(1, 8)).await;
    // Keep publishing until the subscription is live (PUB drops what it sends before).
    let (sink, stop) = live_subscriber(&w, 2).await;
    let got = sink.wait_for(2).await;
    let first = &got[0].events[0];
    let KvEvent::BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        ..
    } = first
    else {
        panic!("{first:?}")
    };
    assert_eq!(block_hashes, &hash::block_hashes(&ids(1, 8), 4));
    assert_eq!(
        (*parent_block_hash, token_ids.clone(), *block_size),
        (None, ids(1, 8), 4)
    );
    let removed = got
        .iter()
        .flat_map(|b| &b.events)
        .any(|e| matches!(e, KvEvent::BlockRemoved { .. }));
    assert!(removed, "the pool of two pages evicted: {got:?}");
    assert_eq!(*sink.resyncs.lock(), 0);
    // /flush_cache clears everything.
    let n = sink.batches.lock().len();
    reqwest::Client::new()
        .post(format!("{}/flush_cache", w.url()))
        .send()
        .await
        .unwrap();
    let all = sink.wait_for(n + 1).await;
    assert!(matches!(
        all.last().unwrap().events[..],
        [KvEvent::AllBlocksCleared]
    ));
    stop.cancel();
}

/// A subscriber on `w`'s events, live when this returns: it has seen `n` batches (the
/// worker is sent one-page prompts until then, as PUB drops what it sends before).
async fn live_subscriber(w: &sim::SimHandle, n: usize) -> (Arc<Collect>, CancellationToken) {
    let (endpoint, replay) = w.kv_events().unwrap();
    let sink = Arc::new(Collect::default());
    let stop = CancellationToken::new();
    let src = Source {
        endpoint: endpoint.to_owned(),
        replay_endpoint: replay.map(str::to_owned),
        topic: "kv-events".into(),
    };
    tokio::spawn(subscribe::run(src, sink.clone(), stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), sink.up.notified())
        .await
        .unwrap();
    let mut k = 0;
    while sink.batches.lock().len() < n {
        generate(&w.url(), &ids(20_000 + 4 * k, 4)).await;
        k += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(k < 200, "no events");
    }
    (sink, stop)
}

#[tokio::test]
async fn a_prompts_pages_are_published_once_its_prefill_has_run() {
    let w = common::start(SimConfig {
        port: 0,
        page_size: 4,
        prefill_compute_per_token: Duration::from_millis(2),
        kv_events_config: Some(loopback_events()),
        ..SimConfig::default()
    })
    .await;
    let (sink, stop) = live_subscriber(&w, 1).await;
    let n = sink.batches.lock().len();
    // 400 uncached tokens at 2 ms: the prefill takes 800 ms.
    let prompt = ids(1000, 400);
    let first = hash::block_hashes(&prompt, 4)[0];
    let url = w.url();
    let t = Instant::now();
    let req = tokio::spawn(async move { generate(&url, &prompt).await });
    let seen = loop {
        let got = sink.wait_for(n + 1).await;
        let has = got.iter().flat_map(|b| &b.events).any(|e| {
            matches!(e, KvEvent::BlockStored { block_hashes, .. } if block_hashes.contains(&first))
        });
        if has {
            break t.elapsed();
        }
        sink.wait_for(got.len() + 1).await;
    };
    assert!(
        seen >= Duration::from_millis(790),
        "published after {seen:?}"
    );
    req.await.unwrap();
    stop.cancel();
}

#[tokio::test]
async fn data_parallel_ranks_keep_their_own_caches_and_counts() {
    let w = start(SimConfig {
        dp_size: 2,
        page_size: 2,
        ..SimConfig::default()
    })
    .await;
    let url = format!("{}/generate", w.url());
    let info = get_json(&format!("{}/get_server_info", w.url())).await;
    assert_eq!(info["dp_size"], 2);
    let prompt = |rank: Option<u32>| {
        let mut b = json!({"input_ids": [5, 6, 7, 8, 9, 10, 11, 12],
            "sampling_params": {"max_new_tokens": 1}});
        if let Some(r) = rank {
            b["data_parallel_rank"] = r.into();
        }
        b
    };
    let cached = |v: &Value| v["meta_info"]["cached_tokens"].as_u64().unwrap();
    // Rank 1 computes the prompt, then has it; rank 0 has not seen it.
    let (s, v) = post(&url, &prompt(Some(1))).await;
    assert_eq!((s, cached(&v)), (200, 0), "{v}");
    let (_, v) = post(&url, &prompt(Some(1))).await;
    assert!(cached(&v) >= 6, "{v}");
    let (_, v) = post(&url, &prompt(Some(0))).await;
    assert_eq!(cached(&v), 0, "{v}");
    // A rank the worker does not have: 400, nothing run.
    let (s, v) = post(&url, &prompt(Some(2))).await;
    assert_eq!(s, 400, "{v}");
    assert!(v.to_string().contains("data_parallel_rank 2"), "{v}");
    // Without a rank: in turn.
    for _ in 0..4 {
        assert_eq!(post(&url, &prompt(None)).await.0, 200);
    }
    let loads = get_json(&format!("{}/v1/loads", w.url())).await;
    let served: Vec<u64> = loads["loads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["sim_served"].as_u64().unwrap())
        .collect();
    assert_eq!(served, [3, 4], "{loads}");
    assert_eq!(loads["dp_rank_count"], 2);
    let load = get_json(&format!("{}/get_load", w.url())).await;
    assert_eq!(load.as_array().unwrap().len(), 2, "{load}");
    // Config checks: ranks need a regular worker and bounded counts.
    for bad in [
        SimConfig {
            dp_size: 0,
            ..SimConfig::default()
        },
        SimConfig {
            dp_size: 65,
            ..SimConfig::default()
        },
        SimConfig {
            dp_size: 2,
            mode: sim::config::SimMode::Prefill,
            ..SimConfig::default()
        },
    ] {
        assert!(bad.validate().is_err(), "{}", bad.dp_size);
    }
}
