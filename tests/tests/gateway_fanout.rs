//! The routes that ask every worker, over sockets, against simulated SGLang workers and a
//! scripted worker that serves none of them: `/flush_cache` (200, or 206 naming who did not
//! flush), `/get_loads` (each worker's ranks, -1 with the reason), `/engine_metrics` (the
//! workers' Prometheus text merged, labelled by worker), `/health_generate` (one worker, or
//! a PD pair), `/start_profile` and `/stop_profile` (all workers or the one named, the
//! options passed through), and the admin key they sit behind.

use gateway::config::ServeConfig;
use moongate_tests::{Backend, eventually, fast_config, start_gateway, start_two_prefill_pd};
use serde_json::Value;
use sim::{SimConfig, SimHandle};

async fn sims(n: usize) -> Vec<SimHandle> {
    let mut out = Vec::new();
    for _ in 0..n {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        out.push(sim::spawn(SimConfig::default(), l).await.unwrap());
    }
    out
}

async fn send(r: reqwest::RequestBuilder) -> (u16, String) {
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn every_worker_is_asked_and_the_answer_says_who_did_not_answer() {
    let workers = sims(2).await;
    let scripted = Backend::start("scripted", "m").await;
    let mut urls: Vec<String> = workers.iter().map(SimHandle::url).collect();
    urls.push(scripted.url());
    let gw = start_gateway(ServeConfig {
        worker_urls: urls.clone(),
        ..fast_config()
    })
    .await;
    eventually("all ready", || gw.state().registry().counts().0 == 3).await;
    let c = reqwest::Client::new();
    let base = gw.url();

    // The scripted worker has no /flush_cache: 206, and it is named.
    let (st, body) = send(c.post(format!("{base}/flush_cache"))).await;
    let v = json(&body);
    assert_eq!(st, 206, "{body}");
    assert_eq!(v["status"], "partial_success");
    assert_eq!(
        (v["workers_flushed"].as_u64(), v["total_workers"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(
        v["failed"][0]["worker"]
            .as_str()
            .unwrap()
            .trim_end_matches('/'),
        scripted.url()
    );
    assert!(
        v["failed"][0]["error"].as_str().unwrap().contains("404"),
        "{body}"
    );
    assert_eq!(v["successful"].as_array().unwrap().len(), 2);

    // Loads: the sims' ranks, the scripted worker's -1 with the reason.
    let (st, body) = send(c.get(format!("{base}/get_loads"))).await;
    assert_eq!(st, 200);
    let v = json(&body);
    let loads = v["workers"].as_array().unwrap();
    assert_eq!(loads.len(), 3);
    for l in loads {
        let url = l["worker"].as_str().unwrap().trim_end_matches('/');
        if url == scripted.url() {
            assert_eq!(l["load"], -1);
            assert!(l["error"].as_str().unwrap().contains("404"));
        } else {
            assert_eq!(l["load"], 0);
            assert_eq!(l["details"][0]["dp_rank"], 0);
            assert!(
                l.get("worker_type").is_none(),
                "regular workers have no type"
            );
        }
    }

    // Engine metrics: each family once, every sim's sample labelled with its URL.
    let r = c
        .get(format!("{base}/engine_metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = r.text().await.unwrap();
    assert_eq!(
        text.matches("# TYPE sglang:num_running_reqs gauge").count(),
        1,
        "{text}"
    );
    for w in &workers {
        let line = format!("sglang:num_running_reqs{{worker_addr=\"{}", w.url());
        assert!(text.contains(&line), "{line} in {text}");
    }
    gw.shutdown().await;

    // Only sims: a plain success, and /health_generate passes on one of them.
    let gw = start_gateway(ServeConfig {
        worker_urls: urls[..2].to_vec(),
        ..fast_config()
    })
    .await;
    eventually("sims ready", || gw.state().registry().counts().0 == 2).await;
    let base = gw.url();
    let (st, body) = send(c.post(format!("{base}/flush_cache"))).await;
    let v = json(&body);
    assert_eq!((st, v["status"].as_str()), (200, Some("success")), "{body}");
    assert!(v.get("failed").is_none());
    let (st, body) = send(c.get(format!("{base}/health_generate"))).await;
    assert_eq!(st, 200, "{body}");
    gw.shutdown().await;
}

#[tokio::test]
async fn health_generate_in_pd_mode_asks_a_pair_and_names_the_failure() {
    // Scripted workers serve no /health_generate: both sides fail, both named.
    let (p1, _p2, d, gw) = start_two_prefill_pd(|_| {}).await;
    let c = reqwest::Client::new();
    let (st, body) = send(c.get(format!("{}/health_generate", gw.url()))).await;
    assert_eq!(st, 503, "{body}");
    let v = json(&body);
    assert_eq!(v["error"]["code"], "health_generate_failed");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&d.url()) && msg.contains("404"), "{msg}");
    assert!(msg.contains(&p1.url()) || msg.contains(&_p2.url()), "{msg}");
    gw.shutdown().await;
}

#[tokio::test]
async fn the_worker_wide_routes_sit_behind_the_admin_key() {
    let workers = sims(1).await;
    let gw = start_gateway(ServeConfig {
        worker_urls: vec![workers[0].url()],
        admin_api_key: Some("admin-key-0123456789".parse().unwrap()),
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 1).await;
    let c = reqwest::Client::new();
    let base = gw.url();
    for (m, path) in [
        ("POST", "/flush_cache"),
        ("GET", "/get_loads"),
        ("GET", "/engine_metrics"),
    ] {
        let req = |key: Option<&str>| {
            let r = c.request(m.parse().unwrap(), format!("{base}{path}"));
            match key {
                Some(k) => r.bearer_auth(k),
                None => r,
            }
        };
        assert_eq!(send(req(None)).await.0, 401, "{path} without a key");
        assert_eq!(
            send(req(Some("wrong"))).await.0,
            401,
            "{path} with a wrong key"
        );
        let (st, _) = send(req(Some("admin-key-0123456789"))).await;
        assert_eq!(st, 200, "{path} with the admin key");
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn profiling_starts_on_every_worker_or_the_one_named_with_its_options() {
    let workers = sims(2).await;
    let gw = start_gateway(ServeConfig {
        worker_urls: workers.iter().map(SimHandle::url).collect(),
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 2).await;
    let c = reqwest::Client::new();
    let base = gw.url();
    let profiling = |w: &SimHandle| {
        let c = c.clone();
        let url = format!("{}/sim/profile", w.url());
        async move { json(&send(c.get(url)).await.1) }
    };
    // One worker by URL, with SGLang's options passed through as sent.
    let one = serde_json::json!({"url": workers[1].url(), "num_steps": 5, "activities": ["CPU"]});
    let (st, body) = send(c.post(format!("{base}/start_profile")).json(&one)).await;
    let v = json(&body);
    assert_eq!(
        (st, v["workers_profiled"].as_u64()),
        (200, Some(1)),
        "{body}"
    );
    assert_eq!(profiling(&workers[0]).await, Value::Null);
    assert_eq!(
        profiling(&workers[1]).await,
        serde_json::json!({"num_steps": 5, "activities": ["CPU"]}),
        "the options arrive without `url`"
    );
    // Stop on all (no body), then a URL that names no worker, then a body that is not JSON.
    let (st, body) = send(c.post(format!("{base}/stop_profile"))).await;
    assert_eq!(
        (st, json(&body)["total_workers"].as_u64()),
        (200, Some(2)),
        "{body}"
    );
    assert_eq!(profiling(&workers[1]).await, Value::Null);
    let none = serde_json::json!({"url": "http://127.0.0.1:9"});
    let (st, body) = send(c.post(format!("{base}/start_profile")).json(&none)).await;
    assert_eq!(
        (st, json(&body)["status"].as_str()),
        (404, Some("error")),
        "{body}"
    );
    let (st, body) = send(
        c.post(format!("{base}/start_profile"))
            .header("content-type", "application/json")
            .body("{not json"),
    )
    .await;
    assert_eq!(
        (st, json(&body)["error"]["code"].as_str()),
        (400, Some("invalid_json")),
        "{body}"
    );
    gw.shutdown().await;
}

/// A worker that answers the fan-out routes with more than the gateway reads: a `/metrics`
/// over 4 MiB, a `/get_load` over 1 MiB, a `/flush_cache` that never ends its body.
async fn oversized_worker() -> String {
    use axum::routing::{get, post};
    async fn huge_metrics() -> String {
        "x_total 1\n".repeat(500_000) // 5 MB
    }
    async fn huge_load() -> String {
        format!("[{}]", vec!["{\"dp_rank\":0}"; 100_000].join(","))
    }
    async fn endless() -> axum::body::Body {
        let chunks = futures::stream::repeat_with(|| {
            Ok::<_, std::io::Error>(bytes::Bytes::from_static(&[b' '; 65536]))
        });
        axum::body::Body::from_stream(chunks)
    }
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async {
                axum::Json(serde_json::json!({"object": "list", "data": [{"id": "m"}]}))
            }),
        )
        .route(
            "/get_model_info",
            get(|| async { axum::Json(serde_json::json!({"model_path": "m"})) }),
        )
        .route(
            "/get_server_info",
            get(|| async { axum::Json(serde_json::json!({})) }),
        )
        .route("/metrics", get(huge_metrics))
        .route("/get_load", get(huge_load))
        .route("/flush_cache", post(endless));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

#[tokio::test]
async fn a_worker_answering_too_much_is_left_out_not_held() {
    let workers = sims(1).await;
    let attacker = oversized_worker().await;
    let gw = start_gateway(ServeConfig {
        worker_urls: vec![workers[0].url(), attacker.clone()],
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 2).await;
    let c = reqwest::Client::new();
    let base = gw.url();
    let text = send(c.get(format!("{base}/engine_metrics"))).await.1;
    assert!(
        text.contains(&workers[0].url()),
        "{}",
        &text[..text.len().min(500)]
    );
    assert!(
        !text.contains("x_total"),
        "the oversized answer is not served"
    );
    let v = json(&send(c.get(format!("{base}/get_loads"))).await.1);
    let attacker_load = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["worker"].as_str().unwrap().trim_end_matches('/') == attacker)
        .expect("listed")
        .clone();
    assert_eq!(attacker_load["load"], -1);
    assert!(
        attacker_load["error"]
            .as_str()
            .unwrap()
            .contains("reading body"),
        "{attacker_load}"
    );
    // An endless body is cut at the bound (or the timeout): a 206 naming it, in bounded time.
    let (st, body) = send(c.post(format!("{base}/flush_cache"))).await;
    assert_eq!(st, 206, "{body}");
    assert!(body.contains(&attacker), "{body}");
    gw.shutdown().await;
}
