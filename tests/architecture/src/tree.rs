//! A crate's module tree, read from its sources the way rustc finds them: `mod x;` is
//! `x.rs` or `x/mod.rs` beside the declaring file (or its `#[path]`), `mod x { .. }` is
//! inline. Test-only code (`#[cfg(test)]` items and the files only they declare) is left
//! out of the tree and counted apart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use syn::spanned::Spanned;

/// A module path inside a crate (`[]` is the crate root, `["tcp", "frame"]` is `tcp::frame`).
pub type ModPath = Vec<String>;

/// One module of a crate, without its test-only items.
pub struct Module {
    /// Where it sits in the tree.
    pub path: ModPath,
    /// The file it is written in (an inline module: the file of its parent).
    pub file: PathBuf,
    /// Its items other than test-only ones and submodules.
    pub items: Vec<syn::Item>,
}

/// Lines of one source file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lines {
    /// Every line.
    pub total: usize,
    /// Lines of test-only code (a test-only file: all of them).
    pub test: usize,
}

/// A crate's modules and the lines of the files they are read from.
#[derive(Default)]
pub struct Tree {
    /// Every module, the root first.
    pub modules: Vec<Module>,
    /// Every file of the crate's targets, test-only files included.
    pub files: BTreeMap<PathBuf, Lines>,
}

impl Tree {
    /// Reads the module tree rooted at `root` (a `lib.rs` or a binary's `main.rs`).
    pub fn read(root: &Path) -> Result<Tree> {
        let mut tree = Tree::default();
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        tree.read_file(Vec::new(), root, &dir)?;
        Ok(tree)
    }

    /// Lines of code outside tests, over every file of the tree.
    pub fn code_lines(&self) -> usize {
        self.files.values().map(|l| l.total - l.test).sum()
    }

    /// Whether `path` names a module of this tree.
    pub fn has(&self, path: &[String]) -> bool {
        self.modules.iter().any(|m| m.path == path)
    }

    /// The names of `path`'s direct submodules.
    pub fn children(&self, path: &[String]) -> Vec<&str> {
        self.modules
            .iter()
            .filter(|m| m.path.len() == path.len() + 1 && m.path.starts_with(path))
            .map(|m| m.path[path.len()].as_str())
            .collect()
    }

    /// Reads a module written in file `file`, whose submodule files live in `dir`.
    fn read_file(&mut self, path: ModPath, file: &Path, dir: &Path) -> Result<()> {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let ast = syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
        self.files.insert(
            file.to_path_buf(),
            Lines {
                total: text.lines().count(),
                test: 0,
            },
        );
        self.read_items(path, file, dir, ast.items)
    }

    fn read_items(
        &mut self,
        path: ModPath,
        file: &Path,
        dir: &Path,
        items: Vec<syn::Item>,
    ) -> Result<()> {
        let mut kept = Vec::new();
        let mut submodules = Vec::new();
        for item in items {
            if is_test_only(item_attrs(&item)) {
                let span = item.span();
                let lines = span.end().line + 1 - span.start().line;
                if let Some(l) = self.files.get_mut(file) {
                    l.test += lines;
                }
                if let syn::Item::Mod(m) = &item
                    && m.content.is_none()
                {
                    // A test-only file: counted, not read into the tree.
                    let child = module_file(file, dir, m)?;
                    let total = std::fs::read_to_string(&child)
                        .with_context(|| format!("reading {}", child.display()))?
                        .lines()
                        .count();
                    self.files.insert(child, Lines { total, test: total });
                }
                continue;
            }
            match item {
                syn::Item::Mod(m) => submodules.push(m),
                other => kept.push(other),
            }
        }
        self.modules.push(Module {
            path: path.clone(),
            file: file.to_path_buf(),
            items: kept,
        });
        for m in submodules {
            let mut child = path.clone();
            child.push(m.ident.to_string());
            let child_dir = dir.join(m.ident.to_string());
            match m.content {
                Some((_, items)) => self.read_items(child, file, &child_dir, items)?,
                None => {
                    let child_file = module_file(file, dir, &m)?;
                    let child_dir = if child_file.ends_with("mod.rs") || path_attr(&m).is_some() {
                        child_file.parent().unwrap_or(dir).to_path_buf()
                    } else {
                        child_dir
                    };
                    self.read_file(child, &child_file, &child_dir)?;
                }
            }
        }
        Ok(())
    }
}

/// The file of `mod name;` declared in `file` (submodule directory `dir`).
fn module_file(file: &Path, dir: &Path, m: &syn::ItemMod) -> Result<PathBuf> {
    if let Some(p) = path_attr(m) {
        return Ok(file.parent().unwrap_or(Path::new(".")).join(p));
    }
    let name = m.ident.to_string();
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() {
        return Ok(flat);
    }
    let nested = dir.join(&name).join("mod.rs");
    if nested.exists() {
        return Ok(nested);
    }
    anyhow::bail!(
        "{}: module `{name}` has no file ({} or {})",
        file.display(),
        flat.display(),
        nested.display()
    )
}

/// The value of a module's `#[path = "..."]`.
fn path_attr(m: &syn::ItemMod) -> Option<String> {
    m.attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Whether these attributes make an item test-only: `#[cfg(test)]` or `#[cfg(all(.., test, ..))]`.
pub fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if !a.path().is_ident("cfg") {
            return false;
        }
        let Ok(meta) = a.parse_args::<syn::Meta>() else {
            return false;
        };
        match meta {
            syn::Meta::Path(p) => p.is_ident("test"),
            syn::Meta::List(l) if l.path.is_ident("all") => l
                .parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                )
                .map(|args| args.iter().any(|m| m.path().is_ident("test")))
                .unwrap_or(false),
            _ => false,
        }
    })
}

/// An item's outer attributes.
pub fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}
