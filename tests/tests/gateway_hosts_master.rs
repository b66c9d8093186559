//! The gateway's hosting API: another component's documented routes (here the KV master's
//! REST API) mounted behind the same front door and in the same OpenAPI document.

use std::sync::Arc;

use moongate_tests::{fast_config, get_json};

#[tokio::test]
async fn the_master_router_mounts_behind_the_front_door() {
    let master = Arc::new(kvmaster::Master::new(kvmaster::MasterConfig::default()).unwrap());
    let state = gateway::server::AppState::new(fast_config()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = gateway::launch::spawn_with(state, kvmaster::router(master), listener)
        .await
        .unwrap();
    let c = reqwest::Client::new();
    let base = gw.url();

    let doc = get_json(&c, &format!("{base}/openapi.json")).await;
    for p in [
        "/v1/chat/completions",
        "/workers",
        "/api/v1/stats",
        "/api/v1/segments",
    ] {
        assert!(
            doc["paths"][p].is_object(),
            "{p} missing from the merged document"
        );
    }
    let r = c
        .get(format!("{base}/api/v1/stats"))
        .header("x-request-id", "kv-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-request-id"],
        "kv-1",
        "the front door applies to mounted routes"
    );
    // The gateway's own routes and fallbacks are unchanged.
    assert_eq!(
        c.get(format!("{base}/liveness"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let missing = c
        .get(format!("{base}/api/v2/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    gw.shutdown().await;
}
