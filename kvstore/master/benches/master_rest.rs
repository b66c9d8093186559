//! REST throughput of the master over loopback, keep-alive, one client issuing one request
//! at a time: `cargo bench -p kvstore --bench master_rest`.
//!
//! Measured side by side in one run, rounds interleaved so machine noise hits all alike:
//! - `noop`: a bare axum route on the same server (the HTTP floor of this machine),
//! - `get_replicas`: `GET /api/v1/objects/{key}/replicas`, one key per request,
//! - `batch64`: `POST /api/v1/batch/replicas` with 64 keys per request (keys/s).
//!
//! Env: `MG_BENCH_SECS` (seconds per round, default 3), `MG_BENCH_ROUNDS` (default 3),
//! `MG_BENCH_PORT` (default 0: any free port), `MG_BENCH_KEYS` (default 100 000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;

mod common;

use common::key;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Sends the requests `make(n)` builds back to back on `conn` for `secs`; every answer
/// must be 200. Returns requests per second.
async fn rate(
    secs: u64,
    conn: &mut SendRequest<Full<Bytes>>,
    mut make: impl FnMut(u64) -> (&'static str, String, Bytes),
) -> f64 {
    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let mut n = 0u64;
    while Instant::now() < until {
        let (method, path, body) = make(n);
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "127.0.0.1")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .unwrap();
        let resp = conn.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let secs = env("MG_BENCH_SECS", 3);
    let rounds = env("MG_BENCH_ROUNDS", 3);
    let keys = env("MG_BENCH_KEYS", 100_000);
    let port = env("MG_BENCH_PORT", 0) as u16;
    let master = Arc::new(common::populated(keys, 4, 16 << 30).0);

    // The server: one worker thread, like a master on one core.
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let addr = server.block_on(async {
        let app: axum::Router = kvmaster::router(master.clone()).into();
        let app = app.route("/bench/noop", axum::routing::get(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    });

    // The client: one HTTP/1.1 connection, kept alive, one request at a time, on hyper's
    // bare connection API so the load generator costs as little CPU as possible.
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client.block_on(async move {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (mut conn, driver) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(driver);
        let mut noop = Vec::new();
        let mut single = Vec::new();
        let mut batch = Vec::new();
        for round in 0..rounds {
            noop.push(rate(secs, &mut conn, |_| ("GET", "/bench/noop".to_string(), Bytes::new())).await);
            single.push(
                rate(secs, &mut conn, |n| {
                    let path = format!("/api/v1/objects/{}/replicas", key((n * 7919) % keys));
                    ("GET", path, Bytes::new())
                })
                .await,
            );
            let r = rate(secs, &mut conn, |n| {
                let ks: Vec<String> = (0..64).map(|j| key((n * 64 + j) * 7919 % keys)).collect();
                let body = serde_json::to_vec(&serde_json::json!({ "keys": ks })).unwrap();
                ("POST", "/api/v1/batch/replicas".to_string(), Bytes::from(body))
            })
            .await;
            batch.push(r * 64.0);
            println!(
                "round {round}: noop {:.0} req/s | get_replicas {:.0} req/s | batch64 {:.0} keys/s ({:.0} req/s)",
                noop[round as usize], single[round as usize], r * 64.0, r
            );
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        let (n, s, b) = (median(&mut noop), median(&mut single), median(&mut batch));
        println!("master_rest (median of {rounds} x {secs}s, {keys} keys, loopback, keep-alive, 1 client):");
        println!("  noop route (HTTP floor)     {n:>10.0} req/s");
        println!("  get_replicas, 1 key/req     {s:>10.0} req/s  ({:.0}% of the floor)", 100.0 * s / n);
        println!("  batch replicas, 64 keys/req {b:>10.0} keys/s ({:.1}x the single-key rate)", b / s);
    });
    drop(server);
}
