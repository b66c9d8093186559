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
fn kv_tokens() -> (u64, Vec<(&'static str, u64)>) {
    let labels = Tiers::default().labelled().map(|(l, _)| l);
    let by_tier = labels
        .iter()
        .zip(&KV_TOKENS[1..])
        .map(|(l, c)| (*l, c.load(Ordering::Relaxed)))
        .collect();
    (KV_TOKENS[0].load(Ordering::Relaxed), by_tier)
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

fn load(counts: &[AtomicU64]) -> Vec<u64> {
    counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
}

/// A family of decisions: its counts by label, and its hit rate (`hits` over `of`).
fn tally(policy: &str, labels: &[&str], counts: &[u64], hits: u64, of: u64) -> PolicyTally {
    PolicyTally {
        policy: policy.to_string(),
        in_use: false,
        decisions: labels
            .iter()
            .zip(counts)
            .map(|(l, &n)| (l.to_string(), n))
            .collect::<BTreeMap<_, _>>(),
        hit_rate: (of > 0).then(|| hits as f64 / of as f64),
        cached_tokens: BTreeMap::new(),
    }
}

/// Every family's counts now (`in_use` is left false: the caller knows the policies in
/// force).
pub fn tallies() -> Vec<PolicyTally> {
    let ca = load(&CACHE_AWARE);
    let kv = load(&KV_AWARE);
    let sticky = load(&STICKY);
    let pd = load(&PD_PATHS);
    let (prompt, by_tier) = kv_tokens();
    let cached = by_tier.iter().map(|(_, n)| n).sum();
    let mut kv_aware = tally(
        "kv_aware",
        &KvDecision::ALL.map(KvDecision::as_str),
        &kv,
        cached,
        prompt,
    );
    kv_aware.cached_tokens = by_tier
        .into_iter()
        .map(|(l, n)| (l.to_string(), n))
        .collect();
    vec![
        tally(
            "cache_aware",
            &Decision::ALL.map(Decision::as_str),
            &ca,
            ca[Decision::Hit as usize],
            ca.iter().sum(),
        ),
        kv_aware,
        tally(
            "manual",
            &StickyDecision::ALL.map(StickyDecision::as_str),
            &sticky,
            sticky[StickyDecision::Hit as usize],
            sticky.iter().sum(),
        ),
        tally("pd", &PdPath::ALL.map(PdPath::as_str), &pd, 0, 0),
    ]
}

/// Tells the process's recorder the counts (a family's series appear once it has
/// counted something, as they did when the recorder counted them itself).
pub(super) fn publish() {
    let families: [(&str, &str, &[AtomicU64], Vec<&'static str>); 4] = [
        (
            "moongate_gateway_cache_aware_decisions_total",
            "decision",
            &CACHE_AWARE,
            Decision::ALL.map(Decision::as_str).to_vec(),
        ),
        (
            "moongate_gateway_kv_aware_decisions_total",
            "decision",
            &KV_AWARE,
            KvDecision::ALL.map(KvDecision::as_str).to_vec(),
        ),
        (
            "moongate_gateway_sticky_decisions_total",
            "decision",
            &STICKY,
            StickyDecision::ALL.map(StickyDecision::as_str).to_vec(),
        ),
        (
            "moongate_gateway_pd_paths_total",
            "path",
            &PD_PATHS,
            PdPath::ALL.map(PdPath::as_str).to_vec(),
        ),
    ];
    for (name, label, counts, labels) in families {
        for (c, l) in counts.iter().zip(labels) {
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                metrics::counter!(name, label => l).absolute(n);
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
