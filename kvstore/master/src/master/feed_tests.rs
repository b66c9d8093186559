//! The object feed: one event per change of what is held under a key, whatever path made
//! the change.

use std::time::Duration;

use super::tests::{SEG, client, master_with, small_config, spec};
use super::tier_tests::{ok, tasks};
use super::*;

fn put(m: &Master, key: &str, len: u64) {
    m.put_start(client(7), key, len, &ReplicateConfig::default())
        .unwrap();
    m.put_end(client(7), key).unwrap();
}

/// Every event from `from` on, as (key, state).
fn drain(m: &Master, from: &mut u64) -> Vec<(String, Option<Held>)> {
    let Since::Events {
        first,
        events,
        next,
    } = m.events_since(*from, usize::MAX)
    else {
        panic!("events kept")
    };
    assert_eq!(first, *from);
    *from = next;
    // Each event says where its key was: where its last event put it.
    for (i, e) in events.iter().enumerate() {
        if let Some(prior) = events[..i].iter().rev().find(|p| p.key == e.key) {
            assert_eq!(e.was, prior.held, "{e:?}");
        }
    }
    events
        .into_iter()
        .map(|e| (e.key.into_string(), e.held))
        .collect()
}

fn ev(key: &str, held: Option<Held>) -> (String, Option<Held>) {
    (key.to_owned(), held)
}

#[test]
fn puts_removals_evictions_and_expiry_each_make_one_event() {
    let (m, clock) = master_with(small_config());
    m.mount_segment(client(1), spec("s", 0x10_0000_0000, SEG))
        .unwrap();
    let mut at = 0;
    m.put_start(client(7), "pending", 10, &ReplicateConfig::default())
        .unwrap();
    assert!(
        drain(&m, &mut at).is_empty(),
        "an unfinished put holds nothing"
    );
    put(&m, "a", 100);
    put(&m, "b", 100);
    m.get_replicas("a").unwrap();
    m.remove("a", true).unwrap();
    assert_eq!(
        drain(&m, &mut at),
        [
            ev("a", Some(Held::Memory)),
            ev("b", Some(Held::Memory)),
            ev("a", None)
        ]
    );
    m.put_revoke(client(7), "pending").unwrap();
    assert!(drain(&m, &mut at).is_empty());
    let r = m.evict(SEG, SEG);
    assert_eq!(r.evicted_objects, 1);
    assert_eq!(drain(&m, &mut at), [ev("b", None)]);
    put(&m, "c", 100);
    clock.advance(m.config().client_ttl_ms + 1);
    m.tick();
    assert_eq!(
        drain(&m, &mut at),
        [ev("c", Some(Held::Memory)), ev("c", None)]
    );
    assert_eq!(m.events_next(), Some(at));
}

#[test]
fn moves_between_memory_and_disk_are_events() {
    let (m, clock) = master_with(MasterConfig {
        client_ttl_ms: 3_600_000,
        ..small_config()
    });
    let mut s = spec("d", 0x10_0000_0000, SEG);
    s.disk_bytes = 1 << 30;
    m.mount_segment(client(1), s).unwrap();
    let mut at = 0;
    put(&m, "k", 1000);
    m.evict(SEG, SEG);
    let offloads = tasks(&m, &[]);
    assert_eq!(
        drain(&m, &mut at),
        [ev("k", Some(Held::Memory))],
        "readable from memory while offloading"
    );
    tasks(&m, &[ok(&offloads[0])]);
    clock.advance(m.config().lease_ttl_ms);
    m.tick();
    let Since::Events { events, .. } = m.events_since(at, 1) else {
        panic!()
    };
    assert_eq!(events[0].was, Some(Held::Memory));
    assert_eq!(drain(&m, &mut at), [ev("k", Some(Held::Disk))]);
    assert!(matches!(m.lookup("k").unwrap(), Lookup::Loading));
    assert!(drain(&m, &mut at).is_empty(), "loading is still on disk");
    let loads = tasks(&m, &[]);
    tasks(&m, &[ok(&loads[0])]);
    assert_eq!(drain(&m, &mut at), [ev("k", Some(Held::Memory))]);
    clock.advance(m.config().lease_ttl_ms);
    m.evict(SEG, SEG);
    assert_eq!(drain(&m, &mut at), [ev("k", Some(Held::Disk))]);
    m.remove("k", false).unwrap();
    assert_eq!(drain(&m, &mut at), [ev("k", None)]);
    assert_eq!(m.held_all(), (Some(at), vec![]));
}

#[test]
fn a_subscriber_behind_the_buffer_takes_a_snapshot_and_follows_it_exactly() {
    let (m, _) = master_with(MasterConfig {
        events_buffer: 4,
        ..small_config()
    });
    m.mount_segment(client(1), spec("s", 0x10_0000_0000, SEG))
        .unwrap();
    for k in ["a", "b", "c", "d", "e"] {
        put(&m, k, 10);
    }
    assert_eq!(m.events_since(0, 10), Since::Gone { oldest: 1 });
    let (next, mut held) = m.held_all();
    let mut at = next.unwrap();
    assert_eq!(at, 5);
    m.remove("b", false).unwrap();
    put(&m, "f", 10);
    // The snapshot and the events after it give the state.
    let mut view: std::collections::BTreeMap<String, Held> = held.drain(..).collect();
    for (k, h) in drain(&m, &mut at) {
        match h {
            Some(h) => view.insert(k, h),
            None => view.remove(&k),
        };
    }
    let (_, now) = m.held_all();
    assert_eq!(view, now.into_iter().collect());
    assert_eq!(
        m.events_since(at + 3, 10),
        Since::Events {
            first: at,
            events: vec![],
            next: at
        },
        "a number ahead of the feed reads as its end"
    );
    let off = master_with(MasterConfig {
        events_buffer: 0,
        ..small_config()
    })
    .0;
    assert_eq!(off.events_since(0, 1), Since::Off);
    assert_ne!(off.events_epoch(), m.events_epoch());
}

#[tokio::test(start_paused = true)]
async fn a_waiting_subscriber_wakes_on_the_next_event() {
    let (m, _) = master_with(small_config());
    let m = Arc::new(m);
    m.mount_segment(client(1), spec("s", 0x10_0000_0000, SEG))
        .unwrap();
    assert!(!m.events_wait(0, Duration::from_millis(50)).await);
    let w = tokio::spawn({
        let m = m.clone();
        async move { m.events_wait(0, Duration::from_secs(60)).await }
    });
    tokio::task::yield_now().await;
    put(&m, "a", 10);
    assert!(w.await.unwrap());
    assert!(m.events_wait(0, Duration::ZERO).await);
}
