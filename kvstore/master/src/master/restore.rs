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

use super::journal::{Journal, ObjectRecord, SegmentRecord};
use super::object::{Object, Replica, Replicas, ReplicateConfig};
use super::segment::Segment;
use super::{Clock, Master, MasterConfig, MasterResult};

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
        // Every replica's range, per live mount, to rebuild the allocators in one pass.
        let mut used: HashMap<(&str, u64), Vec<(u64, u64)>> = HashMap::new();
        let live = |name: &str, mount: u64| by_name.get(name).is_some_and(|s| s.mount == mount);
        for obj in &snapshot.objects {
            let units = master.units(obj.length);
            for r in &obj.replicas {
                if live(&r.segment, r.mount) {
                    used.entry((r.segment.as_str(), r.mount))
                        .or_default()
                        .push((r.offset, units));
                }
            }
        }
        // Allocation of each (mount, offset), handed to the objects below.
        let mut segments: HashMap<&str, Arc<Segment>> = HashMap::new();
        let mut allocs: HashMap<(&str, u64), HashMap<u64, transfer::memory::Allocation>> =
            HashMap::new();
        for rec in by_name.values() {
            let ranges = used
                .remove(&(rec.spec.name.as_str(), rec.mount))
                .unwrap_or_default();
            let (seg, got) = Segment::restored(
                &rec.spec,
                rec.client,
                master.align_shift,
                rec.mount,
                &ranges,
            );
            // Puts its predecessor started and did not end are not in the records: their
            // writers may still be writing into what looks free now.
            let seg = seg.held_until(now.saturating_add(master.use_within_ms()));
            let slot = allocs
                .entry((rec.spec.name.as_str(), rec.mount))
                .or_default();
            for ((offset, _), a) in ranges.iter().zip(got) {
                if let Some(a) = a {
                    slot.insert(*offset, a);
                }
            }
            segments.insert(&rec.spec.name, Arc::new(seg));
        }
        let mut stale_objects = Vec::new();
        for obj in &snapshot.objects {
            if master.check_key(&obj.key).is_err() || obj.length == 0 {
                stale_objects.push(obj.key.clone());
                continue;
            }
            let mut replicas = Vec::new();
            for r in &obj.replicas {
                let alloc = allocs
                    .get_mut(&(r.segment.as_str(), r.mount))
                    .and_then(|m| m.remove(&r.offset));
                if let (Some(alloc), Some(seg)) = (alloc, segments.get(r.segment.as_str())) {
                    replicas.push(Replica {
                        segment: seg.clone(),
                        alloc,
                    });
                }
            }
            if replicas.is_empty() {
                stale_objects.push(obj.key.clone());
                continue;
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
            let hash = master.hash(&obj.key);
            let mut shard = master.lock_shard(master.shard_of(hash));
            if shard.find(hash, &obj.key).is_some() {
                drop(shard);
                o.release();
                continue;
            }
            shard.insert(hash, o, &master);
        }
        {
            let mut table = master.segments.write();
            let mut clients = master.clients.lock();
            for rec in &snapshot.segments {
                let Some(seg) = segments
                    .remove(rec.spec.name.as_str())
                    .filter(|s| s.mount_id() == rec.mount)
                else {
                    continue;
                };
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
