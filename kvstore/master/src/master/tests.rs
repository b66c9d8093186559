//! Scenario tests of the master core on a manual clock.

use std::sync::Arc;

use super::*;

pub(super) const SEG: u64 = 1 << 20;

pub(super) fn client(n: u128) -> ClientId {
    ClientId::from_u128(n)
}

pub(super) fn spec(name: &str, base: u64, size: u64) -> SegmentSpec {
    SegmentSpec {
        name: name.into(),
        base,
        size,
        endpoint: format!("node-{name}"),
        disk_bytes: 0,
        disk_write_through: false,
    }
}

pub(super) fn master_with(config: MasterConfig) -> (Master, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000));
    (Master::with_clock(config, clock.clone()).unwrap(), clock)
}

pub(super) fn small_config() -> MasterConfig {
    MasterConfig {
        shards: 4,
        ..MasterConfig::default()
    }
}

pub(super) fn one() -> ReplicateConfig {
    ReplicateConfig::default()
}

/// Master with segments `s0..sN` of `SEG` bytes, owned by client 1.
fn with_segments(n: usize) -> (Master, Arc<ManualClock>) {
    let (m, c) = master_with(small_config());
    for i in 0..n {
        m.mount_segment(
            client(1),
            spec(&format!("s{i}"), 0x10_0000_0000 * (i as u64 + 1), SEG),
        )
        .unwrap();
    }
    (m, c)
}

pub(super) fn put(m: &Master, key: &str, len: u64) {
    m.put_start(client(7), key, len, &one()).unwrap();
    m.put_end(client(7), key).unwrap();
}

#[test]
fn put_is_invisible_until_put_end() {
    let (m, _) = with_segments(1);
    let locs = m.put_start(client(7), "k", 100, &one()).unwrap();
    assert_eq!(locs.len(), 1);
    assert_eq!(locs[0].segment.name(), "s0");
    assert_eq!(locs[0].segment.endpoint(), "node-s0");
    assert_eq!(locs[0].length, 100);
    assert!(locs[0].address >= 0x10_0000_0000 && locs[0].address + 100 <= 0x10_0000_0000 + SEG);
    assert!(matches!(
        m.get_replicas("k"),
        Err(MasterError::ReplicaIsNotReady(_))
    ));
    assert!(!m.exists("k").unwrap());
    assert!(matches!(
        m.put_end(client(8), "k"),
        Err(MasterError::IllegalClient(_))
    ));
    assert!(matches!(
        m.put_start(client(8), "k", 100, &one()),
        Err(MasterError::ObjectAlreadyExists(_))
    ));
    m.put_end(client(7), "k").unwrap();
    m.put_end(client(7), "k").unwrap();
    let got = m.get_replicas("k").unwrap();
    assert_eq!((got.length, got.lease_ttl_ms), (100, 10_000));
    assert_eq!(got.replicas[0].address, locs[0].address);
    assert!(m.exists("k").unwrap());
    assert!(matches!(
        m.put_revoke(client(7), "k"),
        Err(MasterError::InvalidWrite(_))
    ));
    assert!(matches!(
        m.put_start(client(7), "k", 100, &one()),
        Err(MasterError::ObjectAlreadyExists(_))
    ));
}

#[test]
fn revoke_frees_space_and_the_key() {
    let (m, _) = with_segments(1);
    m.put_start(client(7), "k", 1000, &one()).unwrap();
    assert_eq!(m.stats().allocated_bytes, 1024);
    assert!(matches!(
        m.put_revoke(client(9), "k"),
        Err(MasterError::IllegalClient(_))
    ));
    m.put_revoke(client(7), "k").unwrap();
    assert_eq!(m.stats().allocated_bytes, 0);
    assert_eq!(m.stats().keys, 0);
    assert!(matches!(
        m.put_revoke(client(7), "k"),
        Err(MasterError::ObjectNotFound(_))
    ));
    put(&m, "k", 10);
}

#[test]
fn a_put_start_sent_again_under_its_put_id_answers_the_same_replicas() {
    let (m, _) = with_segments(1);
    let first = m.put_start_with_id(client(7), "k", 100, &one(), 5).unwrap();
    let used = m.stats().allocated_bytes;
    let again = m.put_start_with_id(client(7), "k", 100, &one(), 5).unwrap();
    let at = |l: &[ReplicaLocation]| l.iter().map(|r| r.address).collect::<Vec<_>>();
    assert_eq!(at(&again), at(&first));
    assert_eq!(
        m.stats().allocated_bytes,
        used,
        "a repeat allocates nothing"
    );
    // Anything else that finds the key unfinished is refused, as before.
    for (who, len, id) in [(7, 100, 6), (7, 100, 0), (7, 101, 5), (8, 100, 5)] {
        assert!(
            matches!(
                m.put_start_with_id(client(who), "k", len, &one(), id),
                Err(MasterError::ObjectAlreadyExists(_))
            ),
            "client {who}, {len} bytes, put id {id}"
        );
    }
    // Once ended, the put is done: its id names nothing any more.
    m.put_end(client(7), "k").unwrap();
    assert!(matches!(
        m.put_start_with_id(client(7), "k", 100, &one(), 5),
        Err(MasterError::ObjectAlreadyExists(_))
    ));
    // The batch form, item by item.
    let items = [("b1", 64u64), ("b2", 64)];
    let r = m.batch_put_start(client(7), &items, &one(), 9).unwrap();
    let r2 = m.batch_put_start(client(7), &items, &one(), 9).unwrap();
    for (a, b) in r.iter().zip(&r2) {
        assert_eq!(at(a.as_ref().unwrap()), at(b.as_ref().unwrap()));
    }
    assert!(matches!(
        &m.batch_put_start(client(7), &items, &one(), 10).unwrap()[0],
        Err(MasterError::ObjectAlreadyExists(_))
    ));
}

#[test]
fn a_renewal_answers_the_same_replicas_and_keeps_the_writer_s_put() {
    let (m, clock) = with_segments(1);
    let first = m.put_start_with_id(client(7), "k", 100, &one(), 5).unwrap();
    let used = m.stats().allocated_bytes;
    let at = |l: &[ReplicaLocation]| l.iter().map(|r| r.address).collect::<Vec<_>>();
    // Renewed every 20 s, the put outlives its 30 s discard timeout many times over.
    for _ in 0..5 {
        clock.advance(20_000);
        assert_eq!(
            at(&m.renew_put(client(7), "k", 100, 5).unwrap()),
            at(&first)
        );
        assert!(matches!(
            m.put_start(client(8), "k", 100, &one()),
            Err(MasterError::ObjectAlreadyExists(_))
        ));
    }
    assert_eq!(
        m.stats().allocated_bytes,
        used,
        "a renewal allocates nothing"
    );
    // Another client, id or length, a missing key: no such put, nothing allocated.
    for (who, key, len, id) in [
        (8, "k", 100, 5),
        (7, "k", 100, 6),
        (7, "k", 101, 5),
        (7, "none", 100, 5),
    ] {
        assert!(
            matches!(
                m.renew_put(client(who), key, len, id),
                Err(MasterError::InvalidWrite(_))
            ),
            "client {who}, {key}, {len} bytes, put id {id}"
        );
    }
    assert!(matches!(
        m.renew_put(client(7), "k", 100, 0),
        Err(MasterError::InvalidParams(_))
    ));
    assert_eq!(m.stats().allocated_bytes, used);
    // Left alone past its discard timeout, the put is taken over: a renewal then fails.
    clock.advance(30_001);
    m.put_start(client(8), "k", 100, &one()).unwrap();
    assert!(matches!(
        m.renew_put(client(7), "k", 100, 5),
        Err(MasterError::InvalidWrite(_))
    ));
    // Ended puts renew nothing; the batch form answers item by item.
    m.put_end(client(8), "k").unwrap();
    assert!(matches!(
        m.renew_put(client(8), "k", 100, 0),
        Err(MasterError::InvalidParams(_))
    ));
    let items = [("b1", 64u64), ("b2", 64)];
    let started = m.batch_put_start(client(7), &items, &one(), 9).unwrap();
    m.put_end(client(7), "b2").unwrap();
    let r = m.batch_renew_put(client(7), &items, 9).unwrap();
    assert_eq!(at(r[0].as_ref().unwrap()), at(started[0].as_ref().unwrap()));
    assert!(matches!(r[1], Err(MasterError::InvalidWrite(_))));
    // A write window as long as the discard timeout could let a silent writer's space go
    // to another while it may still write: refused.
    let cfg = MasterConfig {
        reservation_ttl_ms: 300_000,
        ..MasterConfig::default()
    };
    assert!(matches!(cfg.validate(), Err(MasterError::InvalidParams(_))));
}

#[test]
fn replicas_go_to_distinct_segments_preferred_first() {
    let (m, _) = with_segments(3);
    let cfg = ReplicateConfig {
        replica_num: 2,
        preferred_segments: vec!["nope".into(), "s2".into()],
        ..one()
    };
    let locs = m.put_start(client(7), "k", 64, &cfg).unwrap();
    assert_eq!(locs.len(), 2);
    assert_eq!(locs[0].segment.name(), "s2");
    assert_ne!(locs[1].segment.name(), "s2");
    // More replicas than segments: best effort, one per segment.
    let cfg = ReplicateConfig {
        replica_num: 5,
        ..one()
    };
    let locs = m.put_start(client(7), "k2", 64, &cfg).unwrap();
    let mut names: Vec<_> = locs.iter().map(|l| l.segment.name().to_string()).collect();
    names.sort();
    assert_eq!(names, ["s0", "s1", "s2"]);
}

#[test]
fn keys_spread_over_segments() {
    let (m, _) = with_segments(4);
    for i in 0..400 {
        put(&m, &format!("key-{i}"), 64);
    }
    for s in m.segments() {
        assert!(s.allocations > 50, "{} got {}", s.name, s.allocations);
    }
}

#[test]
fn bad_input_changes_nothing() {
    let (m, _) = with_segments(1);
    put(&m, "k", 64);
    let before = m.stats();
    let too_long = "x".repeat(5000);
    let cases = [
        m.put_start(client(7), "", 64, &one()).unwrap_err(),
        m.put_start(client(7), &too_long, 64, &one()).unwrap_err(),
        m.put_start(client(7), "n", 0, &one()).unwrap_err(),
        m.put_start(client(7), "n", u64::MAX, &one()).unwrap_err(),
        m.put_start(
            client(7),
            "n",
            64,
            &ReplicateConfig {
                replica_num: 0,
                ..one()
            },
        )
        .unwrap_err(),
        m.put_start(
            client(7),
            "n",
            64,
            &ReplicateConfig {
                replica_num: 99,
                ..one()
            },
        )
        .unwrap_err(),
        m.remove_by_regex("(").unwrap_err(),
        m.get_replicas("").unwrap_err(),
        m.unmount_segment(client(1), "nope").unwrap_err(),
        m.mount_segment(client(1), spec("bad/name", 0, SEG))
            .unwrap_err(),
        m.mount_segment(client(1), spec("tiny", 0, 1)).unwrap_err(),
        m.mount_segment(client(1), spec("wrap", u64::MAX - 10, SEG))
            .unwrap_err(),
        m.list_keys("", None, Some(0)).unwrap_err(),
    ];
    let codes: Vec<_> = cases.iter().map(|e| e.code()).collect();
    assert_eq!(
        codes,
        [
            -400, -400, -600, -600, -600, -600, -600, -400, -101, -600, -600, -600, -600
        ]
    );
    assert_eq!(m.stats(), before);
    assert!(m.get_replicas("k").is_ok());
}

#[test]
fn no_space_is_no_available_handle() {
    let (m, _) = master_with(small_config());
    assert!(matches!(
        m.put_start(client(7), "k", 64, &one()),
        Err(MasterError::NoAvailableHandle(_))
    ));
    m.mount_segment(client(1), spec("s0", 0, 4096)).unwrap();
    assert!(matches!(
        m.put_start(client(7), "k", 8192, &one()),
        Err(MasterError::NoAvailableHandle(_))
    ));
    assert_eq!(m.stats().keys, 0);
}

#[test]
fn readable_looks_without_a_lease() {
    let (m, _) = with_segments(1);
    m.put_start(client(7), "k", 64, &one()).unwrap();
    assert!(!m.readable("k"), "a put in flight is not readable");
    m.put_end(client(7), "k").unwrap();
    assert!(m.readable("k"));
    assert!(!m.readable("other"));
    assert!(!m.readable(""), "a malformed key is absent");
    m.remove("k", false)
        .expect("readable granted no lease that would block the remove");
    assert!(!m.readable("k"));
}

#[test]
fn leases_block_remove_until_they_end() {
    let (m, clock) = with_segments(1);
    put(&m, "k", 64);
    m.remove("k", false).unwrap();
    put(&m, "k", 64);
    assert_eq!(m.get_replicas("k").unwrap().lease_ttl_ms, 10_000);
    assert!(matches!(
        m.remove("k", false),
        Err(MasterError::ObjectHasLease(_))
    ));
    clock.advance(9_999);
    assert!(m.exists("k").unwrap(), "exists extends the lease");
    clock.advance(9_999);
    assert!(matches!(
        m.remove("k", false),
        Err(MasterError::ObjectHasLease(_))
    ));
    assert_eq!(m.object("k").unwrap().lease_remaining_ms, 1);
    clock.advance(1);
    m.remove("k", false).unwrap();
    put(&m, "k", 64);
    m.get_replicas("k").unwrap();
    m.remove("k", true).unwrap();
    assert!(matches!(
        m.remove("k", false),
        Err(MasterError::ObjectNotFound(_))
    ));
}

#[test]
fn remove_all_and_regex_skip_leased_and_unfinished() {
    let (m, _) = with_segments(1);
    for k in ["a1", "a2", "b1", "b2"] {
        put(&m, k, 64);
    }
    m.put_start(client(7), "a3", 64, &one()).unwrap();
    m.get_replicas("a2").unwrap();
    assert_eq!(m.remove_by_regex("^a").unwrap(), 1);
    assert_eq!(
        m.list_keys("", None, None).unwrap().keys,
        ["a2", "a3", "b1", "b2"]
    );
    assert_eq!(m.remove_all(), 2);
    assert_eq!(m.list_keys("", None, None).unwrap().keys, ["a2", "a3"]);
}

#[test]
fn list_keys_pages_in_order() {
    let (m, _) = with_segments(1);
    for i in (0..25).rev() {
        put(&m, &format!("p/{i:02}"), 64);
    }
    put(&m, "q/1", 64);
    let mut after = None;
    let mut all = Vec::new();
    loop {
        let page = m.list_keys("p/", after.as_deref(), Some(10)).unwrap();
        all.extend(page.keys.clone());
        match page.next_after {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let want: Vec<_> = (0..25).map(|i| format!("p/{i:02}")).collect();
    assert_eq!(all, want);
}

#[test]
fn zombie_put_is_taken_over_then_released() {
    let (m, clock) = with_segments(1);
    m.put_start(client(7), "k", 1000, &one()).unwrap();
    clock.advance(29_999);
    assert!(matches!(
        m.put_start(client(8), "k", 1000, &one()),
        Err(MasterError::ObjectAlreadyExists(_))
    ));
    clock.advance(2);
    m.put_start(client(8), "k", 2000, &one()).unwrap();
    assert_eq!(
        m.stats().allocated_bytes,
        1024 + 2048,
        "old space is kept until release"
    );
    assert!(matches!(
        m.put_end(client(7), "k"),
        Err(MasterError::IllegalClient(_))
    ));
    clock.advance(600_000 - 30_001 - 1);
    m.ping(client(1));
    assert_eq!(m.tick().released_puts, 0);
    clock.advance(1);
    assert_eq!(m.tick().released_puts, 1);
    assert_eq!(m.stats().allocated_bytes, 2048);
    m.put_end(client(8), "k").unwrap();
    assert_eq!(m.get_replicas("k").unwrap().length, 2000);
}

#[test]
fn unfinished_put_is_released_at_release_timeout() {
    let (m, clock) = with_segments(1);
    m.put_start(client(7), "k", 64, &one()).unwrap();
    clock.advance(599_999);
    m.ping(client(1));
    assert_eq!(m.tick().released_puts, 0);
    clock.advance(1);
    assert_eq!(m.tick().released_puts, 1);
    assert_eq!(m.stats().keys, 0);
    assert_eq!(m.stats().allocated_bytes, 0);
}

#[test]
fn silent_client_loses_segments_and_must_remount() {
    let (m, clock) = with_segments(2);
    m.mount_segment(client(2), spec("other", 0x99_0000_0000, SEG))
        .unwrap();
    let cfg = ReplicateConfig {
        replica_num: 1,
        preferred_segments: vec!["s0".into()],
        ..one()
    };
    m.put_start(client(7), "on-s0", 64, &cfg).unwrap();
    m.put_end(client(7), "on-s0").unwrap();
    let both = ReplicateConfig {
        replica_num: 2,
        preferred_segments: vec!["s1".into(), "other".into()],
        ..one()
    };
    m.put_start(client(7), "two", 64, &both).unwrap();
    m.put_end(client(7), "two").unwrap();
    assert_eq!(m.ping(client(1)).status, ClientStatus::Ok);
    clock.advance(10_000);
    m.ping(client(2));
    assert_eq!(m.tick().expired_clients, 0);
    clock.advance(1);
    assert_eq!(m.tick().expired_clients, 1);
    assert_eq!(m.segments().len(), 1);
    assert!(matches!(
        m.get_replicas("on-s0"),
        Err(MasterError::ObjectNotFound(_))
    ));
    let two = m.get_replicas("two").unwrap();
    assert_eq!(two.replicas.len(), 1);
    assert_eq!(two.replicas[0].segment.name(), "other");
    let reply = m.ping(client(1));
    assert_eq!(reply.status, ClientStatus::NeedRemount);
    assert_eq!(reply.view_version, m.view_version());
    let view = m
        .remount_segments(
            client(1),
            vec![
                spec("s0", 0x10_0000_0000, SEG),
                spec("s1", 0x20_0000_0000, SEG),
            ],
        )
        .unwrap();
    assert_eq!(view.status, ClientStatus::Ok);
    assert_eq!(m.ping(client(1)).status, ClientStatus::Ok);
    assert_eq!(m.segments().len(), 3);
    assert_eq!(
        m.segment("s0").unwrap().allocated_bytes,
        0,
        "remounted segments start empty"
    );
}

#[test]
fn unknown_pinger_is_forgotten_after_ttl() {
    let (m, clock) = master_with(small_config());
    assert_eq!(m.ping(client(5)).status, ClientStatus::NeedRemount);
    assert_eq!(m.clients().len(), 1);
    clock.advance(10_001);
    m.tick();
    assert!(m.clients().is_empty());
    assert!(matches!(
        m.client(client(5)),
        Err(MasterError::ClientNotFound(_))
    ));
}

#[test]
fn mount_rules() {
    let (m, _) = with_segments(1);
    let again = m
        .mount_segment(client(1), spec("s0", 0x10_0000_0000, SEG))
        .unwrap();
    assert_eq!(again.name, "s0");
    assert!(matches!(
        m.mount_segment(client(2), spec("s0", 0x10_0000_0000, SEG)),
        Err(MasterError::SegmentAlreadyExists(_))
    ));
    let mut overlapping = spec("x", 0x10_0000_0000 + 4096, SEG);
    overlapping.endpoint = "node-s0".into();
    assert!(matches!(
        m.mount_segment(client(1), overlapping),
        Err(MasterError::InvalidParams(_))
    ));
    assert!(matches!(
        m.unmount_segment(client(2), "s0"),
        Err(MasterError::IllegalClient(_))
    ));
    put(&m, "k", 64);
    m.unmount_segment(client(1), "s0").unwrap();
    assert!(m.segments().is_empty());
    assert_eq!(m.stats().keys, 0, "objects without replicas vanish");
    m.remove_client(client(1)).unwrap();
    assert!(matches!(
        m.remove_client(client(1)),
        Err(MasterError::ClientNotFound(_))
    ));
}

#[test]
fn batches_answer_per_item() {
    let (m, _) = with_segments(1);
    let items = [("a", 64u64), ("b", 0), ("a", 64)];
    let r = m.batch_put_start(client(7), &items, &one(), 0).unwrap();
    assert!(r[0].is_ok());
    assert!(matches!(r[1], Err(MasterError::InvalidParams(_))));
    assert!(matches!(r[2], Err(MasterError::ObjectAlreadyExists(_))));
    let ends = m.batch_put_end(client(7), &["a", "b"]).unwrap();
    assert!(ends[0].is_ok() && matches!(ends[1], Err(MasterError::ObjectNotFound(_))));
    let got = m.batch_get_replicas(&["a", "zz"]).unwrap();
    assert!(got[0].is_ok() && got[1].is_err());
    assert_eq!(
        m.batch_exists(&["a", "zz"])
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>(),
        [true, false]
    );
    let removed = m.batch_remove(&["a"], true).unwrap();
    assert!(removed[0].is_ok());
    m.put_start(client(7), "c", 64, &one()).unwrap();
    assert!(m.batch_put_revoke(client(7), &["c"]).unwrap()[0].is_ok());
    let too_many = vec!["k"; 4097];
    assert!(matches!(
        m.batch_exists(&too_many),
        Err(MasterError::InvalidParams(_))
    ));
}

#[test]
fn object_metadata_is_compact() {
    // Guards the per-key memory budget (see benches/master_memory.rs for the measurement).
    assert!(std::mem::size_of::<Option<object::Object>>() <= 152);
}

#[test]
fn concurrent_clients_keep_accounting_exact() {
    let (m, _) = with_segments(4);
    let m = Arc::new(m);
    let threads: Vec<_> = (0..4u128)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                let me = client(100 + t);
                for i in 0..2000 {
                    let k = format!("t{t}-{i}");
                    m.put_start(me, &k, 100 + i as u64 % 900, &one()).unwrap();
                    m.put_end(me, &k).unwrap();
                    m.get_replicas(&k).unwrap();
                    if i % 2 == 0 {
                        m.remove(&k, true).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = m.stats();
    assert_eq!(stats.keys, 4000);
    let live: u64 = (0..4u128)
        .flat_map(|t| (1..2000).step_by(2).map(move |i| (t, i)))
        .map(|(t, i)| m.object(&format!("t{t}-{i}")).unwrap().length.div_ceil(64) * 64)
        .sum();
    assert_eq!(stats.allocated_bytes, live);
}

#[test]
fn a_client_clears_its_own_replicas_on_one_segment_or_all() {
    let (m, clock) = with_segments(2);
    let two = ReplicateConfig {
        replica_num: 2,
        ..one()
    };
    m.put_start(client(7), "two", 100, &two).unwrap();
    m.put_end(client(7), "two").unwrap();
    put(&m, "one", 100);
    m.put_start(client(8), "theirs", 100, &one()).unwrap();
    m.put_end(client(8), "theirs").unwrap();
    m.put_start(client(7), "unfinished", 100, &one()).unwrap();
    m.get_replicas("one").unwrap(); // a read lease
    let used = m.stats().allocated_bytes;
    let none: &[&str] = &[];
    // Read-leased, another client's, unfinished, missing: left alone.
    let keys = ["one", "theirs", "unfinished", "none", ""];
    assert_eq!(m.replica_clear(client(7), &keys, None).unwrap(), none);
    assert_eq!(m.stats().allocated_bytes, used);
    // One replica of two: the object stays, on the other segment, and its space is freed.
    let first = m.object("two").unwrap().replicas[0]
        .segment
        .name()
        .to_owned();
    assert_eq!(
        m.replica_clear(client(7), &["two"], Some(&first)).unwrap(),
        ["two"]
    );
    let left = m.object("two").unwrap().replicas;
    assert_eq!(left.len(), 1);
    assert_ne!(left[0].segment.name(), first);
    assert_eq!(m.stats().allocated_bytes, used - 128);
    // No replica there any more: left alone. Every segment: the objects go.
    assert_eq!(
        m.replica_clear(client(7), &["two"], Some(&first)).unwrap(),
        none
    );
    clock.advance(m.config().lease_ttl_ms);
    assert_eq!(
        m.replica_clear(client(7), &["two", "one"], None).unwrap(),
        ["two", "one"]
    );
    assert!(matches!(
        m.object("two"),
        Err(MasterError::ObjectNotFound(_))
    ));
    assert!(matches!(
        m.object("one"),
        Err(MasterError::ObjectNotFound(_))
    ));
    assert!(
        m.replica_clear(client(7), &["k"], Some(&"x".repeat(5000)))
            .is_err()
    );
}
