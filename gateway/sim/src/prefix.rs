//! The simulated worker's prefix cache: a radix tree over KV pages, as SGLang's
//! `RadixCache` with `--page-size` keeps it. Each node is one full page, named by SGLang's
//! chained page hash ([`sglang::kv_events::hash`]), so a path from the root is a cached
//! prefix. The tree holds at most `capacity` pages (the KV pool); a request references
//! (locks) the pages of its prompt until it ends, and a page is evicted only when nothing
//! references it and it has no children, least recently used first. Every change is
//! reported as SGLang's KV events (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`),
//! which the worker publishes. With an L3 tier ([`super::l3`]) the pages to write to the
//! store are kept for it ([`PrefixCache::take_for_store`]: each page computed, or each page
//! evicted, by [`WritePolicy`]), and pages it loaded from there are admitted as cached
//! ([`PrefixCache::admit_pages`]). Pure: no I/O, no clock (recency is a counter).

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use super::config::WritePolicy;
use sglang::kv_events::hash::{self, BlockHash, PageDigest};
use sglang::kv_events::wire::KvEvent;

#[derive(Debug, Clone)]
struct Node {
    digest: PageDigest,
    parent: Option<BlockHash>,
    children: u32,
    refs: u32,
    last_use: u64,
}

/// The cache of one worker.
#[derive(Debug)]
pub struct PrefixCache {
    page_size: usize,
    capacity: usize,
    nodes: HashMap<BlockHash, Node>,
    /// Evictable pages (no references, no children) by last use.
    lru: BTreeSet<(u64, BlockHash)>,
    tick: u64,
    epoch: u64,
    events: Vec<KvEvent>,
    evicted: u64,
    /// Digests of the pages to write to the store since the last
    /// [`PrefixCache::take_for_store`], when they are kept ([`PrefixCache::keep_for_store`]).
    spilled: Option<(WritePolicy, Vec<PageDigest>)>,
}

/// What a prompt found and now holds; give it back with [`PrefixCache::release`].
#[derive(Debug, Default)]
pub struct Admission {
    /// Prompt tokens found in the cache (whole pages).
    pub cached_tokens: u64,
    /// Prompt tokens the worker has to compute.
    pub uncached_tokens: u64,
    /// Of the cached tokens, those in pages loaded from the store.
    pub loaded_tokens: u64,
    held: Vec<BlockHash>,
    epoch: u64,
}

/// Counters for `/sim/prefix` and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PrefixStats {
    /// Tokens per page.
    pub page_size: usize,
    /// Pages the pool holds at most.
    pub capacity_pages: usize,
    /// Pages cached now.
    pub cached_pages: usize,
    /// Pages evicted so far.
    pub evicted_pages: u64,
    /// The L3 tier's counters (`--kv-store`; filled by the worker, not the cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<super::l3::L3Stats>,
}

impl PrefixCache {
    /// An empty cache of `capacity` pages of `page_size` tokens.
    pub fn new(page_size: usize, capacity: usize) -> Self {
        PrefixCache {
            page_size: page_size.max(1),
            capacity,
            nodes: HashMap::new(),
            lru: BTreeSet::new(),
            tick: 0,
            epoch: 0,
            events: Vec::new(),
            evicted: 0,
            spilled: None,
        }
    }

    /// Keeps the digests of the pages `policy` writes to the store (each page computed,
    /// or each page evicted) for [`PrefixCache::take_for_store`].
    pub fn keep_for_store(mut self, policy: WritePolicy) -> Self {
        self.spilled = Some((policy, Vec::new()));
        self
    }

    /// Digests of the pages to write to the store since the last call (none unless kept).
    pub fn take_for_store(&mut self) -> Vec<PageDigest> {
        self.spilled
            .as_mut()
            .map(|(_, d)| std::mem::take(d))
            .unwrap_or_default()
    }

    fn keep(&mut self, when: WritePolicy, digest: PageDigest) {
        if let Some((policy, d)) = self.spilled.as_mut()
            && *policy == when
        {
            d.push(digest);
        }
    }

    /// How many leading pages of `digests` are cached now (nothing is locked).
    pub fn cached_pages(&self, digests: &[PageDigest]) -> usize {
        digests
            .iter()
            .take_while(|d| self.nodes.contains_key(&hash::block_hash(d)))
            .count()
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Looks `tokens` up: locks its cached prefix, stores (and locks) its other full pages
    /// as far as the pool allows, evicting unreferenced pages when it is full.
    pub fn admit(&mut self, tokens: &[u32]) -> Admission {
        let digests = hash::page_digests(tokens, self.page_size);
        self.admit_pages(tokens, &digests, 0..0)
    }

    /// [`PrefixCache::admit`] with the page digests of `tokens` already computed, and
    /// pages `loaded` (indices into `digests`) loaded from the store: those continuing the
    /// cached prefix count as cached too.
    pub fn admit_pages(
        &mut self,
        tokens: &[u32],
        digests: &[PageDigest],
        loaded: Range<usize>,
    ) -> Admission {
        self.tick += 1;
        let hashes: Vec<BlockHash> = digests.iter().map(hash::block_hash).collect();
        let hit = hashes
            .iter()
            .take_while(|h| self.nodes.contains_key(h))
            .count();
        let avail = if loaded.start <= hit {
            loaded.end.clamp(hit, hashes.len())
        } else {
            hit
        };
        let mut held = Vec::with_capacity(hashes.len());
        for h in &hashes[..hit] {
            self.lock(*h);
            held.push(*h);
        }
        let mut stored = Vec::new();
        let mut parent = hit.checked_sub(1).map(|i| hashes[i]);
        let mut from_store = 0;
        for (i, &h) in hashes.iter().enumerate().skip(hit) {
            if self.nodes.len() >= self.capacity && !self.evict_one() {
                break;
            }
            if i < avail {
                from_store += 1;
            } else {
                self.keep(WritePolicy::WriteThrough, digests[i]);
            }
            self.nodes.insert(
                h,
                Node {
                    digest: digests[i],
                    parent,
                    children: 0,
                    refs: 1,
                    last_use: self.tick,
                },
            );
            if let Some(p) = parent.and_then(|p| self.nodes.get_mut(&p)) {
                p.children += 1;
            }
            held.push(h);
            stored.push(h);
            parent = Some(h);
        }
        if !stored.is_empty() {
            let first = hit;
            let ps = self.page_size;
            self.events.push(KvEvent::BlockStored {
                parent_block_hash: first.checked_sub(1).map(|i| hashes[i]),
                token_ids: tokens[first * ps..(first + stored.len()) * ps].to_vec(),
                block_hashes: stored,
                block_size: ps as u32,
                lora_id: None,
                medium: Some("GPU".to_owned()),
            });
        }
        let loaded = (from_store * self.page_size) as u64;
        let cached = (hit * self.page_size) as u64 + loaded;
        Admission {
            cached_tokens: cached,
            uncached_tokens: tokens.len() as u64 - cached,
            loaded_tokens: loaded,
            held,
            epoch: self.epoch,
        }
    }

    /// Drops what `a` holds; its pages become evictable once nothing else holds them.
    pub fn release(&mut self, a: Admission) {
        if a.epoch != self.epoch {
            return;
        }
        self.tick += 1;
        for h in a.held {
            let tick = self.tick;
            if let Some(n) = self.nodes.get_mut(&h) {
                n.refs = n.refs.saturating_sub(1);
                n.last_use = tick;
                if n.refs == 0 && n.children == 0 {
                    self.lru.insert((tick, h));
                }
            }
        }
    }

    /// Drops every page (`/flush_cache`); what requests hold is forgotten with them.
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.lru.clear();
        self.epoch += 1;
        self.events.push(KvEvent::AllBlocksCleared);
    }

    /// The events since the last call, in order.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Counters.
    pub fn stats(&self) -> PrefixStats {
        PrefixStats {
            page_size: self.page_size,
            capacity_pages: self.capacity,
            cached_pages: self.nodes.len(),
            evicted_pages: self.evicted,
            store: None,
        }
    }

    fn lock(&mut self, h: BlockHash) {
        if let Some(n) = self.nodes.get_mut(&h) {
            if n.refs == 0 && n.children == 0 {
                self.lru.remove(&(n.last_use, h));
            }
            n.refs += 1;
        }
    }

    /// Evicts the least recently used evictable page; false when none is.
    fn evict_one(&mut self) -> bool {
        let Some((_, h)) = self.lru.pop_first() else {
            return false;
        };
        let Some(node) = self.nodes.remove(&h) else {
            return false;
        };
        self.evicted += 1;
        self.keep(WritePolicy::WriteBack, node.digest);
        if let Some((p, pn)) = node
            .parent
            .and_then(|p| self.nodes.get_mut(&p).map(|pn| (p, pn)))
        {
            pn.children -= 1;
            if pn.children == 0 && pn.refs == 0 {
                self.lru.insert((pn.last_use, p));
            }
        }
        match self.events.last_mut() {
            Some(KvEvent::BlockRemoved { block_hashes, .. }) => block_hashes.push(h),
            _ => self.events.push(KvEvent::BlockRemoved {
                block_hashes: vec![h],
                medium: Some("GPU".to_owned()),
            }),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    #[test]
    fn second_prompt_hits_the_shared_prefix() {
        let mut c = PrefixCache::new(4, 100);
        let a = c.admit(&toks(0..10));
        assert_eq!((a.cached_tokens, a.uncached_tokens), (0, 10));
        let ev = c.take_events();
        assert!(
            matches!(&ev[..], [KvEvent::BlockStored { block_hashes, parent_block_hash: None, token_ids, .. }]
            if block_hashes == &hash::block_hashes(&toks(0..8), 4) && token_ids == &toks(0..8))
        );
        c.release(a);
        let mut p = toks(0..8);
        p.extend([99, 98, 97, 96, 95]);
        let b = c.admit(&p);
        assert_eq!((b.cached_tokens, b.uncached_tokens), (8, 5));
        let ev = c.take_events();
        assert!(
            matches!(&ev[..], [KvEvent::BlockStored { parent_block_hash: Some(parent), token_ids, .. }]
            if *parent == hash::block_hashes(&toks(0..8), 4)[1] && token_ids == &[99, 98, 97, 96])
        );
    }

    #[test]
    fn eviction_takes_unreferenced_leaves_lru_first() {
        let mut c = PrefixCache::new(2, 4);
        let a = c.admit(&[1, 2, 3, 4]); // pages A1 A2
        c.release(a);
        let b = c.admit(&[5, 6, 7, 8]); // pages B1 B2: full
        c.release(b);
        c.take_events();
        // A is older: its leaf A2 goes first, then A1.
        let d = c.admit(&[9, 10, 11, 12]);
        assert_eq!(d.uncached_tokens, 4);
        let ev = c.take_events();
        let a_hashes = hash::block_hashes(&[1, 2, 3, 4], 2);
        assert!(
            matches!(&ev[0], KvEvent::BlockRemoved { block_hashes, .. } if block_hashes == &[a_hashes[1], a_hashes[0]])
        );
        assert_eq!(c.stats().cached_pages, 4);
        assert_eq!(c.stats().evicted_pages, 2);
        assert_eq!(c.admit(&[5, 6, 7, 8]).cached_tokens, 4, "B survived");
    }

    #[test]
    fn loaded_pages_count_as_cached_and_evicted_ones_are_kept() {
        let mut c = PrefixCache::new(2, 4).keep_for_store(WritePolicy::WriteBack);
        let p = toks(0..8);
        let d = hash::page_digests(&p, 2);
        // Pages 0..3 loaded from the store: cached, stored, but not the last one.
        let a = c.admit_pages(&p, &d, 0..3);
        assert_eq!(
            (a.cached_tokens, a.loaded_tokens, a.uncached_tokens),
            (6, 6, 2)
        );
        assert_eq!(c.cached_pages(&d), 4);
        c.release(a);
        // A loaded range that does not continue the cached prefix does not count.
        let q = toks(100..108);
        let dq = hash::page_digests(&q, 2);
        let b = c.admit_pages(&q, &dq, 1..4);
        assert_eq!((b.cached_tokens, b.loaded_tokens), (0, 0));
        c.release(b);
        let mut gone = c.take_for_store();
        gone.sort_unstable();
        let mut want = d.clone();
        want.sort_unstable();
        assert_eq!(gone, want, "p's pages were evicted for q's, and kept");
        assert!(c.take_for_store().is_empty());
        // Write-through keeps each computed page at once, not the loaded ones.
        let mut wt = PrefixCache::new(2, 4).keep_for_store(WritePolicy::WriteThrough);
        wt.admit_pages(&p, &d, 0..2);
        assert_eq!(wt.take_for_store(), d[2..].to_vec());
        // Without keep_for_store nothing is kept.
        let mut plain = PrefixCache::new(2, 1);
        let a = plain.admit(&[1, 2]);
        plain.release(a);
        plain.admit(&[3, 4]);
        assert_eq!(plain.stats().evicted_pages, 1);
        assert!(plain.take_for_store().is_empty());
    }

    #[test]
    fn held_pages_are_never_evicted() {
        let mut c = PrefixCache::new(2, 2);
        let a = c.admit(&[1, 2, 3, 4]);
        let b = c.admit(&[5, 6, 7, 8]);
        assert_eq!(b.cached_tokens, 0);
        assert_eq!(c.stats().cached_pages, 2, "nothing evictable: B not stored");
        c.release(b);
        c.release(a);
        assert_eq!(c.admit(&[1, 2, 3, 4]).cached_tokens, 4);
        c.clear();
        assert_eq!(c.take_events().last(), Some(&KvEvent::AllBlocksCleared));
        assert_eq!(c.admit(&[1, 2, 3, 4]).cached_tokens, 0);
    }
}
