//! Reservations: a put in one commit, and the rules that keep reserved bytes where they
//! belong (owner only, TTL, existing keys, unmounted segments, the client's share).

use super::tests::{SEG, client, master_with, small_config, spec};
use super::*;

fn one() -> ReplicateConfig {
    ReplicateConfig::default()
}

fn mounted(config: MasterConfig) -> (Master, std::sync::Arc<ManualClock>) {
    let (m, c) = master_with(config);
    m.mount_segment(client(1), spec("s0", 0x10_0000_0000, SEG))
        .unwrap();
    (m, c)
}

#[test]
fn a_committed_reservation_is_a_readable_object_where_it_was_reserved() {
    let (m, _) = mounted(small_config());
    let r = m.reserve(client(7), 4096, &one(), 3).unwrap();
    assert_eq!(r.len(), 3);
    assert_eq!(m.reserved(), (3, 3 * 4096));
    assert_eq!(
        m.stats().allocated_bytes,
        3 * 4096,
        "reserved space is allocated"
    );
    assert_eq!(
        (m.stats().reservations, m.stats().reserved_bytes),
        (3, 3 * 4096)
    );
    let addr = r[1].replicas[0].address;
    assert!(!m.exists("k").unwrap());
    m.put_commit(client(7), "k", r[1].id, 4096).unwrap();
    let got = m.get_replicas("k").unwrap();
    assert_eq!((got.length, got.replicas[0].address), (4096, addr));
    assert_eq!(m.reserved(), (2, 2 * 4096));
    // Used once: a second commit of the same reservation finds nothing.
    assert!(matches!(
        m.put_commit(client(7), "k2", r[1].id, 4096),
        Err(MasterError::ReservationNotFound(_))
    ));
    // The object is an ordinary one: removing it frees its space.
    m.remove("k", true).unwrap();
    assert_eq!(m.stats().allocated_bytes, 2 * 4096);
}

#[test]
fn a_reservation_is_committed_only_at_the_master_that_made_it() {
    // Two instances, as before and after a restart: each hands out as many ids, and
    // neither takes the other's (ids counted from 1 at both would all meet).
    let (before, _) = mounted(small_config());
    let (after, _) = mounted(small_config());
    let old = before.reserve(client(7), 4096, &one(), 64).unwrap();
    let new = after.reserve(client(7), 4096, &one(), 64).unwrap();
    assert_eq!((old.len(), new.len()), (64, 64));
    for r in &old {
        assert!(matches!(
            after.put_commit(client(7), "k", r.id, 4096),
            Err(MasterError::ReservationNotFound(_))
        ));
    }
    assert_eq!(
        after.reserved(),
        (64, 64 * 4096),
        "none of its own was taken"
    );
    after.put_commit(client(7), "k", new[0].id, 4096).unwrap();
    // Ids stay exact in any JSON reader.
    assert!(old.iter().chain(&new).all(|r| r.id < 1 << 53));
}

#[test]
fn only_its_client_may_commit_a_reservation_and_only_at_its_length() {
    let (m, _) = mounted(small_config());
    let r = m.reserve(client(7), 4096, &one(), 2).unwrap();
    assert!(matches!(
        m.put_commit(client(8), "k", r[0].id, 4096),
        Err(MasterError::ReservationNotFound(_))
    ));
    // Still there for its owner.
    m.put_commit(client(7), "k", r[0].id, 4096).unwrap();
    assert!(matches!(
        m.put_commit(client(7), "k2", r[1].id, 4095),
        Err(MasterError::InvalidParams(_))
    ));
    assert_eq!(m.reserved(), (0, 0));
    assert_eq!(m.stats().allocated_bytes, 4096, "the refused one is freed");
    assert!(matches!(
        m.put_commit(client(7), "", 1, 4096),
        Err(MasterError::InvalidKey(_))
    ));
}

#[test]
fn committing_an_existing_key_frees_the_reservation_and_keeps_the_object() {
    let (m, _) = mounted(small_config());
    m.put_start(client(7), "k", 100, &one()).unwrap();
    m.put_end(client(7), "k").unwrap();
    let r = m.reserve(client(7), 4096, &one(), 1).unwrap();
    assert!(matches!(
        m.put_commit(client(7), "k", r[0].id, 4096),
        Err(MasterError::ObjectAlreadyExists(_))
    ));
    assert_eq!(m.get_replicas("k").unwrap().length, 100);
    assert_eq!(m.stats().allocated_bytes, 128);
    assert_eq!(m.reserved(), (0, 0));
}

#[test]
fn unused_reservations_are_released_at_their_ttl_and_refused_after_it() {
    let (m, clock) = mounted(small_config());
    let ttl = m.config().reservation_ttl_ms;
    assert_eq!(m.use_within_ms(), ttl / 10);
    let r = m.reserve(client(7), 4096, &one(), 2).unwrap();
    clock.advance(ttl - 1);
    m.ping(client(1));
    assert_eq!(m.tick().released_reservations, 0);
    m.put_commit(client(7), "early", r[0].id, 4096).unwrap();
    clock.advance(1);
    // Past its TTL it is refused even before a tick released it.
    assert!(matches!(
        m.put_commit(client(7), "late", r[1].id, 4096),
        Err(MasterError::ReservationNotFound(_))
    ));
    let r = m.reserve(client(7), 4096, &one(), 1).unwrap();
    clock.advance(ttl);
    m.ping(client(1));
    assert_eq!(m.tick().released_reservations, 1);
    assert_eq!(m.reserved(), (0, 0));
    assert_eq!(
        m.stats().allocated_bytes,
        4096,
        "only the committed object is left"
    );
    assert!(m.put_commit(client(7), "k", r[0].id, 4096).is_err());
}

#[test]
fn a_reservation_on_an_unmounted_segment_is_gone() {
    let (m, _) = mounted(small_config());
    let r = m.reserve(client(7), 4096, &one(), 1).unwrap();
    m.unmount_segment(client(1), "s0").unwrap();
    assert!(matches!(
        m.put_commit(client(7), "k", r[0].id, 4096),
        Err(MasterError::ReservationNotFound(_))
    ));
    assert!(!m.exists("k").unwrap());
}

#[test]
fn a_client_holds_at_most_its_share_and_never_past_the_watermark() {
    let (m, _) = mounted(MasterConfig {
        reservation_max_bytes: 10 * 4096,
        ..small_config()
    });
    assert_eq!(m.reserve(client(7), 4096, &one(), 64).unwrap().len(), 10);
    assert!(m.reserve(client(7), 4096, &one(), 1).unwrap().is_empty());
    // Another client has its own share.
    assert_eq!(m.reserve(client(8), 4096, &one(), 4).unwrap().len(), 4);
    // A client that leaves gives its reservations back.
    m.ping(client(7));
    m.remove_client(client(7)).unwrap();
    assert_eq!(m.reserved(), (4, 4 * 4096));
    // Reservations stop at the eviction watermark (90% of the 1 MiB segment).
    let (m, _) = mounted(small_config());
    let got = m.reserve(client(7), 64 << 10, &one(), 64).unwrap();
    assert_eq!(got.len(), 14, "14 x 64 KiB fit under 0.9 MiB");
    m.put_start(client(7), "k", 64 << 10, &one()).unwrap();
    // Off at 0.
    let (m, _) = mounted(MasterConfig {
        reservation_max_bytes: 0,
        ..small_config()
    });
    assert!(m.reserve(client(7), 4096, &one(), 4).unwrap().is_empty());
    assert!(matches!(
        m.reserve(client(7), 0, &one(), 4),
        Err(MasterError::InvalidParams(_))
    ));
}

#[test]
fn pins_and_replicas_of_the_reservation_carry_over() {
    let (m, _) = master_with(small_config());
    for i in 0..3u64 {
        m.mount_segment(
            client(1),
            spec(&format!("s{i}"), 0x10_0000_0000 * (i + 1), SEG),
        )
        .unwrap();
    }
    let cfg = ReplicateConfig {
        replica_num: 2,
        hard_pin: true,
        ..one()
    };
    let r = m.reserve(client(7), 1000, &cfg, 1).unwrap();
    assert_eq!(r[0].replicas.len(), 2);
    m.put_commit(client(7), "k", r[0].id, 1000).unwrap();
    let v = m.object("k").unwrap();
    assert_eq!(v.replicas.len(), 2);
    assert!(v.hard_pinned);
}

#[test]
fn a_remounted_segment_takes_no_values_while_reservations_made_before_may_be_written() {
    // As after a restart: the master knows nothing of what was reserved in the segment
    // under its mount before, and the holders of those reservations may still write into
    // them for their use window. Placing values there meanwhile could see them overwritten.
    let (m, clock) = master_with(small_config());
    let within = m.use_within_ms();
    assert!(within > 1);
    m.remount_segments(client(1), vec![spec("s0", 0x10_0000_0000, SEG)])
        .unwrap();
    match m.put_start(client(7), "k", 4096, &one()) {
        Err(MasterError::NoAvailableHandle(why)) => {
            assert!(why.contains("remounted"), "{why}")
        }
        other => panic!("a put into a segment remounted just now: {other:?}"),
    }
    assert!(m.reserve(client(7), 4096, &one(), 4).unwrap().is_empty());
    clock.advance(within - 1);
    assert!(m.put_start(client(7), "k", 4096, &one()).is_err());
    clock.advance(1);
    m.put_start(client(7), "k", 4096, &one()).unwrap();
    assert_eq!(m.reserve(client(7), 4096, &one(), 4).unwrap().len(), 4);
}

#[test]
fn a_fresh_mount_takes_values_at_once_next_to_a_held_remount() {
    // A first mount is new memory: nobody can hold reservations in it.
    let (m, _) = master_with(small_config());
    m.remount_segments(client(1), vec![spec("old", 0x10_0000_0000, SEG)])
        .unwrap();
    m.mount_segment(client(2), spec("new", 0x20_0000_0000, SEG))
        .unwrap();
    for i in 0..8 {
        let at = m
            .put_start(client(7), &format!("k{i}"), 4096, &one())
            .unwrap();
        assert_eq!(at[0].segment.name(), "new");
    }
    // Asking for the held one by name changes nothing.
    let prefer_old = ReplicateConfig {
        preferred_segments: vec!["old".into()],
        ..one()
    };
    let at = m.put_start(client(7), "p", 4096, &prefer_old).unwrap();
    assert_eq!(at[0].segment.name(), "new");
}
