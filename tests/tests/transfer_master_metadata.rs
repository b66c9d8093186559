//! The transfer engine's HTTP metadata client against the KV master's real `/metadata`
//! routes: Mooncake's statuses, and two engines finding each other through the master.

use std::sync::Arc;
use std::time::Duration;

use transfer::metadata::segment_key;
use transfer::{EngineConfig, HttpMetadata, MetadataConfig, TransferEngine, TransferRequest};

async fn master() -> String {
    let master = Arc::new(kvmaster::Master::new(kvmaster::MasterConfig::default()).unwrap());
    let (app, _doc) = kvmaster::router(master).split_for_parts();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/metadata")
}

#[tokio::test]
async fn http_metadata_client_matches_the_master() {
    let url = master().await;
    let m = HttpMetadata::new(&url, Duration::from_secs(5)).unwrap();
    assert_eq!(
        m.get("mooncake/ram/x").await.unwrap(),
        None,
        "404 when absent"
    );
    m.put("mooncake/ram/x", b"{\"a\":1}\x00\xff".to_vec())
        .await
        .unwrap();
    assert_eq!(
        m.get("mooncake/ram/x").await.unwrap().unwrap(),
        b"{\"a\":1}\x00\xff",
        "exactly the bytes PUT"
    );
    assert!(
        m.delete("mooncake/ram/x").await.unwrap(),
        "200 when removed"
    );
    assert!(
        !m.delete("mooncake/ram/x").await.unwrap(),
        "404 when absent"
    );
}

#[tokio::test]
async fn engines_find_each_other_through_the_master() {
    let url = master().await;
    let cfg = EngineConfig {
        metadata: MetadataConfig::http(url.clone()),
        shm: false,
        ..EngineConfig::listening_on("127.0.0.1:0".parse().unwrap())
    };
    let node = TransferEngine::new(cfg.clone()).await.unwrap();
    let client = TransferEngine::new(cfg).await.unwrap();
    let pool = node.alloc(1 << 20).unwrap();
    node.publish().await.unwrap();
    let m = HttpMetadata::new(&url, Duration::from_secs(5)).unwrap();
    assert!(
        m.get(&segment_key(node.segment_name()))
            .await
            .unwrap()
            .is_some()
    );

    let value = client.alloc(1 << 20).unwrap();
    value.write_at(0, b"kv page").unwrap();
    let seg = client.open_segment(node.segment_name()).await.unwrap();
    client
        .transfer(TransferRequest::write(
            &value,
            0,
            &seg,
            pool.addr() + 100,
            7,
        ))
        .await
        .unwrap();
    assert_eq!(pool.to_vec(100, 7).unwrap(), b"kv page");

    node.shutdown().await;
    assert_eq!(
        m.get(&segment_key(node.segment_name())).await.unwrap(),
        None,
        "unpublished on shutdown"
    );
}
