//! `moongate serve` hosting the KV master, `moongate master` alone, the admin key, and the
//! OpenAPI document and Swagger UI they serve, over real sockets on 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use gateway::config::{MasterHostConfig, Secret, ServeConfig};
use gateway::master::MasterProcess;
use http::Method;
use kvclient::{ClientConfig, StoreClient};
use kvmaster::MasterConfig;
use moongate_tests::{
    call, check_planes, committed_openapi, eventually, fast_config, first_difference, get_json,
    get_text, operations, start_gateway,
};
use serde_json::{Value, json};

const KEY: &str = "admin-K3y_for.tests";
const STORE: &str = "st0re-K3y_for.tests";

/// The admin key and an explicit store key.
fn keyed(mut cfg: ServeConfig) -> ServeConfig {
    cfg.admin_api_key = Some(Secret::new(KEY));
    cfg.store_api_key = Some(Secret::new(STORE));
    cfg
}

/// Both keys, as `check_planes` takes them.
const KEYS: &[(&str, &str)] = &[("admin_api_key", KEY), ("store_api_key", STORE)];

async fn start_master(cfg: MasterHostConfig) -> MasterProcess {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    gateway::master::spawn_master(cfg, listener).await.unwrap()
}

fn master_alone(key: Option<&str>) -> MasterHostConfig {
    MasterHostConfig {
        host: "127.0.0.1".into(),
        port: 0,
        admin_api_key: key.map(Secret::new),
        store_api_key: Some(Secret::new(STORE)),
        shutdown_grace_period_secs: 2,
        ..MasterHostConfig::default()
    }
}

/// Every documented operation reaches a handler (never the router's 404 / 405 fallbacks).
async fn check_every_operation_is_served(base: &str, doc: &Value, auth: Option<&str>) {
    let c = reqwest::Client::new();
    for op in operations(doc) {
        let path = op.concrete_path();
        let (status, _, body) = call(&c, base, op.method.clone(), &path, auth).await;
        assert!(
            status != 405 && !body.contains("route_not_found"),
            "{} {path} is documented but not served: {status} {body}",
            op.method
        );
    }
}

fn paths_tagged(doc: &Value, tag: &str) -> Vec<(Method, String)> {
    operations(doc)
        .into_iter()
        .filter(|o| o.tag == tag)
        .map(|o| (o.method, o.path))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_hosts_the_master_with_its_background_task_and_metrics() {
    let cfg = ServeConfig {
        master: MasterConfig {
            client_ttl_ms: 300,
            tick_interval_ms: 20,
            ..MasterConfig::default()
        },
        store_api_key: Some(Secret::new(STORE)),
        ..fast_config()
    };
    let gw = start_gateway(cfg).await;
    let base = gw.url();
    let c = reqwest::Client::new();
    let client = "6f1c2a9e-0b7d-4e3a-9c5f-1d2e3f405162";
    let mount = c
        .post(format!("{base}/api/v1/clients/{client}/segments"))
        .bearer_auth(STORE)
        .json(&json!({"name": "seg-a", "base": 4096, "size": 1 << 20, "endpoint": "127.0.0.1:1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(mount.status(), 200, "{}", mount.text().await.unwrap());
    let stats = get_json(&c, &format!("{base}/api/v1/stats")).await;
    assert_eq!(
        (stats["segments"].as_u64(), stats["clients"].as_u64()),
        (Some(1), Some(1))
    );

    // The background task runs: a silent client loses its segment after the TTL.
    let master = gw
        .master()
        .expect("serve hosts a master by default")
        .clone();
    eventually("the silent client's segment is unmounted", || {
        master.stats().segments == 0
    })
    .await;
    let segs = get_json(&c, &format!("{base}/api/v1/segments")).await;
    assert_eq!(segs["segments"], json!([]));

    // Its metrics are on the gateway's /metrics, next to the gateway's own.
    let text = get_text(&c, &format!("{base}/metrics")).await;
    for needle in [
        "moongate_master_segments",
        "moongate_master_requests_total{op=\"mount_segment\"}",
        "moongate_gateway_requests_total{route=\"master\",status=\"200\"}",
    ] {
        assert!(text.contains(needle), "{needle} missing from /metrics");
    }

    // Shutdown stops the background task and drops every handle on the master.
    assert!(Arc::strong_count(&master) > 1);
    gw.shutdown().await;
    assert_eq!(
        Arc::strong_count(&master),
        1,
        "router or background task still holds the master"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_client_puts_and_gets_through_serve() {
    // No explicit store key: the one derived from the cluster's transfer secret.
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("transfer-secret");
    let store_key = transfer::ClusterSecret::load_or_create(&secret_file)
        .unwrap()
        .store_api_key();
    let gw = start_gateway(ServeConfig {
        admin_api_key: Some(Secret::new(KEY)),
        transfer_secret_file: Some(secret_file),
        ..fast_config()
    })
    .await;
    let cfg = |segment, key: Option<&str>| ClientConfig {
        local_buffer_size: 4 << 20,
        store_api_key: key.map(Secret::new),
        ..ClientConfig::local(&gw.url(), segment)
    };
    let node = StoreClient::connect(cfg(16 << 20, Some(&store_key)))
        .await
        .unwrap();
    let reader = StoreClient::connect(cfg(0, Some(&store_key)))
        .await
        .unwrap();
    let value: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    node.put("page-1", &value).await.unwrap();
    assert_eq!(reader.get("page-1").await.unwrap(), value);
    assert!(reader.exists("page-1").await.unwrap());

    // Without a key, or with another one, the master refuses the client with a typed error.
    for key in [None, Some("n0t-the-store-key")] {
        let err = StoreClient::connect(cfg(1 << 20, key))
            .await
            .map(|_| ())
            .unwrap_err();
        assert_eq!(err.name(), "UNAUTHORIZED", "mount: {err}");
        let pure = StoreClient::connect(cfg(0, key)).await.unwrap();
        let err = pure.get("page-1").await.unwrap_err();
        assert_eq!(err.name(), "UNAUTHORIZED", "get: {err}");
    }
    // Bulk removal is the admin plane's: the store key cannot, the admin key can (page-1 is
    // leased by the reads above, page-2 is not).
    node.put("page-2", b"unread").await.unwrap();
    let err = reader.remove_all().await.unwrap_err();
    assert_eq!(err.name(), "UNAUTHORIZED", "remove_all: {err}");
    let admin = StoreClient::connect(ClientConfig {
        admin_api_key: Some(Secret::new(KEY)),
        ..cfg(0, Some(KEY))
    })
    .await
    .unwrap();
    assert_eq!(admin.remove_all().await.unwrap(), 1);
    admin.close().await.unwrap();
    reader.close().await.unwrap();
    node.close().await.unwrap();
    gw.shutdown().await;
}

#[tokio::test]
async fn disable_master_serves_no_master_routes_and_documents_none() {
    let gw = start_gateway(ServeConfig {
        disable_master: true,
        ..fast_config()
    })
    .await;
    assert!(gw.master().is_none());
    let c = reqwest::Client::new();
    let base = gw.url();
    for path in ["/api/v1/stats", "/metadata?key=k"] {
        let (status, _, body) = call(&c, &base, Method::GET, path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.contains("route_not_found"), "{body}");
    }
    let doc = get_json(&c, &format!("{base}/api-docs/openapi.json")).await;
    assert!(paths_tagged(&doc, "kv-master").is_empty());
    assert!(doc["paths"]["/metadata"].is_null());
    assert!(
        !doc["tags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "kv-master")
    );
    // Everything else is what `serve` documents with the master.
    let full = committed_openapi();
    let without: Vec<_> = operations(&full)
        .into_iter()
        .filter(|o| o.tag != "kv-master")
        .map(|o| (o.method, o.path))
        .collect();
    let got: Vec<_> = operations(&doc)
        .into_iter()
        .map(|o| (o.method, o.path))
        .collect();
    assert_eq!(got, without);
    check_every_operation_is_served(&base, &doc, None).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_opens_its_plane_and_the_document_says_which() {
    let gw = start_gateway(keyed(fast_config())).await;
    let base = gw.url();
    let doc = get_json(
        &reqwest::Client::new(),
        &format!("{base}/api-docs/openapi.json"),
    )
    .await;
    assert!(check_planes(&base, &doc, KEYS).await > 0);
    // The worker API and the master's cluster-wide reads take the admin key; the master's
    // store plane the store key or the admin key; inference (no client keys here), health,
    // metrics and the docs no key.
    let mut planes = std::collections::BTreeSet::new();
    for op in operations(&doc) {
        let what = format!("{} {}", op.method, op.path);
        match op.plane.as_deref() {
            Some("admin") => assert_eq!(op.schemes, ["admin_api_key"], "{what}"),
            Some("store") => {
                assert_eq!(op.schemes, ["store_api_key", "admin_api_key"], "{what}")
            }
            Some("client") => assert!(op.schemes.is_empty(), "{what}"),
            None => assert!(
                op.schemes.is_empty() && ["ops", "docs"].contains(&op.tag.as_str()),
                "{what}"
            ),
            Some(other) => panic!("{what}: plane {other}"),
        }
        if op.tag == "workers" {
            assert_eq!(op.plane.as_deref(), Some("admin"), "{what}");
        }
        planes.insert((op.tag.clone(), op.plane.clone()));
    }
    assert!(planes.contains(&("kv-master".into(), Some("store".into()))));
    assert!(planes.contains(&("kv-master".into(), Some("admin".into()))));
    for (path, method, plane) in [
        ("/api/v1/clients/{client_id}/segments", "post", "store"),
        ("/api/v1/objects/{key}", "delete", "store"),
        ("/api/v1/objects/{key}", "get", "admin"),
        ("/api/v1/objects", "delete", "admin"),
        ("/api/v1/clients/{client_id}", "delete", "store"),
        ("/api/v1/clients/{client_id}", "get", "admin"),
        ("/metadata", "put", "store"),
        ("/api/v1/stats", "get", "admin"),
    ] {
        assert_eq!(
            doc["paths"][path][method]["x-moongate-plane"], plane,
            "{method} {path}"
        );
    }
    let schemes = doc["components"]["securitySchemes"].as_object().unwrap();
    let names: Vec<&String> = schemes.keys().collect();
    assert_eq!(
        names,
        ["admin_api_key", "store_api_key"],
        "only the schemes in use"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn without_an_admin_key_admin_routes_answer_loopback_callers() {
    let gw = start_gateway(fast_config()).await;
    let c = reqwest::Client::new();
    for path in ["/workers", "/api/v1/stats", "/api/v1/segments"] {
        let (status, _, body) = call(&c, &gw.url(), Method::GET, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    // The store plane still takes its key, from loopback too.
    let (status, www, body) = call(&c, &gw.url(), Method::GET, "/metadata?key=k", None).await;
    assert_eq!((status, www.as_deref()), (401, Some("Bearer")), "{body}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_serves_the_committed_openapi_document() {
    // Default settings (an explicit store key, which the document does not show).
    let gw = start_gateway(ServeConfig {
        store_api_key: Some(Secret::new(STORE)),
        ..fast_config()
    })
    .await;
    let c = reqwest::Client::new();
    let base = gw.url();
    let served = c
        .get(format!("{base}/api-docs/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(served.headers()["content-type"], "application/json");
    let served = served.text().await.unwrap();
    let alias = get_text(&c, &format!("{base}/openapi.json")).await;
    assert_eq!(served, alias, "/openapi.json serves the same bytes");
    let served: Value = serde_json::from_str(&served).unwrap();
    if let Some(at) = first_difference(&served, &committed_openapi()) {
        panic!(
            "openapi/openapi.json differs from what `moongate serve` serves (first at {at:?}); \
             regenerate it with\n  cargo run -p gateway -- openapi -o openapi/openapi.json"
        );
    }
    assert_eq!(served["info"]["version"], env!("CARGO_PKG_VERSION"));
    // By default only the store plane takes a key; the admin plane answers loopback.
    assert_eq!(
        served["components"]["securitySchemes"]["store_api_key"]["scheme"],
        "bearer"
    );
    assert!(served["components"]["securitySchemes"]["admin_api_key"].is_null());
    assert!(served["paths"]["/workers"]["get"]["responses"]["403"].is_object());
    assert!(served["paths"]["/v1/models"]["get"]["security"].is_null());
    // Every route a user reaches is in it, and every operation in it is served.
    for (method, path) in [
        ("post", "/v1/chat/completions"),
        ("post", "/v1/completions"),
        ("post", "/generate"),
        ("get", "/v1/models"),
        ("post", "/workers"),
        ("patch", "/workers/{id}"),
        ("get", "/health"),
        ("get", "/liveness"),
        ("get", "/readiness"),
        ("get", "/metrics"),
        ("post", "/api/v1/objects/{key}/put-start"),
        ("post", "/api/v1/batch/replicas"),
        ("put", "/metadata"),
        ("get", "/api-docs/openapi.json"),
        ("get", "/openapi.json"),
        ("get", "/docs"),
        ("get", "/docs/"),
    ] {
        assert!(
            served["paths"][path][method].is_object(),
            "{method} {path} missing from the document"
        );
    }
    check_every_operation_is_served(&base, &served, Some(&format!("Bearer {STORE}"))).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_alone_serves_its_routes_document_and_ui() {
    let m = start_master(master_alone(Some(KEY))).await;
    let base = m.url();
    let c = reqwest::Client::new();
    let doc = get_json(&c, &format!("{base}/api-docs/openapi.json")).await;
    assert_eq!(doc["info"]["title"], "Moongate KV master");

    // Its master routes are exactly the ones `serve` documents, plus its own health,
    // metrics and docs; nothing of the gateway's.
    let serve = committed_openapi();
    assert_eq!(
        paths_tagged(&doc, "kv-master"),
        paths_tagged(&serve, "kv-master")
    );
    assert_eq!(
        paths_tagged(&doc, "ops"),
        vec![
            (Method::GET, "/health".to_string()),
            (Method::GET, "/liveness".to_string()),
            (Method::GET, "/metrics".to_string()),
            (Method::GET, "/readiness".to_string())
        ]
    );
    assert_eq!(paths_tagged(&doc, "docs"), paths_tagged(&serve, "docs"));
    assert!(paths_tagged(&doc, "inference").is_empty() && paths_tagged(&doc, "workers").is_empty());
    assert_eq!(
        doc["components"]["schemas"]["MasterErrorResponse"],
        serve["components"]["schemas"]["MasterErrorResponse"]
    );

    assert!(check_planes(&base, &doc, KEYS).await > 0);
    check_every_operation_is_served(&base, &doc, Some(&format!("Bearer {KEY}"))).await;
    let health = get_json(&c, &format!("{base}/health")).await;
    assert_eq!(health["status"], "alive");
    let (status, _, body) = call(&c, &base, Method::GET, "/v1/models", None).await;
    assert_eq!(status, 404);
    assert!(body.contains("route_not_found"), "{body}");

    // The master's metrics, gauges fresh at scrape time.
    let fake = format!("{base}/api/v1/clients/6f1c2a9e-0b7d-4e3a-9c5f-1d2e3f405162");
    let r = c
        .post(format!("{fake}/segments"))
        .bearer_auth(KEY)
        .json(&json!({"name": "alone-seg", "base": 0, "size": 4096, "endpoint": "127.0.0.1:1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The scrape publishes this master's gauges before rendering them; the gauges are the
    // process's, and the other tests' masters in this binary publish theirs on every tick of
    // their background tasks, so one may land in between (CI once read another master's
    // 1048576). Scrape until this master's value shows, a bounded number of times.
    let mut text = String::new();
    for _ in 0..50 {
        text = get_text(&c, &format!("{base}/metrics")).await;
        if text.contains("moongate_master_capacity_bytes 4096") {
            break;
        }
    }
    assert!(
        text.contains("moongate_master_capacity_bytes 4096"),
        "{text}"
    );
    assert_eq!(m.master().stats().segments, 1);
    let r = c.delete(&fake).bearer_auth(KEY).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());

    // A store client with the key works against it.
    let node = StoreClient::connect(ClientConfig {
        local_buffer_size: 4 << 20,
        store_api_key: Some(Secret::new(KEY)),
        ..ClientConfig::local(&base, 8 << 20)
    })
    .await
    .unwrap();
    node.put("k", b"value").await.unwrap();
    assert_eq!(node.get("k").await.unwrap(), &b"value"[..]);
    node.close().await.unwrap();

    let master = m.master().clone();
    m.shutdown().await;
    let refused = c.get(format!("{base}/health")).send().await;
    assert!(refused.is_err(), "still listening after shutdown");
    drop(master);
}

#[tokio::test]
async fn swagger_ui_is_served_from_the_binary_under_a_strict_policy() {
    let gw = start_gateway(fast_config()).await;
    let m = start_master(master_alone(None)).await;
    let c = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for base in [gw.url(), m.url()] {
        let r = c.get(format!("{base}/docs")).send().await.unwrap();
        assert_eq!(r.status(), 303);
        assert_eq!(r.headers()["location"], "/docs/");
        let r = c.get(format!("{base}/docs/")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        let csp = r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
            "{csp}"
        );
        assert!(r.text().await.unwrap().contains("swagger-ui-bundle.js"));
        let init = get_text(&c, &format!("{base}/docs/swagger-initializer.js")).await;
        assert!(init.contains("\"/api-docs/openapi.json\""), "{init}");
        assert!(init.contains("\"validatorUrl\": \"none\""), "{init}");
        let bundle = c
            .get(format!("{base}/docs/swagger-ui-bundle.js"))
            .send()
            .await
            .unwrap();
        assert_eq!(bundle.status(), 200);
        assert!(bundle.bytes().await.unwrap().len() > 100_000);
        let (status, _, body) = call(&c, &base, Method::GET, "/docs/nothing.js", None).await;
        assert_eq!(status, 404, "{body}");
    }
    gw.shutdown().await;
    m.shutdown().await;
}

#[tokio::test]
async fn shutdown_of_a_master_alone_is_prompt_with_idle_connections() {
    let m = start_master(master_alone(None)).await;
    let c = reqwest::Client::new();
    let _ = get_json(&c, &format!("{}/health", m.url())).await;
    // The keep-alive connection above is idle: shutdown must not wait for the grace period.
    let t = std::time::Instant::now();
    m.shutdown().await;
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}
