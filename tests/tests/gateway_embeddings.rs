//! `POST /v1/embeddings` through the gateway to simulated SGLang workers: single and batch
//! inputs (strings and token ids) come back in order, the body reaches the worker as sent,
//! a batch over `--max-batch-size` is refused before any worker sees it, an unknown model
//! is a 404, and PD mode answers 501.

use gateway::config::ServeConfig;
use moongate_tests::{
    Backend, eventually, fast_config, send_json, start_gateway, start_pd_gateway,
};
use serde_json::{Value, json};
use sim::SimConfig;

#[tokio::test]
async fn embeddings_are_proxied_in_order_and_bounded() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = sim::spawn(SimConfig::default(), l).await.unwrap();
    let gw = start_gateway(ServeConfig {
        worker_urls: vec![worker.url()],
        max_batch_size: 4,
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 1).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/embeddings", gw.url());
    let model = SimConfig::default().model;

    let (st, one) = send_json(&c, &url, &json!({"model": model, "input": "hello world"})).await;
    assert_eq!(st, 200, "{one}");
    assert_eq!(one["object"], "list");
    assert_eq!(one["data"].as_array().unwrap().len(), 1);
    assert_eq!(
        one["data"][0]["embedding"].as_array().unwrap().len(),
        sim::embeddings::DIMENSIONS
    );
    assert!(one["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    let batch = json!({"model": model, "input": ["a b", "hello world", "c"], "dimensions": 8});
    let (st, many) = send_json(&c, &url, &batch).await;
    assert_eq!(st, 200, "{many}");
    let data = many["data"].as_array().unwrap();
    assert_eq!(
        data.iter()
            .map(|d| d["index"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(data[1]["embedding"].as_array().unwrap().len(), 8);
    let ids = json!({"model": model, "input": [[1, 2, 3], [4, 5]]});
    assert_eq!(send_json(&c, &url, &ids).await.0, 200);

    // Over --max-batch-size: 400 from the gateway, naming the field.
    let big = json!({"model": model, "input": ["a", "b", "c", "d", "e"]});
    let (st, err) = send_json(&c, &url, &big).await;
    assert_eq!(
        (st, err["error"]["code"].as_str()),
        (400, Some("too_many_items")),
        "{err}"
    );
    assert!(
        err["error"]["message"].as_str().unwrap().contains("input"),
        "{err}"
    );
    // An unknown model: 404, no worker asked.
    let (st, err) = send_json(&c, &url, &json!({"model": "nope", "input": "x"})).await;
    assert_eq!(
        (st, err["error"]["code"].as_str()),
        (404, Some("model_not_found")),
        "{err}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn the_body_reaches_the_worker_as_sent() {
    let w = Backend::start("w", "m").await;
    let gw = start_gateway(ServeConfig {
        worker_urls: vec![w.url()],
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 1).await;
    let body =
        r#"{"model":"m","input":["x",  "y"],"encoding_format":"float","extra_field":{"k":1}}"#;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/embeddings", gw.url()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = w.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/embeddings");
    assert_eq!(seen[0].body, body.as_bytes());
    gw.shutdown().await;
}

#[tokio::test]
async fn pd_mode_serves_no_embeddings() {
    let p = Backend::start("p", "m").await;
    let d = Backend::start("d", "m").await;
    let gw = start_pd_gateway(&[(&p.url(), Some(8998))], &[&d.url()], |_| {}).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/embeddings", gw.url()))
        .json(&json!({"model": "m", "input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 501);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_served_in_pd_mode");
    assert!(p.seen().is_empty() && d.seen().is_empty());
    gw.shutdown().await;
}
