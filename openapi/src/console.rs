//! The cluster at a glance (`GET /cluster`, admin plane): the gateway, its workers, how
//! its policies have routed, and the KV master it hosts, in one answer. The console page
//! (`GET /console`) draws it; scripts may read it too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::master::{MasterStats, Segment};
use crate::workers::WorkerInfo;

/// `GET /cluster`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterView {
    /// The gateway answering.
    pub gateway: GatewayView,
    /// Every registered worker (with `--dp-aware`, one entry per rank), as `/workers` lists
    /// them, with what the gateway knows of their load.
    pub workers: Vec<WorkerRow>,
    /// How the routing policies decided since this process started, one entry per
    /// family of decisions.
    pub routing: Vec<PolicyTally>,
    /// The KV master this gateway hosts; absent when it hosts none
    /// (`--disable-master`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<MasterView>,
}

/// The gateway answering `/cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GatewayView {
    /// Moongate's version.
    pub version: String,
    /// Seconds since the gateway started serving.
    pub uptime_secs: u64,
    /// `regular`, or `pd` (prefill-decode disaggregation).
    pub mode: String,
    /// The policies in force: regular mode's, or PD's prefill and decode policies.
    pub policies: Vec<String>,
    /// Requests in flight on the workers now (the sum of their `load`).
    pub in_flight: u64,
    /// Requests waiting for admission now.
    pub admission_waiting: u64,
}

/// A worker as the console shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkerRow {
    /// The worker's record (`GET /workers/{id}`).
    pub info: WorkerInfo,
    /// Prompt tokens this gateway sent it that it has not started answering yet (the
    /// prefill backlog `kv_aware` weighs).
    pub prefill_backlog_tokens: u64,
    /// Its own last load report (`/v1/loads`), read while a `least_load` policy is in
    /// force; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_load: Option<ReportedLoad>,
}

/// A worker's own load report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReportedLoad {
    /// How long ago it was read, in milliseconds.
    pub age_ms: u64,
    /// KV tokens in use.
    pub used_tokens: u64,
    /// Requests waiting in its queues.
    pub waiting_reqs: u64,
    /// The fullest rank's KV usage (0 to 1).
    pub token_usage: f64,
    /// Tokens generated per second.
    pub gen_throughput: f64,
}

/// How one family of routing decisions went since the process started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PolicyTally {
    /// `cache_aware`, `kv_aware`, `manual` (sticky sessions), or `pd` (what the PD
    /// router did with each request).
    pub policy: String,
    /// Whether a router in force now uses it.
    pub in_use: bool,
    /// Decisions by label: the `decision` (or `path`) label of its
    /// `moongate_gateway_*_total` counter.
    pub decisions: BTreeMap<String, u64>,
    /// The policy's hit rate, 0 to 1, absent before its first decision or where it has
    /// none (`pd`). `cache_aware`: decisions on a prefix match over all decisions;
    /// `manual`: requests that went to their session's worker over all; `kv_aware`: the
    /// prompt tokens the chosen workers held cached when routed, in any tier
    /// (`cached_tokens`), over all prompt tokens it routed on events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_rate: Option<f64>,
    /// `kv_aware`: the prompt tokens the chosen workers held cached when routed, by tier
    /// (`device`, `host`, `store`, `store_disk`, and `estimated` by the `cache_aware` tree
    /// for workers without events); empty for the other families.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cached_tokens: BTreeMap<String, u64>,
}

/// A gateway's view of the store, followed from the master's object events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoreViewSummary {
    /// Pages in the view.
    pub pages: u64,
    /// Events applied since start (snapshot entries included).
    pub events: u64,
    /// Snapshots taken since start (one per master instance followed, and after a gap).
    pub snapshots: u64,
}

/// The KV master this gateway hosts, or follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MasterView {
    /// `alone`, or in an HA cluster `leader`, `follower` or `candidate`; `follows` for a
    /// gateway hosting none that follows a master's events (`--kv-l3-master-url`).
    pub role: String,
    /// With HA: the leader's URL, when one is known; the master followed, with `follows`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_url: Option<String>,
    /// What this gateway's `kv_aware` sees of the store through the master's object events,
    /// while no master answers here (absent where one does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<StoreViewSummary>,
    /// Totals, where the master answers here (alone, or leading); a follower's console
    /// shows the leader's on the leader's own gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<MasterStats>,
    /// Every mounted segment (empty where `stats` is absent).
    pub segments: Vec<Segment>,
}
