//! CORS (`--cors-allowed-origins`) with real preflight requests, as a browser sends them.

use gateway::config::{Secret, ServeConfig};
use moongate_tests::{Backend, start_gateway, start_regular_gateway};
use serde_json::json;

const APP: &str = "https://app.example.com";
const KEY: &str = "cl1ent-key";

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_ascii_lowercase())
}

async fn preflight(base: &str, path: &str, origin: &str, method: &str) -> reqwest::Response {
    reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, format!("{base}{path}"))
        .header("origin", origin)
        .header("access-control-request-method", method)
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_origins_get_preflights_and_headers_others_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{KEY}\n")).unwrap();
    let w = Backend::start("w", "m").await;
    let gw = start_regular_gateway(&[&w], |c| {
        c.cors_allowed_origins = vec![APP.into(), "http://127.0.0.1:8080".into()];
        c.client_api_keys_file = Some(keys.clone());
        c.store_api_key = Some(Secret::new("st0re"));
    })
    .await;
    let base = gw.url();

    // A preflight needs no key: it is answered before any plane is asked.
    for (path, method) in [
        ("/v1/chat/completions", "POST"),
        ("/workers/x", "DELETE"),
        ("/api/v1/stats", "GET"),
    ] {
        let r = preflight(&base, path, APP, method).await;
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(
            header(&r, "access-control-allow-origin").as_deref(),
            Some(APP)
        );
        let methods = header(&r, "access-control-allow-methods").unwrap();
        assert!(methods.contains(&method.to_ascii_lowercase()), "{methods}");
        let allowed = header(&r, "access-control-allow-headers").unwrap();
        assert!(
            allowed.contains("authorization") && allowed.contains("content-type"),
            "{allowed}"
        );
        assert_eq!(header(&r, "access-control-max-age").as_deref(), Some("600"));
        assert!(header(&r, "vary").unwrap().contains("origin"));
        assert!(header(&r, "access-control-allow-credentials").is_none());
    }
    assert_eq!(w.hits(), 0, "a preflight reached a worker");

    // Another origin gets no grant (the browser then blocks the call).
    let r = preflight(
        &base,
        "/v1/chat/completions",
        "https://evil.example",
        "POST",
    )
    .await;
    assert!(header(&r, "access-control-allow-origin").is_none());

    // The real request: the origin is granted, the request id exposed; a refusal carries
    // the grant too, so the page can read the error.
    let c = reqwest::Client::new();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .header("origin", APP)
        .bearer_auth(KEY)
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some(APP)
    );
    let exposed = header(&r, "access-control-expose-headers").unwrap();
    assert!(exposed.contains("x-request-id"), "{exposed}");
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .header("origin", APP)
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some(APP)
    );
    let r = c
        .get(format!("{base}/health"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "access-control-allow-origin").is_none());
    gw.shutdown().await;
}

#[tokio::test]
async fn a_star_allows_any_origin_and_no_setting_means_no_cors() {
    let gw = start_gateway(ServeConfig {
        cors_allowed_origins: vec!["*".into()],
        ..moongate_tests::fast_config()
    })
    .await;
    let r = preflight(&gw.url(), "/v1/models", "https://anyone.example", "GET").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some("*")
    );
    gw.shutdown().await;

    let gw = start_gateway(moongate_tests::fast_config()).await;
    let r = preflight(&gw.url(), "/v1/models", APP, "GET").await;
    assert_eq!(r.status(), 405, "OPTIONS is no route without CORS");
    assert!(header(&r, "access-control-allow-origin").is_none());
    let r = reqwest::Client::new()
        .get(format!("{}/v1/models", gw.url()))
        .header("origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "access-control-allow-origin").is_none());
    gw.shutdown().await;
}
