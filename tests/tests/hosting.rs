//! `moongate serve` hosting the KV master, `moongate master` alone, the admin key, and the
//! OpenAPI document and Swagger UI they serve, over real sockets on 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use gateway::config::{MasterHostConfig, Secret, ServeConfig};
use gateway::hosting::MasterProcess;
use http::Method;
use kvstore::{ClientConfig, MasterConfig, StoreClient};
use moongate_tests::{
    committed_openapi, eventually, fast_config, first_difference, get_json, get_text, operations,
    start_gateway,
};
use serde_json::{Value, json};

const KEY: &str = "admin-K3y_for.tests";

fn keyed(mut cfg: ServeConfig) -> ServeConfig {
    cfg.admin_api_key = Some(Secret::new(KEY));
    cfg
}

async fn start_master(cfg: MasterHostConfig) -> MasterProcess {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    gateway::hosting::spawn_master(cfg, listener).await.unwrap()
}

fn master_alone(key: Option<&str>) -> MasterHostConfig {
    MasterHostConfig {
        host: "127.0.0.1".into(),
        port: 0,
        admin_api_key: key.map(Secret::new),
        shutdown_grace_period_secs: 2,
        ..MasterHostConfig::default()
    }
}

/// Sends `method path` (a `{}` JSON body for methods that take one) with `auth` as the
/// `Authorization` header; returns the status, the `WWW-Authenticate` header and the body.
async fn call(
    c: &reqwest::Client,
    base: &str,
    method: Method,
    path: &str,
    auth: Option<&str>,
) -> (u16, Option<String>, String) {
    let mut req = c.request(method.clone(), format!("{base}{path}"));
    if matches!(method, Method::POST | Method::PUT | Method::PATCH) {
        req = req.header("content-type", "application/json").body("{}");
    }
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let www = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    (status, www, resp.text().await.unwrap())
}

/// Every operation of the document `base` serves: secured ones refuse a request without the
/// right key (401, the owner's envelope, `WWW-Authenticate: Bearer`) and take one with it;
/// open ones never ask for a key.
async fn check_admin_key(base: &str, doc: &Value) {
    let c = reqwest::Client::new();
    let right = format!("Bearer {KEY}");
    let mut secured = 0;
    for op in operations(doc) {
        let path = op.concrete_path();
        let what = format!("{} {path}", op.method);
        if !op.secured {
            let (status, _, body) = call(&c, base, op.method.clone(), &path, None).await;
            assert_ne!(status, 401, "{what} is open: {body}");
            continue;
        }
        secured += 1;
        for wrong in [None, Some("Bearer nope"), Some("Basic YWRtaW4="), Some(KEY)] {
            let (status, www, body) = call(&c, base, op.method.clone(), &path, wrong).await;
            assert_eq!(status, 401, "{what} with {wrong:?}: {body}");
            assert_eq!(www.as_deref(), Some("Bearer"), "{what}");
            let v: Value = serde_json::from_str(&body).unwrap();
            if op.tag == "kv-master" {
                assert_eq!(
                    (v["error"]["type"].as_str(), v["error"]["code"].as_i64()),
                    (Some("UNAUTHORIZED"), Some(-2001)),
                    "{what}: master envelope: {body}"
                );
            } else {
                assert_eq!(v["error"]["code"], "invalid_api_key", "{what}: {body}");
                assert_eq!(v["error"]["type"], "authentication_error", "{what}: {body}");
            }
            assert!(!body.contains(KEY), "{what} echoes the key");
        }
        let (status, _, body) = call(&c, base, op.method.clone(), &path, Some(&right)).await;
        assert_ne!(status, 401, "{what} with the key: {body}");
    }
    assert!(secured > 0, "no secured operation in the document");
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
        ..fast_config()
    };
    let gw = start_gateway(cfg).await;
    let base = gw.url();
    let c = reqwest::Client::new();
    let client = "6f1c2a9e-0b7d-4e3a-9c5f-1d2e3f405162";
    let mount = c
        .post(format!("{base}/api/v1/clients/{client}/segments"))
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
    let gw = start_gateway(keyed(fast_config())).await;
    let cfg = |segment| ClientConfig {
        local_buffer_size: 4 << 20,
        store_api_key: Some(Secret::new(KEY)),
        ..ClientConfig::local(&gw.url(), segment)
    };
    let node = StoreClient::connect(cfg(16 << 20)).await.unwrap();
    let reader = StoreClient::connect(cfg(0)).await.unwrap();
    let value: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    node.put("page-1", &value).await.unwrap();
    assert_eq!(reader.get("page-1").await.unwrap(), value);

    // With a key it does not accept the master refuses the client with a typed error.
    let keyless = |segment| ClientConfig {
        store_api_key: Some(Secret::new("not-the-key")),
        ..cfg(segment)
    };
    let err = StoreClient::connect(keyless(1 << 20))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.name(), "UNAUTHORIZED", "mount: {err}");
    let pure = StoreClient::connect(keyless(0)).await.unwrap();
    let err = pure.get("page-1").await.unwrap_err();
    assert_eq!(err.name(), "UNAUTHORIZED", "get: {err}");
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
async fn the_admin_key_guards_the_worker_api_and_the_master_only() {
    let gw = start_gateway(keyed(fast_config())).await;
    let base = gw.url();
    let doc = get_json(
        &reqwest::Client::new(),
        &format!("{base}/api-docs/openapi.json"),
    )
    .await;
    check_admin_key(&base, &doc).await;
    // What is secured is exactly the worker API and the master's routes.
    for op in operations(&doc) {
        let admin = op.tag == "workers" || op.tag == "kv-master";
        assert_eq!(op.secured, admin, "{} {}", op.method, op.path);
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn without_a_key_admin_routes_are_open() {
    let gw = start_gateway(fast_config()).await;
    let c = reqwest::Client::new();
    for path in ["/workers", "/api/v1/stats", "/api/v1/segments"] {
        let (status, _, body) = call(&c, &gw.url(), Method::GET, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_serves_the_committed_openapi_document() {
    let gw = start_gateway(keyed(fast_config())).await;
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
    assert_eq!(
        served["components"]["securitySchemes"]["admin_api_key"]["scheme"],
        "bearer"
    );
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
    check_every_operation_is_served(&base, &served, Some(&format!("Bearer {KEY}"))).await;
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
            (Method::GET, "/metrics".to_string())
        ]
    );
    assert_eq!(paths_tagged(&doc, "docs"), paths_tagged(&serve, "docs"));
    assert!(paths_tagged(&doc, "inference").is_empty() && paths_tagged(&doc, "workers").is_empty());
    assert_eq!(
        doc["components"]["schemas"]["MasterErrorResponse"],
        serve["components"]["schemas"]["MasterErrorResponse"]
    );

    check_admin_key(&base, &doc).await;
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
    let text = get_text(&c, &format!("{base}/metrics")).await;
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
    assert_eq!(node.get("k").await.unwrap(), b"value");
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
