//! L3 over real sockets: simulated workers with `--kv-store` write the pages they evict to
//! the KV master the gateway hosts, under SGLang HiCache's names, and load them back
//! through the transfer engine instead of computing them; the gateway's `kv_aware` counts
//! the pages the store holds.

use std::sync::Arc;

use gateway::config::PolicyKind;
use gateway::launch::Gateway;
use gateway::workers::Worker;
use kvclient::{ClientConfig, StoreClient};
use moongate_tests::store_sims::{PAGE, start_sim as start, store_sim as config};
use moongate_tests::{eventually, fast_config, generate_ids as generate, start_gateway};
use serde_json::{Value, json};
use sglang::hicache::{KeyLayout, page_hashes};
use sim::config::WritePolicy;
use sim::l3::L3Stats;
use sim::{self, SimConfig, SimHandle};

/// A worker whose prefix cache holds [`POOL_PAGES`] pages, with L3 on `master` writing
/// the pages it evicts (`write-back`).
async fn sim_with_store(master: &str) -> SimHandle {
    sim_writing(master, WritePolicy::WriteBack).await
}

/// [`sim_with_store`] with the write policy `policy`.
async fn sim_writing(master: &str, policy: WritePolicy) -> SimHandle {
    start(config(master, policy)).await
}

fn cached(answer: &Value) -> u64 {
    answer["meta_info"]["cached_tokens"].as_u64().unwrap()
}

fn store_stats(sim: &SimHandle) -> L3Stats {
    sim.l3().expect("the worker has L3").stats()
}

/// 32 tokens (8 full pages) of their own for each `seed`.
fn prompt(seed: u32) -> Vec<u32> {
    (0..32).map(|i| 1000 * seed + i).collect()
}

/// A gateway hosting the KV master, with no workers yet.
async fn gateway() -> Gateway {
    start_gateway(gateway::config::ServeConfig {
        policy: PolicyKind::KvAware,
        ..fast_config()
    })
    .await
}

/// Fills worker `sim` with `p`, then with another prompt, so that `p`'s pages are evicted
/// and written to the store.
async fn spill(c: &reqwest::Client, sim: &SimHandle, p: &[u32], other: &[u32]) {
    assert_eq!(cached(&generate(c, &sim.url(), p).await), 0);
    let before = store_stats(sim).written_pages;
    generate(c, &sim.url(), other).await;
    eventually("the evicted pages are written to the store", || {
        store_stats(sim).written_pages >= before + 8
    })
    .await;
}

#[tokio::test]
async fn evicted_pages_come_back_from_the_store_on_any_worker() {
    let gw = gateway().await;
    let master = gw.master().expect("the gateway hosts the master").clone();
    let (a, b) = (
        sim_with_store(&gw.url()).await,
        sim_with_store(&gw.url()).await,
    );
    let c = reqwest::Client::new();
    let p = prompt(1);
    spill(&c, &a, &p, &prompt(2)).await;

    // The pages are stored under HiCache's Mooncake names: K and V of TP rank 0.
    let hashes = page_hashes(&p, PAGE, None);
    for key in KeyLayout::mha(0).keys_of(&hashes) {
        assert!(master.readable(&key), "{key} is in the store");
    }

    // Worker B never saw the prompt: it loads all 8 pages (and computes the tail).
    let mut q = p.clone();
    q.extend([5, 5]);
    let r = generate(&c, &b.url(), &q).await;
    assert_eq!(cached(&r), 32, "{r}");
    // SGLang's breakdown says where they came from.
    let details = &r["meta_info"]["cached_tokens_details"];
    assert_eq!(
        (&details["device"], &details["storage"]),
        (&0.into(), &32.into()),
        "{r}"
    );
    assert_eq!(details["storage_backend"], "MooncakeStore");
    let s = store_stats(&b);
    assert_eq!((s.lookups, s.loaded_pages, s.load_failures), (1, 8, 0));
    assert_eq!(s.loaded_bytes, 8 * (PAGE as u64) * 128);
    // Now in B's GPU cache: no second load.
    let r = generate(&c, &b.url(), &q).await;
    assert_eq!(cached(&r), 32);
    let details = &r["meta_info"]["cached_tokens_details"];
    assert_eq!(
        (&details["device"], &details["storage"]),
        (&32.into(), &0.into()),
        "{r}"
    );
    assert_eq!(store_stats(&b).loaded_pages, 8);

    // A evicted it, and loads it back too.
    assert_eq!(cached(&generate(&c, &a.url(), &p).await), 32);
    assert_eq!(store_stats(&a).loaded_pages, 8);

    // A page another worker already wrote is not written again.
    spill(&c, &b, &prompt(3), &prompt(4)).await;
    generate(&c, &b.url(), &p).await;
    generate(&c, &b.url(), &prompt(5)).await;
    eventually("the pages the store holds are counted, not written", || {
        store_stats(&b).present_pages >= 8
    })
    .await;
    assert_eq!(store_stats(&b).write_failures, 0);
    a.shutdown().await;
    b.shutdown().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn pages_the_store_evicts_come_back_from_a_workers_disk_tier() {
    let gw = gateway().await;
    let master = gw.master().expect("the gateway hosts the master").clone();
    let dir = tempfile::tempdir().unwrap();
    let a = start(SimConfig {
        kv_store_disk_path: Some(dir.path().join("disk")),
        kv_store_disk_capacity: 1 << 20,
        ..config(&gw.url(), WritePolicy::WriteBack)
    })
    .await;
    let c = reqwest::Client::new();
    let p = prompt(15);
    spill(&c, &a, &p, &prompt(16)).await;
    // The store evicts everything: written to A's disk instead of being lost.
    let evicted = master.evict(u64::MAX, u64::MAX);
    assert_eq!(evicted.offloaded_objects, evicted.evicted_objects);
    assert!(evicted.offloaded_objects >= 16, "{evicted:?}");
    eventually("the evicted pages are on A's disk", || {
        master.tier_stats().on_disk_objects >= 16
    })
    .await;
    // A's GPU cache no longer holds the prompt: it reads its pages from its own disk.
    let body = json!({"input_ids": p, "sampling_params": {"max_new_tokens": 1}});
    eprintln!(
        "DEBUG {:?}",
        moongate_tests::send_json(&c, &format!("{}/generate", a.url()), &body).await
    );
    assert_eq!(cached(&generate(&c, &a.url(), &p).await), 32);
    assert_eq!(store_stats(&a).loaded_pages, 8);
    // B, without a disk, has them read back from A's disk into A's memory, and loads them.
    let b = sim_with_store(&gw.url()).await;
    let mut q = p.clone();
    q.extend([5, 5]);
    assert_eq!(cached(&generate(&c, &b.url(), &q).await), 32);
    let s = store_stats(&b);
    assert_eq!((s.loaded_pages, s.load_failures), (8, 0));
    assert!(master.tier_stats().loads >= 16);
    a.shutdown().await;
    b.shutdown().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn write_through_stores_each_page_computed_and_not_the_ones_loaded() {
    let gw = gateway().await;
    let master = gw.master().expect("the gateway hosts the master").clone();
    let (a, b) = (
        sim_writing(&gw.url(), WritePolicy::WriteThrough).await,
        sim_writing(&gw.url(), WritePolicy::WriteThrough).await,
    );
    let c = reqwest::Client::new();
    let p = prompt(21);
    // Nothing is evicted: A writes the 8 pages it computed all the same.
    assert_eq!(cached(&generate(&c, &a.url(), &p).await), 0);
    eventually("the computed pages are written", || {
        store_stats(&a).written_pages == 8
    })
    .await;
    let keys = KeyLayout::mha(0).keys_of(&page_hashes(&p, PAGE, None));
    assert!(keys.iter().all(|k| master.readable(k)));
    // B loads them, computes the 2 tokens of the tail (no full page), writes nothing.
    let mut q = p.clone();
    q.extend([5, 5]);
    assert_eq!(cached(&generate(&c, &b.url(), &q).await), 32);
    let s = store_stats(&b);
    assert_eq!(
        (s.loaded_pages, s.written_pages, s.present_pages),
        (8, 0, 0)
    );
    a.shutdown().await;
    b.shutdown().await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_page_with_the_wrong_bytes_is_computed_not_loaded() {
    let gw = gateway().await;
    let (a, b) = (
        sim_with_store(&gw.url()).await,
        sim_with_store(&gw.url()).await,
    );
    let c = reqwest::Client::new();
    let p = prompt(7);
    spill(&c, &a, &p, &prompt(8)).await;
    // Someone holding the store key replaces the first page's V with other bytes.
    let rogue = StoreClient::connect(ClientConfig::local(&gw.url(), 0))
        .await
        .unwrap();
    let first = KeyLayout::mha(0).keys_of(&page_hashes(&p[..PAGE], PAGE, None));
    rogue.remove(&first[1], true).await.unwrap();
    rogue.put(&first[1], &[0u8; PAGE * 64]).await.unwrap();

    let r = generate(&c, &b.url(), &p).await;
    assert_eq!(cached(&r), 0, "nothing after a bad first page is used: {r}");
    let s = store_stats(&b);
    assert_eq!((s.loaded_pages, s.load_failures), (0, 1));
    rogue.close().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
    gw.shutdown().await;
}

fn workers(gw: &Gateway) -> Vec<Arc<Worker>> {
    gw.state().registry().snapshot().iter().cloned().collect()
}

#[tokio::test]
async fn kv_aware_counts_the_pages_in_the_hosted_store() {
    let gw = gateway().await;
    let (a, b) = (
        sim_with_store(&gw.url()).await,
        sim_with_store(&gw.url()).await,
    );
    let c = reqwest::Client::new();
    moongate_tests::store_sims::register(&c, &gw, &[&a, &b]).await;
    let router = gw.state().router();
    let kv = router.policy().kv_aware().expect("kv_aware");
    eventually("both workers followed", || kv.followed() == 2).await;
    let ws = workers(&gw);
    let all: Vec<&Arc<Worker>> = ws.iter().collect();
    // A holds the first half of p in its GPU cache; the store holds all of it.
    let p = prompt(11);
    spill(&c, &a, &p, &prompt(12)).await;
    generate(&c, &a.url(), &p[..16]).await;
    generate(&c, &b.url(), &prompt(13)).await;
    let wa = ws
        .iter()
        .position(|w| w.url().as_str().starts_with(&a.url()))
        .unwrap();
    eventually("A's events and B's are in", || {
        ws.iter().all(|w| kv.has_events(w))
    })
    .await;
    // Each worker's prefix: its GPU pages, then the store's pages at 0.5 each.
    eventually("the store's pages are counted", || {
        let got = kv.cached_tokens(&all, &p);
        got[wa] == Some(16.0 + 0.5 * 16.0) && got[1 - wa] == Some(0.5 * 32.0)
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
    gw.shutdown().await;
}
