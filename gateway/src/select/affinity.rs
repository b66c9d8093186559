//! Affinity: requests that name a key (a session, a user, a conversation) in a header go
//! to the worker that key belongs to.
//!
//! - [`RoutingKey`]: which headers carry the routing key and the direct target, and what a
//!   request's headers say ([`Affinity`]).
//! - [`HashRing`]: consistent hashing with virtual nodes, the `consistent_hashing` policy.
//!   Every worker is placed at [`VIRTUAL_NODES`] points of a 64-bit ring by a stable hash
//!   of its URL, so that every gateway replica maps a key to the same worker; a key goes
//!   to the first point at or after its own hash whose worker can take the request. A
//!   worker that joins takes about 1/N of the keys; one that leaves (or is not ready, or
//!   has its breaker open) gives away only its own.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use http::HeaderMap;
use http::header::HeaderName;

use crate::workers::Worker;

/// Points per worker on the ring: enough that with a handful of workers each one's share
/// stays within a few percent of 1/N (the spread falls as 1/sqrt of this), few enough that
/// a ring of 1,000 workers (160k points, 2.5 MiB) builds in milliseconds.
pub const VIRTUAL_NODES: u32 = 160;

/// A routing key longer than this is refused for affinity (the request is then routed as
/// one without a key): keys are session or user ids, and a bound keeps hashing cheap.
pub const MAX_ROUTING_KEY_LEN: usize = 256;

/// Which headers a request names its routing key and its direct target in.
#[derive(Debug, Clone)]
pub struct RoutingKey {
    /// The routing key's header (smg's `x-smg-routing-key` by default).
    pub key: HeaderName,
    /// The direct target's header: a worker id (as `/workers` lists it) or URL.
    pub target: HeaderName,
}

impl Default for RoutingKey {
    /// The default headers ([`crate::config::ServeConfig`]'s).
    fn default() -> Self {
        Self::from(&crate::config::ServeConfig::default())
    }
}

impl From<&crate::config::ServeConfig> for RoutingKey {
    /// The configured headers (validation refuses a name that is not a header name; one
    /// that got past it is never matched).
    fn from(c: &crate::config::ServeConfig) -> Self {
        let name = |v: &str, unmatched: &'static str| {
            HeaderName::try_from(v).unwrap_or(HeaderName::from_static(unmatched))
        };
        Self {
            key: name(&c.routing_key_header, "x-moongate-invalid-routing-key"),
            target: name(&c.target_worker_header, "x-moongate-invalid-target-worker"),
        }
    }
}

/// What a request's headers ask of selection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Affinity<'a> {
    /// The routing key, if the request has one (non-empty, at most
    /// [`MAX_ROUTING_KEY_LEN`] bytes).
    pub key: Option<&'a [u8]>,
    /// The one worker (id or URL) the request must go to, if it names one.
    pub target: Option<&'a str>,
}

impl RoutingKey {
    /// What `headers` say: the routing key and the direct target.
    pub fn read<'a>(&self, headers: &'a HeaderMap) -> Affinity<'a> {
        let key = headers
            .get(&self.key)
            .map(|v| v.as_bytes())
            .filter(|k| !k.is_empty() && k.len() <= MAX_ROUTING_KEY_LEN);
        let target = headers
            .get(&self.target)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty());
        Affinity { key, target }
    }
}

/// Whether `w` is the worker `target` names (its id, or its URL with or without a
/// trailing slash).
pub fn is_target(w: &Worker, target: &str) -> bool {
    let url = w.url().as_str().trim_end_matches('/');
    if w.id() == target || url == target.trim_end_matches('/') {
        return true;
    }
    // `<url>@<rank>` names one data-parallel rank (`--dp-aware`).
    match (target.rsplit_once('@'), w.dp_rank()) {
        (Some((u, r)), Some(dp)) => {
            u.trim_end_matches('/') == url && r.parse::<u32>().is_ok_and(|r| r == dp.rank)
        }
        _ => false,
    }
}

/// The stable hash of the ring (rapidhash v3, whose output is fixed across versions and
/// platforms, so gateway replicas and restarts agree).
#[inline]
fn hash(bytes: &[u8]) -> u64 {
    rapidhash::v3::rapidhash_v3(bytes)
}

/// A ring built for one worker set.
#[derive(Debug)]
struct Ring {
    /// The set's workers, in set order: the ring is valid for a set with exactly these.
    /// Held, so that no other worker can ever sit at one of their addresses: comparing
    /// pointers is then exact, and checking a set of 10,000 reads no worker's memory.
    members: Vec<Arc<Worker>>,
    /// (point, index into the set), sorted by point.
    points: Vec<(u64, u32)>,
}

impl Ring {
    fn build(set: &[Arc<Worker>]) -> Self {
        let mut points = Vec::with_capacity(set.len() * VIRTUAL_NODES as usize);
        let mut buf = Vec::new();
        for (i, w) in set.iter().enumerate() {
            for v in 0..VIRTUAL_NODES {
                buf.clear();
                buf.extend_from_slice(w.name().as_bytes());
                buf.push(b'#');
                buf.extend_from_slice(&v.to_le_bytes());
                points.push((hash(&buf), i as u32));
            }
        }
        // Ties (two names' points colliding) are broken by the name, not by the set's order.
        points.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| set[a.1 as usize].name().cmp(&set[b.1 as usize].name()))
        });
        Self {
            members: set.to_vec(),
            points,
        }
    }

    fn fits(&self, set: &[Arc<Worker>]) -> bool {
        self.members.len() == set.len()
            && self.members.iter().zip(set).all(|(m, w)| Arc::ptr_eq(m, w))
    }
}

/// The `consistent_hashing` policy's ring, rebuilt when the worker set changes.
#[derive(Debug, Default)]
pub struct HashRing {
    ring: ArcSwapOption<Ring>,
}

impl HashRing {
    /// The worker of `set` that `key` belongs to among those `takes` accepts: the first on
    /// the ring at or after the key's point. `None` when `takes` accepts none.
    pub fn pick<'s>(
        &self,
        set: &'s [Arc<Worker>],
        key: &[u8],
        takes: impl Fn(&Arc<Worker>) -> bool,
    ) -> Option<&'s Arc<Worker>> {
        let ring = self.ring_for(set);
        if ring.points.is_empty() {
            return None;
        }
        let h = hash(key);
        let start = ring.points.partition_point(|p| p.0 < h);
        let n = ring.points.len();
        // A worker that cannot take it is met again at each of its points: ask once each.
        let mut refused: Vec<u32> = Vec::new();
        for k in 0..n {
            let i = ring.points[(start + k) % n].1;
            if refused.contains(&i) {
                continue;
            }
            let w = &set[i as usize];
            if takes(w) {
                return Some(w);
            }
            refused.push(i);
            if refused.len() == set.len() {
                break;
            }
        }
        None
    }

    fn ring_for(&self, set: &[Arc<Worker>]) -> Arc<Ring> {
        if let Some(r) = self.ring.load_full().filter(|r| r.fits(set)) {
            return r;
        }
        let r = Arc::new(Ring::build(set));
        self.ring.store(Some(r.clone()));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use workers::testing::ready_workers;

    fn owners(ring: &HashRing, set: &[Arc<Worker>], keys: usize) -> Vec<String> {
        (0..keys)
            .map(|k| {
                let key = format!("session-{k}");
                let w = ring.pick(set, key.as_bytes(), |_| true).unwrap();
                w.url().as_str().to_owned()
            })
            .collect()
    }

    #[test]
    fn a_fifth_worker_takes_about_a_fifth_and_a_leaving_one_gives_only_its_own() {
        let all = ready_workers(5);
        let four = &all[..4];
        let ring = HashRing::default();
        let before = owners(&ring, four, 10_000);
        let after = owners(&ring, &all, 10_000);
        let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
        // Every key that moved, moved to the new worker.
        let new_url = all[4].url().as_str();
        assert!(
            before
                .iter()
                .zip(&after)
                .all(|(a, b)| a == b || b == new_url)
        );
        eprintln!("a fifth worker joining four: {moved} of 10000 keys moved");
        assert!(
            (1_000..=2_500).contains(&moved),
            "{moved} of 10000 keys moved"
        );
        // Each of the four holds a fair share before the fifth joins.
        for w in four {
            let share = before.iter().filter(|u| *u == w.url().as_str()).count();
            assert!((1_900..=3_100).contains(&share), "{share}");
        }
        // One of the five leaves: only its keys move.
        let without: Vec<Arc<Worker>> = all
            .iter()
            .filter(|w| w.uid() != all[2].uid())
            .cloned()
            .collect();
        let left = owners(&ring, &without, 10_000);
        let gone = all[2].url().as_str();
        for (a, b) in after.iter().zip(&left) {
            assert!(a == b || a == gone, "{a} -> {b}");
        }
    }

    #[test]
    fn the_mapping_is_the_same_in_any_order_and_in_any_process() {
        let set = ready_workers(4);
        let mut reversed = set.clone();
        reversed.reverse();
        let (a, b) = (HashRing::default(), HashRing::default());
        assert_eq!(owners(&a, &set, 500), owners(&b, &reversed, 500));
        // The hash is rapidhash v3: a fixed value pins it across builds and platforms.
        assert_eq!(hash(b"session-0"), 0xe217_6f2e_c18f_cb3c);
    }

    #[test]
    fn a_worker_that_cannot_take_the_request_passes_it_to_the_next_on_the_ring() {
        let set = ready_workers(3);
        let ring = HashRing::default();
        let first = ring.pick(&set, b"k", |_| true).unwrap().clone();
        let next = ring
            .pick(&set, b"k", |w| w.uid() != first.uid())
            .unwrap()
            .clone();
        assert_ne!(first.uid(), next.uid());
        // Stable: asked again, the same answers.
        assert_eq!(ring.pick(&set, b"k", |_| true).unwrap().uid(), first.uid());
        assert!(ring.pick(&set, b"k", |_| false).is_none());
        assert!(ring.pick(&[], b"k", |_| true).is_none());
    }

    #[test]
    fn headers_name_the_key_and_the_target_within_bounds() {
        let rk = RoutingKey::default();
        let mut h = HeaderMap::new();
        assert_eq!(rk.read(&h), Affinity::default());
        h.insert("x-smg-routing-key", "user-7".parse().unwrap());
        h.insert("x-smg-target-worker", " http://w0:1 ".parse().unwrap());
        let a = rk.read(&h);
        assert_eq!(a.key, Some(&b"user-7"[..]));
        assert_eq!(a.target, Some("http://w0:1"));
        h.insert(
            "x-smg-routing-key",
            "x".repeat(MAX_ROUTING_KEY_LEN + 1).parse().unwrap(),
        );
        assert_eq!(rk.read(&h).key, None, "an over-long key is no key");
        h.insert("x-smg-routing-key", "".parse().unwrap());
        assert_eq!(rk.read(&h).key, None);
        let w = &ready_workers(1)[0];
        assert!(is_target(w, "http://w0:1/") && is_target(w, w.id()) && !is_target(w, "w0"));
    }
}
