//! A master rebuilt from durable records: what a newly elected HA leader serves.
//!
//! Segments come back with their mount ids and owners; every object comes back readable,
//! at the very offsets its record names (each segment's allocator is rebuilt around them),
//! with a fresh read lease, since readers of the old leader may still be reading it, and
//! its soft pin restarted. Clients owning segments come back alive (their TTL restarts):
//! a client whose segments survived is answered `ok`, not `need_remount`.
//!
//! Every restored segment takes no new values for `use_within_ms`
//! ([`Master::use_within_ms`]): the puts the old leader started and had not ended are in no
//! record, so their space looks free, while their writers may still start writing into it
//! for as long (a client starts writing a put-start's replicas within that window of
//! sending the request, or not at all).
//!
//! Records that no longer describe anything are reported as stale, not loaded: an object
//! whose every replica sits on a mount that has ended (its segment unmounted, or remounted
//! under a new id), or whose range collides with one kept already.

use std::collections::HashMap;
use std::sync::Arc;

use transfer::memory::Allocation;

use super::journal::{Journal, ObjectRecord, SegmentRecord};
use super::object::{Object, Replica, Replicas, ReplicateConfig};
use super::segment::Segment;
use super::{Clock, Master, MasterConfig, MasterResult};

/// A map on the master's fast hash (keys here are the records' own, not an attacker's).
type FoldMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The place of a replica whose mount has ended.
const NOT_LIVE: (u32, u32) = (u32::MAX, u32::MAX);

/// The durable state of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Mounted segments, oldest first (of two records for one name the later wins).
    pub segments: Vec<SegmentRecord>,
    /// Readable objects.
    pub objects: Vec<ObjectRecord>,
}

/// A restored master and what its records held that no longer applies.
#[derive(Debug)]
pub struct Restored {
    /// The master.
    pub master: Master,
    /// Keys of object records that were not loaded (see the module doc).
    pub stale_objects: Vec<String>,
    /// Segment records overridden by a later record of the same name: `(name, mount)`.
    pub stale_mounts: Vec<(String, u64)>,
}

impl Master {
    /// Builds a master from `snapshot` that writes through `journal` (see the module doc).
    pub fn restore(
        config: MasterConfig,
        clock: Arc<dyn Clock>,
        journal: Option<Arc<dyn Journal>>,
        snapshot: &Snapshot,
    ) -> MasterResult<Restored> {
        let master = Self::with_journal(config, clock, journal)?;
        let now = master.clock.now_ms();
        let mut stale_mounts = Vec::new();
        let mut by_name: HashMap<&str, &SegmentRecord> = HashMap::new();
        for rec in &snapshot.segments {
            if let Some(old) = by_name.insert(&rec.spec.name, rec) {
                stale_mounts.push((old.spec.name.clone(), old.mount));
            }
        }
        // Live mounts, numbered; each replica on one gets its place in that mount's list of
        // ranges (`NOT_LIVE` otherwise), so its allocation is found by position, not by key.
        let live: Vec<&SegmentRecord> = by_name.values().copied().collect();
        let number: FoldMap<&str, usize> = live
            .iter()
            .enumerate()
            .map(|(i, rec)| (rec.spec.name.as_str(), i))
            .collect();
        let mut ranges: Vec<Vec<(u64, u64)>> = vec![Vec::new(); live.len()];
        let mut places = Vec::with_capacity(snapshot.objects.len());
        // Each record's key hashed once, and its first replica's index among all replicas.
        let mut keyed = Vec::with_capacity(snapshot.objects.len());
        // Records per shard: each shard is sized once (growing a quarter at a time, as puts
        // do, would copy 10 M objects over and over).
        let mut per_shard = vec![0usize; master.shards.len()];
        for obj in &snapshot.objects {
            let hash = master.hash(&obj.key);
            per_shard[master.shard_of(hash)] += 1;
            keyed.push((hash, places.len()));
            let units = master.units(obj.length);
            for r in &obj.replicas {
                let place = match number.get(r.segment.as_str()) {
                    Some(&i) if live[i].mount == r.mount => {
                        ranges[i].push((r.offset, units));
                        (i as u32, (ranges[i].len() - 1) as u32)
                    }
                    _ => NOT_LIVE,
                };
                places.push(place);
            }
        }
        for (i, n) in per_shard.into_iter().enumerate() {
            master.lock_shard(i).reserve(n, &master);
        }
        // Each live segment's allocator rebuilt around its ranges, in one pass.
        let mut segments = Vec::with_capacity(live.len());
        let mut allocs = Vec::with_capacity(live.len());
        for (rec, used) in live.iter().zip(&ranges) {
            let (seg, got) =
                Segment::restored(&rec.spec, rec.client, master.align_shift, rec.mount, used);
            // Puts its predecessor started and did not end are not in the records: their
            // writers may still be writing into what looks free now.
            let seg = seg.held_until(now.saturating_add(master.use_within_ms()));
            segments.push(Arc::new(seg));
            allocs.push(got);
        }
        drop(ranges);
        // Each replica's allocation, by its index (`None`: its mount ended or its range was
        // not kept).
        let granted: Vec<Option<(u32, Allocation)>> = places
            .into_iter()
            .map(|place| match place {
                NOT_LIVE => None,
                (i, pos) => allocs[i as usize][pos as usize].map(|a| (i, a)),
            })
            .collect();
        drop(allocs);
        let mut stale = master.insert_restored(&keyed, &|record| {
            let obj = &snapshot.objects[record];
            let replicas: Vec<Replica> = granted[keyed[record].1..][..obj.replicas.len()]
                .iter()
                .flatten()
                .map(|&(i, alloc)| Replica {
                    segment: segments[i as usize].clone(),
                    alloc,
                })
                .collect();
            if master.check_key(&obj.key).is_err() || obj.length == 0 || replicas.is_empty() {
                replicas.into_iter().for_each(Replica::release);
                return None;
            }
            let cfg = ReplicateConfig {
                replica_num: replicas.len() as u32,
                soft_pin: obj.soft_pin,
                hard_pin: obj.hard_pin,
                ..ReplicateConfig::default()
            };
            let units = master.units(obj.length);
            let mut o = Object::new(
                &obj.key,
                Replicas::from_vec(replicas),
                obj.length,
                units << master.align_shift,
                now,
                obj.client,
                &cfg,
            );
            o.complete(now, master.config.soft_pin_ttl_ms);
            o.grant_lease(now, master.config.lease_ttl_ms);
            Some(o)
        });
        stale.sort_unstable();
        let stale_objects = stale
            .into_iter()
            .map(|r| snapshot.objects[r].key.clone())
            .collect();
        {
            let mut table = master.segments.write();
            let mut clients = master.clients.lock();
            for rec in &snapshot.segments {
                let Some(seg) = number
                    .get(rec.spec.name.as_str())
                    .map(|&i| &segments[i])
                    .filter(|s| s.mount_id() == rec.mount)
                else {
                    continue;
                };
                let seg = seg.clone();
                let entry = clients.seen(rec.client, now);
                entry.add_segment(seg.name_arc());
                table.insert(seg);
            }
        }
        Ok(Restored {
            master,
            stale_objects,
            stale_mounts,
        })
    }
}

impl Master {
    /// Makes and inserts the restored objects on every core, each thread taking the
    /// records of its own shards, in record order: shards are independent, a thread's
    /// locks are its own, and at 10 M objects a takeover is mostly these inserts (waits on
    /// memory, which threads overlap). `keyed[r]` is record `r`'s key hash; `make` answers
    /// its object (`None`: stale, its space given back). A key met twice keeps its first
    /// record's object (the later one's space is given back). Answers the stale records.
    fn insert_restored(
        &self,
        keyed: &[(u64, usize)],
        make: &(dyn Fn(usize) -> Option<Object> + Sync),
    ) -> Vec<usize> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(self.shards.len());
        let fill = |t: usize| {
            let mut stale = Vec::new();
            for (record, &(hash, _)) in keyed.iter().enumerate() {
                let shard = self.shard_of(hash);
                if shard % threads != t {
                    continue;
                }
                let Some(o) = make(record) else {
                    stale.push(record);
                    continue;
                };
                if let Err(twice) = self.lock_shard(shard).insert_new(hash, o, self) {
                    twice.release();
                }
            }
            stale
        };
        std::thread::scope(|s| {
            let others: Vec<_> = (1..threads).map(|t| s.spawn(move || fill(t))).collect();
            let mut stale = fill(0);
            for h in others {
                match h.join() {
                    Ok(more) => stale.extend(more),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            stale
        })
    }
}
