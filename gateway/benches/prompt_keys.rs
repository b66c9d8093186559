//! What a prompt key costs the gateway per request: `cargo bench -p gateway --bench prompt_keys`.
//!
//! - `text`: `cache_aware`'s key (the prompt's text, read from the body in one pass);
//! - `tokens`: `kv_aware`'s key with `--tokenizer-path` (the chat template rendered, then
//!   encoded by Hugging Face's tokenizer), with the test tokenizer of
//!   `tests/fixtures/tokenizer` (a byte-level BPE of 600 tokens: more tokens per byte than
//!   a real model's, so an upper bound on the encoding).
//!
//! - `tokens_cached`: the same with the gateway's caches (`--tokenizer-cache-size`), the
//!   same prompt sent again: its ids come from the memo of chat prompts (a rollout
//!   group's samples, `n` requests for one prompt, a retry);
//! - `tokens_rendered`: with the caches, a prompt never sent before whose every piece was
//!   (a conversation's earlier turns, a shared system prompt): rendered, then encoded from
//!   the pieces cache (a template variable the template ignores changes each time);
//! - `tokens_next_turn`: with the caches, a conversation whose last turn is new each time
//!   (only that piece is encoded).
//!
//! All over the same chat bodies (a system prompt and 2, 8 and 32 turns), in one run: the
//! ratio is what tokenizing adds.

use std::hint::black_box;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use gateway::proxy::Endpoint;
use gateway::proxy::prompt::{prompt_key, routing_key};
use serde_json::json;
use sglang::tokenizer::Tokenizer;

fn body(turns: usize) -> Vec<u8> {
    body_with(turns, "")
}

/// `body(turns)` whose last message ends with `last`.
fn body_with(turns: usize, last: &str) -> Vec<u8> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant. Answer briefly and say what you did."}),
    ];
    for i in 0..turns {
        let (role, text) = if i % 2 == 0 {
            (
                "user",
                format!(
                    "Question {i}: where do the tall trees grow near the old stone bridge, and why?"
                ),
            )
        } else {
            (
                "assistant",
                format!(
                    "Answer {i}: the quick brown fox jumps over the lazy dog and then runs into a quiet forest."
                ),
            )
        };
        messages.push(json!({"role": role, "content": text}));
    }
    if let Some(serde_json::Value::String(s)) = messages.last_mut().map(|m| &mut m["content"]) {
        s.push_str(last);
    }
    serde_json::to_vec(&json!({"model": "m", "messages": messages, "stream": true})).unwrap()
}

/// `body` with `chat_template_kwargs` `{"take": n}`: a prompt the memo has not met whose
/// render is the same (the template does not read `take`).
fn with_kwarg(body: &[u8], n: u64) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(body).unwrap();
    v["chat_template_kwargs"] = json!({ "take": n });
    serde_json::to_vec(&v).unwrap()
}

/// `name`: the routing key through `tok` of the body `make(n)` gives for the `n`-th
/// iteration (each made ahead, outside the timing).
fn fresh(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: String,
    tok: &Tokenizer,
    mut make: impl FnMut(u64) -> Vec<u8>,
) {
    let mut n = 0u64;
    g.bench_function(name, |x| {
        x.iter_batched(
            || {
                n += 1;
                make(n)
            },
            |b| routing_key(Endpoint::ChatCompletions, black_box(&b), Some(tok)),
            criterion::BatchSize::SmallInput,
        )
    });
}

fn keys(c: &mut Criterion) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer");
    let tok = Tokenizer::load(&dir, None).expect("the test tokenizer");
    let cached = Tokenizer::load(&dir, None)
        .expect("the test tokenizer")
        .with_cache(64 << 20);
    assert!(cached.caches_pieces() && cached.remembers_chats());
    let mut g = c.benchmark_group("prompt_keys");
    // The body of `gateway/bench/gateway_bench.sh` (`gateway/bench/lua/chat.lua`): one user message of 1 KiB.
    let wrk = serde_json::to_vec(&json!({
        "model": "moongate-sim",
        "messages": [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. ".repeat(23)}],
        "max_tokens": 16,
        "stream": false,
    }))
    .unwrap();
    g.throughput(Throughput::Bytes(wrk.len() as u64));
    g.bench_function("text/wrk", |x| {
        x.iter(|| prompt_key(Endpoint::ChatCompletions, black_box(&wrk)))
    });
    g.bench_function("tokens_cached/wrk", |x| {
        x.iter(|| routing_key(Endpoint::ChatCompletions, black_box(&wrk), Some(&cached)))
    });
    fresh(&mut g, "tokens_rendered/wrk".into(), &cached, |n| {
        with_kwarg(&wrk, n)
    });
    for turns in [2, 8, 32] {
        let b = body(turns);
        g.throughput(Throughput::Bytes(b.len() as u64));
        g.bench_function(format!("text/{turns}"), |x| {
            x.iter(|| prompt_key(Endpoint::ChatCompletions, black_box(&b)))
        });
        g.bench_function(format!("tokens/{turns}"), |x| {
            x.iter(|| routing_key(Endpoint::ChatCompletions, black_box(&b), Some(&tok)))
        });
        g.bench_function(format!("tokens_cached/{turns}"), |x| {
            x.iter(|| routing_key(Endpoint::ChatCompletions, black_box(&b), Some(&cached)))
        });
        fresh(&mut g, format!("tokens_rendered/{turns}"), &cached, |n| {
            with_kwarg(&b, n)
        });
        // A new last turn each time.
        fresh(&mut g, format!("tokens_next_turn/{turns}"), &cached, |n| {
            body_with(turns, &format!(" (take {n})"))
        });
    }
    g.finish();
}

criterion_group!(benches, keys);
criterion_main!(benches);
