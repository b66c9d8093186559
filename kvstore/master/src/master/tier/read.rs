//! The read side of the disk tier: descriptions of where values lie, reads that start a
//! load when a value lives on disk, and the release of reads of memory copies of disk
//! values (so their memory can go before their leases end).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::super::object::{Object, Replica, Replicas, TierState};
use super::super::segment::Segment;
use super::super::{
    ClientId, Master, MasterError, MasterResult, Read, ReplicaLocation, ReplicaSet,
};
use openapi::master::{TierTask, TierTaskKind};
use transfer::memory::Allocation;

/// Most keys whose unreleased reads are counted at once.
const MAX_TRACKED_READS: usize = 1 << 20;
/// Most keys whose reads by their owner are counted at once (for promotion); past it the
/// counts start over, so old counts age out.
const MAX_COUNTED_HITS: usize = 1 << 16;
/// Tasks a segment may have queued beyond which a read promotes nothing.
const PROMOTION_QUEUE: usize = 64;
/// Most keys per segment waiting for room to be read back (see `Tiers::room_wanted`).
const MAX_ROOM_WANTED: usize = 4096;

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

    /// Counts a read of a value on `seg`'s owner's disk by that owner: whether the value
    /// has now been read `disk_promote_after` times and is to be copied back into memory
    /// (and the segment's queue has room for the load). The count stays until the load
    /// starts.
    fn admit_promotion(&self, hash: u64, seg: &Segment) -> bool {
        let after = self.config.disk_promote_after;
        if after == 0 {
            return false;
        }
        let queued = self.tiers.queues.lock().get(seg.name()).map_or(0, Vec::len);
        if queued >= PROMOTION_QUEUE {
            return false;
        }
        let mut hits = self.tiers.hits.lock();
        if hits.len() >= MAX_COUNTED_HITS && !hits.contains_key(&hash) {
            hits.clear();
        }
        let n = hits.entry(hash).or_default();
        *n = n.saturating_add(1);
        *n >= after
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
        self.lookup_as(key, None)
    }

    /// [`Master::lookup`] by a `reader` that names itself: a value that lies only on the
    /// reader's own disk tier is answered as that disk ([`ReplicaSet::own_disk`]), under a
    /// read lease, and no load starts: the reader reads its own disk, as Mooncake's
    /// client reads its own `LOCAL_DISK` replicas. A reader that names another client
    /// gains nothing by it: the answer names a disk it cannot read.
    pub fn lookup_as(&self, key: &str, reader: Option<ClientId>) -> MasterResult<Lookup> {
        match self.lookup_once(key, reader)? {
            Found::Ready(set) => Ok(Lookup::Ready(set)),
            Found::Loading => Ok(Lookup::Loading),
            Found::NoSpace => {
                // Make room (eviction takes shard locks: none is held here) and try once more.
                self.evict_for_allocation();
                match self.lookup_once(key, reader)? {
                    Found::Ready(set) => Ok(Lookup::Ready(set)),
                    Found::Loading => Ok(Lookup::Loading),
                    Found::NoSpace => Err(MasterError::NoAvailableHandle(format!(
                        "{key} is on disk and its segment has no room to read it back"
                    ))),
                }
            }
        }
    }

    fn lookup_once(&self, key: &str, reader: Option<ClientId>) -> MasterResult<Found> {
        self.check_key(key)?;
        let hash = self.hash(key);
        let now = self.clock.now_ms();
        let at = self.shard_of(hash);
        let mut shard = self.lock_shard(at);
        let Some(i) = shard.find(hash, key) else {
            self.tally_read(at, Read::Miss);
            return Err(MasterError::ObjectNotFound(key.to_string()));
        };
        let o = shard.get_mut(i);
        if !o.is_complete() {
            return Err(MasterError::ReplicaIsNotReady(key.to_string()));
        }
        // On disk or loading: `replicas[0]` is the disk's (and the load's) segment.
        let disk_seg =
            (o.is_on_disk() || o.is_loading()).then(|| o.replicas.as_slice()[0].segment.clone());
        if let Some(seg) = disk_seg
            .as_ref()
            .filter(|s| reader.is_some_and(|r| r == s.client()))
        {
            // Its owner reads its own disk (a load under way is the owner's promotion).
            if !seg.is_mounted() {
                self.tally_read(at, Read::Miss);
                return Err(MasterError::ObjectNotFound(format!(
                    "{key}: the segment whose disk holds it is unmounted"
                )));
            }
            self.tally_read(at, Read::Disk);
            o.grant_lease(now, self.config.lease_ttl_ms);
            let set = ReplicaSet {
                length: o.length,
                lease_ttl_ms: self.config.lease_ttl_ms,
                replicas: Vec::new(),
                own_disk: Some(seg.clone()),
                release: false,
            };
            let mut promote = None;
            if o.is_on_disk() && self.admit_promotion(hash, seg) {
                match seg.try_alloc(self.units(o.length)) {
                    Some(alloc) => {
                        self.tiers.hits.lock().remove(&hash);
                        promote = Some(start_load(o, key, seg, alloc));
                    }
                    // No room: the next tick evicts, and a later read promotes.
                    None => self.need_eviction.store(true, Ordering::Relaxed),
                }
            }
            drop(shard);
            if let Some(task) = promote {
                self.tiers
                    .counters
                    .promotions
                    .fetch_add(1, Ordering::Relaxed);
                metrics::counter!(crate::metrics::DISK_PROMOTIONS).increment(1);
                self.queue(seg.name_arc(), task, 0);
            }
            return Ok(Found::Ready(set));
        }
        if o.is_loading() {
            self.tally_read(at, Read::Disk);
            return Ok(Found::Loading);
        }
        if let (true, Some(seg)) = (o.is_on_disk(), disk_seg) {
            if !seg.is_mounted() {
                self.tally_read(at, Read::Miss);
                return Err(MasterError::ObjectNotFound(format!(
                    "{key}: the segment whose disk holds it is unmounted"
                )));
            }
            let Some(alloc) = seg.try_alloc(self.units(o.length)) else {
                drop(shard);
                self.want_room(seg.name_arc(), key);
                return Ok(Found::NoSpace);
            };
            let task = start_load(o, key, &seg, alloc);
            self.tally_read(at, Read::Disk);
            drop(shard);
            self.queue(seg.name_arc(), task, 0);
            return Ok(Found::Loading);
        }
        let replicas = o.locations();
        if replicas.is_empty() {
            self.tally_read(at, Read::Miss);
            return Err(MasterError::ObjectNotFound(format!(
                "{key}: every replica's segment is unmounted"
            )));
        }
        self.tally_read(at, Read::Memory);
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
            own_disk: None,
            release,
        }))
    }
}

/// Marks `o` (on disk on `seg`) as loading into `alloc`; answers the load to queue.
impl Master {
    /// Notes that a read of `key`, on `seg`'s disk, found no room there.
    fn want_room(&self, seg: &Arc<str>, key: &str) {
        self.tiers
            .room_wanted
            .lock()
            .entry(seg.clone())
            .or_default()
            .add(key.into());
    }

    /// The owner of `seg` reported tasks done, which may have freed memory: the loads that
    /// reads are waiting on for room start now, in the order asked, before puts take the
    /// room; those that still find none keep waiting.
    pub(super) fn load_wanted(&self, seg: &Arc<Segment>) {
        let Some(keys) = self.tiers.room_wanted.lock().remove(seg.name_arc()) else {
            return;
        };
        let mut started = Vec::new();
        let mut rest = keys.order.into_iter();
        for key in rest.by_ref() {
            let hash = self.hash(&key);
            let mut shard = self.lock_shard(self.shard_of(hash));
            let Some(i) = shard.find(hash, &key) else {
                continue;
            };
            let o = shard.get_mut(i);
            let ours = o.is_on_disk() && Arc::ptr_eq(&o.replicas.as_slice()[0].segment, seg);
            if !ours || !seg.is_mounted() {
                continue;
            }
            let Some(alloc) = seg.try_alloc(self.units(o.length)) else {
                drop(shard);
                let mut wanted = self.tiers.room_wanted.lock();
                let keys = wanted.entry(seg.name_arc().clone()).or_default();
                let later = std::mem::take(keys);
                for k in std::iter::once(key).chain(rest).chain(later.order) {
                    keys.add(k);
                }
                break;
            };
            started.push(start_load(o, &key, seg, alloc));
        }
        for task in started {
            self.queue(seg.name_arc(), task, 0);
        }
    }
}

/// Keys of one segment waiting for room, in the order asked, each once, at most
/// [`MAX_ROOM_WANTED`].
#[derive(Debug, Default)]
pub(super) struct RoomWanted {
    order: Vec<Box<str>>,
    seen: HashSet<Box<str>>,
}

impl RoomWanted {
    fn add(&mut self, key: Box<str>) {
        if self.order.len() < MAX_ROOM_WANTED && self.seen.insert(key.clone()) {
            self.order.push(key);
        }
    }
}

fn start_load(o: &mut Object, key: &str, seg: &Arc<Segment>, alloc: Allocation) -> TierTask {
    let task = TierTask {
        kind: TierTaskKind::Load,
        key: key.to_owned(),
        address: seg.address_of(alloc),
        length: o.length,
        // Numbered when queued.
        id: 0,
        traceparent: READER_TRACE
            .try_with(|t| t.as_deref().map(str::to_owned))
            .ok()
            .flatten(),
    };
    o.replicas = Replicas::One(Replica {
        segment: seg.clone(),
        alloc,
    });
    o.set_tier(TierState::Loading);
    task
}

tokio::task_local! {
    /// The `traceparent` of the read being served (see [`with_reader_trace`]).
    static READER_TRACE: Option<Arc<str>>;
}

/// Runs `fut`, a read, with its caller's `traceparent` (when it sent a plausible one: up to
/// 64 visible ASCII bytes; the owner parses it): the loads it starts carry it to the owner
/// of the disk ([`TierTask::traceparent`]), whose load then joins the reader's trace.
pub async fn with_reader_trace<F: Future>(traceparent: Option<&str>, fut: F) -> F::Output {
    let tp = traceparent
        .filter(|t| t.len() <= 64 && t.bytes().all(|b| b.is_ascii_graphic()))
        .map(Arc::from);
    READER_TRACE.scope(tp, fut).await
}

enum Found {
    Ready(ReplicaSet),
    Loading,
    NoSpace,
}
