//! Mooncake's master HTTP service (`--mooncake-http-port`, what `mooncake_master` serves on
//! its `--metrics_port`) over real sockets: the answers of `mooncake_master` 0.3.13.post1
//! (recorded from it, same routes, same states), SGLang's `MOONCAKE_CHECK_SERVER` poll, and
//! the admin plane in front of it, from a real non-loopback address of this host.

use std::sync::Arc;

use gateway::config::{MasterHostConfig, Secret, ServeConfig};
use http::Method;
use kvmaster::Master;
use kvmaster::master::ReplicateConfig;
use kvmaster::master::SegmentSpec;
use moongate_tests::{call, direct, fast_config, non_loopback_ip};
use serde_json::Value;

const ADMIN: &str = "adm1n-key";
const STORE: &str = "st0re-key";

fn master_cfg(host: &str) -> MasterHostConfig {
    MasterHostConfig {
        host: host.into(),
        port: 0,
        store_api_key: Some(Secret::new(STORE)),
        shutdown_grace_period_secs: 2,
        mooncake_http_port: Some(0),
        mooncake_http_host: host.into(),
        ..MasterHostConfig::default()
    }
}

async fn get(c: &reqwest::Client, base: &str, path: &str) -> (u16, String, String) {
    let resp = c.get(format!("{base}{path}")).send().await.unwrap();
    let status = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ctype, resp.text().await.unwrap())
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Mounts a 64 MiB segment for a new client and stores `key` (`len` bytes) on it.
fn mount_and_put(
    m: &Arc<Master>,
    name: &str,
    key: &str,
    len: u64,
) -> (kvmaster::master::ClientId, u64) {
    let client = kvmaster::master::ClientId::new_v4();
    let base = 0x7f00_0000_0000;
    let spec = SegmentSpec {
        name: name.into(),
        base,
        size: 64 << 20,
        endpoint: format!("{name}-te"),
        disk_bytes: 0,
        disk_write_through: false,
    };
    m.mount_segment(client, spec).unwrap();
    let cfg = ReplicateConfig::default();
    m.put_start(client, key, len, &cfg).unwrap();
    m.put_end(client, key).unwrap();
    (client, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_answers_as_mooncake_master_does() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let p = gateway::master::spawn_master(master_cfg("127.0.0.1"), listener)
        .await
        .unwrap();
    let base = format!("http://{}", p.mooncake_addr().expect("the service listens"));
    let c = direct();

    // Nothing mounted: SGLang's check reads an empty body and waits.
    let (status, ctype, body) = get(&c, &base, "/get_all_segments").await;
    assert_eq!(
        (status, ctype.as_str(), body.as_str()),
        (200, "text/plain; version=0.0.4", "")
    );
    let (status, _, body) = get(&c, &base, "/health").await;
    assert_eq!(status, 200);
    let h = json(&body);
    assert_eq!(
        (
            h["status"].as_str(),
            h["role"].as_str(),
            h["ha_state"].as_str(),
            h["service_ready"].as_bool()
        ),
        (Some("ok"), Some("leader"), Some("serving"), Some(true)),
        "{body}"
    );
    assert!(
        h["leader_address"].is_null() && h["view_version"].is_null(),
        "{body}"
    );
    for path in ["/query_key?key=foo", "/query_key"] {
        let (status, ctype, body) = get(&c, &base, path).await;
        assert_eq!(
            (status, ctype.as_str()),
            (404, "application/json; charset=utf-8"),
            "{path}"
        );
        let v = json(&body);
        assert_eq!(
            (
                v["success"].as_bool(),
                v["error_code"].as_i64(),
                v["error_message"].as_str()
            ),
            (Some(false), Some(-704), Some("OBJECT_NOT_FOUND")),
            "{path}: {body}"
        );
    }
    for path in ["/batch_query_keys", "/batch_query_keys?keys="] {
        let (status, _, body) = get(&c, &base, path).await;
        assert_eq!(status, 400, "{path}");
        assert_eq!(
            json(&body)["error"],
            "No keys provided. Use ?keys=key1,key2,..."
        );
    }
    let (status, _, body) = get(&c, &base, "/get_segments_detail").await;
    assert_eq!(
        (status, json(&body)),
        (
            200,
            serde_json::json!({"total_segments": 0, "segments": []})
        )
    );
    let (status, _, body) = get(&c, &base, "/query_segment?segment=x").await;
    assert_eq!((status, body.as_str()), (500, "Failed to query segment"));
    let (status, _, body) = get(&c, &base, "/nope").await;
    assert_eq!((status, body.as_str()), (404, "404 Not Found"));

    // A node mounts and stores two values.
    let m = p.master().clone();
    let (client, seg_base) = mount_and_put(&m, "127.0.0.1:12606", "foo", 1000);
    m.put_start(client, "bar", 5000, &ReplicateConfig::default())
        .unwrap();
    m.put_end(client, "bar").unwrap();
    m.put_start(client, "unfinished", 10, &ReplicateConfig::default())
        .unwrap();

    let (_, _, body) = get(&c, &base, "/get_all_segments").await;
    assert_eq!(body, "127.0.0.1:12606\n");
    let (status, _, body) = get(&c, &base, "/query_key?key=foo").await;
    assert_eq!(status, 200, "{body}");
    let v = json(&body);
    assert_eq!(v["success"], true);
    let d = &v["data"][0];
    assert_eq!(v["data"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(
        (d["size_"].as_u64(), d["transport_endpoint_"].as_str()),
        (Some(1000), Some("127.0.0.1:12606-te"))
    );
    let addr = d["buffer_address_"].as_u64().unwrap();
    assert!((seg_base..seg_base + (64 << 20)).contains(&addr), "{body}");
    // A put not yet ended is not readable: Mooncake's REPLICA_IS_NOT_READY.
    let (status, _, body) = get(&c, &base, "/query_key?key=unfinished").await;
    assert_eq!(
        (status, json(&body)["error_code"].as_i64()),
        (404, Some(-703)),
        "{body}"
    );

    let (status, _, body) = get(&c, &base, "/batch_query_keys?keys=foo,nokey").await;
    assert_eq!(status, 200);
    let v = json(&body);
    assert_eq!(v["success"], true);
    assert_eq!(v["data"]["foo"]["ok"], true);
    assert_eq!(v["data"]["foo"]["values"][0]["size_"], 1000);
    assert!(v["data"]["foo"]["disk_values"].is_null());
    assert_eq!(
        v["data"]["nokey"],
        serde_json::json!({"ok": false, "error": "OBJECT_NOT_FOUND", "values": null,
            "disk_values": null, "local_disk_values": null, "nof_values": null})
    );
    // More keys than a batch may hold are refused before they are looked at.
    let many = vec!["k"; m.config().max_batch_items + 1].join(",");
    let (status, _, _) = get(&c, &base, &format!("/batch_query_keys?keys={many}")).await;
    assert_eq!(status, 400);

    let (_, ctype, body) = get(&c, &base, "/get_all_keys").await;
    assert_eq!(ctype, "text/plain; version=0.0.4");
    let mut keys: Vec<&str> = body.lines().collect();
    keys.sort_unstable();
    assert_eq!(keys, ["bar", "foo", "unfinished"]);
    assert!(body.ends_with('\n'));

    let (_, _, body) = get(&c, &base, "/get_segments_detail").await;
    let v = json(&body);
    assert_eq!(v["total_segments"], 1);
    let s = &v["segments"][0];
    assert_eq!(
        (
            s["segment_name"].as_str(),
            s["size_bytes"].as_u64(),
            s["size_human"].as_str()
        ),
        (Some("127.0.0.1:12606"), Some(64 << 20), Some("0.0625 GiB"))
    );
    assert_eq!(s["base_address"], format!("{seg_base:#x}"));
    assert_eq!(s["client_id"], client.to_string());
    assert_eq!(
        (s["status"].as_str(), s["te_endpoint"].as_str()),
        (Some("OK"), Some("127.0.0.1:12606-te"))
    );
    let used = s["allocator_used_bytes"].as_u64().unwrap();
    assert!(used >= 6010, "{body}");
    let (status, _, body) = get(&c, &base, "/query_segment?segment=127.0.0.1:12606").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        format!(
            "127.0.0.1:12606\nUsed(bytes): {used}\nCapacity(bytes) : {}\n",
            64 << 20
        )
    );

    let (_, ctype, body) = get(&c, &base, "/metrics").await;
    assert_eq!(ctype, "text/plain; version=0.0.4");
    for line in [
        "master_key_count 3",
        "master_total_capacity_bytes 67108864",
        "segment_total_capacity_bytes{segment=\"127.0.0.1:12606\"} 67108864",
        "master_active_clients 1",
    ] {
        assert!(body.lines().any(|l| l == line), "{line} missing:\n{body}");
    }
    assert!(
        body.contains("moongate_master_"),
        "the process's own series follow"
    );
    let (_, _, body) = get(&c, &base, "/metrics/summary").await;
    assert!(
        body.starts_with("role=leader, state=serving, service_ready=true, master={Mem Storage: "),
        "{body}"
    );
    assert!(body.contains("Keys: 3 | Clients: 1"), "{body}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_is_on_the_admin_plane() {
    let far = non_loopback_ip().expect("this host has no non-loopback address to call from");
    let c = direct();
    // Without an admin key: loopback callers only.
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let p = gateway::master::spawn_master(master_cfg("0.0.0.0"), listener)
        .await
        .unwrap();
    let port = p.mooncake_addr().unwrap().port();
    let (lo, far_url) = (
        format!("http://127.0.0.1:{port}"),
        format!("http://{far}:{port}"),
    );
    for path in [
        "/get_all_segments",
        "/get_all_keys",
        "/query_key?key=k",
        "/metrics",
    ] {
        let (status, _, _) = call(&c, &lo, Method::GET, path, None).await;
        assert_ne!(status, 403, "loopback {path}");
        let (status, _, body) = call(&c, &far_url, Method::GET, path, None).await;
        assert_eq!(status, 403, "{far_url}{path}: {body}");
        assert!(body.contains("--insecure-open-admin"), "{body}");
        // The store key is not the admin key.
        let bearer = format!("Bearer {STORE}");
        let (status, _, _) = call(&c, &far_url, Method::GET, path, Some(&bearer)).await;
        assert_eq!(status, 403, "{path} with the store key");
    }
    p.shutdown().await;

    // With an admin key: everyone needs it, loopback too.
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let cfg = MasterHostConfig {
        admin_api_key: Some(Secret::new(ADMIN)),
        ..master_cfg("0.0.0.0")
    };
    let p = gateway::master::spawn_master(cfg, listener).await.unwrap();
    let port = p.mooncake_addr().unwrap().port();
    for base in [
        format!("http://127.0.0.1:{port}"),
        format!("http://{far}:{port}"),
    ] {
        let (status, www, _) = call(&c, &base, Method::GET, "/get_all_segments", None).await;
        assert_eq!((status, www.as_deref()), (401, Some("Bearer")), "{base}");
        let bearer = format!("Bearer {ADMIN}");
        let (status, _, body) =
            call(&c, &base, Method::GET, "/get_all_segments", Some(&bearer)).await;
        assert_eq!((status, body.as_str()), (200, ""), "{base}");
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_it_for_the_master_it_hosts() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = ServeConfig {
        store_api_key: Some(Secret::new(STORE)),
        mooncake_http_port: Some(0),
        mooncake_http_host: "127.0.0.1".into(),
        ..fast_config()
    };
    let gw = gateway::launch::spawn(cfg, listener).await.unwrap();
    let base = format!("http://{}", gw.mooncake_addr.expect("the service listens"));
    let c = direct();
    let (status, _, body) = get(&c, &base, "/health").await;
    assert_eq!(
        (status, json(&body)["service_ready"].as_bool()),
        (200, Some(true))
    );
    let m = gw
        .state()
        .master()
        .expect("the gateway hosts the master")
        .clone();
    mount_and_put(&m, "node-a:1", "k", 64);
    let (_, _, body) = get(&c, &base, "/get_all_segments").await;
    assert_eq!(body, "node-a:1\n");
    gw.shutdown().await;
}

#[test]
fn its_port_must_not_be_the_main_port_and_needs_a_master() {
    let cfg = MasterHostConfig {
        port: 50051,
        mooncake_http_port: Some(50051),
        ..MasterHostConfig::default()
    };
    let e = cfg.validate().unwrap_err().to_string();
    assert!(
        e.contains("mooncake_http_port must differ from port"),
        "{e}"
    );
    let cfg = ServeConfig {
        disable_master: true,
        mooncake_http_port: Some(9003),
        ..ServeConfig::default()
    };
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("drop --disable-master"), "{e}");
}
