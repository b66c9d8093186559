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

use crate::tenants::{self, Tenant};

/// Longest client keys file read, in bytes.
const MAX_KEYS_FILE: u64 = 4 << 20;

/// Keys a plane accepts, as digests, each with its owner (the tenant of a client key;
/// [`NO_OWNER`] otherwise). `Debug` shows only how many.
#[derive(Clone, Default)]
pub struct KeySet {
    digests: Box<[[u8; 32]]>,
    owners: Box<[u32]>,
}

/// The owner of a key that belongs to no tenant.
pub const NO_OWNER: u32 = u32::MAX;

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

    /// Every key of `keys` (duplicates kept once), owned by nobody.
    pub fn from_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Self {
        Self::with_owners(keys.into_iter().map(|k| (k, NO_OWNER)))
    }

    /// Every key of `keys` with its owner (a duplicate key keeps its first owner).
    pub fn with_owners<'a>(keys: impl IntoIterator<Item = (&'a str, u32)>) -> Self {
        let mut pairs: Vec<([u8; 32], u32)> = keys
            .into_iter()
            .map(|(k, o)| (digest(k.as_bytes()), o))
            .collect();
        pairs.sort_by_key(|p| p.0);
        pairs.dedup_by_key(|p| p.0);
        let (digests, owners): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
        Self {
            digests: digests.into(),
            owners: owners.into(),
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
        self.owner_of(token).is_some()
    }

    /// The owner of `token`'s key (`Some(NO_OWNER)` for a key of nobody), `None` when it is
    /// not one of the keys. Every digest is compared in full, and which one matched does
    /// not steer a branch.
    pub fn owner_of(&self, token: &Presented) -> Option<u32> {
        let mut found = 0u32;
        let mut owner = 0u32;
        for (d, o) in self.digests.iter().zip(self.owners.iter()) {
            let hit = u32::from(constant_time_eq(d, &token.0)).wrapping_neg();
            found |= hit;
            owner = (owner & !hit) | (o & hit);
        }
        (std::hint::black_box(found) != 0).then_some(owner)
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

/// The client keys file: the keys (each owned by its tenant's index) and the tenants.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientKeys {
    /// The keys.
    pub keys: KeySet,
    /// The tenants the keys name, indexed by [`KeySet::owner_of`].
    pub tenants: Vec<Tenant>,
}

/// Reads the client keys file at `path`: one key per line, then optionally its tenant and
/// limits ([`crate::tenants`]); blank lines and lines whose first non-blank character is
/// `#` are ignored; a key is visible ASCII without spaces (what `Authorization: Bearer
/// <key>` can carry). A file with no key is refused (it would refuse every request; drop
/// `--client-api-keys-file` to serve without client keys).
pub fn load_client_keys(path: &Path) -> Result<ClientKeys, KeysFileError> {
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
    let (keys, tenants) = parse_keys(&text).map_err(invalid)?;
    if keys.is_empty() {
        return Err(invalid(
            "holds no key (every inference request would be refused; without \
             --client-api-keys-file inference needs no key)"
                .into(),
        ));
    }
    Ok(ClientKeys {
        keys: KeySet::with_owners(keys),
        tenants,
    })
}

/// The keys of a keys file's text with their owners, and the tenants; or which lines are
/// wrong and why (never quoting a key).
type Parsed<'a> = (Vec<(&'a str, u32)>, Vec<Tenant>);

fn parse_keys(text: &str) -> Result<Parsed<'_>, String> {
    let mut keys = Vec::new();
    let mut tenants = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_ascii_whitespace();
        let key = words.next().unwrap_or_default();
        let owner = match tenants::parse_options(words) {
            _ if !is_sendable(key) => Err("not a key".to_string()),
            Ok(o) => tenants::merge(&mut tenants, o),
            Err(e) => Err(e),
        };
        match owner {
            Ok(o) => keys.push((key, o.unwrap_or(NO_OWNER))),
            Err(why) => bad.push(format!("line {}: {why}", i + 1)),
        }
    }
    if bad.is_empty() {
        Ok((keys, tenants))
    } else {
        Err(format!(
            "{} (a line is a key, visible ASCII without spaces, then name=value options: \
             tenant, rate, concurrency, max_priority; comments are whole lines starting with #)",
            bad.join("; ")
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
        let keys = load_client_keys(&path).unwrap().keys;
        assert_eq!(keys.len(), 2);
        assert!(keys.admits(&presented(Some("Bearer key-a")).unwrap()));
        assert!(!keys.admits(&presented(Some("Bearer key-c")).unwrap()));

        std::fs::write(&path, "good-key\nsecret with spaces\nok\nkey # trailing\n").unwrap();
        let err = load_client_keys(&path).unwrap_err().to_string();
        assert!(
            err.contains("line 2: ") && err.contains("line 4: "),
            "{err}"
        );
        for secret in ["secret", "with spaces", "good-key", "trailing"] {
            assert!(!err.contains(secret), "{err}");
        }
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

    #[test]
    fn keys_name_their_tenants() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(
            &path,
            "k-a1 tenant=a rate=5\nk-a2  tenant=a concurrency=2\nk-b tenant=b max_priority=bulk\nk-free\n",
        )
        .unwrap();
        let ck = load_client_keys(&path).unwrap();
        assert_eq!(ck.tenants.len(), 2);
        assert_eq!(ck.tenants[0].rate_per_second, Some(5));
        assert_eq!(ck.tenants[0].max_concurrent, Some(2));
        let owner = |k: &str| {
            ck.keys
                .owner_of(&presented(Some(&format!("Bearer {k}"))).unwrap())
        };
        assert_eq!(owner("k-a1"), Some(0));
        assert_eq!(owner("k-a2"), Some(0));
        assert_eq!(owner("k-b"), Some(1));
        assert_eq!(owner("k-free"), Some(NO_OWNER));
        assert_eq!(owner("k-c"), None);
        std::fs::write(&path, "k-a1 tenant=a rate=5\nk-a2 tenant=a rate=6\n").unwrap();
        let err = load_client_keys(&path).unwrap_err().to_string();
        assert!(err.contains("line 2: tenant a: rate given twice"), "{err}");
    }
}
