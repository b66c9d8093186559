//! Property tests of the object lifecycle against the master's own bookkeeping:
//! space accounting is exact, replicas never overlap, nothing is readable before its
//! `put_end`, and eviction never takes a leased, hard-pinned or unfinished object.

use std::collections::HashSet;
use std::sync::Arc;

use proptest::prelude::*;

use super::tests::{client, master_with, small_config, spec};
use super::*;

#[derive(Clone, Debug)]
enum Op {
    Start {
        key: u8,
        len: u16,
        replicas: u8,
        soft: bool,
        hard: bool,
    },
    End(u8),
    Revoke(u8),
    Get(u8),
    Exists(u8),
    Remove(u8, bool),
    Advance(u32),
    Tick,
    Evict(u16),
    RemoveAll,
    Unmount(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..24;
    prop_oneof![
        6 => (key.clone(), 1u16..12_000, 1u8..4, any::<bool>(), any::<bool>())
            .prop_map(|(key, len, replicas, soft, hard)| Op::Start { key, len, replicas, soft, hard: hard && len % 4 == 0 }),
        5 => key.clone().prop_map(Op::End),
        1 => key.clone().prop_map(Op::Revoke),
        3 => key.clone().prop_map(Op::Get),
        1 => key.clone().prop_map(Op::Exists),
        2 => (key.clone(), any::<bool>()).prop_map(|(k, f)| Op::Remove(k, f)),
        2 => (0u32..40_000).prop_map(Op::Advance),
        1 => Just(Op::Tick),
        1 => (1u16..64).prop_map(Op::Evict),
        1 => Just(Op::RemoveAll),
        1 => (0u8..3).prop_map(Op::Unmount),
    ]
}

fn name(k: u8) -> String {
    format!("key-{k}")
}

/// Keys eviction must not take: a live lease, a hard pin, or an unfinished put not yet
/// past its release timeout.
fn protected(m: &Master, hard_pins: bool) -> HashSet<String> {
    let now = m.now_ms();
    let mut out = HashSet::new();
    for s in 0..m.shards.len() {
        let shard = m.lock_shard(s);
        for i in shard.indices() {
            let o = shard.get(i);
            let young = now < o.aux.saturating_add(m.config.put_start_release_timeout_ms);
            if o.has_lease(now) || (hard_pins && o.is_hard_pinned()) || (!o.is_complete() && young)
            {
                out.insert(o.key.as_str().to_string());
            }
        }
    }
    out
}

/// Space accounting and placement invariants, read from the master's internals.
fn check_invariants(m: &Master) -> Result<(), TestCaseError> {
    let mut spans: Vec<(Arc<Segment>, u64, u64)> = Vec::new();
    let mut keys = 0;
    for s in 0..m.shards.len() {
        let shard = m.lock_shard(s);
        prop_assert_eq!(
            shard.len(),
            m.shards[s].len.load(std::sync::atomic::Ordering::Relaxed)
        );
        keys += shard.len();
        let processing: HashSet<u32> = shard
            .indices()
            .filter(|&i| !shard.get(i).is_complete())
            .collect();
        prop_assert_eq!(
            &processing,
            &shard.processing.iter().copied().collect::<HashSet<_>>()
        );
        for i in shard.indices() {
            let o = shard.get(i);
            prop_assert!(!o.replicas.as_slice().is_empty());
            let mut segs = HashSet::new();
            for r in o.replicas.as_slice() {
                prop_assert!(
                    segs.insert(Arc::as_ptr(&r.segment)),
                    "two replicas on one segment"
                );
                spans.push((r.segment.clone(), r.segment.address_of(r.alloc), o.aligned));
            }
        }
    }
    for d in m.discarded.lock().iter() {
        for r in &d.replicas {
            spans.push((r.segment.clone(), r.segment.address_of(r.alloc), d.aligned));
        }
    }
    prop_assert_eq!(keys as u64, m.stats().keys);
    for seg in m.segments.read().list.iter() {
        let mut mine: Vec<(u64, u64)> = spans
            .iter()
            .filter(|(s, _, _)| Arc::ptr_eq(s, seg))
            .map(|(_, a, l)| (*a, *l))
            .collect();
        mine.sort_unstable();
        for w in mine.windows(2) {
            prop_assert!(
                w[0].0 + w[0].1 <= w[1].0,
                "replicas overlap on {}",
                seg.name()
            );
        }
        for (a, l) in &mine {
            prop_assert!(*a >= seg.base() && a + l <= seg.base() + seg.capacity_bytes());
        }
        let sum: u64 = mine.iter().map(|(_, l)| l).sum();
        prop_assert_eq!(
            seg.allocated_bytes(),
            sum,
            "usage of {} is not the sum of its replicas",
            seg.name()
        );
    }
    Ok(())
}

fn setup() -> (Master, Arc<ManualClock>) {
    let (m, clock) = master_with(small_config());
    for i in 0..3u64 {
        m.mount_segment(client(1), spec(&format!("s{i}"), (i + 1) << 32, 64 * 1024))
            .unwrap();
    }
    (m, clock)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn lifecycle_invariants(ops in proptest::collection::vec(op(), 1..120)) {
        let (m, clock) = setup();
        let writer = client(7);
        // Keys whose latest successful put_start was followed by a successful put_end.
        let mut ended: HashSet<String> = HashSet::new();
        for op in ops {
            match op {
                Op::Start { key, len, replicas, soft, hard } => {
                    let cfg = ReplicateConfig { replica_num: replicas.into(), soft_pin: soft, hard_pin: hard, ..Default::default() };
                    let mut guard = protected(&m, true);
                    guard.remove(&name(key));
                    if m.put_start(writer, &name(key), len.into(), &cfg).is_ok() {
                        ended.remove(&name(key));
                    }
                    for k in &guard {
                        prop_assert!(m.object(k).is_ok(), "put_start evicted protected {}", k);
                    }
                }
                Op::End(k) => {
                    if m.put_end(writer, &name(k)).is_ok() {
                        ended.insert(name(k));
                    }
                }
                Op::Revoke(k) => {
                    if m.put_revoke(writer, &name(k)).is_ok() {
                        ended.remove(&name(k));
                    }
                }
                Op::Get(k) => {
                    if let Ok(set) = m.get_replicas(&name(k)) {
                        prop_assert!(ended.contains(&name(k)), "{} readable before put_end", name(k));
                        prop_assert!(!set.replicas.is_empty());
                    }
                }
                Op::Exists(k) => {
                    if m.exists(&name(k)).unwrap() {
                        prop_assert!(ended.contains(&name(k)));
                    }
                }
                Op::Remove(k, force) => {
                    let _ = m.remove(&name(k), force);
                }
                Op::Advance(ms) => clock.advance(ms.into()),
                Op::Tick => {
                    m.ping(client(1));
                    let guard = protected(&m, true);
                    m.tick();
                    for k in &guard {
                        prop_assert!(m.object(k).is_ok(), "tick evicted protected {}", k);
                    }
                }
                Op::Evict(kib) => {
                    let guard = protected(&m, true);
                    let bytes = u64::from(kib) * 1024;
                    m.evict(bytes, bytes);
                    for k in &guard {
                        prop_assert!(m.object(k).is_ok(), "evict took protected {}", k);
                    }
                }
                Op::RemoveAll => {
                    let guard = protected(&m, false);
                    m.remove_all();
                    for k in &guard {
                        prop_assert!(m.object(k).is_ok(), "remove_all took leased/unfinished {}", k);
                    }
                }
                Op::Unmount(i) => {
                    let seg = format!("s{i}");
                    if m.unmount_segment(client(1), &seg).is_ok() {
                        m.mount_segment(client(1), spec(&seg, (u64::from(i) + 1) << 32, 64 * 1024)).unwrap();
                    }
                }
            }
            check_invariants(&m)?;
        }
    }
}
