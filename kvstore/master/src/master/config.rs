//! Every tunable of the master, with its default, in one place. The gateway's CLI (flags,
//! `MOONGATE_MASTER_*` environment, `[master]` TOML table), the docs and deploy/ read the
//! defaults from here.

use serde::{Deserialize, Serialize};

use super::{MasterError, MasterResult};

/// Environment variables, one per setting (`MOONGATE_MASTER_` + the field name in capitals).
/// Hosts that read settings from the environment (`moongate serve`, `moongate master`) use
/// these; flags are `--master-` + the field name in kebab case; TOML keys sit in a `[master]`
/// table.
pub mod env {
    /// `--master-lease-ttl-ms`.
    pub const LEASE_TTL_MS: &str = "MOONGATE_MASTER_LEASE_TTL_MS";
    /// `--master-client-ttl-ms`.
    pub const CLIENT_TTL_MS: &str = "MOONGATE_MASTER_CLIENT_TTL_MS";
    /// `--master-put-start-discard-timeout-ms`.
    pub const PUT_START_DISCARD_TIMEOUT_MS: &str = "MOONGATE_MASTER_PUT_START_DISCARD_TIMEOUT_MS";
    /// `--master-put-start-release-timeout-ms`.
    pub const PUT_START_RELEASE_TIMEOUT_MS: &str = "MOONGATE_MASTER_PUT_START_RELEASE_TIMEOUT_MS";
    /// `--master-reservation-ttl-ms`.
    pub const RESERVATION_TTL_MS: &str = "MOONGATE_MASTER_RESERVATION_TTL_MS";
    /// `--master-reservation-max-bytes`.
    pub const RESERVATION_MAX_BYTES: &str = "MOONGATE_MASTER_RESERVATION_MAX_BYTES";
    /// `--master-eviction-high-watermark`.
    pub const EVICTION_HIGH_WATERMARK: &str = "MOONGATE_MASTER_EVICTION_HIGH_WATERMARK";
    /// `--master-eviction-ratio`.
    pub const EVICTION_RATIO: &str = "MOONGATE_MASTER_EVICTION_RATIO";
    /// `--master-allow-evict-soft-pinned`.
    pub const ALLOW_EVICT_SOFT_PINNED: &str = "MOONGATE_MASTER_ALLOW_EVICT_SOFT_PINNED";
    /// `--master-soft-pin-ttl-ms`.
    pub const SOFT_PIN_TTL_MS: &str = "MOONGATE_MASTER_SOFT_PIN_TTL_MS";
    /// `--master-shards`.
    pub const SHARDS: &str = "MOONGATE_MASTER_SHARDS";
    /// `--master-alignment`.
    pub const ALIGNMENT: &str = "MOONGATE_MASTER_ALIGNMENT";
    /// `--master-max-replicas`.
    pub const MAX_REPLICAS: &str = "MOONGATE_MASTER_MAX_REPLICAS";
    /// `--master-max-key-bytes`.
    pub const MAX_KEY_BYTES: &str = "MOONGATE_MASTER_MAX_KEY_BYTES";
    /// `--master-max-object-bytes`.
    pub const MAX_OBJECT_BYTES: &str = "MOONGATE_MASTER_MAX_OBJECT_BYTES";
    /// `--master-max-segment-bytes`.
    pub const MAX_SEGMENT_BYTES: &str = "MOONGATE_MASTER_MAX_SEGMENT_BYTES";
    /// `--master-max-batch-items`.
    pub const MAX_BATCH_ITEMS: &str = "MOONGATE_MASTER_MAX_BATCH_ITEMS";
    /// `--master-max-name-bytes`.
    pub const MAX_NAME_BYTES: &str = "MOONGATE_MASTER_MAX_NAME_BYTES";
    /// `--master-tick-interval-ms`.
    pub const TICK_INTERVAL_MS: &str = "MOONGATE_MASTER_TICK_INTERVAL_MS";
    /// `--master-list-default-limit`.
    pub const LIST_DEFAULT_LIMIT: &str = "MOONGATE_MASTER_LIST_DEFAULT_LIMIT";
    /// `--master-list-max-limit`.
    pub const LIST_MAX_LIMIT: &str = "MOONGATE_MASTER_LIST_MAX_LIMIT";
    /// `--master-metadata-max-entries`.
    pub const METADATA_MAX_ENTRIES: &str = "MOONGATE_MASTER_METADATA_MAX_ENTRIES";
    /// `--master-metadata-max-value-bytes`.
    pub const METADATA_MAX_VALUE_BYTES: &str = "MOONGATE_MASTER_METADATA_MAX_VALUE_BYTES";
    /// `--master-disk-task-timeout-ms`.
    pub const DISK_TASK_TIMEOUT_MS: &str = "MOONGATE_MASTER_DISK_TASK_TIMEOUT_MS";
    /// `--master-disk-offload-on-evict`.
    pub const DISK_OFFLOAD_ON_EVICT: &str = "MOONGATE_MASTER_DISK_OFFLOAD_ON_EVICT";
    /// `--master-disk-promote-after`.
    pub const DISK_PROMOTE_AFTER: &str = "MOONGATE_MASTER_DISK_PROMOTE_AFTER";
    /// `--master-disk-load-wait-ms`.
    pub const DISK_LOAD_WAIT_MS: &str = "MOONGATE_MASTER_DISK_LOAD_WAIT_MS";
    /// `--master-events-buffer`.
    pub const EVENTS_BUFFER: &str = "MOONGATE_MASTER_EVENTS_BUFFER";
    /// `--master-kv-events-endpoint`.
    pub const KV_EVENTS_ENDPOINT: &str = "MOONGATE_MASTER_KV_EVENTS_ENDPOINT";
}

/// Configuration of the KV-cache master. Durations are in milliseconds. Defaults follow
/// Mooncake Store (`types.h`, the master's flags) unless noted.
///
/// It is also a set of command-line flags (`clap::Args`, flattened into the host's command,
/// under the "KV master" heading); their ids are `master.<field>`, which is how a host that
/// nests this struct under a `master` key maps a given flag back to its field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "KV master")]
pub struct MasterConfig {
    /// Read lease granted (or extended) by `get_replicas` and `exists`.
    #[arg(id = "master.lease_ttl_ms", long = "master-lease-ttl-ms", env = env::LEASE_TTL_MS, value_name = "MS",
        default_value_t = MasterConfig::default().lease_ttl_ms)]
    pub lease_ttl_ms: u64,
    /// A client that neither pings nor mounts for this long loses its segments and is told
    /// to remount.
    #[arg(id = "master.client_ttl_ms", long = "master-client-ttl-ms", env = env::CLIENT_TTL_MS, value_name = "MS",
        default_value_t = MasterConfig::default().client_ttl_ms)]
    pub client_ttl_ms: u64,
    /// A put left unfinished this long may be taken over by a new `put_start` of the same
    /// key.
    #[arg(id = "master.put_start_discard_timeout_ms", long = "master-put-start-discard-timeout-ms", env = env::PUT_START_DISCARD_TIMEOUT_MS, value_name = "MS",
        default_value_t = MasterConfig::default().put_start_discard_timeout_ms)]
    pub put_start_discard_timeout_ms: u64,
    /// The space of an unfinished (or taken-over) put is released this long after its
    /// `put_start`. Must exceed the discard timeout.
    #[arg(id = "master.put_start_release_timeout_ms", long = "master-put-start-release-timeout-ms", env = env::PUT_START_RELEASE_TIMEOUT_MS, value_name = "MS",
        default_value_t = MasterConfig::default().put_start_release_timeout_ms)]
    pub put_start_release_timeout_ms: u64,
    /// Space reserved for a client's future puts (so each is one commit request) is
    /// released this long after it was reserved if still unused. A tenth of it is the
    /// write window: clients start writing a reservation or a put-start's replicas only
    /// within it of their request, and a segment remounted, or restored by a new HA
    /// leader, takes no new values for it (clients may still write into space given out
    /// in it before). Moongate's own.
    #[arg(id = "master.reservation_ttl_ms", long = "master-reservation-ttl-ms", env = env::RESERVATION_TTL_MS, value_name = "MS",
        default_value_t = MasterConfig::default().reservation_ttl_ms)]
    pub reservation_ttl_ms: u64,
    /// Most bytes of reserved space one client may hold (every replica counted); 0 turns
    /// reservations off (every put takes two requests), as it is on an HA master (`--ha`),
    /// whose successor would not know them. Moongate's own.
    #[arg(id = "master.reservation_max_bytes", long = "master-reservation-max-bytes", env = env::RESERVATION_MAX_BYTES, value_name = "BYTES",
        default_value_t = MasterConfig::default().reservation_max_bytes)]
    pub reservation_max_bytes: u64,
    /// Eviction starts when allocated / capacity passes this ratio.
    #[arg(id = "master.eviction_high_watermark", long = "master-eviction-high-watermark", env = env::EVICTION_HIGH_WATERMARK, value_name = "RATIO",
        default_value_t = MasterConfig::default().eviction_high_watermark)]
    pub eviction_high_watermark: f64,
    /// Share of allocated bytes one eviction round frees.
    #[arg(id = "master.eviction_ratio", long = "master-eviction-ratio", env = env::EVICTION_RATIO, value_name = "RATIO",
        default_value_t = MasterConfig::default().eviction_ratio)]
    pub eviction_ratio: f64,
    /// Whether soft-pinned objects may be evicted (second pass, after all others).
    #[arg(id = "master.allow_evict_soft_pinned", long = "master-allow-evict-soft-pinned", env = env::ALLOW_EVICT_SOFT_PINNED, value_name = "BOOL", action = clap::ArgAction::Set,
        default_value_t = MasterConfig::default().allow_evict_soft_pinned)]
    pub allow_evict_soft_pinned: bool,
    /// How long a soft pin protects an object after its `put_end`.
    #[arg(id = "master.soft_pin_ttl_ms", long = "master-soft-pin-ttl-ms", env = env::SOFT_PIN_TTL_MS, value_name = "MS",
        default_value_t = MasterConfig::default().soft_pin_ttl_ms)]
    pub soft_pin_ttl_ms: u64,
    /// Number of metadata shards (power of two); each has its own lock.
    #[arg(id = "master.shards", long = "master-shards", env = env::SHARDS, value_name = "N",
        default_value_t = MasterConfig::default().shards)]
    pub shards: usize,
    /// Allocation granularity and alignment in bytes (power of two), relative to the
    /// segment base.
    #[arg(id = "master.alignment", long = "master-alignment", env = env::ALIGNMENT, value_name = "BYTES",
        default_value_t = MasterConfig::default().alignment)]
    pub alignment: u64,
    /// Largest `replica_num` a put may ask for.
    #[arg(id = "master.max_replicas", long = "master-max-replicas", env = env::MAX_REPLICAS, value_name = "N",
        default_value_t = MasterConfig::default().max_replicas)]
    pub max_replicas: u32,
    /// Longest key in bytes.
    #[arg(id = "master.max_key_bytes", long = "master-max-key-bytes", env = env::MAX_KEY_BYTES, value_name = "BYTES",
        default_value_t = MasterConfig::default().max_key_bytes)]
    pub max_key_bytes: usize,
    /// Largest object in bytes.
    #[arg(id = "master.max_object_bytes", long = "master-max-object-bytes", env = env::MAX_OBJECT_BYTES, value_name = "BYTES",
        default_value_t = MasterConfig::default().max_object_bytes)]
    pub max_object_bytes: u64,
    /// Largest segment in bytes.
    #[arg(id = "master.max_segment_bytes", long = "master-max-segment-bytes", env = env::MAX_SEGMENT_BYTES, value_name = "BYTES",
        default_value_t = MasterConfig::default().max_segment_bytes)]
    pub max_segment_bytes: u64,
    /// Most items in one batch request.
    #[arg(id = "master.max_batch_items", long = "master-max-batch-items", env = env::MAX_BATCH_ITEMS, value_name = "N",
        default_value_t = MasterConfig::default().max_batch_items)]
    pub max_batch_items: usize,
    /// Longest segment name, client endpoint or regex, in bytes.
    #[arg(id = "master.max_name_bytes", long = "master-max-name-bytes", env = env::MAX_NAME_BYTES, value_name = "BYTES",
        default_value_t = MasterConfig::default().max_name_bytes)]
    pub max_name_bytes: usize,
    /// Period of the background tick (client TTL sweep, zombie release, watermark check).
    #[arg(id = "master.tick_interval_ms", long = "master-tick-interval-ms", env = env::TICK_INTERVAL_MS, value_name = "MS",
        default_value_t = MasterConfig::default().tick_interval_ms)]
    pub tick_interval_ms: u64,
    /// Page size of key listings when the request gives none.
    #[arg(id = "master.list_default_limit", long = "master-list-default-limit", env = env::LIST_DEFAULT_LIMIT, value_name = "N",
        default_value_t = MasterConfig::default().list_default_limit)]
    pub list_default_limit: usize,
    /// Largest page size of key listings.
    #[arg(id = "master.list_max_limit", long = "master-list-max-limit", env = env::LIST_MAX_LIMIT, value_name = "N",
        default_value_t = MasterConfig::default().list_max_limit)]
    pub list_max_limit: usize,
    /// Most entries in the transfer-metadata store.
    #[arg(id = "master.metadata_max_entries", long = "master-metadata-max-entries", env = env::METADATA_MAX_ENTRIES, value_name = "N",
        default_value_t = MasterConfig::default().metadata_max_entries)]
    pub metadata_max_entries: usize,
    /// Largest value in the transfer-metadata store, in bytes.
    #[arg(id = "master.metadata_max_value_bytes", long = "master-metadata-max-value-bytes", env = env::METADATA_MAX_VALUE_BYTES, value_name = "BYTES",
        default_value_t = MasterConfig::default().metadata_max_value_bytes)]
    pub metadata_max_value_bytes: usize,
    /// Longest a segment owner may take over a disk-tier task (writing an evicted value to
    /// its disk, reading one back) before the master gives it up: an offload keeps the
    /// value in memory, a load is a miss. Memory an abandoned task may still touch is
    /// reused only after this.
    #[arg(id = "master.disk_task_timeout_ms", long = "master-disk-task-timeout-ms", env = env::DISK_TASK_TIMEOUT_MS, value_name = "MS",
        default_value_t = MasterConfig::default().disk_task_timeout_ms)]
    pub disk_task_timeout_ms: u64,
    /// Longest a read of a value that lives on disk waits for its owner to read it back
    /// into memory before the key answers "not ready"; also the longest an owner's tier
    /// exchange is held back while there is no task.
    #[arg(id = "master.disk_load_wait_ms", long = "master-disk-load-wait-ms", env = env::DISK_LOAD_WAIT_MS, value_name = "MS",
        default_value_t = MasterConfig::default().disk_load_wait_ms)]
    pub disk_load_wait_ms: u64,
    /// Write values to the segment owners' disks only when they are evicted, even for
    /// owners that ask to write through (Mooncake's `--offload_on_evict`).
    #[arg(id = "master.disk_offload_on_evict", long = "master-disk-offload-on-evict", env = env::DISK_OFFLOAD_ON_EVICT, value_name = "BOOL", action = clap::ArgAction::Set,
        default_value_t = MasterConfig::default().disk_offload_on_evict)]
    pub disk_offload_on_evict: bool,
    /// Reads by its owner after which a value on the owner's own disk is copied back into
    /// its segment (Mooncake's `--promotion_admission_threshold`; 0: never). Without room
    /// there, the next eviction round makes some and a later read promotes. The owner
    /// reads such values from its disk meanwhile; other readers always have the value
    /// read back into memory.
    #[arg(id = "master.disk_promote_after", long = "master-disk-promote-after", env = env::DISK_PROMOTE_AFTER, value_name = "READS",
        default_value_t = MasterConfig::default().disk_promote_after)]
    pub disk_promote_after: u32,
    /// Object events (stored, moved between memory and disk, removed) kept for the
    /// gateways and indexers that follow the store (`GET /api/v1/events`, the gateway's
    /// `--enable-kv-events` publisher); a subscriber further behind takes a snapshot.
    /// 0: no events (a router that does not host this master cannot see the store).
    #[arg(id = "master.events_buffer", long = "master-events-buffer", env = env::EVENTS_BUFFER, value_name = "EVENTS",
        default_value_t = MasterConfig::default().events_buffer)]
    pub events_buffer: usize,
    /// Publish the store's object events on a ZMQ PUB socket bound here, in SGLang's
    /// KV-event format (`BlockStored` / `BlockRemoved` with medium `cpu` or `disk`, one
    /// event per page key of `--kv-l3-key-format`'s shape): Mooncake's `--enable_kv_events`
    /// with `--kv_events_bind_endpoint`. Loopback only (`tcp://127.0.0.1:PORT`): ZMQ here
    /// has no authentication, and routers on other hosts follow `GET /api/v1/events` with
    /// the store key instead. Absent: not published.
    #[arg(id = "master.kv_events_endpoint", long = "master-kv-events-endpoint", env = env::KV_EVENTS_ENDPOINT, value_name = "TCP_ENDPOINT")]
    pub kv_events_endpoint: Option<String>,
}

impl Default for MasterConfig {
    fn default() -> Self {
        Self {
            lease_ttl_ms: 10_000,
            client_ttl_ms: 10_000,
            put_start_discard_timeout_ms: 30_000,
            put_start_release_timeout_ms: 600_000,
            reservation_ttl_ms: 30_000,
            reservation_max_bytes: 256 << 20,
            eviction_high_watermark: 0.90,
            eviction_ratio: 0.05,
            allow_evict_soft_pinned: true,
            soft_pin_ttl_ms: 30 * 60 * 1000,
            shards: 64,
            alignment: 64,
            max_replicas: 8,
            max_key_bytes: 4096,
            max_object_bytes: 1 << 40,
            max_segment_bytes: 1 << 50,
            max_batch_items: 4096,
            max_name_bytes: 1024,
            tick_interval_ms: 100,
            list_default_limit: 1000,
            list_max_limit: 10_000,
            metadata_max_entries: 65_536,
            metadata_max_value_bytes: 1 << 20,
            disk_task_timeout_ms: 30_000,
            disk_load_wait_ms: 5_000,
            disk_offload_on_evict: false,
            disk_promote_after: 2,
            events_buffer: 65_536,
            kv_events_endpoint: None,
        }
    }
}

impl MasterConfig {
    /// Checks the values are usable together; the master refuses to start otherwise.
    pub fn validate(&self) -> MasterResult<()> {
        let bad = |m: &str| Err(MasterError::InvalidParams(m.to_string()));
        if !(0.0..=1.0).contains(&self.eviction_high_watermark) {
            return bad("eviction_high_watermark must be within [0, 1]");
        }
        if !(0.0..=1.0).contains(&self.eviction_ratio) {
            return bad("eviction_ratio must be within [0, 1]");
        }
        if self.put_start_release_timeout_ms <= self.put_start_discard_timeout_ms {
            return bad("put_start_release_timeout_ms must exceed put_start_discard_timeout_ms");
        }
        if self.reservation_ttl_ms < 10 {
            return bad("reservation_ttl_ms must be at least 10");
        }
        // A writer that stopped renewing its put must be out of its write window before
        // another may take the key over and be given its space.
        if self.reservation_ttl_ms / 10 >= self.put_start_discard_timeout_ms {
            return bad(
                "the write window (a tenth of reservation_ttl_ms) must be shorter than \
                 put_start_discard_timeout_ms",
            );
        }
        if !self.shards.is_power_of_two() || self.shards > 1 << 16 {
            return bad("shards must be a power of two, at most 65536");
        }
        if !self.alignment.is_power_of_two() {
            return bad("alignment must be a power of two");
        }
        if self.max_replicas == 0 {
            return bad("max_replicas must be at least 1");
        }
        if self.disk_task_timeout_ms == 0 || self.disk_load_wait_ms == 0 {
            return bad("disk_task_timeout_ms and disk_load_wait_ms must be positive");
        }
        if self.lease_ttl_ms == 0 || self.client_ttl_ms == 0 || self.tick_interval_ms == 0 {
            return bad("lease_ttl_ms, client_ttl_ms and tick_interval_ms must be positive");
        }
        if self.list_default_limit == 0 || self.list_default_limit > self.list_max_limit {
            return bad("list_default_limit must be within 1..=list_max_limit");
        }
        if self.max_key_bytes == 0 || self.max_batch_items == 0 || self.max_name_bytes == 0 {
            return bad("max_key_bytes, max_batch_items and max_name_bytes must be positive");
        }
        if let Some(e) = &self.kv_events_endpoint {
            if !loopback_tcp(e) {
                return bad(
                    "kv_events_endpoint must be tcp://127.0.0.1:PORT, tcp://[::1]:PORT or \
                     tcp://localhost:PORT: ZMQ publishes unauthenticated; routers elsewhere \
                     follow GET /api/v1/events with the store key",
                );
            }
            if self.events_buffer == 0 {
                return bad("kv_events_endpoint needs events_buffer above 0");
            }
        }
        Ok(())
    }
}

/// Whether `endpoint` is `tcp://` to a loopback address with a port.
fn loopback_tcp(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return false;
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    port.parse::<u16>().is_ok()
        && (host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_events_bind_loopback_only() {
        for ok in ["tcp://127.0.0.1:5557", "tcp://[::1]:0", "tcp://localhost:9"] {
            assert!(loopback_tcp(ok), "{ok}");
        }
        for bad in [
            "tcp://0.0.0.0:5557",
            "tcp://*:5557",
            "tcp://10.0.0.1:1",
            "ipc:///x",
            "tcp://127.0.0.1",
        ] {
            assert!(!loopback_tcp(bad), "{bad}");
        }
        let c = MasterConfig {
            kv_events_endpoint: Some("tcp://*:5557".into()),
            ..MasterConfig::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn defaults_are_valid_and_round_trip() {
        let c = MasterConfig::default();
        c.validate().unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<MasterConfig>(&json).unwrap(), c);
        let partial: MasterConfig = serde_json::from_str(r#"{"lease_ttl_ms": 5}"#).unwrap();
        assert_eq!(partial.lease_ttl_ms, 5);
        assert_eq!(partial.client_ttl_ms, 10_000);
        assert!(serde_json::from_str::<MasterConfig>(r#"{"nope": 1}"#).is_err());
    }

    #[test]
    fn validate_refuses_inconsistent_values() {
        let mut c = MasterConfig {
            put_start_release_timeout_ms: 1,
            ..MasterConfig::default()
        };
        assert!(c.validate().is_err());
        c = MasterConfig {
            shards: 3,
            ..MasterConfig::default()
        };
        assert!(c.validate().is_err());
        c = MasterConfig {
            eviction_ratio: 1.5,
            ..MasterConfig::default()
        };
        assert!(c.validate().is_err());
    }
}
