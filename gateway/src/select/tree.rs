//! An approximate prefix cache: one radix tree over byte strings (prompt keys) shared by
//! many tenants (workers), each node recording which tenants were sent a prompt through it
//! and when (a logical clock).
//!
//! Invariants (`RadixTree::check` asserts them in tests):
//! - every node but the root has a non-empty label and at least one tenant;
//! - a child's tenants are a subset of its parent's (inserting a key adds the tenant to
//!   every node on its path; eviction removes a tenant from leaves first);
//! - children are keyed by the first byte of their label, sorted, one per byte;
//! - `bytes[t]` is the total label length of the nodes holding `t`.
//!
//! Nodes live in an arena (`Vec`, indices, a free list), so a walk is index chasing and
//! byte comparisons; no allocation on a match, one or two on an insert that adds nodes.
//! The tree is not synchronized: [`super::cache_aware`] keeps each behind a mutex.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// A tenant (a worker's [`crate::workers::Worker::uid`]).
pub type Tenant = u64;

const ROOT: u32 = 0;

#[derive(Debug, Default)]
struct Node {
    parent: u32,
    label: Box<[u8]>,
    /// `(first byte of the child's label, child)`, sorted by byte.
    children: Vec<(u8, u32)>,
    /// `(tenant, last access tick)`.
    tenants: Vec<(Tenant, u64)>,
    alive: bool,
}

impl Node {
    fn child(&self, b: u8) -> Option<u32> {
        self.children
            .binary_search_by_key(&b, |&(k, _)| k)
            .ok()
            .map(|i| self.children[i].1)
    }

    fn tick_of(&self, t: Tenant) -> Option<u64> {
        self.tenants.iter().find(|(x, _)| *x == t).map(|&(_, k)| k)
    }
}

/// The result of [`RadixTree::match_prefix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Bytes of the key matched.
    pub matched: usize,
    node: u32,
}

/// See the module doc.
#[derive(Debug)]
pub struct RadixTree {
    nodes: Vec<Node>,
    free: Vec<u32>,
    bytes: HashMap<Tenant, usize>,
    clock: u64,
}

impl Default for RadixTree {
    fn default() -> Self {
        Self::new()
    }
}

/// Length of the common prefix of `a` and `b`, eight bytes at a time.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let mut x = [0u8; 8];
        let mut y = [0u8; 8];
        x.copy_from_slice(&a[i..i + 8]);
        y.copy_from_slice(&b[i..i + 8]);
        let diff = u64::from_le_bytes(x) ^ u64::from_le_bytes(y);
        if diff != 0 {
            return i + (diff.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

impl RadixTree {
    /// An empty tree.
    pub fn new() -> Self {
        Self {
            nodes: vec![Node {
                parent: ROOT,
                alive: true,
                ..Node::default()
            }],
            free: Vec::new(),
            bytes: HashMap::new(),
            clock: 0,
        }
    }

    /// The longest prefix of `key` that some `eligible` tenant was sent.
    pub fn match_prefix(&self, key: &[u8], eligible: impl Fn(Tenant) -> bool) -> PrefixMatch {
        let mut best = PrefixMatch {
            matched: 0,
            node: ROOT,
        };
        let mut node = ROOT;
        let mut pos = 0;
        while pos < key.len() {
            let Some(c) = self.nodes[node as usize].child(key[pos]) else {
                break;
            };
            let child = &self.nodes[c as usize];
            // Tenant sets shrink downwards: no eligible tenant here, none below.
            if !child.tenants.iter().any(|&(t, _)| eligible(t)) {
                break;
            }
            let k = common_prefix(&child.label, &key[pos..]);
            pos += k;
            best = PrefixMatch {
                matched: pos,
                node: c,
            };
            if k < child.label.len() {
                break;
            }
            node = c;
        }
        best
    }

    /// The tenants holding the matched prefix (none when nothing matched).
    pub fn tenants_at(&self, m: &PrefixMatch) -> impl Iterator<Item = Tenant> + '_ {
        self.nodes[m.node as usize].tenants.iter().map(|&(t, _)| t)
    }

    /// Records that `tenant` was sent `key`.
    pub fn insert(&mut self, key: &[u8], tenant: Tenant) {
        self.clock += 1;
        let tick = self.clock;
        let mut node = ROOT;
        let mut pos = 0;
        while pos < key.len() {
            let rest = &key[pos..];
            let Some(c) = self.nodes[node as usize].child(rest[0]) else {
                let leaf = self.alloc(Node {
                    parent: node,
                    label: rest.into(),
                    children: Vec::new(),
                    tenants: vec![(tenant, tick)],
                    alive: true,
                });
                self.attach(node, rest[0], leaf);
                *self.bytes.entry(tenant).or_default() += rest.len();
                return;
            };
            let k = common_prefix(&self.nodes[c as usize].label, rest);
            let c = if k < self.nodes[c as usize].label.len() {
                self.split(c, k)
            } else {
                c
            };
            self.touch(c, tenant, tick);
            pos += k;
            node = c;
        }
    }

    /// Splits `c` after `k` bytes of its label; returns the new upper node.
    fn split(&mut self, c: u32, k: usize) -> u32 {
        let parent = self.nodes[c as usize].parent;
        let label = std::mem::take(&mut self.nodes[c as usize].label);
        let (upper, lower) = label.split_at(k);
        let tenants = self.nodes[c as usize].tenants.clone();
        let first = upper[0];
        let m = self.alloc(Node {
            parent,
            label: upper.into(),
            children: vec![(lower[0], c)],
            tenants,
            alive: true,
        });
        let cn = &mut self.nodes[c as usize];
        cn.label = lower.into();
        cn.parent = m;
        let p = &mut self.nodes[parent as usize];
        if let Ok(i) = p.children.binary_search_by_key(&first, |&(b, _)| b) {
            p.children[i].1 = m;
        }
        m
    }

    /// Marks `node` as sent to `tenant` at `tick`, counting its bytes if new to it.
    fn touch(&mut self, node: u32, tenant: Tenant, tick: u64) {
        let n = &mut self.nodes[node as usize];
        match n.tenants.iter_mut().find(|(t, _)| *t == tenant) {
            Some(e) => e.1 = tick,
            None => {
                n.tenants.push((tenant, tick));
                let len = n.label.len();
                *self.bytes.entry(tenant).or_default() += len;
            }
        }
    }

    fn alloc(&mut self, node: Node) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn attach(&mut self, parent: u32, first: u8, child: u32) {
        let p = &mut self.nodes[parent as usize];
        let i = p.children.partition_point(|&(b, _)| b < first);
        p.children.insert(i, (first, child));
    }

    /// Unlinks `node` from its parent and frees it and everything below it.
    fn remove_subtree(&mut self, node: u32) {
        let parent = self.nodes[node as usize].parent;
        let first = self.nodes[node as usize].label.first().copied();
        if let Some(b) = first {
            let p = &mut self.nodes[parent as usize];
            if let Ok(i) = p.children.binary_search_by_key(&b, |&(k, _)| k) {
                p.children.remove(i);
            }
        }
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            let dead = std::mem::take(&mut self.nodes[n as usize]);
            stack.extend(dead.children.iter().map(|&(_, c)| c));
            self.free.push(n);
        }
    }

    /// Bytes of prompt text held for `tenant`.
    pub fn tenant_bytes(&self, tenant: Tenant) -> usize {
        self.bytes.get(&tenant).copied().unwrap_or(0)
    }

    /// Nodes in use, the root included.
    pub fn node_count(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Whether `node` holds `t` and none of its children does.
    fn is_leaf_of(&self, node: u32, t: Tenant) -> bool {
        self.nodes[node as usize]
            .children
            .iter()
            .all(|&(_, c)| self.nodes[c as usize].tick_of(t).is_none())
    }

    /// Brings every tenant down to at most `max_bytes`, removing its least recently used
    /// leaves first. Returns the bytes removed.
    pub fn evict(&mut self, max_bytes: usize) -> usize {
        let over: Vec<Tenant> = self
            .bytes
            .iter()
            .filter(|&(_, &b)| b > max_bytes)
            .map(|(&t, _)| t)
            .collect();
        if over.is_empty() {
            return 0;
        }
        let mut heap = BinaryHeap::new();
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            if !n.alive {
                continue;
            }
            for &(t, tick) in &n.tenants {
                if over.contains(&t) && self.is_leaf_of(i as u32, t) {
                    heap.push(Reverse((tick, i as u32, t)));
                }
            }
        }
        let mut removed = 0;
        while let Some(Reverse((_, node, t))) = heap.pop() {
            if self.tenant_bytes(t) <= max_bytes {
                continue;
            }
            let n = &mut self.nodes[node as usize];
            let Some(i) = n.tenants.iter().position(|(x, _)| *x == t) else {
                continue;
            };
            n.tenants.swap_remove(i);
            let len = n.label.len();
            let (empty, parent) = (n.tenants.is_empty(), n.parent);
            removed += len;
            if let Some(b) = self.bytes.get_mut(&t) {
                *b -= len;
            }
            if empty {
                self.remove_subtree(node);
            }
            if parent != ROOT
                && let Some(tick) = self.nodes[parent as usize].tick_of(t)
                && self.is_leaf_of(parent, t)
            {
                heap.push(Reverse((tick, parent, t)));
            }
        }
        self.bytes.retain(|_, b| *b > 0);
        removed
    }

    /// Forgets every tenant `keep` rejects (workers that are gone).
    pub fn retain_tenants(&mut self, keep: impl Fn(Tenant) -> bool) {
        if self.bytes.keys().all(|&t| keep(t)) {
            return;
        }
        for n in self.nodes.iter_mut().skip(1).filter(|n| n.alive) {
            n.tenants.retain(|&(t, _)| keep(t));
        }
        let mut stack = vec![ROOT];
        while let Some(n) = stack.pop() {
            let children: Vec<u32> = self.nodes[n as usize]
                .children
                .iter()
                .map(|&(_, c)| c)
                .collect();
            for c in children {
                if self.nodes[c as usize].tenants.is_empty() {
                    self.remove_subtree(c);
                } else {
                    stack.push(c);
                }
            }
        }
        self.bytes.retain(|&t, _| keep(t));
    }

    /// Asserts the invariants of the module doc (tests only).
    #[cfg(test)]
    pub fn check(&self) {
        let mut bytes: HashMap<Tenant, usize> = HashMap::new();
        let mut seen = 0;
        let mut stack = vec![ROOT];
        while let Some(n) = stack.pop() {
            seen += 1;
            let node = &self.nodes[n as usize];
            assert!(node.alive);
            if n != ROOT {
                assert!(!node.label.is_empty(), "empty label");
                assert!(!node.tenants.is_empty(), "node without tenants");
                let parent = &self.nodes[node.parent as usize];
                for &(t, _) in &node.tenants {
                    assert!(
                        node.parent == ROOT || parent.tick_of(t).is_some(),
                        "tenant {t} below a node without it"
                    );
                    *bytes.entry(t).or_default() += node.label.len();
                }
            }
            assert!(node.children.windows(2).all(|w| w[0].0 < w[1].0));
            for &(b, c) in &node.children {
                let child = &self.nodes[c as usize];
                assert_eq!(child.parent, n, "parent link");
                assert_eq!(child.label[0], b, "child key");
                stack.push(c);
            }
        }
        assert_eq!(seen, self.node_count(), "unreachable live nodes");
        assert_eq!(bytes, self.bytes, "byte counts");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashSet};

    #[test]
    fn common_prefix_by_words_and_bytes() {
        let a = b"0123456789abcdefXYZ";
        for n in 0..a.len() {
            let mut b = a.to_vec();
            b[n] = b'!';
            assert_eq!(common_prefix(a, &b), n);
        }
        assert_eq!(common_prefix(a, a), a.len());
        assert_eq!(common_prefix(a, b"0123"), 4);
        assert_eq!(common_prefix(b"", a), 0);
    }

    #[test]
    fn insert_split_match() {
        let mut t = RadixTree::new();
        t.insert(b"hello world", 1);
        t.insert(b"hello there", 2);
        t.insert(b"help", 1);
        t.check();
        let all = |_| true;
        assert_eq!(t.match_prefix(b"hello world!", all).matched, 11);
        let m = t.match_prefix(b"hello thereafter", all);
        assert_eq!(m.matched, 11);
        assert_eq!(t.tenants_at(&m).collect::<Vec<_>>(), vec![2]);
        let m = t.match_prefix(b"hello", all);
        assert_eq!(m.matched, 5);
        let mut at: Vec<_> = t.tenants_at(&m).collect();
        at.sort();
        assert_eq!(at, vec![1, 2]);
        // Only tenant 1 is eligible: "hello there" matches as far as tenant 1 went.
        assert_eq!(t.match_prefix(b"hello there", |x| x == 1).matched, 6);
        assert_eq!(t.match_prefix(b"xyz", all).matched, 0);
        assert_eq!(t.tenants_at(&t.match_prefix(b"xyz", all)).count(), 0);
        assert_eq!(t.tenant_bytes(1), "hello world".len() + "p".len());
        assert_eq!(t.tenant_bytes(2), "hello there".len());
    }

    #[test]
    fn evicts_least_recently_used_first_and_forgets_gone_tenants() {
        let mut t = RadixTree::new();
        t.insert(b"aaaa-old", 1);
        t.insert(b"bbbb-mid", 1);
        t.insert(b"cccc-new", 1);
        t.insert(b"aaaa-old", 2);
        let removed = t.evict(16);
        t.check();
        assert_eq!(removed, 8);
        let all = |_| true;
        assert_eq!(t.match_prefix(b"aaaa-old", |x| x == 1).matched, 0);
        assert_eq!(t.match_prefix(b"cccc-new", all).matched, 8);
        assert_eq!(
            t.match_prefix(b"aaaa-old", all).matched,
            8,
            "tenant 2 keeps it"
        );
        t.retain_tenants(|x| x != 2);
        t.check();
        assert_eq!(t.match_prefix(b"aaaa-old", all).matched, 0);
        assert_eq!(t.node_count(), 3);
    }

    /// Operations for the property tests, over a small alphabet so keys share prefixes.
    #[derive(Debug, Clone)]
    enum Op {
        Insert(Vec<u8>, Tenant),
        Evict(usize),
        Forget(Tenant),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (proptest::collection::vec(b'a'..=b'd', 0..24), 0u64..4)
                .prop_map(|(k, t)| Op::Insert(k, t)),
            1 => (0usize..60).prop_map(Op::Evict),
            1 => (0u64..4).prop_map(Op::Forget),
        ]
    }

    proptest! {
        /// Without eviction, a match is exactly the longest common prefix with any key an
        /// eligible tenant was sent, and the invariants hold after every step.
        #[test]
        fn match_is_the_longest_prefix_sent(
            keys in proptest::collection::vec((proptest::collection::vec(b'a'..=b'c', 0..16), 0u64..3), 0..40),
            query in proptest::collection::vec(b'a'..=b'c', 0..20),
            allowed in proptest::collection::hash_set(0u64..3, 0..3),
        ) {
            let mut t = RadixTree::new();
            for (k, tenant) in &keys {
                t.insert(k, *tenant);
                t.check();
            }
            let expect = keys
                .iter()
                .filter(|(_, x)| allowed.contains(x))
                .map(|(k, _)| common_prefix(k, &query))
                .max()
                .unwrap_or(0);
            let m = t.match_prefix(&query, |x| allowed.contains(&x));
            prop_assert_eq!(m.matched, expect);
            if expect > 0 {
                // The tenants named are eligible ones that were sent that much of the query.
                let named: HashSet<Tenant> = t.tenants_at(&m).filter(|x| allowed.contains(x)).collect();
                prop_assert!(!named.is_empty());
                for x in named {
                    prop_assert!(keys.iter().any(|(k, y)| *y == x && common_prefix(k, &query) >= expect));
                }
            }
        }

        /// Any mix of inserts, evictions and forgotten tenants keeps the invariants; after
        /// an eviction every tenant is within the limit and still holds the last key it was
        /// sent if that key fits.
        #[test]
        fn eviction_keeps_invariants_and_recent_keys(ops in proptest::collection::vec(op(), 0..80)) {
            let mut t = RadixTree::new();
            let mut last: BTreeMap<Tenant, Vec<u8>> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, tenant) => {
                        t.insert(&k, tenant);
                        last.insert(tenant, k);
                    }
                    Op::Evict(max) => {
                        t.evict(max);
                        for (&tenant, k) in &last {
                            prop_assert!(t.tenant_bytes(tenant) <= max);
                            if k.len() <= max {
                                prop_assert_eq!(t.match_prefix(k, |x| x == tenant).matched, k.len());
                            }
                        }
                        // A key that did not fit may be gone in part: no longer tracked.
                        last.retain(|_, k| k.len() <= max);
                    }
                    Op::Forget(tenant) => {
                        t.retain_tenants(|x| x != tenant);
                        last.remove(&tenant);
                        prop_assert_eq!(t.tenant_bytes(tenant), 0);
                    }
                }
                t.check();
            }
        }
    }
}
