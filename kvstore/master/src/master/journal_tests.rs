//! A journaled master against a journal the test commits by hand: what is visible before
//! and after a commit, space reuse, and a master restored from the committed records.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use super::tests::{SEG, client, small_config, spec};
use super::*;

/// Changes queue up until [`Manual::commit`]; committed records land in `store` the way
/// the HA layer lays them out in etcd (one entry per segment mount and per object).
#[derive(Default)]
struct Manual {
    queue: Mutex<Vec<Change>>,
    last: Mutex<u64>,
    segments: Mutex<BTreeMap<(String, u64), SegmentRecord>>,
    objects: Mutex<HashMap<String, ObjectRecord>>,
}

impl Journal for Manual {
    fn append(&self, changes: Vec<Change>) -> u64 {
        let mut last = self.last.lock();
        *last += changes.len() as u64;
        self.queue.lock().extend(changes);
        *last
    }

    fn appended(&self) -> u64 {
        *self.last.lock()
    }

    fn durable(&self, _seq: u64) -> Durable {
        Box::pin(std::future::ready(Ok(())))
    }
}

impl Manual {
    /// Commits everything queued, in order, and runs the apply steps.
    fn commit(&self, m: &Master) -> usize {
        let changes = std::mem::take(&mut *self.queue.lock());
        let n = changes.len();
        for c in changes {
            match c.record {
                Record::Mount(s) => {
                    self.segments
                        .lock()
                        .insert((s.spec.name.clone(), s.mount), s);
                }
                Record::Unmount { name, mount } => {
                    self.segments.lock().remove(&(name, mount));
                }
                Record::Put(o) => {
                    self.objects.lock().insert(o.key.clone(), o);
                }
                Record::Remove { key } => {
                    self.objects.lock().remove(&key);
                }
            }
            if let Some(apply) = c.on_commit {
                apply(m);
            }
        }
        n
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            segments: self.segments.lock().values().cloned().collect(),
            objects: self.objects.lock().values().cloned().collect(),
        }
    }
}

fn journaled() -> (Master, Arc<Manual>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000));
    let journal = Arc::new(Manual::default());
    let m = Master::with_journal(
        small_config(),
        clock.clone(),
        Some(journal.clone() as Arc<dyn Journal>),
    )
    .unwrap();
    (m, journal, clock)
}

/// A journaled master with segment `s0` of `size` bytes (client 1) mounted and committed.
fn journaled_with_s0(size: u64) -> (Master, Arc<Manual>, Arc<ManualClock>) {
    let (m, j, clock) = journaled();
    m.mount_segment(client(1), spec("s0", 0x1000_0000, size))
        .unwrap();
    j.commit(&m);
    (m, j, clock)
}

fn one() -> ReplicateConfig {
    ReplicateConfig::default()
}

/// `m`'s segments take no value (refusals naming `why`) until exactly the write window
/// has passed from now; the clock is then at its end.
fn held_for_the_write_window(m: &Master, clock: &ManualClock, why: &str) {
    let Err(e) = m.put_start(client(7), "held", 100, &one()) else {
        panic!("a held segment took a value");
    };
    assert!(
        matches!(&e, MasterError::NoAvailableHandle(w) if w.contains(why)),
        "{e}"
    );
    clock.advance(m.use_within_ms() - 1);
    assert!(m.put_start(client(7), "held", 100, &one()).is_err());
    clock.advance(1);
}

#[test]
fn a_mount_is_usable_only_once_committed_and_is_idempotent_meanwhile() {
    let (m, j, _) = journaled();
    m.mount_segment(client(1), spec("s0", 0x1000_0000, SEG))
        .unwrap();
    assert!(m.segments().is_empty(), "nothing mounted before the commit");
    // The same mount again waits for the same commit; another client's is refused.
    m.mount_segment(client(1), spec("s0", 0x1000_0000, SEG))
        .unwrap();
    assert!(matches!(
        m.mount_segment(client(2), spec("s0", 0x2000_0000, SEG)),
        Err(MasterError::SegmentAlreadyExists(_))
    ));
    assert!(matches!(
        m.put_start(client(7), "k", 100, &one()),
        Err(MasterError::NoAvailableHandle(_))
    ));
    assert_eq!(j.commit(&m), 1, "one mount record");
    assert_eq!(m.segments().len(), 1);
    m.put_start(client(7), "k", 100, &one()).unwrap();
}

#[test]
fn a_journaled_put_end_is_readable_only_once_committed() {
    let (m, j, _) = journaled_with_s0(SEG);
    m.put_start(client(7), "k", 100, &one()).unwrap();
    m.put_end(client(7), "k").unwrap();
    assert!(matches!(
        m.get_replicas("k"),
        Err(MasterError::ReplicaIsNotReady(_))
    ));
    assert!(!m.exists("k").unwrap());
    // While its commit is pending the put can be neither revoked nor taken over.
    assert!(matches!(
        m.put_revoke(client(7), "k"),
        Err(MasterError::InvalidWrite(_))
    ));
    m.put_end(client(7), "k").unwrap();
    assert_eq!(j.commit(&m), 1, "a repeated put_end appends nothing more");
    let r = m.get_replicas("k").unwrap();
    assert_eq!(r.length, 100);
    assert!(j.objects.lock().contains_key("k"));
}

#[test]
fn removed_space_is_reused_only_after_the_removal_commits() {
    let (m, j, clock) = journaled_with_s0(4096);
    m.put_start(client(7), "a", 4096, &one()).unwrap();
    m.put_end(client(7), "a").unwrap();
    j.commit(&m);
    clock.advance(60_000);
    m.remove("a", false).unwrap();
    assert!(matches!(
        m.get_replicas("a"),
        Err(MasterError::ObjectNotFound(_))
    ));
    // Its bytes may still come back after a failover: nobody may overwrite them yet.
    assert!(matches!(
        m.put_start(client(7), "b", 4096, &one()),
        Err(MasterError::NoAvailableHandle(_))
    ));
    j.commit(&m);
    assert!(!j.objects.lock().contains_key("a"));
    m.put_start(client(7), "b", 4096, &one()).unwrap();
}

#[test]
fn a_restored_master_serves_exactly_what_was_committed() {
    let (m, j, clock) = journaled();
    m.mount_segment(client(1), spec("s0", 0x1000_0000, SEG))
        .unwrap();
    m.mount_segment(client(2), spec("s1", 0x2000_0000, SEG))
        .unwrap();
    j.commit(&m);
    let two = ReplicateConfig {
        replica_num: 2,
        ..one()
    };
    for (k, cfg) in [("x", &one()), ("y", &two), ("z", &one()), ("gone", &one())] {
        m.put_start(client(7), k, 1000, cfg).unwrap();
        m.put_end(client(7), k).unwrap();
    }
    m.put_start(client(7), "unfinished", 10, &one()).unwrap();
    j.commit(&m);
    clock.advance(60_000);
    m.remove("gone", false).unwrap();
    j.commit(&m);
    let before: HashMap<&str, Vec<u64>> = ["x", "y", "z"]
        .into_iter()
        .map(|k| {
            let mut a: Vec<u64> = m
                .get_replicas(k)
                .unwrap()
                .replicas
                .iter()
                .map(|r| r.address)
                .collect();
            a.sort_unstable();
            (k, a)
        })
        .collect();

    let clock2 = Arc::new(ManualClock::new(5_000));
    let r = Master::restore(small_config(), clock2.clone(), None, &j.snapshot()).unwrap();
    assert!(r.stale_objects.is_empty() && r.stale_mounts.is_empty());
    let n = r.master;
    assert_ne!(n.view_version(), 0);
    for (k, addrs) in &before {
        let got = n.get_replicas(k).unwrap();
        let mut a: Vec<u64> = got.replicas.iter().map(|r| r.address).collect();
        a.sort_unstable();
        assert_eq!(&a, addrs, "{k} is where its record says");
    }
    assert!(matches!(
        n.get_replicas("gone"),
        Err(MasterError::ObjectNotFound(_))
    ));
    assert!(matches!(
        n.get_replicas("unfinished"),
        Err(MasterError::ObjectNotFound(_))
    ));
    // Live clients keep their segments: no remount.
    assert_eq!(n.ping(client(1)).status, ClientStatus::Ok);
    assert_eq!(n.ping(client(2)).status, ClientStatus::Ok);
    // Leases restarted: a just-restored object is not removable without force.
    assert!(matches!(
        n.remove("x", false),
        Err(MasterError::ObjectHasLease(_))
    ));
    // The old leader's unfinished put is in no record, yet its writer may still write:
    // restored segments take no new values until the write window is over.
    held_for_the_write_window(&n, &clock2, "restored");
    // New puts never land on restored bytes.
    let taken: Vec<(u64, u64)> = before.values().flatten().map(|&a| (a, a + 1024)).collect();
    for i in 0..50 {
        for loc in n
            .put_start(client(7), &format!("new{i}"), 1000, &one())
            .unwrap()
        {
            let (lo, hi) = (loc.address, loc.address + 1000);
            assert!(
                taken.iter().all(|&(a, b)| hi <= a || b <= lo),
                "new{i} at {lo:#x} overlaps a restored replica"
            );
        }
    }
    let stats = n.stats();
    assert_eq!(stats.segments, 2);
}

#[test]
fn puts_refused_while_restored_segments_are_held_evict_nothing() {
    let (m, j, _) = journaled_with_s0(SEG);
    for k in ["a", "b", "c"] {
        m.put_start(client(7), k, 1000, &one()).unwrap();
        m.put_end(client(7), k).unwrap();
    }
    j.commit(&m);
    // Read leases shorter than the hold: the restored objects are evictable meanwhile.
    let cfg = MasterConfig {
        lease_ttl_ms: 10,
        ..small_config()
    };
    let clock = Arc::new(ManualClock::new(5_000));
    let n = Master::restore(cfg, clock.clone(), None, &j.snapshot())
        .unwrap()
        .master;
    clock.advance(n.use_within_ms() / 2);
    for i in 0..20 {
        let e = n.put_start(client(7), &format!("new{i}"), 1000, &one());
        assert!(matches!(e, Err(MasterError::NoAvailableHandle(_))), "{e:?}");
    }
    // Room in a held segment helps no one: nothing was evicted for those puts.
    assert_eq!(n.stats().evicted_objects, 0);
    for k in ["a", "b", "c"] {
        n.get_replicas(k).unwrap();
    }
}

#[test]
fn a_journaled_remount_is_held_for_the_write_window_once_committed() {
    let (m, j, clock) = journaled_with_s0(SEG);
    // A put under way when the client's TTL runs out and its segment goes.
    m.put_start(client(7), "unfinished", 100, &one()).unwrap();
    clock.advance(m.config().client_ttl_ms + 1);
    assert_eq!(m.tick().expired_clients, 1);
    j.commit(&m);
    assert_eq!(m.ping(client(1)).status, ClientStatus::NeedRemount);
    m.remount_segments(client(1), vec![spec("s0", 0x1000_0000, SEG)])
        .unwrap();
    j.commit(&m);
    assert_eq!(m.ping(client(1)).status, ClientStatus::Ok);
    // Its writer may still write where it was told: nothing new goes there yet.
    held_for_the_write_window(&m, &clock, "remounted");
    m.put_start(client(7), "new", 100, &one()).unwrap();
}

#[test]
fn records_of_ended_mounts_are_stale_after_a_restore() {
    let (m, j, _) = journaled_with_s0(SEG);
    m.put_start(client(7), "k", 100, &one()).unwrap();
    m.put_end(client(7), "k").unwrap();
    j.commit(&m);
    // The node goes and comes back: the same name under a new mount id.
    m.unmount_segment(client(1), "s0").unwrap();
    m.mount_segment(client(1), spec("s0", 0x1000_0000, SEG))
        .unwrap();
    j.commit(&m);
    assert!(
        !j.objects.lock().contains_key("k"),
        "the unmount removed it"
    );
    // An object record left behind by a lost removal is recognised as stale.
    let mut snap = j.snapshot();
    snap.objects.push(record_at("orphan", 12345, 0));
    let r = Master::restore(small_config(), Arc::new(ManualClock::new(1)), None, &snap).unwrap();
    assert_eq!(r.stale_objects, vec!["orphan".to_string()]);
    assert_eq!(r.master.segments().len(), 1);
}

#[test]
fn a_journaled_master_reserves_nothing() {
    // A new leader would not know what this one reserved (see `master::reserve`).
    let (m, j, _) = journaled_with_s0(SEG);
    assert!(m.reserve(client(7), 4096, &one(), 2).unwrap().is_empty());
    assert_eq!(m.reserved(), (0, 0));
    assert_eq!(m.stats().allocated_bytes, 0);
    assert_eq!(j.commit(&m), 0, "nothing to journal");
}

#[test]
fn a_cleared_replica_is_journaled_and_its_space_reused_only_once_committed() {
    let (m, j, clock) = journaled_with_s0(4096);
    m.mount_segment(client(1), spec("s1", 0x2000_0000, 4096))
        .unwrap();
    j.commit(&m);
    clock.advance(m.use_within_ms());
    let two = ReplicateConfig {
        replica_num: 2,
        ..one()
    };
    m.put_start(client(7), "k", 4096, &two).unwrap();
    m.put_end(client(7), "k").unwrap();
    j.commit(&m);
    clock.advance(60_000);
    assert_eq!(
        m.replica_clear(client(7), &["k"], Some("s0")).unwrap(),
        ["k"]
    );
    assert_eq!(m.get_replicas("k").unwrap().replicas.len(), 1);
    // The cleared bytes may still come back after a failover until the change commits.
    assert!(matches!(
        m.put_start(client(7), "b", 4096, &one()),
        Err(MasterError::NoAvailableHandle(_))
    ));
    j.commit(&m);
    let rec = j.objects.lock()["k"].clone();
    assert_eq!(rec.replicas.len(), 1, "journaled with the replica it kept");
    m.put_start(client(7), "b", 4096, &one()).unwrap();
}

#[test]
fn a_detached_disk_is_journaled_so_a_new_leader_does_not_attach_it_again() {
    let (m, j, _) = journaled();
    let mut s = spec("d0", 0x1000_0000, SEG);
    s.disk_bytes = 1 << 30;
    s.disk_write_through = true;
    m.mount_segment(client(1), s).unwrap();
    j.commit(&m);
    let mounted = j.segments.lock().keys().next().unwrap().clone();
    assert_eq!(m.detach_disk(client(1), "d0").unwrap(), 0);
    assert_eq!(j.commit(&m), 1, "the mount record again");
    assert_eq!(j.segments.lock().len(), 1, "the same mount, rewritten");
    let rec = j.segments.lock()[&mounted].clone();
    assert_eq!(
        (rec.spec.disk_bytes, rec.spec.disk_write_through),
        (0, false)
    );
    assert_eq!(rec.spec.size, SEG);
}

/// A record of `key` on `s0`'s mount `mount` at `offset` (alignment units), 100 bytes.
fn record_at(key: &str, mount: u64, offset: u64) -> ObjectRecord {
    ObjectRecord {
        key: key.into(),
        length: 100,
        client: client(7),
        soft_pin: false,
        hard_pin: false,
        replicas: vec![ReplicaRecord {
            segment: "s0".into(),
            mount,
            offset,
        }],
    }
}

#[test]
fn records_that_clash_are_stale_and_keep_no_space() {
    let (_, j, _) = journaled_with_s0(SEG);
    let mut snap = j.snapshot();
    let mount = snap.segments[0].mount;
    let too_long = "k".repeat(small_config().max_key_bytes + 1);
    snap.objects = vec![
        record_at("a", mount, 0),
        // The same key again, elsewhere: the first record's object stays.
        record_at("a", mount, 10),
        // A range another record holds already.
        record_at("b", mount, 0),
        // A key the master refuses.
        record_at(&too_long, mount, 20),
        record_at("c", mount, 30),
    ];
    let r = Master::restore(small_config(), Arc::new(ManualClock::new(1)), None, &snap).unwrap();
    assert_eq!(r.stale_objects, vec!["b".to_string(), too_long]);
    let m = r.master;
    assert_eq!(m.stats().keys, 2);
    let at = |key: &str| m.get_replicas(key).unwrap().replicas[0].address;
    let base = 0x1000_0000;
    assert_eq!(at("a"), base, "the first record of a key wins");
    assert_eq!(at("c"), base + 30 * 64);
    // Only what the two objects hold stays allocated: two 100-byte values in 64-byte units.
    assert_eq!(m.stats().allocated_bytes, 2 * 128);
}
