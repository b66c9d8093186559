//! Every route of the master's REST API over a real socket with a real HTTP client.

mod common;

use common::{CLIENT, Server, WRITER, assert_error};
use serde_json::json;

#[tokio::test]
async fn object_lifecycle_over_http() {
    let s = Server::start().await;
    s.mount("seg-a", 0x7f00_0000_0000).await;
    let (st, b) = s
        .call(
            "POST",
            "/api/v1/objects/page%2F1/put-start",
            Some(json!({"client_id": WRITER, "length": 4096, "config": {"replica_num": 1, "preferred_segments": ["seg-a"]}})),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["key"], "page/1");
    let replica = &b["replicas"][0];
    assert_eq!(replica["segment"], "seg-a");
    assert_eq!(replica["endpoint"], "te-seg-a");
    assert_eq!(replica["length"], 4096);
    let addr = replica["address"].as_u64().unwrap();
    assert!((0x7f00_0000_0000..0x7f00_0000_0000 + (1 << 20)).contains(&addr));

    let before_end = s
        .call("GET", "/api/v1/objects/page%2F1/replicas", None)
        .await;
    assert_error(&before_end, 409, "REPLICA_IS_NOT_READY", -703);
    let (st, b) = s.call("GET", "/api/v1/objects/page%2F1/exists", None).await;
    assert_eq!((st, &b["exists"]), (200, &json!(false)));
    let (st, b) = s.call("GET", "/api/v1/objects/page%2F1", None).await;
    assert_eq!((st, &b["status"]), (200, &json!("processing")), "{b}");

    let (st, _) = s
        .call(
            "POST",
            "/api/v1/objects/page%2F1/put-end",
            Some(json!({"client_id": WRITER})),
        )
        .await;
    assert_eq!(st, 204);
    let (st, b) = s
        .call("GET", "/api/v1/objects/page%2F1/replicas", None)
        .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["lease_ttl_ms"], 10_000);
    assert_eq!(b["length"], 4096);
    assert_eq!(b["replicas"][0]["address"].as_u64(), Some(addr));
    let (st, b) = s.call("GET", "/api/v1/objects/page%2F1/exists", None).await;
    assert_eq!(
        (st, &b["exists"], &b["lease_ttl_ms"]),
        (200, &json!(true), &json!(10_000))
    );
    let (st, b) = s.call("GET", "/api/v1/objects/page%2F1", None).await;
    assert_eq!(st, 200);
    assert_eq!(b["status"], "complete");
    assert_eq!(b["client_id"], WRITER);
    assert!(b["lease_remaining_ms"].as_u64().unwrap() > 9_000);

    let leased = s.call("DELETE", "/api/v1/objects/page%2F1", None).await;
    assert_error(&leased, 409, "OBJECT_HAS_LEASE", -706);
    let (st, b) = s
        .call("DELETE", "/api/v1/objects/page%2F1?force=true", None)
        .await;
    assert_eq!((st, &b["removed"]), (200, &json!(1)));
    let gone = s.call("GET", "/api/v1/objects/page%2F1", None).await;
    assert_error(&gone, 404, "OBJECT_NOT_FOUND", -704);

    // Revoke frees the key.
    let (st, _) = s
        .call(
            "POST",
            "/api/v1/objects/k/put-start",
            Some(json!({"client_id": WRITER, "length": 10})),
        )
        .await;
    assert_eq!(st, 200);
    let (st, _) = s
        .call(
            "POST",
            "/api/v1/objects/k/put-revoke",
            Some(json!({"client_id": WRITER})),
        )
        .await;
    assert_eq!(st, 204);
    let (_, stats) = s.call("GET", "/api/v1/stats", None).await;
    assert_eq!(
        (stats["keys"].as_u64(), stats["allocated_bytes"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test]
async fn listing_and_bulk_removal() {
    let s = Server::start().await;
    s.mount("seg", 0).await;
    for k in ["a1", "a2", "a3", "b1", "b2"] {
        s.put(k, 64).await;
    }
    let (st, b) = s
        .call("GET", "/api/v1/objects?prefix=a&limit=2", None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(b, json!({"keys": ["a1", "a2"], "next_after": "a2"}));
    let (_, b) = s
        .call("GET", "/api/v1/objects?prefix=a&limit=2&after=a2", None)
        .await;
    assert_eq!(b, json!({"keys": ["a3"]}));
    s.call("GET", "/api/v1/objects/b1/replicas", None).await;
    let (st, b) = s.call("DELETE", "/api/v1/objects?regex=%5Ea", None).await;
    assert_eq!((st, &b["removed"]), (200, &json!(3)));
    let (st, b) = s.call("DELETE", "/api/v1/objects?all=true", None).await;
    assert_eq!((st, &b["removed"]), (200, &json!(1)), "b1 is leased");
    let (_, b) = s.call("GET", "/api/v1/objects", None).await;
    assert_eq!(b["keys"], json!(["b1"]));
}

#[tokio::test]
async fn batch_forms() {
    let s = Server::start().await;
    s.mount("seg", 0).await;
    s.put("old", 64).await;
    let (st, b) = s
        .call(
            "POST",
            "/api/v1/batch/put-start",
            Some(json!({"client_id": WRITER, "items": [{"key": "x", "length": 100}, {"key": "old", "length": 1}, {"key": "y", "length": 0}]})),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    let r = b["results"].as_array().unwrap();
    assert_eq!(r[0]["replicas"][0]["segment"], "seg");
    assert_eq!(r[1]["error"]["type"], "OBJECT_ALREADY_EXISTS");
    assert_eq!(r[2]["error"]["code"], -600);

    let (st, b) = s
        .call(
            "POST",
            "/api/v1/batch/put-end",
            Some(json!({"client_id": WRITER, "keys": ["x", "nope"]})),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(b["results"][0], json!({"key": "x"}));
    assert_eq!(b["results"][1]["error"]["type"], "OBJECT_NOT_FOUND");

    let (st, b) = s
        .call(
            "POST",
            "/api/v1/batch/replicas",
            Some(json!({"keys": ["x", "old", "nope"]})),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(b["results"][0]["length"], 100);
    assert_eq!(b["results"][0]["lease_ttl_ms"], 10_000);
    assert_eq!(b["results"][1]["replicas"][0]["segment"], "seg");
    assert_eq!(b["results"][2]["error"]["code"], -704);

    let (st, b) = s
        .call(
            "POST",
            "/api/v1/batch/exists",
            Some(json!({"keys": ["x", "nope", ""]})),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(
        b["results"][0],
        json!({"key": "x", "exists": true, "lease_ttl_ms": 10_000})
    );
    assert_eq!(b["results"][1], json!({"key": "nope", "exists": false}));
    assert_eq!(b["results"][2]["error"]["type"], "INVALID_KEY");

    let (_, b) = s
        .call(
            "POST",
            "/api/v1/batch/remove",
            Some(json!({"keys": ["x", "old"]})),
        )
        .await;
    assert_eq!(b["results"][0]["error"]["type"], "OBJECT_HAS_LEASE");
    let (_, b) = s
        .call(
            "POST",
            "/api/v1/batch/remove",
            Some(json!({"keys": ["x", "old"], "force": true})),
        )
        .await;
    assert_eq!(b["results"], json!([{"key": "x"}, {"key": "old"}]));

    s.call(
        "POST",
        "/api/v1/batch/put-start",
        Some(json!({"client_id": WRITER, "items": [{"key": "z", "length": 8}]})),
    )
    .await;
    let (_, b) = s
        .call(
            "POST",
            "/api/v1/batch/put-revoke",
            Some(json!({"client_id": WRITER, "keys": ["z"]})),
        )
        .await;
    assert_eq!(b["results"], json!([{"key": "z"}]));
    let (_, stats) = s.call("GET", "/api/v1/stats", None).await;
    assert_eq!(stats["keys"], 0);
}

#[tokio::test]
async fn clients_and_segments() {
    let s = Server::start().await;
    let other = "00000000-0000-0000-0000-000000000002";
    let (st, b) = s
        .call("POST", &format!("/api/v1/clients/{other}/ping"), None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(b["status"], "need_remount");
    let view = b["view_version"].as_u64().unwrap();
    let (st, b) = s
        .call(
            "POST",
            &format!("/api/v1/clients/{other}/remount"),
            Some(json!({"segments": [{"name": "o1", "base": 0, "size": 65536, "endpoint": "te-o"},
                                      {"name": "o2", "base": 65536, "size": 65536, "endpoint": "te-o"}]})),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["status"], "ok");
    assert_eq!(b["segments"], json!(["o1", "o2"]));
    let (_, b) = s
        .call("POST", &format!("/api/v1/clients/{other}/ping"), None)
        .await;
    assert_eq!(
        (b["status"].as_str(), b["view_version"].as_u64()),
        (Some("ok"), Some(view))
    );

    s.mount("mine", 1 << 40).await;
    let (st, b) = s.call("GET", "/api/v1/segments", None).await;
    assert_eq!(st, 200);
    let names: Vec<_> = b["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].clone())
        .collect();
    assert_eq!(names, [json!("mine"), json!("o1"), json!("o2")]);
    let (st, b) = s.call("GET", "/api/v1/segments/o1", None).await;
    assert_eq!(st, 200);
    assert_eq!(
        (b["client_id"].as_str(), b["capacity_bytes"].as_u64()),
        (Some(other), Some(65536))
    );
    let (st, b) = s.call("GET", "/api/v1/clients", None).await;
    assert_eq!(st, 200);
    assert_eq!(b["clients"].as_array().unwrap().len(), 2);
    let (st, b) = s
        .call("GET", &format!("/api/v1/clients/{CLIENT}"), None)
        .await;
    assert_eq!((st, &b["segments"]), (200, &json!(["mine"])));

    let foreign = s
        .call(
            "DELETE",
            &format!("/api/v1/clients/{CLIENT}/segments/o1"),
            None,
        )
        .await;
    assert_error(&foreign, 403, "ILLEGAL_CLIENT", -601);
    let taken = s
        .call(
            "POST",
            &format!("/api/v1/clients/{CLIENT}/segments"),
            Some(json!({"name": "o1", "base": 0, "size": 65536, "endpoint": "te-o"})),
        )
        .await;
    assert_error(&taken, 409, "SEGMENT_ALREADY_EXISTS", -102);
    let (st, _) = s
        .call(
            "DELETE",
            &format!("/api/v1/clients/{other}/segments/o1"),
            None,
        )
        .await;
    assert_eq!(st, 204);
    let (st, _) = s
        .call("DELETE", &format!("/api/v1/clients/{other}"), None)
        .await;
    assert_eq!(st, 204);
    let (_, b) = s.call("GET", "/api/v1/segments", None).await;
    assert_eq!(b["segments"].as_array().unwrap().len(), 1);
    let gone = s
        .call("GET", &format!("/api/v1/clients/{other}"), None)
        .await;
    assert_error(&gone, 404, "CLIENT_NOT_FOUND", -103);
}

#[tokio::test]
async fn metadata_store_is_mooncake_compatible() {
    let s = Server::start().await;
    let url = s.url("/metadata?key=mooncake%2Fram%2Fnode-1");
    let resp = s.http.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    // A descriptor (a JSON object) comes back as JSON; other bytes come back unchanged, as
    // octet-stream (the content type never claims JSON for what is not).
    let descriptor: &[u8] = b"{\"name\":\"node-1\",\"buffers\":[]}";
    let raw: &[u8] = b"{\"name\":\"node-1\"}\x00\xff raw";
    for (value, kind) in [
        (descriptor, "application/json"),
        (raw, "application/octet-stream"),
    ] {
        let resp = s.http.put(&url).body(value.to_vec()).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), "metadata updated");
        let resp = s.http.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], kind);
        assert_eq!(&resp.bytes().await.unwrap()[..], value);
    }
    let empty = s.http.put(&url).send().await.unwrap();
    assert_eq!(empty.status(), 400, "an empty value");
    let resp = s.http.put(&url).body("v2").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        s.http.get(&url).send().await.unwrap().text().await.unwrap(),
        "v2"
    );
    let resp = s.http.delete(&url).send().await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.text().await.unwrap()),
        (200, "metadata deleted".into())
    );
    assert_eq!(s.http.delete(&url).send().await.unwrap().status(), 404);
    assert_eq!(s.http.get(&url).send().await.unwrap().status(), 404);
    for bad in ["/metadata", "/metadata?key="] {
        let got = s.call("GET", bad, None).await;
        assert_error(&got, 400, "INVALID_KEY", -400);
        let got = s.call("PUT", bad, None).await;
        assert_error(&got, 400, "INVALID_KEY", -400);
    }
    assert!(s.master.metadata().is_empty());
}

#[tokio::test]
async fn openapi_document_describes_every_route() {
    let master =
        std::sync::Arc::new(kvmaster::Master::new(kvmaster::MasterConfig::default()).unwrap());
    let (_, doc) = kvmaster::router(master).split_for_parts();
    let json = serde_json::to_value(&doc).unwrap();
    let paths = json["paths"].as_object().unwrap();
    let want = [
        ("/api/v1/clients/{client_id}/segments", "post"),
        ("/api/v1/clients/{client_id}/remount", "post"),
        ("/api/v1/clients/{client_id}/segments/{name}", "delete"),
        ("/api/v1/clients/{client_id}/ping", "post"),
        ("/api/v1/clients", "get"),
        ("/api/v1/clients/{client_id}", "get"),
        ("/api/v1/clients/{client_id}", "delete"),
        ("/api/v1/segments", "get"),
        ("/api/v1/segments/{name}", "get"),
        ("/api/v1/stats", "get"),
        ("/api/v1/objects/{key}/put-start", "post"),
        ("/api/v1/objects/{key}/put-end", "post"),
        ("/api/v1/objects/{key}/put-revoke", "post"),
        ("/api/v1/objects/{key}/replicas", "get"),
        ("/api/v1/objects/{key}/exists", "get"),
        ("/api/v1/objects/{key}", "get"),
        ("/api/v1/objects/{key}", "delete"),
        ("/api/v1/objects", "get"),
        ("/api/v1/objects", "delete"),
        ("/api/v1/batch/put-start", "post"),
        ("/api/v1/batch/put-end", "post"),
        ("/api/v1/batch/put-revoke", "post"),
        ("/api/v1/batch/replicas", "post"),
        ("/api/v1/batch/exists", "post"),
        ("/api/v1/batch/put-commit", "post"),
        ("/api/v1/batch/remove", "post"),
        ("/api/v1/batch/replica-clear", "post"),
        ("/api/v1/segments/{name}/tier", "post"),
        ("/api/v1/segments/{name}/tier/detach", "post"),
        ("/api/v1/batch/replica-descs", "post"),
        ("/api/v1/batch/release-reads", "post"),
        ("/api/v1/events", "get"),
        ("/metadata", "get"),
        ("/metadata", "put"),
        ("/metadata", "delete"),
    ];
    let mut count = 0;
    let mut ids = std::collections::HashSet::new();
    for (path, ops) in paths {
        count += ops.as_object().unwrap().len();
        for (_, op) in ops.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap();
            assert!(
                id.starts_with("master_") && ids.insert(id.to_string()),
                "operationId {id}"
            );
            assert_eq!(op["tags"][0], "kv-master", "{path}");
            assert!(
                op["responses"]["404"].is_object(),
                "{path} documents its errors"
            );
        }
    }
    for (path, method) in want {
        assert!(
            paths[path][method].is_object(),
            "{method} {path} undocumented"
        );
    }
    assert_eq!(count, want.len());
    // Every $ref resolves.
    fn refs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    if k == "$ref" {
                        out.push(x.as_str().unwrap().to_string());
                    }
                    refs(x, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&json, &mut all);
    assert!(all.len() > 30);
    for r in all {
        let name = r.strip_prefix("#/components/schemas/").unwrap();
        assert!(
            json["components"]["schemas"][name].is_object(),
            "dangling {r}"
        );
    }
    assert_eq!(
        json["components"]["schemas"]["MetadataValue"]["format"],
        "binary"
    );
    for schema in [
        "MasterErrorResponse",
        "PutStartRequest",
        "ReplicasResponse",
        "BatchReplicasResponse",
        "PingResponse",
    ] {
        assert!(
            json["components"]["schemas"][schema].is_object(),
            "{schema}"
        );
    }
}
