//! Master core throughput on one core with 1 M keys:
//! `cargo bench -p kvstore --bench master_core`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvstore::master::{ClientId, ReplicateConfig, SegmentSpec};
use kvstore::{Master, MasterConfig};

const KEYS: usize = 1_000_000;
const PAGE: u64 = 4096;

/// A SGLang-HiCache-like page key: 64 hex characters.
fn key(i: u64) -> String {
    format!(
        "{:016x}{:016x}{:016x}{:016x}",
        i,
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        !i,
        i ^ 0x5555
    )
}

/// A master with 16 segments of 4 GiB (metadata only; no memory behind them) and 1 M
/// complete page objects.
fn populated() -> (Arc<Master>, Vec<String>) {
    let m = Arc::new(Master::new(MasterConfig::default()).unwrap());
    let owner = ClientId::from_u128(1);
    for s in 0..16u64 {
        m.mount_segment(
            owner,
            SegmentSpec {
                name: format!("node-{s}"),
                base: (s + 1) << 40,
                size: 4 << 30,
                endpoint: format!("te-{s}"),
            },
        )
        .unwrap();
    }
    let writer = ClientId::from_u128(7);
    let cfg = ReplicateConfig::default();
    let keys: Vec<String> = (0..KEYS as u64).map(key).collect();
    for k in &keys {
        m.put_start(writer, k, PAGE, &cfg).unwrap();
        m.put_end(writer, k).unwrap();
    }
    (m, keys)
}

/// Writes `key(i)` into a reused buffer, as a request handler would hold a key it just
/// parsed: the lookup, not fetching the test's own key list, is what is measured.
fn key_into(i: u64, buf: &mut String) -> &str {
    use std::fmt::Write;
    buf.clear();
    write!(
        buf,
        "{:016x}{:016x}{:016x}{:016x}",
        i,
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        !i,
        i ^ 0x5555
    )
    .unwrap();
    buf
}

fn bench(c: &mut Criterion) {
    let (m, keys) = populated();
    // Visit keys in a scrambled order so lookups miss the cache like real traffic.
    let order: Vec<usize> = (0..KEYS).map(|i| (i * 7_919 + 13) % KEYS).collect();
    let mut g = c.benchmark_group("master_core_1M_keys");
    g.throughput(Throughput::Elements(1));
    g.measurement_time(Duration::from_secs(5));
    // Reference measured in the same run: a std HashMap<String, u64> lookup over the same
    // 1 M keys in the same order (the memory-bound floor of any keyed lookup here).
    let reference: std::collections::HashMap<String, u64> =
        keys.iter().cloned().zip(0u64..).collect();
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
