//! Reserved space: replicas allocated ahead of the puts that will fill them, so a client
//! that writes many values of one length puts each with one master request (a commit)
//! instead of two (put-start, then put-end).
//!
//! A client asks for reservations along with a put-start or a commit (`reserve: {length,
//! count}`), holds them, writes a later value of that length straight into one, and
//! commits it under its key: the master turns the reservation into the object and ends its
//! put in the same step (journaled like any put-end, so nothing is readable before it is
//! durable).
//!
//! Rules, so that no byte is written where it does not belong:
//! - A reservation belongs to the client it was made for; any other client committing it
//!   is told it does not exist.
//! - A client uses a reservation only within `use_within_ms` of sending the request that
//!   brought it (a tenth of the master's `reservation_ttl_ms`); the master releases an
//!   unused one after the whole TTL, so a write begun in time has finished long before its
//!   space can be handed out again.
//! - A segment remounted (the client was told to: the master restarted, or the client's
//!   TTL ran out and its segments were unmounted), or restored by a new HA leader
//!   (`crate::master::restore`), takes no new values for `use_within_ms`
//!   (`crate::master::placement`). A put-start's replicas come with the same window
//!   (`write_within_ms`): a client whose answer arrives later writes nothing and revokes.
//!   The master does not know what was reserved in it under
//!   the mount before, while the holders may still write into that space: within one
//!   master their reservations were dropped with the unmount, across a restart they were
//!   never known. Before, a client's write into such a reservation, up to a heartbeat
//!   after the restart, could overwrite a value placed there since.
//! - Ids are unique across master instances (each starts at a random point of a 52-bit
//!   space), so a reservation is committed only at the master that made it: a restarted
//!   master answers another one's ids `RESERVATION_NOT_FOUND` (the client puts the value
//!   the two-request way) even where it has handed out as many ids itself. With ids that
//!   every master counted from 1, a client committing a reservation of the master before
//!   a restart could commit one of the new master's, at a place it never wrote.
//! - A journaled (HA) master reserves nothing. Reservations are not journaled, so a new
//!   leader would hand out as free the space its predecessor reserved, while a client
//!   still writes into it (for up to `use_within_ms`, which outlasts a failover): the bytes
//!   of an acknowledged object would be overwritten. HA puts take two requests; journaling
//!   the reservations a leader grants is what would bring the one-request put back.
//! - A commit whose key exists answers `OBJECT_ALREADY_EXISTS` and frees the reservation;
//!   one whose segment was unmounted answers `RESERVATION_NOT_FOUND`.
//! - Each client holds at most `reservation_max_bytes` of reserved space (`0` turns
//!   reservations off: requests for them are answered with none).

use std::collections::HashMap;

use super::object::{Object, Replica, ReplicaLocation, Replicas, ReplicateConfig};
use super::ops::Claim;
use super::{ClientId, Master, MasterError, MasterResult};

/// Space held for one future object of a fixed length.
#[derive(Debug)]
pub(crate) struct Reserved {
    client: ClientId,
    length: u64,
    /// Pins of the future object.
    soft_pin: bool,
    hard_pin: bool,
    replicas: Vec<Replica>,
    created_ms: u64,
}

impl Reserved {
    fn aligned_total(&self, align_shift: u32, units: u64) -> u64 {
        (units << align_shift) * self.replicas.len() as u64
    }
}

/// Every live reservation, and the bytes each client holds.
#[derive(Debug)]
pub(crate) struct ReservationTable {
    by_id: HashMap<u64, Reserved>,
    held: HashMap<ClientId, u64>,
    /// The last id handed out; starts at a random point (see the module doc).
    next_id: u64,
}

/// Ids stay below 2^53, exact in every JSON reader; a table starts in the lower half.
const ID_START_BITS: u32 = 52;

impl Default for ReservationTable {
    fn default() -> Self {
        Self {
            by_id: HashMap::new(),
            held: HashMap::new(),
            next_id: rand::random::<u64>() >> (64 - ID_START_BITS),
        }
    }
}

/// A reservation handed to a client: its id and where to write.
#[derive(Clone, Debug)]
pub struct Reservation {
    /// Id to commit it with.
    pub id: u64,
    /// Object length it was made for, in bytes.
    pub length: u64,
    /// Where the value goes (every replica).
    pub replicas: Vec<ReplicaLocation>,
}

impl Master {
    /// How long after sending a request a client may still start writing into the space
    /// it answered: a put-start's replicas, a reservation (a tenth of
    /// `reservation_ttl_ms`). Segments this master cannot know the use of (remounted, or
    /// restored by a new HA leader) take no values for as long.
    pub fn use_within_ms(&self) -> u64 {
        self.config.reservation_ttl_ms / 10
    }

    /// Reserves space for up to `count` future objects of `length` bytes, placed as `cfg`
    /// says, for `client`. Best effort: fewer (or none) when the client's share
    /// (`reservation_max_bytes`) or the segments' free space runs out; never evicts.
    pub fn reserve(
        &self,
        client: ClientId,
        length: u64,
        cfg: &ReplicateConfig,
        count: u32,
    ) -> MasterResult<Vec<Reservation>> {
        self.check_put(length, cfg)?;
        if self.journal.is_some() {
            // See the module doc: a new leader could not know what this one reserved.
            return Ok(Vec::new());
        }
        let count = (count as usize).min(self.config.max_batch_items);
        let units = self.units(length);
        let per_object = (units << self.align_shift).saturating_mul(u64::from(cfg.replica_num));
        let cap = self.config.reservation_max_bytes;
        if count == 0 || per_object > cap {
            return Ok(Vec::new());
        }
        // Reservations never take the store past its eviction watermark: reserved space
        // cannot be evicted, and puts must still find room.
        let (capacity, used) = self.segments.read().usage();
        let ceiling = (capacity as f64 * self.config.eviction_high_watermark) as u64;
        let mut room = ceiling.saturating_sub(used);
        let now = self.clock.now_ms();
        let mut out = Vec::with_capacity(count);
        let mut table = self.reservations.lock();
        for _ in 0..count {
            let held = table.held.get(&client).copied().unwrap_or(0);
            if held.saturating_add(per_object) > cap || per_object > room {
                break;
            }
            room -= per_object;
            table.next_id += 1;
            let id = table.next_id;
            // Spread like keys do: the placement start follows the id's hash.
            let Ok(replicas) = self.place(self.hash_bytes(&id.to_le_bytes()), units, cfg) else {
                break;
            };
            let r = Reserved {
                client,
                length,
                soft_pin: cfg.soft_pin,
                hard_pin: cfg.hard_pin,
                replicas,
                created_ms: now,
            };
            *table.held.entry(client).or_default() += r.aligned_total(self.align_shift, units);
            out.push(Reservation {
                id,
                length,
                replicas: r.replicas.iter().map(|x| x.location(length)).collect(),
            });
            table.by_id.insert(id, r);
        }
        Ok(out)
    }

    /// Takes reservation `id` of `client` out of the table (it is the caller's now).
    fn take_reservation(&self, client: ClientId, id: u64) -> Option<Reserved> {
        let mut table = self.reservations.lock();
        if table.by_id.get(&id).is_none_or(|r| r.client != client) {
            return None;
        }
        let r = table.by_id.remove(&id)?;
        let bytes = r.aligned_total(self.align_shift, self.units(r.length));
        release_share(&mut table.held, client, bytes);
        Some(r)
    }

    /// Puts `key` into reservation `id` of `client` and ends the put, in one step: the
    /// object is readable once this returns (and, journaled, once it is durable). The value
    /// must have the reservation's length.
    pub fn put_commit(
        &self,
        client: ClientId,
        key: &str,
        id: u64,
        length: u64,
    ) -> MasterResult<()> {
        self.check_key(key)?;
        let gone = || MasterError::ReservationNotFound(format!("reservation {id} of {key}"));
        let r = self.take_reservation(client, id).ok_or_else(gone)?;
        let now = self.clock.now_ms();
        let expired = now >= r.created_ms.saturating_add(self.config.reservation_ttl_ms);
        if expired || !r.replicas.iter().all(|x| x.segment.is_mounted()) {
            release(r.replicas);
            return Err(gone());
        }
        if length != r.length {
            release(r.replicas);
            return Err(MasterError::InvalidParams(format!(
                "{key} is {length} bytes, its reservation {id} holds {}",
                r.length
            )));
        }
        let hash = self.hash(key);
        let mut shard = self.lock_shard(self.shard_of(hash));
        let refused = match self.claim_key(&shard, hash, key, now, None) {
            Ok(Claim::Free) => None,
            Ok(Claim::Abandoned(i)) => {
                self.take_over(&mut shard, hash, i);
                None
            }
            // Only a put-start is recognised as its own retry (`None` above asks for none).
            Ok(Claim::Again(_)) => Some(MasterError::ObjectAlreadyExists(key.to_string())),
            Err(e) => Some(e),
        };
        if let Some(e) = refused {
            drop(shard);
            release(r.replicas);
            return Err(e);
        }
        let cfg = ReplicateConfig {
            replica_num: r.replicas.len() as u32,
            preferred_segments: Vec::new(),
            soft_pin: r.soft_pin,
            hard_pin: r.hard_pin,
        };
        let aligned = self.units(r.length) << self.align_shift;
        let obj = Object::new(
            key,
            Replicas::from_vec(r.replicas),
            r.length,
            aligned,
            now,
            client,
            &cfg,
        );
        let i = shard.insert(hash, obj, self);
        self.end_found(&mut shard, i, client, key, now)
    }

    /// [`Master::put_commit`] for many `(key, reservation, length)` items.
    pub fn batch_put_commit<K: AsRef<str>>(
        &self,
        client: ClientId,
        items: &[(K, u64, u64)],
    ) -> MasterResult<Vec<MasterResult<()>>> {
        self.batch(items, |(k, id, len)| {
            self.put_commit(client, k.as_ref(), *id, *len)
        })
    }

    /// Releases every reservation past its TTL; returns how many.
    pub(crate) fn release_expired_reservations(&self, now: u64) -> u64 {
        let ttl = self.config.reservation_ttl_ms;
        let due: Vec<Reserved> = {
            let mut table = self.reservations.lock();
            let ids: Vec<u64> = table
                .by_id
                .iter()
                .filter(|(_, r)| now >= r.created_ms.saturating_add(ttl))
                .map(|(id, _)| *id)
                .collect();
            let mut due = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(r) = table.by_id.remove(&id) {
                    let bytes = r.aligned_total(self.align_shift, self.units(r.length));
                    release_share(&mut table.held, r.client, bytes);
                    due.push(r);
                }
            }
            due
        };
        let n = due.len() as u64;
        for r in due {
            release(r.replicas);
        }
        n
    }

    /// Releases every reservation of `client` (it left); returns how many.
    pub fn release_reservations_of(&self, client: ClientId) -> u64 {
        let mine: Vec<Reserved> = {
            let mut table = self.reservations.lock();
            table.held.remove(&client);
            let ids: Vec<u64> = table
                .by_id
                .iter()
                .filter(|(_, r)| r.client == client)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| table.by_id.remove(id)).collect()
        };
        let n = mine.len() as u64;
        for r in mine {
            release(r.replicas);
        }
        n
    }

    /// Live reservations and the bytes they hold (every replica).
    pub fn reserved(&self) -> (usize, u64) {
        let table = self.reservations.lock();
        (table.by_id.len(), table.held.values().sum())
    }
}

/// Lowers `client`'s share by `bytes`, forgetting a client that holds nothing.
fn release_share(held: &mut HashMap<ClientId, u64>, client: ClientId, bytes: u64) {
    if let Some(h) = held.get_mut(&client) {
        *h = h.saturating_sub(bytes);
        if *h == 0 {
            held.remove(&client);
        }
    }
}

fn release(replicas: Vec<Replica>) {
    for r in replicas {
        r.release();
    }
}
