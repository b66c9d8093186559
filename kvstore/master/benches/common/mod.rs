//! Shared setup of the master benches: page-like keys and a master with virtual segments.

#![allow(dead_code)]

use kvmaster::master::{ClientId, ReplicateConfig, SegmentSpec};
use kvmaster::{Master, MasterConfig};

/// Length of a page in the benches.
pub const PAGE: u64 = 4096;

/// A SGLang-HiCache-like page key: 64 hex characters.
pub fn key(i: u64) -> String {
    let mut s = String::with_capacity(64);
    key_into(i, &mut s);
    s
}

/// Writes `key(i)` into a reused buffer (what a handler holding a parsed key looks like).
pub fn key_into(i: u64, buf: &mut String) -> &str {
    use std::fmt::Write;
    buf.clear();
    let mix = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    write!(buf, "{i:016x}{mix:016x}{:016x}{:016x}", !i, i ^ 0x5555).unwrap();
    buf
}

/// Mounts `n` segments of `size` bytes (metadata only; no memory behind them).
pub fn mount(m: &Master, n: u64, size: u64) {
    for s in 0..n {
        let spec = SegmentSpec {
            name: format!("node-{s}"),
            base: (s + 1) << 40,
            size,
            endpoint: format!("te-{s}"),
            disk_bytes: 0,
            disk_write_through: false,
        };
        m.mount_segment(ClientId::from_u128(1), spec).unwrap();
    }
}

/// Puts (start + end) one page under each key.
pub fn fill<'a>(m: &Master, keys: impl IntoIterator<Item = &'a String>) {
    let writer = ClientId::from_u128(7);
    let cfg = ReplicateConfig::default();
    for k in keys {
        m.put_start(writer, k, PAGE, &cfg).unwrap();
        m.put_end(writer, k).unwrap();
    }
}

/// A default master with `segments` segments of `size` bytes and `n` pages.
pub fn populated(n: u64, segments: u64, size: u64) -> (Master, Vec<String>) {
    let m = Master::new(MasterConfig::default()).unwrap();
    mount(&m, segments, size);
    let keys: Vec<String> = (0..n).map(key).collect();
    fill(&m, &keys);
    (m, keys)
}
