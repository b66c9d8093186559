//! The disk tier: values evicted from a segment whose owner keeps a disk
//! (`SegmentSpec::disk_bytes > 0`) are written to that disk instead of being lost, and
//! read back into the segment when a reader asks for them.
//!
//! The master decides and the owner moves the bytes, between its own memory and its own
//! disk; no byte passes through the master. Per segment the master keeps a queue of
//! [`TierTask`]s, which the owner takes with [`Master::tier_exchange`] while reporting
//! what it finished. An object's tier state (`object::TierState`) goes:
//!
//! ```text
//!  memory --evict--> offloading --offload ok--> on disk --read--> loading --load ok--> disk copy
//!    ^                   |  (offload failed,                          | (load failed:  |
//!    +-------------------+   timed out)                               |  gone)   evict: on disk
//! ```
//!
//! - Eviction picks objects as before; one with a replica on a disk-tier segment is marked
//!   offloading (still readable from memory) and an offload task queued; its memory is
//!   freed when the owner reports the record durable, and not while a reader holds a lease
//!   (the conversion waits for the lease to end).
//! - A read of an on-disk object allocates space on the disk's segment and queues a load;
//!   the REST layer waits for it ([`Master::tier_changed`]), bounded by
//!   `disk_load_wait_ms`. A loaded object keeps its disk record: evicting it again costs
//!   no write. A read by the disk's owner itself is answered that disk, and promotes the
//!   value after `disk_promote_after` reads (`read`).
//! - An owner may stop its disk tier (`detach`): the master forgets the disk.
//! - Memory a task may still touch (an offload's source, a load's target) is reused only
//!   after `disk_task_timeout_ms` when its object goes away mid-task.
//! - Disk state is not journaled: an object moved to disk leaves the journal (its memory is
//!   freed), and every new master learns the disk records from the owners, which report
//!   them after a mount and whenever the master's view version changes.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::journal::{Change, Record};
use super::object::{DISK_ALLOCATION, Object, Replica, Replicas, TierState};
use super::segment::Segment;
use super::{ClientId, Discarded, Master, MasterError, MasterResult};
use openapi::master::{DiskRecord, TierDone, TierTask, TierTaskKind};

mod detach;
mod read;

pub use read::{Described, Lookup, with_reader_trace};

/// A task's identity: the segment and the key.
type TaskId = (Arc<str>, Box<str>);

/// Most offloads one exchange hands an owner: a round ends with one directory sync and
/// one report, so a load queued meanwhile (a reader waits on it) waits for at most this
/// many writes, and memory comes back round by round.
pub const ROUND_OFFLOADS: usize = 64;

/// A task handed to an owner and not reported yet.
#[derive(Debug)]
struct Inflight {
    kind: TierTaskKind,
    /// The task's number ([`TierTask::id`]).
    id: u64,
    deadline: u64,
    /// Bytes an offload will free (counted out of the eviction target meanwhile).
    bytes: u64,
}

/// The tier's bookkeeping beside the objects. Lock order: after the shard locks.
#[derive(Debug, Default)]
pub(crate) struct Tiers {
    /// Tasks not handed out yet, per segment name.
    queues: Mutex<HashMap<Arc<str>, Vec<TierTask>>>,
    /// Tasks handed out (or queued) and not reported, by (segment, key).
    /// The last task number given.
    next_id: AtomicU64,
    inflight: Mutex<HashMap<TaskId, Inflight>>,
    /// Offloads whose record is durable but whose object was leased: converted at a tick
    /// once the lease is over.
    deferred: Mutex<Vec<TaskId>>,
    /// Bytes of memory offloads in flight will free.
    offloading_bytes: AtomicU64,
    /// Bumped when objects of a vanished segment were forgotten (see `report_epoch`).
    report_epoch: AtomicU64,
    /// Reads granted and not released, per key of an object whose memory is a copy of a
    /// record on disk (see [`Master::release_reads`]).
    readers: Mutex<HashMap<Box<str>, u32>>,
    /// Reads of values on disk by their owner, by key hash, not yet promoted (see
    /// `disk_promote_after`).
    hits: Mutex<HashMap<u64, u32>>,
    /// Keys of values on disk whose reads found no room in their segment, per segment:
    /// loaded first when the owner's report frees memory (see `read`).
    room_wanted: Mutex<HashMap<Arc<str>, read::RoomWanted>>,
    /// Wakes owners waiting in an exchange (a task was queued).
    pub(crate) tasks_queued: tokio::sync::Notify,
    /// Wakes readers waiting for loads (a load finished, either way).
    pub(crate) loads_done: tokio::sync::Notify,
    counters: TierCounters,
}

impl Tiers {
    /// The tasks of `seg`'s next round, in the order to run them. Deletes and loads go
    /// alone, deletes first (before a later write of the same key): a reader waits on each
    /// load, and the owner reports a round only once all of it is done. Otherwise the
    /// oldest offloads, at most [`ROUND_OFFLOADS`]; the rest stay queued.
    fn take_round(&self, seg: &Arc<str>) -> Vec<TierTask> {
        let mut queues = self.queues.lock();
        let Some(queue) = queues.get_mut(seg) else {
            return Vec::new();
        };
        let (mut round, rest): (Vec<TierTask>, Vec<TierTask>) =
            if queue.iter().any(|t| t.kind != TierTaskKind::Offload) {
                queue
                    .drain(..)
                    .partition(|t| t.kind != TierTaskKind::Offload)
            } else {
                let rest = queue.split_off(queue.len().min(ROUND_OFFLOADS));
                (std::mem::take(queue), rest)
            };
        round.sort_by_key(|t| t.kind != TierTaskKind::Delete);
        if rest.is_empty() {
            queues.remove(seg);
        } else {
            *queue = rest;
        }
        round
    }
}

/// Totals of the disk tier since the master started.
#[derive(Debug, Default)]
struct TierCounters {
    offloads: AtomicU64,
    offload_failures: AtomicU64,
    loads: AtomicU64,
    load_failures: AtomicU64,
    adopted: AtomicU64,
    dropped: AtomicU64,
    timeouts: AtomicU64,
    promotions: AtomicU64,
}

/// Totals of the disk tier (see [`Master::tier_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Values written to disk by an owner (offloads reported durable).
    pub offloads: u64,
    /// Offloads that failed or timed out (the value stayed in memory).
    pub offload_failures: u64,
    /// Values read back from disk into memory.
    pub loads: u64,
    /// Loads that failed (a record missing or failing its checksum) or timed out.
    pub load_failures: u64,
    /// Disk records taken from owners' reports (after a restart of either side).
    pub adopted: u64,
    /// Records owners dropped on their own (disk full, checksum).
    pub dropped: u64,
    /// Loads started because the owner kept reading a value from its disk.
    pub promotions: u64,
    /// Objects that live only on disk now.
    pub on_disk_objects: u64,
    /// Bytes offloads in flight will free.
    pub offloading_bytes: u64,
}

impl Master {
    /// The notifications of the disk tier: `loads_done` for readers waiting on loads,
    /// `tasks_queued` for owners waiting in [`Master::tier_exchange`].
    pub fn tier_changed(&self) -> (&tokio::sync::Notify, &tokio::sync::Notify) {
        (&self.tiers.loads_done, &self.tiers.tasks_queued)
    }

    /// Values offloaded to disk and loaded back since start, without a scan.
    pub(crate) fn tier_moves(&self) -> (u64, u64) {
        let c = &self.tiers.counters;
        (
            c.offloads.load(Ordering::Relaxed),
            c.loads.load(Ordering::Relaxed),
        )
    }

    /// Totals of the disk tier.
    pub fn tier_stats(&self) -> TierStats {
        let c = &self.tiers.counters;
        let on_disk_objects = (0..self.shards.len())
            .map(|s| {
                let shard = self.lock_shard(s);
                shard
                    .indices()
                    .filter(|&i| shard.get(i).is_on_disk())
                    .count() as u64
            })
            .sum();
        TierStats {
            offloads: c.offloads.load(Ordering::Relaxed),
            offload_failures: c.offload_failures.load(Ordering::Relaxed),
            loads: c.loads.load(Ordering::Relaxed),
            load_failures: c.load_failures.load(Ordering::Relaxed),
            adopted: c.adopted.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            promotions: c.promotions.load(Ordering::Relaxed),
            on_disk_objects,
            offloading_bytes: self.tiers.offloading_bytes.load(Ordering::Relaxed),
        }
    }

    /// Asks every owner to report its records again (objects of a vanished segment are
    /// being forgotten; a disk may hold them).
    pub(crate) fn records_lost(&self) {
        self.tiers.report_epoch.fetch_add(1, Ordering::Relaxed);
        self.tiers.tasks_queued.notify_waiters();
    }

    /// Changes whenever owners should report their disk records again.
    pub fn report_epoch(&self) -> u64 {
        self.tiers.report_epoch.load(Ordering::Relaxed)
    }

    /// Bytes offloads in flight will free: eviction counts them as freed already.
    pub(crate) fn offloading_bytes(&self) -> u64 {
        self.tiers.offloading_bytes.load(Ordering::Relaxed)
    }

    fn queue(&self, seg: &Arc<str>, mut task: TierTask, bytes: u64) {
        let deadline = self
            .clock
            .now_ms()
            .saturating_add(self.config.disk_task_timeout_ms);
        task.id = self.tiers.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        if task.kind != TierTaskKind::Delete {
            self.tiers
                .offloading_bytes
                .fetch_add(bytes, Ordering::Relaxed);
            let replaced = self.tiers.inflight.lock().insert(
                (seg.clone(), task.key.as_str().into()),
                Inflight {
                    kind: task.kind,
                    id: task.id,
                    deadline,
                    bytes,
                },
            );
            // An earlier task of the key (its object removed meanwhile) is settled by
            // nothing now: its bytes are not to be freed any more.
            if let Some(old) = replaced {
                self.tiers
                    .offloading_bytes
                    .fetch_sub(old.bytes, Ordering::Relaxed);
            }
        }
        self.tiers
            .queues
            .lock()
            .entry(seg.clone())
            .or_default()
            .push(task);
        self.tiers.tasks_queued.notify_waiters();
    }

    fn queue_delete(&self, seg: &Arc<Segment>, key: &str) {
        self.queue(
            seg.name_arc(),
            TierTask {
                kind: TierTaskKind::Delete,
                key: key.to_owned(),
                address: 0,
                length: 0,
                id: 0,
                traceparent: None,
            },
            0,
        );
    }

    /// Settles the in-flight task `id` of `key` (0: whichever): whether it was known,
    /// with its offload bytes released. A report of an earlier task of the key settles
    /// nothing.
    fn settle(&self, seg: &Arc<str>, key: &str, id: u64) -> Option<Inflight> {
        let done = {
            let mut inflight = self.tiers.inflight.lock();
            let task = (seg.clone(), Box::from(key));
            if id != 0 && inflight.get(&task)?.id != id {
                return None;
            }
            inflight.remove(&task)?
        };
        self.tiers
            .offloading_bytes
            .fetch_sub(done.bytes, Ordering::Relaxed);
        Some(done)
    }

    /// The replica whose segment's owner keeps (or would keep) the value on disk.
    fn disk_replica(o: &Object) -> Option<&Replica> {
        o.replicas
            .as_slice()
            .iter()
            .find(|r| r.segment.disk_bytes() > 0 && r.segment.is_mounted())
    }

    fn offload_task(o: &Object, r: &Replica) -> TierTask {
        TierTask {
            kind: TierTaskKind::Offload,
            key: o.key.as_str().to_owned(),
            address: r.segment.address_of(r.alloc),
            length: o.length,
            // Numbered when queued.
            id: 0,
            traceparent: None,
        }
    }

    /// Eviction of `o` when its value can go to disk instead of being lost: marks it
    /// offloading and queues the write. Returns the bytes this will free, or `None` when
    /// the object has no replica on a mounted disk-tier segment (evict it as before).
    pub(crate) fn offload_on_evict(&self, o: &mut Object) -> Option<u64> {
        let r = Self::disk_replica(o)?;
        let (task, seg) = (Self::offload_task(o, r), r.segment.name_arc().clone());
        let bytes = o.footprint();
        o.set_tier(TierState::Offloading);
        self.queue(&seg, task, bytes);
        Some(bytes)
    }

    /// A put just completed: on a segment whose owner writes through, its copy on disk is
    /// queued (the memory stays).
    pub(crate) fn copy_on_complete(&self, o: &mut Object) {
        if self.config.disk_offload_on_evict {
            return;
        }
        let Some(r) = Self::disk_replica(o).filter(|r| r.segment.write_through()) else {
            return;
        };
        let (task, seg) = (Self::offload_task(o, r), r.segment.name_arc().clone());
        o.set_tier(TierState::Copying);
        self.queue(&seg, task, 0);
    }

    /// Eviction of a value whose record is on disk already (read back, or written
    /// through): its memory goes at once (after the journal forgot it, when it is
    /// journaled) and it lives on on disk. Returns the bytes freed.
    pub(crate) fn drop_to_disk(&self, o: &mut Object) -> u64 {
        let bytes = o.footprint();
        let seg = Self::disk_replica(o)
            .unwrap_or(&o.replicas.as_slice()[0])
            .segment
            .clone();
        self.to_disk(o, &seg);
        bytes
    }

    /// A removed object in a tier state: its record is deleted, and memory a task may
    /// still touch (an offload's or a copy's source, a load's target) is reused only after
    /// the task timeout.
    pub(crate) fn retire_tiered(&self, obj: Object) {
        let disk = Self::disk_replica(&obj)
            .unwrap_or(&obj.replicas.as_slice()[0])
            .segment
            .clone();
        let key = obj.key.as_str().to_owned();
        let (state, durable, aligned) = (obj.tier(), obj.is_durable(), obj.aligned);
        if matches!(
            state,
            TierState::OnDisk | TierState::DiskCopy | TierState::Copied | TierState::Loading
        ) {
            self.queue_delete(&disk, &key);
        }
        if state == TierState::OnDisk {
            return;
        }
        let replicas = obj.replicas.into_vec();
        let release_at = self
            .clock
            .now_ms()
            .saturating_add(self.config.disk_task_timeout_ms);
        let busy = matches!(
            state,
            TierState::Offloading | TierState::Copying | TierState::Loading
        );
        let free: Box<dyn FnOnce(&Master) + Send> = if busy {
            Box::new(move |m: &Master| {
                m.discarded.lock().push(Discarded {
                    release_at,
                    aligned,
                    replicas,
                })
            })
        } else {
            Box::new(move |_: &Master| replicas.into_iter().for_each(Replica::release))
        };
        match &self.journal {
            Some(journal) if durable => {
                journal.append(vec![Change::then(Record::Remove { key }, free)]);
            }
            _ => free(self),
        }
    }

    /// Segment `segment`, if `client` owns it.
    fn owned_segment(&self, client: ClientId, segment: &str) -> MasterResult<Arc<Segment>> {
        let seg = self
            .segments
            .read()
            .get(segment)
            .cloned()
            .ok_or_else(|| MasterError::SegmentNotFound(segment.to_string()))?;
        if seg.client() != client {
            return Err(MasterError::IllegalClient(format!(
                "segment {segment} belongs to client {}",
                seg.client()
            )));
        }
        Ok(seg)
    }

    /// The owner of `segment` reports finished tasks, dropped records and the records its
    /// disk holds; answers its next tasks and how many records were taken.
    pub fn tier_exchange(
        &self,
        client: ClientId,
        segment: &str,
        done: &[TierDone],
        dropped: &[String],
        records: &[DiskRecord],
    ) -> MasterResult<(Vec<TierTask>, u64)> {
        self.check_batch(done.len() + dropped.len() + records.len())?;
        let seg = self.owned_segment(client, segment)?;
        if seg.disk_bytes() == 0 {
            return Err(MasterError::InvalidParams(format!(
                "segment {segment} was mounted without a disk tier"
            )));
        }
        for d in done {
            self.finish(&seg, d);
        }
        if !done.is_empty() {
            self.load_wanted(&seg);
        }
        if !done.is_empty() {
            // Loads finished, or offloads freed room a read from disk may be waiting for.
            self.tiers.loads_done.notify_waiters();
        }
        for key in dropped {
            self.forget_record(&seg, key);
        }
        let mut adopted = 0;
        for r in records {
            adopted += u64::from(self.adopt(&seg, client, r));
        }
        self.tiers
            .counters
            .adopted
            .fetch_add(adopted, Ordering::Relaxed);
        crate::metrics::record_disk_adopted(adopted);
        Ok((self.tiers.take_round(seg.name_arc()), adopted))
    }

    fn finish(&self, seg: &Arc<Segment>, d: &TierDone) {
        let c = &self.tiers.counters;
        let known = self.settle(seg.name_arc(), &d.key, d.id);
        if self.check_key(&d.key).is_err() {
            return;
        }
        let hash = self.hash(&d.key);
        let mut shard = self.lock_shard(self.shard_of(hash));
        let found = shard.find(hash, &d.key);
        let on_seg = |o: &Object| {
            o.replicas
                .as_slice()
                .iter()
                .any(|r| Arc::ptr_eq(&r.segment, seg))
        };
        match d.kind {
            TierTaskKind::Delete => {}
            TierTaskKind::Offload => {
                let ours = found.filter(|&i| {
                    let o = shard.get(i);
                    o.is_offloading() && on_seg(o) && known.is_some()
                });
                let Some(i) = ours else {
                    // Removed (or put again) meanwhile: the record is nobody's.
                    drop(shard);
                    if d.ok {
                        self.queue_delete(seg, &d.key);
                    }
                    return;
                };
                if !d.ok {
                    shard.get_mut(i).set_tier(TierState::Memory);
                    c.offload_failures.fetch_add(1, Ordering::Relaxed);
                    crate::metrics::record_disk_task("offload", "failed");
                    return;
                }
                c.offloads.fetch_add(1, Ordering::Relaxed);
                crate::metrics::record_disk_task("offload", "ok");
                if shard.get(i).tier() == TierState::Copying {
                    // Written through: the memory stays, now with its copy on disk.
                    shard.get_mut(i).set_tier(TierState::Copied);
                    return;
                }
                if shard.get(i).has_lease(self.clock.now_ms()) {
                    drop(shard);
                    self.tiers
                        .deferred
                        .lock()
                        .push((seg.name_arc().clone(), d.key.as_str().into()));
                    return;
                }
                let o = shard.get_mut(i);
                self.to_disk(o, seg);
            }
            TierTaskKind::Load => {
                let ours = found.filter(|&i| {
                    let o = shard.get(i);
                    o.is_loading() && on_seg(o) && known.is_some()
                });
                let Some(i) = ours else {
                    return;
                };
                if d.ok {
                    let o = shard.get_mut(i);
                    o.set_tier(TierState::DiskCopy);
                    c.loads.fetch_add(1, Ordering::Relaxed);
                    crate::metrics::record_disk_task("load", "ok");
                } else {
                    let obj = shard.remove(hash, i);
                    obj.release();
                    c.load_failures.fetch_add(1, Ordering::Relaxed);
                    crate::metrics::record_disk_task("load", "failed");
                }
                drop(shard);
                self.tiers.loads_done.notify_waiters();
            }
        }
    }

    /// An offloaded object's memory goes (after the journal forgot it, on a journaled
    /// master) and it lives on on `seg`'s disk.
    fn to_disk(&self, o: &mut Object, seg: &Arc<Segment>) {
        let durable = o.is_durable();
        let memory = std::mem::replace(
            &mut o.replicas,
            Replicas::One(Replica {
                segment: seg.clone(),
                alloc: DISK_ALLOCATION,
            }),
        );
        o.set_tier(TierState::OnDisk);
        let memory = memory.into_vec();
        match &self.journal {
            Some(journal) if durable => {
                let key = o.key.as_str().to_owned();
                journal.append(vec![Change::then(Record::Remove { key }, move |_| {
                    memory.into_iter().for_each(Replica::release)
                })]);
            }
            _ => memory.into_iter().for_each(Replica::release),
        }
    }

    /// The owner dropped `key`'s record: an object only there is gone; a loaded one is
    /// plain memory again.
    fn forget_record(&self, seg: &Arc<Segment>, key: &str) {
        if self.check_key(key).is_err() {
            return;
        }
        self.tiers.counters.dropped.fetch_add(1, Ordering::Relaxed);
        let hash = self.hash(key);
        let mut shard = self.lock_shard(self.shard_of(hash));
        let Some(i) = shard.find(hash, key) else {
            return;
        };
        let o = shard.get_mut(i);
        let here = Arc::ptr_eq(&o.replicas.as_slice()[0].segment, seg);
        if o.is_on_disk() && here {
            shard.remove(hash, i);
        } else if o.has_disk_copy() && here {
            o.set_tier(TierState::Memory);
        }
    }

    /// Takes a record an owner reports: a key the master does not hold becomes an object
    /// on that disk; one on disk elsewhere (the same disk before a restart) moves here.
    fn adopt(&self, seg: &Arc<Segment>, client: ClientId, r: &DiskRecord) -> bool {
        if self.check_key(&r.key).is_err() || self.check_put(r.length, &Default::default()).is_err()
        {
            return false;
        }
        let hash = self.hash(&r.key);
        let mut shard = self.lock_shard(self.shard_of(hash));
        if let Some(i) = shard.find(hash, &r.key) {
            let o = shard.get_mut(i);
            let elsewhere = !Arc::ptr_eq(&o.replicas.as_slice()[0].segment, seg);
            if o.length != r.length || !(o.is_on_disk() || (o.is_loading() && elsewhere)) {
                return false;
            }
            let here = Replicas::One(Replica {
                segment: seg.clone(),
                alloc: DISK_ALLOCATION,
            });
            let before = std::mem::replace(&mut o.replicas, here);
            if o.is_loading() {
                // Read back by another owner (one that may be gone: this is the same disk
                // after a restart): its load is abandoned, its space reused only after the
                // task timeout, and the readers waiting for it try this disk instead.
                o.set_tier(TierState::OnDisk);
                let release_at = self
                    .clock
                    .now_ms()
                    .saturating_add(self.config.disk_task_timeout_ms);
                let aligned = o.aligned;
                drop(shard);
                self.discarded.lock().push(Discarded {
                    release_at,
                    aligned,
                    replicas: before.into_vec(),
                });
                self.tiers.loads_done.notify_waiters();
            }
            return true;
        }
        let now = self.clock.now_ms();
        let mut obj = Object::new(
            &r.key,
            Replicas::One(Replica {
                segment: seg.clone(),
                alloc: DISK_ALLOCATION,
            }),
            r.length,
            self.units(r.length) << self.align_shift,
            now,
            client,
            &Default::default(),
        );
        obj.set_tier(TierState::OnDisk);
        obj.complete(now, self.config.soft_pin_ttl_ms);
        shard.insert(hash, obj, self);
        true
    }

    /// The tick's share: tasks past their timeout, or whose segment is gone (its owner
    /// died: nothing will report them), are given up, and offloads that waited for a
    /// lease to end are finished. A task of a gone segment must not wait out its timeout:
    /// its bytes count as being freed, which holds eviction back meanwhile.
    pub(crate) fn tier_tick(&self, now: u64) {
        let mounted: std::collections::HashSet<Arc<str>> = self
            .segments
            .read()
            .list
            .iter()
            .map(|s| s.name_arc().clone())
            .collect();
        let expired: Vec<(TaskId, Inflight)> = {
            let mut inflight = self.tiers.inflight.lock();
            let keys: Vec<_> = inflight
                .iter()
                .filter(|((seg, _), t)| t.deadline <= now || !mounted.contains(seg))
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| inflight.remove(&k).map(|t| (k, t)))
                .collect()
        };
        for ((seg_name, key), t) in expired {
            self.tiers
                .offloading_bytes
                .fetch_sub(t.bytes, Ordering::Relaxed);
            self.tiers.counters.timeouts.fetch_add(1, Ordering::Relaxed);
            crate::metrics::record_disk_task(
                if t.kind == TierTaskKind::Load {
                    "load"
                } else {
                    "offload"
                },
                "timeout",
            );
            self.give_up(&seg_name, &key, t.kind);
        }
        let deferred = std::mem::take(&mut *self.tiers.deferred.lock());
        for (seg_name, key) in deferred {
            let hash = self.hash(&key);
            let mut shard = self.lock_shard(self.shard_of(hash));
            let Some(i) = shard.find(hash, &key) else {
                continue;
            };
            let o = shard.get_mut(i);
            let seg = o
                .replicas
                .as_slice()
                .iter()
                .find(|r| *r.segment.name_arc() == seg_name)
                .map(|r| r.segment.clone());
            match seg {
                Some(seg) if o.tier() == TierState::Offloading && !o.has_lease(now) => {
                    self.to_disk(o, &seg)
                }
                Some(_) if o.tier() == TierState::Offloading => {
                    drop(shard);
                    self.tiers.deferred.lock().push((seg_name, key));
                }
                _ => {}
            }
        }
    }

    /// A task its owner never reported: an offload leaves the value in memory, a load is a
    /// miss (its space is reused after one more timeout, should the owner still write).
    fn give_up(&self, seg_name: &Arc<str>, key: &str, kind: TierTaskKind) {
        let hash = self.hash(key);
        let mut shard = self.lock_shard(self.shard_of(hash));
        let Some(i) = shard.find(hash, key) else {
            return;
        };
        let on_seg = shard
            .get(i)
            .replicas
            .as_slice()
            .iter()
            .any(|r| r.segment.name_arc() == seg_name);
        if !on_seg {
            return;
        }
        match kind {
            TierTaskKind::Offload if shard.get(i).is_offloading() => {
                shard.get_mut(i).set_tier(TierState::Memory);
                self.tiers
                    .counters
                    .offload_failures
                    .fetch_add(1, Ordering::Relaxed);
            }
            TierTaskKind::Load if shard.get(i).is_loading() => {
                let obj = shard.remove(hash, i);
                drop(shard);
                self.tiers
                    .counters
                    .load_failures
                    .fetch_add(1, Ordering::Relaxed);
                self.retire_tiered(obj);
                self.tiers.loads_done.notify_waiters();
            }
            _ => {}
        }
    }
}
