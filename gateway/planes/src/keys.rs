//! Accepted keys: a [`KeySet`] keeps SHA-256 digests of the keys (never the keys), and a
//! request's bearer token is hashed once ([`Presented`]) and compared with every digest
//! in constant time; and the client keys file (`--client-api-keys-file`).
//!
//! Comparing digests instead of keys makes the comparison's cost independent of the keys'
//! lengths and of where a guess differs, and a set of any size costs one hash per request
//! plus a 32-byte comparison per key, with no early exit.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use http::{HeaderMap, header};
use sha2::{Digest, Sha256};

/// Longest client keys file read, in bytes.
const MAX_KEYS_FILE: u64 = 4 << 20;

/// Keys a plane accepts, as digests. `Debug` shows only how many.
#[derive(Clone, Default)]
pub struct KeySet {
    digests: Box<[[u8; 32]]>,
}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeySet({} keys)", self.digests.len())
    }
}

impl PartialEq for KeySet {
    fn eq(&self, other: &Self) -> bool {
        self.digests == other.digests
    }
}

impl KeySet {
    /// One key.
    pub fn single(key: &str) -> Self {
        Self::from_keys([key])
    }

    /// Every key of `keys` (duplicates kept once).
    pub fn from_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Self {
        let mut digests: Vec<[u8; 32]> = keys.into_iter().map(|k| digest(k.as_bytes())).collect();
        digests.sort_unstable();
        digests.dedup();
        Self {
            digests: digests.into(),
        }
    }

    /// A plane that takes a key this process does not know: nothing matches. For documents
    /// built from a configuration without reading its secrets (`moongate openapi`).
    pub fn unresolved() -> Self {
        Self::default()
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether there is no key at all.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether `token` is one of the keys; every digest is compared in full.
    pub fn admits(&self, token: &Presented) -> bool {
        let mut found = 0u8;
        for d in self.digests.iter() {
            found |= u8::from(constant_time_eq(d, &token.0));
        }
        std::hint::black_box(found) == 1
    }
}

/// The digest of the bearer token a request presented.
#[derive(Clone, Copy)]
pub struct Presented([u8; 32]);

impl Presented {
    /// The token of `headers`' `Authorization: Bearer <token>`, hashed; `None` without one.
    pub fn of(headers: &HeaderMap) -> Option<Self> {
        let value = headers.get(header::AUTHORIZATION)?;
        bearer_token(value.as_bytes()).map(|t| Self(digest(t)))
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The token of an `Authorization: Bearer <token>` value (the scheme name is
/// case-insensitive, RFC 9110; surrounding blanks are not part of the token).
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    if value.len() <= SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &value[SCHEME.len()..];
    let token = rest.trim_ascii_start();
    (token.len() < rest.len() && !token.is_empty()).then_some(token.trim_ascii_end())
}

/// `a == b` for two digests, without early exit.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// Whether `key` can be sent as `Authorization: Bearer <key>`: non-empty visible ASCII
/// without spaces.
pub fn is_sendable(key: &str) -> bool {
    !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic())
}

/// Why the client keys file cannot be used. Never quotes a key.
#[derive(Debug, thiserror::Error)]
pub enum KeysFileError {
    /// Not readable.
    #[error("cannot read the client keys file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Readable, but not a keys file.
    #[error("client keys file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (line numbers, never the lines).
        reason: String,
    },
}

/// Reads the client keys file at `path`: one key per line; blank lines and lines whose
/// first non-blank character is `#` are ignored; a key is visible ASCII without spaces
/// (what `Authorization: Bearer <key>` can carry). A file with no key is refused (it would
/// refuse every request; drop `--client-api-keys-file` to serve without client keys).
pub fn load_client_keys(path: &Path) -> Result<KeySet, KeysFileError> {
    let read = |source| KeysFileError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let len = file.metadata().map_err(read)?.len();
    let invalid = |reason: String| KeysFileError::Invalid {
        path: path.to_owned(),
        reason,
    };
    if len > MAX_KEYS_FILE {
        return Err(invalid(format!(
            "{len} bytes; a keys file holds at most {MAX_KEYS_FILE}"
        )));
    }
    let mut text = String::new();
    file.take(MAX_KEYS_FILE)
        .read_to_string(&mut text)
        .map_err(read)?;
    let keys = parse_keys(&text).map_err(invalid)?;
    if keys.is_empty() {
        return Err(invalid(
            "holds no key (every inference request would be refused; without \
             --client-api-keys-file inference needs no key)"
                .into(),
        ));
    }
    Ok(KeySet::from_keys(keys))
}

/// The keys of a keys file's text, or which lines are wrong.
fn parse_keys(text: &str) -> Result<Vec<&str>, String> {
    let mut keys = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if is_sendable(line) {
            keys.push(line);
        } else {
            bad.push((i + 1).to_string());
        }
    }
    if bad.is_empty() {
        Ok(keys)
    } else {
        Err(format!(
            "line(s) {} are not keys (a key is visible ASCII without spaces; comments are \
             whole lines starting with #)",
            bad.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn presented(auth: Option<&str>) -> Option<Presented> {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        Presented::of(&h)
    }

    #[test]
    fn only_the_exact_bearer_keys_are_admitted() {
        let keys = KeySet::from_keys(["k3y-Value", "other.key"]);
        for good in [
            "Bearer k3y-Value",
            "bearer   k3y-Value ",
            "BEARER other.key",
        ] {
            assert!(
                presented(Some(good)).is_some_and(|p| keys.admits(&p)),
                "{good}"
            );
        }
        for bad in [
            None,
            Some(""),
            Some("Bearer"),
            Some("Bearer "),
            Some("Bearerk3y-Value"),
            Some("Basic k3y-Value"),
            Some("Bearer k3y-valuE"),
            Some("Bearer k3y-Value2"),
            Some("Bearer k3y-Valu"),
            Some("k3y-Value"),
        ] {
            assert!(
                !presented(bad).is_some_and(|p| keys.admits(&p)),
                "{bad:?} admitted"
            );
        }
        let nothing = KeySet::unresolved();
        assert!(!nothing.admits(&presented(Some("Bearer k3y-Value")).unwrap()));
    }

    #[test]
    fn debug_never_shows_a_key() {
        let keys = KeySet::from_keys(["topsecret", "topsecret", "b"]);
        assert_eq!(format!("{keys:?}"), "KeySet(2 keys)");
    }

    #[test]
    fn keys_files_take_comments_and_blank_lines_and_name_bad_lines_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, "# team a\n\n  key-a  \nkey-b\n\t# old: key-c\n").unwrap();
        let keys = load_client_keys(&path).unwrap();
        assert_eq!(keys.len(), 2);
        assert!(keys.admits(&presented(Some("Bearer key-a")).unwrap()));
        assert!(!keys.admits(&presented(Some("Bearer key-c")).unwrap()));

        std::fs::write(&path, "good-key\nsecret with spaces\nok\nkey # trailing\n").unwrap();
        let err = load_client_keys(&path).unwrap_err().to_string();
        assert!(err.contains("line(s) 2, 4"), "{err}");
        assert!(
            !err.contains("secret") && !err.contains("trailing"),
            "{err}"
        );

        std::fs::write(&path, "# nothing here\n\n").unwrap();
        let err = load_client_keys(&path).unwrap_err().to_string();
        assert!(err.contains("holds no key"), "{err}");

        let err = load_client_keys(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(err, KeysFileError::Read { .. }), "{err}");
    }
}
