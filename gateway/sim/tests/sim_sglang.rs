//! The simulated worker's SGLang routes over real sockets: `/generate` (single, batch,
//! stream, logprobs, rid, errors) and the control endpoints.

mod common;

use common::{get, get_json, post, post_raw, start, start_default, stream};
use openapi::openai::ModelList;
use openapi::sglang::server::{LoadReport, Loads, ModelInfo, ServerInfo};
use openapi::sglang::{GenerateFinishReason, GenerateResponse};
use serde_json::{Value, json};
use sim::SimConfig;

#[tokio::test]
async fn generate_single_batch_and_n() {
    let w = start(SimConfig {
        output_tokens: 5,
        ..SimConfig::default()
    })
    .await;
    let url = format!("{}/generate", w.url());

    let (status, v) = post(&url, &json!({"text": "hello world", "rid": "r1"})).await;
    assert_eq!(status, 200, "{v}");
    let r: GenerateResponse = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(r.meta_info.id, "r1");
    assert_eq!(r.meta_info.prompt_tokens, 3);
    assert_eq!(r.meta_info.completion_tokens, 6, "5 words + EOS");
    assert_eq!(r.output_ids.len(), 6);
    assert_eq!(r.output_ids[5], 2, "EOS");
    assert!(matches!(
        &r.meta_info.finish_reason,
        Some(GenerateFinishReason::Stop { .. })
    ));
    assert_eq!(
        v["meta_info"]["finish_reason"],
        json!({"type": "stop", "matched": 2})
    );
    assert_eq!(r.text.as_deref().unwrap().split_whitespace().count(), 5);
    assert!(r.index.is_none());

    let (_, v) = post(
        &url,
        &json!({"input_ids": [[300, 301], [302]], "sampling_params": {"max_new_tokens": 3},
        "rid": ["a", "b"]}),
    )
    .await;
    let outs: Vec<GenerateResponse> = serde_json::from_value(v).unwrap();
    assert_eq!(outs.len(), 2);
    assert_eq!(
        (outs[0].meta_info.id.as_str(), outs[1].meta_info.id.as_str()),
        ("a", "b")
    );
    assert_eq!(
        (
            outs[0].meta_info.prompt_tokens,
            outs[1].meta_info.prompt_tokens
        ),
        (2, 1)
    );
    assert!(
        outs.iter()
            .all(|o| o.meta_info.finish_reason == Some(GenerateFinishReason::Length { length: 3 }))
    );

    // n > 1 on one prompt answers a list; a string rid becomes `{rid}_{i}`.
    let (_, v) = post(
        &url,
        &json!({"text": "x", "sampling_params": {"n": 3, "max_new_tokens": 2}, "rid": "q"}),
    )
    .await;
    let ids: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["meta_info"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["q_0", "q_1", "q_2"]);

    // Per-item sampling params: different limits per prompt; unknown fields are accepted.
    let (_, v) = post(
        &url,
        &json!({"text": ["x", "y"], "regex": "[a-z]+",
        "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2, "json_schema": "{}"}]}),
    )
    .await;
    assert_eq!(v[0]["meta_info"]["completion_tokens"], 1);
    assert_eq!(v[1]["meta_info"]["completion_tokens"], 2);
    w.shutdown().await;
}

#[tokio::test]
async fn generate_stream_is_cumulative() {
    let w = start_default().await;
    let url = format!("{}/generate", w.url());
    let body = json!({"text": "go", "sampling_params": {"max_new_tokens": 4}});
    let (_, plain) = post(&url, &body).await;

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, events) = stream(&url, &streamed).await;
    assert_eq!(events.len(), 4);
    for (k, e) in events.iter().enumerate() {
        assert_eq!(e["meta_info"]["completion_tokens"], k + 1);
        assert_eq!(e["output_ids"].as_array().unwrap().len(), k + 1);
        assert!(
            plain["text"]
                .as_str()
                .unwrap()
                .starts_with(e["text"].as_str().unwrap())
        );
        assert_eq!(e["meta_info"]["finish_reason"].is_null(), k < 3);
        assert!(e.get("index").is_none());
    }
    assert_eq!(events[3]["text"], plain["text"]);
    assert_eq!(events[3]["output_ids"], plain["output_ids"]);

    // Streamed batch events carry `index`.
    let (_, events) = stream(
        &url,
        &json!({"text": ["a", "b"], "stream": true, "sampling_params": {"max_new_tokens": 2}}),
    )
    .await;
    let idx: Vec<u64> = events
        .iter()
        .map(|e| e["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, [0, 1, 0, 1]);
    w.shutdown().await;
}

#[tokio::test]
async fn generate_logprobs_in_sglang_shape() {
    let w = start_default().await;
    let url = format!("{}/generate", w.url());
    let body = json!({"text": "one two three", "sampling_params": {"max_new_tokens": 2},
        "return_logprob": true, "logprob_start_len": 0, "top_logprobs_num": 2, "return_text_in_logprobs": true});
    let (_, v) = post(&url, &body).await;
    let m = &v["meta_info"];
    let input = m["input_token_logprobs"].as_array().unwrap();
    assert_eq!(input.len(), 4, "BOS + 3 pieces");
    assert_eq!(input[0], json!([null, 1, "<s>"]));
    assert!(input[1][0].as_f64().unwrap() < 0.0);
    let output = m["output_token_logprobs"].as_array().unwrap();
    assert_eq!(output.len(), 2);
    assert_eq!(output[0][1], v["output_ids"][0]);
    let joined: String = output.iter().map(|e| e[2].as_str().unwrap()).collect();
    assert_eq!(joined, v["text"].as_str().unwrap());
    assert_eq!(m["input_top_logprobs"][0], Value::Null);
    assert_eq!(m["input_top_logprobs"][1].as_array().unwrap().len(), 2);
    assert_eq!(m["output_top_logprobs"][1][0], output[1]);

    // Default start (-1): only the last prompt position, which has no logprob.
    let (_, v) = post(
        &url,
        &json!({"input_ids": [300, 301, 302], "return_logprob": true,
        "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(
        v["meta_info"]["input_token_logprobs"],
        json!([[null, 302, null]])
    );
    assert!(v["meta_info"].get("output_top_logprobs").is_none());
    w.shutdown().await;
}

#[tokio::test]
async fn generate_errors_in_sglang_shape() {
    let w = start_default().await;
    let url = format!("{}/generate", w.url());
    for (body, needle) in [
        (
            r#"{"sampling_params":{}}"#,
            "Either text, input_ids or input_embeds",
        ),
        (r#"{"text":5}"#, "expected a string"),
        (r#"{"text":[]}"#, "no prompts"),
        (r#"{"input_ids":[]}"#, "input_ids cannot be empty"),
        (r#"{"input_ids":[[1],[32000]]}"#, "out of vocabulary"),
        (
            r#"{"text":"a","return_logprob":true,"top_logprobs_num":100000}"#,
            "top_logprobs_num must be at most",
        ),
        (r#"{"text":["a","b"],"rid":["x"]}"#, "rid has 1 entries"),
        (
            r#"{"text":["a","b"],"sampling_params":[{"n":1},{"n":2}]}"#,
            "parallel_sample_num",
        ),
        (r#"{"text":"a","sampling_params":{"top_p":0}}"#, "top_p"),
        (
            r#"{"text":"a","return_logprob":true,"logprob_start_len":9}"#,
            "logprob_start_len",
        ),
        (
            r#"{"text":"a","sampling_params":{"max_new_tokens":100000}}"#,
            "context length",
        ),
        ("[1,2]", "invalid type"),
    ] {
        let (status, v) = post_raw(&url, body).await;
        assert_eq!(status, 400, "{body}: {v}");
        let msg = v["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    w.shutdown().await;
}

#[tokio::test]
async fn control_endpoints_answer_like_sglang() {
    let cfg = SimConfig {
        model: "sim-m".into(),
        model_path: Some("/models/sim".into()),
        ..SimConfig::default()
    };
    let w = start(cfg).await;
    let base = w.url();
    for path in ["/health", "/health_generate"] {
        assert_eq!(
            get(&format!("{base}{path}")).await,
            (200, String::new()),
            "{path}"
        );
    }
    for path in ["/get_model_info", "/model_info"] {
        let m: ModelInfo =
            serde_json::from_value(get_json(&format!("{base}{path}")).await).unwrap();
        assert_eq!(m.model_path, "/models/sim");
        assert!(m.is_generation);
    }
    for path in ["/get_server_info", "/server_info"] {
        let s: ServerInfo =
            serde_json::from_value(get_json(&format!("{base}{path}")).await).unwrap();
        assert_eq!(s.served_model_name.as_deref(), Some("sim-m"));
        assert_eq!(s.disaggregation_mode.as_deref(), Some("null"));
        assert_eq!(
            s.port,
            Some(w.addr.port()),
            "reports the port it listens on"
        );
    }
    let models: ModelList =
        serde_json::from_value(get_json(&format!("{base}/v1/models")).await).unwrap();
    assert_eq!(models.data.len(), 1);
    assert_eq!(
        (models.data[0].id.as_str(), models.data[0].owned_by.as_str()),
        ("sim-m", "sglang")
    );
    assert_eq!(
        get_json(&format!("{base}/v1/models/sim-m")).await["id"],
        "sim-m"
    );
    let (status, body) = get(&format!("{base}/v1/models/other/name")).await;
    assert_eq!(status, 404, "{body}");
    let load: Vec<LoadReport> =
        serde_json::from_value(get_json(&format!("{base}/get_load")).await).unwrap();
    assert_eq!((load.len(), load[0].num_reqs), (1, 0));
    let loads: Loads = serde_json::from_value(get_json(&format!("{base}/v1/loads")).await).unwrap();
    assert_eq!(
        (loads.dp_rank_count, loads.loads[0].num_running_reqs),
        (1, 0)
    );
    assert!(loads.timestamp.starts_with("20"), "{}", loads.timestamp);
    let (status, text) = get(&format!("{base}/flush_cache")).await;
    assert!(status == 200 && text.starts_with("Cache flushed."));
    let resp = reqwest::Client::new()
        .post(format!("{base}/flush_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);

    assert_eq!(
        get(&format!("{base}/nope")).await,
        (404, r#"{"detail":"Not Found"}"#.to_owned())
    );
    let (status, text) = get(&format!("{base}/generate")).await;
    assert_eq!(
        (status, text.as_str()),
        (405, r#"{"detail":"Method Not Allowed"}"#)
    );
    let resp = reqwest::Client::new()
        .put(format!("{base}/generate"))
        .json(&json!({"text": "a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        200,
        "SGLang also accepts PUT /generate"
    );
    w.shutdown().await;
}
