//! Metadata bytes per key at 1 M keys: `cargo bench -p kvstore --bench master_memory`.
//!
//! A counting global allocator measures every byte the master allocates while 1 M page
//! objects (64-character keys, one replica each) are put; the key bytes themselves are
//! subtracted. RSS growth is printed too (it includes the allocator's own overhead).

use std::alloc::System;

mod common;

use kvmaster::{Master, MasterConfig};
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
    let keys: Vec<String> = (0..KEYS).map(common::key).collect();
    let rss0 = rss_kib();
    let region = Region::new(GLOBAL);
    let m = Master::new(MasterConfig::default()).unwrap();
    common::mount(&m, 16, 4 << 30);
    let empty = region.change();
    common::fill(&m, &keys);
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
