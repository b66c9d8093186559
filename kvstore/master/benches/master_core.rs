//! Master core throughput on one core with 1 M keys:
//! `cargo bench -p kvstore --bench master_core`.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvmaster::Master;
use kvmaster::master::{ClientId, ReplicateConfig};

mod common;

use common::{PAGE, key, key_into};

const KEYS: usize = 1_000_000;

/// Reference and subject in alternating slices of 50 000 lookups, so load from other
/// processes hits both alike; prints per-slice rates and the median cost ratio.
fn interleaved(m: &Master, reference: &HashMap<String, u64>, order: &[usize]) {
    let slice = 50_000;
    let mut buf = String::with_capacity(64);
    let (mut ratios, mut refs, mut gets) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..12 {
        let base = round * slice * 2;
        let t = Instant::now();
        for j in 0..slice {
            let k = key_into(order[(base + j) % KEYS] as u64, &mut buf);
            black_box(reference.get(k));
        }
        let r = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for j in 0..slice {
            let k = key_into(order[(base + slice + j) % KEYS] as u64, &mut buf);
            black_box(m.get_replicas(k).unwrap());
        }
        let g = t.elapsed().as_secs_f64();
        ratios.push(g / r);
        refs.push(slice as f64 / r);
        gets.push(slice as f64 / g);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    println!(
        "interleaved, 1 M keys: get_replicas median {:.0}/s (best {:.0}/s), std HashMap get median {:.0}/s; \
         get_replicas costs {:.2}x a HashMap get (median of 12 slice pairs)",
        median(&mut gets.clone()),
        gets.iter().cloned().fold(0.0, f64::max),
        median(&mut refs),
        median(&mut ratios)
    );
}

fn bench(c: &mut Criterion) {
    // 16 segments of 4 GiB and 1 M complete pages.
    let (m, keys) = common::populated(KEYS as u64, 16, 4 << 30);
    // Visit keys in a scrambled order so lookups miss the cache like real traffic.
    let order: Vec<usize> = (0..KEYS).map(|i| (i * 7_919 + 13) % KEYS).collect();
    let mut g = c.benchmark_group("master_core_1M_keys");
    g.throughput(Throughput::Elements(1));
    g.measurement_time(Duration::from_secs(5));
    // Reference measured in the same run: a std HashMap<String, u64> lookup over the same
    // 1 M keys in the same order (the memory-bound floor of any keyed lookup here).
    let reference: HashMap<String, u64> = keys.iter().cloned().zip(0u64..).collect();
    interleaved(&m, &reference, &order);
    let mut r = 0usize;
    let mut buf = String::with_capacity(64);
    g.bench_function("reference_hashmap_get", |b| {
        b.iter(|| {
            r = (r + 1) % KEYS;
            black_box(reference.get(key_into(order[r] as u64, &mut buf)));
        })
    });
    g.bench_function("get_replicas_hot_key", |b| {
        b.iter(|| black_box(m.get_replicas(&keys[0]).unwrap()))
    });
    let mut i = 0usize;
    g.bench_function("get_replicas", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(m.get_replicas(key_into(order[i] as u64, &mut buf)).unwrap());
        })
    });
    let writer = ClientId::from_u128(7);
    let cfg = ReplicateConfig::default();
    let mut next = KEYS as u64;
    g.bench_function("put_start+put_end", |b| {
        b.iter_custom(|iters| {
            let fresh: Vec<String> = (0..iters).map(|j| key(next + j)).collect();
            next += iters;
            let t = Instant::now();
            for k in &fresh {
                black_box(m.put_start(writer, k, PAGE, &cfg).unwrap());
                m.put_end(writer, k).unwrap();
            }
            let took = t.elapsed();
            // Back to 1 M keys, untimed.
            m.batch_remove(&fresh[..fresh.len().min(4096)], true)
                .unwrap();
            for k in fresh.iter().skip(4096) {
                m.remove(k, true).unwrap();
            }
            took
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
