//! Store hits for every gateway: a second gateway that hosts no master follows the first's
//! master through its object events (`GET /api/v1/events`, with the store key) and counts
//! the pages of the store as the gateway hosting the master does; and the hosted master's
//! pages published on ZMQ in SGLang's KV-event format, as Mooncake's `--enable_kv_events`.

use std::sync::Arc;

use gateway::config::{PolicyKind, ServeConfig};
use gateway::launch::Gateway;
use gateway::select::kv_aware::store::KeyFormat;
use gateway::workers::Worker;
use moongate_tests::store_sims;
use moongate_tests::{eventually, fast_config, generate_ids as generate, get_json, start_gateway};
use sglang::kv_events::subscribe::{self, EventSink, Source};
use sglang::kv_events::wire::{EventBatch, KvEvent};
use sim::SimHandle;
use sim::config::WritePolicy;
use sim::l3::L3Stats;

/// A worker whose cache holds [`store_sims::POOL_PAGES`] pages, writing those it evicts
/// to `master`.
async fn sim_with_store(master: &str) -> SimHandle {
    store_sims::start_sim(store_sims::store_sim(master, WritePolicy::WriteBack)).await
}

fn cached(answer: &serde_json::Value) -> u64 {
    answer["meta_info"]["cached_tokens"].as_u64().unwrap()
}

fn store_stats(sim: &SimHandle) -> L3Stats {
    sim.l3().expect("the worker has L3").stats()
}

/// 32 tokens (8 full pages) of their own for each `seed`.
fn prompt(seed: u32) -> Vec<u32> {
    (0..32).map(|i| 1000 * seed + i).collect()
}

fn workers(gw: &Gateway) -> Vec<Arc<Worker>> {
    let mut ws: Vec<_> = gw.state().registry().snapshot().iter().cloned().collect();
    ws.sort_by(|a, b| a.url().as_str().cmp(b.url().as_str()));
    ws
}

#[tokio::test]
async fn a_gateway_without_the_master_counts_the_store_through_its_events() {
    let kv_aware = || ServeConfig {
        policy: PolicyKind::KvAware,
        ..fast_config()
    };
    let hosting = start_gateway(kv_aware()).await;
    let follower = start_gateway(ServeConfig {
        disable_master: true,
        kv_l3_master_url: Some(hosting.url()),
        ..kv_aware()
    })
    .await;
    assert!(follower.master().is_none());
    let (a, b) = (
        sim_with_store(&hosting.url()).await,
        sim_with_store(&hosting.url()).await,
    );
    let c = reqwest::Client::new();
    for gw in [&hosting, &follower] {
        store_sims::register(&c, gw, &[&a, &b]).await;
        let router = gw.state().router();
        let kv = router.policy().kv_aware().expect("kv_aware");
        eventually("both workers followed", || kv.followed() == 2).await;
    }
    // A computed all of p and evicted it to the store; then it computes p's first half
    // again. B holds other pages.
    let p = prompt(11);
    assert_eq!(cached(&generate(&c, &a.url(), &p).await), 0);
    generate(&c, &a.url(), &prompt(12)).await;
    eventually("p's pages are written to the store", || {
        store_stats(&a).written_pages >= 8
    })
    .await;
    generate(&c, &a.url(), &p[..16]).await;
    generate(&c, &b.url(), &prompt(13)).await;

    // Both gateways see A's 4 device pages and the store's 4 after them, B's 8 in the
    // store (0.5 each).
    let want = |gw: &Gateway| {
        let ws = workers(gw);
        let router = gw.state().router();
        let kv = router.policy().kv_aware().expect("kv_aware");
        let all: Vec<&Arc<Worker>> = ws.iter().collect();
        let ia = ws
            .iter()
            .position(|w| w.url().as_str().starts_with(&a.url()))
            .unwrap();
        let got = kv.cached_tokens(&all, &p);
        got[ia] == Some(16.0 + 0.5 * 16.0) && got[1 - ia] == Some(0.5 * 32.0)
    };
    eventually("the hosting gateway counts the store", || want(&hosting)).await;
    eventually("the following gateway counts the store", || want(&follower)).await;

    // Routed through the follower, p goes where the store and the device pages say: A,
    // which loads the 4 pages it no longer holds.
    let before = (
        store_stats(&a).lookups,
        store_stats(&b).lookups,
        store_stats(&a).loaded_pages,
    );
    let mut q = p.clone();
    q.extend([7, 7]);
    assert_eq!(cached(&generate(&c, &follower.url(), &q).await), 32);
    assert_eq!(store_stats(&a).lookups, before.0 + 1, "routed to A");
    assert_eq!(store_stats(&b).lookups, before.1);
    assert_eq!(store_stats(&a).loaded_pages, before.2 + 4);

    // Removals reach the follower too: its view is the master's pages, before and after
    // an admin empties the store (values still leased by a load stay).
    let master = hosting.master().unwrap().clone();
    let view = follower
        .state()
        .store()
        .and_then(|s| s.view())
        .expect("the follower keeps a view");
    let keys = KeyFormat::new("{hash}_0_k");
    // The master's pages; whether the view holds exactly them.
    let pages = || {
        master
            .held_all()
            .1
            .iter()
            .filter_map(|(k, _)| keys.block_hash_of(k))
            .collect::<Vec<_>>()
    };
    let same = || {
        let p = pages();
        view.len() == p.len() && p.iter().all(|h| view.held(*h).is_some())
    };
    let held = pages().len();
    assert!(held >= 8);
    eventually("the view is the store's pages", same).await;
    let seen = master.events_next().unwrap();
    assert!(master.remove_all() > 0);
    assert!(pages().len() < held);
    eventually("the view follows the removals", same).await;
    assert!(master.events_next().unwrap() > seen);
    // The console says so: the gateway follows the master, with its view.
    let cluster = get_json(&c, &format!("{}/cluster", follower.url())).await;
    assert_eq!(cluster["master"]["role"], "follows", "{cluster}");
    assert_eq!(cluster["master"]["leader_url"], hosting.url());
    assert!(cluster["master"]["view"]["snapshots"].as_u64() >= Some(1));
    assert!(cluster["master"]["view"]["events"].as_u64() >= Some(held as u64));
    a.shutdown().await;
    b.shutdown().await;
    follower.shutdown().await;
    hosting.shutdown().await;
}

/// What a ZMQ subscriber of the store's KV events got.
#[derive(Default)]
struct Seen {
    events: parking_lot::Mutex<Vec<KvEvent>>,
    up: std::sync::atomic::AtomicBool,
}

impl EventSink for Seen {
    fn apply(&self, batch: &EventBatch) {
        self.events.lock().extend(batch.events.iter().cloned());
    }
    fn resync(&self) {}
    fn connected(&self, up: bool) {
        self.up.store(up, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test]
async fn the_hosted_master_publishes_its_pages_as_sglang_kv_events_on_loopback() {
    let mut cfg = fast_config();
    cfg.master.kv_events_endpoint = Some("tcp://127.0.0.1:0".into());
    let gw = start_gateway(cfg).await;
    let endpoint = gw.kv_events_endpoint.clone().expect("published");
    assert!(endpoint.starts_with("tcp://127.0.0.1:"), "{endpoint}");
    let seen = Arc::new(Seen::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let src = Source {
        endpoint,
        replay_endpoint: None,
        topic: String::new(),
    };
    tokio::spawn(subscribe::run(src, seen.clone(), stop.clone()));
    eventually("subscribed", || {
        seen.up.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;

    let master = gw.master().unwrap().clone();
    let writer = kvmaster::master::ClientId::from_u128(7);
    master
        .mount_segment(
            writer,
            kvmaster::master::SegmentSpec {
                name: "seg".into(),
                base: 0x7f00_0000_0000,
                size: 1 << 20,
                endpoint: "te-seg".into(),
                disk_bytes: 0,
                disk_write_through: false,
            },
        )
        .unwrap();
    let keys = KeyFormat::new("{hash}_0_k");
    let page = |n: u8| {
        let mut k = String::new();
        keys.write(&[n; 32], &mut k);
        k
    };
    let put = |key: &str| {
        master
            .put_start(writer, key, 64, &Default::default())
            .unwrap();
        master.put_end(writer, key).unwrap();
    };
    // The subscription takes a moment to reach the publisher: pages put until one is seen.
    let stored = |n: u8| KvEvent::BlockStored {
        block_hashes: vec![keys.block_hash_of(&page(n)).unwrap()],
        parent_block_hash: None,
        token_ids: vec![],
        block_size: 0,
        lora_id: None,
        medium: Some("cpu".into()),
    };
    let mut n = 0u8;
    let mut found = false;
    for _ in 0..100 {
        n += 1;
        put(&page(n));
        put("not-a-page");
        master.remove("not-a-page", true).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        if seen.events.lock().contains(&stored(n)) {
            found = true;
            break;
        }
    }
    assert!(found, "a stored page was published");
    master.remove(&page(n), true).unwrap();
    let removed = KvEvent::BlockRemoved {
        block_hashes: vec![keys.block_hash_of(&page(n)).unwrap()],
        medium: Some("cpu".into()),
    };
    eventually("the removal is published", || {
        seen.events.lock().contains(&removed)
    })
    .await;
    // Keys of another shape are not pages: every event names one of the pages put.
    let hashes: Vec<i64> = (1..=n)
        .map(|i| keys.block_hash_of(&page(i)).unwrap())
        .collect();
    for e in seen.events.lock().iter() {
        match e {
            KvEvent::BlockStored { block_hashes, .. }
            | KvEvent::BlockRemoved { block_hashes, .. } => {
                assert!(block_hashes.iter().all(|h| hashes.contains(h)), "{e:?}")
            }
            KvEvent::AllBlocksCleared => {}
        }
    }
    stop.cancel();
    gw.shutdown().await;
}
