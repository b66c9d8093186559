//! The disk tier's state machine on a manual clock.

use super::tests::{SEG, client, master_with, small_config, spec};
use super::*;
use openapi::master::{DiskRecord, TierDone, TierTask, TierTaskKind};

const BASE: u64 = 0x10_0000_0000;

/// A master with one 1 MiB segment `d` (owner client 1) that has a disk tier.
fn with_disk() -> (Master, std::sync::Arc<ManualClock>) {
    with_disk_in(small_config())
}

/// [`with_disk`] on a master configured `cfg` (its clients outliving the task timeouts the
/// tests wait for).
fn with_disk_in(cfg: MasterConfig) -> (Master, std::sync::Arc<ManualClock>) {
    let (m, c) = master_with(MasterConfig {
        client_ttl_ms: 3_600_000,
        ..cfg
    });
    let mut s = spec("d", BASE, SEG);
    s.disk_bytes = 1 << 30;
    m.mount_segment(client(1), s).unwrap();
    (m, c)
}

fn put(m: &Master, key: &str, len: u64) {
    m.put_start(client(7), key, len, &ReplicateConfig::default())
        .unwrap();
    m.put_end(client(7), key).unwrap();
}

pub(super) fn tasks(m: &Master, done: &[TierDone]) -> Vec<TierTask> {
    m.tier_exchange(client(1), "d", done, &[], &[]).unwrap().0
}

pub(super) fn ok(t: &TierTask) -> TierDone {
    TierDone {
        kind: t.kind,
        key: t.key.clone(),
        ok: true,
        id: t.id,
    }
}

/// Evicts everything evictable and answers the offload tasks.
fn evict_all(m: &Master) -> Vec<TierTask> {
    let r = m.evict(SEG, SEG);
    assert_eq!(r.offloaded_objects, r.evicted_objects);
    tasks(m, &[])
}

#[test]
fn an_evicted_value_goes_to_disk_and_comes_back_on_a_read() {
    let (m, clock) = with_disk();
    put(&m, "k", 1000);
    let offloads = evict_all(&m);
    assert_eq!(offloads.len(), 1);
    assert_eq!(offloads[0].kind, TierTaskKind::Offload);
    assert_eq!(offloads[0].length, 1000);
    assert!(offloads[0].address >= BASE && offloads[0].address + 1000 <= BASE + SEG);
    // Still readable from memory while the owner writes it.
    assert_eq!(m.get_replicas("k").unwrap().replicas.len(), 1);
    assert_eq!(m.tier_stats().offloading_bytes, 1024);
    // Leased now: the record is durable but the memory waits for the lease.
    assert!(tasks(&m, &[ok(&offloads[0])]).is_empty());
    assert_eq!(m.segments()[0].allocated_bytes, 1024);
    clock.advance(m.config().lease_ttl_ms);
    m.tick();
    assert_eq!(m.segments()[0].allocated_bytes, 0);
    assert_eq!(m.tier_stats().on_disk_objects, 1);
    assert!(m.exists("k").unwrap());
    // A read starts a load into fresh space on the same segment.
    assert!(matches!(m.lookup("k").unwrap(), Lookup::Loading));
    assert!(matches!(m.lookup("k").unwrap(), Lookup::Loading));
    let loads = tasks(&m, &[]);
    assert_eq!(loads.len(), 1);
    assert_eq!(loads[0].kind, TierTaskKind::Load);
    assert_eq!(m.segments()[0].allocated_bytes, 1024);
    assert!(tasks(&m, &[ok(&loads[0])]).is_empty());
    let Lookup::Ready(set) = m.lookup("k").unwrap() else {
        panic!("loaded")
    };
    assert_eq!(set.replicas[0].address, loads[0].address);
    // Loaded values keep their record: evicting again writes nothing.
    clock.advance(m.config().lease_ttl_ms);
    let r = m.evict(SEG, SEG);
    assert_eq!((r.evicted_objects, r.offloaded_objects), (1, 0));
    assert!(tasks(&m, &[]).is_empty());
    assert_eq!(m.segments()[0].allocated_bytes, 0);
    // Removing it deletes the record.
    m.remove("k", false).unwrap();
    let del = tasks(&m, &[]);
    assert_eq!(del.len(), 1);
    assert_eq!(del[0].kind, TierTaskKind::Delete);
    let s = m.tier_stats();
    assert_eq!((s.offloads, s.loads, s.on_disk_objects), (1, 1, 0));
}

#[test]
fn a_failed_or_silent_offload_leaves_the_value_in_memory() {
    let (m, clock) = with_disk();
    put(&m, "a", 100);
    put(&m, "b", 100);
    let offloads = evict_all(&m);
    assert_eq!(offloads.len(), 2);
    let failed = TierDone {
        ok: false,
        ..ok(&offloads[0])
    };
    tasks(&m, &[failed]);
    // The other is never reported: given up after the task timeout.
    clock.advance(m.config().disk_task_timeout_ms);
    m.tick();
    let s = m.tier_stats();
    assert_eq!((s.offload_failures, s.offloading_bytes), (2, 0));
    for k in ["a", "b"] {
        assert!(matches!(m.lookup(k).unwrap(), Lookup::Ready(_)), "{k}");
    }
    // Both evictable, and so offloaded, again.
    clock.advance(m.config().lease_ttl_ms);
    assert_eq!(m.evict(SEG, SEG).offloaded_objects, 2);
}

#[test]
fn a_failed_load_is_a_miss_and_frees_its_space() {
    let (m, clock) = with_disk();
    put(&m, "k", 100);
    let offloads = evict_all(&m);
    tasks(&m, &[ok(&offloads[0])]);
    assert!(matches!(m.lookup("k").unwrap(), Lookup::Loading));
    let load = tasks(&m, &[]);
    let bad = TierDone {
        ok: false,
        ..ok(&load[0])
    };
    tasks(&m, &[bad]);
    assert!(matches!(m.lookup("k"), Err(MasterError::ObjectNotFound(_))));
    assert_eq!(m.segments()[0].allocated_bytes, 0);
    // A load its owner never answers is a miss too; its space waits one more timeout.
    put(&m, "j", 100);
    clock.advance(m.config().lease_ttl_ms);
    let offloads = evict_all(&m);
    tasks(&m, &[ok(&offloads[0])]);
    assert!(matches!(m.lookup("j").unwrap(), Lookup::Loading));
    clock.advance(m.config().disk_task_timeout_ms);
    m.tick();
    assert!(matches!(m.lookup("j"), Err(MasterError::ObjectNotFound(_))));
    assert_eq!(m.segments()[0].allocated_bytes, 128);
    clock.advance(m.config().disk_task_timeout_ms);
    m.tick();
    assert_eq!(m.segments()[0].allocated_bytes, 0);
    assert_eq!(m.tier_stats().load_failures, 2);
}

#[test]
fn removing_a_value_mid_offload_keeps_its_memory_until_the_task_timeout() {
    let (m, clock) = with_disk();
    put(&m, "k", 100);
    let offloads = evict_all(&m);
    m.remove("k", false).unwrap();
    assert_eq!(m.segments()[0].allocated_bytes, 128);
    // The owner finishes: the record is nobody's, so it is deleted.
    let del = tasks(&m, &[ok(&offloads[0])]);
    assert_eq!(del.len(), 1);
    assert_eq!(del[0].kind, TierTaskKind::Delete);
    clock.advance(m.config().disk_task_timeout_ms);
    m.tick();
    assert_eq!(m.segments()[0].allocated_bytes, 0);
}

#[test]
fn an_owner_reports_its_records_and_they_are_served_again() {
    let (m, _) = with_disk();
    let records = [
        DiskRecord {
            key: "old/1".into(),
            length: 4096,
        },
        DiskRecord {
            key: "old/2".into(),
            length: 10,
        },
    ];
    let (_, adopted) = m.tier_exchange(client(1), "d", &[], &[], &records).unwrap();
    assert_eq!(adopted, 2);
    assert!(m.exists("old/1").unwrap());
    assert!(matches!(m.lookup("old/1").unwrap(), Lookup::Loading));
    // Reported twice (a second master change): nothing new.
    let (_, adopted) = m.tier_exchange(client(1), "d", &[], &[], &records).unwrap();
    assert_eq!(
        adopted, 1,
        "old/2 is on disk still and stays; old/1 is loading"
    );
    // Dropped by the owner: gone.
    m.tier_exchange(client(1), "d", &[], &["old/2".into()], &[])
        .unwrap();
    assert!(!m.exists("old/2").unwrap());
    assert_eq!(m.tier_stats().adopted, 3);
}

#[test]
fn only_the_owner_of_a_segment_with_a_disk_exchanges() {
    let (m, _) = with_disk();
    assert!(matches!(
        m.tier_exchange(client(2), "d", &[], &[], &[]),
        Err(MasterError::IllegalClient(_))
    ));
    assert!(matches!(
        m.tier_exchange(client(1), "nope", &[], &[], &[]),
        Err(MasterError::SegmentNotFound(_))
    ));
    m.mount_segment(client(1), spec("plain", 2 * BASE, SEG))
        .unwrap();
    assert!(matches!(
        m.tier_exchange(client(1), "plain", &[], &[], &[]),
        Err(MasterError::InvalidParams(_))
    ));
    // Values on a segment without a disk are evicted as before.
    let (m, _) = master_with(small_config());
    m.mount_segment(client(1), spec("plain", BASE, SEG))
        .unwrap();
    put(&m, "k", 100);
    let r = m.evict(SEG, SEG);
    assert_eq!((r.evicted_objects, r.offloaded_objects), (1, 0));
    assert!(!m.exists("k").unwrap());
}

#[test]
fn a_write_through_owner_copies_every_value_and_eviction_frees_memory_at_once() {
    let (m, clock) = master_with(MasterConfig {
        client_ttl_ms: 3_600_000,
        ..small_config()
    });
    let mut s = spec("d", BASE, SEG);
    s.disk_bytes = 1 << 30;
    s.disk_write_through = true;
    m.mount_segment(client(1), s).unwrap();
    put(&m, "k", 1000);
    let copies = tasks(&m, &[]);
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].kind, TierTaskKind::Offload);
    // Readable throughout, and not evictable while its copy is written.
    assert!(matches!(m.lookup("k").unwrap(), Lookup::Ready(_)));
    clock.advance(m.config().lease_ttl_ms);
    assert_eq!(m.evict(SEG, SEG).evicted_objects, 0);
    assert_eq!(m.tier_stats().offloading_bytes, 0, "a copy frees nothing");
    tasks(&m, &[ok(&copies[0])]);
    assert_eq!(m.segments()[0].allocated_bytes, 1024);
    // Evicted: no write, the memory goes now.
    let r = m.evict(SEG, SEG);
    assert_eq!((r.evicted_objects, r.offloaded_objects), (1, 0));
    assert!(tasks(&m, &[]).is_empty());
    assert_eq!(m.segments()[0].allocated_bytes, 0);
    assert_eq!(m.tier_stats().on_disk_objects, 1);
    // A copy that fails leaves the value in memory, evictable as a plain one.
    put(&m, "j", 100);
    let copy = tasks(&m, &[]);
    tasks(
        &m,
        &[TierDone {
            ok: false,
            ..ok(&copy[0])
        }],
    );
    assert_eq!(m.evict(SEG, SEG).offloaded_objects, 1);
    // Removing a written-through value deletes its record.
    m.remove("k", false).unwrap();
    let del = tasks(&m, &[]);
    assert!(
        del.iter()
            .any(|t| t.kind == TierTaskKind::Delete && t.key == "k")
    );
}

#[test]
fn a_restarted_owner_takes_over_a_load_its_predecessor_never_finished() {
    let (m, clock) = with_disk();
    put(&m, "k", 100);
    let offloads = evict_all(&m);
    tasks(&m, &[ok(&offloads[0])]);
    // A read starts a load on "d", whose owner dies before doing it.
    assert!(matches!(m.lookup("k").unwrap(), Lookup::Loading));
    assert_eq!(m.segments()[0].allocated_bytes, 128);
    // Its successor mounts "d2" on the same disk and reports the record.
    let mut s2 = spec("d2", 2 * BASE, SEG);
    s2.disk_bytes = 1 << 30;
    m.mount_segment(client(2), s2).unwrap();
    let rec = DiskRecord {
        key: "k".into(),
        length: 100,
    };
    let (_, adopted) = m.tier_exchange(client(2), "d2", &[], &[], &[rec]).unwrap();
    assert_eq!(adopted, 1);
    assert!(matches!(m.lookup("k").unwrap(), Lookup::Loading));
    let load = m.tier_exchange(client(2), "d2", &[], &[], &[]).unwrap().0;
    assert_eq!(load.len(), 1);
    assert!(load[0].address >= 2 * BASE);
    // The abandoned load's space on "d" waits out the task timeout.
    clock.advance(m.config().disk_task_timeout_ms);
    m.tick();
    let d = m.segments().into_iter().find(|s| s.name == "d").unwrap();
    assert_eq!(d.allocated_bytes, 0);
}

#[test]
fn a_lease_on_a_copy_of_a_disk_value_ends_when_every_reader_released_it() {
    let (m, clock) = with_disk();
    put(&m, "k", 100);
    let offloads = evict_all(&m);
    tasks(&m, &[ok(&offloads[0])]);
    assert!(matches!(m.lookup("k").unwrap(), Lookup::Loading));
    let load = tasks(&m, &[]);
    tasks(&m, &[ok(&load[0])]);
    // Two readers: each is told to release.
    let Lookup::Ready(a) = m.lookup("k").unwrap() else {
        panic!("loaded")
    };
    let Lookup::Ready(b) = m.lookup("k").unwrap() else {
        panic!("loaded")
    };
    assert!(a.release && b.release);
    m.release_reads(&["k"]).unwrap();
    // One reader still holds it: not evictable.
    assert_eq!(m.evict(SEG, SEG).evicted_objects, 0);
    m.release_reads(&["k", "never-read"]).unwrap();
    let r = m.evict(SEG, SEG);
    assert_eq!((r.evicted_objects, r.offloaded_objects), (1, 0));
    assert_eq!(m.segments()[0].allocated_bytes, 0);
    // A plain memory value is never released early.
    put(&m, "plain", 100);
    clock.advance(1);
    let Lookup::Ready(p) = m.lookup("plain").unwrap() else {
        panic!("in memory")
    };
    assert!(!p.release);
    m.release_reads(&["plain"]).unwrap();
    assert!(m.object("plain").unwrap().lease_remaining_ms > 0);
}

#[test]
fn the_owner_reads_its_own_disk_and_others_get_a_load() {
    let (m, clock) = with_disk();
    on_disk(&m, &clock);
    // The owner is answered its own disk, under a lease, and nothing is loaded.
    let set = own_read(&m);
    assert!(set.replicas.is_empty());
    assert_eq!(set.own_disk.as_ref().map(|s| s.name()), Some("d"));
    assert_eq!(set.length, 1000);
    assert!(matches!(
        m.remove("k", false),
        Err(MasterError::ObjectHasLease(_))
    ));
    assert!(tasks(&m, &[]).is_empty());
    assert_eq!(m.segments()[0].allocated_bytes, 0);
    // Anyone else (naming itself or not) gets the value read back into memory.
    assert!(matches!(
        m.lookup_as("k", Some(client(7))).unwrap(),
        Lookup::Loading
    ));
    assert_eq!(tasks(&m, &[])[0].kind, TierTaskKind::Load);
}

/// `k` (1000 bytes) put on `with_disk`'s segment and moved to its disk alone.
fn on_disk(m: &Master, clock: &ManualClock) {
    put(m, "k", 1000);
    let offloads = evict_all(m);
    tasks(m, &[ok(&offloads[0])]);
    clock.advance(m.config().lease_ttl_ms);
    m.tick();
    assert_eq!(m.tier_stats().on_disk_objects, 1);
}

fn own_read(m: &Master) -> ReplicaSet {
    match m.lookup_as("k", Some(client(1))).unwrap() {
        Lookup::Ready(set) => set,
        Lookup::Loading => panic!("the owner waits for a load"),
    }
}

#[test]
fn an_owner_that_reads_a_value_from_its_disk_again_gets_it_back_in_memory() {
    let (m, clock) = with_disk();
    assert_eq!(m.config().disk_promote_after, 2);
    on_disk(&m, &clock);
    assert!(own_read(&m).own_disk.is_some());
    assert!(tasks(&m, &[]).is_empty(), "promoted on the first read");
    // The second read is still served from the disk, and promotes.
    assert!(own_read(&m).own_disk.is_some());
    let loads = tasks(&m, &[]);
    assert_eq!(loads.len(), 1);
    assert_eq!(loads[0].kind, TierTaskKind::Load);
    assert_eq!(m.tier_stats().promotions, 1);
    // While it loads, the owner keeps reading its disk; anyone else waits for the load.
    assert!(own_read(&m).own_disk.is_some());
    assert!(matches!(
        m.lookup_as("k", Some(client(7))).unwrap(),
        Lookup::Loading
    ));
    assert!(tasks(&m, &[ok(&loads[0])]).is_empty());
    // Back in memory: read there, by everyone.
    let set = own_read(&m);
    assert!(set.own_disk.is_none());
    assert_eq!(set.replicas[0].address, loads[0].address);
    assert_eq!(m.tier_stats().on_disk_objects, 0);
}

#[test]
fn promotion_off_leaves_an_owners_values_on_its_disk() {
    let (m, clock) = with_disk_in(MasterConfig {
        disk_promote_after: 0,
        ..small_config()
    });
    on_disk(&m, &clock);
    for _ in 0..5 {
        assert!(own_read(&m).own_disk.is_some());
    }
    assert!(tasks(&m, &[]).is_empty());
    assert_eq!(m.tier_stats().promotions, 0);
}

#[test]
fn an_owner_that_detaches_its_disk_loses_what_lives_only_there() {
    let (m, clock) = with_disk();
    on_disk(&m, &clock);
    put(&m, "mem", 1000);
    assert!(matches!(
        m.detach_disk(client(7), "d"),
        Err(MasterError::IllegalClient(_))
    ));
    assert_eq!(m.detach_disk(client(1), "d").unwrap(), 1);
    // On the disk only: gone. In memory: still there.
    assert!(matches!(m.lookup("k"), Err(MasterError::ObjectNotFound(_))));
    assert!(m.exists("mem").unwrap());
    // Eviction offloads nothing any more (the value evicted is simply gone), the
    // exchange is refused, and detaching again changes nothing.
    clock.advance(m.config().lease_ttl_ms);
    let r = m.evict(SEG, SEG);
    assert_eq!((r.evicted_objects, r.offloaded_objects), (1, 0));
    assert!(!m.exists("mem").unwrap_or(false));
    assert!(matches!(
        m.tier_exchange(client(1), "d", &[], &[], &[]),
        Err(MasterError::InvalidParams(_))
    ));
    assert_eq!(m.detach_disk(client(1), "d").unwrap(), 0);
    assert_eq!(m.tier_stats().on_disk_objects, 0);
}

#[test]
fn a_round_hands_reads_alone_and_first_and_a_bounded_share_of_offloads() {
    let (m, _clock) = with_disk();
    let n = tier::ROUND_OFFLOADS + 10;
    for i in 0..n {
        put(&m, &format!("o{i}"), 1000);
    }
    let first = evict_all(&m);
    assert_eq!(first.len(), tier::ROUND_OFFLOADS);
    assert!(first.iter().all(|t| t.kind == TierTaskKind::Offload));
    let done: Vec<TierDone> = first.iter().map(ok).collect();
    let second = tasks(&m, &done);
    assert_eq!(second.len(), 10);
    // With offloads queued, a read's load and a removal's delete go alone, the delete
    // first (a later write of the key must not be undone by it).
    for i in 0..5 {
        put(&m, &format!("p{i}"), 1000);
    }
    assert_eq!(m.evict(SEG, SEG).offloaded_objects, 5);
    assert!(matches!(m.lookup("o0").unwrap(), Lookup::Loading));
    m.remove("o1", false).unwrap();
    let reads: Vec<(TierTaskKind, String)> = tasks(&m, &second.iter().map(ok).collect::<Vec<_>>())
        .into_iter()
        .map(|t| (t.kind, t.key))
        .collect();
    assert_eq!(
        reads,
        [
            (TierTaskKind::Delete, "o1".to_owned()),
            (TierTaskKind::Load, "o0".to_owned())
        ]
    );
    let third = tasks(&m, &[]);
    assert_eq!(third.len(), 5);
    assert!(third.iter().all(|t| t.kind == TierTaskKind::Offload));
}

#[test]
fn a_read_waiting_for_room_is_loaded_first_when_offloads_free_memory() {
    let (m, _clock) = with_disk();
    put(&m, "cold", 1000);
    let t = evict_all(&m);
    assert!(tasks(&m, &t.iter().map(ok).collect::<Vec<_>>()).is_empty());
    // The segment full again, all of it being written out: no room until the owner reports.
    for i in 0..SEG / 1024 {
        put(&m, &format!("f{i}"), 1000);
    }
    assert_eq!(m.evict(SEG, SEG).offloaded_objects, SEG / 1024);
    assert!(matches!(
        m.lookup("cold"),
        Err(MasterError::NoAvailableHandle(_))
    ));
    let round = tasks(&m, &[]);
    assert_eq!(round.len(), tier::ROUND_OFFLOADS);
    // The report frees memory: the waiting read's load starts in the same answer, before
    // any put can take the room.
    let next = tasks(&m, &round.iter().map(ok).collect::<Vec<_>>());
    assert_eq!(next.len(), 1);
    assert_eq!(
        (next[0].kind, next[0].key.as_str()),
        (TierTaskKind::Load, "cold")
    );
    assert!(matches!(m.lookup("cold").unwrap(), Lookup::Loading));
}

#[test]
fn a_failed_allocation_scans_again_once_a_put_completes_or_a_lease_ends() {
    let (m, clock) = master_with(small_config());
    m.mount_segment(client(1), spec("s", BASE, SEG)).unwrap();
    let slots = SEG / 1024;
    for i in 0..slots - 1 {
        put(&m, &format!("l{i}"), 1000);
        assert!(matches!(
            m.lookup(&format!("l{i}")).unwrap(),
            Lookup::Ready(_)
        ));
    }
    m.put_start(client(7), "open", 1000, &ReplicateConfig::default())
        .unwrap();
    let put_x = || m.put_start(client(7), "x", 1000, &ReplicateConfig::default());
    // Everything leased or unfinished: nothing to evict, and the next failures do not scan.
    assert!(matches!(put_x(), Err(MasterError::NoAvailableHandle(_))));
    assert!(matches!(put_x(), Err(MasterError::NoAvailableHandle(_))));
    // A completed put is evictable: the next failure scans, and takes it.
    m.put_end(client(7), "open").unwrap();
    put_x().unwrap();
    assert!(!m.exists("open").unwrap());
    m.put_end(client(7), "x").unwrap();
    assert!(matches!(m.lookup("x").unwrap(), Lookup::Ready(_)));
    assert!(matches!(
        m.put_start(client(7), "y", 1000, &ReplicateConfig::default()),
        Err(MasterError::NoAvailableHandle(_))
    ));
    // Leases end with time alone (no put completes, no tick): the next failure scans.
    clock.advance(m.config().lease_ttl_ms);
    m.put_start(client(7), "y", 1000, &ReplicateConfig::default())
        .unwrap();
}

#[test]
fn a_failed_put_evicts_no_more_while_offloads_in_flight_will_free_a_round() {
    let (m, _clock) = with_disk();
    for i in 0..SEG / 1024 {
        put(&m, &format!("f{i}"), 1000);
    }
    // Half the segment is being written out: far more than a round's share.
    let half = m.evict(SEG / 2, SEG / 2);
    let in_flight = m.tier_stats().offloading_bytes;
    assert_eq!(in_flight, half.offloaded_objects * 1024);
    assert!(matches!(
        m.put_start(client(7), "x", 1000, &ReplicateConfig::default()),
        Err(MasterError::NoAvailableHandle(_))
    ));
    assert_eq!(m.tier_stats().offloading_bytes, in_flight);
    // Once written, the room is there.
    let done: Vec<TierDone> = std::iter::from_fn(|| Some(tasks(&m, &[])))
        .take_while(|t| !t.is_empty())
        .flatten()
        .map(|t| ok(&t))
        .collect();
    tasks(&m, &done);
    m.put_start(client(7), "x", 1000, &ReplicateConfig::default())
        .unwrap();
}

#[test]
fn the_report_of_a_removed_objects_offload_settles_nothing_of_the_key_put_again() {
    let (m, _clock) = with_disk();
    put(&m, "k", 1000);
    let old = evict_all(&m);
    assert_eq!(old.len(), 1);
    // Removed while the owner writes it, put again, evicted again.
    m.remove("k", false).unwrap();
    put(&m, "k", 2000);
    assert_eq!(m.evict(SEG, SEG).offloaded_objects, 1);
    assert_eq!(m.tier_stats().offloading_bytes, 2048);
    // The old write's report: its record is nobody's (deleted before the new write),
    // and the new value stays in memory, still being written.
    let round = tasks(&m, &[ok(&old[0])]);
    assert_eq!(
        round.iter().map(|t| t.kind).collect::<Vec<_>>(),
        [TierTaskKind::Delete]
    );
    assert_eq!(m.tier_stats().offloading_bytes, 2048);
    assert_eq!(m.tier_stats().on_disk_objects, 0);
    let Lookup::Ready(set) = m.lookup("k").unwrap() else {
        panic!("still in memory")
    };
    assert_eq!(set.length, 2000);
    let new = tasks(&m, &[ok(&round[0])]);
    assert_eq!((new.len(), new[0].length), (1, 2000));
    assert_ne!(new[0].id, old[0].id);
    tasks(&m, &[ok(&new[0])]);
    assert_eq!(m.tier_stats().offloading_bytes, 0);
    assert_eq!(m.tier_stats().offloads, 1);
}

#[test]
fn reads_are_counted_by_the_tier_that_answers_them() {
    let (m, clock) = with_disk();
    put(&m, "k", 1000);
    let counts = |m: &Master| {
        let s = m.stats();
        (s.reads_from_memory, s.reads_from_disk, s.read_misses)
    };
    m.get_replicas("k").unwrap();
    assert!(m.get_replicas("absent").is_err());
    assert_eq!(counts(&m), (1, 0, 1));
    // `exists` and a routing look are not reads.
    assert!(m.exists("k").unwrap());
    assert!(m.readable("k"));
    assert_eq!(counts(&m), (1, 0, 1));
    clock.advance(m.config().lease_ttl_ms);
    let offloads = evict_all(&m);
    tasks(&m, &[ok(&offloads[0])]);
    clock.advance(m.config().lease_ttl_ms);
    m.tick();
    assert_eq!((m.stats().disk_offloads, m.stats().disk_loads), (1, 0));
    assert_eq!(m.held("k"), Some(Held::Disk));
    assert!(m.readable("k"));
    // On disk: a read starts the load, a read while it runs waits on it; both are disk
    // reads. Loaded, the value is read from memory again.
    assert!(matches!(m.lookup("k").unwrap(), Lookup::Loading));
    assert!(matches!(m.lookup("k").unwrap(), Lookup::Loading));
    let loads = tasks(&m, &[]);
    tasks(&m, &[ok(&loads[0])]);
    m.get_replicas("k").unwrap();
    assert_eq!(counts(&m), (2, 2, 1));
    assert_eq!((m.stats().disk_offloads, m.stats().disk_loads), (1, 1));
    // A look for routing says where it lies, and reads nothing.
    assert_eq!(m.held("k"), Some(Held::Memory));
    assert_eq!(m.held("absent"), None);
    let seg = openapi::master::Segment::from(m.segments().remove(0));
    assert_eq!((seg.disk_bytes, seg.disk_write_through), (1 << 30, false));
}

#[test]
fn a_gone_segments_tasks_are_given_up_at_the_next_tick() {
    // Its owner died with an offload in flight: nothing will report it, and its bytes,
    // counted as being freed, would hold eviction back until the task timeout.
    let (m, _clock) = with_disk();
    put(&m, "k", 1000);
    assert_eq!(m.evict(SEG, SEG).offloaded_objects, 1);
    assert!(m.tier_stats().offloading_bytes > 0);
    m.remove_client(client(1)).unwrap();
    m.tick();
    assert_eq!(m.tier_stats().offloading_bytes, 0);
}
