//! Eviction: which objects a round takes, in which order, and which it never takes.

use super::tests::{SEG, client, master_with, one, put, small_config, spec};
use super::*;

#[test]
fn watermark_eviction_spares_leased_pinned_and_unfinished() {
    let (m, clock) = master_with(small_config());
    m.mount_segment(client(1), spec("s0", 0, 100 * 1024))
        .unwrap();
    let hard = ReplicateConfig {
        hard_pin: true,
        ..one()
    };
    let soft = ReplicateConfig {
        soft_pin: true,
        ..one()
    };
    for i in 0..92 {
        let cfg = match i % 23 {
            0 => &hard,
            1 => &soft,
            _ => &one(),
        };
        m.put_start(client(7), &format!("k{i:02}"), 1024, cfg)
            .unwrap();
        if i % 23 != 2 {
            m.put_end(client(7), &format!("k{i:02}")).unwrap();
        }
        clock.advance(1);
    }
    for i in (3..92).step_by(23) {
        m.get_replicas(&format!("k{i:02}")).unwrap();
    }
    let report = m.tick().eviction.expect("above the watermark");
    assert!(report.evicted_objects >= 6, "{report:?}");
    assert!(m.stats().allocated_bytes <= 85 * 1024 + 1024);
    for i in 0..92 {
        let spared = matches!(i % 23, 0..=3);
        if spared {
            assert!(
                m.object(&format!("k{i:02}")).is_ok(),
                "k{i:02} must survive"
            );
        }
    }
    // The oldest unpinned, unleased objects went first.
    assert!(m.object("k04").is_err());
    assert!(m.object("k91").is_ok());
    assert_eq!(m.stats().evicted_objects, report.evicted_objects);
}

#[test]
fn eviction_takes_the_oldest_first_when_sizes_differ_from_the_mean() {
    // The oldest 100 objects are small, the newest 100 large: freeing the small ones and
    // three large ones takes far more objects than the mean size suggests, so the round
    // orders the candidates beyond the oldest it sorted first.
    let (m, clock) = master_with(MasterConfig {
        shards: 1,
        ..small_config()
    });
    m.mount_segment(client(1), spec("s0", 0, 4 << 20)).unwrap();
    for i in 0..200 {
        put(&m, &format!("k{i:03}"), if i < 100 { 64 } else { 16 << 10 });
        clock.advance(1);
    }
    let target = 100 * 64 + 3 * (16 << 10);
    let r = m.evict(target, target);
    assert_eq!(r.evicted_objects, 103, "{r:?}");
    for i in 0..200 {
        let key = format!("k{i:03}");
        assert_eq!(m.object(&key).is_ok(), i >= 103, "{key}");
    }
}

#[test]
fn soft_pinned_objects_go_only_in_the_second_pass() {
    let (m, _) = master_with(small_config());
    m.mount_segment(client(1), spec("s0", 0, 10 * 1024))
        .unwrap();
    let soft = ReplicateConfig {
        soft_pin: true,
        ..one()
    };
    for i in 0..10 {
        m.put_start(client(7), &format!("k{i}"), 1024, &soft)
            .unwrap();
        m.put_end(client(7), &format!("k{i}")).unwrap();
    }
    let r = m.evict(2048, 2048);
    assert_eq!(r.evicted_objects, 2);
    let (m2, _) = master_with(MasterConfig {
        allow_evict_soft_pinned: false,
        ..small_config()
    });
    m2.mount_segment(client(1), spec("s0", 0, 10 * 1024))
        .unwrap();
    m2.put_start(client(7), "k", 1024, &soft).unwrap();
    m2.put_end(client(7), "k").unwrap();
    assert_eq!(m2.evict(2048, 2048).evicted_objects, 0);
}

#[test]
fn allocation_failure_triggers_eviction() {
    let (m, _) = master_with(small_config());
    m.mount_segment(client(1), spec("s0", 0, 8 * 1024)).unwrap();
    for i in 0..8 {
        put(&m, &format!("k{i}"), 1024);
    }
    m.put_start(client(7), "new", 1024, &one()).unwrap();
    m.put_end(client(7), "new").unwrap();
    assert_eq!(m.stats().evicted_objects, 1);
    assert_eq!(m.stats().keys, 8);
    // Nothing evictable: every object leased.
    for k in m.list_keys("", None, None).unwrap().keys {
        m.get_replicas(&k).unwrap();
    }
    assert!(matches!(
        m.put_start(client(7), "more", 1024, &one()),
        Err(MasterError::NoAvailableHandle(_))
    ));
    assert_eq!(m.stats().keys, 8);
}

#[test]
fn eviction_takes_the_oldest_across_shards_however_few_each_holds() {
    // 64 shards, 100 objects of 1 KiB put a millisecond apart: most shards hold one or
    // two. Freeing 10 KiB takes the 10 oldest, wherever they lie; the newest stays.
    let (m, clock) = master_with(MasterConfig {
        shards: 64,
        ..MasterConfig::default()
    });
    m.mount_segment(client(1), spec("s0", 0, SEG)).unwrap();
    for i in 0..100 {
        put(&m, &format!("k{i:03}"), 1024);
        clock.advance(1);
    }
    let r = m.evict(10 * 1024, 10 * 1024);
    assert_eq!(r.evicted_objects, 10, "{r:?}");
    for i in 0..100 {
        let key = format!("k{i:03}");
        assert_eq!(m.object(&key).is_ok(), i >= 10, "{key}");
    }
    // A read makes the oldest object young again (its lease ends seconds after the
    // others'): a round a minute later, cutting to within 1% of their ages, passes it by.
    m.get_replicas("k010").unwrap();
    clock.advance(60_000);
    let r = m.evict(1024, 1024);
    assert_eq!(r.evicted_objects, 1, "{r:?}");
    assert!(m.object("k010").is_ok());
    assert_eq!(m.stats().keys, 89);
}
