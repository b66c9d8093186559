//! The read side of the disk tier: descriptions of where values lie, reads that start a
//! load when a value lives on disk, and the release of reads of memory copies of disk
//! values (so their memory can go before their leases end).

use std::sync::Arc;

use super::super::object::{Replica, Replicas, TierState};
use super::super::segment::Segment;
use super::super::{Master, MasterError, MasterResult, ReplicaLocation, ReplicaSet};
use openapi::master::{TierTask, TierTaskKind};

/// Most keys whose unreleased reads are counted at once.
const MAX_TRACKED_READS: usize = 1 << 20;

/// An object's replicas as they lie, for descriptions (see [`Master::describe`]).
#[derive(Debug)]
pub struct Described {
    /// Object length in bytes.
    pub length: u64,
    /// Replicas in memory, readable now.
    pub memory: Vec<ReplicaLocation>,
    /// The segment whose owner holds the value on disk, if one does.
    pub disk: Option<Arc<Segment>>,
}

/// What one read found: the replicas, or a load under way.
#[derive(Debug)]
pub enum Lookup {
    /// Readable now.
    Ready(ReplicaSet),
    /// On disk: its owner is reading it back; ask again after [`Master::tier_changed`].
    Loading,
}

impl Master {
    /// `key`'s replicas as they lie, memory and disk, without granting a lease or reading
    /// anything back from disk (Mooncake's replica descriptions).
    pub fn describe(&self, key: &str) -> MasterResult<Described> {
        self.check_key(key)?;
        let hash = self.hash(key);
        let shard = self.lock_shard(self.shard_of(hash));
        let i = shard
            .find(hash, key)
            .ok_or_else(|| MasterError::ObjectNotFound(key.to_string()))?;
        let o = shard.get(i);
        if !o.is_complete() {
            return Err(MasterError::ReplicaIsNotReady(key.to_string()));
        }
        let disk = match o.tier() {
            TierState::OnDisk | TierState::Loading => {
                Some(o.replicas.as_slice()[0].segment.clone())
            }
            TierState::DiskCopy | TierState::Copied => {
                Self::disk_replica(o).map(|r| r.segment.clone())
            }
            _ => None,
        };
        Ok(Described {
            length: o.length,
            memory: o.locations(),
            disk: disk.filter(|s| s.is_mounted()),
        })
    }

    /// [`Master::describe`] for many keys.
    pub fn batch_describe<K: AsRef<str>>(
        &self,
        keys: &[K],
    ) -> MasterResult<Vec<MasterResult<Described>>> {
        self.batch(keys, |k| self.describe(k.as_ref()))
    }

    /// Counts a read granted on a value whose memory copy is also on disk.
    fn count_read(&self, key: &str) {
        let mut readers = self.tiers.readers.lock();
        if readers.len() >= MAX_TRACKED_READS && !readers.contains_key(key) {
            // Readers that never released (gone): their leases end on their own.
            readers.clear();
        }
        *readers.entry(key.into()).or_default() += 1;
    }

    /// Readers of `keys` are done with the replicas their lookups answered with `release`:
    /// once every read granted on a key is released, its read lease ends, so eviction
    /// may drop the memory copy (the value stays on disk) at once instead of at the end
    /// of the lease. Keys never granted such a read are left alone.
    pub fn release_reads<K: AsRef<str>>(&self, keys: &[K]) -> MasterResult<()> {
        self.check_batch(keys.len())?;
        let now = self.clock.now_ms();
        for k in keys {
            let key = k.as_ref();
            if self.check_key(key).is_err() {
                continue;
            }
            let hash = self.hash(key);
            let mut shard = self.lock_shard(self.shard_of(hash));
            let last = {
                let mut readers = self.tiers.readers.lock();
                match readers.get_mut(key) {
                    Some(n) if *n > 1 => {
                        *n -= 1;
                        false
                    }
                    Some(_) => {
                        readers.remove(key);
                        true
                    }
                    None => false,
                }
            };
            if let (true, Some(i)) = (last, shard.find(hash, key)) {
                let o = shard.get_mut(i);
                if o.has_disk_copy() {
                    o.lease_until = o.lease_until.min(now);
                }
            }
        }
        Ok(())
    }

    /// A read of `key`: its replicas, or a load started (or under way) when it lives on
    /// disk. Grants a read lease when ready.
    pub fn lookup(&self, key: &str) -> MasterResult<Lookup> {
        match self.lookup_once(key)? {
            Found::Ready(set) => Ok(Lookup::Ready(set)),
            Found::Loading => Ok(Lookup::Loading),
            Found::NoSpace => {
                // Make room (eviction takes shard locks: none is held here) and try once more.
                self.evict_for_allocation();
                match self.lookup_once(key)? {
                    Found::Ready(set) => Ok(Lookup::Ready(set)),
                    Found::Loading => Ok(Lookup::Loading),
                    Found::NoSpace => Err(MasterError::NoAvailableHandle(format!(
                        "{key} is on disk and its segment has no room to read it back"
                    ))),
                }
            }
        }
    }

    fn lookup_once(&self, key: &str) -> MasterResult<Found> {
        self.check_key(key)?;
        let hash = self.hash(key);
        let now = self.clock.now_ms();
        let mut shard = self.lock_shard(self.shard_of(hash));
        let i = shard
            .find(hash, key)
            .ok_or_else(|| MasterError::ObjectNotFound(key.to_string()))?;
        let o = shard.get_mut(i);
        if !o.is_complete() {
            return Err(MasterError::ReplicaIsNotReady(key.to_string()));
        }
        if o.is_loading() {
            return Ok(Found::Loading);
        }
        if o.is_on_disk() {
            let seg = o.replicas.as_slice()[0].segment.clone();
            if !seg.is_mounted() {
                return Err(MasterError::ObjectNotFound(format!(
                    "{key}: the segment whose disk holds it is unmounted"
                )));
            }
            let Some(alloc) = seg.try_alloc(self.units(o.length)) else {
                return Ok(Found::NoSpace);
            };
            let task = TierTask {
                kind: TierTaskKind::Load,
                key: key.to_owned(),
                address: seg.address_of(alloc),
                length: o.length,
            };
            o.replicas = Replicas::One(Replica {
                segment: seg.clone(),
                alloc,
            });
            o.set_tier(TierState::Loading);
            drop(shard);
            self.queue(seg.name_arc(), task, 0);
            return Ok(Found::Loading);
        }
        let replicas = o.locations();
        if replicas.is_empty() {
            return Err(MasterError::ObjectNotFound(format!(
                "{key}: every replica's segment is unmounted"
            )));
        }
        o.grant_lease(now, self.config.lease_ttl_ms);
        let release = o.has_disk_copy();
        let length = o.length;
        if release {
            // Under the shard lock, like the releases: a release never ends a lease
            // granted after its count was taken.
            self.count_read(key);
        }
        drop(shard);
        Ok(Found::Ready(ReplicaSet {
            length,
            lease_ttl_ms: self.config.lease_ttl_ms,
            replicas,
            release,
        }))
    }
}

enum Found {
    Ready(ReplicaSet),
    Loading,
    NoSpace,
}
