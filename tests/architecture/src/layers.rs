//! The workspace's crates, their layers and the arrows between them.
//!
//! The layers are declared once, in the root `Cargo.toml`:
//!
//! ```toml
//! [workspace.metadata.layers]
//! order = [["openapi"], ["transfer"], ["gateway"]]   # lowest first
//! forbid = { gateway = ["transfer"] }                # arrows the order allows, the design not
//! manifests = ["kvstore/wheel/Cargo.toml"]           # crates outside the workspace, read too
//! ```
//!
//! A crate may depend (normal or build dependency) only on crates of a strictly lower
//! layer, and never on what `forbid` lists for it (a crate of the workspace or a third-party one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use cargo_metadata::{DependencyKind, MetadataCommand, TargetKind};
use serde::Deserialize;

/// `[workspace.metadata.layers]`.
#[derive(Debug, Default, Deserialize)]
pub struct Declared {
    /// Layers, lowest first; each lists crate names.
    pub order: Vec<Vec<String>>,
    /// Per crate, dependencies it must not have.
    #[serde(default)]
    pub forbid: BTreeMap<String, Vec<String>>,
    /// Manifests outside the workspace whose crates are checked too, relative to the root.
    #[serde(default)]
    pub manifests: Vec<PathBuf>,
}

/// One crate of the check.
#[derive(Debug, Clone)]
pub struct Crate {
    /// Package name.
    pub name: String,
    /// Its layer (index into `order`).
    pub layer: Option<usize>,
    /// Normal and build dependencies, by package name.
    pub deps: Vec<String>,
    /// Root files of its library and binaries.
    pub roots: Vec<PathBuf>,
}

/// A dependency the layers do not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrongArrow {
    /// The depending crate.
    pub from: String,
    /// What it depends on.
    pub to: String,
    /// Why it is wrong.
    pub why: String,
}

/// The declaration and crates of the workspace at `root`.
pub fn read(root: &Path) -> Result<(Declared, Vec<Crate>)> {
    let meta = MetadataCommand::new()
        .manifest_path(root.join("Cargo.toml"))
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let declared: Declared = match meta.workspace_metadata.get("layers") {
        Some(v) => serde_json::from_value(v.clone()).context("[workspace.metadata.layers]")?,
        None => bail!("the root Cargo.toml declares no [workspace.metadata.layers]"),
    };
    let mut packages: Vec<cargo_metadata::Package> =
        meta.workspace_packages().into_iter().cloned().collect();
    for m in &declared.manifests {
        let extra = MetadataCommand::new()
            .manifest_path(root.join(m))
            .no_deps()
            .exec()
            .with_context(|| format!("cargo metadata for {}", m.display()))?;
        packages.extend(extra.workspace_packages().into_iter().cloned());
    }
    let crates = packages
        .iter()
        .map(|p| Crate {
            name: p.name.to_string(),
            layer: declared
                .order
                .iter()
                .position(|l| l.iter().any(|n| *n == *p.name)),
            deps: p
                .dependencies
                .iter()
                .filter(|d| d.kind != DependencyKind::Development)
                .map(|d| d.name.clone())
                .collect(),
            roots: p
                .targets
                .iter()
                .filter(|t| {
                    t.kind.iter().any(|k| {
                        matches!(
                            k,
                            TargetKind::Lib
                                | TargetKind::Bin
                                | TargetKind::CDyLib
                                | TargetKind::RLib
                                | TargetKind::ProcMacro
                        )
                    })
                })
                .map(|t| t.src_path.clone().into_std_path_buf())
                .collect(),
        })
        .collect();
    Ok((declared, crates))
}

/// The dependencies among `crates` that `declared` does not allow, and the crates it
/// gives no layer.
pub fn wrong_arrows(declared: &Declared, crates: &[Crate]) -> Vec<WrongArrow> {
    let layer: BTreeMap<&str, Option<usize>> =
        crates.iter().map(|c| (c.name.as_str(), c.layer)).collect();
    let mut out = Vec::new();
    for c in crates {
        let Some(from) = c.layer else {
            out.push(WrongArrow {
                from: c.name.clone(),
                to: String::new(),
                why: "has no layer in [workspace.metadata.layers] order".into(),
            });
            continue;
        };
        for d in &c.deps {
            if let Some(Some(to)) = layer.get(d.as_str())
                && *to >= from
            {
                out.push(WrongArrow {
                    from: c.name.clone(),
                    to: d.clone(),
                    why: format!("layer {from} -> layer {to}: arrows point down only"),
                });
            }
            if declared
                .forbid
                .get(&c.name)
                .is_some_and(|f| f.iter().any(|x| x == d))
            {
                out.push(WrongArrow {
                    from: c.name.clone(),
                    to: d.clone(),
                    why: "forbidden by [workspace.metadata.layers] forbid".into(),
                });
            }
        }
    }
    out
}
