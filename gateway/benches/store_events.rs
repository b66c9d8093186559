//! The store's object events, from the master to a gateway that follows them:
//! `cargo bench -p gateway --bench store_events`.
//!
//! Criterion groups (one core each):
//! - `master`: what the master spends per event: its feed read (`events_since`) and the
//!   JSON answer of `GET /api/v1/events`, 65 536 events a call.
//! - `gateway`: what a following gateway spends per event: the answer decoded and applied
//!   to its view of 1 M pages. Reference in the same run: 65 536 `HashMap` inserts.
//!
//! Then, printed, over real HTTP on loopback (a master's REST API on a socket, a
//! gateway's follower task long-polling it):
//! - put to view: a put made visible in the follower's view, one at a time (p50, p99,
//!   max). Target: p99 within 50 ms.
//! - burst: 1 M puts as fast as one thread makes them on a master without a feed and with
//!   one nobody follows (what the feed costs a put); then followed, with the time until
//!   the follower's view holds every page; then 1 M removals at once (faster than puts
//!   can be made), and the events the follower applied per second. Target: >= 1 M events
//!   a second applied.

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use gateway::client::HttpClient;
use gateway::select::kv_aware::follow::FollowedStore;
use gateway::select::kv_aware::store::{KeyFormat, StoreView};
use kvmaster::master::{ClientId, ReplicateConfig, Since};
use kvmaster::{Master, MasterConfig};
use openapi::master::{HeldTier, ObjectEvent, StoreEvents};

const BATCH: usize = 65_536;

fn master(events_buffer: usize) -> Arc<Master> {
    common::master(MasterConfig {
        events_buffer,
        ..MasterConfig::default()
    })
}

fn page_key(keys: &KeyFormat, i: u64) -> String {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
    d[8..16].copy_from_slice(&i.to_le_bytes());
    let mut k = String::new();
    keys.write(&d, &mut k);
    k
}

fn put(m: &Master, key: &str) {
    let owner = ClientId::from_u128(1);
    m.put_start(owner, key, 64, &ReplicateConfig::default())
        .expect("put_start");
    m.put_end(owner, key).expect("put_end");
}

fn wire(events: Vec<kvmaster::master::ObjectEvent>) -> StoreEvents {
    StoreEvents {
        epoch: 1,
        snapshot: false,
        resume: None,
        first: 0,
        next: events.len() as u64,
        events: events
            .into_iter()
            .map(|e| ObjectEvent {
                key: e.key.into_string(),
                held: e.held.map(|_| HeldTier::Memory),
            })
            .collect(),
    }
}

fn criterion_groups(c: &mut Criterion) {
    let keys = KeyFormat::new("{hash}_0_k");
    let m = master(BATCH);
    for i in 0..BATCH as u64 {
        put(&m, &page_key(&keys, i));
    }
    let mut g = c.benchmark_group("master");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("feed_read_and_json_65536_events", |b| {
        b.iter(|| {
            let Since::Events { events, .. } = m.events_since(0, BATCH) else {
                panic!("kept")
            };
            black_box(serde_json::to_vec(&wire(events)).expect("json"))
        })
    });
    g.finish();

    let Since::Events { events, .. } = m.events_since(0, BATCH) else {
        panic!("kept")
    };
    let body = serde_json::to_vec(&wire(events)).expect("json");
    let view = StoreView::default();
    let million: Vec<ObjectEvent> = (BATCH as u64..1_000_000)
        .map(|i| ObjectEvent {
            key: page_key(&keys, i),
            held: Some(HeldTier::Memory),
        })
        .collect();
    view.replace(&keys, &million);
    let mut g = c.benchmark_group("gateway");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("decode_and_apply_65536_events_1m_view", |b| {
        b.iter(|| {
            let ev: StoreEvents = serde_json::from_slice(&body).expect("decode");
            view.apply(&keys, &ev.events);
        })
    });
    g.bench_function("reference_65536_hashmap_inserts", |b| {
        let mut map = std::collections::HashMap::<i64, u8>::with_capacity(1 << 21);
        b.iter(|| {
            for i in 0..BATCH as i64 {
                map.insert(black_box(i.wrapping_mul(0x9e37_79b9)), 1);
            }
        })
    });
    g.finish();
}

/// A master's REST API on a loopback socket and a follower of it.
async fn served(m: Arc<Master>) -> (Arc<StoreView>, tokio_util::sync::CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let app: axum::Router = kvmaster::router(m).into();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let store = Arc::new(FollowedStore::new(None, Some(url)));
    let view = store.view().clone();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(store.run(
        HttpClient::new(),
        KeyFormat::new("{hash}_0_k"),
        trust::Secret::new("unchecked"),
        stop.clone(),
    ));
    (view, stop)
}

async fn until(mut cond: impl FnMut() -> bool, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while !cond() {
        if Instant::now() > end {
            return false;
        }
        tokio::task::yield_now().await;
    }
    true
}

async fn put_to_view() {
    let keys = KeyFormat::new("{hash}_0_k");
    let m = master(65_536);
    let (view, stop) = served(m.clone()).await;
    put(&m, &page_key(&keys, u64::MAX));
    assert!(
        until(|| view.len() == 1, Duration::from_secs(10)).await,
        "following"
    );
    let mut lat = Vec::with_capacity(2000);
    for i in 0..2000u64 {
        let key = page_key(&keys, i);
        let h = keys.block_hash_of(&key).expect("a page");
        let t = Instant::now();
        put(&m, &key);
        assert!(until(|| view.held(h).is_some(), Duration::from_secs(10)).await);
        lat.push(t.elapsed());
    }
    lat.sort();
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!(
        "put to view, 2000 puts one at a time: p50 {:?} p99 {:?} max {:?} (target p99 <= 50 ms)",
        at(0.5),
        at(0.99),
        lat[lat.len() - 1]
    );
    stop.cancel();
}

/// Makes `n` puts on a thread of its own; answers how long they took.
fn burst(m: Arc<Master>, n: u64) -> std::thread::JoinHandle<Duration> {
    let keys = KeyFormat::new("{hash}_0_k");
    let names: Vec<String> = (0..n).map(|i| page_key(&keys, 1 << 40 | i)).collect();
    std::thread::spawn(move || {
        let t = Instant::now();
        for k in &names {
            put(&m, k);
        }
        t.elapsed()
    })
}

async fn bursts() {
    const N: u64 = 1_000_000;
    let rate = |d: Duration| N as f64 / d.as_secs_f64() / 1e6;
    let alone = |buffer: usize| async move {
        let m = master(buffer);
        tokio::task::spawn_blocking(move || burst(m, N).join().expect("puts"))
            .await
            .expect("join")
    };
    let (bare, unfollowed) = (alone(0).await, alone(65_536).await);
    println!(
        "burst of {N} puts, one thread: {:.2} M puts/s without a feed, {:.2} M/s with one \
         nobody follows (ratio {:.2})",
        rate(bare),
        rate(unfollowed),
        bare.as_secs_f64() / unfollowed.as_secs_f64()
    );
    let m = master(65_536);
    let (view, stop) = served(m.clone()).await;
    let t = Instant::now();
    let writer = burst(m.clone(), N);
    let all = until(|| view.len() as u64 == N, Duration::from_secs(120)).await;
    let applied = t.elapsed();
    let puts = tokio::task::spawn_blocking(move || writer.join().expect("puts"))
        .await
        .expect("join");
    println!(
        "  followed over loopback HTTP: {:.2} M puts/s; every page in the follower's view \
         after {:.2} s ({:.2} M events/s){}",
        rate(puts),
        applied.as_secs_f64(),
        rate(applied),
        if all { "" } else { " (NOT ALL: timed out)" }
    );
    // Removals come faster than puts (one shard lock for all of a shard's keys): how fast
    // the follower applies events when the master is not the bound.
    let t = Instant::now();
    let removed = tokio::task::spawn_blocking({
        let m = m.clone();
        move || m.remove_all()
    })
    .await
    .expect("join");
    let made = t.elapsed();
    let all = until(|| view.is_empty(), Duration::from_secs(120)).await;
    let applied = t.elapsed();
    println!(
        "  {removed} removals made in {:.2} s, all applied by the follower after {:.2} s: \
         {:.2} M events/s applied (target >= 1 M){}",
        made.as_secs_f64(),
        applied.as_secs_f64(),
        removed as f64 / applied.as_secs_f64() / 1e6,
        if all { "" } else { " (NOT ALL: timed out)" }
    );
    stop.cancel();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    criterion_groups(&mut c);
    c.final_summary();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(put_to_view());
    rt.block_on(bursts());
}
