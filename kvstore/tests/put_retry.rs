//! A put-start whose answer is lost. A client of several masters (HA) that gets no answer
//! in time sends the request on to the next master; the first may have done it all the
//! same. Here the first URL is a front that hands every request to a real master and
//! passes the answer back, except the first put-start's, which it keeps: the client's
//! retry reaches the same master, which must recognise its own put (by its put id) and
//! answer the same replicas, not `OBJECT_ALREADY_EXISTS` for a value no one will finish.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use kvstore::{ClientConfig, MasterConfig, MasterServer, StoreClient};
use parking_lot::Mutex;

const MIB: u64 = 1 << 20;

/// What the front did with the put-start whose answer it kept: the real master's status.
#[derive(Default)]
struct Kept {
    status: Mutex<Option<u16>>,
}

/// A front of the master at `to`; keeps the answer of the first put-start it forwards.
async fn front(to: String) -> (String, Arc<Kept>) {
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
                if first {
                    // Done at the master; the answer never comes back.
                    std::future::pending::<()>().await;
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

/// A writer listing the front first and the master second (no segment of its own).
async fn writer(master: &MasterServer) -> (StoreClient, Arc<Kept>) {
    let (front, kept) = front(master.url()).await;
    let cfg = ClientConfig {
        // Each master gets half of it; far more than the front needs to forward.
        rpc_timeout_ms: 2000,
        local_buffer_size: 8 * MIB,
        ..ClientConfig::local(&format!("{front},{}", master.url()), 0)
    };
    (StoreClient::connect(cfg).await.unwrap(), kept)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_start_answered_too_late_is_sent_again_and_the_put_completes() {
    let m = MasterServer::start(MasterConfig::default(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let node = StoreClient::connect(ClientConfig {
        local_buffer_size: 8 * MIB,
        ..ClientConfig::local(&m.url(), 64 * MIB)
    })
    .await
    .unwrap();

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
