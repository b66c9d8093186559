//! The HTTP metadata client against a real HTTP server with Mooncake's semantics (as the KV
//! master serves them), and engines finding each other through it.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode};
use axum::routing::any;
use common::*;
use parking_lot::Mutex;
use transfer::metadata::segment_key;
use transfer::{EngineConfig, HttpMetadata, MetadataConfig, TransferEngine, TransferError};

type Store = Arc<Mutex<HashMap<String, Vec<u8>>>>;

/// Mooncake's `/metadata` handler: GET 200 body / 404, PUT 200, DELETE 200 / 404, no key 400.
async fn metadata(
    State(store): State<Store>,
    method: Method,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    let Some(key) = q.get("key").filter(|k| !k.is_empty()) else {
        return (
            StatusCode::BAD_REQUEST,
            b"metadata key is required".to_vec(),
        );
    };
    let mut map = store.lock();
    match method {
        Method::GET => match map.get(key) {
            Some(v) => (StatusCode::OK, v.clone()),
            None => (StatusCode::NOT_FOUND, b"metadata not found".to_vec()),
        },
        Method::PUT => {
            map.insert(key.clone(), body.to_vec());
            (StatusCode::OK, b"metadata updated".to_vec())
        }
        Method::DELETE => match map.remove(key) {
            Some(_) => (StatusCode::OK, b"metadata deleted".to_vec()),
            None => (StatusCode::NOT_FOUND, b"metadata not found".to_vec()),
        },
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            b"Method not allowed".to_vec(),
        ),
    }
}

async fn server() -> (String, Store) {
    let store: Store = Arc::default();
    let app = Router::new()
        .route("/metadata", any(metadata))
        .with_state(store.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/metadata"), store)
}

#[tokio::test]
async fn http_client_follows_mooncake_semantics() {
    let (url, store) = server().await;
    let m = HttpMetadata::new(&url, Duration::from_secs(5)).unwrap();
    assert_eq!(m.get("a/b c&d").await.unwrap(), None);
    m.put("a/b c&d", b"\x00\x01binary\xff".to_vec())
        .await
        .unwrap();
    assert_eq!(
        store.lock().get("a/b c&d").unwrap(),
        b"\x00\x01binary\xff",
        "the key is sent encoded and decoded intact"
    );
    assert_eq!(
        m.get("a/b c&d").await.unwrap().unwrap(),
        b"\x00\x01binary\xff"
    );
    m.put("a/b c&d", b"v2".to_vec()).await.unwrap();
    assert_eq!(m.get("a/b c&d").await.unwrap().unwrap(), b"v2");
    assert!(m.delete("a/b c&d").await.unwrap());
    assert!(
        !m.delete("a/b c&d").await.unwrap(),
        "404 on delete of an absent key"
    );
    assert_eq!(m.get("a/b c&d").await.unwrap(), None);
    // A server error surfaces as a typed metadata error with the status.
    let err = m.get("").await.unwrap_err();
    assert!(
        matches!(&err, TransferError::Metadata { reason, .. } if reason.contains("400")),
        "{err}"
    );
    // Configuration errors and an unreachable server.
    assert!(HttpMetadata::new("ftp://x/metadata", Duration::from_secs(1)).is_err());
    assert!(HttpMetadata::new("not a url", Duration::from_secs(1)).is_err());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = HttpMetadata::new(
        &format!("http://127.0.0.1:{port}/metadata"),
        Duration::from_secs(2),
    )
    .unwrap();
    assert!(matches!(
        dead.get("k").await,
        Err(TransferError::Metadata { .. })
    ));
}

#[tokio::test]
async fn engines_find_each_other_through_http_metadata_and_unpublish_on_shutdown() {
    let (url, store) = server().await;
    let cfg = EngineConfig {
        metadata: MetadataConfig::http(url.clone()),
        ..config(false)
    };
    let target = TransferEngine::new(cfg.clone()).await.unwrap();
    let initiator = TransferEngine::new(cfg).await.unwrap();
    let key = segment_key(target.segment_name());
    assert!(store.lock().contains_key(&key), "published at start");
    let remote = target.alloc(1 << 16).unwrap();
    target.publish().await.unwrap();
    let local = initiator.alloc(1 << 16).unwrap();
    fill(&local, 11);
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    write_checked(&initiator, &local, 0, &seg, &remote, 0, 1 << 16).await;

    // A region registered later is found after the background republish (the initiator
    // refreshes the descriptor once when a range is not in it).
    let later = target.alloc(4096).unwrap();
    for _ in 0..100 {
        if store
            .lock()
            .get(&key)
            .is_some_and(|v| String::from_utf8_lossy(v).contains(&later.addr().to_string()))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    write_checked(&initiator, &local, 0, &seg, &later, 0, 4096).await;

    target.shutdown().await;
    assert!(!store.lock().contains_key(&key), "removed on shutdown");
    assert!(matches!(
        initiator.open_segment("nobody:9").await,
        Err(TransferError::UnknownSegment { .. })
    ));
}

#[tokio::test]
async fn engine_start_fails_cleanly_when_the_metadata_server_is_down() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = EngineConfig {
        metadata: MetadataConfig::http(format!("http://127.0.0.1:{port}/metadata")),
        request_timeout: Duration::from_secs(2),
        ..config(false)
    };
    let err = TransferEngine::new(cfg).await.unwrap_err();
    assert!(
        matches!(
            err,
            TransferError::Metadata {
                operation: "publish",
                ..
            }
        ),
        "{err}"
    );
}
