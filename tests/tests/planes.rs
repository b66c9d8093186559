//! A key for every plane, over real sockets: client keys on inference (never forwarded to
//! a worker), the gateway's worker key only for the workers it was given for, and the admin
//! plane of a server without an admin key answering loopback callers only, tested from a
//! real non-loopback address of this host.

use gateway::config::{MasterHostConfig, Secret, ServeConfig};
use http::Method;
use moongate_tests::{
    Backend, call, check_planes, direct, eventually, fast_config, get_json, get_text,
    non_loopback_ip, operations, start_gateway, start_regular_gateway,
};
use serde_json::{Value, json};

const CLIENT_A: &str = "cl1ent-key-A";
const CLIENT_B: &str = "cl1ent-key-B";
const ADMIN: &str = "adm1n-key";
const STORE: &str = "st0re-key";
const WORKER_KEY: &str = "gateway-w0rker-key";

/// A client keys file with both client keys, comments and blank lines.
fn keys_file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("client-keys");
    std::fs::write(
        &path,
        format!("# team a\n{CLIENT_A}\n\n  # team b\n{CLIENT_B}\n"),
    )
    .unwrap();
    path
}

fn keyed(dir: &tempfile::TempDir, cfg: &mut ServeConfig) {
    cfg.client_api_keys_file = Some(keys_file(dir));
    cfg.admin_api_key = Some(Secret::new(ADMIN));
    cfg.store_api_key = Some(Secret::new(STORE));
}

fn authorization(h: &http::HeaderMap) -> Option<String> {
    h.get("authorization")
        .map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_plane_takes_its_keys_and_the_document_states_exactly_that() {
    let dir = tempfile::tempdir().unwrap();
    let w = Backend::start("w", "m").await;
    let gw = start_regular_gateway(&[&w], |c| keyed(&dir, c)).await;
    let base = gw.url();
    let doc = get_json(
        &reqwest::Client::new(),
        &format!("{base}/api-docs/openapi.json"),
    )
    .await;
    let keys = [
        ("client_api_key", CLIENT_A),
        ("store_api_key", STORE),
        ("admin_api_key", ADMIN),
    ];
    assert!(check_planes(&base, &doc, &keys).await > 20);
    // The second client key is a key too.
    check_planes(&base, &doc, &[("client_api_key", CLIENT_B)]).await;
    for op in operations(&doc) {
        let what = format!("{} {}", op.method, op.path);
        let want: &[&str] = match op.plane.as_deref() {
            Some("client") => &["client_api_key", "admin_api_key"],
            Some("store") => &["store_api_key", "admin_api_key"],
            Some("admin") => &["admin_api_key"],
            _ => &[],
        };
        assert_eq!(op.schemes, want, "{what}");
        assert!(
            !op.statuses
                .iter()
                .any(|s| s == "403" && op.tag != "kv-master"),
            "{what}: a keyed admin plane has no loopback 403"
        );
        if op.tag == "inference" {
            assert_eq!(op.plane.as_deref(), Some("client"), "{what}");
        }
    }
    let schemes = doc["components"]["securitySchemes"].as_object().unwrap();
    assert_eq!(schemes.len(), 3, "{schemes:?}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_keys_are_checked_and_never_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let w = Backend::start("w", "m").await;
    let gw = start_regular_gateway(&[&w], |c| keyed(&dir, c)).await;
    let c = reqwest::Client::new();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let send = |auth: Option<&str>, path: &str| {
        let mut r = c.post(format!("{}{path}", gw.url())).json(&chat);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.send()
    };
    for path in ["/v1/chat/completions", "/v1/completions", "/generate"] {
        for bad in [
            None,
            Some("Bearer wrong"),
            Some(&*format!("Bearer {STORE}")),
            Some(CLIENT_A),
        ] {
            let r = send(bad, path).await.unwrap();
            assert_eq!(r.status(), 401, "{path} {bad:?}");
            assert_eq!(r.headers()["www-authenticate"], "Bearer");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("client API key"),
                "{v}"
            );
        }
    }
    assert_eq!(w.hits(), 0, "a refused request reached the worker");
    for key in [CLIENT_A, CLIENT_B, ADMIN] {
        let r = send(Some(&format!("Bearer {key}")), "/v1/chat/completions")
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{key}");
    }
    let seen = w.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_eq!(
            authorization(&s.headers),
            None,
            "the client's key reached the worker"
        );
    }
    let models = c
        .get(format!("{}/v1/models", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 401);
    let models = c
        .get(format!("{}/v1/models", gw.url()))
        .bearer_auth(CLIENT_B)
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    // Probes stay open.
    for path in ["/health", "/liveness", "/readiness", "/metrics"] {
        let r = c.get(format!("{}{path}", gw.url())).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let metrics = get_text(&c, &format!("{}/metrics", gw.url())).await;
    assert!(
        metrics.contains("moongate_auth_refusals_total{plane=\"client\",reason=\"unauthorized\"}"),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_worker_key_goes_only_to_the_workers_it_was_given_for() {
    let configured = Backend::start("configured", "m").await;
    let keyless = Backend::start("keyless", "m").await;
    let own = Backend::start("own", "m").await;
    let gw = start_regular_gateway(&[&configured], |c| {
        c.api_key = Some(WORKER_KEY.into());
        c.policy = gateway::config::PolicyKind::RoundRobin;
    })
    .await;
    let c = reqwest::Client::new();
    let base = gw.url();
    let register = |url: String, key: Option<&str>| {
        let mut body = json!({"url": url});
        if let Some(k) = key {
            body["api_key"] = json!(k);
        }
        c.post(format!("{base}/workers")).json(&body).send()
    };
    let r = register(keyless.url(), None).await.unwrap();
    assert_eq!(r.status(), 201);
    let keyless_id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = register(own.url(), Some("its-own-key")).await.unwrap();
    assert_eq!(r.status(), 201);
    let own_id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    eventually("three ready workers", || {
        gw.state().registry().counts().0 == 3
    })
    .await;

    // Inference: round robin sends each worker requests; a client header never replaces a
    // worker's key, and only reaches the worker that has none (no client keys here).
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..6 {
        let r = c
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth("client-sent")
            .json(&chat)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let keys_of = |b: &Backend| {
        let mut k: Vec<Option<String>> = b
            .seen()
            .iter()
            .map(|s| authorization(&s.headers))
            .chain(b.probes().iter().map(|(_, h)| authorization(h)))
            .collect();
        k.dedup();
        k
    };
    assert_eq!(keys_of(&configured), [Some(format!("Bearer {WORKER_KEY}"))]);
    assert!(!configured.probes().is_empty() && !configured.seen().is_empty());
    let seen_keyless: Vec<_> = keyless
        .probes()
        .iter()
        .map(|(_, h)| authorization(h))
        .collect();
    assert!(
        !seen_keyless.is_empty() && seen_keyless.iter().all(Option::is_none),
        "{seen_keyless:?}"
    );
    let sent: Vec<_> = keyless
        .seen()
        .iter()
        .map(|s| authorization(&s.headers))
        .collect();
    assert!(
        !sent.is_empty()
            && sent
                .iter()
                .all(|a| a.as_deref() == Some("Bearer client-sent")),
        "{sent:?}"
    );
    assert_eq!(keys_of(&own), [Some("Bearer its-own-key".to_string())]);

    // Removing a registered worker's own key leaves it with none, not the gateway's; a new
    // one is sent from the next probe on (probes run every second).
    let probe_after_patch = async |b: &Backend, id: &str, key: Value| {
        let r = c
            .patch(format!("{base}/workers/{id}"))
            .json(&json!({ "api_key": key }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let before = b.probes().len();
        eventually("a probe after the change", || b.probes().len() > before + 1).await;
        b.probes().last().and_then(|(_, h)| authorization(h))
    };
    assert_eq!(
        probe_after_patch(&own, &own_id, Value::Null).await,
        None,
        "the gateway's key went to a registered worker"
    );
    assert_eq!(
        probe_after_patch(&keyless, &keyless_id, json!("rotated"))
            .await
            .as_deref(),
        Some("Bearer rotated")
    );
    // No answer echoes a key.
    let list = c
        .get(format!("{base}/workers"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for k in [WORKER_KEY, "its-own-key", "rotated"] {
        assert!(!list.contains(k), "GET /workers shows {k}");
    }
    gw.shutdown().await;
}

/// This host's non-loopback address: these tests need one.
fn far_ip() -> std::net::IpAddr {
    non_loopback_ip().expect("this host has no non-loopback address to call the server from")
}

fn url(ip: std::net::IpAddr, port: u16) -> String {
    format!("http://{}", std::net::SocketAddr::new(ip, port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_key_the_admin_plane_answers_loopback_callers_only() {
    let far_ip = far_ip();
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cfg = ServeConfig {
        host: "0.0.0.0".into(),
        store_api_key: Some(Secret::new(STORE)),
        ..fast_config()
    };
    let gw = gateway::launch::spawn(cfg, listener).await.unwrap();
    let (lo, far) = (url("127.0.0.1".parse().unwrap(), port), url(far_ip, port));
    let c = direct();
    for path in ["/workers", "/api/v1/stats", "/api/v1/clients"] {
        let (status, _, body) = call(&c, &lo, Method::GET, path, None).await;
        assert_eq!(status, 200, "loopback {path}: {body}");
        let (status, www, body) = call(&c, &far, Method::GET, path, None).await;
        assert_eq!((status, www), (403, None), "{far} {path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("--admin-api-key") && msg.contains("--insecure-open-admin"),
            "{msg}"
        );
        if path == "/workers" {
            assert_eq!(v["error"]["code"], "admin_loopback_only", "{body}");
        } else {
            assert_eq!(
                (v["error"]["type"].as_str(), v["error"]["code"].as_i64()),
                (Some("FORBIDDEN"), Some(-2002)),
                "{body}"
            );
        }
    }
    let (status, _, body) = call(&c, &far, Method::POST, "/workers", None).await;
    assert_eq!(status, 403, "{body}");
    // Other planes answer a far caller as they answer any: inference open (no client
    // keys), the store plane with its key, probes and docs open.
    for (path, auth, want) in [
        ("/v1/models", None, 200),
        ("/health", None, 200),
        ("/api-docs/openapi.json", None, 200),
        ("/metadata?key=none", Some(format!("Bearer {STORE}")), 404),
        ("/metadata?key=none", None, 401),
    ] {
        let (status, _, body) = call(&c, &far, Method::GET, path, auth.as_deref()).await;
        assert_eq!(status, want, "{path}: {body}");
    }
    // The document says so: no key on the admin plane, its 403 documented.
    let doc = get_json(&c, &format!("{far}/api-docs/openapi.json")).await;
    for op in operations(&doc)
        .into_iter()
        .filter(|o| o.plane.as_deref() == Some("admin"))
    {
        assert!(
            op.schemes.is_empty() && op.statuses.iter().any(|s| s == "403"),
            "{} {}",
            op.method,
            op.path
        );
    }
    gw.shutdown().await;

    // An admin key: everyone needs it, loopback too.
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cfg = ServeConfig {
        host: "0.0.0.0".into(),
        admin_api_key: Some(Secret::new(ADMIN)),
        store_api_key: Some(Secret::new(STORE)),
        ..fast_config()
    };
    let gw = gateway::launch::spawn(cfg, listener).await.unwrap();
    let (lo, far_url) = (url("127.0.0.1".parse().unwrap(), port), url(far_ip, port));
    for base in [&lo, &far_url] {
        let (status, _, _) = call(&c, base, Method::GET, "/workers", None).await;
        assert_eq!(status, 401, "{base}");
        let (status, _, _) = call(
            &c,
            base,
            Method::GET,
            "/workers",
            Some(format!("Bearer {ADMIN}").as_str()),
        )
        .await;
        assert_eq!(status, 200, "{base}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_open_admin_opens_the_admin_plane_to_far_callers() {
    let far = far_ip();
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cfg = ServeConfig {
        host: "0.0.0.0".into(),
        insecure_open_admin: true,
        store_api_key: Some(Secret::new(STORE)),
        ..fast_config()
    };
    let gw = gateway::launch::spawn(cfg, listener).await.unwrap();
    let c = direct();
    let far = url(far, port);
    for path in ["/workers", "/api/v1/stats"] {
        let (status, _, body) = call(&c, &far, Method::GET, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let doc = get_json(&c, &format!("{far}/api-docs/openapi.json")).await;
    for op in operations(&doc)
        .into_iter()
        .filter(|o| o.plane.as_deref() == Some("admin"))
    {
        assert!(op.schemes.is_empty(), "{} {}", op.method, op.path);
        let loopback_403 = doc["paths"][&op.path][op.method.as_str().to_ascii_lowercase()]["responses"]["403"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("loopback"));
        assert!(
            !loopback_403,
            "{} {} documents the loopback 403",
            op.method, op.path
        );
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_alone_keeps_its_admin_plane_on_loopback_without_a_key() {
    let far = far_ip();
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cfg = MasterHostConfig {
        host: "0.0.0.0".into(),
        port: 0,
        store_api_key: Some(Secret::new(STORE)),
        shutdown_grace_period_secs: 2,
        ..MasterHostConfig::default()
    };
    let m = gateway::master::spawn_master(cfg, listener).await.unwrap();
    let c = direct();
    let (lo, far) = (url("127.0.0.1".parse().unwrap(), port), url(far, port));
    let (status, _, body) = call(&c, &lo, Method::GET, "/api/v1/segments", None).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(&c, &far, Method::GET, "/api/v1/segments", None).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("FORBIDDEN") && body.contains("--insecure-open-admin"),
        "{body}"
    );
    let client = "0d1f8a3e-5b6c-4d7e-8f90-a1b2c3d4e5f6";
    let (status, _, body) = call(
        &c,
        &far,
        Method::POST,
        &format!("/api/v1/clients/{client}/ping"),
        Some(format!("Bearer {STORE}").as_str()),
    )
    .await;
    assert_eq!(
        status, 200,
        "the store plane answers far nodes with the key: {body}"
    );
    m.shutdown().await;
}

#[tokio::test]
async fn a_bad_client_keys_file_stops_the_server_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(&path, "ok-key\nnot a key\n").unwrap();
    let cfg = ServeConfig {
        client_api_keys_file: Some(path.clone()),
        ..fast_config()
    };
    let err = cfg.validate().unwrap_err().to_string();
    assert!(
        err.contains("client_api_keys_file") && err.contains("line 2"),
        "{err}"
    );
    assert!(
        !err.contains("not a key") && !err.contains("ok-key"),
        "{err}"
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let started = gateway::launch::spawn(cfg, listener).await;
    assert!(
        started.is_err(),
        "a server started with an unreadable keys file"
    );
}

#[tokio::test]
async fn the_demo_needs_no_key_on_loopback() {
    let gw = start_gateway(fast_config()).await;
    let c = reqwest::Client::new();
    for path in ["/workers", "/v1/models", "/api/v1/stats"] {
        let (status, _, body) = call(&c, &gw.url(), Method::GET, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    gw.shutdown().await;
}
