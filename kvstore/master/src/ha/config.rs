//! Every setting of the HA master, with its default, in one place (the `[ha]` TOML table,
//! `--ha-*` flags and `MOONGATE_HA_*` variables of `moongate master` and `moongate serve`).
//! Always compiled, so a binary built without the `etcd` feature still parses `--ha` and
//! can say which feature it lacks.

use serde::{Deserialize, Serialize};

/// Environment variables, one per setting.
pub mod env {
    /// `--ha`.
    pub const ENABLED: &str = "MOONGATE_HA";
    /// `--etcd-endpoints`.
    pub const ETCD_ENDPOINTS: &str = "MOONGATE_HA_ETCD_ENDPOINTS";
    /// `--advertise-url`.
    pub const ADVERTISE_URL: &str = "MOONGATE_HA_ADVERTISE_URL";
    /// `--cluster-id`.
    pub const CLUSTER_ID: &str = "MOONGATE_HA_CLUSTER_ID";
    /// `--ha-lease-ttl-secs`.
    pub const LEASE_TTL_SECS: &str = "MOONGATE_HA_LEASE_TTL_SECS";
    /// `--ha-commit-timeout-ms`.
    pub const COMMIT_TIMEOUT_MS: &str = "MOONGATE_HA_COMMIT_TIMEOUT_MS";
    /// `--ha-max-txn-ops`.
    pub const MAX_TXN_OPS: &str = "MOONGATE_HA_MAX_TXN_OPS";
    /// `--ha-txns-in-flight`.
    pub const TXNS_IN_FLIGHT: &str = "MOONGATE_HA_TXNS_IN_FLIGHT";
    /// `--etcd-ca-cert`.
    pub const ETCD_CA_CERT: &str = "MOONGATE_HA_ETCD_CA_CERT";
    /// `--etcd-cert-file`.
    pub const ETCD_CERT_FILE: &str = "MOONGATE_HA_ETCD_CERT_FILE";
    /// `--etcd-key-file`.
    pub const ETCD_KEY_FILE: &str = "MOONGATE_HA_ETCD_KEY_FILE";
}

/// The HA master: leader election on an etcd lease, every durable change committed to etcd
/// before it is acknowledged (see `kvmaster::ha`, feature `etcd`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "HA master (etcd)")]
pub struct HaConfig {
    /// Run as one of several masters of a cluster, on etcd: one leader serves, the others
    /// stand by with the state loaded and redirect. Needs a binary built with the cargo
    /// feature `etcd`.
    #[arg(id = "ha.enabled", long = "ha", env = env::ENABLED, action = clap::ArgAction::SetTrue)]
    pub enabled: bool,
    /// etcd client URLs, comma-separated: `https://h1:2379,https://h2:2379` (TLS, with
    /// `--etcd-ca-cert` and a client certificate), or `http://...` (plain: keep etcd's
    /// client port on a network only the masters reach).
    #[arg(id = "ha.etcd_endpoints", long = "etcd-endpoints", env = env::ETCD_ENDPOINTS, value_name = "URLS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// PEM file of the CA that signed etcd's server certificates (`https://` endpoints).
    #[arg(id = "ha.etcd_ca_cert", long = "etcd-ca-cert", env = env::ETCD_CA_CERT, value_name = "PEM")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_ca_cert: Option<std::path::PathBuf>,
    /// PEM client certificate this master presents to etcd (`--client-cert-auth` on etcd);
    /// needs `--etcd-key-file`.
    #[arg(id = "ha.etcd_cert_file", long = "etcd-cert-file", env = env::ETCD_CERT_FILE, value_name = "PEM")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of `--etcd-cert-file`.
    #[arg(id = "ha.etcd_key_file", long = "etcd-key-file", env = env::ETCD_KEY_FILE, value_name = "PEM")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_key_file: Option<std::path::PathBuf>,
    /// The URL other masters redirect clients to while this one leads
    /// (`http://this-host:port`): it must reach this process from every client.
    #[arg(id = "ha.advertise_url", long = "advertise-url", env = env::ADVERTISE_URL, value_name = "URL",
        default_value_t = HaConfig::default().advertise_url)]
    pub advertise_url: String,
    /// Name of the cluster: masters with the same id (and etcd) elect one leader and share
    /// one state, under the etcd prefix `/moongate/<id>/`.
    #[arg(id = "ha.cluster_id", long = "cluster-id", env = env::CLUSTER_ID, value_name = "NAME",
        default_value_t = HaConfig::default().cluster_id)]
    pub cluster_id: String,
    /// TTL of the leader's etcd lease, in seconds: a dead leader is replaced within about
    /// this long (plus a moment to load the state). The default is chosen so that writes and
    /// reads are served again within 5 s of a leader's death (Mooncake's lease is 5 s); a leader that
    /// cannot reach etcd for this long steps down.
    #[arg(id = "ha.lease_ttl_secs", long = "ha-lease-ttl-secs", env = env::LEASE_TTL_SECS, value_name = "SECS",
        default_value_t = HaConfig::default().lease_ttl_secs)]
    pub lease_ttl_secs: u64,
    /// A change not committed to etcd within this long is answered 503 `UNAVAILABLE`
    /// (retryable; nothing acknowledged). Must be below the lease TTL.
    #[arg(id = "ha.commit_timeout_ms", long = "ha-commit-timeout-ms", env = env::COMMIT_TIMEOUT_MS, value_name = "MS",
        default_value_t = HaConfig::default().commit_timeout_ms)]
    pub commit_timeout_ms: u64,
    /// Most operations in one etcd transaction (group commit); etcd's own limit
    /// (`--max-txn-ops`) is 128 by default, and the fence takes none of them.
    #[arg(id = "ha.max_txn_ops", long = "ha-max-txn-ops", env = env::MAX_TXN_OPS, value_name = "N",
        default_value_t = HaConfig::default().max_txn_ops)]
    pub max_txn_ops: usize,
    /// etcd transactions under way at once (on disjoint keys; changes still turn durable
    /// in the order they were made).
    #[arg(id = "ha.txns_in_flight", long = "ha-txns-in-flight", env = env::TXNS_IN_FLIGHT, value_name = "N",
        default_value_t = HaConfig::default().txns_in_flight)]
    pub txns_in_flight: usize,
}

/// Most bytes of keys and values in one transaction: etcd refuses requests over 1.5 MiB.
pub const MAX_TXN_BYTES: usize = 1 << 20;

impl Default for HaConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            etcd_endpoints: Vec::new(),
            etcd_ca_cert: None,
            etcd_cert_file: None,
            etcd_key_file: None,
            advertise_url: String::new(),
            cluster_id: openapi::master::etcd::DEFAULT_CLUSTER_ID.to_owned(),
            lease_ttl_secs: 3,
            commit_timeout_ms: 1500,
            max_txn_ops: 128,
            txns_in_flight: 4,
        }
    }
}

impl HaConfig {
    /// Problems that keep an HA master from starting (none when HA is off).
    pub fn problems(&self) -> Vec<String> {
        let mut errs = Vec::new();
        if !self.enabled {
            return errs;
        }
        if self.etcd_endpoints.is_empty() {
            errs.push("--ha needs --etcd-endpoints".to_owned());
        }
        errs.extend(self.tls_problems());
        if !(self.advertise_url.starts_with("http://")
            || self.advertise_url.starts_with("https://"))
        {
            errs.push(
                "--ha needs --advertise-url http(s)://host:port (where clients reach this master)"
                    .to_owned(),
            );
        }
        if self.cluster_id.is_empty()
            || !self
                .cluster_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            errs.push("cluster_id must be non-empty letters, digits, '-', '_' or '.'".to_owned());
        }
        if self.lease_ttl_secs < 2 {
            errs.push("ha lease_ttl_secs must be at least 2".to_owned());
        }
        if self.commit_timeout_ms == 0 || self.commit_timeout_ms >= self.lease_ttl_secs * 1000 {
            errs.push("ha commit_timeout_ms must be positive and below the lease TTL".to_owned());
        }
        if !(1..=1024).contains(&self.max_txn_ops) {
            errs.push("ha max_txn_ops must be within 1..=1024".to_owned());
        }
        if !(1..=64).contains(&self.txns_in_flight) {
            errs.push("ha txns_in_flight must be within 1..=64".to_owned());
        }
        errs
    }

    /// The problem with starting HA in this binary: `None` with the `etcd` feature or when
    /// HA is off. Kept out of [`HaConfig::problems`] so that `--print-config` shows a
    /// configuration that a build with the feature runs.
    pub fn feature_problem(&self) -> Option<String> {
        (self.enabled && !cfg!(feature = "etcd")).then(|| {
            "--ha needs a binary built with the cargo feature `etcd` \
             (cargo build --release -p gateway --features etcd)"
                .to_owned()
        })
    }

    /// Whether the masters reach etcd over TLS (`https://` endpoints).
    pub fn etcd_tls(&self) -> bool {
        self.etcd_endpoints
            .iter()
            .any(|e| e.starts_with("https://"))
    }

    /// What is wrong with the endpoints' schemes and the TLS files.
    fn tls_problems(&self) -> Vec<String> {
        let mut errs = Vec::new();
        for e in &self.etcd_endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                errs.push(format!(
                    "etcd endpoint {e:?} must be https://host:port or http://host:port"
                ));
            }
        }
        let tls = self.etcd_tls();
        if tls && self.etcd_endpoints.iter().any(|e| e.starts_with("http://")) {
            errs.push("etcd endpoints must be all https:// or all http://".to_owned());
        }
        if tls && self.etcd_ca_cert.is_none() {
            errs.push(
                "https:// etcd endpoints need --etcd-ca-cert (the CA of etcd's certificates)"
                    .to_owned(),
            );
        }
        if self.etcd_cert_file.is_some() != self.etcd_key_file.is_some() {
            errs.push("--etcd-cert-file and --etcd-key-file go together".to_owned());
        }
        let files = self.etcd_ca_cert.is_some() || self.etcd_cert_file.is_some();
        if files && !tls {
            errs.push(
                "--etcd-ca-cert and --etcd-cert-file need https:// etcd endpoints".to_owned(),
            );
        }
        errs
    }

    /// The etcd key prefix of this cluster.
    pub fn prefix(&self) -> String {
        openapi::master::etcd::cluster_prefix(&self.cluster_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_off_and_ha_needs_its_settings() {
        assert!(HaConfig::default().problems().is_empty());
        let on = HaConfig {
            enabled: true,
            ..HaConfig::default()
        };
        let p = on.problems().join("; ");
        assert!(
            p.contains("--etcd-endpoints") && p.contains("--advertise-url"),
            "{p}"
        );
        let good = HaConfig {
            enabled: true,
            etcd_endpoints: vec!["http://127.0.0.1:2379".into()],
            advertise_url: "http://127.0.0.1:50051".into(),
            ..HaConfig::default()
        };
        assert!(good.problems().is_empty(), "{:?}", good.problems());
        assert_eq!(good.feature_problem().is_none(), cfg!(feature = "etcd"));
        assert!(HaConfig::default().feature_problem().is_none());
        assert_eq!(good.prefix(), "/moongate/default/");
        let tls = HaConfig {
            etcd_endpoints: vec!["https://127.0.0.1:2379".into()],
            ..good.clone()
        };
        assert!(
            tls.problems()[0].contains("--etcd-ca-cert"),
            "{:?}",
            tls.problems()
        );
        let tls = HaConfig {
            etcd_ca_cert: Some("ca.pem".into()),
            etcd_cert_file: Some("c.pem".into()),
            ..tls
        };
        assert!(
            tls.problems()[0].contains("go together"),
            "{:?}",
            tls.problems()
        );
        let tls = HaConfig {
            etcd_key_file: Some("c.key".into()),
            ..tls
        };
        assert!(
            tls.problems().is_empty() && tls.etcd_tls(),
            "{:?}",
            tls.problems()
        );
        let mixed = HaConfig {
            etcd_endpoints: vec!["https://a:1".into(), "http://b:1".into()],
            ..tls.clone()
        };
        assert!(
            mixed.problems()[0].contains("all https"),
            "{:?}",
            mixed.problems()
        );
        let plain_with_files = HaConfig {
            etcd_endpoints: vec!["http://a:1".into()],
            ..tls
        };
        assert!(plain_with_files.problems()[0].contains("need https"));
    }
}
