//! What `cache_aware` adds per request: `cargo bench -p gateway --bench cache_aware`.
//!
//! A ~1 KiB chat body (a 900-byte system prompt shared by its family, a short question),
//! eight workers, trees warmed with 20 000 earlier requests of 50 families. Measured: the
//! prompt key alone, one decision (match + insert under the tree's lock), both together,
//! and as the reference the gateway's own `model`/`stream` parse of the same body. An
//! eviction pass over the warmed tree is measured too (it runs every
//! `--eviction-interval-secs`, holding the tree's lock).

mod common;

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use gateway::proxy::Endpoint;
use gateway::proxy::inspect::routing_fields;
use gateway::proxy::prompt::prompt_key;
use gateway::select::cache_aware::{CacheAware, CacheAwareConfig};
use gateway::workers::Worker;

fn body(family: usize, n: usize) -> Vec<u8> {
    let system = format!("You are assistant number {family}. ")
        + &"Answer carefully, cite sources, keep it short. ".repeat(19);
    serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("Question {n}: what is the capital of country {n}?")},
        ],
        "max_tokens": 16,
    }))
    .expect("json")
}

use common::workers;

fn bench(c: &mut Criterion) {
    let ws = workers(8);
    let refs: Vec<&Arc<Worker>> = ws.iter().collect();
    let policy = CacheAware::new(CacheAwareConfig::default());
    for n in 0..20_000 {
        let key = prompt_key(Endpoint::ChatCompletions, &body(n % 50, n)).expect("key");
        policy.decide(&refs, Some(&key));
    }
    let sample = body(7, 123_456);
    eprintln!("body: {} bytes", sample.len());
    let key = prompt_key(Endpoint::ChatCompletions, &sample).expect("key");
    let mut g = c.benchmark_group("cache_aware_1k_chat");
    g.bench_function("reference: routing_fields (model, stream)", |b| {
        b.iter(|| black_box(routing_fields(black_box(&sample)).expect("parse")));
    });
    g.bench_function("prompt_key", |b| {
        b.iter(|| black_box(prompt_key(Endpoint::ChatCompletions, black_box(&sample))));
    });
    g.bench_function("decide (match + insert)", |b| {
        b.iter(|| black_box(policy.decide(&refs, Some(black_box(&key)))));
    });
    g.bench_function("prompt_key + decide", |b| {
        b.iter(|| {
            let k = prompt_key(Endpoint::ChatCompletions, black_box(&sample));
            black_box(policy.decide(&refs, k.as_deref()).0.uid())
        });
    });
    g.finish();
    c.bench_function("maintain over a warm tree (nothing to evict)", |b| {
        b.iter(|| black_box(policy.maintain(|_| true)));
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
