//! Where settings come from: defaults or a TOML file, then the environment variables and
//! flags that were given ([`merge_sources`]); shared by every command with a `--config`.

use std::path::Path;

use clap::{ArgMatches, parser::ValueSource};
use serde::{Serialize, de::DeserializeOwned};

use super::ConfigError;

/// Defaults (or the TOML file at `file`, whose missing keys keep their defaults), then the
/// environment variables and flags that `matches` says were given. Not validated yet.
pub fn merge_sources<T>(
    cli: &T,
    file: Option<&Path>,
    matches: &ArgMatches,
) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned + Default,
{
    let base = match file {
        Some(path) => read_toml(path)?,
        None => T::default(),
    };
    overlay_given(base, cli, matches)
}

/// Reads a TOML file into `T`; keys it lacks keep `T`'s defaults (`#[serde(default)]`).
pub fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Copies into `base` every field that was given on the command line or in the
/// environment (per `matches`), taking the value from `given`. Field names and clap ids
/// are the same (clap derives ids from field names), which is what makes this generic; an
/// id with dots (`master.lease_ttl_ms`) names a field of a nested struct.
pub fn overlay_given<T>(base: T, given: &T, matches: &ArgMatches) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned,
{
    let to_value = |v: &T| serde_json::to_value(v).map_err(|e| ConfigError::Merge(e.to_string()));
    let mut merged = to_value(&base)?;
    let given = to_value(given)?;
    for id in matches.ids() {
        let explicit = matches!(
            matches.value_source(id.as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if !explicit {
            continue;
        }
        let pointer = format!("/{}", id.as_str().replace('.', "/"));
        let Some(value) = given.pointer(&pointer) else {
            continue;
        };
        match merged.pointer_mut(&pointer) {
            Some(slot) => *slot = value.clone(),
            None => {
                // A field the base left out (e.g. skipped when empty): add it to its parent.
                let (parent, field) = pointer.rsplit_once('/').unwrap_or(("", ""));
                if let Some(obj) = merged.pointer_mut(parent).and_then(|p| p.as_object_mut()) {
                    obj.insert(field.to_string(), value.clone());
                }
            }
        }
    }
    serde_json::from_value(merged).map_err(|e| ConfigError::Merge(e.to_string()))
}
