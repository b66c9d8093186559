//! The proxied routes besides generation, through the gateway to simulated SGLang workers
//! and to a recording worker: rerank in both forms (the worker's list answered in the
//! router's envelope, `top_k`, `return_documents`, `rid`), classify, score, tokenize and
//! detokenize (answers as the worker gives them, bodies byte for byte, counts bounded by
//! `--max-batch-size`), and what PD mode does with each.

use gateway::config::ServeConfig;
use moongate_tests::{
    Backend, Reply, eventually, fast_config, send_json, start_gateway, start_pd_gateway,
    start_regular_gateway,
};
use serde_json::{Value, json};
use sim::SimConfig;

async fn sim_gateway(
    tweak: impl FnOnce(&mut ServeConfig),
) -> (sim::SimHandle, gateway::launch::Gateway) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = sim::spawn(SimConfig::default(), l).await.unwrap();
    let mut cfg = ServeConfig {
        worker_urls: vec![worker.url()],
        ..fast_config()
    };
    tweak(&mut cfg);
    let gw = start_gateway(cfg).await;
    eventually("ready", || gw.state().registry().counts().0 == 1).await;
    (worker, gw)
}

#[tokio::test]
async fn rerank_answers_in_the_routers_envelope() {
    let (worker, gw) = sim_gateway(|c| c.max_batch_size = 3).await;
    let c = reqwest::Client::new();
    let model = SimConfig::default().model;
    let docs = json!([
        "the moon is far",
        "tell me about the moon",
        "apples are red"
    ]);
    for path in ["/rerank", "/v1/rerank"] {
        let url = format!("{}{path}", gw.url());
        let (st, v) = send_json(
            &c,
            &url,
            &json!({"query": "tell me about the moon",
            "documents": docs, "rid": "r-1"}),
        )
        .await;
        assert_eq!(st, 200, "{path}: {v}");
        assert_eq!(v["object"], "rerank");
        assert_eq!(
            v["model"],
            model.as_str(),
            "the served model when none is named"
        );
        assert_eq!(v["id"], "r-1");
        assert!(v["created"].as_u64().unwrap() > 0);
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        // Best first: the document equal to the query.
        assert_eq!(results[0]["index"], 1, "{v}");
        assert_eq!(results[0]["document"], "tell me about the moon");
        let scores: Vec<f64> = results
            .iter()
            .map(|r| r["score"].as_f64().unwrap())
            .collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");

        // top_k and return_documents (the router's), top_n (SGLang's, done by the worker).
        let (st, v) = send_json(
            &c,
            &url,
            &json!({"query": "moon", "documents": docs,
            "model": model, "top_k": 2, "return_documents": false}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["model"], model.as_str());
        assert_eq!(v["id"], Value::Null);
        assert_eq!(v["results"].as_array().unwrap().len(), 2);
        assert!(v["results"][0].get("document").is_none(), "{v}");
        let (_, v) = send_json(
            &c,
            &url,
            &json!({"query": "moon", "documents": docs, "top_n": 1}),
        )
        .await;
        assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");

        // Over --max-batch-size: refused before any worker sees it.
        let (st, v) = send_json(
            &c,
            &url,
            &json!({"query": "q", "documents": ["a", "b", "c", "d"]}),
        )
        .await;
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (400, Some("too_many_items")),
            "{v}"
        );
        // The worker's own error: relayed in the envelope.
        let (st, v) = send_json(&c, &url, &json!({"query": " ", "documents": ["a"]})).await;
        assert_eq!(st, 400, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("Query"),
            "{v}"
        );
    }
    gw.shutdown().await;
    drop(worker);
}

#[tokio::test]
async fn classify_score_and_tokenize_are_proxied() {
    let (worker, gw) = sim_gateway(|c| c.max_batch_size = 2).await;
    let c = reqwest::Client::new();
    let direct = reqwest::Client::new();
    // Deterministic workers: the gateway's answer is the worker's.
    for (path, body) in [
        ("/v1/tokenize", json!({"prompt": "hello moon world"})),
        (
            "/v1/tokenize",
            json!({"prompt": ["a b", "c"], "add_special_tokens": false}),
        ),
        ("/v1/detokenize", json!({"tokens": [1, 2]})),
        (
            "/v1/score",
            json!({"query": "moon", "items": ["the moon", "sun"],
            "label_token_ids": [5, 9], "apply_softmax": true}),
        ),
    ] {
        let (st, via) = send_json(&c, &format!("{}{path}", gw.url()), &body).await;
        let (_, own) = send_json(&direct, &format!("{}{path}", worker.url()), &body).await;
        assert_eq!(st, 200, "{path}: {via}");
        assert_eq!(via, own, "{path}");
    }
    let (st, v) = send_json(
        &c,
        &format!("{}/v1/classify", gw.url()),
        &json!({"input": ["x y", "z"]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(v["data"][1]["num_classes"], 2);
    // Counts over --max-batch-size, per route's field.
    for (path, body, field) in [
        ("/v1/classify", json!({"input": ["a", "b", "c"]}), "input"),
        (
            "/v1/score",
            json!({"query": "q", "items": ["a", "b", "c"], "label_token_ids": [1]}),
            "items",
        ),
        ("/v1/tokenize", json!({"prompt": ["a", "b", "c"]}), "prompt"),
    ] {
        let (st, v) = send_json(&c, &format!("{}{path}", gw.url()), &body).await;
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (400, Some("too_many_items")),
            "{path}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains(field),
            "{v}"
        );
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn bodies_reach_the_worker_as_sent() {
    let w = Backend::start("w", "m").await;
    w.reply(Reply {
        json: Some(json!([{"score": 0.5, "document": "d", "index": 0}])),
        ..Reply::default()
    });
    let gw = start_regular_gateway(&[&w], |_| {}).await;
    let c = reqwest::Client::new();
    for (path, worker_path) in [
        ("/rerank?x=1", "/v1/rerank?x=1"),
        ("/v1/rerank", "/v1/rerank"),
        ("/v1/classify", "/v1/classify"),
        ("/v1/score", "/v1/score"),
        ("/v1/tokenize", "/v1/tokenize"),
        ("/v1/detokenize", "/v1/detokenize"),
    ] {
        let body = r#"{"model":"m",  "query":"q","documents":["d"],"input":"i","items":["x"],"prompt":"p","tokens":[1],"odd":{"k":[1,2]}}"#;
        let r = c
            .post(format!("{}{path}", gw.url()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let seen = w.seen();
        let last = seen.last().unwrap();
        assert_eq!(last.path, worker_path);
        assert_eq!(last.body, body.as_bytes(), "{path}");
    }
    // A rerank answer that is not a list of results is relayed unchanged.
    w.reply(Reply {
        json: Some(json!({"results": [], "already": "wrapped"})),
        ..Reply::default()
    });
    let (st, v) = send_json(
        &c,
        &format!("{}/v1/rerank", gw.url()),
        &json!({"query": "q", "documents": ["d"]}),
    )
    .await;
    assert_eq!((st, &v["already"]), (200, &json!("wrapped")));
    gw.shutdown().await;
}

#[tokio::test]
async fn pd_mode_pairs_rerank_sends_tokenize_to_prefill_and_refuses_the_rest() {
    let p = Backend::start("p", "m").await;
    let d = Backend::start("d", "m").await;
    d.reply(Reply {
        json: Some(json!([{"score": 0.5, "index": 0}])),
        ..Reply::default()
    });
    let gw = start_pd_gateway(&[(&p.url(), Some(8998))], &[&d.url()], |_| {}).await;
    eventually("ready", || gw.state().registry().counts().0 == 2).await;
    let c = reqwest::Client::new();
    for path in [
        "/v1/classify",
        "/v1/score",
        "/v1/embeddings",
        "/v1/responses",
    ] {
        let (st, v) = send_json(&c, &format!("{}{path}", gw.url()), &json!({"input": "x"})).await;
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (501, Some("not_served_in_pd_mode")),
            "{path}"
        );
    }
    assert!(p.seen().is_empty() && d.seen().is_empty());

    // Rerank: both sides, one bootstrap room; decode's answer in the envelope.
    let (st, v) = send_json(
        &c,
        &format!("{}/rerank", gw.url()),
        &json!({"query": "q", "documents": ["a", "b"]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "rerank");
    let (ps, ds) = (p.seen(), d.seen());
    assert_eq!((ps.len(), ds.len()), (1, 1));
    for s in [&ps[0], &ds[0]] {
        assert_eq!(s.path, "/v1/rerank");
        let b: Value = serde_json::from_slice(&s.body).unwrap();
        assert!(b["bootstrap_room"].is_u64(), "one room, not a list: {b}");
        assert_eq!(b["bootstrap_host"], "127.0.0.1");
    }
    // Tokenize: a prefill worker alone, the body unchanged.
    let body = json!({"prompt": "hello"});
    let (st, _) = send_json(&c, &format!("{}/v1/tokenize", gw.url()), &body).await;
    assert_eq!(st, 200);
    assert_eq!(p.seen().len(), 2);
    assert_eq!(d.seen().len(), 1);
    assert_eq!(p.seen()[1].body, serde_json::to_vec(&body).unwrap());
    gw.shutdown().await;
}
