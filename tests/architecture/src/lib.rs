//! The workspace's architecture check, run by `.ci/run` and by `cargo test --workspace`.
//!
//! Why a parser of its own rather than `cargo-modules --acyclic`: that tool builds
//! rust-analyzer (minutes on CI's two cores, on every fresh clone), and its acyclic check
//! looks for cycles between single files, so it passes a crate whose `tcp` and `engine`
//! subtrees import each other through different files. The rule checked here is the
//! layering one: at every level of a crate's module tree, the subtrees under one parent
//! form an acyclic graph ("a module of `tcp` uses `engine`" is an arrow `tcp -> engine`).
//! Parsing is `syn`'s; what is written here is only the walk and the graph.
//!
//! # Layout
//! - [`layers`]: the crates, their declared layers (`[workspace.metadata.layers]` in the
//!   root `Cargo.toml`) and the arrows between them (from `cargo metadata`).
//! - [`tree`]: a crate's module tree read from its sources (`mod` declarations, `#[path]`,
//!   inline modules), with the lines of test-only code (`#[cfg(test)]`) per file.
//! - [`refs`]: the modules each module refers to (`use` trees and paths in code).
//! - [`cycles`]: the cycles between sibling subtrees, with the references behind them.
//! - [`report`]: the whole check over a workspace, rendered as text.

pub mod cycles;
pub mod layers;
pub mod refs;
pub mod report;
pub mod tree;
