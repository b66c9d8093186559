//! Wire types of a storage node's own HTTP endpoints (`moongate store`: `/health`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Whether a storage node serves its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// The segment is mounted at the master and the node serves transfers.
    Ok,
    /// The segment is not mounted (master unreachable, or a remount pending).
    Unmounted,
}

/// Answer of a storage node's `GET /health` (200 when `ok`, 503 otherwise).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeHealth {
    /// Overall status.
    pub status: NodeStatus,
    /// The node's client id at the master (UUID).
    pub client_id: String,
    /// The master's base URL.
    pub master: String,
    /// Segment name (also its transfer endpoint).
    pub segment: String,
    /// Segment size in bytes.
    pub segment_bytes: u64,
    /// Pings the master answered.
    pub pings: u64,
    /// Pings that failed since the last answered one.
    pub consecutive_ping_failures: u64,
    /// Remounts done after the master asked for one.
    pub remounts: u64,
    /// Milliseconds since the last answered ping (absent before the first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ping_ok_ms_ago: Option<u64>,
    /// The master's view version last seen.
    pub view_version: u64,
}
