//! The `cache_aware` tree as it grows: heap bytes per byte of prompt it was sent, and what
//! matching a prompt against it costs.
//!
//! The tree is a radix tree of prompt text, not of pages, so its unit is the prompt byte
//! (a 64-token page of English text is about 256 of them). Prompts are ~2 KiB chat keys of
//! 64 families (a 900-byte system prompt each family shares, then the question), sent to
//! 64 workers; a match is a stored prompt's key against every worker.

use std::hint::black_box;
use std::time::Instant;

use gateway::select::tree::RadixTree;

/// What one decade of prompt bytes measured.
pub struct TreeRow {
    pub prompt_bytes: u64,
    pub heap_bytes_per_prompt_byte: f64,
    pub nodes: usize,
    pub match_mean_ns: f64,
    pub match_p99_ns: f64,
}

/// The CSV header of [`TreeRow`]s.
pub const HEADER: &str = "prompt_bytes,heap_bytes_per_prompt_byte,nodes,match_mean_ns,match_p99_ns";

impl TreeRow {
    /// Its CSV line.
    pub fn csv(&self) -> String {
        format!(
            "{},{:.2},{},{:.0},{:.0}",
            self.prompt_bytes,
            self.heap_bytes_per_prompt_byte,
            self.nodes,
            self.match_mean_ns,
            self.match_p99_ns
        )
    }
}

/// Prompt `n`'s key: its family's system prompt, then its own question.
fn prompt(n: u64) -> Vec<u8> {
    let family = n % 64;
    let mut key = format!("system: You are assistant number {family}. ").into_bytes();
    while key.len() < 900 {
        key.extend_from_slice(b"Answer carefully, cite sources, keep it short. ");
    }
    let mix = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    while key.len() < 2048 {
        key.extend_from_slice(
            format!("user: question {n} ({mix:x}) about item {}. ", key.len()).as_bytes(),
        );
    }
    key
}

/// Grows a tree decade by decade from 1 MB of prompts up to `max_bytes`, timing `matches`
/// matches at each. `live` answers the heap bytes allocated and not freed so far.
pub fn measure(max_bytes: u64, matches: usize, live: impl Fn() -> i64) -> Vec<TreeRow> {
    let mut tree = RadixTree::new();
    let (mut sent, mut bytes, mut heap) = (0u64, 0u64, 0i64);
    let mut rows = Vec::new();
    let mut decade = 1_000_000u64;
    println!("{HEADER}");
    while decade <= max_bytes {
        while bytes < decade {
            let key = prompt(sent);
            let before = live();
            tree.insert(&key, sent % 64);
            heap += live() - before;
            bytes += key.len() as u64;
            sent += 1;
        }
        let mut lat = Vec::with_capacity(matches);
        for k in 0..matches as u64 {
            let key = prompt(k.wrapping_mul(7_919) % sent);
            let t = Instant::now();
            black_box(tree.match_prefix(&key, |_| true));
            lat.push(t.elapsed().as_nanos() as f64);
        }
        let (match_mean_ns, match_p99_ns) = crate::mean_and_p99(&mut lat);
        let row = TreeRow {
            prompt_bytes: bytes,
            heap_bytes_per_prompt_byte: heap as f64 / bytes as f64,
            nodes: tree.node_count(),
            match_mean_ns,
            match_p99_ns,
        };
        println!("{}", row.csv());
        rows.push(row);
        decade = decade.saturating_mul(10);
    }
    rows
}
