//! `node_health` (what the wheel's `setup_dummy` reads of a local store process) against
//! peers that are not storage nodes: one that sends an endless body, one that never
//! answers, one that answers something else. Each is a clear error, bounded in time and in
//! what is read.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A peer on 127.0.0.1 that reads a request, then runs `answer` on the connection.
async fn peer<F, Fut>(answer: F) -> String
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            answer(s).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_is_not_a_storage_node_is_a_bounded_clear_error() {
    // An endless body: refused past the read limit, not buffered whole.
    let endless = peer(|mut s| async move {
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            .await;
        let chunk = format!("{:x}\r\n{}\r\n", 1 << 16, "x".repeat(1 << 16));
        while s.write_all(chunk.as_bytes()).await.is_ok() {}
    })
    .await;
    let t = Instant::now();
    let e = kvclient::node::node_health(&endless, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5), "{e}");
    assert_eq!(e.name(), "RPC_FAIL", "{e}");

    // Silence: the timeout.
    let silent = peer(|s| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(s);
    })
    .await;
    let e = kvclient::node::node_health(&silent, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no answer within 300 ms"), "{e}");

    // Something else: not a node's health.
    let other = peer(|mut s| async move {
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            .await;
    })
    .await;
    let e = kvclient::node::node_health(&other, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a node's health"), "{e}");
    let e = kvclient::node::node_health("no port", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a host:port"), "{e}");
}
