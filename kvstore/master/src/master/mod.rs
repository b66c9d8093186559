//! The KV-cache master: pure metadata logic with Mooncake Store semantics, no I/O.
//!
//! # Layout
//! - `config`: [`MasterConfig`], every tunable and its default.
//! - [`MasterError`] (Mooncake's error names and codes, classified once) is the wire's,
//!   `openapi::master`'s: the client decodes the very errors raised here.
//! - `clock`: [`Clock`] and its implementations (tokio-time aware, manual).
//! - each segment's O(1) offset allocator is `transfer::memory::OffsetAllocator`.
//! - `segment`: [`Segment`], the table of mounted segments.
//! - `object`: object metadata and the shard that stores it.
//! - `placement`: choosing segments for replicas (preferred first, then spread).
//! - `ops`: the object lifecycle: put_start / put_end / put_revoke, reads, removes, batches.
//! - `clear`: a client clearing its objects' replicas, on one segment or all.
//! - `clients`: mount / remount / unmount, ping, client TTL.
//! - `evict`: the background tick: zombie puts, client expiry, watermark eviction.
//! - `admin`: read-only views (keys with paging, one object, segments, clients, stats).
//! - `journal`: durable changes and their records, for a master that writes through a
//!   [`Journal`] (the HA master); without one nothing there runs.
//! - `restore`: a master rebuilt from durable records ([`Master::restore`]).
//! - `reserve`: space reserved ahead of puts, so a put can be one commit request.
//! - `tier`: the disk tier: offload on eviction, reads back from disk, the owners' tasks.
//! - `feed`: every change of what is held under a key, in order, for subscribers
//!   ([`Master::events_since`]).
//!
//! # Concurrency
//! Object metadata is split over `config.shards` shards by key hash, each behind its own
//! mutex; segments sit in one read-mostly table; each segment's allocator has its own
//! mutex. Lock order, never reversed: clients -> shard -> reservations -> segment table ->
//! allocator -> discarded list; the feed's ring comes after a shard (it is pushed to while
//! the shard is locked) and nothing is taken under it; the disk tier's own locks come after a shard's (or with none
//! held), never the other way. Nobody holds the segment table while taking a shard lock.

mod admin;
mod clear;
mod clients;
mod clock;
mod config;
mod evict;
mod feed;
mod journal;
mod object;
mod ops;
mod placement;
mod reserve;
mod restore;
mod segment;
mod tier;

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard, RwLock};

pub use admin::{KeyPage, MasterStats, ObjectView};
pub use clients::{ClientStatus, ClientView, PingReply};
pub use clock::{Clock, ManualClock, TokioClock};
pub use config::MasterConfig;
pub use evict::{EvictReport, TickReport};
pub use feed::{MAX_EVENTS_PER_CALL, ObjectEvent, Since};
pub use journal::{
    Apply, Change, Durable, Journal, ObjectRecord, Record, ReplicaRecord, SegmentRecord,
};
pub use object::{ObjectStatus, ReplicaLocation, ReplicateConfig};
pub use openapi::master::{MasterError, MasterResult};
pub use ops::{MAX_PREFERRED, ReplicaSet};
pub use reserve::Reservation;
pub use restore::{Restored, Snapshot};
pub use segment::{Segment, SegmentSpec, SegmentView};
pub use tier::{Described, Lookup, TierStats, with_reader_trace};
pub use uuid::Uuid as ClientId;

use clients::ClientTable;
use object::{Object, Replica, ShardInner};
use segment::SegmentTable;

/// One shard on its own cache line(s), so neighbouring locks do not false-share.
#[repr(align(128))]
#[derive(Debug, Default)]
struct Shard {
    inner: Mutex<ShardInner>,
    /// Object count, readable without the lock (metrics, eviction shares).
    len: AtomicUsize,
    /// Reads of the shard's keys since start, by [`Read`] (counted where its lock is
    /// taken anyway, so a count costs no cache line of its own).
    reads: [AtomicU64; 3],
}

/// Where a complete object lies, for a look that reads nothing ([`Master::held`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// In a segment's memory: a reader copies it at once.
    Memory,
    /// Only on its segment owner's disk tier (or being read back from it): a reader waits
    /// for it to be loaded into memory first.
    Disk,
}

/// How a read (a replica lookup) was answered: the master's read counters.
#[derive(Clone, Copy, Debug)]
enum Read {
    /// From memory.
    Memory = 0,
    /// A value on a disk tier (its owner reads it there, or it is loaded back).
    Disk = 1,
    /// The key is not held.
    Miss = 2,
}

/// Replicas of a taken-over put, kept allocated until the writer can no longer be writing.
#[derive(Debug)]
struct Discarded {
    release_at: u64,
    /// Bytes each replica occupies.
    aligned: u64,
    replicas: Vec<Replica>,
}

/// The KV-cache master. Share it as `Arc<Master>`; every method takes `&self`.
pub struct Master {
    config: MasterConfig,
    clock: Arc<dyn Clock>,
    hasher: foldhash::fast::RandomState,
    shard_mask: usize,
    align_shift: u32,
    shards: Box<[Shard]>,
    segments: RwLock<SegmentTable>,
    clients: Mutex<ClientTable>,
    discarded: Mutex<Vec<Discarded>>,
    reservations: Mutex<reserve::ReservationTable>,
    evict_lock: Mutex<()>,
    need_eviction: AtomicBool,
    /// The last eviction round found nothing to take: until this time (ms; 0: not so),
    /// allocations that fail do not scan again, unless a put completes meanwhile.
    evict_futile_until: AtomicU64,
    evict_cursor: AtomicUsize,
    view_version: u64,
    evicted_objects: AtomicU64,
    evicted_bytes: AtomicU64,
    metadata: crate::metadata::MetadataStore,
    journal: Option<Arc<dyn Journal>>,
    tiers: tier::Tiers,
    feed: Option<feed::Feed>,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master")
            .field("view_version", &self.view_version)
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl Master {
    /// A master on the default clock ([`TokioClock`]).
    pub fn new(config: MasterConfig) -> MasterResult<Self> {
        Self::with_clock(config, Arc::new(TokioClock::new()))
    }

    /// A master reading time from `clock`.
    pub fn with_clock(config: MasterConfig, clock: Arc<dyn Clock>) -> MasterResult<Self> {
        Self::with_journal(config, clock, None)
    }

    /// A master reading time from `clock` that makes its durable changes through `journal`
    /// (see the `journal` module; `None`: the plain in-memory master).
    pub fn with_journal(
        config: MasterConfig,
        clock: Arc<dyn Clock>,
        journal: Option<Arc<dyn Journal>>,
    ) -> MasterResult<Self> {
        config.validate()?;
        let shards = (0..config.shards).map(|_| Shard::default()).collect();
        // A fresh view version per master instance: clients that see it change know the
        // master restarted and must remount.
        let view_version = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            .max(1);
        let feed = (config.events_buffer > 0).then(|| feed::Feed::new(config.events_buffer));
        Ok(Self {
            shard_mask: config.shards - 1,
            align_shift: config.alignment.trailing_zeros(),
            metadata: crate::metadata::MetadataStore::new(
                config.metadata_max_entries,
                config.metadata_max_value_bytes,
            ),
            config,
            clock,
            hasher: foldhash::fast::RandomState::default(),
            shards,
            segments: RwLock::new(SegmentTable::default()),
            clients: Mutex::new(ClientTable::default()),
            discarded: Mutex::new(Vec::new()),
            reservations: Mutex::default(),
            evict_lock: Mutex::new(()),
            need_eviction: AtomicBool::new(false),
            evict_futile_until: AtomicU64::new(0),
            evict_cursor: AtomicUsize::new(0),
            view_version,
            evicted_objects: AtomicU64::new(0),
            evicted_bytes: AtomicU64::new(0),
            journal,
            tiers: tier::Tiers::default(),
            feed,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &MasterConfig {
        &self.config
    }

    /// This master's view version (changes when the master restarts).
    pub fn view_version(&self) -> u64 {
        self.view_version
    }

    /// The Mooncake-compatible transfer-metadata store served at `/metadata`.
    pub fn metadata(&self) -> &crate::metadata::MetadataStore {
        &self.metadata
    }

    /// Current time of the master's clock, in ms.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn hash(&self, key: &str) -> u64 {
        self.hash_bytes(key.as_bytes())
    }

    fn hash_bytes(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Shard of a hash. Bits 40.. are used: hashbrown takes the low bits for the bucket
    /// and the top 7 for its control bytes, so the shard choice does not bias either.
    fn shard_of(&self, hash: u64) -> usize {
        ((hash >> 40) as usize) & self.shard_mask
    }

    /// Counts one read of a key of shard `i`.
    fn tally_read(&self, i: usize, read: Read) {
        self.shards[i].reads[read as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Reads since start by [`Read`], over every shard.
    fn reads(&self) -> [u64; 3] {
        let mut out = [0; 3];
        for s in self.shards.iter() {
            for (o, r) in out.iter_mut().zip(&s.reads) {
                *o += r.load(Ordering::Relaxed);
            }
        }
        out
    }

    fn lock_shard(&self, i: usize) -> ShardGuard<'_> {
        ShardGuard {
            inner: self.shards[i].inner.lock(),
            len: &self.shards[i].len,
            feed: self.feed.as_ref(),
            touched: feed::Touched::default(),
        }
    }

    /// Units (alignment blocks) an object of `length` bytes occupies.
    fn units(&self, length: u64) -> u64 {
        length.div_ceil(self.config.alignment)
    }
}

/// A locked shard that keeps the lock-free length in step and, with a feed, tells it
/// what changed: every way to change an object goes through here ([`Self::get_mut`],
/// [`Self::insert`], [`Self::remove`]), which notes the object's state before, and the
/// unlock reports the ones that changed ([`feed`]).
struct ShardGuard<'a> {
    inner: MutexGuard<'a, ShardInner>,
    len: &'a AtomicUsize,
    feed: Option<&'a feed::Feed>,
    touched: feed::Touched,
}

impl Drop for ShardGuard<'_> {
    fn drop(&mut self) {
        if let Some(feed) = self.feed
            && !self.touched.is_empty()
        {
            // Still under the shard lock: each key's events keep their order.
            feed.push(&self.inner, &mut self.touched);
        }
    }
}

impl ShardGuard<'_> {
    /// The object at `idx`, to change.
    fn get_mut(&mut self, idx: u32) -> &mut Object {
        if self.feed.is_some() {
            let inner = &self.inner;
            self.touched.note(idx, || feed::state_of(inner.get(idx)));
        }
        self.inner.slot_mut(idx)
    }

    fn insert(&mut self, hash: u64, obj: Object, master: &Master) -> u32 {
        let idx = self.inner.insert(hash, obj, |k| master.hash_bytes(k));
        self.len.store(self.inner.len(), Ordering::Relaxed);
        if self.feed.is_some() {
            self.touched.inserted(idx);
        }
        idx
    }

    /// Inserts `obj` unless its key is present (then hands it back).
    fn insert_new(&mut self, hash: u64, obj: Object, master: &Master) -> Result<u32, Box<Object>> {
        let idx = self.inner.insert_new(hash, obj, |k| master.hash_bytes(k))?;
        self.len.store(self.inner.len(), Ordering::Relaxed);
        if self.feed.is_some() {
            self.touched.inserted(idx);
        }
        Ok(idx)
    }

    fn reserve(&mut self, n: usize, master: &Master) {
        self.inner.reserve(n, |k| master.hash_bytes(k));
    }

    fn remove(&mut self, hash: u64, idx: u32) -> Object {
        let obj = self.inner.remove(hash, idx);
        self.len.store(self.inner.len(), Ordering::Relaxed);
        if self.feed.is_some() {
            self.touched.removed(idx, &obj);
        }
        obj
    }
}

impl std::ops::Deref for ShardGuard<'_> {
    type Target = ShardInner;
    fn deref(&self) -> &ShardInner {
        &self.inner
    }
}

impl std::ops::DerefMut for ShardGuard<'_> {
    fn deref_mut(&mut self) -> &mut ShardInner {
        &mut self.inner
    }
}

#[cfg(test)]
mod evict_tests;
#[cfg(test)]
mod feed_tests;
#[cfg(test)]
mod journal_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod reserve_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tier_tests;
