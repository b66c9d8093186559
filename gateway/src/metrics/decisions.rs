//! Routing decisions counted since the process started: one relaxed atomic per label,
//! read by `/cluster` (the console) and written to `/metrics` as the
//! `moongate_gateway_{cache_aware,kv_aware,sticky}_decisions_total`, `..._pd_paths_total`
//! and `kv_aware`'s token counters (prompt tokens, cached tokens by tier) when it is
//! scraped. One count, two readers: the
//! Prometheus recorder's counters cannot be read back, so these are the counts and the
//! recorder is told their values at each rendering.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use openapi::console::PolicyTally;

use crate::outcome::{Decision, KvDecision, PdPath, StickyDecision, Tiers};

static CACHE_AWARE: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static KV_AWARE: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
static STICKY: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static PD_PATHS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
/// `kv_aware`'s prompt tokens routed on events, then those the chosen workers held, by
/// tier in [`Tiers::labelled`]'s order.
static KV_TOKENS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// Records one `cache_aware` decision.
#[inline]
pub fn cache_aware_decision(d: Decision) {
    CACHE_AWARE[d as usize].fetch_add(1, Ordering::Relaxed);
}

/// Records one `kv_aware` decision.
#[inline]
pub fn kv_aware_decision(d: KvDecision) {
    KV_AWARE[d as usize].fetch_add(1, Ordering::Relaxed);
}

/// Records the prompt tokens of a request `kv_aware` routed on events, and what the
/// chosen worker held of them, by tier.
#[inline]
pub fn kv_aware_tokens(prompt: u64, tiers: &Tiers) {
    KV_TOKENS[0].fetch_add(prompt, Ordering::Relaxed);
    for (c, (_, n)) in KV_TOKENS[1..].iter().zip(tiers.labelled()) {
        if n > 0 {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// `kv_aware`'s prompt tokens routed on events since the process started, and what the
/// chosen workers held of them by tier (a bench subtracts two readings).
pub fn kv_aware_token_counts() -> (u64, Tiers) {
    let n = |i: usize| KV_TOKENS[i].load(Ordering::Relaxed);
    let tiers = Tiers {
        device: n(1),
        host: n(2),
        store: n(3),
        store_disk: n(4),
        estimated: n(5),
    };
    (n(0), tiers)
}

/// `kv_aware`'s prompt tokens routed on events, and the cached ones by tier label.
fn kv_tokens() -> (u64, [(&'static str, u64); 5]) {
    let (prompt, tiers) = kv_aware_token_counts();
    (prompt, tiers.labelled())
}

/// Records one `manual` (sticky session) decision.
#[inline]
pub fn sticky_decision(d: StickyDecision) {
    STICKY[d as usize].fetch_add(1, Ordering::Relaxed);
}

/// Records what the PD router did with one request (disaggregated or decode alone).
#[inline]
pub fn pd_path(p: PdPath) {
    PD_PATHS[p as usize].fetch_add(1, Ordering::Relaxed);
}

/// A family of decisions: the console's name for it, its Prometheus counter and label,
/// its counts and their labels, in the same order.
struct Family {
    policy: &'static str,
    metric: &'static str,
    label: &'static str,
    counts: &'static [AtomicU64],
    labels: Vec<&'static str>,
}

impl Family {
    fn counts(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

/// Every family, in the console's order.
fn families() -> [Family; 4] {
    [
        Family {
            policy: "cache_aware",
            metric: "moongate_gateway_cache_aware_decisions_total",
            label: "decision",
            counts: &CACHE_AWARE,
            labels: Decision::ALL.map(Decision::as_str).to_vec(),
        },
        Family {
            policy: "kv_aware",
            metric: "moongate_gateway_kv_aware_decisions_total",
            label: "decision",
            counts: &KV_AWARE,
            labels: KvDecision::ALL.map(KvDecision::as_str).to_vec(),
        },
        Family {
            policy: "manual",
            metric: "moongate_gateway_sticky_decisions_total",
            label: "decision",
            counts: &STICKY,
            labels: StickyDecision::ALL.map(StickyDecision::as_str).to_vec(),
        },
        Family {
            policy: "pd",
            metric: "moongate_gateway_pd_paths_total",
            label: "path",
            counts: &PD_PATHS,
            labels: PdPath::ALL.map(PdPath::as_str).to_vec(),
        },
    ]
}

/// Every family's counts now (`in_use` is left false: the caller knows the policies in
/// force). Hit rates: `cache_aware`'s and `manual`'s hits over their decisions,
/// `kv_aware`'s cached prompt tokens (every tier) over its prompt tokens; `pd` has none.
pub fn tallies() -> Vec<PolicyTally> {
    let (prompt, by_tier) = kv_tokens();
    families()
        .into_iter()
        .map(|f| {
            let counts = f.counts();
            let all: u64 = counts.iter().sum();
            let (hits, of) = match f.policy {
                "cache_aware" => (counts[Decision::Hit as usize], all),
                "manual" => (counts[StickyDecision::Hit as usize], all),
                "kv_aware" => (by_tier.iter().map(|(_, n)| n).sum(), prompt),
                _ => (0, 0),
            };
            let cached_tokens = match f.policy {
                "kv_aware" => by_tier.iter().map(|(l, n)| (l.to_string(), *n)).collect(),
                _ => BTreeMap::new(),
            };
            PolicyTally {
                policy: f.policy.to_string(),
                in_use: false,
                decisions: f
                    .labels
                    .iter()
                    .zip(&counts)
                    .map(|(l, &n)| (l.to_string(), n))
                    .collect(),
                hit_rate: (of > 0).then(|| hits as f64 / of as f64),
                cached_tokens,
            }
        })
        .collect()
}

/// Tells the process's recorder the counts (a family's series appear once it has
/// counted something, as they did when the recorder counted them itself).
pub(super) fn publish() {
    for f in families() {
        for (n, l) in f.counts().into_iter().zip(&f.labels) {
            if n > 0 {
                metrics::counter!(f.metric, f.label => *l).absolute(n);
            }
        }
    }
    let (prompt, by_tier) = kv_tokens();
    if prompt > 0 {
        metrics::counter!("moongate_gateway_kv_aware_prompt_tokens_total").absolute(prompt);
        for (tier, n) in by_tier {
            metrics::counter!("moongate_gateway_kv_aware_cached_tokens_total", "tier" => tier)
                .absolute(n);
        }
    }
}
