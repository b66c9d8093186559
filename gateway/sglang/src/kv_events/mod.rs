//! SGLang's KV-cache events (`--kv-events-config`), both ends: the simulated worker
//! publishes them ([`publish`]) and the `kv_aware` policy subscribes to every worker's
//! ([`subscribe`]).
//!
//! # Layout
//! - [`hash`]: SGLang's chained SHA-256 page hashes and the 64-bit block hash of events.
//! - [`wire`]: the msgpack `EventBatch` and its tagged events, the frames and the replay
//!   protocol.
//! - [`publish`]: a ZMQ PUB socket with SGLang's framing and the replay ROUTER socket.
//! - [`subscribe`]: a ZMQ SUB client per worker: reconnects, notices gaps, replays or resyncs.

pub mod hash;
pub mod publish;
pub mod subscribe;
pub mod wire;

use serde::{Deserialize, Serialize};

/// The publisher endpoint when the config names none: loopback (SGLang's own default,
/// `tcp://*:5557`, binds every interface; say so explicitly to get that).
pub const DEFAULT_ENDPOINT: &str = "tcp://127.0.0.1:5557";
/// Batches kept for replay (SGLang's `buffer_steps`).
pub const DEFAULT_BUFFER_STEPS: usize = 10_000;
/// Batches queued for the publisher before new ones are dropped (SGLang's `max_queue_size`).
pub const DEFAULT_MAX_QUEUE_SIZE: usize = 100_000;

/// SGLang's `KVEventsConfig`, as given to `--kv-events-config` (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KvEventsConfig {
    /// `zmq` publishes; `null` does not.
    pub publisher: String,
    /// Where the PUB socket binds (`tcp://host:port`; `*` for every interface).
    pub endpoint: String,
    /// Where the replay ROUTER socket binds (none: no replay).
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// ZMQ high-water mark (accepted for compatibility).
    pub hwm: usize,
    /// Batches queued before new ones are dropped.
    pub max_queue_size: usize,
    /// The topic frame of every message.
    pub topic: String,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            publisher: "zmq".to_owned(),
            endpoint: DEFAULT_ENDPOINT.to_owned(),
            replay_endpoint: None,
            buffer_steps: DEFAULT_BUFFER_STEPS,
            hwm: 100_000,
            max_queue_size: DEFAULT_MAX_QUEUE_SIZE,
            topic: String::new(),
        }
    }
}

/// `endpoint` (`tcp://host:port`) with its port moved up by `by`: where data-parallel rank
/// `by` of a worker publishes (SGLang offsets each rank's endpoints so). `None` when the
/// endpoint has no port or the sum leaves the port range.
pub fn offset_port(endpoint: &str, by: u32) -> Option<String> {
    let (head, port) = endpoint.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let moved = u16::try_from(u32::from(port) + by).ok()?;
    Some(format!("{head}:{moved}"))
}

impl KvEventsConfig {
    /// Parses the JSON of `--kv-events-config`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let c: KvEventsConfig =
            serde_json::from_str(s).map_err(|e| format!("bad --kv-events-config: {e}"))?;
        if !matches!(c.publisher.as_str(), "zmq" | "null") {
            return Err(format!(
                "unknown event publisher {:?} (zmq or null)",
                c.publisher
            ));
        }
        Ok(c)
    }

    /// Whether events are published at all.
    pub fn enabled(&self) -> bool {
        self.publisher == "zmq"
    }
}

/// A ZMQ endpoint with `*` turned into an address this crate can bind (`0.0.0.0`).
pub fn bindable(endpoint: &str) -> String {
    endpoint.replacen("://*:", "://0.0.0.0:", 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_endpoints_move_the_port() {
        assert_eq!(
            offset_port("tcp://10.0.0.1:5557", 3).as_deref(),
            Some("tcp://10.0.0.1:5560")
        );
        assert_eq!(
            offset_port("tcp://[::1]:5557", 0).as_deref(),
            Some("tcp://[::1]:5557")
        );
        assert_eq!(offset_port("tcp://h:65535", 1), None);
        assert_eq!(offset_port("ipc:///tmp/x", 1), None);
    }
}
