//! The check on small crates written for it: each rule fails when broken and holds when not.

use std::path::Path;

use architecture::layers::{Crate, Declared, wrong_arrows};
use architecture::{cycles, refs, tree::Tree};

/// Writes `files` (path, text) under a temporary directory and reads the tree of `lib.rs`.
fn tree(files: &[(&str, &str)]) -> (tempfile::TempDir, Tree) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let t = Tree::read(&dir.path().join("lib.rs")).unwrap();
    (dir, t)
}

fn cycle_members(t: &Tree) -> Vec<(String, Vec<String>)> {
    let refs = refs::collect(t);
    cycles::find(t, &refs)
        .into_iter()
        .map(|c| (c.parent.join("::"), c.members))
        .collect()
}

#[test]
fn sibling_subtrees_that_use_each_other_are_a_cycle_even_through_different_files() {
    let (_d, t) = tree(&[
        ("lib.rs", "mod engine; mod tcp;"),
        ("engine/mod.rs", "mod batch; mod route;"),
        ("engine/batch.rs", "pub struct Batch;"),
        ("engine/route.rs", "use crate::tcp::client::Client;"),
        ("tcp/mod.rs", "pub mod client;"),
        (
            "tcp/client.rs",
            "pub struct Client(crate::engine::batch::Batch);",
        ),
    ]);
    assert_eq!(
        cycle_members(&t),
        vec![(String::new(), vec!["engine".to_string(), "tcp".to_string()])]
    );
}

#[test]
fn a_child_and_its_parent_may_use_each_other() {
    let (_d, t) = tree(&[
        ("lib.rs", "mod engine; pub use engine::Engine;"),
        (
            "engine/mod.rs",
            "mod batch; pub struct Engine; pub use batch::Batch; fn f(_: batch::Batch) {}",
        ),
        (
            "engine/batch.rs",
            "use super::Engine; pub struct Batch(Engine);",
        ),
    ]);
    assert!(cycle_members(&t).is_empty());
}

#[test]
fn test_only_code_neither_counts_as_code_nor_makes_cycles() {
    let (_d, t) = tree(&[
        (
            "lib.rs",
            "mod a; mod b;\n#[cfg(test)]\nmod tests;\n#[cfg(all(test, unix))]\nfn x() {}\n",
        ),
        (
            "a.rs",
            "pub struct A;\n#[cfg(test)]\nmod t {\n    use crate::b::B;\n}\n",
        ),
        ("b.rs", "pub struct B(crate::a::A);"),
        ("tests.rs", "use crate::a::A;\nuse crate::b::B;\n"),
    ]);
    assert!(cycle_members(&t).is_empty());
    // lib.rs: 4 of 5 lines test-only code; a.rs: 4 of 5; b.rs: none; tests.rs: all.
    assert_eq!(t.code_lines(), 1 + 1 + 1);
}

#[test]
fn nested_use_groups_super_and_self_paths_resolve_to_the_deepest_module() {
    let (_d, t) = tree(&[
        ("lib.rs", "mod x; mod y;"),
        (
            "x/mod.rs",
            "mod inner { use super::super::y::{deep::{D}, Y}; }",
        ),
        ("y/mod.rs", "pub mod deep; pub struct Y;"),
        (
            "y/deep.rs",
            "pub struct D; fn f() { self::g(); crate::x::h(); } fn g() {}",
        ),
    ]);
    let refs = refs::collect(&t);
    let pairs: Vec<(String, String)> = refs
        .iter()
        .map(|r| (r.from.join("::"), r.to.join("::")))
        .collect();
    assert!(pairs.contains(&("x::inner".into(), "y::deep".into())));
    assert!(pairs.contains(&("x::inner".into(), "y".into())));
    assert!(pairs.contains(&("y::deep".into(), "x".into())));
    assert_eq!(
        cycle_members(&t),
        vec![(String::new(), vec!["x".to_string(), "y".to_string()])]
    );
}

#[test]
fn a_missing_module_file_is_an_error_not_a_pass() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lib.rs"), "mod gone;").unwrap();
    let e = Tree::read(&dir.path().join("lib.rs")).err().unwrap();
    assert!(e.to_string().contains("gone"), "{e}");
}

fn krate(name: &str, layer: Option<usize>, deps: &[&str]) -> Crate {
    Crate {
        name: name.into(),
        layer,
        deps: deps.iter().map(|d| d.to_string()).collect(),
        roots: vec![Path::new("src/lib.rs").to_path_buf()],
    }
}

#[test]
fn arrows_point_down_the_layers_and_never_where_forbidden() {
    let declared = Declared {
        order: vec![
            vec!["wire".into()],
            vec!["low".into(), "peer".into()],
            vec!["top".into()],
        ],
        forbid: [(
            "top".to_string(),
            vec!["low".to_string(), "reqwest".to_string()],
        )]
        .into(),
        manifests: vec![],
    };
    let ok = [
        krate("wire", Some(0), &["serde"]),
        krate("low", Some(1), &["wire"]),
        krate("peer", Some(1), &["wire"]),
        krate("top", Some(2), &["peer", "wire"]),
    ];
    assert!(wrong_arrows(&declared, &ok).is_empty());
    let bad = [
        krate("wire", Some(0), &["low"]),
        krate("low", Some(1), &["peer"]),
        krate("peer", Some(1), &[]),
        krate("top", Some(2), &["low", "reqwest"]),
        krate("stray", None, &[]),
    ];
    let found: Vec<(String, String)> = wrong_arrows(&declared, &bad)
        .into_iter()
        .map(|w| (w.from, w.to))
        .collect();
    assert_eq!(
        found,
        vec![
            ("wire".into(), "low".into()),
            ("low".into(), "peer".into()),
            ("top".into(), "low".into()),
            ("top".into(), "reqwest".into()),
            ("stray".into(), String::new()),
        ]
    );
}

/// The real workspace: no module cycle, no wrong-way arrow, no file or crate over its size.
#[test]
fn the_workspace_holds_its_architecture() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let findings = architecture::report::check(&root).unwrap();
    assert!(
        findings.ok(),
        "{}",
        architecture::report::render(&findings, &root)
    );
}
