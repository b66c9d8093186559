//! [`ClientConfig`]: every setting of a store client, each default written once here (the
//! CLI of `moongate store`, `Default`, serde and the docs all read these constants).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use transfer::{EngineConfig, MetadataConfig, RdmaMode};

use super::error::{StoreError, StoreResult};
use trust::Secret;

/// Environment variables, one per setting (`MOONGATE_STORE_` + the field name in capitals).
pub mod env {
    /// `--master`.
    pub const MASTER: &str = "MOONGATE_STORE_MASTER";
    /// `--segment-size`.
    pub const SEGMENT_SIZE: &str = "MOONGATE_STORE_SEGMENT_SIZE";
    /// `--local-buffer-size`.
    pub const LOCAL_BUFFER_SIZE: &str = "MOONGATE_STORE_LOCAL_BUFFER_SIZE";
    /// `--hugepages`.
    pub const HUGEPAGES: &str = "MOONGATE_STORE_HUGEPAGES";
    /// `--disk-path`.
    pub const DISK_PATH: &str = "MOONGATE_STORE_DISK_PATH";
    /// `--disk-capacity`.
    pub const DISK_CAPACITY: &str = "MOONGATE_STORE_DISK_CAPACITY";
    /// `--disk-write-policy`.
    pub const DISK_WRITE_POLICY: &str = "MOONGATE_STORE_DISK_WRITE_POLICY";
    /// `--prefault`.
    pub const PREFAULT: &str = "MOONGATE_STORE_PREFAULT";
    /// `--listen`.
    pub const LISTEN: &str = "MOONGATE_STORE_LISTEN";
    /// `--advertise-host`.
    pub const ADVERTISE_HOST: &str = "MOONGATE_STORE_ADVERTISE_HOST";
    /// `--protocol`.
    pub const PROTOCOL: &str = "MOONGATE_STORE_PROTOCOL";
    /// `--metadata`.
    pub const METADATA: &str = "MOONGATE_STORE_METADATA";
    /// `--replica-num`.
    pub const REPLICA_NUM: &str = "MOONGATE_STORE_REPLICA_NUM";
    /// `--heartbeat-interval-ms`.
    pub const HEARTBEAT_INTERVAL_MS: &str = "MOONGATE_STORE_HEARTBEAT_INTERVAL_MS";
    /// `--rpc-timeout-ms`.
    pub const RPC_TIMEOUT_MS: &str = "MOONGATE_STORE_RPC_TIMEOUT_MS";
    /// `--rpc-busy-poll-us`.
    pub const RPC_BUSY_POLL_US: &str = "MOONGATE_STORE_RPC_BUSY_POLL_US";
    /// `--put-reserve-bytes`.
    pub const PUT_RESERVE_BYTES: &str = "MOONGATE_STORE_PUT_RESERVE_BYTES";
    /// `--store-api-key`: the same variable `moongate serve` and `moongate master` read for
    /// the store key they accept, so one environment configures both ends.
    pub const STORE_API_KEY: &str = "MOONGATE_STORE_API_KEY";
    /// `--transfer-secret-file`: the variable the transfer engine itself reads.
    pub const TRANSFER_SECRET_FILE: &str = trust::SECRET_FILE_ENV;
    /// `--master-ca-cert`.
    pub const MASTER_CA_CERT: &str = "MOONGATE_STORE_MASTER_CA_CERT";
    /// `--http-listen` (storage node).
    pub const HTTP_LISTEN: &str = "MOONGATE_STORE_HTTP_LISTEN";
    /// `--otlp-traces-endpoint` (storage node).
    pub const OTLP_TRACES_ENDPOINT: &str = "MOONGATE_STORE_OTLP_TRACES_ENDPOINT";
}

/// Default master URL: the gateway's default address, which hosts the master.
pub const DEFAULT_MASTER: &str = "http://127.0.0.1:30000";
/// Default segment contributed to the store (SGLang's Mooncake default, 4 GiB).
pub const DEFAULT_SEGMENT_SIZE: &str = "4G";
/// Default registered copy buffer for `put` / `get` (the zero-copy forms need none).
pub const DEFAULT_LOCAL_BUFFER_SIZE: &str = "64M";
/// Default transfer listen address (any interface, any port; the port is published).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:0";
/// Default replicas per put.
pub const DEFAULT_REPLICA_NUM: u32 = 1;
/// Default `--disk-capacity`.
pub const DEFAULT_DISK_CAPACITY: &str = "64G";
/// Default heartbeat period (Mooncake pings every second).
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 1000;
/// Default time a master request may take.
pub const DEFAULT_RPC_TIMEOUT_MS: u64 = 10_000;
/// Default `rpc_busy_poll_us`: [`transfer::busy_poll::DEFAULT_BUSY_POLL_US`].
pub const DEFAULT_RPC_BUSY_POLL_US: u64 = transfer::busy_poll::DEFAULT_BUSY_POLL_US;
/// Default `put_reserve_bytes`: 64 MiB.
pub const DEFAULT_PUT_RESERVE_BYTES: u64 = 64 << 20;

/// How the client moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Shared memory with same-host peers, RDMA when a device is usable, TCP otherwise.
    #[default]
    Auto,
    /// TCP only (no shared memory, no RDMA), Mooncake's `tcp` protocol.
    Tcp,
    /// RDMA required (shared memory still used on one host); fails without a device.
    Rdma,
}

/// When the segment and the copy buffer are faulted in (the kernel's first touch of each
/// page: zeroing and mapping it, ~0.25 ms per MiB here, which a first write would otherwise
/// pay on its path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Prefault {
    /// On a background thread right after start (the client serves at once; its resident
    /// memory reaches the segment plus twice the copy buffer size within about a second per
    /// few GiB). A storage node mounts its segment once it is resident, so its first
    /// writers meet warm memory; it answers `/health` (unmounted) meanwhile.
    #[default]
    Background,
    /// Before the client starts (`MAP_POPULATE`): start-up takes that second.
    #[value(alias = "true")]
    Start,
    /// On first touch (resident memory grows only with use; first writes are slower).
    #[value(alias = "false")]
    Off,
}

/// When the disk tier writes a value (`--disk-write-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DiskWritePolicy {
    /// When the master evicts it from the segment: only values that leave memory cost a
    /// write, but one in memory is lost with the process.
    #[default]
    OffloadOnEvict,
    /// As soon as it is complete (Mooncake's `enable_ssd_offload` without the master's
    /// `offload_on_evict`): every value costs a write, eviction then frees memory at once,
    /// and a killed process loses no value that reached the disk.
    WriteThrough,
}

/// `prefault = true / false` (the setting was once a switch) or a name.
impl<'de> Deserialize<'de> for Prefault {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Switch(bool),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Switch(true) => Ok(Self::Start),
            Raw::Switch(false) => Ok(Self::Off),
            Raw::Name(n) => <Self as clap::ValueEnum>::from_str(&n, true).map_err(|_| {
                serde::de::Error::custom(format!("prefault {n:?}: background, start or off"))
            }),
        }
    }
}

/// A byte count written with an optional binary suffix (the one parser of every size
/// setting, the transfer crate's).
pub use transfer::parse_size;

fn size(s: &str) -> u64 {
    parse_size(s).expect("default sizes parse")
}

/// Settings of a store client (and of the storage node, which is a client with a segment).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// Base URL of the KV master (`moongate serve` hosts it); for an HA cluster, every
    /// master's URL, comma-separated (calls follow the leader), or
    /// `etcd://h1:2379,h2:2379[/cluster]` to read them from the cluster's etcd at start
    /// (a build with the cargo feature `etcd`).
    #[arg(long = "master", env = env::MASTER, default_value = DEFAULT_MASTER)]
    pub master: String,
    /// Bytes of memory this node contributes to the store as its segment (0: a pure
    /// client that only reads and writes others' segments). Suffixes K, M, G, T.
    #[arg(long, env = env::SEGMENT_SIZE, default_value = DEFAULT_SEGMENT_SIZE, value_parser = parse_size)]
    pub segment_size: u64,
    /// Registered copy buffer used by `put` and `get` (values that do not fit get a
    /// temporary buffer); also the most idle memory kept for copying reads' values.
    /// Suffixes K, M, G.
    #[arg(long, env = env::LOCAL_BUFFER_SIZE, default_value = DEFAULT_LOCAL_BUFFER_SIZE, value_parser = parse_size)]
    pub local_buffer_size: u64,
    /// Back the segment with huge pages (needs pages reserved in /proc/sys/vm/nr_hugepages).
    #[arg(long, env = env::HUGEPAGES)]
    pub hugepages: bool,
    /// A directory for the disk tier below the segment: values the master evicts from the
    /// segment are written there instead of being lost, and read back when asked for; a
    /// restart on the same directory serves them again. Created 0700; an existing one must
    /// belong to this user and not be writable by others. Needs `--segment-size > 0`.
    #[arg(long, env = env::DISK_PATH)]
    pub disk_path: Option<PathBuf>,
    /// Most bytes of records the disk tier holds (the least recently used go first).
    /// Suffixes K, M, G, T.
    #[arg(long, env = env::DISK_CAPACITY, default_value = DEFAULT_DISK_CAPACITY, value_parser = parse_size)]
    pub disk_capacity: u64,
    /// When the disk tier writes a value: `offload-on-evict` (when the master evicts it
    /// from the segment) or `write-through` (as soon as it is complete).
    #[arg(long, env = env::DISK_WRITE_POLICY, value_enum, default_value_t = DiskWritePolicy::OffloadOnEvict)]
    pub disk_write_policy: DiskWritePolicy,
    /// When the segment, the copy buffer and a buffer of the same size for copying reads'
    /// values (not on a storage node) are faulted in: `background` (right after start, off
    /// the data path), `start` (before serving; a bare `--prefault`) or `off` (on first
    /// touch). Either of the first two makes their whole size resident.
    #[arg(long, env = env::PREFAULT, value_enum, default_value_t = Prefault::Background,
        num_args = 0..=1, default_missing_value = "start")]
    pub prefault: Prefault,
    /// Transfer engine listen address (data from and to peers).
    #[arg(long, env = env::LISTEN, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Host peers should connect to (default: the listen IP, or this host's primary IP).
    #[arg(long, env = env::ADVERTISE_HOST)]
    pub advertise_host: Option<String>,
    /// Transport: auto (shared memory on one host, RDMA if present, else TCP), tcp, rdma.
    #[arg(long, env = env::PROTOCOL, value_enum, default_value_t = Protocol::Auto)]
    pub protocol: Protocol,
    /// Where transfer descriptors are found: `p2p` (asked of each peer) or Mooncake's
    /// HTTP metadata URL (the master serves one at `{master}/metadata`).
    #[arg(long, env = env::METADATA, default_value = "p2p")]
    pub metadata: String,
    /// Replicas per put, on distinct segments (best effort).
    #[arg(long, env = env::REPLICA_NUM, default_value_t = DEFAULT_REPLICA_NUM)]
    pub replica_num: u32,
    /// Heartbeat period, ms.
    #[arg(long, env = env::HEARTBEAT_INTERVAL_MS, default_value_t = DEFAULT_HEARTBEAT_INTERVAL_MS)]
    pub heartbeat_interval_ms: u64,
    /// Longest a master request may take, ms.
    #[arg(long, env = env::RPC_TIMEOUT_MS, default_value_t = DEFAULT_RPC_TIMEOUT_MS)]
    pub rpc_timeout_ms: u64,
    /// How long a master call polls for its answer before its thread sleeps, µs (0: sleep
    /// at once). Polling saves the wake-up (tens of µs on virtual machines) on each small
    /// call; it adapts, so a master that answers slower than this costs little. See
    /// `transfer::busy_poll`.
    #[arg(long, env = env::RPC_BUSY_POLL_US, default_value_t = DEFAULT_RPC_BUSY_POLL_US)]
    pub rpc_busy_poll_us: u64,
    /// Most bytes of segment space this client holds reserved for its next puts, so that a
    /// put of a value up to a sixteenth of this is one master request (a commit) instead of
    /// two (put-start, put-end). Reserved space is asked for along with other put requests,
    /// used within a tenth of the master's `reservation_ttl_ms`, and released by the master
    /// at the end of that TTL when unused. 0: every put takes two requests. Supports K/M/G.
    #[arg(long, env = env::PUT_RESERVE_BYTES, value_parser = parse_size, default_value_t = DEFAULT_PUT_RESERVE_BYTES)]
    pub put_reserve_bytes: u64,
    /// The cluster secret file: transfer peers prove they hold it, and the store key is
    /// derived from it. Default: the file `MOONGATE_TRANSFER_SECRET_FILE` names, else the
    /// per-user `~/.config/moongate/transfer-secret` (created 0600 on first use), which
    /// every process of this user on this host shares.
    #[arg(long, env = env::TRANSFER_SECRET_FILE)]
    pub transfer_secret_file: Option<PathBuf>,
    /// The master's store key (its `--store-api-key`), sent as `Authorization: Bearer` with
    /// every call of the store plane (mount, ping, objects, `/metadata`), to the master URL
    /// only. Default: the key derived from the cluster secret, which a master holding the
    /// same secret accepts.
    #[arg(long, env = env::STORE_API_KEY, hide_env_values = true)]
    pub store_api_key: Option<Secret>,
    /// PEM file of CA certificates trusted for an `https://` master (and metadata) URL, on
    /// top of the system's trust roots.
    #[arg(long, env = env::MASTER_CA_CERT)]
    pub master_ca_cert: Option<PathBuf>,
    /// The master's admin key (its `--admin-api-key`), sent only with the admin plane's
    /// calls a client makes ([`crate::StoreClient::remove_all`]); the store plane never
    /// needs it. Not a flag: storage nodes have no use for it.
    #[arg(skip)]
    pub admin_api_key: Option<Secret>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            master: DEFAULT_MASTER.to_owned(),
            segment_size: size(DEFAULT_SEGMENT_SIZE),
            local_buffer_size: size(DEFAULT_LOCAL_BUFFER_SIZE),
            hugepages: false,
            disk_path: None,
            disk_capacity: size(DEFAULT_DISK_CAPACITY),
            disk_write_policy: DiskWritePolicy::OffloadOnEvict,
            prefault: Prefault::Background,
            listen: DEFAULT_LISTEN.parse().expect("default listen parses"),
            advertise_host: None,
            protocol: Protocol::Auto,
            metadata: "p2p".to_owned(),
            replica_num: DEFAULT_REPLICA_NUM,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            rpc_timeout_ms: DEFAULT_RPC_TIMEOUT_MS,
            rpc_busy_poll_us: DEFAULT_RPC_BUSY_POLL_US,
            put_reserve_bytes: DEFAULT_PUT_RESERVE_BYTES,
            transfer_secret_file: None,
            store_api_key: None,
            master_ca_cert: None,
            admin_api_key: None,
        }
    }
}

impl ClientConfig {
    /// A default client of the master at `master`, listening on loopback (tests, benches).
    pub fn local(master: &str, segment_size: u64) -> Self {
        Self {
            master: master.to_owned(),
            segment_size,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..Self::default()
        }
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> StoreResult<()> {
        let bad = |m: String| Err(StoreError::InvalidArgument(m));
        if self.local_buffer_size < 4096 || self.local_buffer_size > 1 << 40 {
            return bad(format!(
                "local_buffer_size must be within 4 KiB..=1 TiB, not {}",
                self.local_buffer_size
            ));
        }
        if self.segment_size > 1 << 50 {
            return bad(format!("segment_size {} is too large", self.segment_size));
        }
        if self.disk_path.is_some() && (self.segment_size == 0 || self.disk_capacity == 0) {
            return bad(
                "a disk tier (disk_path) needs segment_size > 0 and disk_capacity > 0".into(),
            );
        }
        if self.replica_num == 0 {
            return bad("replica_num must be at least 1".into());
        }
        if self.heartbeat_interval_ms == 0 || self.rpc_timeout_ms == 0 {
            return bad("heartbeat_interval_ms and rpc_timeout_ms must be positive".into());
        }
        if let Some(p) =
            transfer::busy_poll::window_problem("rpc_busy_poll_us", self.rpc_busy_poll_us)
        {
            return bad(p);
        }
        MetadataConfig::from_str(&self.metadata).map_err(StoreError::InvalidArgument)?;
        if !crate::discover::is_etcd_url(&self.master) {
            super::rpc::master_urls(&self.master)?;
        }
        for (name, key) in [
            ("store_api_key", &self.store_api_key),
            ("admin_api_key", &self.admin_api_key),
        ] {
            if key.as_ref().is_some_and(|k| !is_bearer_token(k.expose())) {
                return bad(format!(
                    "{name} must be non-empty visible ASCII without spaces"
                ));
            }
        }
        if let Some(ca) = &self.master_ca_cert {
            trust::tls::ca_certificates(ca)
                .map_err(|e| StoreError::InvalidArgument(format!("master_ca_cert: {e}")))?;
        }
        Ok(())
    }

    /// These settings with every secret replaced by `<hidden>` (what `--print-config`
    /// shows).
    pub fn redacted(&self) -> Self {
        let hide = |k: &Option<Secret>| k.as_ref().map(|_| Secret::new("<hidden>"));
        Self {
            store_api_key: hide(&self.store_api_key),
            admin_api_key: hide(&self.admin_api_key),
            ..self.clone()
        }
    }

    /// Heartbeat period.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }

    /// Master request timeout.
    pub fn rpc_timeout(&self) -> Duration {
        Duration::from_millis(self.rpc_timeout_ms)
    }

    /// How long a master call polls for its answer.
    pub fn rpc_busy_poll(&self) -> Duration {
        Duration::from_micros(self.rpc_busy_poll_us)
    }

    /// The transfer engine configuration these settings imply.
    /// An HTTP metadata service gets the store key and the master's CA: it is the
    /// master's `/metadata` (or a server trusted like it).
    pub fn engine_config(&self) -> StoreResult<EngineConfig> {
        let metadata =
            match MetadataConfig::from_str(&self.metadata).map_err(StoreError::InvalidArgument)? {
                MetadataConfig::Http { url, .. } => MetadataConfig::Http {
                    url,
                    api_key: self.store_api_key.clone(),
                    ca_cert_file: self.master_ca_cert.clone(),
                },
                p2p => p2p,
            };
        Ok(EngineConfig {
            listen: self.listen,
            advertise_host: self.advertise_host.clone(),
            metadata,
            shm: self.protocol != Protocol::Tcp,
            rdma: match self.protocol {
                Protocol::Auto => RdmaMode::Auto,
                Protocol::Tcp => RdmaMode::Off,
                Protocol::Rdma => RdmaMode::On,
            },
            transfer_secret_file: self.transfer_secret_file.clone(),
            ..EngineConfig::default()
        })
    }
}

/// Whether `key` can be sent as `Authorization: Bearer <key>` as it is.
fn is_bearer_token(key: &str) -> bool {
    !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        c: ClientConfig,
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size(" 4g "), Ok(4 << 30));
        assert!(parse_size("4X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn cli_defaults_equal_the_struct_defaults() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.c, ClientConfig::default());
        ClientConfig::default().validate().unwrap();
        let json = serde_json::to_string(&ClientConfig::default()).unwrap();
        assert_eq!(
            serde_json::from_str::<ClientConfig>(&json).unwrap(),
            ClientConfig::default()
        );
        let cli = Cli::try_parse_from(["x", "--segment-size", "1G", "--protocol", "tcp"]).unwrap();
        assert_eq!(cli.c.segment_size, 1 << 30);
        assert!(!cli.c.engine_config().unwrap().shm);
    }

    #[test]
    fn keys_secret_file_and_ca_reach_the_engine_and_never_print() {
        let cli = Cli::try_parse_from([
            "x",
            "--transfer-secret-file",
            "/run/secrets/cluster",
            "--store-api-key",
            "s-key-1",
            "--metadata",
            "https://m:1/metadata",
            "--master-ca-cert",
            "/etc/ca.pem",
        ])
        .unwrap();
        let e = cli.c.engine_config().unwrap();
        assert_eq!(
            e.transfer_secret_file.as_deref(),
            Some(std::path::Path::new("/run/secrets/cluster"))
        );
        assert_eq!(
            e.metadata,
            MetadataConfig::Http {
                url: "https://m:1/metadata".into(),
                api_key: Some(Secret::new("s-key-1")),
                ca_cert_file: Some("/etc/ca.pem".into()),
            }
        );
        assert!(!format!("{:?}", cli.c).contains("s-key-1"));
        let shown = ClientConfig {
            admin_api_key: Some(Secret::new("a-key-1")),
            ..cli.c.redacted()
        }
        .redacted();
        let json = serde_json::to_string(&shown).unwrap();
        assert!(
            !json.contains("s-key-1") && !json.contains("a-key-1"),
            "{json}"
        );
        assert!(json.contains("\"store_api_key\":\"<hidden>\""), "{json}");
        // The admin key is no flag: a storage node never holds it.
        assert!(Cli::try_parse_from(["x", "--admin-api-key", "k"]).is_err());
        assert!(Cli::try_parse_from(["x", "--master-api-key", "k"]).is_err());
        // Without an explicit key the engine derives it (none is configured here).
        let plain = ClientConfig {
            metadata: "http://m:1/metadata".into(),
            ..ClientConfig::default()
        };
        assert_eq!(
            plain.engine_config().unwrap().metadata,
            MetadataConfig::Http {
                url: "http://m:1/metadata".into(),
                api_key: None,
                ca_cert_file: None,
            }
        );
    }

    #[test]
    fn bad_values_are_refused() {
        for c in [
            ClientConfig {
                replica_num: 0,
                ..ClientConfig::default()
            },
            ClientConfig {
                local_buffer_size: 1,
                ..ClientConfig::default()
            },
            ClientConfig {
                metadata: "etcd://x".into(),
                ..ClientConfig::default()
            },
            ClientConfig {
                master: "ftp://m:1".into(),
                ..ClientConfig::default()
            },
            ClientConfig {
                store_api_key: Some(Secret::new("two words")),
                ..ClientConfig::default()
            },
            ClientConfig {
                admin_api_key: Some(Secret::new("")),
                ..ClientConfig::default()
            },
            ClientConfig {
                master_ca_cert: Some("/nonexistent/ca.pem".into()),
                ..ClientConfig::default()
            },
            ClientConfig {
                rpc_busy_poll_us: transfer::busy_poll::MAX_BUSY_POLL_US + 1,
                ..ClientConfig::default()
            },
        ] {
            assert!(c.validate().is_err(), "{c:?}");
        }
        let https = ClientConfig {
            master: "https://m:1".into(),
            ..ClientConfig::default()
        };
        https.validate().unwrap();
    }
}
