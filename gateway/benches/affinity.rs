//! What affinity costs per request: `cargo bench -p gateway --bench affinity`.
//!
//! One selection through `Policy::select` over 4, 64 and 1,000 ready workers:
//! `consistent_hashing` with a routing key (ring lookup; the ring is built once per worker
//! set), `manual` with a key already seated (table hit, and the prompt recorded in
//! `cache_aware`'s tree), and as the reference `round_robin` (count and take the n-th) and
//! `power_of_two` (the default). Also the ring's build for a new worker set (what a
//! membership change costs the first request after it).

mod common;

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use gateway::config::PolicyKind;
use gateway::select::affinity::{Affinity, HashRing};
use gateway::select::{Policy, Want};
use openapi::workers::WorkerType;

use common::workers;

fn bench(c: &mut Criterion) {
    let prompt = b"c"
        .iter()
        .chain(&[b'x'; 1024])
        .copied()
        .collect::<Vec<u8>>();
    let keys: Vec<String> = (0..1024).map(|i| format!("session-{i}")).collect();
    let mut g = c.benchmark_group("select");
    for n in [4usize, 64, 1000] {
        let set = workers(n);
        for kind in [
            PolicyKind::RoundRobin,
            PolicyKind::PowerOfTwo,
            PolicyKind::ConsistentHashing,
            PolicyKind::Manual,
        ] {
            let policy = Policy::new(kind);
            let mut i = 0usize;
            g.bench_with_input(BenchmarkId::new(kind.to_string(), n), &n, |b, _| {
                b.iter(|| {
                    i = (i + 1) % keys.len();
                    let want = Want {
                        worker_type: WorkerType::Regular,
                        model: Some("m"),
                        exclude: &[],
                        key: policy.needs_key().then_some(&prompt[..]),
                        affinity: Affinity {
                            key: Some(keys[i].as_bytes()),
                            target: None,
                        },
                    };
                    black_box(policy.select(&set, &want).expect("a worker"));
                })
            });
        }
    }
    g.finish();
    let mut g = c.benchmark_group("ring_build");
    for n in [4usize, 64, 1000] {
        let set = workers(n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                // A fresh ring each time: the first pick after a membership change.
                let ring = HashRing::default();
                black_box(ring.pick(&set, b"k", |_| true).expect("a worker"));
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
