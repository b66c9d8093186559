//! The `kv_aware` index as it grows: heap bytes per cached block, the rate it takes block
//! events in, and what matching a prompt against it costs.
//!
//! Each `BlockStored` event carries 32 pages (a 2048-token prompt in 64-token pages) of
//! one of 64 workers; every page hash is distinct. A match is a stored prompt's 32 hashes
//! against every worker, as `kv_aware` asks per request.

use std::hint::black_box;
use std::time::Instant;

use gateway::select::kv_aware::index::{KvIndex, MAX_SLOTS};
use sglang::kv_events::wire::KvEvent;

/// Pages per event (and per matched prompt).
const PAGES: u64 = 32;
/// Events built at a time, outside the timed and counted region.
const CHUNK: u64 = 1024;

/// What one decade of blocks measured.
pub struct IndexRow {
    pub blocks: u64,
    pub heap_bytes_per_block: f64,
    pub ingest_blocks_per_s: f64,
    pub match_mean_ns: f64,
    pub match_p99_ns: f64,
}

/// The CSV header of [`IndexRow`]s.
pub const HEADER: &str =
    "blocks,heap_bytes_per_block,ingest_blocks_per_s,match_mean_ns,match_p99_ns";

impl IndexRow {
    /// Its CSV line.
    pub fn csv(&self) -> String {
        format!(
            "{},{:.1},{:.0},{:.0},{:.0}",
            self.blocks,
            self.heap_bytes_per_block,
            self.ingest_blocks_per_s,
            self.match_mean_ns,
            self.match_p99_ns
        )
    }
}

/// Page `p` of event `e`: distinct for every (e, p) (an odd multiplier is a bijection).
fn page_hash(e: u64, p: u64) -> i64 {
    (e * PAGES + p).wrapping_mul(0x9e37_79b9_7f4a_7c15) as i64
}

fn event(e: u64) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: (0..PAGES).map(|p| page_hash(e, p)).collect(),
        parent_block_hash: None,
        token_ids: Vec::new(),
        block_size: 64,
        lora_id: None,
        medium: Some("GPU".into()),
    }
}

/// Grows an index decade by decade from 1,000 blocks (rounded to whole events) up to
/// `max_blocks`, timing `matches` matches at each. `live` answers the heap bytes allocated
/// and not freed so far.
pub fn measure(max_blocks: u64, matches: usize, live: impl Fn() -> i64) -> Vec<IndexRow> {
    let mut ix = KvIndex::new();
    let (mut events, mut heap) = (0u64, 0i64);
    let mut rows = Vec::new();
    let mut decade = 1_000u64;
    println!("{HEADER}");
    while decade <= max_blocks {
        let want = decade.div_ceil(PAGES);
        let (mut added, mut took) = (0u64, 0f64);
        while events < want {
            let chunk: Vec<KvEvent> = (events..want.min(events + CHUNK)).map(event).collect();
            let before = live();
            let t = Instant::now();
            for (k, ev) in chunk.iter().enumerate() {
                ix.apply(((events + k as u64) % MAX_SLOTS as u64) as usize, ev);
            }
            took += t.elapsed().as_secs_f64();
            heap += live() - before;
            added += chunk.len() as u64;
            events += chunk.len() as u64;
        }
        let blocks = ix.len() as u64;
        let mut lat = Vec::with_capacity(matches);
        let mut pick = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..matches {
            pick ^= pick << 13;
            pick ^= pick >> 7;
            pick ^= pick << 17;
            let e = pick % events;
            let hashes: Vec<i64> = (0..PAGES).map(|p| page_hash(e, p)).collect();
            let t = Instant::now();
            black_box(ix.overlap(&hashes, u64::MAX, MAX_SLOTS, |_| 0));
            lat.push(t.elapsed().as_nanos() as f64);
        }
        let (match_mean_ns, match_p99_ns) = crate::mean_and_p99(&mut lat);
        let row = IndexRow {
            blocks,
            heap_bytes_per_block: heap as f64 / blocks as f64,
            ingest_blocks_per_s: (added * PAGES) as f64 / took.max(f64::MIN_POSITIVE),
            match_mean_ns,
            match_p99_ns,
        };
        println!("{}", row.csv());
        rows.push(row);
        decade = decade.saturating_mul(10);
    }
    rows
}
