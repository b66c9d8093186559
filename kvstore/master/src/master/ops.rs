//! The object lifecycle (Mooncake's PutStart / PutEnd / PutRevoke, GetReplicaList,
//! ExistKey, Remove, RemoveAll, RemoveByRegex) and their batch forms.
//!
//! Every operation validates its input before it touches state, so a refused request
//! changes nothing.

use super::journal::{Change, Record};
use super::object::{Object, ReplicaLocation, Replicas, ReplicateConfig};
use super::segment::Segment;
use super::{ClientId, Discarded, Held, Master, MasterError, MasterResult};
use std::sync::Arc;

/// Answer of `get_replicas`: where to read, and for how long the read is protected.
#[derive(Clone, Debug)]
pub struct ReplicaSet {
    /// Object length in bytes.
    pub length: u64,
    /// Read lease granted, in ms from now.
    pub lease_ttl_ms: u64,
    /// Readable replicas (at least one, unless `own_disk` is set).
    pub replicas: Vec<ReplicaLocation>,
    /// The value lies only on the reader's own disk tier, below this segment: the reader
    /// reads it there (`replicas` is empty). Set only for lookups that name their reader
    /// ([`Master::lookup_as`]).
    pub own_disk: Option<Arc<Segment>>,
    /// The value's memory copy is also on disk: the reader should release its read
    /// ([`Master::release_reads`]) once done, so the memory can go before the lease ends.
    pub release: bool,
}

/// Who asks for a key in a put-start, so that a retry of its own is recognised.
#[derive(Clone, Copy, Debug)]
pub(super) struct Put {
    pub(super) client: ClientId,
    pub(super) length: u64,
    pub(super) put_id: u32,
}

/// What a put may do with a key ([`Master::claim_key`]).
#[derive(Debug)]
pub(super) enum Claim {
    /// No object has it.
    Free,
    /// The object at this index is an unfinished put past its discard timeout, to be
    /// taken over ([`Master::take_over`]).
    Abandoned(u32),
    /// The object at this index is the asking put's own, started before (a retry).
    Again(u32),
}

/// Most preferred segments a put may name.
pub const MAX_PREFERRED: usize = 64;

impl Master {
    pub(crate) fn check_key(&self, key: &str) -> MasterResult<()> {
        if key.is_empty() {
            return Err(MasterError::InvalidKey("key is empty".into()));
        }
        if key.len() > self.config.max_key_bytes {
            return Err(MasterError::InvalidKey(format!(
                "key is {} bytes, the limit is {}",
                key.len(),
                self.config.max_key_bytes
            )));
        }
        Ok(())
    }

    pub(crate) fn check_put(&self, length: u64, cfg: &ReplicateConfig) -> MasterResult<()> {
        if length == 0 || length > self.config.max_object_bytes {
            return Err(MasterError::InvalidParams(format!(
                "length {length} is outside 1..={}",
                self.config.max_object_bytes
            )));
        }
        self.check_config(cfg)
    }

    /// Whether `cfg` can be used at this master: `replica_num` within `1..=max_replicas`, at
    /// most [`MAX_PREFERRED`] preferred segments.
    pub fn check_config(&self, cfg: &ReplicateConfig) -> MasterResult<()> {
        if cfg.replica_num == 0 || cfg.replica_num > self.config.max_replicas {
            return Err(MasterError::InvalidParams(format!(
                "replica_num {} is outside 1..={}",
                cfg.replica_num, self.config.max_replicas
            )));
        }
        if cfg.preferred_segments.len() > MAX_PREFERRED {
            return Err(MasterError::InvalidParams(format!(
                "at most {MAX_PREFERRED} preferred segments"
            )));
        }
        Ok(())
    }

    pub(crate) fn check_batch(&self, n: usize) -> MasterResult<()> {
        if n > self.config.max_batch_items {
            return Err(MasterError::InvalidParams(format!(
                "batch of {n} items, the limit is {}",
                self.config.max_batch_items
            )));
        }
        Ok(())
    }

    /// Starts a put: allocates replicas and records the object as PROCESSING (invisible to
    /// readers). A put left unfinished past the discard timeout is taken over; its space
    /// is released at its release timeout. If no segment has room, one eviction round runs
    /// and the allocation is tried once more (not when every segment is held: evicting
    /// would make room in none that takes values).
    pub fn put_start(
        &self,
        client: ClientId,
        key: &str,
        length: u64,
        cfg: &ReplicateConfig,
    ) -> MasterResult<Vec<ReplicaLocation>> {
        self.put_start_with_id(client, key, length, cfg, 0)
    }

    /// [`Master::put_start`] of a put its writer names `put_id` (0: none). When `key` is
    /// still unfinished, started by `client` under the same nonzero id and length, this is
    /// that put-start again (a retry whose answer was lost, e.g. one an HA client sent on
    /// to another master after a timeout): it answers the same replicas, not
    /// `OBJECT_ALREADY_EXISTS`, and allocates nothing.
    pub fn put_start_with_id(
        &self,
        client: ClientId,
        key: &str,
        length: u64,
        cfg: &ReplicateConfig,
        put_id: u32,
    ) -> MasterResult<Vec<ReplicaLocation>> {
        self.check_key(key)?;
        self.check_put(length, cfg)?;
        let hash = self.hash(key);
        let put = Put {
            client,
            length,
            put_id,
        };
        match self.try_put_start(put, key, hash, cfg) {
            // Evicting frees nothing a held segment would take (see `placement`).
            Err(MasterError::NoAvailableHandle(_))
                if self.some_segment_takes_values() && self.evict_for_allocation() =>
            {
                self.try_put_start(put, key, hash, cfg)
            }
            other => other,
        }
    }

    /// The replicas of `client`'s unfinished put of `key` under `put_id` (nonzero) and
    /// `length`, as its put-start answered them, allocating nothing: what a writer asks to
    /// go on writing past its write window. The put's discard and release timeouts count
    /// again from now. `INVALID_WRITE` when there is no such put (ended, revoked,
    /// discarded, another's, or lost in a restart).
    pub fn renew_put(
        &self,
        client: ClientId,
        key: &str,
        length: u64,
        put_id: u32,
    ) -> MasterResult<Vec<ReplicaLocation>> {
        self.check_key(key)?;
        if put_id == 0 {
            return Err(MasterError::InvalidParams(
                "a put is renewed by its nonzero put_id".into(),
            ));
        }
        let hash = self.hash(key);
        let now = self.clock.now_ms();
        let mut shard = self.lock_shard(self.shard_of(hash));
        let put = Put {
            client,
            length,
            put_id,
        };
        match self.claim_key(&shard, hash, key, now, Some(put)) {
            Ok(Claim::Again(i)) => {
                // The writer is alive: its put is neither discarded nor released for as
                // long again as after its start.
                shard.get_mut(i).aux = now;
                let o = shard.get(i);
                let locations = o.replicas.as_slice().iter();
                Ok(locations.map(|r| r.location(o.length)).collect())
            }
            _ => Err(MasterError::InvalidWrite(format!(
                "{key:?}: no unfinished put of this client under put id {put_id} and length \
                 {length} (ended, revoked, discarded or lost in a restart)"
            ))),
        }
    }

    fn try_put_start(
        &self,
        put: Put,
        key: &str,
        hash: u64,
        cfg: &ReplicateConfig,
    ) -> MasterResult<Vec<ReplicaLocation>> {
        let now = self.clock.now_ms();
        let mut shard = self.lock_shard(self.shard_of(hash));
        let zombie = match self.claim_key(&shard, hash, key, now, Some(put))? {
            Claim::Again(i) => {
                let o = shard.get(i);
                let locations = o.replicas.as_slice().iter();
                return Ok(locations.map(|r| r.location(o.length)).collect());
            }
            Claim::Free => None,
            Claim::Abandoned(i) => Some(i),
        };
        let units = self.units(put.length);
        let replicas = self.place(hash, units, cfg)?;
        let locations = replicas.iter().map(|r| r.location(put.length)).collect();
        if let Some(i) = zombie {
            self.take_over(&mut shard, hash, i);
        }
        let mut obj = Object::new(
            key,
            Replicas::from_vec(replicas),
            put.length,
            units << self.align_shift,
            now,
            put.client,
            cfg,
        );
        obj.put_id = put.put_id;
        shard.insert(hash, obj, self);
        Ok(locations)
    }

    /// Whether a new put may have `key` ([`Claim`]), else `ObjectAlreadyExists`. `put`
    /// names the put-start asking, if one is, so that its own retry is recognised.
    pub(super) fn claim_key(
        &self,
        shard: &super::ShardGuard<'_>,
        hash: u64,
        key: &str,
        now: u64,
        put: Option<Put>,
    ) -> MasterResult<Claim> {
        let Some(i) = shard.find(hash, key) else {
            return Ok(Claim::Free);
        };
        let o = shard.get(i);
        if o.is_complete() || o.is_ending() {
            return Err(MasterError::ObjectAlreadyExists(key.to_string()));
        }
        if let Some(p) = put
            && p.put_id != 0
            && p.put_id == o.put_id
            && p.client == o.client
            && p.length == o.length
        {
            return Ok(Claim::Again(i));
        }
        let discard_at = o
            .aux
            .saturating_add(self.config.put_start_discard_timeout_ms);
        if now < discard_at {
            return Err(MasterError::ObjectAlreadyExists(key.to_string()));
        }
        Ok(Claim::Abandoned(i))
    }

    /// Removes the abandoned put at `i`; its space stays allocated until its writer can no
    /// longer be writing (the release timeout after its put-start).
    pub(super) fn take_over(&self, shard: &mut super::ShardGuard<'_>, hash: u64, i: u32) {
        let old = shard.remove(hash, i);
        let release_at = old
            .aux
            .saturating_add(self.config.put_start_release_timeout_ms);
        self.discarded.lock().push(Discarded {
            release_at,
            aligned: old.aligned,
            replicas: old.replicas.into_vec(),
        });
    }

    /// Ends a put: the object becomes readable. Only the client that started it may end
    /// it; ending a completed object again is a no-op.
    pub fn put_end(&self, client: ClientId, key: &str) -> MasterResult<()> {
        self.check_key(key)?;
        let hash = self.hash(key);
        let now = self.clock.now_ms();
        let mut shard = self.lock_shard(self.shard_of(hash));
        let i = shard
            .find(hash, key)
            .ok_or_else(|| MasterError::ObjectNotFound(key.to_string()))?;
        self.end_found(&mut shard, i, client, key, now)
    }

    /// [`Master::put_end`] of the object at `i` of a locked shard.
    pub(super) fn end_found(
        &self,
        shard: &mut super::ShardGuard<'_>,
        i: u32,
        client: ClientId,
        key: &str,
        now: u64,
    ) -> MasterResult<()> {
        let o = shard.get_mut(i);
        if o.client != client {
            return Err(MasterError::IllegalClient(format!(
                "{key} was started by client {}",
                o.client
            )));
        }
        if o.is_complete() {
            return Ok(());
        }
        if let Some(journal) = &self.journal {
            // Durable first: the object turns readable when its record is committed.
            if !o.is_ending() {
                o.set_ending();
                let key = key.to_owned();
                journal.append(vec![Change::then(
                    Record::Put(o.record()),
                    move |m: &Master| m.finish_put_end(client, &key),
                )]);
            }
            return Ok(());
        }
        o.complete(now, self.config.soft_pin_ttl_ms);
        self.copy_on_complete(o);
        shard.processing.remove(&i);
        self.evictable_added();
        Ok(())
    }

    /// A journaled put_end's apply step: the committed object turns readable (unless it
    /// vanished meanwhile, its segment unmounted; that removal is journaled after it).
    fn finish_put_end(&self, client: ClientId, key: &str) {
        let hash = self.hash(key);
        let now = self.clock.now_ms();
        let mut shard = self.lock_shard(self.shard_of(hash));
        if let Some(i) = shard.find(hash, key) {
            let o = shard.get_mut(i);
            if o.client == client && o.is_ending() {
                o.complete(now, self.config.soft_pin_ttl_ms);
                self.copy_on_complete(o);
                shard.processing.remove(&i);
                self.evictable_added();
            }
        }
    }

    /// Lets go of a removed object's space: at once, or for a durable object of a
    /// journaled master once its removal is committed (see `journal`).
    pub(crate) fn retire(&self, obj: Object) {
        if obj.in_tier() {
            return self.retire_tiered(obj);
        }
        match &self.journal {
            Some(journal) if obj.is_durable() => {
                let key = obj.key.as_str().to_owned();
                journal.append(vec![Change::then(Record::Remove { key }, move |_| {
                    obj.release()
                })]);
            }
            _ => obj.release(),
        }
    }

    /// Revokes an unfinished put: its space is freed at once and the key is free again.
    pub fn put_revoke(&self, client: ClientId, key: &str) -> MasterResult<()> {
        self.check_key(key)?;
        let hash = self.hash(key);
        let mut shard = self.lock_shard(self.shard_of(hash));
        let i = shard
            .find(hash, key)
            .ok_or_else(|| MasterError::ObjectNotFound(key.to_string()))?;
        let o = shard.get(i);
        if o.client != client {
            return Err(MasterError::IllegalClient(format!(
                "{key} was started by client {}",
                o.client
            )));
        }
        if o.is_complete() {
            return Err(MasterError::InvalidWrite(format!(
                "{key} is complete; remove it instead"
            )));
        }
        if o.is_ending() {
            return Err(MasterError::InvalidWrite(format!(
                "{key}: its put_end is being made durable"
            )));
        }
        shard.remove(hash, i).release();
        Ok(())
    }

    /// Replicas of a readable object, granting (or extending) a read lease. An object
    /// that lives on disk is not ready yet: this starts reading it back (see
    /// [`Master::lookup`], which says so instead of failing).
    pub fn get_replicas(&self, key: &str) -> MasterResult<ReplicaSet> {
        match self.lookup(key)? {
            super::Lookup::Ready(set) => Ok(set),
            super::Lookup::Loading => Err(MasterError::ReplicaIsNotReady(format!(
                "{key} is being read back from disk"
            ))),
        }
    }

    /// Whether a readable object exists; if so, grants (or extends) a read lease.
    pub fn exists(&self, key: &str) -> MasterResult<bool> {
        self.check_key(key)?;
        let hash = self.hash(key);
        let now = self.clock.now_ms();
        let mut shard = self.lock_shard(self.shard_of(hash));
        let Some(i) = shard.find(hash, key) else {
            return Ok(false);
        };
        let o = shard.get_mut(i);
        let readable = o.is_readable();
        if readable {
            o.grant_lease(now, self.config.lease_ttl_ms);
        }
        Ok(readable)
    }

    /// Whether a readable object exists (in memory or on a disk tier), without granting a
    /// lease or counting a request: a look for routing (a gateway asking which prompt pages
    /// the store holds), not a read. A malformed key is simply absent.
    pub fn readable(&self, key: &str) -> bool {
        self.held(key).is_some()
    }

    /// Where a complete object lies ([`Held`]), without granting a lease or counting a
    /// request (a look for routing); `None` when it is absent, unfinished or on no mounted
    /// segment. A malformed key is simply absent.
    pub fn held(&self, key: &str) -> Option<Held> {
        self.check_key(key).ok()?;
        let hash = self.hash(key);
        let shard = self.lock_shard(self.shard_of(hash));
        let o = shard.get(shard.find(hash, key)?);
        if (o.is_on_disk() || o.is_loading()) && o.is_complete() {
            // `replicas[0]` is the disk's segment.
            o.replicas.as_slice()[0]
                .segment
                .is_mounted()
                .then_some(Held::Disk)
        } else {
            o.is_readable().then_some(Held::Memory)
        }
    }

    /// Removes a readable object. Refused while a read lease is live unless `force`; an
    /// unfinished put is never removed here (it is revoked, or expires).
    pub fn remove(&self, key: &str, force: bool) -> MasterResult<()> {
        self.check_key(key)?;
        let hash = self.hash(key);
        let now = self.clock.now_ms();
        let mut shard = self.lock_shard(self.shard_of(hash));
        let i = shard
            .find(hash, key)
            .ok_or_else(|| MasterError::ObjectNotFound(key.to_string()))?;
        let o = shard.get(i);
        if !o.is_complete() {
            return Err(MasterError::ReplicaIsNotReady(key.to_string()));
        }
        if !force && o.has_lease(now) {
            return Err(MasterError::ObjectHasLease(format!(
                "{key}: lease ends in {} ms",
                o.lease_until - now
            )));
        }
        let obj = shard.remove(hash, i);
        self.retire(obj);
        Ok(())
    }

    /// Removes every complete object without a live lease (pinned ones included); returns
    /// how many went.
    pub fn remove_all(&self) -> u64 {
        self.remove_where(|_| true)
    }

    /// Like [`Master::remove_all`], for keys the regex matches (anywhere in the key).
    pub fn remove_by_regex(&self, pattern: &str) -> MasterResult<u64> {
        if pattern.len() > self.config.max_name_bytes {
            return Err(MasterError::InvalidParams(format!(
                "regex is {} bytes, the limit is {}",
                pattern.len(),
                self.config.max_name_bytes
            )));
        }
        let re = regex::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| MasterError::InvalidParams(format!("invalid regex: {e}")))?;
        Ok(self.remove_where(|k| re.is_match(k)))
    }

    fn remove_where(&self, matches: impl Fn(&str) -> bool) -> u64 {
        let now = self.clock.now_ms();
        let mut removed = 0;
        for s in 0..self.shards.len() {
            let mut shard = self.lock_shard(s);
            let doomed: Vec<u32> = shard
                .indices()
                .filter(|&i| {
                    let o = shard.get(i);
                    o.is_complete() && !o.has_lease(now) && matches(o.key.as_str())
                })
                .collect();
            for i in doomed {
                let hash = self.hash_bytes(shard.get(i).key.as_bytes());
                let obj = shard.remove(hash, i);
                self.retire(obj);
                removed += 1;
            }
        }
        removed
    }

    /// Runs `op` on every item after checking the batch size; results in request order.
    pub(crate) fn batch<I, T>(
        &self,
        items: &[I],
        op: impl Fn(&I) -> MasterResult<T>,
    ) -> MasterResult<Vec<MasterResult<T>>> {
        self.check_batch(items.len())?;
        Ok(items.iter().map(op).collect())
    }

    /// [`Master::put_start_with_id`] for many keys with one config and put id (a config
    /// that cannot be used fails the whole request, even one without items).
    pub fn batch_put_start<K: AsRef<str>>(
        &self,
        client: ClientId,
        items: &[(K, u64)],
        cfg: &ReplicateConfig,
        put_id: u32,
    ) -> MasterResult<Vec<MasterResult<Vec<ReplicaLocation>>>> {
        self.check_config(cfg)?;
        self.batch(items, |(k, len)| {
            self.put_start_with_id(client, k.as_ref(), *len, cfg, put_id)
        })
    }

    /// [`Master::renew_put`] for many keys under one put id.
    pub fn batch_renew_put<K: AsRef<str>>(
        &self,
        client: ClientId,
        items: &[(K, u64)],
        put_id: u32,
    ) -> MasterResult<Vec<MasterResult<Vec<ReplicaLocation>>>> {
        self.batch(items, |(k, len)| {
            self.renew_put(client, k.as_ref(), *len, put_id)
        })
    }

    /// [`Master::put_end`] for many keys.
    pub fn batch_put_end<K: AsRef<str>>(
        &self,
        client: ClientId,
        keys: &[K],
    ) -> MasterResult<Vec<MasterResult<()>>> {
        self.batch(keys, |k| self.put_end(client, k.as_ref()))
    }

    /// [`Master::put_revoke`] for many keys.
    pub fn batch_put_revoke<K: AsRef<str>>(
        &self,
        client: ClientId,
        keys: &[K],
    ) -> MasterResult<Vec<MasterResult<()>>> {
        self.batch(keys, |k| self.put_revoke(client, k.as_ref()))
    }

    /// [`Master::get_replicas`] for many keys.
    pub fn batch_get_replicas<K: AsRef<str>>(
        &self,
        keys: &[K],
    ) -> MasterResult<Vec<MasterResult<ReplicaSet>>> {
        self.batch(keys, |k| self.get_replicas(k.as_ref()))
    }

    /// [`Master::lookup_as`] for many keys.
    pub fn batch_lookup<K: AsRef<str>>(
        &self,
        keys: &[K],
        reader: Option<ClientId>,
    ) -> MasterResult<Vec<MasterResult<super::Lookup>>> {
        self.batch(keys, |k| self.lookup_as(k.as_ref(), reader))
    }

    /// [`Master::exists`] for many keys.
    pub fn batch_exists<K: AsRef<str>>(&self, keys: &[K]) -> MasterResult<Vec<MasterResult<bool>>> {
        self.batch(keys, |k| self.exists(k.as_ref()))
    }

    /// [`Master::remove`] for many keys.
    pub fn batch_remove<K: AsRef<str>>(
        &self,
        keys: &[K],
        force: bool,
    ) -> MasterResult<Vec<MasterResult<()>>> {
        self.batch(keys, |k| self.remove(k.as_ref(), force))
    }
}
