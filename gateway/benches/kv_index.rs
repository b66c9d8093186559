//! The `kv_aware` index: `cargo bench -p gateway --bench kv_index`.
//!
//! - `ingest`: applying `BlockStored` events (32 pages each, a 2048-token prompt in
//!   64-token pages) to an index, per block; also decoding them from SGLang's msgpack
//!   first, and `BlockRemoved` events. Target: >= 1 M block events per second, one core.
//! - `match`: the overlap of a 32-page prompt against an index of 1 M blocks over 8
//!   workers (hashes given), with the prompt's SHA-256 page hashes computed too, and
//!   with them found in the gateway's memo of digests (`hash::DigestMemo`, every prompt
//!   met before).
//!   Target: >= 200 k matches per second at 1 M blocks, one core.
//! - `store`: looking a 32-page prompt up in a KV master holding 1 M objects, page by
//!   page, as `kv_aware` does for the pages past a worker's cached prefix (all found: the
//!   most lookups a prompt costs); and in a view of the same pages followed from the
//!   master's events (a gateway that does not host the master).
//!
//! Reference in the same run: one `HashMap` insert per block (the floor of any index).

mod common;

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gateway::select::kv_aware::index::KvIndex;
use gateway::select::kv_aware::store::{KeyFormat, Lookup, Probe, StoreView};
use kvmaster::MasterConfig;
use kvmaster::master::{ClientId, ReplicateConfig};
use sglang::kv_events::hash;
use sglang::kv_events::wire::{EventBatch, KvEvent};

const PAGES: usize = 32;
const PAGE: usize = 64;

fn event(seed: i64) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: (0..PAGES as i64)
            .map(|i| seed.wrapping_mul(0x9e37_79b9).wrapping_add(i))
            .collect(),
        parent_block_hash: None,
        token_ids: vec![7; PAGES * PAGE],
        block_size: PAGE as u32,
        lora_id: None,
        medium: Some("GPU".into()),
    }
}

fn ingest(c: &mut Criterion) {
    let events: Vec<KvEvent> = (0..1024).map(event).collect();
    let payloads: Vec<Vec<u8>> = events
        .chunks(16)
        .map(|ch| {
            EventBatch {
                ts: 0.0,
                events: ch.to_vec(),
                attn_dp_rank: Some(0),
            }
            .encode()
        })
        .collect();
    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements((events.len() * PAGES) as u64));
    g.bench_function("apply_block_stored", |b| {
        b.iter_batched_ref(
            KvIndex::new,
            |ix| {
                for (i, e) in events.iter().enumerate() {
                    ix.apply(i % 8, e);
                }
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.bench_function("decode_and_apply", |b| {
        b.iter_batched_ref(
            KvIndex::new,
            |ix| {
                for (i, p) in payloads.iter().enumerate() {
                    let batch = EventBatch::decode(p).expect("decodes");
                    ix.apply_batch(i % 8, &batch);
                }
            },
            criterion::BatchSize::LargeInput,
        )
    });
    let removed: Vec<KvEvent> = events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored { block_hashes, .. } => KvEvent::BlockRemoved {
                block_hashes: block_hashes.clone(),
                medium: None,
            },
            _ => KvEvent::AllBlocksCleared,
        })
        .collect();
    g.bench_function("apply_block_removed", |b| {
        b.iter_batched_ref(
            || {
                let mut ix = KvIndex::new();
                for (i, e) in events.iter().enumerate() {
                    ix.apply(i % 8, e);
                }
                ix
            },
            |ix| {
                for (i, e) in removed.iter().enumerate() {
                    ix.apply(i % 8, e);
                }
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.bench_function("reference_hashmap_insert", |b| {
        b.iter_batched_ref(
            std::collections::HashMap::<i64, u64>::new,
            |m| {
                for e in &events {
                    if let KvEvent::BlockStored { block_hashes, .. } = e {
                        for h in block_hashes {
                            *m.entry(*h).or_default() |= 1;
                        }
                    }
                }
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn matching(c: &mut Criterion) {
    // 1 M blocks: 31 250 prompts of 32 pages, spread over 8 workers.
    let mut ix = KvIndex::new();
    let prompts: Vec<Vec<u32>> = (0..64u32)
        .map(|p| {
            (0..(PAGES * PAGE) as u32)
                .map(|t| p * 100_000 + t)
                .collect()
        })
        .collect();
    let mut hashed: Vec<Vec<i64>> = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let h = hash::block_hashes(p, PAGE);
        ix.apply(
            i % 8,
            &KvEvent::BlockStored {
                block_hashes: h[..PAGES / 2 + i % (PAGES / 2)].to_vec(),
                parent_block_hash: None,
                token_ids: Vec::new(),
                block_size: PAGE as u32,
                lora_id: None,
                medium: None,
            },
        );
        hashed.push(h);
    }
    for s in 64..31_400i64 {
        ix.apply((s % 8) as usize, &event(s));
    }
    assert!(ix.len() >= 1_000_000, "{}", ix.len());
    let mut g = c.benchmark_group("match");
    g.throughput(Throughput::Elements(1));
    let mut k = 0;
    g.bench_function("overlap_1m_blocks_32_pages", |b| {
        b.iter(|| {
            k = (k + 1) % hashed.len();
            black_box(ix.overlap(&hashed[k], 0xff, 8, |_| 0))
        })
    });
    g.bench_function("hash_and_overlap_1m_blocks_32_pages", |b| {
        b.iter(|| {
            k = (k + 1) % prompts.len();
            let h = hash::block_hashes(&prompts[k], PAGE);
            black_box(ix.overlap(&h, 0xff, 8, |_| 0))
        })
    });
    // The same, the digests from the gateway's memo (every prompt met before).
    let memo = hash::DigestMemo::default();
    for p in &prompts {
        memo.page_digests(p, PAGE);
    }
    g.bench_function("memo_hash_and_overlap_1m_blocks_32_pages", |b| {
        b.iter(|| {
            k = (k + 1) % prompts.len();
            let h: Vec<_> = memo
                .page_digests(&prompts[k], PAGE)
                .iter()
                .map(hash::block_hash)
                .collect();
            black_box(ix.overlap(&h, 0xff, 8, |_| 0))
        })
    });
    g.finish();
}

fn store(c: &mut Criterion) {
    let master = common::master(MasterConfig::default());
    let owner = ClientId::from_u128(1);
    let keys = KeyFormat::new("{hash}_0_k");
    let put = |d: &hash::PageDigest| {
        let mut name = String::new();
        keys.write(d, &mut name);
        let rc = ReplicateConfig::default();
        master.put_start(owner, &name, 64, &rc).expect("put_start");
        master.put_end(owner, &name).expect("put_end");
    };
    let prompts: Vec<Vec<hash::PageDigest>> = (0..64u32)
        .map(|p| {
            let t: Vec<u32> = (0..(PAGES * PAGE) as u32)
                .map(|t| p * 100_000 + t)
                .collect();
            hash::page_digests(&t, PAGE)
        })
        .collect();
    prompts.iter().flatten().for_each(&put);
    for i in 0..1_000_000u32 {
        let mut d = [0u8; 32];
        d[..4].copy_from_slice(&i.to_le_bytes());
        put(&d);
    }
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(1));
    let mut k = 0;
    g.bench_function("probe_1m_objects_32_pages", |b| {
        b.iter(|| {
            k = (k + 1) % prompts.len();
            let mut p = Probe::new(Lookup::Master(master.clone()), &keys, &prompts[k]);
            black_box(p.run_from(0))
        })
    });
    // The same pages in a view followed from the master's events (another gateway's).
    let view = std::sync::Arc::new(StoreView::default());
    let (_, held) = master.held_all();
    let snapshot: Vec<_> = held
        .into_iter()
        .map(|(key, _)| openapi::master::ObjectEvent {
            key,
            held: Some(openapi::master::HeldTier::Memory),
        })
        .collect();
    view.replace(&keys, &snapshot);
    g.bench_function("probe_view_1m_pages_32_pages", |b| {
        b.iter(|| {
            k = (k + 1) % prompts.len();
            let mut p = Probe::new(Lookup::View(view.clone()), &keys, &prompts[k]);
            black_box(p.run_from(0))
        })
    });
    g.finish();
}

criterion_group!(benches, ingest, matching, store);
criterion_main!(benches);
