//! The cluster secret and secret settings.
//!
//! The cluster secret: where it comes from (an explicit file, `MOONGATE_TRANSFER_SECRET_FILE`,
//! or the per-user file made on first use), how it is checked, and what is derived from it.

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::str::FromStr;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Why the cluster secret could not be read, checked or created: the file and what is
/// wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct SecretError {
    /// The file and what is wrong with it.
    pub reason: String,
}

type Result<T> = std::result::Result<T, SecretError>;

/// Environment variable naming the secret file when no path is configured.
pub const SECRET_FILE_ENV: &str = "MOONGATE_TRANSFER_SECRET_FILE";
/// Shortest secret accepted, in bytes (a generated one has 64 hex digits).
pub const MIN_SECRET_LEN: usize = 16;
/// Longest secret file read, in bytes.
const MAX_SECRET_FILE: u64 = 4096;
/// Label of the store API key derived from the secret.
const STORE_KEY_LABEL: &str = "moongate store api key v1";

/// HMAC-SHA256, keyed with the secret by [`ClusterSecret::hmac`].
pub type HmacSha256 = Hmac<Sha256>;

/// The secret every node of a cluster holds. Transfer peers prove to each other that they
/// hold it (the transfer engine's handshake); the store plane's API key is derived
/// from it. `Debug` never shows it; cheap to clone.
#[derive(Clone)]
pub struct ClusterSecret {
    key: Arc<[u8]>,
    source: Option<PathBuf>,
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterSecret")
            .field("source", &self.source)
            .field("key", &"<hidden>")
            .finish()
    }
}

impl PartialEq for ClusterSecret {
    fn eq(&self, other: &Self) -> bool {
        // Equal keys give equal derived tags; compared without early exit.
        self.derive(b"equality") == other.derive(b"equality")
    }
}

fn bad(path: &Path, reason: impl fmt::Display) -> SecretError {
    SecretError {
        reason: format!("{}: {reason}", path.display()),
    }
}

impl ClusterSecret {
    /// The secret the process should use: the file `explicit` names, else the file
    /// [`SECRET_FILE_ENV`] names, else the per-user file ([`ClusterSecret::default_path`]),
    /// created on first use.
    pub fn resolve(explicit: Option<&Path>) -> Result<Self> {
        if let Some(p) = explicit {
            return Self::from_file(p);
        }
        if let Some(p) = std::env::var_os(SECRET_FILE_ENV).filter(|v| !v.is_empty()) {
            return Self::from_file(Path::new(&p));
        }
        Self::load_or_create(&Self::default_path()?)
    }

    /// `$XDG_CONFIG_HOME/moongate/transfer-secret`, else `$HOME/.config/moongate/transfer-secret`.
    pub fn default_path() -> Result<PathBuf> {
        default_path_from(
            std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from),
            std::env::var_os("HOME").map(PathBuf::from),
        )
    }

    /// A secret from raw bytes (at least [`MIN_SECRET_LEN`]), for embedding processes that
    /// keep it elsewhere.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretError {
                reason: format!(
                    "a secret of {} bytes is too short (at least {MIN_SECRET_LEN})",
                    bytes.len()
                ),
            });
        }
        Ok(Self {
            key: Arc::from(bytes),
            source: None,
        })
    }

    /// A fresh random secret (64 hex digits from the OS RNG), not stored anywhere.
    pub fn generate() -> Result<Self> {
        Self::from_bytes(random_hex()?.as_bytes())
    }

    /// Reads the secret file `path`: it must belong to this user and be private to it (no
    /// group or other permission bits), or belong to root and be readable at most by its
    /// group (a mounted Kubernetes Secret: root, `fsGroup`, 0440); and hold at least
    /// [`MIN_SECRET_LEN`] bytes (surrounding whitespace is not part of the secret).
    pub fn from_file(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| bad(path, e))?;
        let meta = file.metadata().map_err(|e| bad(path, e))?;
        if !meta.is_file() {
            return Err(bad(path, "not a regular file"));
        }
        let me = rustix::process::geteuid().as_raw();
        let owner = meta.uid();
        if owner != me && owner != 0 {
            return Err(bad(
                path,
                format!("owned by uid {owner}, not this user (uid {me}) or root"),
            ));
        }
        // A file of this user's must be private to it (0600, 0400). A root-owned one may be
        // readable by its group, as a mounted Kubernetes Secret is (root:fsGroup, 0440).
        let mode = meta.permissions().mode() & 0o777;
        let forbidden = if owner == 0 { 0o027 } else { 0o077 };
        if mode & forbidden != 0 {
            return Err(bad(
                path,
                format!(
                    "mode {mode:03o} lets other users read or change it; run `chmod 600` on it"
                ),
            ));
        }
        if meta.len() > MAX_SECRET_FILE {
            return Err(bad(
                path,
                format!("{} bytes is not a secret file", meta.len()),
            ));
        }
        let mut text = String::new();
        (&file)
            .take(MAX_SECRET_FILE)
            .read_to_string(&mut text)
            .map_err(|e| bad(path, e))?;
        let trimmed = text.trim();
        if trimmed.len() < MIN_SECRET_LEN {
            return Err(bad(
                path,
                format!(
                    "holds {} bytes; a secret needs at least {MIN_SECRET_LEN}",
                    trimmed.len()
                ),
            ));
        }
        Ok(Self {
            key: Arc::from(trimmed.as_bytes()),
            source: Some(path.to_owned()),
        })
    }

    /// Reads `path`, or creates it (mode 0600, its directory 0700) with a fresh random
    /// secret when it does not exist. Two processes racing to create it end up with the
    /// same secret: the file is written aside and linked into place without replacing one
    /// that appeared meanwhile.
    pub fn load_or_create(path: &Path) -> Result<Self> {
        // Whether the file is there decides, not whether reading it failed: reading can
        // fail because it is missing and then another creator link it before a second
        // look, which must not turn into "missing" (a file, once linked, is complete).
        match std::fs::symlink_metadata(path) {
            Ok(_) => return Self::from_file(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(bad(path, e)),
        }
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| bad(dir, e))?;
        let tmp = dir.join(format!(
            ".transfer-secret.{}.{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let written = (|| -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            writeln!(f, "{}", random_hex().map_err(std::io::Error::other)?)?;
            f.sync_all()
        })();
        let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => tracing::info!(path = %path.display(), "created the transfer secret file"),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(bad(path, format!("cannot create it: {e}"))),
        }
        Self::from_file(path)
    }

    /// The file this secret was read from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// HMAC-SHA256 of `label` under the secret: a key for another purpose that reveals
    /// nothing about the secret.
    pub fn derive(&self, label: &[u8]) -> [u8; 32] {
        let mut mac = self.hmac();
        mac.update(b"moongate derive v1\0");
        mac.update(label);
        mac.finalize().into_bytes().into()
    }

    /// The store plane's API key derived from this secret (64 hex digits): what storage
    /// nodes and store clients present to the master when no explicit store key is set.
    pub fn store_api_key(&self) -> String {
        hex_of(&self.derive(STORE_KEY_LABEL.as_bytes()))
    }

    /// An HMAC-SHA256 keyed with the secret (the transfer handshake's tags).
    pub fn hmac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.key).expect("HMAC takes keys of any length")
    }
}

fn default_path_from(xdg: Option<PathBuf>, home: Option<PathBuf>) -> Result<PathBuf> {
    // The XDG spec ignores relative values.
    let base = match (xdg.filter(|p| p.is_absolute()), home) {
        (Some(x), _) => x,
        (None, Some(h)) if !h.as_os_str().is_empty() => h.join(".config"),
        _ => {
            return Err(SecretError {
                reason: format!(
                    "neither XDG_CONFIG_HOME nor HOME is set: give the secret file with \
                     --transfer-secret-file or {SECRET_FILE_ENV}"
                ),
            });
        }
    };
    Ok(base.join("moongate").join("transfer-secret"))
}

/// `N` bytes from the OS random number generator.
pub fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| SecretError {
        reason: format!("the OS random number generator failed: {e}"),
    })?;
    Ok(b)
}

fn random_hex() -> Result<String> {
    Ok(hex_of(&random_bytes::<32>()?))
}

fn hex_of(b: &[u8]) -> String {
    use std::fmt::Write as _;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

/// A secret setting, such as an API key. `Debug` never shows the value, so a logged
/// configuration cannot leak it; (de)serializes as the plain string, so configuration files
/// and the environment carry it unchanged.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself (to send or compare, never to print).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<hidden>)")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_path_follows_xdg_then_home() {
        let p = default_path_from(Some("/x/cfg".into()), Some("/home/u".into())).unwrap();
        assert_eq!(p, Path::new("/x/cfg/moongate/transfer-secret"));
        let p = default_path_from(Some("rel".into()), Some("/home/u".into())).unwrap();
        assert_eq!(p, Path::new("/home/u/.config/moongate/transfer-secret"));
        assert!(default_path_from(None, None).is_err());
    }

    #[test]
    fn created_once_with_private_modes_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cfg/moongate/transfer-secret");
        let a = ClusterSecret::load_or_create(&path).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dmeta = std::fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(dmeta.permissions().mode() & 0o777, 0o700);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().len(), 64);
        let b = ClusterSecret::load_or_create(&path).unwrap();
        assert_eq!(a, b, "the second call reads the same secret");
        assert_eq!(a.store_api_key(), b.store_api_key());
        assert_eq!(a.store_api_key().len(), 64);
        assert!(!format!("{a:?}").contains(text.trim()));
        // Nothing is left behind besides the secret.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("transfer-secret")]);
    }

    #[test]
    fn racing_creators_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transfer-secret");
        let keys: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        ClusterSecret::load_or_create(&path)
                            .unwrap()
                            .store_api_key()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn unsafe_files_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ClusterSecret::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        // load_or_create never overwrites an existing file it cannot use.
        assert!(ClusterSecret::load_or_create(&path).is_err());
        // Root-owned files may be group-readable (a mounted Kubernetes Secret), never more.
        if rustix::process::geteuid().is_root() {
            for (mode, ok) in [(0o640, true), (0o440, true), (0o660, false), (0o604, false)] {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
                assert_eq!(ClusterSecret::from_file(&path).is_ok(), ok, "mode {mode:o}");
            }
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = ClusterSecret::from_file(&path).unwrap();
        assert_eq!(s.source(), Some(path.as_path()));
        assert_eq!(
            s,
            ClusterSecret::from_bytes(b"0123456789abcdef0123").unwrap()
        );

        std::fs::write(&path, "short\n").unwrap();
        let e = ClusterSecret::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("at least 16"), "{e}");
        assert!(ClusterSecret::from_file(&dir.path().join("missing")).is_err());
        assert!(ClusterSecret::from_file(dir.path()).is_err());
        assert!(ClusterSecret::from_bytes(b"short").is_err());
    }

    #[test]
    fn derived_keys_differ_by_label_and_secret() {
        let a = ClusterSecret::generate().unwrap();
        let b = ClusterSecret::generate().unwrap();
        assert_ne!(a, b);
        assert_ne!(a.store_api_key(), b.store_api_key());
        assert_ne!(a.derive(b"x"), a.derive(b"y"));
    }
}
