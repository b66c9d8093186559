//! `--dp-aware`: each data-parallel rank of a worker is its own routing target. The ranks
//! are learnt from the worker's `/get_server_info`, listed, probed and counted one by one,
//! and the chosen rank reaches the worker as `data_parallel_rank` (PD: on both sides, the
//! bootstrap room agreeing with the prefill's rank). Against simulated workers with four
//! ranks each (the balance at saturation) and recording workers (the bytes).

use std::collections::BTreeMap;

use gateway::config::{PolicyKind, ServeConfig};
use moongate_tests::{
    Backend, eventually, fast_config, get_json, send_json, start_gateway, start_pd_gateway,
};
use serde_json::{Value, json};
use sim::SimConfig;

async fn sim_with_ranks(dp_size: u32) -> sim::SimHandle {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = SimConfig {
        dp_size,
        ttft: std::time::Duration::from_millis(20),
        tpot: std::time::Duration::from_millis(2),
        output_tokens: 4,
        ..SimConfig::default()
    };
    sim::spawn(cfg, l).await.unwrap()
}

/// Requests each rank of `worker` took (the sim's `sim_served` in `/v1/loads`).
async fn served(c: &reqwest::Client, worker: &sim::SimHandle) -> Vec<u64> {
    let loads = get_json(c, &format!("{}/v1/loads", worker.url())).await;
    loads["loads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["sim_served"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks_of_two_workers_share_the_load_evenly() {
    let workers = [sim_with_ranks(4).await, sim_with_ranks(4).await];
    let cfg = ServeConfig {
        worker_urls: workers.iter().map(|w| w.url()).collect(),
        dp_aware: true,
        ..fast_config()
    };
    let gw = start_gateway(cfg).await;
    eventually("eight ranks ready", || {
        gw.state().registry().counts() == (8, 8)
    })
    .await;
    let c = reqwest::Client::new();
    let list = get_json(&c, &format!("{}/workers", gw.url())).await;
    let mut ranks: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for w in list["workers"].as_array().unwrap() {
        assert_eq!(w["dp_size"], 4, "{w}");
        ranks
            .entry(w["url"].as_str().unwrap().to_owned())
            .or_default()
            .push(w["dp_rank"].as_u64().unwrap());
    }
    for r in ranks.values_mut() {
        r.sort();
        assert_eq!(r, &[0, 1, 2, 3], "{list}");
    }

    // Saturation: 64 clients at once over 8 ranks, 800 requests in all.
    let total = 800usize;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..64 {
        let (c, url, next) = (c.clone(), format!("{}/generate", gw.url()), next.clone());
        clients.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    return;
                }
                let body = json!({"text": format!("request {i} about the moon and the sea"),
                    "sampling_params": {"max_new_tokens": 4}});
                let (st, v) = send_json(&c, &url, &body).await;
                assert_eq!(st, 200, "{v}");
            }
        }));
    }
    for t in clients {
        t.await.unwrap();
    }
    let mut counts = Vec::new();
    for w in &workers {
        counts.extend(served(&c, w).await);
    }
    let mean = total as f64 / 8.0;
    let spread: Vec<f64> = counts.iter().map(|&n| n as f64 / mean - 1.0).collect();
    eprintln!(
        "dp-aware, power_of_two, 2 workers x 4 ranks, {total} requests: per rank {counts:?}, off the mean by {spread:.3?}"
    );
    assert_eq!(counts.iter().sum::<u64>(), total as u64);
    assert!(
        spread.iter().all(|d| d.abs() <= 0.10),
        "per-rank counts {counts:?} stray over 10% from {mean}"
    );
    // The fan-outs ask each worker once, not once per rank.
    let (st, v) = send_json(&c, &format!("{}/flush_cache", gw.url()), &json!({})).await;
    assert_eq!((st, v["total_workers"].as_u64()), (200, Some(2)), "{v}");
    let loads = get_json(&c, &format!("{}/get_loads", gw.url())).await;
    let entries = loads["workers"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{loads}");
    assert!(
        entries
            .iter()
            .all(|e| e["details"].as_array().unwrap().len() == 4),
        "one line per rank: {loads}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn the_rank_goes_in_the_body_and_a_url_names_every_rank() {
    let b = Backend::start("dp", "m").await;
    b.knobs()
        .dp_size
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let cfg = ServeConfig {
        worker_urls: vec![b.url()],
        dp_aware: true,
        policy: PolicyKind::RoundRobin,
        ..fast_config()
    };
    let gw = start_gateway(cfg).await;
    eventually("two ranks ready", || {
        gw.state().registry().counts() == (2, 2)
    })
    .await;
    let c = reqwest::Client::new();
    for i in 0..4 {
        let (st, v) = send_json(
            &c,
            &format!("{}/v1/completions", gw.url()),
            &json!({"model": "m", "prompt": format!("p{i}")}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
    }
    // The client's own rank is replaced; tokenize carries none (the worker's tokenizer
    // answers it, not a rank's scheduler).
    let raw = br#"{"model":"m", "data_parallel_rank": 9, "text":"x"}"#;
    let st = c
        .post(format!("{}/generate", gw.url()))
        .header("content-type", "application/json")
        .body(&raw[..])
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(st, 200);
    let (st, _) = send_json(
        &c,
        &format!("{}/v1/tokenize", gw.url()),
        &json!({"model": "m", "prompt": "x"}),
    )
    .await;
    assert_eq!(st, 200);
    let seen = b.seen();
    let bodies: Vec<String> = seen
        .iter()
        .map(|s| String::from_utf8(s.body.to_vec()).unwrap())
        .collect();
    let mut ranks: Vec<u64> = Vec::new();
    for (i, body) in bodies.iter().take(4).enumerate() {
        // Byte for byte what the client sent, the rank added as the last member.
        let sent =
            serde_json::to_string(&json!({"model": "m", "prompt": format!("p{i}")})).unwrap();
        let head = &sent[..sent.len() - 1];
        assert!(body.starts_with(head), "{body}");
        let rank: u64 = body[head.len()..]
            .strip_prefix(",\"data_parallel_rank\":")
            .and_then(|r| r.strip_suffix('}'))
            .unwrap()
            .parse()
            .unwrap();
        ranks.push(rank);
    }
    ranks.sort();
    assert_eq!(ranks, [0, 0, 1, 1], "round robin over the two ranks");
    let v: Value = serde_json::from_str(&bodies[4]).unwrap();
    assert_eq!(
        bodies[4].matches("data_parallel_rank").count(),
        1,
        "{}",
        bodies[4]
    );
    assert!(
        v["data_parallel_rank"] == 0 || v["data_parallel_rank"] == 1,
        "{v}"
    );
    assert_eq!(
        bodies[5].matches("data_parallel_rank").count(),
        0,
        "{}",
        bodies[5]
    );

    // A target header naming the URL picks one of its ranks; `url@rank` picks that one.
    let header = ServeConfig::default().target_worker_header;
    for (target, want) in [(format!("{}@1", b.url()), Some(1)), (b.url(), None)] {
        let before = b.hits();
        let st = c
            .post(format!("{}/generate", gw.url()))
            .header(&header, &target)
            .json(&json!({"text": "t"}))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(st, 200, "{target}");
        let v: Value = serde_json::from_slice(&b.seen()[before].body).unwrap();
        if let Some(r) = want {
            assert_eq!(v["data_parallel_rank"], r, "{target}");
        }
    }

    // A change to one rank is the worker's; so is removing one: every rank goes.
    let list = get_json(&c, &format!("{}/workers", gw.url())).await;
    let id = list["workers"][1]["id"].as_str().unwrap().to_owned();
    let st = c
        .patch(format!("{}/workers/{id}", gw.url()))
        .json(&json!({"labels": {"zone": "a"}, "priority": 7}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(st, 200);
    let list = get_json(&c, &format!("{}/workers", gw.url())).await;
    for w in list["workers"].as_array().unwrap() {
        assert_eq!(
            (&w["labels"]["zone"], &w["priority"]),
            (&json!("a"), &json!(7)),
            "{w}"
        );
    }
    let st = c
        .delete(format!("{}/workers/{id}", gw.url()))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(st, 202);
    eventually("both ranks gone", || {
        gw.state().registry().list().is_empty()
    })
    .await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_worker_takes_no_request_before_its_ranks_are_known() {
    let b = Backend::start("dp", "m").await;
    b.knobs()
        .info_down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    b.knobs()
        .dp_size
        .store(3, std::sync::atomic::Ordering::SeqCst);
    let cfg = ServeConfig {
        worker_urls: vec![b.url()],
        dp_aware: true,
        ..fast_config()
    };
    let gw = start_gateway(cfg).await;
    let c = reqwest::Client::new();
    eventually("a probe asked for its server info", || {
        b.probes().iter().any(|(p, _)| p == "/get_server_info")
    })
    .await;
    let list = get_json(&c, &format!("{}/workers", gw.url())).await;
    assert_eq!(list["workers"].as_array().unwrap().len(), 1, "{list}");
    assert_ne!(list["workers"][0]["status"], "ready", "{list}");
    let err = list["workers"][0]["health"]["last_error"]
        .as_str()
        .unwrap_or("");
    assert!(err.contains("dp-aware"), "{list}");
    let (st, v) = send_json(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
    assert_eq!(st, 503, "{v}");
    assert_eq!(b.hits(), 0);
    // Once it says, its three ranks take requests.
    b.knobs()
        .info_down
        .store(false, std::sync::atomic::Ordering::SeqCst);
    eventually("three ranks ready", || {
        gw.state().registry().counts() == (3, 3)
    })
    .await;
    let (st, v) = send_json(&c, &format!("{}/generate", gw.url()), &json!({"text": "x"})).await;
    assert_eq!(st, 200, "{v}");
    gw.shutdown().await;
}

#[tokio::test]
async fn pd_sends_each_side_its_rank_and_a_room_of_the_prefill_rank() {
    let p = Backend::start("prefill", "m").await;
    let d = Backend::start("decode", "m").await;
    p.knobs()
        .dp_size
        .store(4, std::sync::atomic::Ordering::SeqCst);
    d.knobs()
        .dp_size
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let gw = start_pd_gateway(&[(&p.url(), Some(8998))], &[&d.url()], |c| {
        c.dp_aware = true;
        c.policy = PolicyKind::RoundRobin;
    })
    .await;
    eventually("six ranks ready", || {
        gw.state().registry().counts() == (6, 6)
    })
    .await;
    let c = reqwest::Client::new();
    for i in 0..8 {
        let (st, v) = send_json(
            &c,
            &format!("{}/generate", gw.url()),
            &json!({"text": format!("t{i}"), "sampling_params": {"max_new_tokens": 2}}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
    }
    let (ps, ds) = (p.seen(), d.seen());
    assert_eq!((ps.len(), ds.len()), (8, 8));
    let mut prefill_ranks = std::collections::BTreeSet::new();
    for s in &ps {
        let v: Value = serde_json::from_slice(&s.body).unwrap();
        let rank = v["data_parallel_rank"].as_u64().unwrap();
        let room = v["bootstrap_room"].as_u64().unwrap();
        assert_eq!(room % 4, rank, "the room agrees with the prefill rank: {v}");
        assert!(room < 1 << 63);
        prefill_ranks.insert(rank);
        // Its decode twin has the same room and its own rank.
        let twin = ds
            .iter()
            .map(|s| serde_json::from_slice::<Value>(&s.body).unwrap())
            .find(|d| d["bootstrap_room"] == room)
            .expect("the decode side of the room");
        assert!(twin["data_parallel_rank"].as_u64().unwrap() < 2, "{twin}");
    }
    assert_eq!(
        prefill_ranks.len(),
        4,
        "every prefill rank used: {prefill_ranks:?}"
    );
    gw.shutdown().await;
}

/// A simulated worker with `dp` ranks publishing KV events (and replays), rank `r` on the
/// endpoints' ports + `r` as SGLang binds them: fixed ports, so a free block is found
/// first (and looked for again should another process take it meanwhile).
async fn sim_with_rank_events(dp: u32) -> sim::SimHandle {
    for _ in 0..20 {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = probe.local_addr().unwrap().port();
        drop(probe);
        if u32::from(base) + 2 * dp >= 65535 {
            continue;
        }
        let block: Vec<_> = (0..2 * dp as u16)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if block.iter().any(|b| b.is_err()) {
            continue;
        }
        drop(block);
        let cfg = SimConfig {
            model: "m".into(),
            dp_size: dp,
            model_shape: sim::ModelShape::Tiny,
            page_size: 4,
            kv_pool_size: 4096 * 128,
            kv_events_config: Some(sglang::kv_events::KvEventsConfig {
                endpoint: format!("tcp://127.0.0.1:{base}"),
                replay_endpoint: Some(format!("tcp://127.0.0.1:{}", base + dp as u16)),
                ..Default::default()
            }),
            ..SimConfig::default()
        };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        if let Ok(s) = sim::spawn(cfg, l).await {
            return s;
        }
    }
    panic!("no free block of event ports");
}

#[tokio::test]
async fn kv_aware_follows_each_rank_on_its_own_events() {
    let sims = [sim_with_rank_events(2).await, sim_with_rank_events(2).await];
    let cfg = ServeConfig {
        worker_urls: sims.iter().map(|s| s.url()).collect(),
        policy: PolicyKind::KvAware,
        dp_aware: true,
        ..fast_config()
    };
    let gw = start_gateway(cfg).await;
    eventually("four ranks ready", || {
        gw.state().registry().counts() == (4, 4)
    })
    .await;
    let router = gw.state().router();
    let kv = router.policy().kv_aware().expect("kv_aware");
    eventually("following every rank", || kv.followed() == 4).await;
    let c = reqwest::Client::new();
    let ws: Vec<_> = gw.state().registry().list().iter().cloned().collect();
    // Each rank caches a prompt of its own, sent to it directly (not through the gateway);
    // a fresh filler each round, so a subscriber that joined late still gets events.
    let prompt =
        |i: usize| -> Vec<u32> { (1000 * (i as u32 + 1)..1000 * (i as u32 + 1) + 64).collect() };
    let mut attempts = 0u32;
    loop {
        for (i, w) in ws.iter().enumerate() {
            let s = sims
                .iter()
                .find(|s| s.url() == w.url().as_str().trim_end_matches('/'))
                .unwrap();
            let body = json!({"input_ids": prompt(i), "sampling_params": {"max_new_tokens": 1},
                "data_parallel_rank": w.dp_rank().unwrap().rank});
            let (st, v) = send_json(&c, &format!("{}/generate", s.url()), &body).await;
            assert_eq!(st, 200, "{v}");
            let filler: Vec<u32> = (0..4)
                .map(|k| 100 + attempts * 16 + i as u32 * 4 + k)
                .collect();
            let body = json!({"input_ids": filler, "sampling_params": {"max_new_tokens": 1},
                "data_parallel_rank": w.dp_rank().unwrap().rank});
            send_json(&c, &format!("{}/generate", s.url()), &body).await;
        }
        if ws.iter().all(|w| kv.has_events(w)) {
            break;
        }
        attempts += 1;
        let has: Vec<bool> = ws.iter().map(|w| kv.has_events(w)).collect();
        assert!(
            attempts < 50,
            "events never arrived from every rank: {has:?}, following {}",
            kv.followed()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let all: Vec<_> = ws.iter().collect();
    for i in 0..ws.len() {
        eventually("the index knows the prompt on its rank only", || {
            let seen = kv.cached_tokens(&all, &prompt(i));
            seen[i] == Some(64.0) && seen.iter().filter(|c| **c == Some(64.0)).count() == 1
        })
        .await;
    }
    // Through the gateway each prompt (with a new tail) lands on the rank that holds it.
    for i in 0..ws.len() {
        let mut q = prompt(i);
        q.extend([7, 7, 7, 7, 7]);
        let (st, r) = send_json(
            &c,
            &format!("{}/generate", gw.url()),
            &json!({"input_ids": q, "sampling_params": {"max_new_tokens": 1}}),
        )
        .await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["meta_info"]["cached_tokens"], 64, "prompt {i}: {r}");
    }
    gw.shutdown().await;
}
