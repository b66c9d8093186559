//! The simulated worker's OpenAI routes over real sockets: shapes, token counts, finish
//! reasons, streaming order, n > 1, logprobs, errors.

mod common;

use common::{post, post_raw, start, start_default, stream};
use openapi::openai::FinishReason;
use openapi::openai::chat::{ChatCompletionChunk, ChatCompletionResponse};
use openapi::openai::completions::CompletionResponse;
use serde_json::{Value, json};
use sim::SimConfig;

fn chat_body(content: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": content}]})
}

fn with(mut v: Value, extra: Value) -> Value {
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[tokio::test]
async fn chat_counts_tokens_and_finishes_by_length_or_eos() {
    let w = start(SimConfig {
        output_tokens: 6,
        ..SimConfig::default()
    })
    .await;
    let url = format!("{}/v1/chat/completions", w.url());

    // No limit: the model writes 6 words, then its end-of-sequence token.
    let (status, v) = post(&url, &chat_body("one two three")).await;
    assert_eq!(status, 200, "{v}");
    let r: ChatCompletionResponse = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(r.object, "chat.completion");
    assert_eq!(r.model, "m");
    assert!(r.id.starts_with("chatcmpl-"));
    let c = &r.choices[0];
    assert_eq!(c.finish_reason, Some(FinishReason::Stop));
    assert_eq!(v["choices"][0]["matched_stop"], 2, "EOS token id");
    let text = c.message.content.clone().unwrap();
    assert_eq!(text.split_whitespace().count(), 6, "{text}");
    let usage = r.usage.unwrap();
    // BOS + (3 per message + 3 words) + 3 for the reply header.
    assert_eq!(usage.prompt_tokens, 1 + 3 + 3 + 3);
    assert_eq!(usage.completion_tokens, 7, "6 words + EOS");
    assert_eq!(usage.total_tokens, usage.prompt_tokens + 7);
    assert_eq!(v["metadata"]["weight_version"], "default");

    // max_tokens below the natural length: `length`, and a prefix of the same text.
    let (_, v) = post(
        &url,
        &with(chat_body("one two three"), json!({"max_tokens": 4})),
    )
    .await;
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    let short = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with(short) && short.split_whitespace().count() == 4);

    // max_completion_tokens wins over max_tokens.
    let body = with(
        chat_body("one two three"),
        json!({"max_tokens": 5, "max_completion_tokens": 2}),
    );
    let (_, v) = post(&url, &body).await;
    assert_eq!(v["usage"]["completion_tokens"], 2);

    // Deterministic: the same prompt, the same answer; another prompt, another answer.
    let (_, again) = post(&url, &chat_body("one two three")).await;
    assert_eq!(again["choices"][0]["message"]["content"], text.as_str());
    let (_, other) = post(&url, &chat_body("something else")).await;
    assert_ne!(other["choices"][0]["message"]["content"], text.as_str());
    w.shutdown().await;
}

#[tokio::test]
async fn chat_stop_strings_n_and_logprobs() {
    let w = start_default().await;
    let url = format!("{}/v1/chat/completions", w.url());
    let (_, full) = post(&url, &with(chat_body("hi"), json!({"max_tokens": 10}))).await;
    let text = full["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let third = text.split(' ').nth(3).unwrap().to_owned();
    let stop = format!(" {third}");

    let (_, v) = post(
        &url,
        &with(
            chat_body("hi"),
            json!({"max_tokens": 10, "stop": [stop.clone(), "zzz"]}),
        ),
    )
    .await;
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "stop");
    assert_eq!(c["matched_stop"], stop.as_str());
    let cut = c["message"]["content"].as_str().unwrap();
    assert!(
        text.starts_with(cut) && !cut.contains(&stop),
        "{cut:?} / {text:?}"
    );
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 3);

    let body = with(
        chat_body("hi"),
        json!({"n": 3, "max_tokens": 5, "logprobs": true, "top_logprobs": 2}),
    );
    let (_, v) = post(&url, &body).await;
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    assert_eq!(v["usage"]["completion_tokens"], 15);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let content = c["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content.len(), 5);
        let first = &content[0];
        assert_eq!(first["top_logprobs"].as_array().unwrap().len(), 2);
        assert_eq!(first["top_logprobs"][0]["token"], first["token"]);
        let token = first["token"].as_str().unwrap();
        assert_eq!(first["bytes"], json!(token.as_bytes()));
        assert!(first["logprob"].as_f64().unwrap() < 0.0);
        let joined: String = content
            .iter()
            .map(|t| t["token"].as_str().unwrap())
            .collect();
        assert_eq!(joined, c["message"]["content"].as_str().unwrap());
    }
    assert_ne!(
        choices[0]["message"]["content"],
        choices[1]["message"]["content"]
    );
    w.shutdown().await;
}

#[tokio::test]
async fn chat_stream_chunks_in_sglang_order() {
    let w = start_default().await;
    let url = format!("{}/v1/chat/completions", w.url());
    let body = with(
        chat_body("stream me"),
        json!({"max_tokens": 4, "rid": "req-1"}),
    );
    let (_, plain) = post(&url, &body).await;
    assert_eq!(plain["id"], "req-1");

    let (ctype, events) = stream(
        &url,
        &with(
            body.clone(),
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert!(ctype.starts_with("text/event-stream"));
    let chunks: Vec<ChatCompletionChunk> = events
        .iter()
        .map(|e| serde_json::from_value(e.clone()).unwrap())
        .collect();
    // role, 4 tokens, finish, usage
    assert_eq!(chunks.len(), 1 + 4 + 1 + 1);
    assert!(
        chunks
            .iter()
            .all(|c| c.id == "req-1" && c.object == "chat.completion.chunk")
    );
    assert_eq!(
        chunks[0].choices[0].delta.role.as_deref(),
        Some("assistant")
    );
    assert_eq!(chunks[0].choices[0].delta.content.as_deref(), Some(""));
    let content: String = chunks[1..5]
        .iter()
        .map(|c| c.choices[0].delta.content.clone().unwrap())
        .collect();
    assert_eq!(
        content,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert!(
        chunks[..5]
            .iter()
            .all(|c| c.choices[0].finish_reason.is_none())
    );
    let fin = &chunks[5].choices[0];
    assert_eq!(
        (fin.finish_reason, fin.delta.content.as_deref()),
        (Some(FinishReason::Length), None)
    );
    assert!(
        events[5]["choices"][0]["delta"]
            .as_object()
            .unwrap()
            .contains_key("reasoning_content")
    );
    assert!(chunks[6].choices.is_empty());
    assert_eq!(
        serde_json::to_value(chunks[6].usage.as_ref().unwrap()).unwrap(),
        plain["usage"]
    );

    // Without include_usage there is no usage chunk; with n = 2 every choice gets its own
    // role chunk and finish chunk.
    let (_, events) = stream(&url, &with(body, json!({"stream": true, "n": 2}))).await;
    assert!(events.iter().all(|e| e.get("usage").is_none()));
    let finishes: Vec<&Value> = events
        .iter()
        .filter(|e| !e["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finishes.len(), 2);
    assert_eq!(
        (
            finishes[0]["choices"][0]["index"].clone(),
            finishes[1]["choices"][0]["index"].clone()
        ),
        (json!(0), json!(1))
    );
    let roles = events
        .iter()
        .filter(|e| e["choices"][0]["delta"]["role"] == "assistant")
        .count();
    assert_eq!(roles, 2);
    w.shutdown().await;
}

#[tokio::test]
async fn completions_accept_every_prompt_form() {
    let w = start_default().await;
    let url = format!("{}/v1/completions", w.url());
    for (prompt, prompts, prompt_tokens) in [
        (json!("a b c"), 1, 4),
        (json!(["a b", "c"]), 2, 3 + 2),
        (json!([300, 301, 302]), 1, 3),
        (json!([[300], [301, 302]]), 2, 3),
    ] {
        let (status, v) = post(
            &url,
            &json!({"model": "m", "prompt": prompt, "n": 2, "max_tokens": 3}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let r: CompletionResponse = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(r.object, "text_completion");
        assert_eq!(r.choices.len(), prompts * 2);
        assert!(
            r.choices
                .iter()
                .enumerate()
                .all(|(i, c)| c.index as usize == i)
        );
        assert!(
            r.choices
                .iter()
                .all(|c| c.finish_reason == Some(FinishReason::Length))
        );
        let usage = r.usage.unwrap();
        assert_eq!(
            (usage.prompt_tokens, usage.completion_tokens),
            (prompt_tokens, prompts as u64 * 6)
        );
    }
    // OpenAI's default max_tokens for completions is 16 (the natural length is 16 too).
    let (_, v) = post(&url, &json!({"prompt": "x"})).await;
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["model"], "moongate-sim");
    w.shutdown().await;
}

#[tokio::test]
async fn completions_stream_echo_and_logprobs() {
    let w = start_default().await;
    let url = format!("{}/v1/completions", w.url());
    let body = json!({"prompt": "Say it", "max_tokens": 3, "echo": true, "logprobs": 2});
    let (_, plain) = post(&url, &body).await;
    let c = &plain["choices"][0];
    let text = c["text"].as_str().unwrap();
    assert!(text.starts_with("Say it "), "{text}");
    let lp = &c["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.concat(), text);
    assert_eq!(
        lp["token_logprobs"][0],
        Value::Null,
        "first prompt token has no logprob"
    );
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    assert_eq!(lp["top_logprobs"][2].as_object().unwrap().len(), 2);
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    let mut at = 0;
    for (t, o) in tokens.iter().zip(&offsets) {
        assert_eq!(*o, at);
        at += t.len() as u64;
    }

    let (_, events) = stream(
        &url,
        &json!({"prompt": "Say it", "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(events.len(), 3 + 1);
    let streamed: String = events[..3]
        .iter()
        .map(|e| e["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(format!("Say it{streamed}"), text);
    assert!(
        events[..2]
            .iter()
            .all(|e| e["choices"][0]["finish_reason"].is_null())
    );
    assert_eq!(events[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[3]["usage"]["completion_tokens"], 3);
    assert_eq!(events[3]["choices"], json!([]));

    // SGLang's continuous_usage_stats: running usage on every content chunk.
    let body = json!({"prompt": "Say it", "max_tokens": 2, "stream": true,
        "stream_options": {"continuous_usage_stats": true}});
    let (_, events) = stream(&url, &body).await;
    let running: Vec<u64> = events
        .iter()
        .map(|e| e["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(running, [1, 2]);
    let chat = format!("{}/v1/chat/completions", w.url());
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": true,
        "stream_options": {"continuous_usage_stats": true}});
    let (_, events) = stream(&chat, &body).await;
    let running: Vec<u64> = events
        .iter()
        .filter(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .map(|e| e["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(running, [1, 2]);
    w.shutdown().await;
}

#[tokio::test]
async fn bad_input_gets_sglang_errors() {
    let w = start(SimConfig {
        context_length: 64,
        ..SimConfig::default()
    })
    .await;
    let chat = format!("{}/v1/chat/completions", w.url());
    let cmpl = format!("{}/v1/completions", w.url());
    let cases: Vec<(&str, String, &str)> = vec![
        (&chat, "{not json".into(), "key must be a string"),
        (&chat, r#"{"model":"m"}"#.into(), "missing field `messages`"),
        (
            &chat,
            r#"{"messages":[]}"#.into(),
            "messages must not be empty",
        ),
        (
            &chat,
            r#"{"messages":[{"role":"robot","content":"x"}]}"#.into(),
            "'role' must be one of",
        ),
        (
            &chat,
            r#"{"messages":[{"role":"user","content":7}]}"#.into(),
            "content parts",
        ),
        (
            &chat,
            r#"{"messages":[{"role":"user","content":"x"}],"n":0}"#.into(),
            "n must be at least 1",
        ),
        (
            &chat,
            r#"{"messages":[{"role":"user","content":"x"}],"temperature":-1}"#.into(),
            "temperature",
        ),
        (
            &chat,
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":100}"#.into(),
            "context length",
        ),
        (
            &chat,
            r#"{"messages":[{"role":"user","content":"x"}],"ignore_eos":"yes"}"#.into(),
            "ignore_eos",
        ),
        (
            &cmpl,
            r#"{"prompt":[]}"#.into(),
            "prompt must not be an empty list",
        ),
        (&cmpl, r#"{"prompt":["a",1]}"#.into(), "only strings"),
        (
            &cmpl,
            r#"{"prompt":[99999999]}"#.into(),
            "out of vocabulary",
        ),
        (
            &chat,
            r#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":4294967295}"#.into(),
            "top_logprobs must be at most",
        ),
        (&cmpl, r#"{"prompt":"x","logprobs":65}"#.into(), "logprobs must be at most"),
        (
            &cmpl,
            format!(r#"{{"prompt":"{}"}}"#, "w ".repeat(100)),
            "longer than the model's context length",
        ),
    ];
    for (url, body, needle) in cases {
        let (status, v) = post_raw(url, &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["object"], "error", "{v}");
        assert_eq!(v["type"], "BadRequestError");
        assert_eq!(v["code"], 400);
        let msg = v["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    w.shutdown().await;
}
