//! Tables keyed by what clients send stay bounded in memory however many distinct keys
//! arrive: the sticky-session table (routing keys) and the Responses API's table of
//! response ids, counted by a global allocator over 200,000 distinct keys of the longest
//! length allowed.

use std::alloc::System;
use std::time::Duration;

use gateway::select::affinity::MAX_ROUTING_KEY_LEN;
use gateway::select::responses::{MAX_RESPONSE_ID_LEN, ResponseHomes};
use gateway::select::sticky::{Sticky, StickyConfig};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The tests count one process-wide allocator: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Bytes live now (allocated minus freed; realloc growth counts).
fn live() -> isize {
    let s = GLOBAL.stats();
    s.bytes_allocated as isize - s.bytes_deallocated as isize
}

#[test]
fn two_hundred_thousand_keys_hold_no_more_than_the_bound() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let max_keys = 1_000;
    let table = Sticky::new(StickyConfig {
        max_keys,
        max_idle: Duration::from_secs(3600),
    });
    let mut key = vec![b'k'; MAX_ROUTING_KEY_LEN];
    let mut fill = |from: u32, to: u32| {
        for i in from..to {
            key[..4].copy_from_slice(&i.to_le_bytes());
            table.assign(&key, u64::from(i));
        }
    };
    let base = live();
    fill(0, 20_000);
    let after_20k = live() - base;
    fill(20_000, 200_000);
    let after_200k = live() - base;
    assert_eq!(table.len(), max_keys);
    // A key (256 bytes) plus its entry and index slot: well under 1 KiB each.
    let per_key = after_200k / max_keys as isize;
    eprintln!(
        "{max_keys} keys of {MAX_ROUTING_KEY_LEN} bytes: {after_200k} bytes live, {per_key} per key"
    );
    assert!(per_key < 1024, "{per_key} bytes per key");
    assert!(
        after_200k <= after_20k + 64 * 1024,
        "grew from {after_20k} to {after_200k} bytes"
    );
}

#[test]
fn two_hundred_thousand_response_ids_hold_no_more_than_the_bound() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let max_ids = 1_000;
    let homes = ResponseHomes::new(max_ids);
    let worker = "http://worker-with-a-long-host-name.example:30000";
    let mut id = "r".repeat(MAX_RESPONSE_ID_LEN);
    let mut fill = |from: u32, to: u32| {
        for i in from..to {
            id.replace_range(..8, &format!("{i:08x}"));
            homes.bind(&id, worker);
        }
    };
    let base = live();
    fill(0, 20_000);
    let after_20k = live() - base;
    fill(20_000, 200_000);
    let after_200k = live() - base;
    assert_eq!(homes.len(), max_ids);
    let per_id = after_200k / max_ids as isize;
    eprintln!(
        "{max_ids} ids of {MAX_RESPONSE_ID_LEN} bytes: {after_200k} bytes live, {per_id} per id"
    );
    assert!(per_id < 1024, "{per_id} bytes per id");
    assert!(
        after_200k <= after_20k + 64 * 1024,
        "grew from {after_20k} to {after_200k} bytes"
    );
}
