//! Bounded memos of results computed before, found by a secret 128-bit hash of what they
//! were computed from.
//!
//! Two parts, shared by the page-digest memo of `kv_aware`
//! ([`crate::kv_events::hash::DigestMemo`]) and the chat-prompt memo of the tokenizer
//! ([`crate::tokenizer::Tokenizer::chat_body_ids`]):
//! - [`KeyedHash`]: two [`foldhash`] quality hashes with seeds drawn at start, as one
//!   128-bit key. A hit means the same input up to a chance no sender can steer (the seeds
//!   are secret); both memos hold what only steers routing, so even that chance could only
//!   mislead a pick, never change what a worker computes.
//! - [`Generations`]: two maps, an LRU at the grain of a generation. Lookups and inserts go
//!   to the newer; a hit in the older moves forward; when the newer holds its budget it
//!   becomes the older and the older is dropped. So at most twice the budget is held, and
//!   what is used at least once a generation stays.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// A 128-bit keyed hash (see the module doc).
#[derive(Default)]
pub struct KeyedHash {
    seeds: [foldhash::quality::RandomState; 2],
}

impl std::fmt::Debug for KeyedHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The seeds are the secret: never printed.
        f.write_str("KeyedHash")
    }
}

impl KeyedHash {
    /// The key of `value`.
    pub fn key<T: Hash + ?Sized>(&self, value: &T) -> u128 {
        let [a, b] = &self.seeds;
        u128::from(a.hash_one(value)) << 64 | u128::from(b.hash_one(value))
    }
}

/// Two generations of a map from [`KeyedHash`] keys to `V` (see the module doc), each
/// holding at most `budget` units of the weight its `weigh` gives a value.
pub struct Generations<V> {
    newer: HashMap<u128, V, foldhash::fast::RandomState>,
    older: HashMap<u128, V, foldhash::fast::RandomState>,
    /// The newer generation's weight.
    weight: usize,
    budget: usize,
    weigh: fn(&V) -> usize,
}

impl<V> std::fmt::Debug for Generations<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generations")
            .field("entries", &self.len())
            .field("budget", &self.budget)
            .finish()
    }
}

impl<V: Clone> Generations<V> {
    /// An empty memo whose generations hold at most `budget` units of `weigh`.
    pub fn new(budget: usize, weigh: fn(&V) -> usize) -> Self {
        Generations {
            newer: HashMap::default(),
            older: HashMap::default(),
            weight: 0,
            budget,
            weigh,
        }
    }

    /// The value kept under `key`, moved to the newer generation when found in the older.
    pub fn get(&mut self, key: u128) -> Option<V> {
        if let Some(v) = self.newer.get(&key) {
            return Some(v.clone());
        }
        let v = self.older.remove(&key)?;
        self.insert(key, v.clone());
        Some(v)
    }

    /// Keeps `value` under `key` (a value heavier than the budget is not kept).
    pub fn insert(&mut self, key: u128, value: V) {
        let w = (self.weigh)(&value);
        if w > self.budget {
            return;
        }
        if let Some(old) = self.newer.remove(&key) {
            self.weight -= (self.weigh)(&old);
        }
        if self.weight + w > self.budget {
            std::mem::swap(&mut self.newer, &mut self.older);
            self.newer.clear();
            self.weight = 0;
        }
        self.newer.insert(key, value);
        self.weight += w;
    }
}

impl<V> Generations<V> {
    /// Whether `key` is held (in either generation), without moving it.
    pub fn contains(&self, key: u128) -> bool {
        self.newer.contains_key(&key) || self.older.contains_key(&key)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.newer.len() + self.older.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_with_the_input_and_the_seeds() {
        let h = KeyedHash::default();
        assert_eq!(h.key("abc"), h.key("abc"));
        assert_ne!(h.key("abc"), h.key("abd"));
        assert_ne!(
            h.key(&(Some("a"), None::<&str>)),
            h.key(&(None::<&str>, Some("a")))
        );
        assert_ne!(KeyedHash::default().key("abc"), h.key("abc"));
        assert_eq!(format!("{h:?}"), "KeyedHash");
    }

    #[test]
    fn generations_stay_within_twice_the_budget_and_keep_what_is_used() {
        let mut g: Generations<Vec<u8>> = Generations::new(100, Vec::len);
        g.insert(1, vec![0; 10]);
        for k in 2..1000u128 {
            assert_eq!(
                g.get(1),
                Some(vec![0; 10]),
                "the value used every round stays"
            );
            g.insert(k, vec![1; 7]);
            let held: usize = g.newer.values().chain(g.older.values()).map(Vec::len).sum();
            assert!(held <= 200, "{held}");
        }
        assert!(g.contains(999) && !g.contains(2));
        // Too heavy for a generation: not kept, and nothing pushed out.
        let before = g.len();
        g.insert(5000, vec![0; 101]);
        assert!(!g.contains(5000));
        assert_eq!(g.len(), before);
        // A value replaced under its key weighs only once.
        let mut g: Generations<Vec<u8>> = Generations::new(100, Vec::len);
        for _ in 0..50 {
            g.insert(7, vec![0; 60]);
        }
        assert_eq!(g.weight, 60);
        assert!(g.older.is_empty());
    }
}
