//! Bad input to every kind of route answers a typed 4xx (Mooncake name and code) and
//! changes nothing.

mod common;

use common::{CLIENT, Server, WRITER, assert_error};
use serde_json::{Value, json};

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let s = Server::start().await;
    s.mount("seg", 0).await;
    s.put("k", 100).await;
    s.call(
        "POST",
        "/api/v1/objects/p/put-start",
        Some(json!({"client_id": WRITER, "length": 8})),
    )
    .await;
    let before = s.snapshot().await;
    let start = |key: &str| format!("/api/v1/objects/{key}/put-start");

    // Unknown key.
    for (m, path) in [
        ("GET", "/api/v1/objects/nope/replicas"),
        ("GET", "/api/v1/objects/nope"),
        ("DELETE", "/api/v1/objects/nope"),
    ] {
        assert_error(&s.call(m, path, None).await, 404, "OBJECT_NOT_FOUND", -704);
    }
    for path in [
        "/api/v1/objects/nope/put-end",
        "/api/v1/objects/nope/put-revoke",
    ] {
        let got = s
            .call("POST", path, Some(json!({"client_id": WRITER})))
            .await;
        assert_error(&got, 404, "OBJECT_NOT_FOUND", -704);
    }

    // Bad JSON: syntax, missing field, wrong type, unknown field, wrong content.
    for body in [
        "{not json",
        r#"{"client_id": "00000000-0000-0000-0000-000000000007"}"#,
        r#"{"client_id": "00000000-0000-0000-0000-000000000007", "length": "ten"}"#,
        r#"{"client_id": "00000000-0000-0000-0000-000000000007", "length": 8, "colour": 1}"#,
        r#"[1, 2]"#,
        // The struct's fields as an array, in order: serde takes that, no document does.
        r#"["00000000-0000-0000-0000-000000000007", 8]"#,
        r#" ["00000000-0000-0000-0000-000000000007", 8, {"replica_num": 1}]"#,
    ] {
        let got = s.raw("POST", &start("new"), body).await;
        assert_error(&got, 400, "INVALID_PARAMS", -600);
    }
    // A placement config that cannot be used fails a batch even without items.
    let got = s
        .call(
            "POST",
            "/api/v1/batch/put-start",
            Some(json!({"client_id": WRITER, "items": [], "config": {"replica_num": 0}})),
        )
        .await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);
    // So does it for a commit, whose config places only the new reservations.
    let got = s
        .call(
            "POST",
            "/api/v1/batch/put-commit",
            Some(json!({"client_id": WRITER, "items": [], "config": {"replica_num": 0}})),
        )
        .await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);
    // A reservation no object could fill fails the request, single and batch.
    let reserve = json!({"length": 0, "count": 1});
    let got = s
        .call(
            "POST",
            &start("r"),
            Some(json!({"client_id": WRITER, "length": 8, "reserve": reserve})),
        )
        .await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);
    let got = s
        .call(
            "POST",
            "/api/v1/batch/put-start",
            Some(json!({"client_id": WRITER, "items": [], "reserve": reserve})),
        )
        .await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);
    // An empty regex is refused, alone or beside all=true (the document requires one
    // character).
    for q in ["regex=", "all=true&regex="] {
        let got = s
            .call("DELETE", &format!("/api/v1/objects?{q}"), None)
            .await;
        assert_error(&got, 400, "INVALID_PARAMS", -600);
    }
    let got = s
        .raw("POST", "/api/v1/batch/replicas", "{\"keys\": 7}")
        .await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);
    let got = s
        .raw("POST", &format!("/api/v1/clients/{CLIENT}/remount"), "{}")
        .await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);

    // Negative, zero and huge sizes.
    for length in [
        json!(-1),
        json!(0),
        json!(1u64 << 63),
        json!(1e30),
        json!(u64::MAX),
    ] {
        let got = s
            .call(
                "POST",
                &start("new"),
                Some(json!({"client_id": WRITER, "length": length})),
            )
            .await;
        assert_error(&got, 400, "INVALID_PARAMS", -600);
    }
    for size in [json!(-4096), json!(0), json!(1u64 << 62)] {
        let got = s
            .call(
                "POST",
                &format!("/api/v1/clients/{CLIENT}/segments"),
                Some(json!({"name": "big", "base": 0, "size": size, "endpoint": "te"})),
            )
            .await;
        assert_error(&got, 400, "INVALID_PARAMS", -600);
    }
    for cfg in [
        json!({"replica_num": 0}),
        json!({"replica_num": 1000}),
        json!({"replica_num": -1}),
    ] {
        let got = s
            .call(
                "POST",
                &start("new"),
                Some(json!({"client_id": WRITER, "length": 8, "config": cfg})),
            )
            .await;
        assert_error(&got, 400, "INVALID_PARAMS", -600);
    }
    let huge_batch: Vec<String> = (0..5000).map(|i| format!("k{i}")).collect();
    let got = s
        .call(
            "POST",
            "/api/v1/batch/exists",
            Some(json!({"keys": huge_batch})),
        )
        .await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);

    // Bad client ids, keys and ownership.
    let got = s
        .call(
            "POST",
            &start("new"),
            Some(json!({"client_id": "not-a-uuid", "length": 8})),
        )
        .await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);
    let got = s.call("POST", "/api/v1/clients/zzz/ping", None).await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);
    let long_key = "x".repeat(5000);
    let got = s
        .call("GET", &format!("/api/v1/objects/{long_key}/replicas"), None)
        .await;
    assert_error(&got, 400, "INVALID_KEY", -400);
    let got = s
        .call(
            "POST",
            "/api/v1/objects/p/put-end",
            Some(json!({"client_id": CLIENT})),
        )
        .await;
    assert_error(&got, 403, "ILLEGAL_CLIENT", -601);
    let got = s
        .call(
            "POST",
            "/api/v1/objects/k/put-revoke",
            Some(json!({"client_id": WRITER})),
        )
        .await;
    assert_error(&got, 409, "INVALID_WRITE", -700);
    let got = s
        .call(
            "POST",
            &start("k"),
            Some(json!({"client_id": WRITER, "length": 8})),
        )
        .await;
    assert_error(&got, 409, "OBJECT_ALREADY_EXISTS", -705);
    assert_error(
        &s.call("DELETE", "/api/v1/objects/p", None).await,
        409,
        "REPLICA_IS_NOT_READY",
        -703,
    );

    // Unknown segment and client.
    let got = s
        .call(
            "DELETE",
            &format!("/api/v1/clients/{CLIENT}/segments/nope"),
            None,
        )
        .await;
    assert_error(&got, 404, "SEGMENT_NOT_FOUND", -101);
    assert_error(
        &s.call("GET", "/api/v1/segments/nope", None).await,
        404,
        "SEGMENT_NOT_FOUND",
        -101,
    );
    let stranger = "00000000-0000-0000-0000-0000000000ff";
    assert_error(
        &s.call("GET", &format!("/api/v1/clients/{stranger}"), None)
            .await,
        404,
        "CLIENT_NOT_FOUND",
        -103,
    );
    assert_error(
        &s.call("DELETE", &format!("/api/v1/clients/{stranger}"), None)
            .await,
        404,
        "CLIENT_NOT_FOUND",
        -103,
    );
    let got = s
        .call(
            "POST",
            &format!("/api/v1/clients/{CLIENT}/segments"),
            Some(json!({"name": "a/b", "base": 0, "size": 4096, "endpoint": "te"})),
        )
        .await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);
    let got = s
        .call(
            "POST",
            &format!("/api/v1/clients/{CLIENT}/segments"),
            Some(json!({"name": "overlap", "base": 4096, "size": 4096, "endpoint": "te-seg"})),
        )
        .await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);

    // Invalid regex and bad query strings.
    for path in [
        "/api/v1/objects?regex=(",
        "/api/v1/objects",
        "/api/v1/objects?all=true&regex=k",
        "/api/v1/objects?all=maybe",
        "/api/v1/objects/k?force=perhaps",
    ] {
        assert_error(
            &s.call("DELETE", path, None).await,
            400,
            "INVALID_PARAMS",
            -600,
        );
    }
    for path in [
        "/api/v1/objects?limit=abc",
        "/api/v1/objects?limit=0",
        "/api/v1/objects?limit=100000",
        "/api/v1/objects?colour=red",
    ] {
        assert_error(
            &s.call("GET", path, None).await,
            400,
            "INVALID_PARAMS",
            -600,
        );
    }

    assert_eq!(
        s.snapshot().await,
        before,
        "a refused request changed state"
    );
}

/// JSON bodies: a wrong or missing content type and an oversized body are refused like bad
/// JSON; a bad body's message says where it went wrong.
#[tokio::test]
async fn json_bodies_are_checked_whatever_the_path_they_take() {
    let s = Server::start().await;
    let url = s.url("/api/v1/batch/exists");
    let send = |ct: Option<&'static str>, body: Vec<u8>| {
        let mut r = s.http.post(url.clone()).body(body);
        if let Some(ct) = ct {
            r = r.header("content-type", ct);
        }
        async move {
            let resp = r.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let ok = br#"{"keys": ["a"]}"#.to_vec();
    assert_eq!(send(Some("application/json"), ok.clone()).await.0, 200);
    assert_eq!(
        send(Some("application/json; charset=utf-8"), ok.clone())
            .await
            .0,
        200
    );
    for ct in [None, Some("text/plain")] {
        let got = send(ct, ok.clone()).await;
        assert_error(&got, 400, "INVALID_PARAMS", -600);
        let msg = got.1["error"]["message"].as_str().unwrap();
        assert!(msg.contains("Content-Type"), "{msg}");
    }
    let got = send(Some("application/json"), br#"{"keys": ["a", 7]}"#.to_vec()).await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);
    let msg = got.1["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("keys[1]"),
        "the message names the field: {msg}"
    );
    let huge = format!(
        "{{\"keys\": [\"{}\"]}}",
        "k".repeat(kvmaster::rest::BODY_LIMIT)
    );
    let got = send(Some("application/json"), huge.into_bytes()).await;
    assert_error(&got, 400, "INVALID_PARAMS", -600);
    // `application/*+json` is JSON too; a list one item over `max_batch_items` is not.
    assert_eq!(send(Some("application/cloudevents+json"), ok).await.0, 200);
    let limit = kvmaster::MasterConfig::default().max_batch_items;
    for (n, status) in [(limit, 200), (limit + 1, 400)] {
        let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        let body = serde_json::to_vec(&serde_json::json!({ "keys": keys })).unwrap();
        let got = send(Some("application/json"), body).await;
        assert_eq!(got.0, status, "{n} keys: {}", got.1);
        if status == 400 {
            assert_error(&got, 400, "INVALID_PARAMS", -600);
            let msg = got.1["error"]["message"].as_str().unwrap();
            assert!(msg.contains(&format!("more than {limit} items")), "{msg}");
        }
    }
}
