//! Cycles between sibling subtrees. Under every module, its submodules (each with all it
//! contains) are the nodes, and a reference from inside one to inside another is an arrow;
//! those arrows must form no cycle. A module and its own ancestors may refer to each other
//! freely (a parent re-exports, a child uses what its parent defines).

use std::collections::{BTreeMap, BTreeSet};

use crate::refs::Ref;
use crate::tree::{ModPath, Tree};

/// A cycle: sibling subtrees of `parent` that reach each other, with a reference behind
/// each arrow between them.
#[derive(Debug)]
pub struct Cycle {
    /// The module whose submodules form the cycle.
    pub parent: ModPath,
    /// The submodules in the cycle, by name.
    pub members: Vec<String>,
    /// One reference per arrow between members.
    pub arrows: Vec<Ref>,
}

/// Every cycle of `tree`, given its references.
pub fn find(tree: &Tree, refs: &[Ref]) -> Vec<Cycle> {
    let mut out = Vec::new();
    for parent in tree.modules.iter().map(|m| &m.path) {
        let depth = parent.len();
        let mut arrows: BTreeMap<(String, String), &Ref> = BTreeMap::new();
        for r in refs {
            if r.from.len() <= depth
                || r.to.len() <= depth
                || !r.from.starts_with(parent)
                || !r.to.starts_with(parent)
            {
                continue;
            }
            let (a, b) = (&r.from[depth], &r.to[depth]);
            if a != b {
                arrows.entry((a.clone(), b.clone())).or_insert(r);
            }
        }
        for members in strongly_connected(&arrows) {
            let set: BTreeSet<&String> = members.iter().collect();
            let arrows = arrows
                .iter()
                .filter(|((a, b), _)| set.contains(a) && set.contains(b))
                .map(|(_, r)| (*r).clone())
                .collect();
            out.push(Cycle {
                parent: parent.clone(),
                members,
                arrows,
            });
        }
    }
    out
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
fn strongly_connected<V>(arrows: &BTreeMap<(String, String), V>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in arrows.keys() {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    struct State<'a> {
        next: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in &s.next[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in next.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}
