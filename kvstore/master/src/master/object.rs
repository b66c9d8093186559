//! Object metadata and the shard that stores it.
//!
//! A shard keeps its objects in a slab (`Vec<Option<Object>>` with a free list, so indices
//! are stable) and indexes them with a `hashbrown::HashTable<u32>` of slab indices: the
//! table costs ~5 bytes per slot instead of a whole object, which is what keeps metadata
//! under ~200 bytes per key. Unfinished puts are also listed in `processing` so the
//! zombie sweep does not scan every object.

use std::collections::HashSet;
use std::sync::Arc;

use hashbrown::HashTable;
use uuid::Uuid;

use super::segment::Segment;
pub use openapi::master::ReplicateConfig;
use transfer::memory::Allocation;

/// Where one replica lives: what a client needs to read or write it with `transfer`.
#[derive(Clone, Debug)]
pub struct ReplicaLocation {
    /// The segment holding it (name, endpoint, owner).
    pub segment: Arc<Segment>,
    /// Address of the first byte in the owner's memory.
    pub address: u64,
    /// Object length in bytes.
    pub length: u64,
}

/// Where an object's value lives, for the disk tier (see `tier`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum TierState {
    /// In memory replicas only.
    Memory = 0,
    /// In memory, evicted: being written to disk, then the memory goes. Still readable.
    Offloading = 1,
    /// On disk only, on `replicas[0]`'s segment's owner; that replica's allocation is
    /// [`DISK_ALLOCATION`], never released.
    OnDisk = 2,
    /// Being read from disk into `replicas[0]` (space on the disk's segment); not readable
    /// until its owner reports it done.
    Loading = 3,
    /// Read back from disk into `replicas[0]`, whose owner still holds the record. Not
    /// journaled (the owners report their records to every new master).
    DiskCopy = 4,
    /// Written through: in memory (journaled), its copy on disk being written.
    Copying = 5,
    /// Written through: in memory (journaled) with a durable copy on disk.
    Copied = 6,
}

impl TierState {
    const ALL: [TierState; 16] = {
        use TierState::*;
        [
            Memory, Offloading, OnDisk, Loading, DiskCopy, Copying, Copied, Memory, Memory, Memory,
            Memory, Memory, Memory, Memory, Memory, Memory,
        ]
    };

    /// Whether an object in this state is in the journal (its memory replicas are).
    fn journaled(self) -> bool {
        matches!(
            self,
            TierState::Memory | TierState::Offloading | TierState::Copying | TierState::Copied
        )
    }
}

/// Lifecycle state of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectStatus {
    /// `put_start` done, `put_end` not yet: invisible to readers.
    Processing,
    /// Readable.
    Complete,
}

/// One allocated replica.
#[derive(Debug)]
pub(crate) struct Replica {
    pub(crate) segment: Arc<Segment>,
    pub(crate) alloc: Allocation,
}

impl Replica {
    pub(crate) fn location(&self, length: u64) -> ReplicaLocation {
        ReplicaLocation {
            segment: self.segment.clone(),
            address: self.segment.address_of(self.alloc),
            length,
        }
    }

    pub(crate) fn release(self) {
        self.segment.release(self.alloc);
    }
}

/// Replicas of one object; one inline (the common case), more on the heap.
#[derive(Debug)]
pub(crate) enum Replicas {
    One(Replica),
    Many(Box<[Replica]>),
}

impl Replicas {
    pub(crate) fn from_vec(mut v: Vec<Replica>) -> Self {
        if v.len() == 1 {
            Self::One(v.pop().expect("one replica"))
        } else {
            Self::Many(v.into_boxed_slice())
        }
    }

    pub(crate) fn as_slice(&self) -> &[Replica] {
        match self {
            Self::One(r) => std::slice::from_ref(r),
            Self::Many(v) => v,
        }
    }

    pub(crate) fn into_vec(self) -> Vec<Replica> {
        match self {
            Self::One(r) => vec![r],
            Self::Many(v) => v.into_vec(),
        }
    }
}

/// Keys up to this many bytes live inside the object (no extra allocation, and the key
/// compare of a lookup touches the object's own cache lines, not a separate heap block).
const INLINE_KEY: usize = 64;

/// An object's key: inline when short (SGLang page keys are 64 hex characters).
#[derive(Debug)]
pub(crate) enum Key {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<str>),
}

impl Key {
    pub(crate) fn new(key: &str) -> Self {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key.as_bytes());
            Self::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            Self::Heap(key.into())
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..*len as usize],
            Self::Heap(s) => s.as_bytes(),
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            // Built from a &str, so always UTF-8.
            Self::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            Self::Heap(s) => s,
        }
    }
}

const COMPLETE: u8 = 1;
const SOFT_PIN: u8 = 2;
const HARD_PIN: u8 = 4;
/// Journaled masters: `put_end` is appended and waits for its commit (still unreadable).
const ENDING: u8 = 8;
/// Bits 4..8: the object's [`TierState`] (the disk tier, see `tier`), as a number.
const TIER_SHIFT: u8 = 4;
const TIER: u8 = 0xf0;

/// The allocation of a replica that lives on disk (no segment space).
pub(crate) const DISK_ALLOCATION: Allocation = Allocation {
    offset: 0,
    node: u32::MAX,
};

/// Metadata of one object.
#[derive(Debug)]
pub(crate) struct Object {
    pub(crate) key: Key,
    pub(crate) replicas: Replicas,
    pub(crate) length: u64,
    /// Bytes one replica occupies (length rounded up to the alignment).
    pub(crate) aligned: u64,
    /// Read lease end (ms); no lease when `now >= lease_until`.
    pub(crate) lease_until: u64,
    /// While processing: when `put_start` ran. Once complete: soft-pin end (0 = none).
    pub(crate) aux: u64,
    pub(crate) client: Uuid,
    /// While processing: the writer's id for the put (0: none), so that a retried
    /// put-start is recognised (`Master::put_start_with_id`). Sits in the padding after
    /// `flags`: it costs no memory.
    pub(crate) put_id: u32,
    flags: u8,
}

impl Object {
    pub(crate) fn new(
        key: &str,
        replicas: Replicas,
        length: u64,
        aligned: u64,
        now: u64,
        client: Uuid,
        cfg: &ReplicateConfig,
    ) -> Self {
        let mut flags = 0;
        if cfg.soft_pin {
            flags |= SOFT_PIN;
        }
        if cfg.hard_pin {
            flags |= HARD_PIN;
        }
        Self {
            key: Key::new(key),
            replicas,
            length,
            aligned,
            lease_until: 0,
            aux: now,
            client,
            put_id: 0,
            flags,
        }
    }

    pub(crate) fn status(&self) -> ObjectStatus {
        if self.flags & COMPLETE != 0 {
            ObjectStatus::Complete
        } else {
            ObjectStatus::Processing
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.flags & COMPLETE != 0
    }

    /// Complete, with at least one replica on a mounted segment: what a reader can get.
    pub(crate) fn is_readable(&self) -> bool {
        self.is_complete()
            && !self.is_loading()
            && self
                .replicas
                .as_slice()
                .iter()
                .any(|r| r.segment.is_mounted())
    }

    /// Marks the object readable at `now`, starting its soft pin if it asked for one.
    pub(crate) fn complete(&mut self, now: u64, soft_pin_ttl: u64) {
        self.flags = (self.flags | COMPLETE) & !ENDING;
        self.lease_until = now;
        self.aux = if self.flags & SOFT_PIN != 0 {
            now.saturating_add(soft_pin_ttl)
        } else {
            0
        };
    }

    /// Whether a journaled `put_end` is waiting for its commit.
    pub(crate) fn is_ending(&self) -> bool {
        self.flags & ENDING != 0
    }

    pub(crate) fn set_ending(&mut self) {
        self.flags |= ENDING;
    }

    /// Whether a journaled master made this object durable (or is making it): its space
    /// may only be reused once its removal is committed.
    pub(crate) fn is_durable(&self) -> bool {
        self.flags & (COMPLETE | ENDING) != 0 && self.tier().journaled()
    }

    /// Where the value lives (see [`TierState`]).
    pub(crate) fn tier(&self) -> TierState {
        TierState::ALL[usize::from((self.flags & TIER) >> TIER_SHIFT)]
    }

    /// Whether the object is anywhere but plain memory.
    pub(crate) fn in_tier(&self) -> bool {
        self.tier() != TierState::Memory
    }

    pub(crate) fn is_offloading(&self) -> bool {
        matches!(self.tier(), TierState::Offloading | TierState::Copying)
    }

    pub(crate) fn is_on_disk(&self) -> bool {
        self.tier() == TierState::OnDisk
    }

    pub(crate) fn is_loading(&self) -> bool {
        self.tier() == TierState::Loading
    }

    /// In memory with a durable copy on disk: eviction drops the memory, writing nothing.
    pub(crate) fn has_disk_copy(&self) -> bool {
        matches!(self.tier(), TierState::DiskCopy | TierState::Copied)
    }

    pub(crate) fn set_tier(&mut self, state: TierState) {
        self.flags = (self.flags & !TIER) | ((state as u8) << TIER_SHIFT);
    }

    /// The durable form of this object.
    pub(crate) fn record(&self) -> super::journal::ObjectRecord {
        super::journal::ObjectRecord {
            key: self.key.as_str().to_owned(),
            length: self.length,
            client: self.client,
            soft_pin: self.flags & SOFT_PIN != 0,
            hard_pin: self.flags & HARD_PIN != 0,
            replicas: self
                .replicas
                .as_slice()
                .iter()
                .map(|r| super::journal::ReplicaRecord {
                    segment: r.segment.name().to_owned(),
                    mount: r.segment.mount_id(),
                    offset: r.alloc.offset,
                })
                .collect(),
        }
    }

    pub(crate) fn put_started_at(&self) -> u64 {
        if self.is_complete() { 0 } else { self.aux }
    }

    pub(crate) fn has_lease(&self, now: u64) -> bool {
        now < self.lease_until
    }

    pub(crate) fn grant_lease(&mut self, now: u64, ttl: u64) {
        self.lease_until = self.lease_until.max(now.saturating_add(ttl));
    }

    pub(crate) fn is_soft_pinned(&self, now: u64) -> bool {
        self.flags & SOFT_PIN != 0 && self.is_complete() && now < self.aux
    }

    pub(crate) fn is_hard_pinned(&self) -> bool {
        self.flags & HARD_PIN != 0
    }

    /// Bytes of segment space the object holds.
    pub(crate) fn footprint(&self) -> u64 {
        if self.is_on_disk() {
            return 0;
        }
        self.aligned * self.replicas.as_slice().len() as u64
    }

    /// Locations of replicas on segments still mounted.
    pub(crate) fn locations(&self) -> Vec<ReplicaLocation> {
        if self.is_on_disk() || self.is_loading() {
            return Vec::new();
        }
        self.replicas
            .as_slice()
            .iter()
            .filter(|r| r.segment.is_mounted())
            .map(|r| r.location(self.length))
            .collect()
    }

    /// Frees every replica's space (a disk-only object holds none).
    pub(crate) fn release(self) {
        if self.is_on_disk() {
            return;
        }
        for r in self.replicas.into_vec() {
            r.release();
        }
    }
}

/// Objects of one shard; see the module doc. Callers hold the shard lock.
#[derive(Debug, Default)]
pub(crate) struct ShardInner {
    slots: Vec<Option<Object>>,
    spare: Vec<u32>,
    table: HashTable<u32>,
    pub(crate) processing: HashSet<u32, foldhash::fast::RandomState>,
}

impl ShardInner {
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn find(&self, hash: u64, key: &str) -> Option<u32> {
        let slots = &self.slots;
        self.table
            .find(hash, |&i| {
                slots[i as usize]
                    .as_ref()
                    .is_some_and(|o| o.key.as_bytes() == key.as_bytes())
            })
            .copied()
    }

    pub(crate) fn get(&self, idx: u32) -> &Object {
        self.slots[idx as usize].as_ref().expect("live slot")
    }

    /// The object at `idx`, if the slot is live.
    pub(crate) fn try_get(&self, idx: u32) -> Option<&Object> {
        self.slots.get(idx as usize)?.as_ref()
    }

    /// Not through a shard guard: the feed would not see the change (see
    /// `ShardGuard::get_mut`).
    pub(crate) fn slot_mut(&mut self, idx: u32) -> &mut Object {
        self.slots[idx as usize].as_mut().expect("live slot")
    }

    /// Inserts an object whose key is not present; `hash_of` rehashes keys on growth.
    pub(crate) fn insert(&mut self, hash: u64, obj: Object, hash_of: impl Fn(&[u8]) -> u64) -> u32 {
        match self.insert_new(hash, obj, hash_of) {
            Ok(idx) => idx,
            Err(_) => unreachable!("insert of a key present"),
        }
    }

    /// Inserts `obj` unless its key is present (then hands it back): one probe of the
    /// table for both the look and the insert.
    pub(crate) fn insert_new(
        &mut self,
        hash: u64,
        obj: Object,
        hash_of: impl Fn(&[u8]) -> u64,
    ) -> Result<u32, Box<Object>> {
        let slots = &self.slots;
        let live = |i: u32| slots[i as usize].as_ref().expect("live slot");
        let entry = self.table.entry(
            hash,
            |&i| live(i).key.as_bytes() == obj.key.as_bytes(),
            |&i| hash_of(live(i).key.as_bytes()),
        );
        let hashbrown::hash_table::Entry::Vacant(vacant) = entry else {
            return Err(Box::new(obj));
        };
        let processing = !obj.is_complete();
        let idx = match self.spare.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(obj);
                i
            }
            None => {
                if self.slots.len() == self.slots.capacity() {
                    // Grow by a quarter, not double: bounds slack memory per key.
                    let extra = (self.slots.len() / 4).max(64);
                    self.slots.reserve_exact(extra);
                }
                self.slots.push(Some(obj));
                (self.slots.len() - 1) as u32
            }
        };
        vacant.insert(idx);
        if processing {
            self.processing.insert(idx);
        }
        Ok(idx)
    }

    /// Makes room for `n` more objects at once (a restore knows its count; growing a
    /// quarter at a time would copy the slots over and over).
    pub(crate) fn reserve(&mut self, n: usize, hash_of: impl Fn(&[u8]) -> u64) {
        self.slots.reserve_exact(n.saturating_sub(self.spare.len()));
        let slots = &self.slots;
        self.table.reserve(n, |&i| {
            hash_of(
                slots[i as usize]
                    .as_ref()
                    .expect("live slot")
                    .key
                    .as_bytes(),
            )
        });
    }

    /// Removes the object at `idx` (whose key hashes to `hash`) and returns it.
    pub(crate) fn remove(&mut self, hash: u64, idx: u32) -> Object {
        if let Ok(entry) = self.table.find_entry(hash, |&i| i == idx) {
            entry.remove();
        }
        self.processing.remove(&idx);
        self.spare.push(idx);
        self.slots[idx as usize].take().expect("live slot")
    }

    /// Indices of live objects.
    pub(crate) fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.table.iter().copied()
    }

    /// Heap bytes held by the shard's containers (not the objects' own heap data).
    pub(crate) fn container_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Option<Object>>()
            + self.spare.capacity() * 4
            + self.table.allocation_size()
            + self.processing.capacity() * 5
    }
}
