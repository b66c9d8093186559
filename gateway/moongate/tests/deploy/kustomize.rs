//! The part of kustomize that deploy/k8s uses, so the tests read each overlay as
//! `kubectl apply -k` would apply it without kubectl: `resources` (files, and directories
//! holding a kustomization), `configMapGenerator` (its files, by key), and `patches`: JSON
//! 6902 operation lists (`add`, `replace`, `remove`) on a `target` kind and name, and
//! strategic-merge `$patch: delete` documents. Anything else in a kustomization fails the
//! test rather than being ignored. The `kustomize` test of deploy.rs checks this reading
//! against `kubectl kustomize` where kubectl is installed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

/// An overlay as applied: its documents, and the ConfigMaps it generates (name -> key ->
/// file).
pub struct Rendered {
    /// Every resource, patched.
    pub docs: Vec<Yaml>,
    /// Generated ConfigMaps: name -> key -> the file it holds.
    pub config_maps: BTreeMap<String, BTreeMap<String, PathBuf>>,
}

fn load(path: &Path) -> Vec<Yaml> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn key(s: &str) -> Yaml {
    Yaml::String(s.to_owned())
}

/// Renders the kustomization in `dir`.
pub fn render(dir: &Path) -> Rendered {
    let file = dir.join("kustomization.yaml");
    let k = load(&file).remove(0);
    let origin = file.display().to_string();
    let known = [
        "apiVersion",
        "kind",
        "resources",
        "configMapGenerator",
        "patches",
    ];
    for (name, _) in k.as_hash().unwrap_or_else(|| panic!("{origin}: not a map")) {
        let name = name.as_str().unwrap_or_default();
        assert!(
            known.contains(&name),
            "{origin}: `{name}` is not understood by gateway/moongate/tests/deploy/kustomize.rs"
        );
    }
    let mut out = Rendered {
        docs: Vec::new(),
        config_maps: BTreeMap::new(),
    };
    for r in k["resources"].as_vec().into_iter().flatten() {
        let r = dir.join(r.as_str().expect("a resource path"));
        if r.is_dir() {
            let base = render(&r);
            out.docs.extend(base.docs);
            out.config_maps.extend(base.config_maps);
        } else {
            out.docs
                .extend(load(&r).into_iter().filter(|d| !d.is_null()));
        }
    }
    for g in k["configMapGenerator"].as_vec().into_iter().flatten() {
        let name = g["name"]
            .as_str()
            .expect("configMapGenerator name")
            .to_owned();
        let mut files = BTreeMap::new();
        for f in g["files"].as_vec().into_iter().flatten() {
            let f = f.as_str().expect("a file");
            let (key, path) = f
                .split_once('=')
                .unwrap_or((f.rsplit('/').next().unwrap(), f));
            let path = dir.join(path);
            assert!(path.is_file(), "{origin}: no file {}", path.display());
            files.insert(key.to_owned(), path);
        }
        out.config_maps.insert(name, files);
    }
    for p in k["patches"].as_vec().into_iter().flatten() {
        let text = p["patch"]
            .as_str()
            .unwrap_or_else(|| panic!("{origin}: inline `patch:` text only"));
        let patch = YamlLoader::load_from_str(text)
            .unwrap_or_else(|e| panic!("{origin}: patch: {e}"))
            .remove(0);
        if patch["$patch"].as_str() == Some("delete") {
            let (kind, name) = (patch["kind"].as_str(), patch["metadata"]["name"].as_str());
            let before = out.docs.len();
            out.docs
                .retain(|d| (d["kind"].as_str(), d["metadata"]["name"].as_str()) != (kind, name));
            assert_eq!(
                before - 1,
                out.docs.len(),
                "{origin}: deletes {kind:?} {name:?}"
            );
            continue;
        }
        let ops = patch
            .as_vec()
            .unwrap_or_else(|| panic!("{origin}: a JSON 6902 list of operations"));
        let (kind, name) = (p["target"]["kind"].as_str(), p["target"]["name"].as_str());
        let doc = out
            .docs
            .iter_mut()
            .find(|d| d["kind"].as_str() == kind && d["metadata"]["name"].as_str() == name)
            .unwrap_or_else(|| panic!("{origin}: no {kind:?} {name:?} to patch"));
        for op in ops {
            apply(doc, op, &origin);
        }
    }
    out
}

/// One JSON 6902 operation on `doc`.
fn apply(doc: &mut Yaml, op: &Yaml, origin: &str) {
    let path = op["path"].as_str().expect("op path");
    let mut parts: Vec<String> = path
        .strip_prefix('/')
        .unwrap_or_else(|| panic!("{origin}: path {path:?}"))
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect();
    let last = parts.pop().expect("a path");
    let mut at = &mut *doc;
    for p in &parts {
        at = match at {
            Yaml::Hash(h) => h
                .get_mut(&key(p))
                .unwrap_or_else(|| panic!("{origin}: {path}: no {p:?}")),
            Yaml::Array(a) => {
                let i: usize = p.parse().unwrap_or_else(|_| panic!("{origin}: {path}"));
                a.get_mut(i)
                    .unwrap_or_else(|| panic!("{origin}: {path}: no item {i}"))
            }
            _ => panic!("{origin}: {path}: {p:?} is inside a scalar"),
        };
    }
    let value = op["value"].clone();
    match (op["op"].as_str(), at) {
        (Some("add"), Yaml::Array(a)) if last == "-" => a.push(value),
        (Some("add"), Yaml::Array(a)) => a.insert(last.parse().expect("an index"), value),
        (Some("add"), Yaml::Hash(h)) => {
            h.insert(key(&last), value);
        }
        (Some("replace"), Yaml::Array(a)) => {
            let i: usize = last.parse().expect("an index");
            assert!(i < a.len(), "{origin}: {path}: replace of a missing item");
            a[i] = value;
        }
        (Some("replace"), Yaml::Hash(h)) => {
            let slot = h
                .get_mut(&key(&last))
                .unwrap_or_else(|| panic!("{origin}: {path}: replace of a missing key"));
            *slot = value;
        }
        (Some("remove"), Yaml::Array(a)) => {
            a.remove(last.parse().expect("an index"));
        }
        (Some("remove"), Yaml::Hash(h)) => {
            assert!(
                h.remove(&key(&last)).is_some(),
                "{origin}: {path}: nothing to remove"
            );
        }
        (other, _) => panic!("{origin}: {path}: operation {other:?} not understood here"),
    }
}
