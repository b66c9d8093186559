//! The third tier: prompt pages in the KV master's store. SGLang HiCache's Mooncake
//! backend writes a worker's pages there under their chained page hash
//! ([`sglang::hicache`], the same chain as the KV events' block hashes), and any worker
//! of the deployment can load them instead of computing them. A page there continues
//! every worker's cached prefix alike, so it narrows the lead of the worker that holds the
//! prefix in its GPU cache by what loading costs against computing.
//!
//! The policy looks at the master this process hosts ([`StoreSource`]), in memory: no
//! request, no read lease ([`kvmaster::Master::readable`]). One object per page says it
//! is there (`--kv-l3-key-format`, K of TP rank 0 by default).

use std::fmt;
use std::sync::Arc;

use kvmaster::{Held, Master};

use sglang::kv_events::hash::PageDigest;

/// Where the policy finds the store's index: the master this process hosts.
pub trait StoreSource: Send + Sync + fmt::Debug {
    /// The master answering now (with HA, only while this process leads).
    fn master(&self) -> Option<Arc<Master>>;

    /// This process's master's role (`alone`, or with HA `leader`, `follower`,
    /// `candidate`) and the leader's URL when one is known (the console shows them).
    fn role(&self) -> (&'static str, Option<String>) {
        ("alone", None)
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
}

/// One prompt's pages looked up in the store, each at most once, as the candidates ask.
pub struct Probe<'a> {
    master: Arc<Master>,
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
    /// A probe of `digests` in `master`'s store, named by `keys`.
    pub fn new(master: Arc<Master>, keys: &'a KeyFormat, digests: &'a [PageDigest]) -> Self {
        Probe {
            master,
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
                    self.keys.write(&self.digests[i], &mut self.name);
                    let h = self.master.held(&self.name);
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
}
