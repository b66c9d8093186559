//! The modules a module refers to: every `use` tree and every path in its code that starts
//! at `crate`, `super`, `self` or one of its submodules, resolved to the deepest module of
//! the tree it names (`crate::tcp::frame::Status` -> `tcp::frame`). Paths through names a
//! `use` brought in are covered by that `use`; macro bodies are not read.

use std::path::PathBuf;

use syn::spanned::Spanned;
use syn::visit::Visit;

use crate::tree::{ModPath, Tree, is_test_only};

/// One reference from a module to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ref {
    /// The referring module.
    pub from: ModPath,
    /// The module referred to.
    pub to: ModPath,
    /// Where: file and line.
    pub file: PathBuf,
    /// The line of the reference.
    pub line: usize,
}

/// Every reference between modules of `tree` (self-references left out).
pub fn collect(tree: &Tree) -> Vec<Ref> {
    let mut out = Vec::new();
    for m in &tree.modules {
        let children: Vec<String> = tree
            .children(&m.path)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let mut v = Collector {
            tree,
            here: &m.path,
            children: &children,
            found: Vec::new(),
        };
        for item in &m.items {
            v.visit_item(item);
        }
        for (to, line) in v.found {
            if to != m.path {
                out.push(Ref {
                    from: m.path.clone(),
                    to,
                    file: m.file.clone(),
                    line,
                });
            }
        }
    }
    out
}

struct Collector<'a> {
    tree: &'a Tree,
    here: &'a ModPath,
    children: &'a [String],
    found: Vec<(ModPath, usize)>,
}

impl Collector<'_> {
    fn record(&mut self, segments: &[String], line: usize) {
        if let Some(to) = resolve(self.tree, self.here, self.children, segments) {
            self.found.push((to, line));
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {
        // A module inside a function body: rare, and read as its own module nowhere.
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if is_test_only(&u.attrs) {
            return;
        }
        let line = u.span().start().line;
        let mut paths = Vec::new();
        flatten(&u.tree, &mut Vec::new(), &mut paths);
        for p in paths {
            self.record(&p, line);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.record(&segments, p.span().start().line);
        syn::visit::visit_path(self, p);
    }
}

/// The paths a `use` tree names (`a::{b, c::d}` -> `a::b`, `a::c::d`; a glob: its prefix).
fn flatten(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut p = prefix.clone();
            p.push(n.ident.to_string());
            out.push(p);
        }
        syn::UseTree::Rename(r) => {
            let mut p = prefix.clone();
            p.push(r.ident.to_string());
            out.push(p);
        }
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix, out);
            }
        }
    }
}

/// The module a path written in module `here` names, if it names one of `tree`'s.
pub fn resolve(
    tree: &Tree,
    here: &[String],
    children: &[String],
    segments: &[String],
) -> Option<ModPath> {
    let first = segments.first()?;
    let (mut full, rest): (Vec<String>, &[String]) = match first.as_str() {
        "crate" => (Vec::new(), &segments[1..]),
        "self" => (here.to_vec(), &segments[1..]),
        "super" => {
            let mut base = here.to_vec();
            let mut i = 0;
            while segments.get(i).is_some_and(|s| s == "super") {
                base.pop()?;
                i += 1;
            }
            (base, &segments[i..])
        }
        name if children.iter().any(|c| c == name) => (here.to_vec(), segments),
        _ => return None,
    };
    full.extend(rest.iter().cloned());
    (0..=full.len())
        .rev()
        .map(|n| full[..n].to_vec())
        .find(|p| tree.has(p))
}
