//! The KV index: which worker holds which page, learnt from the workers' KV events. Keyed
//! by SGLang's block hash (a chained hash, so a hash names a whole prefix); each entry is a
//! bit set of worker slots per medium (device, or host / storage). Pure: no I/O, no lock.
//!
//! Matching walks a prompt's page hashes in order and narrows the set of workers still
//! matching, so a worker's depth is the length of its cached prefix in pages; it stops as
//! soon as no candidate matches (usually after a few lookups).

use std::collections::HashMap;

use sglang::kv_events::hash::BlockHash;
use sglang::kv_events::wire::{EventBatch, KvEvent, Medium};

/// Workers one index tracks at most (a worker beyond them is routed by the fallback).
pub const MAX_SLOTS: usize = 64;

/// A bit set of worker slots.
pub type SlotSet = u64;

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    gpu: SlotSet,
    other: SlotSet,
}

/// The index.
#[derive(Debug, Default)]
pub struct KvIndex {
    blocks: HashMap<BlockHash, Entry, foldhash::fast::RandomState>,
    applied: u64,
}

/// How deep each slot matched: `depth[slot]` device pages, `host[slot]` more pages found
/// only in host memory or storage right after them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overlap {
    /// Device pages of the cached prefix, per slot.
    pub depth: Vec<u32>,
    /// Further pages of the prefix held in another medium, per slot.
    pub host: Vec<u32>,
}

fn bit(slot: usize) -> SlotSet {
    1u64 << (slot % MAX_SLOTS)
}

impl KvIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Pages indexed.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// True when nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Events applied so far.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Applies one worker's batch.
    pub fn apply_batch(&mut self, slot: usize, batch: &EventBatch) {
        for e in &batch.events {
            self.apply(slot, e);
        }
    }

    /// Applies one event of the worker in `slot`.
    pub fn apply(&mut self, slot: usize, event: &KvEvent) {
        self.applied += 1;
        let b = bit(slot);
        let medium = event.medium();
        match event {
            KvEvent::BlockStored { block_hashes, .. } => {
                for h in block_hashes {
                    let e = self.blocks.entry(*h).or_default();
                    match medium {
                        Medium::Gpu => e.gpu |= b,
                        Medium::Other => e.other |= b,
                    }
                }
            }
            KvEvent::BlockRemoved { block_hashes, .. } => {
                for h in block_hashes {
                    if let Some(e) = self.blocks.get_mut(h) {
                        match medium {
                            Medium::Gpu => e.gpu &= !b,
                            Medium::Other => e.other &= !b,
                        }
                        if e.gpu == 0 && e.other == 0 {
                            self.blocks.remove(h);
                        }
                    }
                }
            }
            KvEvent::AllBlocksCleared => self.remove_slot(slot),
        }
    }

    /// Forgets everything about `slot` (cleared, resynced, or the worker is gone).
    pub fn remove_slot(&mut self, slot: usize) {
        let b = bit(slot);
        self.blocks.retain(|_, e| {
            e.gpu &= !b;
            e.other &= !b;
            e.gpu != 0 || e.other != 0
        });
    }

    /// How far each slot of `candidates` holds the prefix named by `hashes` (`slots` is
    /// the number of slots in use, the length of the answer's vectors), a page on the
    /// slots `predicted` names counting as a device page there.
    pub fn overlap(
        &self,
        hashes: &[BlockHash],
        candidates: SlotSet,
        slots: usize,
        predicted: impl Fn(&BlockHash) -> SlotSet,
    ) -> Overlap {
        let mut out = Overlap {
            depth: vec![0; slots],
            host: vec![0; slots],
        };
        // Device pages first: a worker leaves the running set at its first missing page.
        let mut active = candidates;
        let mut gpu_end = vec![hashes.len() as u32; slots];
        let mut i = 0;
        while active != 0 && i < hashes.len() {
            let held = self.blocks.get(&hashes[i]).copied().unwrap_or_default();
            let device = held.gpu | predicted(&hashes[i]);
            let dropped = active & !device;
            for_each(dropped, |s| gpu_end[s] = i as u32);
            active &= device;
            i += 1;
        }
        for_each(candidates, |s| {
            if s < slots {
                out.depth[s] = gpu_end[s].min(hashes.len() as u32);
            }
        });
        // Then what continues in another medium.
        for_each(candidates, |s| {
            if s >= slots {
                return;
            }
            let b = bit(s);
            let mut j = out.depth[s] as usize;
            while j < hashes.len() {
                match self.blocks.get(&hashes[j]) {
                    Some(e) if (e.other | e.gpu) & b != 0 => j += 1,
                    _ => break,
                }
            }
            out.host[s] = (j - out.depth[s] as usize) as u32;
        });
        out
    }
}

/// Calls `f` with each slot in `set`.
pub fn for_each(mut set: SlotSet, mut f: impl FnMut(usize)) {
    while set != 0 {
        let s = set.trailing_zeros() as usize;
        f(s);
        set &= set - 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: &[i64], medium: Option<&str>) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: None,
            token_ids: Vec::new(),
            block_size: 4,
            lora_id: None,
            medium: medium.map(str::to_owned),
        }
    }

    #[test]
    fn depths_follow_each_workers_prefix() {
        let mut ix = KvIndex::new();
        ix.apply(0, &stored(&[1, 2, 3], None));
        ix.apply(1, &stored(&[1, 2], Some("GPU")));
        ix.apply(1, &stored(&[3, 4], Some("CPU")));
        ix.apply(2, &stored(&[9], None));
        let o = ix.overlap(&[1, 2, 3, 4], 0b111, 3, |_| 0);
        assert_eq!(o.depth, [3, 2, 0]);
        assert_eq!(o.host, [0, 2, 0]);
        ix.apply(
            0,
            &KvEvent::BlockRemoved {
                block_hashes: vec![2],
                medium: None,
            },
        );
        assert_eq!(ix.overlap(&[1, 2, 3], 0b001, 3, |_| 0).depth, [1, 0, 0]);
        ix.apply(1, &KvEvent::AllBlocksCleared);
        assert_eq!(ix.overlap(&[1, 2, 3, 4], 0b111, 3, |_| 0).depth, [1, 0, 0]);
        ix.remove_slot(0);
        ix.remove_slot(2);
        assert!(ix.is_empty(), "{ix:?}");
        assert_eq!(ix.applied(), 6);
    }

    #[test]
    fn candidates_limit_the_answer() {
        let mut ix = KvIndex::new();
        ix.apply(0, &stored(&[1, 2], None));
        ix.apply(1, &stored(&[1, 2], None));
        assert_eq!(ix.overlap(&[1, 2], 0b10, 2, |_| 0).depth, [0, 2]);
        assert_eq!(ix.overlap(&[], 0b11, 2, |_| 0).depth, [0, 0]);
    }
}
