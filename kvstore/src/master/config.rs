//! Every tunable of the master, with its default, in one place. The gateway's CLI, the
//! docs and deploy/ read the defaults from here.

use serde::{Deserialize, Serialize};

use super::error::{MasterError, MasterResult};

/// Configuration of the KV-cache master. Durations are in milliseconds. Defaults follow
/// Mooncake Store (`types.h`, the master's flags) unless noted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MasterConfig {
    /// Read lease granted (or extended) by `get_replicas` and `exists`. Default 10 s.
    pub lease_ttl_ms: u64,
    /// A client that neither pings nor mounts for this long loses its segments and is told
    /// to remount. Default 10 s.
    pub client_ttl_ms: u64,
    /// A put left unfinished this long may be taken over by a new `put_start` of the same
    /// key. Default 30 s.
    pub put_start_discard_timeout_ms: u64,
    /// The space of an unfinished (or taken-over) put is released this long after its
    /// `put_start`. Must exceed the discard timeout. Default 600 s.
    pub put_start_release_timeout_ms: u64,
    /// Eviction starts when allocated / capacity passes this ratio. Default 0.90.
    pub eviction_high_watermark: f64,
    /// Share of allocated bytes one eviction round frees. Default 0.05.
    pub eviction_ratio: f64,
    /// Whether soft-pinned objects may be evicted (second pass, after all others).
    /// Default true.
    pub allow_evict_soft_pinned: bool,
    /// How long a soft pin protects an object after its `put_end`. Default 30 min.
    pub soft_pin_ttl_ms: u64,
    /// Number of metadata shards (power of two); each has its own lock. Default 64.
    pub shards: usize,
    /// Allocation granularity and alignment in bytes (power of two), relative to the
    /// segment base. Default 64.
    pub alignment: u64,
    /// Largest `replica_num` a put may ask for. Default 8.
    pub max_replicas: u32,
    /// Longest key in bytes. Default 4096.
    pub max_key_bytes: usize,
    /// Largest object in bytes. Default 1 TiB (Mooncake's largest segment).
    pub max_object_bytes: u64,
    /// Largest segment in bytes. Default 1 PiB.
    pub max_segment_bytes: u64,
    /// Most items in one batch request. Default 4096.
    pub max_batch_items: usize,
    /// Longest segment name, client endpoint or regex, in bytes. Default 1024.
    pub max_name_bytes: usize,
    /// Period of the background tick (client TTL sweep, zombie release, watermark check).
    /// Default 100 ms.
    pub tick_interval_ms: u64,
    /// Page size of key listings when the request gives none. Default 1000.
    pub list_default_limit: usize,
    /// Largest page size of key listings. Default 10 000.
    pub list_max_limit: usize,
    /// Most entries in the transfer-metadata store. Default 65 536.
    pub metadata_max_entries: usize,
    /// Largest value in the transfer-metadata store, in bytes. Default 1 MiB.
    pub metadata_max_value_bytes: usize,
}

impl Default for MasterConfig {
    fn default() -> Self {
        Self {
            lease_ttl_ms: 10_000,
            client_ttl_ms: 10_000,
            put_start_discard_timeout_ms: 30_000,
            put_start_release_timeout_ms: 600_000,
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
        if !self.shards.is_power_of_two() || self.shards > 1 << 16 {
            return bad("shards must be a power of two, at most 65536");
        }
        if !self.alignment.is_power_of_two() {
            return bad("alignment must be a power of two");
        }
        if self.max_replicas == 0 {
            return bad("max_replicas must be at least 1");
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
