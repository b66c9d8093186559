//! Predicted pages: what a worker is about to hold because this gateway just sent it a
//! request. A worker's KV events report a prompt's pages only once its prefill has run,
//! so without this the requests sharing a new prefix that arrive meanwhile see no worker
//! holding it and are spread by load (Dynamo's KV router counts the blocks of its routed,
//! unconfirmed requests for the same reason).
//!
//! Routing a request with known token ids to a worker predicts the prompt's page hashes
//! there ([`Predicted::add`]) until the request ends (the [`Prediction`] handle rides on
//! the request's load guard): by then the worker's events have said whether it holds them
//! (a running request's pages cannot be evicted under it). Counts per page and worker,
//! so requests sharing a prefix predict it together and the last one to end takes it
//! away. Pure bookkeeping: no I/O.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use sglang::kv_events::hash::BlockHash;

use super::index::{MAX_SLOTS, SlotSet};

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Pages predicted per worker slot (see the module doc).
#[derive(Debug, Default)]
pub struct Predicted {
    /// Which slots each page is predicted on.
    slots: Map<BlockHash, SlotSet>,
    /// How many requests in flight predict each page on each slot.
    refs: Map<(BlockHash, u8), u32>,
}

impl Predicted {
    /// The slots `hash` is predicted on.
    #[inline]
    pub fn slots(&self, hash: &BlockHash) -> SlotSet {
        self.slots.get(hash).copied().unwrap_or(0)
    }

    /// Pages predicted (on any slot).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when nothing is predicted.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// One more request in flight on `slot` with these pages.
    pub fn add(&mut self, slot: usize, hashes: &[BlockHash]) {
        let s = (slot % MAX_SLOTS) as u8;
        for h in hashes {
            let n = self.refs.entry((*h, s)).or_insert(0);
            *n += 1;
            if *n == 1 {
                *self.slots.entry(*h).or_insert(0) |= 1 << s;
            }
        }
    }

    /// That request ended (a page no longer counted is forgotten; one already forgotten,
    /// its slot cleared meanwhile, is left alone).
    pub fn release(&mut self, slot: usize, hashes: &[BlockHash]) {
        let s = (slot % MAX_SLOTS) as u8;
        for h in hashes {
            let Some(n) = self.refs.get_mut(&(*h, s)) else {
                continue;
            };
            *n -= 1;
            if *n == 0 {
                self.refs.remove(&(*h, s));
                self.unset(*h, s);
            }
        }
    }

    /// Forgets every prediction on `slot` (its worker is gone or resynced).
    pub fn remove_slot(&mut self, slot: usize) {
        let s = (slot % MAX_SLOTS) as u8;
        let gone: Vec<BlockHash> = self
            .refs
            .keys()
            .filter(|(_, t)| *t == s)
            .map(|(h, _)| *h)
            .collect();
        for h in gone {
            self.refs.remove(&(h, s));
            self.unset(h, s);
        }
    }

    fn unset(&mut self, h: BlockHash, s: u8) {
        if let Some(set) = self.slots.get_mut(&h) {
            *set &= !(1 << s);
            if *set == 0 {
                self.slots.remove(&h);
            }
        }
    }
}

/// One request's prediction; released when dropped (with the request's load guard).
#[derive(Debug)]
pub struct Prediction {
    table: Arc<RwLock<Predicted>>,
    slot: usize,
    hashes: Vec<BlockHash>,
}

impl Prediction {
    /// Predicts `hashes` on `slot` in `table` until the handle drops.
    pub fn new(table: Arc<RwLock<Predicted>>, slot: usize, hashes: Vec<BlockHash>) -> Self {
        table.write().add(slot, &hashes);
        Self {
            table,
            slot,
            hashes,
        }
    }
}

impl Drop for Prediction {
    fn drop(&mut self) {
        self.table.write().release(self.slot, &self.hashes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_sharing_a_prefix_predict_it_until_the_last_ends() {
        let table = Arc::new(RwLock::new(Predicted::default()));
        let a = Prediction::new(table.clone(), 2, vec![1, 2, 3]);
        let b = Prediction::new(table.clone(), 2, vec![1, 2, 9]);
        let c = Prediction::new(table.clone(), 5, vec![1]);
        {
            let t = table.read();
            assert_eq!(t.slots(&1), 1 << 2 | 1 << 5);
            assert_eq!(t.slots(&3), 1 << 2);
            assert_eq!(t.slots(&4), 0);
        }
        drop(a);
        assert_eq!(table.read().slots(&1), 1 << 2 | 1 << 5);
        assert_eq!(table.read().slots(&3), 0);
        drop(c);
        assert_eq!(table.read().slots(&1), 1 << 2);
        // A slot cleared while a request is in flight: its end changes nothing else.
        let d = Prediction::new(table.clone(), 7, vec![1, 2]);
        table.write().remove_slot(2);
        assert_eq!(table.read().slots(&1), 1 << 7);
        drop(b);
        drop(d);
        assert!(table.read().is_empty());
        assert!(table.read().refs.is_empty());
    }
}
