//! The whole check over a workspace: crate arrows, module cycles, sizes; rendered as text.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::cycles::{self, Cycle};
use crate::layers::{self, Crate, WrongArrow};
use crate::refs;
use crate::tree::Tree;

/// The most lines a source file may have (tests included).
pub const MAX_FILE_LINES: usize = 800;
/// The most lines of non-test code a crate may have.
pub const MAX_CRATE_LINES: usize = 15_000;

/// What the check found.
#[derive(Debug, Default)]
pub struct Findings {
    /// Crates with their layer and lines of non-test code.
    pub crates: Vec<(Crate, usize)>,
    /// Dependencies pointing the wrong way.
    pub wrong_arrows: Vec<WrongArrow>,
    /// Module cycles, per crate (`crate` or `crate (bin name)`).
    pub cycles: Vec<(String, Cycle)>,
    /// Source files over [`MAX_FILE_LINES`].
    pub long_files: Vec<(PathBuf, usize)>,
}

impl Findings {
    /// Whether everything holds.
    pub fn ok(&self) -> bool {
        self.wrong_arrows.is_empty()
            && self.cycles.is_empty()
            && self.long_files.is_empty()
            && self.crates.iter().all(|(_, n)| *n <= MAX_CRATE_LINES)
    }
}

/// Checks the workspace at `root`.
pub fn check(root: &Path) -> Result<Findings> {
    let (declared, crates) = layers::read(root)?;
    let mut f = Findings {
        wrong_arrows: layers::wrong_arrows(&declared, &crates),
        ..Findings::default()
    };
    for c in crates {
        let mut lines = 0;
        for r in &c.roots {
            let tree = Tree::read(r)?;
            lines += tree.code_lines();
            let refs = refs::collect(&tree);
            let label = if r.ends_with("lib.rs") {
                c.name.clone()
            } else {
                format!("{} ({})", c.name, r.display())
            };
            for cy in cycles::find(&tree, &refs) {
                f.cycles.push((label.clone(), cy));
            }
        }
        f.crates.push((c, lines));
    }
    f.long_files = long_files(root)?;
    Ok(f)
}

/// Every `.rs` file under `root` (outside `target` and hidden folders) over the limit.
fn long_files(root: &Path) -> Result<Vec<(PathBuf, usize)>> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    dirs.push(p);
                }
            } else if name.ends_with(".rs") {
                let n = std::fs::read_to_string(&p)?.lines().count();
                if n > MAX_FILE_LINES {
                    out.push((p.strip_prefix(root).unwrap_or(&p).to_path_buf(), n));
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The findings as the text CI prints.
pub fn render(f: &Findings, root: &Path) -> String {
    let mut s = String::new();
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let _ = writeln!(
        s,
        "== crates (layer, lines of non-test code; at most {MAX_CRATE_LINES})"
    );
    let mut crates: Vec<_> = f.crates.iter().collect();
    crates.sort_by_key(|(c, _)| (c.layer, c.name.clone()));
    for (c, n) in crates {
        let layer = c.layer.map_or("-".into(), |l| l.to_string());
        let flag = if *n > MAX_CRATE_LINES {
            "  TOO LARGE"
        } else {
            ""
        };
        let _ = writeln!(s, "  {layer:>2} {:<16} {n:>6}{flag}", c.name);
    }
    let _ = writeln!(
        s,
        "== crate arrows pointing the wrong way: {}",
        f.wrong_arrows.len()
    );
    for w in &f.wrong_arrows {
        let _ = writeln!(s, "  {} -> {}: {}", w.from, w.to, w.why);
    }
    let _ = writeln!(s, "== module cycles: {}", f.cycles.len());
    for (krate, c) in &f.cycles {
        let under = if c.parent.is_empty() {
            "the root".into()
        } else {
            c.parent.join("::")
        };
        let _ = writeln!(s, "  {krate}, under {under}: {}", c.members.join(" <-> "));
        for r in &c.arrows {
            let _ = writeln!(
                s,
                "    {} -> {}  ({}:{})",
                r.from.join("::"),
                r.to.join("::"),
                rel(&r.file),
                r.line
            );
        }
    }
    let _ = writeln!(
        s,
        "== files over {MAX_FILE_LINES} lines: {}",
        f.long_files.len()
    );
    for (p, n) in &f.long_files {
        let _ = writeln!(s, "  {} ({n})", p.display());
    }
    let _ = writeln!(
        s,
        "== {}",
        if f.ok() {
            "architecture check passed"
        } else {
            "architecture check FAILED"
        }
    );
    s
}
