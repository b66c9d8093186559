//! The gateway in front of real simulated SGLang workers (`sim`), over sockets:
//! every inference route streamed and not, SSE order and `[DONE]`, and the demo.

use std::time::{Duration, Instant};

use futures::StreamExt;
use moongate_tests::{eventually, fast_config, get_json, post_json, start_gateway};
use openapi::openai::chat::{ChatCompletionChunk, ChatCompletionResponse};
use serde_json::json;
use sim::{self, SimConfig, SimHandle};

async fn sims(n: usize, cfg: SimConfig) -> Vec<SimHandle> {
    let mut out = Vec::new();
    for _ in 0..n {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        out.push(sim::spawn(cfg.clone(), l).await.unwrap());
    }
    out
}

/// Reads an SSE body to the end; returns the `data:` payloads in order.
async fn sse_events(r: reqwest::Response) -> Vec<String> {
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data: line").to_string())
        .collect()
}

#[tokio::test]
async fn chat_completions_generate_through_sim_workers() {
    let workers = sims(
        2,
        SimConfig {
            output_tokens: 64,
            ..SimConfig::default()
        },
    )
    .await;
    let gw = start_gateway(gateway::config::ServeConfig {
        worker_urls: workers.iter().map(SimHandle::url).collect(),
        ..fast_config()
    })
    .await;
    eventually("both ready", || gw.state().registry().counts().0 == 2).await;
    let c = reqwest::Client::new();
    let base = gw.url();
    let model = SimConfig::default().model;

    let models = get_json(&c, &format!("{base}/v1/models")).await;
    assert_eq!(models["data"][0]["id"], model.as_str());

    // Chat, not streamed: a well-formed completion with usage and finish_reason.
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hello moon"}], "max_tokens": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let chat: ChatCompletionResponse = r.json().await.unwrap();
    let usage = chat.usage.expect("usage");
    assert_eq!(usage.completion_tokens, 5);
    assert_eq!(
        serde_json::to_value(chat.choices[0].finish_reason).unwrap(),
        "length"
    );

    // Chat, streamed: chunks in order, usage last when asked, then [DONE].
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(
            &json!({"model": model, "messages": [{"role": "user", "content": "hello moon"}],
            "max_tokens": 16, "stream": true, "stream_options": {"include_usage": true}}),
        )
        .send()
        .await
        .unwrap();
    let events = sse_events(r).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<ChatCompletionChunk> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("a chat chunk"))
        .collect();
    let id = &chunks[0].id;
    assert!(chunks.iter().all(|c| &c.id == id), "one completion id");
    let text: String = chunks
        .iter()
        .flat_map(|c| c.choices.iter())
        .filter_map(|ch| ch.delta.content.clone())
        .collect();
    assert_eq!(text.split_whitespace().count(), 16);
    assert_eq!(
        chunks
            .last()
            .unwrap()
            .usage
            .as_ref()
            .map(|u| u.completion_tokens),
        Some(16)
    );

    // The same prompt gives the same text through either worker (deterministic), streamed or not.
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hello moon"}], "max_tokens": 16});
    let whole: ChatCompletionResponse = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let whole_text = serde_json::to_value(&whole.choices[0].message).unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(whole_text, text);

    // Completions and /generate, both ways.
    let r = post_json(
        &c,
        &format!("{base}/v1/completions"),
        &json!({"model": model, "prompt": ["a", "b"], "max_tokens": 3}),
    )
    .await;
    assert_eq!(r["choices"].as_array().unwrap().len(), 2);
    let events = sse_events(
        c.post(format!("{base}/v1/completions"))
            .json(&json!({"model": model, "prompt": "a", "max_tokens": 3, "stream": true}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let r = post_json(
        &c,
        &format!("{base}/generate"),
        &json!({"text": "hello", "sampling_params": {"max_new_tokens": 4}}),
    )
    .await;
    assert_eq!(r["meta_info"]["completion_tokens"], 4);
    let events = sse_events(
        c.post(format!("{base}/generate"))
            .json(
                &json!({"text": "hello", "sampling_params": {"max_new_tokens": 4}, "stream": true}),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(events.len(), 5);
    gw.shutdown().await;
    for w in workers {
        w.shutdown().await;
    }
}

#[tokio::test]
async fn tokens_reach_the_client_as_the_worker_produces_them() {
    let workers = sims(
        1,
        SimConfig {
            tpot: Duration::from_millis(40),
            ..SimConfig::default()
        },
    )
    .await;
    let gw = start_gateway(gateway::config::ServeConfig {
        worker_urls: vec![workers[0].url()],
        ..fast_config()
    })
    .await;
    eventually("ready", || gw.state().registry().counts().0 == 1).await;
    let start = Instant::now();
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.url()))
        .json(&json!({"model": SimConfig::default().model, "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 10, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    let mut arrivals = Vec::new();
    while let Some(chunk) = body.next().await {
        chunk.unwrap();
        arrivals.push(start.elapsed());
    }
    // 10 tokens, 40 ms apart: the chunks arrive spread over ~360 ms, not all at the end.
    assert!(arrivals.len() >= 5, "{arrivals:?}");
    let spread = *arrivals.last().unwrap() - arrivals[0];
    assert!(
        spread >= Duration::from_millis(250),
        "chunks arrived together: {arrivals:?}"
    );
    gw.shutdown().await;
    workers.into_iter().next().unwrap().shutdown().await;
}

#[tokio::test]
async fn the_demo_serves_what_it_prints() {
    let demo = sim::demo::Demo::start(sim::demo::DemoConfig {
        port: 0,
        tpot: Duration::ZERO,
        ..Default::default()
    })
    .await
    .unwrap();
    let text = demo.instructions();
    let url = demo.gateway().url();
    assert!(
        text.contains(&format!("curl -sN {url}/v1/chat/completions")),
        "{text}"
    );
    for needle in [
        "/v1/completions",
        "/generate",
        "-X PATCH",
        "-X DELETE",
        "-X POST",
    ] {
        assert!(text.contains(needle), "{needle}");
    }
    let c = reqwest::Client::new();
    let ready = get_json(&c, &format!("{url}/readiness")).await;
    assert_eq!(ready["ready_workers"], 2);
    let r = c
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"model": SimConfig::default().model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The printed prefix-caching example: its second answer reports cached tokens.
    let ids: Vec<u32> = (1000..1040).collect();
    let body = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 4}});
    let mut cached = Vec::new();
    // Until the KV event of the first answer has reached the gateway, a repeat may land on
    // the other worker (which then caches it too); within a few tries it hits.
    for _ in 0..40 {
        let r = post_json(&c, &format!("{url}/generate"), &body).await;
        cached.push(r["meta_info"]["cached_tokens"].as_u64().unwrap());
        if cached.last() == Some(&32) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((cached[0], cached.last()), (0, Some(&32)), "{cached:?}");
    assert!(text.contains("cached_tokens 32"));
    // The printed L3 example: with both GPU caches flushed, the prefix comes from the store.
    let workers: Vec<String> = demo
        .gateway()
        .state()
        .registry()
        .list()
        .iter()
        .map(|w| w.url().as_str().trim_end_matches('/').to_owned())
        .collect();
    assert!(text.contains("/flush_cache") && text.contains("/sim/prefix"));
    let store = |key: &'static str| {
        let (c, workers) = (c.clone(), workers.clone());
        async move {
            let mut n = 0;
            for w in &workers {
                n += get_json(&c, &format!("{w}/sim/prefix")).await["store"][key]
                    .as_u64()
                    .unwrap();
            }
            n
        }
    };
    for _ in 0..100 {
        if store("written_pages").await >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        store("written_pages").await >= 2,
        "the computed pages reach the store"
    );
    let before = store("loaded_pages").await;
    for w in &workers {
        let r = c.post(format!("{w}/flush_cache")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = post_json(&c, &format!("{url}/generate"), &body).await;
    assert_eq!(r["meta_info"]["cached_tokens"], 32, "{r}");
    assert_eq!(
        store("loaded_pages").await - before,
        2,
        "two 16-token pages loaded from the store"
    );
    demo.shutdown().await;
}

#[tokio::test]
async fn concurrent_load_completes_and_every_guard_is_released() {
    let workers = sims(2, SimConfig::default()).await;
    let gw = start_gateway(gateway::config::ServeConfig {
        worker_urls: workers.iter().map(SimHandle::url).collect(),
        ..fast_config()
    })
    .await;
    eventually("both ready", || gw.state().registry().counts().0 == 2).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let model = SimConfig::default().model;
    // 32 clients x 8 requests, half of them streamed.
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (c, url, model) = (c.clone(), url.clone(), model.clone());
            tokio::spawn(async move {
                for j in 0..8 {
                    let stream = (i + j) % 2 == 0;
                    let r = c
                        .post(&url)
                        .json(&json!({"model": model, "messages": [{"role": "user", "content": format!("q{i}-{j}")}],
                            "max_tokens": 8, "stream": stream}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200);
                    let text = r.text().await.unwrap();
                    assert_eq!(stream, text.ends_with("data: [DONE]\n\n"));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let metrics = c
        .get(format!("{}/metrics", gw.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let served: f64 = metrics
        .lines()
        .find(|l| {
            l.starts_with(
                r#"moongate_gateway_requests_total{route="chat_completions",status="200"}"#,
            )
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(served >= 256.0, "{served}");
    for w in gw.state().registry().list().iter() {
        assert_eq!(w.load(), 0, "guard released on {}", w.url().as_str());
    }
    gw.shutdown().await;
    for w in workers {
        w.shutdown().await;
    }
}
