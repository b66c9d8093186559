//! The security settings of `serve` and `master`: their validation, and the keys they put in
//! force ([`planes::AuthSettings`]). What each key opens is `planes`' module doc.

use std::path::Path;

use anyhow::Context;

use super::{MasterHostConfig, Secret, ServeConfig};
use planes::{AuthSettings, KeySet, keys};

/// What is wrong with `serve`'s keys, key files and CORS origins.
pub(super) fn problems(c: &ServeConfig) -> Vec<String> {
    let mut errs = Vec::new();
    errs.extend(secret_problem("admin_api_key", &c.admin_api_key));
    errs.extend(secret_problem("store_api_key", &c.store_api_key));
    if let Some(path) = &c.client_api_keys_file
        && let Err(e) = keys::load_client_keys(path)
    {
        errs.push(format!("client_api_keys_file: {e}"));
    }
    errs.extend(transfer_secret_problem(c.transfer_secret_file.as_deref()));
    errs.extend(cors_problems(&c.cors_allowed_origins));
    errs
}

/// What is wrong with `master`'s keys and key files.
pub(super) fn master_problems(c: &MasterHostConfig) -> Vec<String> {
    let mut errs = Vec::new();
    errs.extend(secret_problem("admin_api_key", &c.admin_api_key));
    errs.extend(secret_problem("store_api_key", &c.store_api_key));
    errs.extend(transfer_secret_problem(c.transfer_secret_file.as_deref()));
    errs
}

/// A key must be non-empty visible ASCII without spaces, or no client could send it as
/// `Authorization: Bearer <key>`.
fn secret_problem(name: &str, key: &Option<Secret>) -> Option<String> {
    let k = key.as_ref()?.expose();
    (!keys::is_sendable(k))
        .then(|| format!("{name} must be non-empty visible ASCII without spaces"))
}

/// An explicit secret file must be one the transfer engine would read.
fn transfer_secret_problem(path: Option<&Path>) -> Option<String> {
    let e = trust::ClusterSecret::from_file(path?).err()?;
    Some(format!("transfer_secret_file: {e}"))
}

/// Each origin is `*` (alone) or exactly `scheme://host[:port]`, what browsers send.
fn cors_problems(origins: &[String]) -> Vec<String> {
    let mut errs = Vec::new();
    if origins.iter().any(|o| o == "*") && origins.len() > 1 {
        errs.push("cors_allowed_origins: `*` allows every origin; give it alone".to_string());
    }
    for o in origins.iter().filter(|o| *o != "*") {
        let exact = o.parse::<http::Uri>().ok().and_then(|u| {
            let scheme = u.scheme_str().filter(|s| matches!(*s, "http" | "https"))?;
            let authority = u.authority()?;
            (*o == format!("{scheme}://{authority}")).then_some(())
        });
        if exact.is_none() {
            errs.push(format!(
                "cors_allowed_origins: {o:?} is not an origin (scheme://host[:port], no path \
                 or trailing slash) or `*`"
            ));
        }
    }
    errs
}

/// The store key: `explicit`, else derived from the transfer secret (`secret_file`, else
/// `MOONGATE_TRANSFER_SECRET_FILE`, else the per-user file, made on first use).
fn store_key(explicit: &Option<Secret>, secret_file: Option<&Path>) -> anyhow::Result<KeySet> {
    Ok(KeySet::single(
        store_secret(explicit, secret_file)?.expose(),
    ))
}

/// The store key itself, to send (see [`store_key`]).
fn store_secret(explicit: &Option<Secret>, secret_file: Option<&Path>) -> anyhow::Result<Secret> {
    if let Some(k) = explicit {
        return Ok(k.clone());
    }
    let secret = trust::ClusterSecret::resolve(secret_file)
        .context("the store key is derived from the transfer secret (or give --store-api-key)")?;
    Ok(Secret::new(secret.store_api_key()))
}

/// The keys in force for an admin key, `--insecure-open-admin`, client keys and a store
/// key: what `serve` and `master` share.
fn keys_in_force(
    admin: &Option<Secret>,
    open_admin: bool,
    client: Option<keys::ClientKeys>,
    store: Option<KeySet>,
) -> AuthSettings {
    let (client, tenants) = match client {
        Some(c) => (Some(c.keys), c.tenants.into()),
        None => (None, Default::default()),
    };
    AuthSettings {
        client,
        tenants,
        store,
        admin: admin.as_ref().map(|k| KeySet::single(k.expose())),
        open_admin,
    }
}

impl ServeConfig {
    /// The keys this configuration puts in force: the client keys file read now, the admin
    /// key, and `store` as the store key (`None` without a hosted master).
    pub fn auth_settings(
        &self,
        store: Option<KeySet>,
    ) -> Result<AuthSettings, keys::KeysFileError> {
        let client = match &self.client_api_keys_file {
            Some(path) => Some(keys::load_client_keys(path)?),
            None => None,
        };
        Ok(keys_in_force(
            &self.admin_api_key,
            self.insecure_open_admin,
            client,
            store,
        ))
    }

    /// The store key of the hosted master (see [`ServeConfig::store_api_key`]); reads or
    /// creates the transfer secret file unless the key is explicit.
    pub fn store_key(&self) -> anyhow::Result<KeySet> {
        store_key(&self.store_api_key, self.transfer_secret_file.as_deref())
    }

    /// The store key itself, as this gateway sends it to a master it follows
    /// (`--kv-l3-master-url`, or an HA member's leader).
    pub fn store_secret(&self) -> anyhow::Result<Secret> {
        store_secret(&self.store_api_key, self.transfer_secret_file.as_deref())
    }
}

impl MasterHostConfig {
    /// The keys `moongate master` puts in force, with `store` as the store key.
    pub fn auth_settings(&self, store: KeySet) -> AuthSettings {
        keys_in_force(
            &self.admin_api_key,
            self.insecure_open_admin,
            None,
            Some(store),
        )
    }

    /// The store key (see [`MasterHostConfig::store_api_key`]).
    pub fn store_key(&self) -> anyhow::Result<KeySet> {
        store_key(&self.store_api_key, self.transfer_secret_file.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cors_origins_are_exact_or_a_lone_star() {
        assert!(cors_problems(&["*".into()]).is_empty());
        assert!(
            cors_problems(&[
                "https://app.example.com".into(),
                "http://127.0.0.1:8080".into()
            ])
            .is_empty()
        );
        for bad in [
            &["*", "https://a.example"][..],
            &["https://a.example/"],
            &["https://a.example/path"],
            &["a.example"],
            &["ftp://a.example"],
            &[""],
        ] {
            let v: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
            assert!(!cors_problems(&v).is_empty(), "{bad:?} accepted");
        }
    }

    #[test]
    fn an_explicit_store_key_wins_and_the_derived_one_follows_the_secret_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let secret = trust::ClusterSecret::load_or_create(&path).unwrap();
        let derived = store_key(&None, Some(&path)).unwrap();
        assert_eq!(derived, KeySet::single(&secret.store_api_key()));
        let explicit = store_key(&Some(Secret::new("st0re")), Some(&path)).unwrap();
        assert_eq!(explicit, KeySet::single("st0re"));
        let missing = store_key(&None, Some(&dir.path().join("nope"))).unwrap_err();
        assert!(
            format!("{missing:#}").contains("--store-api-key"),
            "{missing:#}"
        );
    }
}
