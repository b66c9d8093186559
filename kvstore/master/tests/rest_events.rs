//! `GET /api/v1/events` over a real socket: a snapshot in parts, the changes after it in
//! order, a long poll woken by a put, a new snapshot for another epoch or a follower left
//! behind the events kept.

mod common;

use common::{Server, assert_error};
use kvmaster::MasterConfig;
use serde_json::{Value, json};

async fn events(s: &Server, query: &str) -> Value {
    let (st, b) = s.call("GET", &format!("/api/v1/events{query}"), None).await;
    assert_eq!(st, 200, "{b}");
    b
}

fn keys(b: &Value) -> Vec<(String, Value)> {
    b["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["key"].as_str().unwrap().to_owned(), e["held"].clone()))
        .collect()
}

#[tokio::test]
async fn a_follower_takes_a_snapshot_in_parts_then_each_change_in_order() {
    let s = Server::with_config(MasterConfig {
        shards: 4,
        ..MasterConfig::default()
    })
    .await;
    s.mount("seg", 0x7f00_0000_0000).await;
    for k in ["a", "b", "c", "d", "e", "f"] {
        s.put(k, 64).await;
    }
    // A snapshot of whole shards, at least `max` keys a part.
    let mut got = Vec::new();
    let first = events(&s, "?max=1").await;
    assert_eq!(first["snapshot"], true);
    let (epoch, next) = (
        first["epoch"].as_u64().unwrap(),
        first["next"].as_u64().unwrap(),
    );
    assert_eq!(next, 6);
    got.extend(keys(&first));
    let mut resume = first["resume"].clone();
    while let Some(c) = resume.as_u64() {
        let part = events(&s, &format!("?max=1&epoch={epoch}&from={next}&cursor={c}")).await;
        assert_eq!(
            (part["snapshot"].as_bool(), part["next"].as_u64()),
            (Some(true), Some(next))
        );
        got.extend(keys(&part));
        resume = part["resume"].clone();
    }
    got.sort_by(|x, y| x.0.cmp(&y.0));
    let want: Vec<(String, Value)> = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .map(|k| (k.to_string(), json!("memory")))
        .collect();
    assert_eq!(got, want);

    // Then the changes, in order; a removal has no `held`.
    let (st, _) = s.call("DELETE", "/api/v1/objects/b", None).await;
    assert_eq!(st, 200);
    let b = events(&s, &format!("?epoch={epoch}&from={next}")).await;
    assert_eq!(b["snapshot"], false);
    assert_eq!(
        (b["first"].as_u64(), b["next"].as_u64()),
        (Some(6), Some(7))
    );
    assert_eq!(keys(&b), [("b".to_owned(), Value::Null)]);

    // A long poll answers as soon as a put lands.
    let waiting = {
        let url = s.url(&format!(
            "/api/v1/events?epoch={epoch}&from=7&wait_ms=30000"
        ));
        let http = s.http.clone();
        tokio::spawn(async move {
            http.get(url)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    tokio::task::yield_now().await;
    s.put("g", 64).await;
    let woke = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("woken by the put")
        .unwrap();
    assert_eq!(keys(&woke), [("g".to_owned(), json!("memory"))]);

    // Another epoch (a restarted master) is answered with a snapshot.
    let other = events(&s, &format!("?epoch={}&from=8", epoch + 1)).await;
    assert_eq!(other["snapshot"], true);
    assert_eq!(other["epoch"].as_u64(), Some(epoch));
}

#[tokio::test]
async fn a_follower_behind_the_events_kept_starts_over_and_no_feed_is_an_error() {
    let s = Server::with_config(MasterConfig {
        events_buffer: 2,
        ..MasterConfig::default()
    })
    .await;
    s.mount("seg", 0x7f00_0000_0000).await;
    let first = events(&s, "").await;
    let epoch = first["epoch"].as_u64().unwrap();
    for k in ["a", "b", "c"] {
        s.put(k, 64).await;
    }
    let b = events(&s, &format!("?epoch={epoch}&from=0")).await;
    assert_eq!(b["snapshot"], true, "{b}");
    assert_eq!(b["next"].as_u64(), Some(3));
    assert_eq!(keys(&b).len(), 3);

    let off = Server::with_config(MasterConfig {
        events_buffer: 0,
        ..MasterConfig::default()
    })
    .await;
    let r = off.call("GET", "/api/v1/events", None).await;
    assert_error(&r, 400, "INVALID_PARAMS", -600);
    for bad in [
        "from=x",
        "max=0",
        "max=65537",
        "wait_ms=30001",
        "from=9223372036854775808",
    ] {
        let r = s.call("GET", &format!("/api/v1/events?{bad}"), None).await;
        assert_eq!(r.0, 400, "{bad}: {r:?}");
    }
}
