//! The store's object events (`GET /api/v1/events`): what the master holds under each
//! key, as a stream of changes a router follows to score store hits without hosting the
//! master. See `kvmaster`'s feed for the order and the snapshot rule.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Longest `wait_ms` the master honours.
pub const MAX_WAIT_MS: u64 = 30_000;

/// Query of `GET /api/v1/events`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// The epoch of the events the caller follows (the last answer's `epoch`). Absent, or
    /// not this master's: the answer is a snapshot.
    pub epoch: Option<u64>,
    /// The sequence number to go on from (the last answer's `next`). Absent, or older than
    /// the events the master keeps: the answer is a snapshot.
    pub from: Option<u64>,
    /// The next part of a snapshot: the last answer's `resume` (with its `epoch` and
    /// `next` as `from`).
    pub cursor: Option<u64>,
    /// With no event from `from` on yet, wait up to this long for one (at most 30 000).
    #[param(maximum = 30000)]
    pub wait_ms: Option<u64>,
    /// Most events to answer (default and at most 65 536; a snapshot's part holds whole
    /// shards of the master's keys, so it may hold more).
    #[param(minimum = 1, maximum = 65536)]
    pub max: Option<usize>,
}

/// Where a key's value is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HeldTier {
    /// In a storage node's memory.
    Memory,
    /// Only on a storage node's disk tier.
    Disk,
}

/// One key's new state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ObjectEvent {
    /// The key.
    pub key: String,
    /// Where its value is now; absent: no longer held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<HeldTier>,
}

/// Events, or a snapshot to start from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoreEvents {
    /// The master instance the sequence numbers belong to.
    pub epoch: u64,
    /// True: `events` is part of a snapshot of every key held (its first part: forget what
    /// was known before); false: the changes numbered `first..next`, in order.
    pub snapshot: bool,
    /// The snapshot continues: ask with this as `cursor` (and `from` = `next`) for the next
    /// part before following the events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<u64>,
    /// Sequence number of `events[0]` (a snapshot's is `next`: the changes from there on
    /// follow it).
    pub first: u64,
    /// Ask `from` this next.
    pub next: u64,
    /// The events, or the snapshot.
    pub events: Vec<ObjectEvent>,
}
