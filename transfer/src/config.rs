//! Engine configuration: every default of the transfer engine lives here (the bench CLI,
//! the docs and the crates embedding the engine read them from [`EngineConfig::default`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use trust::Secret;

use crate::error::{Result, TransferError};
use crate::wire::MAX_DATA_LEN;

/// A byte count as every Moongate size setting takes it: a number with an optional
/// suffix, `4096`, `64K`, `16M`, `4 GiB`, `1T`, each suffix binary whatever its spelling
/// (`16MB` is 16 MiB, as Mooncake reads its sizes), case-insensitive.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| format!("bad size {s:?}: {e}"))
}

/// Whether to use RDMA.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RdmaMode {
    /// Never (TCP and shared memory only).
    #[default]
    Off,
    /// Required: building the engine fails when no RDMA device is usable.
    On,
    /// When a device is usable; otherwise fall back to TCP (logged).
    Auto,
}

impl FromStr for RdmaMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "off" | "false" | "no" => Ok(RdmaMode::Off),
            "on" | "true" | "yes" => Ok(RdmaMode::On),
            "auto" => Ok(RdmaMode::Auto),
            other => Err(format!("unknown RDMA mode {other:?} (off, on, auto)")),
        }
    }
}

/// Where descriptors are published and fetched.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum MetadataConfig {
    /// Ask each peer over its TCP port; no central service (the default).
    #[default]
    P2p,
    /// Mooncake's HTTP metadata interface at `url` (e.g. `http://master:8080/metadata`, or
    /// `https://` with TLS).
    Http {
        /// Base URL, `http://` or `https://`.
        url: String,
        /// Sent as `Authorization: Bearer <key>` with every request, to `url` only: the KV
        /// master's store key. Default: the store key derived from the engine's cluster
        /// secret ([`crate::ClusterSecret::store_api_key`]), which a master holding the same
        /// secret accepts.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        api_key: Option<Secret>,
        /// PEM file of CA certificates trusted for an `https://` URL, on top of the system's
        /// trust roots.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ca_cert_file: Option<PathBuf>,
    },
}

impl MetadataConfig {
    /// Mooncake's HTTP interface at `url`, with the default key and the system's roots.
    pub fn http(url: impl Into<String>) -> Self {
        MetadataConfig::Http {
            url: url.into(),
            api_key: None,
            ca_cert_file: None,
        }
    }
}

impl FromStr for MetadataConfig {
    type Err = String;
    /// `p2p` (or Mooncake's `P2PHANDSHAKE`), or an `http://` / `https://` URL.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s.eq_ignore_ascii_case("p2p") || s == "P2PHANDSHAKE" {
            Ok(MetadataConfig::P2p)
        } else if s.starts_with("http://") || s.starts_with("https://") {
            Ok(MetadataConfig::http(s))
        } else {
            Err(format!(
                "metadata must be `p2p` or an http:// or https:// URL, not {s:?}"
            ))
        }
    }
}

/// Configuration of a `TransferEngine`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// TCP listen address (data, control and peer-to-peer metadata).
    pub listen: SocketAddr,
    /// Host peers should connect to; default: the listen IP, or this host's primary IP when
    /// listening on the unspecified address.
    pub advertise_host: Option<String>,
    /// Segment name; default `advertise_host:port`.
    pub segment_name: Option<String>,
    /// Descriptor publication and lookup.
    pub metadata: MetadataConfig,
    /// TCP connections per peer.
    pub lanes_per_peer: usize,
    /// Requests larger than this are cut into slices of this size, spread over lanes.
    pub slice_size: usize,
    /// Frames in flight per lane before submitters wait (backpressure).
    pub max_inflight_per_lane: usize,
    /// Time a request may take from submission to completion.
    #[serde(with = "duration_text")]
    pub request_timeout: Duration,
    /// Time to establish a TCP connection.
    #[serde(with = "duration_text")]
    pub connect_timeout: Duration,
    /// A connection with requests outstanding and no progress this long is declared dead.
    #[serde(with = "duration_text")]
    pub io_timeout: Duration,
    /// Use the shared-memory transport with same-host peers, and allocate `alloc`ed buffers
    /// as shared memory so same-host peers can use it on them.
    pub shm: bool,
    /// RDMA use.
    pub rdma: RdmaMode,
    /// RDMA devices to use (empty: all).
    pub rdma_devices: Vec<String>,
    /// GID index used on RoCE ports (ignored on InfiniBand, which routes by LID).
    pub rdma_gid_index: u8,
    /// Slice size of RDMA requests (slices are spread over device pairs).
    pub rdma_slice_size: usize,
    /// How long a fetched descriptor is trusted without a failure.
    #[serde(with = "duration_text")]
    pub descriptor_ttl: Duration,
    /// Capacity of the incoming notification queue.
    pub notification_queue: usize,
    /// How long `shutdown` waits for in-flight requests.
    #[serde(with = "duration_text")]
    pub drain_timeout: Duration,
    /// The cluster secret file peers authenticate with (see [`crate::auth`]); default:
    /// the file `MOONGATE_TRANSFER_SECRET_FILE` names, else the per-user file
    /// `$XDG_CONFIG_HOME/moongate/transfer-secret`, created on first use.
    pub transfer_secret_file: Option<PathBuf>,
    /// Bytes of one pinned staging buffer that device memory passes through on the TCP path
    /// (requests with device memory on this side are sliced to it).
    pub device_staging_chunk: usize,
    /// Most pinned staging memory one peer may hold at once, as initiator and as target
    /// (each role has a budget of its own: see `device_staging_total`).
    pub device_staging_per_peer: usize,
    /// Most pinned staging memory all peers together may hold at once in one role: this
    /// engine's requests have this much, and peers' requests to it as much again, so two
    /// engines moving device memory to each other never wait on each other's buffers.
    pub device_staging_total: usize,
    /// Export CUDA IPC handles of registered device memory, and open same-host peers' ones
    /// (else same-host device traffic is staged over TCP).
    pub device_ipc: bool,
    /// The CUDA driver library to load when device memory is registered; default: the
    /// dynamic loader's `libcuda.so.1`.
    pub cuda_library: Option<PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 0)),
            advertise_host: None,
            segment_name: None,
            metadata: MetadataConfig::P2p,
            lanes_per_peer: 2,
            slice_size: 1 << 20,
            max_inflight_per_lane: 256,
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(10),
            shm: true,
            rdma: RdmaMode::Off,
            rdma_devices: Vec::new(),
            rdma_gid_index: 3,
            rdma_slice_size: 64 << 10,
            descriptor_ttl: Duration::from_secs(300),
            notification_queue: 4096,
            drain_timeout: Duration::from_secs(10),
            transfer_secret_file: None,
            device_staging_chunk: 1 << 20,
            device_staging_per_peer: 64 << 20,
            device_staging_total: 1 << 30,
            device_ipc: true,
            cuda_library: None,
        }
    }
}

impl EngineConfig {
    /// A default configuration listening on `listen` (tests use `127.0.0.1:0`).
    pub fn listening_on(listen: SocketAddr) -> Self {
        Self {
            listen,
            ..Self::default()
        }
    }

    /// Checks values before use.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(TransferError::invalid(format!("engine config: {what}")));
        if self.lanes_per_peer == 0 || self.lanes_per_peer > 64 {
            return bad(format!(
                "lanes_per_peer must be 1..=64, not {}",
                self.lanes_per_peer
            ));
        }
        if self.slice_size == 0 || self.slice_size as u64 > MAX_DATA_LEN {
            return bad(format!(
                "slice_size must be 1..={MAX_DATA_LEN}, not {}",
                self.slice_size
            ));
        }
        if self.rdma_slice_size == 0 || self.rdma_slice_size > 1 << 30 {
            return bad(format!(
                "rdma_slice_size must be 1..=1 GiB, not {}",
                self.rdma_slice_size
            ));
        }
        if self.max_inflight_per_lane == 0 {
            return bad("max_inflight_per_lane must be at least 1".into());
        }
        if self.device_staging_chunk < 4096 || self.device_staging_chunk as u64 > MAX_DATA_LEN {
            return bad(format!(
                "device_staging_chunk must be 4 KiB..={MAX_DATA_LEN}, not {}",
                self.device_staging_chunk
            ));
        }
        if self.device_staging_per_peer < self.device_staging_chunk {
            return bad(format!(
                "device_staging_per_peer ({}) must hold at least one device_staging_chunk ({})",
                self.device_staging_per_peer, self.device_staging_chunk
            ));
        }
        if self.device_staging_total < self.device_staging_per_peer {
            return bad(format!(
                "device_staging_total ({}) must hold at least device_staging_per_peer ({})",
                self.device_staging_total, self.device_staging_per_peer
            ));
        }
        if self.notification_queue == 0 {
            return bad("notification_queue must be at least 1".into());
        }
        for (name, d) in [
            ("request_timeout", self.request_timeout),
            ("connect_timeout", self.connect_timeout),
            ("io_timeout", self.io_timeout),
        ] {
            if d.is_zero() {
                return bad(format!("{name} must be positive"));
            }
        }
        Ok(())
    }
}

/// Durations as human-readable text in config files (`"30s"`, `"250ms"`).
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_take_every_suffix_as_binary() {
        let cases = [
            ("4096", 4096),
            ("64K", 64 << 10),
            ("64k", 64 << 10),
            ("16MB", 16 << 20),
            ("16 MiB", 16 << 20),
            (" 4G ", 4 << 30),
            ("1T", 1 << 40),
        ];
        for (s, n) in cases {
            assert_eq!(super::parse_size(s), Ok(n), "{s}");
        }
        for bad in ["", "12Q", "-1", "M"] {
            assert!(super::parse_size(bad).is_err(), "{bad}");
        }
    }

    use super::*;

    #[test]
    fn defaults_validate_and_round_trip_through_json() {
        let c = EngineConfig::default();
        c.validate().unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"request_timeout\":\"30s\""), "{json}");
        let back: EngineConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        let partial: EngineConfig = serde_json::from_str(
            r#"{"lanes_per_peer":4,"metadata":{"kind":"http","url":"http://m:8080/metadata"}}"#,
        )
        .unwrap();
        assert_eq!(partial.lanes_per_peer, 4);
        assert_eq!(
            partial.metadata,
            MetadataConfig::http("http://m:8080/metadata")
        );
        assert!(serde_json::from_str::<EngineConfig>(r#"{"lanes":4}"#).is_err());
    }

    #[test]
    fn secrets_are_hidden_from_debug_and_kept_by_serde() {
        let s = Secret::new("k-123");
        assert_eq!(format!("{s:?}"), "Secret(<hidden>)");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"k-123\"");
        assert_eq!(serde_json::from_str::<Secret>("\"k-123\"").unwrap(), s);
        assert_eq!("k-123".parse::<Secret>().unwrap().expose(), "k-123");
    }

    #[test]
    fn http_metadata_options_are_optional_and_the_key_hidden() {
        let m = MetadataConfig::Http {
            url: "https://m/metadata".into(),
            api_key: Some(Secret::new("k-42")),
            ca_cert_file: Some("/etc/ca.pem".into()),
        };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"http","url":"https://m/metadata","api_key":"k-42","ca_cert_file":"/etc/ca.pem"}"#
        );
        assert_eq!(serde_json::from_str::<MetadataConfig>(&json).unwrap(), m);
        assert!(!format!("{m:?}").contains("k-42"));
        // Without the options, the encoding is the one older configurations hold.
        let plain = MetadataConfig::http("http://m/metadata");
        assert_eq!(
            serde_json::to_string(&plain).unwrap(),
            r#"{"kind":"http","url":"http://m/metadata"}"#
        );
    }

    #[test]
    fn invalid_values_are_refused() {
        for c in [
            EngineConfig {
                lanes_per_peer: 0,
                ..Default::default()
            },
            EngineConfig {
                slice_size: 0,
                ..Default::default()
            },
            EngineConfig {
                slice_size: (MAX_DATA_LEN + 1) as usize,
                ..Default::default()
            },
            EngineConfig {
                io_timeout: Duration::ZERO,
                ..Default::default()
            },
            EngineConfig {
                device_staging_chunk: 100,
                ..Default::default()
            },
            EngineConfig {
                device_staging_per_peer: 1 << 19,
                ..Default::default()
            },
            EngineConfig {
                device_staging_total: 1 << 20,
                ..Default::default()
            },
        ] {
            assert!(c.validate().is_err());
        }
    }

    #[test]
    fn modes_parse() {
        assert_eq!("auto".parse::<RdmaMode>().unwrap(), RdmaMode::Auto);
        assert!("maybe".parse::<RdmaMode>().is_err());
        assert_eq!(
            "P2PHANDSHAKE".parse::<MetadataConfig>().unwrap(),
            MetadataConfig::P2p
        );
        assert!(matches!(
            "http://h:1/metadata".parse::<MetadataConfig>().unwrap(),
            MetadataConfig::Http { .. }
        ));
        assert_eq!(
            "https://h:1/metadata".parse::<MetadataConfig>().unwrap(),
            MetadataConfig::http("https://h:1/metadata")
        );
        assert!("etcd://h".parse::<MetadataConfig>().is_err());
    }
}
