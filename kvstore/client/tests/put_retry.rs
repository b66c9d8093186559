//! A put-start whose answer is lost or late.
//!
//! Lost: a client of several masters (HA) that gets no answer in time sends the request on
//! to the next master; the first may have done it all the same. Here the first URL is a
//! front that hands every request to a real master and passes the answer back, except the
//! first put-start's, which it keeps: the client's retry reaches the same master, which
//! must recognise its own put (by its put id) and answer the same replicas, not
//! `OBJECT_ALREADY_EXISTS` for a value no one will finish.
//!
//! Late: an answer that arrives after the master's `write_within_ms` (a master that took
//! over since may give that space out again) must not be written: the put fails, is
//! revoked, and the key is free for the next put.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use kvclient::{ClientConfig, StoreClient};
use kvmaster::{MasterConfig, MasterServer};
use parking_lot::Mutex;

const MIB: u64 = 1 << 20;

/// What the front did with the put-start whose answer it kept: the real master's status.
#[derive(Default)]
struct Kept {
    status: Mutex<Option<u16>>,
}

/// A front of the master at `to`. The answer of the first put-start it forwards is kept
/// for `delay`, or for ever (`None`).
async fn front(to: String, delay: Option<Duration>) -> (String, Arc<Kept>) {
    let kept = Arc::new(Kept::default());
    let k = kept.clone();
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |req: Request<Body>| {
        let (k, http, to) = (k.clone(), http.clone(), to.clone());
        async move {
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let mut fwd = http.request(parts.method.clone(), format!("{to}{path}"));
            for (name, value) in &parts.headers {
                if name != "host" && name != "content-length" {
                    fwd = fwd.header(name, value);
                }
            }
            let answer = fwd.body(body).send().await.unwrap();
            let status = answer.status().as_u16();
            if path.ends_with("/put-start") {
                let first = {
                    let mut s = k.status.lock();
                    let first = s.is_none();
                    s.get_or_insert(status);
                    first
                };
                match delay {
                    // Done at the master; the answer comes back late, or never.
                    Some(d) if first => tokio::time::sleep(d).await,
                    None if first => std::future::pending::<()>().await,
                    _ => {}
                }
            }
            let bytes = answer.bytes().await.unwrap();
            Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", "application/json")
                .body(Body::from(bytes))
                .unwrap()
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (format!("http://{addr}"), kept)
}

/// A master on loopback and a storage node with a 64 MiB segment.
async fn master_and_node(config: MasterConfig) -> (MasterServer, StoreClient) {
    let m = MasterServer::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let node = StoreClient::connect(ClientConfig {
        local_buffer_size: 8 * MIB,
        ..ClientConfig::local(&m.url(), 64 * MIB)
    })
    .await
    .unwrap();
    (m, node)
}

/// A writer listing the front first and the master second (no segment of its own).
async fn writer(master: &MasterServer) -> (StoreClient, Arc<Kept>) {
    let (front, kept) = front(master.url(), None).await;
    let cfg = ClientConfig {
        // Each master gets half of it; far more than the front needs to forward.
        rpc_timeout_ms: 2000,
        local_buffer_size: 8 * MIB,
        ..ClientConfig::local(&format!("{front},{}", master.url()), 0)
    };
    (StoreClient::connect(cfg).await.unwrap(), kept)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_start_whose_answer_is_lost_is_sent_again_and_the_put_completes() {
    let (m, node) = master_and_node(MasterConfig::default()).await;

    let (c, kept) = writer(&m).await;
    let v = vec![7u8; 5000];
    c.put("single", &v).await.unwrap();
    assert_eq!(
        *kept.status.lock(),
        Some(200),
        "the kept put-start was done"
    );
    assert_eq!(c.get("single").await.unwrap().as_ref(), &v[..]);

    let (c, kept) = writer(&m).await;
    let items = [("b1", vec![1u8; 3000]), ("b2", vec![2u8; MIB as usize])];
    for r in c.batch_put(&items).await {
        r.unwrap();
    }
    assert_eq!(
        *kept.status.lock(),
        Some(200),
        "the kept batch put-start was done"
    );
    for (k, v) in &items {
        assert_eq!(c.get(k).await.unwrap().as_ref(), &v[..], "{k}");
    }
    assert_eq!(
        m.master().stats().keys,
        3,
        "one object each, none left unfinished"
    );
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_start_answered_after_its_write_window_writes_nothing_and_is_revoked() {
    // A write window of 100 ms (a tenth of the reservation TTL).
    let config = MasterConfig {
        reservation_ttl_ms: 1000,
        ..MasterConfig::default()
    };
    let (m, node) = master_and_node(config).await;
    let (front, kept) = front(m.url(), Some(Duration::from_millis(300))).await;
    let c = StoreClient::connect(ClientConfig {
        local_buffer_size: 8 * MIB,
        ..ClientConfig::local(&front, 0)
    })
    .await
    .unwrap();
    // Bytes held by objects (reservations the put-start brought aside).
    let held = || {
        let s = m.master().stats();
        s.allocated_bytes - s.reserved_bytes
    };
    let used = held();
    let e = c.put("late", &[9u8; 4096]).await.unwrap_err();
    assert_eq!(*kept.status.lock(), Some(200), "the master did start it");
    assert_eq!(e.name(), "RPC_FAIL", "{e}");
    assert!(e.to_string().contains("too late to write"), "{e}");
    assert!(e.is_retryable());
    // Revoked: its space is free and the key too; nothing of it is readable.
    assert_eq!(held(), used);
    assert_eq!(c.get("late").await.unwrap_err().name(), "OBJECT_NOT_FOUND");
    c.put("late", &[1u8; 4096]).await.unwrap();
    assert_eq!(c.get("late").await.unwrap().as_ref(), &[1u8; 4096][..]);
    node.close().await.unwrap();
}
