//! Helpers for the simulated-worker tests: start a worker on 127.0.0.1:0, speak HTTP to it.

#![allow(dead_code)]

use serde_json::Value;
use sim::{SimConfig, SimHandle};

/// Starts a worker with `cfg` on a free loopback port.
pub async fn start(cfg: SimConfig) -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    sim::spawn(cfg, listener).await.unwrap()
}

/// A worker with the default config.
pub async fn start_default() -> SimHandle {
    start(SimConfig::default()).await
}

/// POSTs `body` (raw bytes) and returns the status and the body parsed as JSON.
pub async fn post_raw(url: &str, body: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, v)
}

/// POSTs a JSON body; returns the status and JSON answer.
pub async fn post(url: &str, body: &Value) -> (u16, Value) {
    post_raw(url, &body.to_string()).await
}

/// GETs `url`; returns the status and the body text.
pub async fn get(url: &str) -> (u16, String) {
    let resp = reqwest::get(url).await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// GETs `url` and parses the body as JSON.
pub async fn get_json(url: &str) -> Value {
    let (status, text) = get(url).await;
    assert_eq!(status, 200, "{url}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// POSTs a streaming request; returns the content type and the `data:` events, the
/// JSON ones parsed, and checks the stream ends with exactly one `data: [DONE]`.
pub async fn stream(url: &str, body: &Value) -> (String, Vec<Value>) {
    let resp = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let ctype = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data event: {e:?}"))
        })
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let json = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    (ctype, json)
}
