//! Metadata bytes per key at 1 M keys: `cargo bench -p kvstore --bench master_memory`.
//!
//! A counting global allocator measures every byte the master allocates while 1 M page
//! objects (64-character keys, one replica each) are put; the key bytes themselves are
//! subtracted. RSS growth is printed too (it includes the allocator's own overhead).

use std::alloc::System;

use kvstore::master::{ClientId, ReplicateConfig, SegmentSpec};
use kvstore::{Master, MasterConfig};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const KEYS: u64 = 1_000_000;
const KEY_LEN: u64 = 64;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    // Criterion-style flags from `cargo bench` are ignored.
    let keys: Vec<String> = (0..KEYS)
        .map(|i| {
            format!(
                "{:016x}{:016x}{:016x}{:016x}",
                i,
                i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                !i,
                i ^ 0x5555
            )
        })
        .collect();
    let owner = ClientId::from_u128(1);
    let writer = ClientId::from_u128(7);
    let cfg = ReplicateConfig::default();
    let rss0 = rss_kib();
    let region = Region::new(GLOBAL);
    let m = Master::new(MasterConfig::default()).unwrap();
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
    let empty = region.change();
    for k in &keys {
        m.put_start(writer, k, 4096, &cfg).unwrap();
        m.put_end(writer, k).unwrap();
    }
    let full = region.change();
    let rss1 = rss_kib();
    // stats_alloc counts realloc growth in bytes_allocated already.
    let live = |c: stats_alloc::Stats| c.bytes_allocated as i64 - c.bytes_deallocated as i64;
    let per_key = (live(full) - live(empty)) as f64 / KEYS as f64;
    println!("master_memory: {KEYS} keys of {KEY_LEN} bytes, one replica each");
    println!("  heap bytes per key (total):          {per_key:.1}");
    println!(
        "  heap bytes per key (minus the key):  {:.1}",
        per_key - KEY_LEN as f64
    );
    println!(
        "  RSS growth per key (incl. malloc):   {:.1}",
        (rss1.saturating_sub(rss0) * 1024) as f64 / KEYS as f64
    );
    println!(
        "  shard containers per key:           {:.1}",
        m.container_bytes() as f64 / KEYS as f64
    );
    println!("  keys held: {}", m.stats().keys);
}
