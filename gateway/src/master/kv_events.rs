//! The store's object events on ZMQ, in SGLang's KV-event format (Mooncake's
//! `--enable_kv_events`): for indexers and routers that subscribe to KV events the way they
//! subscribe to SGLang workers'. The host publishes what its master's feed reports
//! ([`kvmaster::Master::events_since`]) while that master answers (alone, or while this
//! HA member leads), on a PUB socket bound to loopback (`--master-kv-events-endpoint`).
//!
//! Each key of `--kv-l3-key-format`'s shape is one page, named by its block hash (the
//! first 16 of its 64 hex digits): a value stored is `BlockStored` with medium `cpu` (in a
//! storage node's memory) or `disk` (only on its disk tier), a value removed is
//! `BlockRemoved` in the medium it left, a move between tiers is both. Other keys are
//! skipped (counted in `moongate_master_kv_events_skipped_total`). A subscriber's view
//! starts at `AllBlocksCleared` and a `BlockStored` for every page held, sent first and
//! again whenever the events cannot be followed on (a new leader, a publisher left behind
//! the events the master keeps): the same resync SGLang's subscribers make on a gap.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kvmaster::master::{MAX_EVENTS_PER_CALL, ObjectEvent, Since};
use kvmaster::{Held, Master};
use sglang::kv_events::KvEventsConfig;
use sglang::kv_events::publish::Publisher;
use sglang::kv_events::wire::KvEvent;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::HostedMaster;
use crate::select::kv_aware::store::KeyFormat;

/// Events per published batch at most.
pub const BATCH_EVENTS: usize = 1024;
/// How long the publisher waits for events before it looks at the leadership again.
const WAIT: Duration = Duration::from_secs(1);

fn medium(h: Held) -> Option<String> {
    Some(
        match h {
            Held::Memory => "cpu",
            Held::Disk => "disk",
        }
        .to_owned(),
    )
}

fn stored(hash: i64, h: Held) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: vec![hash],
        parent_block_hash: None,
        token_ids: Vec::new(),
        block_size: 0,
        lora_id: None,
        medium: medium(h),
    }
}

/// The SGLang events of one change of a key (none for a key that names no page).
fn translate(keys: &KeyFormat, e: &ObjectEvent, out: &mut Vec<KvEvent>) -> bool {
    let Some(hash) = keys.block_hash_of(&e.key) else {
        return false;
    };
    if let Some(was) = e.was {
        out.push(KvEvent::BlockRemoved {
            block_hashes: vec![hash],
            medium: medium(was),
        });
    }
    if let Some(h) = e.held {
        out.push(stored(hash, h));
    }
    true
}

/// Binds the PUB socket at `endpoint` and publishes `hosted`'s object events until `stop`
/// is cancelled. Answers the endpoint bound (its port resolved) and the task.
pub async fn spawn(
    hosted: &HostedMaster,
    endpoint: &str,
    keys: KeyFormat,
    stop: CancellationToken,
) -> anyhow::Result<(String, JoinHandle<()>)> {
    let cfg = KvEventsConfig {
        endpoint: endpoint.to_owned(),
        ..KvEventsConfig::default()
    };
    let publisher = Publisher::start(&cfg)
        .await
        .context("the store's KV events (--master-kv-events-endpoint)")?;
    let bound = publisher.endpoint().to_owned();
    tracing::info!(endpoint = %bound, "publishing the store's KV events");
    let hosted = hosted.clone();
    let task = tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = run(hosted, publisher, keys) => {}
        }
    });
    Ok((bound, task))
}

async fn run(hosted: HostedMaster, publisher: Publisher, keys: KeyFormat) {
    let skipped = metrics::counter!("moongate_master_kv_events_skipped_total");
    let mut at: Option<(u64, u64)> = None;
    let mut out = Vec::with_capacity(BATCH_EVENTS);
    loop {
        let Some(m) = hosted.current() else {
            at = None;
            tokio::time::sleep(WAIT).await;
            continue;
        };
        let epoch = m.events_epoch();
        let from = match at {
            Some((e, n)) if e == epoch => n,
            _ => {
                // A new master (or the first): start the subscribers over from its state.
                let Some(next) = resync(&m, &publisher, &keys, &skipped).await else {
                    return;
                };
                at = Some((epoch, next));
                continue;
            }
        };
        m.events_wait(from, WAIT).await;
        match m.events_since(from, MAX_EVENTS_PER_CALL) {
            Since::Events { events, next, .. } => {
                for e in &events {
                    if !translate(&keys, e, &mut out) {
                        skipped.increment(1);
                    }
                    if out.len() >= BATCH_EVENTS {
                        publisher.publish(std::mem::take(&mut out));
                    }
                }
                publisher.publish(std::mem::take(&mut out));
                at = Some((epoch, next));
            }
            Since::Gone { .. } => at = None,
            Since::Off => return,
        }
    }
}

/// Publishes `AllBlocksCleared` and every page `m` holds; answers where to follow on from
/// (`None`: `m` keeps no events).
async fn resync(
    m: &Arc<Master>,
    publisher: &Publisher,
    keys: &KeyFormat,
    skipped: &metrics::Counter,
) -> Option<u64> {
    let snapshot = {
        let m = m.clone();
        tokio::task::spawn_blocking(move || m.held_all())
            .await
            .ok()?
    };
    let next = snapshot.0?;
    publisher.publish(vec![KvEvent::AllBlocksCleared]);
    let mut out = Vec::with_capacity(BATCH_EVENTS);
    for (key, h) in &snapshot.1 {
        match keys.block_hash_of(key) {
            Some(hash) => out.push(stored(hash, *h)),
            None => skipped.increment(1),
        }
        if out.len() == BATCH_EVENTS {
            publisher.publish(std::mem::take(&mut out));
        }
    }
    publisher.publish(out);
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_between_tiers_is_a_removal_then_a_store() {
        let keys = KeyFormat::new("{hash}_0_k");
        let key = format!("{}_0_k", "ab".repeat(32));
        let hash = keys.block_hash_of(&key).unwrap();
        let ev = |held, was| ObjectEvent {
            key: key.clone().into(),
            held,
            was,
        };
        let mut out = Vec::new();
        assert!(translate(
            &keys,
            &ev(Some(Held::Disk), Some(Held::Memory)),
            &mut out
        ));
        assert_eq!(
            out,
            [
                KvEvent::BlockRemoved {
                    block_hashes: vec![hash],
                    medium: Some("cpu".into())
                },
                stored(hash, Held::Disk)
            ]
        );
        out.clear();
        assert!(translate(&keys, &ev(None, Some(Held::Disk)), &mut out));
        assert_eq!(out.len(), 1);
        let other = ObjectEvent {
            key: "not-a-page".into(),
            held: Some(Held::Memory),
            was: None,
        };
        assert!(!translate(&keys, &other, &mut out));
    }
}
