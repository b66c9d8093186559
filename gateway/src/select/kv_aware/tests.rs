use super::*;
use crate::workers::{LoadGuard, testing::ready_workers};

fn key(ids: &[u32]) -> Vec<u8> {
    let mut k = vec![b'i'];
    for id in ids {
        k.extend(id.to_le_bytes());
    }
    k
}

fn stored(ids: &[u32], ps: usize) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events: vec![KvEvent::BlockStored {
            block_hashes: hash::block_hashes(ids, ps),
            parent_block_hash: None,
            token_ids: ids.to_vec(),
            block_size: ps as u32,
            lora_id: None,
            medium: None,
        }],
        attn_dp_rank: None,
    }
}

/// A policy following `n` workers through sinks the test feeds directly.
fn following(n: usize, cfg: KvAwareConfig) -> (KvAware, Vec<Arc<Worker>>, Vec<Sink>) {
    let kv = KvAware::new(cfg);
    let ws = ready_workers(n);
    let mut sinks = Vec::new();
    for (slot, w) in ws.iter().enumerate() {
        kv.subs.write().insert(
            w.uid(),
            Sub {
                slot,
                stop: CancellationToken::new(),
            },
        );
        sinks.push(Sink {
            shared: kv.shared.clone(),
            slot,
        });
    }
    (kv, ws, sinks)
}

#[test]
fn the_worker_holding_the_prefix_wins() {
    // Load at full weight (the default is 0: in-flight requests only break ties).
    let cfg = KvAwareConfig {
        load_weight: 1.0,
        ..KvAwareConfig::default()
    };
    let (kv, ws, sinks) = following(3, cfg);
    let prompt: Vec<u32> = (0..64).collect();
    sinks[2].apply(&stored(&prompt[..48], 16));
    sinks[0].apply(&stored(&prompt[..16], 16));
    sinks[1].apply(&stored(&[7; 16], 16));
    let all: Vec<&Arc<Worker>> = ws.iter().collect();
    let c = kv.cached_tokens(&all, &prompt);
    assert_eq!(c, [Some(16.0), Some(0.0), Some(48.0)]);
    let (w, d) = kv.decide(&all, Some(&key(&prompt)));
    assert!(Arc::ptr_eq(w, &ws[2]));
    assert_eq!(d, KvDecision::Events);
    // Load counts against it: 2 requests x 64 tokens outweigh 32 more cached tokens.
    let _busy: Vec<LoadGuard> = (0..2).map(|_| LoadGuard::new(ws[2].clone())).collect();
    let (w, _) = kv.decide(&all, Some(&key(&prompt)));
    assert!(Arc::ptr_eq(w, &ws[0]), "{}", w.url().as_str());
    // So does a prefill backlog: worker 0's queue of prompts to compute sends the request
    // to worker 1, which holds nothing but has nothing to do.
    let mut queued = LoadGuard::new(ws[0].clone());
    queued.charge_prefill(200);
    let (w, d, _) = kv.pick(&all, Some(&key(&prompt)));
    assert!(Arc::ptr_eq(w, &ws[1]), "{}", w.url().as_str());
    assert_eq!(d, 64, "it computes the whole prompt");
    drop(queued);
    let (w, d, _) = kv.pick(&all, Some(&key(&prompt)));
    assert!(Arc::ptr_eq(w, &ws[0]));
    assert_eq!(d, 48, "16 of 64 tokens cached");
    // A resync forgets the worker's pages.
    sinks[0].resync();
    assert_eq!(kv.cached_tokens(&all, &prompt)[0], Some(0.0));
}

#[test]
fn the_backlog_weight_keeps_a_prompt_with_its_prefix_through_a_short_queue() {
    let prompt: Vec<u32> = (0..64).collect();
    // Worker 0 caches 16 of the 64 tokens and has 40 tokens of earlier prompts to compute;
    // worker 1 caches nothing and has nothing to compute. One request in flight on each.
    let route = |backlog_weight: f64| {
        let (kv, ws, sinks) = following(
            2,
            KvAwareConfig {
                backlog_weight,
                ..KvAwareConfig::default()
            },
        );
        sinks[0].apply(&stored(&prompt[..16], 16));
        sinks[1].apply(&stored(&[7; 16], 16));
        let mut queued = LoadGuard::new(ws[0].clone());
        queued.charge_prefill(40);
        let _decoding = LoadGuard::new(ws[1].clone());
        let all: Vec<&Arc<Worker>> = ws.iter().collect();
        let (w, uncached, _) = kv.pick(&all, Some(&key(&prompt)));
        (ws.iter().position(|x| Arc::ptr_eq(x, w)).unwrap(), uncached)
    };
    // Both count alike (Dynamo's cost): 48 + 40 tokens against 64, so worker 1.
    assert_eq!(route(1.0), (1, 64));
    // At the default 0.25: 48 + 10 against 64, so the prompt stays with its prefix.
    assert_eq!(KvAwareConfig::default().backlog_weight, 0.25);
    assert_eq!(route(0.1875), (0, 48));
    // So it does below 0.4 (48 + 16 = 64 ties); past it the idle worker wins.
    assert_eq!(route(0.25), (0, 48));
    assert_eq!(route(0.45), (1, 64));
}

#[test]
fn a_namespaced_prompt_is_placed_by_the_tree_not_by_other_namespaces_pages() {
    let (kv, ws, sinks) = following(2, KvAwareConfig::default());
    let prompt: Vec<u32> = (0..64).collect();
    sinks[1].apply(&stored(&prompt, 16));
    sinks[0].apply(&stored(&[7; 16], 16));
    let all: Vec<&Arc<Worker>> = ws.iter().collect();
    let plain = key(&prompt);
    let (w, d) = kv.decide(&all, Some(&plain));
    assert!(Arc::ptr_eq(w, &ws[1]) && d == KvDecision::Events);
    // The same tokens for an adapter: the pages worker 1 holds are not its pages.
    let scoped = crate::select::namespace::scoped(plain.clone(), 42);
    let (first, d, _) = kv.pick(&all, Some(&scoped));
    assert_eq!(d, 0, "the tree decided");
    assert_eq!(kv.decide(&all, Some(&scoped)).1, KvDecision::Fallback);
    // ... and the tree keeps it where it sent it first.
    for _ in 0..3 {
        assert!(Arc::ptr_eq(kv.decide(&all, Some(&scoped)).0, first));
    }
}

#[test]
fn without_events_or_ids_cache_aware_decides() {
    let (kv, ws, sinks) = following(2, KvAwareConfig::default());
    let all: Vec<&Arc<Worker>> = ws.iter().collect();
    // No events at all yet.
    assert_eq!(
        kv.decide(&all, Some(&key(&[1, 2, 3]))).1,
        KvDecision::Fallback
    );
    sinks[0].apply(&stored(&[1, 2, 3, 4], 2));
    // A text prompt has no ids.
    assert_eq!(kv.decide(&all, Some(b"thello")).1, KvDecision::Fallback);
    // Worker 1 has no events: estimated by the tree, which learns the choice.
    let (w, d) = kv.decide(&all, Some(&key(&[9, 9, 9, 9])));
    assert_eq!(d, KvDecision::Mixed);
    let again = kv.fallback.estimate(&all, &key(&[9, 9, 9, 9]));
    let i = all.iter().position(|x| Arc::ptr_eq(x, w)).unwrap();
    assert_eq!(again[i], 1.0);
    assert!(kv.has_events(&ws[0]) && !kv.has_events(&ws[1]));
}

#[test]
fn temperature_spreads_and_zero_is_argmin() {
    assert_eq!(choose(&[3.0, 1.0, 2.0], 0.0, |_| 0), 1);
    assert_eq!(
        choose(&[1.0, 1.0], 0.0, |i| 1 - i),
        1,
        "ties go to the less loaded"
    );
    let mut seen = [0; 3];
    for _ in 0..2000 {
        seen[choose(&[10.0, 10.5, 100.0], 1.0, |_| 0)] += 1;
    }
    assert!(seen[0] > 200 && seen[1] > 200, "{seen:?}");
    assert!(seen[2] < seen[0], "{seen:?}");
    assert_eq!(key_tokens(&key(&[7, 8])), Some(vec![7, 8]));
    assert_eq!(key_tokens(b"tabc"), None);
}

#[test]
fn a_routed_prefix_is_predicted_on_its_worker_until_the_request_ends() {
    let (kv, ws, sinks) = following(3, KvAwareConfig::default());
    for (i, s) in sinks.iter().enumerate() {
        s.apply(&stored(&[i as u32 + 1; 16], 16));
    }
    let all: Vec<&Arc<Worker>> = ws.iter().collect();
    let prompt: Vec<u32> = (100..164).collect();
    let (w, uncached, prediction) = kv.pick(&all, Some(&key(&prompt)));
    assert_eq!(uncached, 64, "nobody holds it yet");
    let i = ws.iter().position(|x| Arc::ptr_eq(x, w)).unwrap();
    assert!(prediction.is_some());
    assert_eq!(kv.predicted_pages(), 4);
    // Before any event: the worker it went to is seen holding it, the others not.
    let seen = kv.cached_tokens(&all, &prompt);
    for (j, c) in seen.iter().enumerate() {
        assert_eq!(*c, Some(if j == i { 64.0 } else { 0.0 }), "{seen:?}");
    }
    // A longer prompt sharing it is seen there up to the shared pages.
    let longer: Vec<u32> = (100..196).collect();
    assert_eq!(kv.cached_tokens(&all, &longer)[i], Some(64.0));
    // The request ends: the prediction goes; the events say what the worker holds.
    drop(prediction);
    assert_eq!(kv.predicted_pages(), 0);
    assert_eq!(kv.cached_tokens(&all, &prompt)[i], Some(0.0));
    sinks[i].apply(&stored(&prompt, 16));
    assert_eq!(kv.cached_tokens(&all, &prompt)[i], Some(64.0));
    // No prediction where the tree decided (no token ids).
    let (_, _, none) = kv.pick(&all, Some(b"thello"));
    assert!(none.is_none());
}

/// `ids`' pages from page `from` on, stored in `medium` (their hashes chained from the
/// start of `ids`).
fn stored_in(ids: &[u32], ps: usize, from: usize, medium: &str) -> EventBatch {
    let mut b = stored(ids, ps);
    if let KvEvent::BlockStored {
        block_hashes,
        medium: m,
        ..
    } = &mut b.events[0]
    {
        block_hashes.drain(..from);
        *m = Some(medium.to_owned());
    }
    b
}

#[test]
fn host_pages_count_at_their_value_and_decisions_report_each_tier() {
    let cfg = KvAwareConfig {
        host_page_value: 0.25,
        ..KvAwareConfig::default()
    };
    let (kv, ws, sinks) = following(2, cfg);
    let prompt: Vec<u32> = (0..64).collect();
    // Worker 0: one page on its GPU, the next two in its host memory.
    sinks[0].apply(&stored(&prompt[..16], 16));
    sinks[0].apply(&stored_in(&prompt[..48], 16, 1, "CPU_PINNED"));
    sinks[1].apply(&stored(&[7; 16], 16));
    let all: Vec<&Arc<Worker>> = ws.iter().collect();
    assert_eq!(
        kv.cached_tokens(&all, &prompt),
        [Some(16.0 + 0.25 * 32.0), Some(0.0)]
    );
    let (w, d, uncached, _, held) = kv.decide_charged(&all, Some(&key(&prompt)));
    assert!(Arc::ptr_eq(w, &ws[0]));
    assert_eq!((d, uncached), (KvDecision::Events, 40));
    let tiers = Tiers {
        device: 16,
        host: 32,
        ..Tiers::default()
    };
    assert_eq!(held, Some((64, tiers)));
    // Worth nothing, host pages no longer hold the prompt on worker 0 against a tie.
    let (kv, ws, sinks) = following(
        2,
        KvAwareConfig {
            host_page_value: 0.0,
            ..KvAwareConfig::default()
        },
    );
    sinks[0].apply(&stored_in(&prompt[..48], 16, 0, "CPU_PINNED"));
    sinks[1].apply(&stored(&[7; 16], 16));
    let all: Vec<&Arc<Worker>> = ws.iter().collect();
    assert_eq!(kv.cached_tokens(&all, &prompt), [Some(0.0), Some(0.0)]);
}
