//! The store's object events across an HA failover, as users run them: a real etcd, two
//! `moongate master --ha` processes, two gateways hosting no master that follow the masters
//! (`moongate serve --disable-master --kv-l3-master-url <both>`), and a store client
//! writing pages under HiCache's names. Each gateway's view of the store
//! (`moongate_gateway_store_view_pages` on its `/metrics`) holds every page; the leader is
//! SIGKILLed, the gateways move to the new leader (a snapshot of what the journal kept),
//! and the pages written after the failover reach both views too.
//!
//! Needs the cargo feature `etcd` and the `etcd` binary, as `ha_master.rs`.

#![cfg(feature = "etcd")]

mod common;

use std::time::{Duration, Instant};

use common::Proc;
use common::etcd::Etcd;
use common::ha::{MasterProc, STORE_KEY, client, leader};
use kvclient::StoreClient;

/// The HiCache name of page `i` (64 hex digits, the first 16 its block hash, then `_0_k`).
fn page(i: u64) -> String {
    format!(
        "{:016x}{:048x}_0_k",
        (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        i
    )
}

/// A gateway following `masters`, hosting none.
fn gateway(masters: &str) -> Proc {
    Proc::start(common::serve_no_master().args([
        "--kv-l3-master-url",
        masters,
        "--store-api-key",
        STORE_KEY,
        "--policy",
        "kv_aware",
    ]))
}

/// A series of the gateway's `/metrics` (0 when absent).
async fn series(gw: &Proc, name: &str) -> f64 {
    let Ok(r) = reqwest::get(format!("{}/metrics", gw.base)).await else {
        return 0.0;
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits (up to 30 s) until every gateway's view holds `n` pages.
async fn views_hold(gws: &[&Proc], n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for gw in gws {
        loop {
            let pages = series(gw, "moongate_gateway_store_view_pages").await;
            if pages == n as f64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: its view holds {pages} pages, not {n}",
                gw.base
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn put_pages(c: &StoreClient, range: std::ops::Range<u64>) {
    for i in range {
        let deadline = Instant::now() + Duration::from_secs(20);
        // A failover may be under way: a put that fails is made again.
        while let Err(e) = c.put(&page(i), &[i as u8; 256]).await {
            assert!(Instant::now() < deadline, "put {i}: {e}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_gateway_sees_the_store_through_a_failover() {
    let etcd = Etcd::start();
    let logs = tempfile::tempdir().unwrap();
    let mut masters: Vec<MasterProc> = (0..2)
        .map(|n| MasterProc::start(&etcd.url(), "events", logs.path(), n))
        .collect();
    let (old, _) = leader(&masters).await;
    let urls: Vec<String> = masters.iter().map(MasterProc::url).collect();
    let (a, b) = (gateway(&urls.join(",")), gateway(&urls.join(",")));
    let c = client(&masters).await;

    put_pages(&c, 0..40).await;
    views_hold(&[&a, &b], 40).await;

    masters[old].kill9();
    let (new, _) = leader(&masters).await;
    assert_ne!(new, old);
    put_pages(&c, 40..80).await;
    views_hold(&[&a, &b], 80).await;
    for gw in [&a, &b] {
        let snapshots = series(gw, "moongate_gateway_store_snapshots_total").await;
        assert!(snapshots >= 2.0, "{}: {snapshots} snapshots", gw.base);
    }
    let _ = c.close().await;
    a.terminate();
    b.terminate();
}
