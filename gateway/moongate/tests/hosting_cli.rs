//! `moongate serve` hosting the KV master and `moongate master` alone, as processes started
//! the way users start them: settings reach the master, the admin key is enforced and never
//! logged, the documents match, SIGTERM stops them cleanly. Plus `moongate openapi`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::{Proc, moongate};

use serde_json::{Value, json};

const KEY: &str = "pr0cess-admin-key";
const WRONG: &str = "wr0ng-key-value";

async fn status(c: &reqwest::Client, url: &str, key: Option<&str>) -> u16 {
    let mut req = c.get(url);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    req.send().await.unwrap().status().as_u16()
}

async fn json_of(c: &reqwest::Client, url: &str) -> Value {
    c.get(url).send().await.unwrap().json().await.unwrap()
}

async fn text_of(c: &reqwest::Client, url: &str) -> String {
    c.get(url).send().await.unwrap().text().await.unwrap()
}

fn committed_openapi() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../openapi/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn openapi_of(of: &str) -> Value {
    let out = moongate().args(["openapi", "--of", of]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Mounts a fake segment for `client`, writes `key` and reads its replicas: the lease TTL the
/// master grants.
async fn lease_ttl_of_a_fresh_object(c: &reqwest::Client, base: &str, key: &str) -> u64 {
    let client = "0e8f6d2a-3b1c-4d5e-9f7a-8b6c5d4e3f21";
    let post = |path: String, body: Value| {
        c.post(format!("{base}{path}"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    };
    let r = post(
        format!("/api/v1/clients/{client}/segments"),
        json!({"name": "p-seg", "base": 0, "size": 1 << 20, "endpoint": "127.0.0.1:1"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200, "mount: {}", r.text().await.unwrap());
    let r = post(
        format!("/api/v1/objects/{key}/put-start"),
        json!({"client_id": client, "length": 64}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200, "put-start: {}", r.text().await.unwrap());
    let r = post(
        format!("/api/v1/objects/{key}/put-end"),
        json!({"client_id": client}),
    )
    .await
    .unwrap();
    assert!(r.status().is_success(), "put-end: {}", r.status());
    let v: Value = c
        .get(format!("{base}/api/v1/objects/{key}/replicas"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["lease_ttl_ms"].as_u64().unwrap_or_else(|| panic!("{v}"))
}

#[tokio::test]
async fn serve_process_hosts_the_master_with_its_settings_and_key() {
    let p = Proc::start(moongate().args([
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--log-level",
        "debug",
        "--admin-api-key",
        KEY,
        "--master-lease-ttl-ms",
        "1234",
    ]));
    let c = reqwest::Client::new();
    let base = p.base.clone();
    assert_eq!(status(&c, &format!("{base}/api/v1/stats"), None).await, 401);
    assert_eq!(
        status(&c, &format!("{base}/api/v1/stats"), Some(WRONG)).await,
        401
    );
    assert_eq!(
        status(&c, &format!("{base}/workers"), Some(WRONG)).await,
        401
    );
    assert_eq!(
        status(&c, &format!("{base}/metadata?key=x"), None).await,
        401
    );
    assert_eq!(
        status(&c, &format!("{base}/api/v1/stats"), Some(KEY)).await,
        200
    );
    assert_eq!(status(&c, &format!("{base}/workers"), Some(KEY)).await, 200);
    for open in [
        "/health",
        "/liveness",
        "/metrics",
        "/v1/models",
        "/docs/",
        "/api-docs/openapi.json",
    ] {
        assert_eq!(
            status(&c, &format!("{base}{open}"), None).await,
            200,
            "{open}"
        );
    }
    assert_eq!(lease_ttl_of_a_fresh_object(&c, &base, "obj-1").await, 1234);
    // The process serves the document of its settings: the admin key on the admin plane.
    let served = json_of(&c, &format!("{base}/api-docs/openapi.json")).await;
    let expected = gateway::launch::document(gateway::config::ServeConfig {
        admin_api_key: Some(gateway::config::Secret::new(KEY)),
        ..Default::default()
    })
    .unwrap();
    assert!(
        served == serde_json::to_value(&expected).unwrap(),
        "serve's document is not the one of its settings"
    );
    assert_eq!(
        served["paths"]["/workers"]["get"]["security"],
        json!([{"admin_api_key": []}])
    );
    assert!(
        served != committed_openapi(),
        "the committed document has no admin key"
    );
    let metrics = text_of(&c, &format!("{base}/metrics")).await;
    assert!(metrics.contains("moongate_master_keys 1"), "{metrics}");

    let log = p.terminate();
    assert!(log.contains("refused"), "{log}");
    assert!(
        !log.contains(KEY) && !log.contains(WRONG),
        "a key was logged:\n{log}"
    );
}

#[tokio::test]
async fn serve_process_without_the_master() {
    let p = Proc::start(
        moongate()
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .env("MOONGATE_DISABLE_MASTER", "true"),
    );
    let c = reqwest::Client::new();
    assert_eq!(
        status(&c, &format!("{}/api/v1/stats", p.base), None).await,
        404
    );
    assert_eq!(status(&c, &format!("{}/workers", p.base), None).await, 200);
    let doc = json_of(&c, &format!("{}/api-docs/openapi.json", p.base)).await;
    assert!(
        doc == openapi_of("gateway"),
        "the process and `moongate openapi` disagree"
    );
    assert!(doc["paths"]["/api/v1/stats"].is_null());
    p.terminate();
}

#[tokio::test]
async fn master_process_alone() {
    let p = Proc::start(
        moongate()
            .args([
                "master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--log-level",
                "debug",
            ])
            .env("MOONGATE_ADMIN_API_KEY", KEY)
            .env("MOONGATE_MASTER_LEASE_TTL_MS", "2345"),
    );
    let c = reqwest::Client::new();
    let base = p.base.clone();
    assert_eq!(
        json_of(&c, &format!("{base}/health")).await["status"],
        "alive"
    );
    // The probes are open: liveness, and readiness (a master alone always answers).
    assert_eq!(status(&c, &format!("{base}/liveness"), None).await, 200);
    assert_eq!(
        json_of(&c, &format!("{base}/readiness")).await["status"],
        "ready"
    );
    assert_eq!(
        status(&c, &format!("{base}/api/v1/segments"), None).await,
        401
    );
    assert_eq!(
        status(&c, &format!("{base}/api/v1/segments"), Some(WRONG)).await,
        401
    );
    assert_eq!(
        status(&c, &format!("{base}/metadata?key=x"), Some(KEY)).await,
        404
    );
    assert_eq!(lease_ttl_of_a_fresh_object(&c, &base, "obj-2").await, 2345);
    let metrics = text_of(&c, &format!("{base}/metrics")).await;
    assert!(metrics.contains("moongate_master_keys 1"), "{metrics}");
    assert!(
        metrics.contains("moongate_master_requests_total{op=\"put_start\"} 1"),
        "{metrics}"
    );
    let ui = c.get(format!("{base}/docs/")).send().await.unwrap();
    assert_eq!(ui.status(), 200);
    let served = json_of(&c, &format!("{base}/api-docs/openapi.json")).await;
    let expected = gateway::master::document(gateway::config::MasterHostConfig {
        admin_api_key: Some(gateway::config::Secret::new(KEY)),
        ..Default::default()
    })
    .unwrap();
    assert!(
        served == serde_json::to_value(&expected).unwrap(),
        "the process and `gateway::master::document` disagree"
    );
    let plain = openapi_of("master");
    assert_eq!(
        served["paths"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        plain["paths"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        "the process and `moongate openapi --of master` serve other routes"
    );

    let log = p.terminate();
    assert!(log.contains("moongate master listening"), "{log}");
    assert!(
        !log.contains(KEY) && !log.contains(WRONG),
        "a key was logged:\n{log}"
    );
}

#[test]
fn openapi_subcommand_prints_the_committed_document() {
    assert!(
        openapi_of("serve") == committed_openapi(),
        "openapi/openapi.json is stale: cargo run -p gateway -- openapi -o openapi/openapi.json"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("doc.json");
    let run = moongate()
        .args(["openapi", "--of", "master", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(written["info"]["title"], "Moongate KV master");
    assert!(written["paths"]["/v1/chat/completions"].is_null());
}

#[test]
fn master_settings_merge_file_env_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("moongate.toml");
    std::fs::write(
        &file,
        "port = 4100\nadmin_api_key = \"from-file\"\n[master]\nlease_ttl_ms = 5000\nclient_ttl_ms = 6000\neviction_high_watermark = 0.8\n",
    )
    .unwrap();
    for cmd in ["master", "serve"] {
        let out = moongate()
            .args([cmd, "--print-config", "--config"])
            .arg(&file)
            .args(["--master-client-ttl-ms", "7000"])
            .env("MOONGATE_MASTER_LEASE_TTL_MS", "5500")
            .env("MOONGATE_MASTER_EVICTION_RATIO", "0.2")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        for needle in [
            "port = 4100",
            "lease_ttl_ms = 5500",
            "client_ttl_ms = 7000",
            "eviction_high_watermark = 0.8",
            "eviction_ratio = 0.2",
            "admin_api_key = \"<hidden>\"",
            "[master]",
        ] {
            assert!(
                text.contains(needle),
                "{cmd}: {needle} missing from\n{text}"
            );
        }
        assert!(!text.contains("from-file"), "{cmd} printed the key");
    }
    let out = moongate()
        .args([
            "master",
            "--master-eviction-ratio",
            "2",
            "--master-shards",
            "3",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("eviction_ratio"), "{err}");
}

#[tokio::test]
async fn a_storage_node_mounts_on_a_keyed_serve_only_with_an_accepted_key() {
    let p = Proc::start(moongate().args([
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--admin-api-key",
        KEY,
    ]));
    let node = |key: &str| {
        let mut c = moongate();
        c.args(["store", "--master", &p.base, "--segment-size", "8M"])
            .args(["--local-buffer-size", "4M", "--listen", "127.0.0.1:0"])
            .args(["--http-listen", "127.0.0.1:0"])
            .env("MOONGATE_STORE_API_KEY", key);
        c
    };
    // With a key the master does not accept the node cannot mount: it exits at once with
    // the master's reason (a wrong key is not retried like a master that is not up yet).
    let mut keyless = node("not-the-key")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut exited = None;
    for _ in 0..200 {
        exited = keyless.try_wait().unwrap();
        if exited.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let Some(status) = exited else {
        let _ = keyless.kill();
        panic!("a storage node with a wrong key kept running");
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut keyless.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("unauthorized"), "{err}");

    let mut keyed = node(KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(keyed.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert!(ready.contains("mounted true"), "{ready}");
    let c = reqwest::Client::new();
    let segs: Value = c
        .get(format!("{}/api/v1/segments", p.base))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(segs["segments"].as_array().unwrap().len(), 1, "{segs}");
    let _ = keyed.kill();
    let _ = keyed.wait();
    p.terminate();
}
