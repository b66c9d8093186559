//! The third tier: prompt pages in the KV master's store. SGLang HiCache's Mooncake
//! backend writes a worker's pages there under their chained page hash
//! ([`sglang::hicache`], the same chain as the KV events' block hashes), and any worker
//! of the deployment can load them instead of computing them. A page there continues
//! every worker's cached prefix alike, so it narrows the lead of the worker that holds the
//! prefix in its GPU cache by what loading costs against computing.
//!
//! The policy looks at the master this process hosts ([`StoreSource`]), in memory: no
//! request, no read lease ([`kvmaster::Master::held`]). Without one answering here (no
//! master hosted, or an HA member that follows), it looks at a [`StoreView`]: the store's
//! keys as the master's object events report them ([`super::follow`]). One object per page
//! says it is there (`--kv-l3-key-format`, K of TP rank 0 by default).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvmaster::{Held, Master};
use openapi::master::{HeldTier, ObjectEvent};
use parking_lot::RwLock;

use sglang::kv_events::hash::{BlockHash, PageDigest, block_hash};

/// Where the policy finds the store's index: the master this process hosts.
pub trait StoreSource: Send + Sync + fmt::Debug {
    /// The master answering now (with HA, only while this process leads).
    fn master(&self) -> Option<Arc<Master>>;

    /// This process's master's role (`alone`, or with HA `leader`, `follower`,
    /// `candidate`) and the leader's URL when one is known (the console shows them).
    fn role(&self) -> (&'static str, Option<String>) {
        ("alone", None)
    }

    /// The view of a followed master's events, looked at while [`Self::master`] is none.
    fn view(&self) -> Option<Arc<StoreView>> {
        None
    }
}

impl StoreSource for Arc<Master> {
    fn master(&self) -> Option<Arc<Master>> {
        Some(self.clone())
    }
}

/// The store object names of pages: `--kv-l3-key-format` split at its `{hash}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFormat {
    before: String,
    after: String,
}

impl KeyFormat {
    /// Reads a format holding `{hash}` (its first one; the config checks there is one).
    pub fn new(format: &str) -> Self {
        let (before, after) = format.split_once("{hash}").unwrap_or((format, ""));
        KeyFormat {
            before: before.to_owned(),
            after: after.to_owned(),
        }
    }

    /// Writes the name of the page whose digest is `digest` into `out` (cleared first).
    pub fn write(&self, digest: &PageDigest, out: &mut String) {
        out.clear();
        out.push_str(&self.before);
        let mut hex = [0u8; 64];
        // 32 bytes always fit 64 hex digits.
        if hex::encode_to_slice(digest, &mut hex).is_ok() {
            out.push_str(std::str::from_utf8(&hex).unwrap_or_default());
        }
        out.push_str(&self.after);
    }

    /// The block hash of the page a key names (the first 16 of its 64 hex digits), or
    /// `None` for a key of another shape (another TP rank's, the V half, not a page).
    pub fn block_hash_of(&self, key: &str) -> Option<BlockHash> {
        let hex = key.strip_prefix(&self.before)?.strip_suffix(&self.after)?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let first = u64::from_str_radix(&hex[..16], 16).ok()?;
        Some(first as BlockHash)
    }
}

/// The store's pages as a master's object events report them, by block hash.
#[derive(Debug, Default)]
pub struct StoreView {
    pages: RwLock<HashMap<BlockHash, Held, foldhash::fast::RandomState>>,
    /// Events applied (snapshot entries included).
    applied: AtomicU64,
    /// Snapshots taken.
    snapshots: AtomicU64,
}

fn held(t: HeldTier) -> Held {
    match t {
        HeldTier::Memory => Held::Memory,
        HeldTier::Disk => Held::Disk,
    }
}

impl StoreView {
    /// Forgets everything and holds the pages of `snapshot` (keys of another shape skipped).
    pub fn replace(&self, keys: &KeyFormat, snapshot: &[ObjectEvent]) {
        let mut fresh = HashMap::with_capacity_and_hasher(snapshot.len(), Default::default());
        for e in snapshot {
            if let (Some(h), Some(t)) = (keys.block_hash_of(&e.key), e.held) {
                fresh.insert(h, held(t));
            }
        }
        *self.pages.write() = fresh;
        self.snapshots.fetch_add(1, Ordering::Relaxed);
        self.applied
            .fetch_add(snapshot.len() as u64, Ordering::Relaxed);
    }

    /// Applies changes, in order.
    pub fn apply(&self, keys: &KeyFormat, events: &[ObjectEvent]) {
        // Parsed before the lock: routing reads the view meanwhile.
        let parsed: Vec<(BlockHash, Option<Held>)> = events
            .iter()
            .filter_map(|e| Some((keys.block_hash_of(&e.key)?, e.held.map(held))))
            .collect();
        let mut pages = self.pages.write();
        for (h, t) in parsed {
            match t {
                Some(t) => pages.insert(h, t),
                None => pages.remove(&h),
            };
        }
        drop(pages);
        self.applied
            .fetch_add(events.len() as u64, Ordering::Relaxed);
    }

    /// Forgets everything (the master followed is gone, or this process leads now).
    pub fn clear(&self) {
        self.pages.write().clear();
    }

    /// Where the page is held, if it is.
    pub fn held(&self, page: BlockHash) -> Option<Held> {
        self.pages.read().get(&page).copied()
    }

    /// Pages in the view.
    pub fn len(&self) -> usize {
        self.pages.read().len()
    }

    /// True when the view holds no page.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Events applied and snapshots taken so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.applied.load(Ordering::Relaxed),
            self.snapshots.load(Ordering::Relaxed),
        )
    }
}

/// Where a probe looks pages up.
#[derive(Clone, Debug)]
pub enum Lookup {
    /// The master this process hosts, by key.
    Master(Arc<Master>),
    /// A followed master's events, by block hash.
    View(Arc<StoreView>),
}

/// One prompt's pages looked up in the store, each at most once, as the candidates ask.
pub struct Probe<'a> {
    lookup: Lookup,
    keys: &'a KeyFormat,
    digests: &'a [PageDigest],
    seen: Vec<Option<Option<Held>>>,
    name: String,
}

/// A run of pages the store holds: how many lie in memory, how many only on a disk tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Run {
    /// Pages in a storage node's memory.
    pub memory: u32,
    /// Pages only on a storage node's disk tier (read back into memory before a load).
    pub disk: u32,
}

impl<'a> Probe<'a> {
    /// A probe of `digests` in the store `lookup` sees, named by `keys`.
    pub fn new(lookup: Lookup, keys: &'a KeyFormat, digests: &'a [PageDigest]) -> Self {
        Probe {
            lookup,
            keys,
            digests,
            seen: vec![None; digests.len()],
            name: String::with_capacity(96),
        }
    }

    /// The pages from page `start` on the store holds, in a row, by tier.
    pub fn run_from(&mut self, start: usize) -> Run {
        let mut run = Run::default();
        for i in start..self.digests.len() {
            let held = match self.seen[i] {
                Some(h) => h,
                None => {
                    let h = match &self.lookup {
                        Lookup::Master(m) => {
                            self.keys.write(&self.digests[i], &mut self.name);
                            m.held(&self.name)
                        }
                        Lookup::View(v) => v.held(block_hash(&self.digests[i])),
                    };
                    self.seen[i] = Some(h);
                    h
                }
            };
            match held {
                Some(Held::Memory) => run.memory += 1,
                Some(Held::Disk) => run.disk += 1,
                None => break,
            }
        }
        run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_format() {
        let d = [0xabu8; 32];
        let mut out = String::from("stale");
        KeyFormat::new("{hash}_0_k").write(&d, &mut out);
        assert_eq!(out, format!("{}_0_k", "ab".repeat(32)));
        KeyFormat::new("mc_llama_{hash}_k").write(&d, &mut out);
        assert_eq!(out, format!("mc_llama_{}_k", "ab".repeat(32)));
    }

    #[test]
    fn keys_name_their_pages_block_hash_and_others_name_none() {
        let d: PageDigest = std::array::from_fn(|i| (i * 37 + 200) as u8);
        let f = KeyFormat::new("mc_{hash}_0_k");
        let mut key = String::new();
        f.write(&d, &mut key);
        assert_eq!(f.block_hash_of(&key), Some(block_hash(&d)));
        assert_eq!(f.block_hash_of(&key.replace("_k", "_v")), None);
        assert_eq!(f.block_hash_of(&key.replace("mc_", "")), None);
        assert_eq!(f.block_hash_of("mc_xyz_0_k"), None);
        assert_eq!(f.block_hash_of(&format!("mc_{}_0_k", "g".repeat(64))), None);
    }

    #[test]
    fn a_view_follows_a_snapshot_then_changes() {
        let f = KeyFormat::new("{hash}_0_k");
        let key = |n: u8| {
            let mut k = String::new();
            f.write(&[n; 32], &mut k);
            k
        };
        let ev = |k: String, t: Option<HeldTier>| ObjectEvent { key: k, held: t };
        let v = StoreView::default();
        v.replace(
            &f,
            &[
                ev(key(1), Some(HeldTier::Memory)),
                ev(key(2), Some(HeldTier::Disk)),
                ev("other".into(), Some(HeldTier::Memory)),
            ],
        );
        assert_eq!(v.len(), 2);
        assert_eq!(v.held(block_hash(&[2; 32])), Some(Held::Disk));
        v.apply(&f, &[ev(key(1), None), ev(key(2), Some(HeldTier::Memory))]);
        assert_eq!(v.held(block_hash(&[1; 32])), None);
        assert_eq!(v.held(block_hash(&[2; 32])), Some(Held::Memory));
        assert_eq!(v.counts(), (5, 1));
        v.replace(&f, &[]);
        assert!(v.is_empty());
    }
}
