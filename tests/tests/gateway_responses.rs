//! The Responses API through the gateway to three simulated SGLang workers, each keeping
//! its responses in its own memory, routed round robin: a response's retrieve, input
//! items, cancel, delete and `previous_response_id` follow-ups all reach the worker that
//! made it (any other answers 404), streamed or not; an id made behind the gateway's back
//! is found by asking the workers; a response whose worker left is a clear 404.

use gateway::config::{PolicyKind, ServeConfig};
use gateway::launch::Gateway;
use moongate_tests::{eventually, fast_config, get_json, send_json, sse_json, start_gateway};
use serde_json::{Value, json};
use sim::{SimConfig, SimHandle};

async fn cluster() -> (Vec<SimHandle>, Gateway) {
    let mut workers = Vec::new();
    for _ in 0..3 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        // A long first-token time keeps a background response queued until cancelled.
        let cfg = SimConfig {
            ttft: std::time::Duration::from_secs(60),
            ..SimConfig::default()
        };
        workers.push(sim::spawn(cfg, l).await.unwrap());
    }
    let gw = start_gateway(ServeConfig {
        worker_urls: workers.iter().map(SimHandle::url).collect(),
        policy: PolicyKind::RoundRobin,
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 3).await;
    (workers, gw)
}

async fn status_of(c: &reqwest::Client, method: reqwest::Method, url: &str) -> (u16, Value) {
    let r = c.request(method, url).send().await.unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap())
}

#[tokio::test]
async fn a_response_and_its_follow_ups_stay_with_its_worker() {
    let (_workers, gw) = cluster().await;
    let c = reqwest::Client::new();
    let create = format!("{}/v1/responses", gw.url());
    let (st, first) = send_json(&c, &create, &json!({"input": "Tell me about the moon."})).await;
    assert_eq!(st, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("resp_"));
    // Round robin would spread these over all three workers; each reaches the holder.
    for _ in 0..4 {
        let got = get_json(&c, &format!("{create}/{id}")).await;
        assert_eq!(got["id"], id.as_str(), "{got}");
    }
    let mut last = id.clone();
    for turn in 0..3 {
        let (st, next) = send_json(
            &c,
            &create,
            &json!({"input": format!("And then {turn}?"), "previous_response_id": last}),
        )
        .await;
        assert_eq!(st, 200, "turn {turn}: {next}");
        last = next["id"].as_str().unwrap().to_string();
    }
    let items = get_json(&c, &format!("{create}/{last}/input_items?limit=10")).await;
    assert_eq!(items["data"].as_array().unwrap().len(), 4, "{items}");

    // Streamed: bound at its first event, so a follow-up right after it finds it.
    let r = c
        .post(&create)
        .json(&json!({"input": "stream it", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: response.created\n"), "{text}");
    let events = sse_json(&text);
    let sid = events[0]["response"]["id"].as_str().unwrap().to_string();
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    let (st, v) = send_json(
        &c,
        &create,
        &json!({"input": "more", "previous_response_id": sid}),
    )
    .await;
    assert_eq!(st, 200, "{v}");

    // Background: queued, cancelled on its worker.
    let (_, bg) = send_json(&c, &create, &json!({"input": "later", "background": true})).await;
    assert_eq!(bg["status"], "queued");
    let bid = bg["id"].as_str().unwrap();
    let (st, v) = status_of(&c, reqwest::Method::POST, &format!("{create}/{bid}/cancel")).await;
    assert_eq!((st, v["status"].as_str()), (200, Some("cancelled")), "{v}");
    // Cancelling a finished one: the worker's 400, in the envelope.
    let (st, v) = status_of(&c, reqwest::Method::POST, &format!("{create}/{id}/cancel")).await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Cannot cancel"),
        "{v}"
    );

    // Delete: gone from its worker, and then not found anywhere.
    let (st, v) = status_of(&c, reqwest::Method::DELETE, &format!("{create}/{id}")).await;
    assert_eq!((st, v["deleted"].as_bool()), (200, Some(true)), "{v}");
    let (st, v) = status_of(&c, reqwest::Method::GET, &format!("{create}/{id}")).await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("response_not_found")),
        "{v}"
    );
    assert_eq!(gw.state().homes().home(&id), None);
    gw.shutdown().await;
}

#[tokio::test]
async fn unknown_ids_are_found_and_lost_workers_are_clear() {
    let (workers, gw) = cluster().await;
    let c = reqwest::Client::new();
    let create = format!("{}/v1/responses", gw.url());
    // Made on the third worker directly (another gateway replica, or before a restart).
    let (_, made) = send_json(
        &c,
        &format!("{}/v1/responses", workers[2].url()),
        &json!({"input": "behind the gateway's back"}),
    )
    .await;
    let id = made["id"].as_str().unwrap();
    assert_eq!(gw.state().homes().home(id), None);
    let got = get_json(&c, &format!("{create}/{id}")).await;
    assert_eq!(got["id"], id);
    assert_eq!(gw.state().homes().home(id), Some(workers[2].url()));
    for _ in 0..3 {
        let (st, v) = send_json(
            &c,
            &create,
            &json!({"input": "go on", "previous_response_id": id}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
    }

    // Its worker leaves: follow-ups and retrieval are a clear 404, no other worker asked
    // to continue a conversation it does not hold.
    let holder = gw
        .state()
        .registry()
        .snapshot()
        .iter()
        .find(|w| w.url().as_str().trim_end_matches('/') == workers[2].url())
        .unwrap()
        .id()
        .to_string();
    gw.state().registry().remove(&holder);
    let (st, v) = send_json(
        &c,
        &create,
        &json!({"input": "x", "previous_response_id": id}),
    )
    .await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("previous_response_not_found")),
        "{v}"
    );
    let (st, v) = status_of(&c, reqwest::Method::GET, &format!("{create}/{id}")).await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("response_not_found")),
        "{v}"
    );

    // An id no worker has: asked once, then answered from memory for a while.
    let gone = format!("{create}/resp_nobody_has_this");
    let (st, _) = status_of(&c, reqwest::Method::GET, &gone).await;
    assert_eq!(st, 404);
    assert!(gw.state().homes().recently_missed("resp_nobody_has_this"));

    // Ids that cannot be one: 404 without asking anyone.
    for bad in ["a%2Fb", "a%20b", &"r".repeat(300)] {
        let (st, v) = status_of(&c, reqwest::Method::GET, &format!("{create}/{bad}")).await;
        assert_eq!(st, 404, "{bad}: {v}");
    }
    gw.shutdown().await;
}
