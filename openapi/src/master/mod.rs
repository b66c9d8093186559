//! Wire types of the KV-cache master's REST API (`/api/v1/...`) and its transfer-metadata
//! store (`/metadata`).
//!
//! Client ids are UUID strings. Addresses and sizes are byte counts (JSON numbers, u64).
//! Every error answers [`MasterErrorResponse`]: `{"error": {"message", "type", "code"}}`
//! (the OpenAI envelope's shape) where `type` is Mooncake's error name (e.g.
//! `OBJECT_NOT_FOUND`) and `code` its numeric code (-704).
//! Batch endpoints answer 200 with one result per item, in request order; an item that
//! failed carries `error` instead of its payload. Every list in a request body is
//! [`crate::bounded`]: the master refuses one longer than its `max_batch_items` while
//! parsing it.
//!
//! [`MasterError`] is what those `type`s and `code`s mean: the master raises it, the store
//! client decodes it from the envelope ([`MasterError::from_wire`]).

mod error;
pub mod events;
mod tier;

pub use error::{MasterError, MasterResult};
pub use events::{EventsQuery, HeldTier, ObjectEvent, StoreEvents};
pub use tier::{DiskRecord, TierDone, TierExchange, TierTask, TierTaskKind, TierTasks};

/// Where the masters of an HA cluster live in etcd, as far as clients need to know: each
/// running master keeps its advertised URL under `<cluster prefix>masters/` (on its own
/// lease), which a client given `etcd://` reads to find them.
pub mod etcd {
    /// The cluster a master joins, and a client's `etcd://` URL names, when none is given.
    pub const DEFAULT_CLUSTER_ID: &str = "default";
    /// Under the cluster prefix: one key per running master, its URL the value.
    pub const MASTERS_DIR: &str = "masters/";

    /// The etcd key prefix of cluster `cluster_id` (every key of the cluster starts with it).
    pub fn cluster_prefix(cluster_id: &str) -> String {
        format!("/moongate/{cluster_id}/")
    }
}

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Error envelope of every master error response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MasterErrorResponse {
    /// What went wrong.
    pub error: MasterErrorDetail,
}

/// One error: message, Mooncake name, Mooncake code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MasterErrorDetail {
    /// Human-readable cause.
    pub message: String,
    /// Mooncake error name, e.g. `OBJECT_NOT_FOUND`, `OBJECT_HAS_LEASE`.
    #[serde(rename = "type")]
    #[schema(example = "OBJECT_NOT_FOUND")]
    pub kind: String,
    /// Mooncake error code (`ErrorCode` in `types.h`), e.g. -704.
    #[schema(example = -704)]
    pub code: i32,
}

/// A memory region a client mounts as a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SegmentSpec {
    /// Unique segment name at this master (no `/`).
    #[schema(min_length = 1)]
    pub name: String,
    /// Address of the first byte in the owner's registered memory.
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
    /// The owner's `transfer` segment name: where replicas on it are written and read.
    #[schema(min_length = 1)]
    pub endpoint: String,
    /// Bytes of disk the owner keeps below this segment (its `--disk-capacity`; 0: no
    /// disk tier). A value evicted from a segment with a disk tier is written to that disk
    /// by the owner, and read back from it into the segment (see [`TierExchange`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub disk_bytes: u64,
    /// The owner's disk write policy: `true` writes every value to the disk as soon as it
    /// is complete (eviction then drops the memory at once); `false` (the default) writes a
    /// value only when it is evicted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disk_write_through: bool,
}

/// Remount: every segment the client has, after a ping answered `need_remount`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RemountRequest {
    /// The client's segments.
    #[serde(deserialize_with = "crate::bounded::vec")]
    pub segments: Vec<SegmentSpec>,
}

/// A mounted segment with its usage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Segment {
    /// Segment name.
    pub name: String,
    /// Owning client (UUID).
    pub client_id: String,
    /// Base address.
    pub base: u64,
    /// Size in bytes as mounted.
    pub size: u64,
    /// Transfer endpoint of the owner.
    pub endpoint: String,
    /// Bytes the allocator can hand out (size rounded down to the alignment).
    pub capacity_bytes: u64,
    /// Bytes allocated to replicas.
    pub allocated_bytes: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Bytes of disk its owner keeps below it (0: no disk tier).
    #[serde(default)]
    pub disk_bytes: u64,
    /// Whether its owner writes values to disk as soon as they are complete (else on
    /// eviction).
    #[serde(default)]
    pub disk_write_through: bool,
}

/// All mounted segments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SegmentList {
    /// Segments by name.
    pub segments: Vec<Segment>,
}

/// What the master thinks of a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientStatus {
    /// Alive; nothing to do.
    Ok,
    /// Unknown or expired: remount all segments (`POST .../remount`).
    NeedRemount,
}

/// Answer to a ping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PingResponse {
    /// The master's view version; a change means the master restarted.
    pub view_version: u64,
    /// Whether the client must remount.
    pub status: ClientStatus,
}

/// A known client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Client {
    /// Client id (UUID).
    pub client_id: String,
    /// Its status.
    pub status: ClientStatus,
    /// Milliseconds since its last ping or mount.
    pub last_seen_ms_ago: u64,
    /// Names of its mounted segments.
    pub segments: Vec<String>,
}

/// All known clients.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClientList {
    /// Clients by id.
    pub clients: Vec<Client>,
}

fn one() -> u32 {
    1
}

/// Whether a number field holds its default, 0 (left out of a serialized body).
fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// Placement options of a put (Mooncake's `ReplicateConfig`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplicateConfig {
    /// Replicas wanted on distinct segments; best effort (at least one). Default 1.
    #[serde(default = "one")]
    #[schema(format = Int64, minimum = 1, maximum = 4294967295_u64)]
    pub replica_num: u32,
    /// Segment names tried first, in order; unknown or full ones are skipped.
    #[serde(default, deserialize_with = "crate::bounded::vec")]
    pub preferred_segments: Vec<String>,
    /// Evicted only after all unpinned objects, until the soft pin expires.
    #[serde(default)]
    pub soft_pin: bool,
    /// Never evicted.
    #[serde(default)]
    pub hard_pin: bool,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        Self {
            replica_num: 1,
            preferred_segments: Vec::new(),
            soft_pin: false,
            hard_pin: false,
        }
    }
}

/// Start a put of one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutStartRequest {
    /// Writing client (UUID); only it may end or revoke the put.
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub client_id: String,
    /// Object length in bytes.
    #[schema(minimum = 1)]
    pub length: u64,
    /// Placement options.
    #[serde(default)]
    pub config: ReplicateConfig,
    /// Space to reserve for this client's next puts, placed with the same options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<ReserveRequest>,
    /// The writer's id for this put (0: none). A put-start that finds its key still
    /// unfinished, started by the same client with the same nonzero id and length, is a
    /// retry whose first answer was lost: it answers the same replicas again instead of
    /// `OBJECT_ALREADY_EXISTS`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub put_id: u32,
    /// Only renew: answer the replicas of this client's unfinished put of the key under
    /// the same nonzero `put_id` and `length`, allocating nothing (`INVALID_WRITE` when the
    /// master has no such put: ended, revoked, discarded or lost in a restart). A writer
    /// asks this to go on writing past its write window: each answer opens a new one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub renew: bool,
}

/// Space to reserve for future puts of one length: each reservation is later filled and
/// committed with one request (`batch/put-commit`) instead of put-start and put-end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReserveRequest {
    /// Length in bytes of the values to come.
    #[schema(minimum = 1)]
    pub length: u64,
    /// Reservations wanted (best effort: fewer when the client's share or free space runs
    /// out).
    pub count: u32,
}

/// Space reserved for one future put of this client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Reservation {
    /// Id to commit it with.
    pub id: u64,
    /// Length in bytes of the value it holds.
    pub length: u64,
    /// Where the value goes (every replica).
    pub replicas: Vec<Replica>,
    /// Write into it only within this many ms of receiving it; after that it is released.
    pub use_within_ms: u64,
}

/// Where one replica lives: write or read `length` bytes at `address` of `endpoint`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Replica {
    /// Segment name.
    pub segment: String,
    /// Transfer endpoint (the owner's `transfer` segment name).
    pub endpoint: String,
    /// Address of the first byte (0 for a replica on disk).
    pub address: u64,
    /// Object length in bytes.
    pub length: u64,
    /// Where the replica lies: in the segment's memory (the default, left out), or on the
    /// disk below it (only in descriptions, `batch/replica-descs`).
    #[serde(default, skip_serializing_if = "ReplicaKind::is_memory")]
    pub kind: ReplicaKind,
}

/// Where a replica lies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaKind {
    /// In the segment's memory: readable with a transfer.
    #[default]
    Memory,
    /// On the disk of the segment's owner (Mooncake's `LOCAL_DISK`): a read brings it
    /// back into memory first.
    LocalDisk,
}

impl ReplicaKind {
    /// Whether the replica is in memory.
    pub fn is_memory(&self) -> bool {
        *self == ReplicaKind::Memory
    }
}

/// Replicas allocated for a put.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PutStartResponse {
    /// Object key.
    pub key: String,
    /// Where to write the bytes (every replica), then call put-end.
    pub replicas: Vec<Replica>,
    /// Space reserved as the request's `reserve` asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<Reservation>,
    /// Start writing within this many ms of sending the request, or not at all (revoke
    /// the put): space a master gave out is safe to write only that long, since a master
    /// that restarts or takes over as leader holds its segments back that long and then
    /// gives out what it does not know to be in use. 0: no limit (an older master).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub write_within_ms: u64,
}

/// Body of put-end, put-revoke and a disk tier's detach.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientRequest {
    /// The client that started the put (UUID).
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub client_id: String,
}

/// Readable replicas of an object, under a read lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReplicasResponse {
    /// Object key.
    pub key: String,
    /// Object length in bytes.
    pub length: u64,
    /// Read lease granted, ms from now; a read must finish before it ends.
    pub lease_ttl_ms: u64,
    /// Readable replicas (at least one): memory replicas, or, for a `reader` whose own
    /// disk tier holds the value, that disk's `local_disk` replica.
    pub replicas: Vec<Replica>,
    /// The memory copy read is also on disk: release the read when done
    /// (`batch/release-reads`), so the memory can go before the lease ends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release: bool,
}

/// Whether an object is readable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExistsResponse {
    /// Object key.
    pub key: String,
    /// Readable (complete) object exists.
    pub exists: bool,
    /// Read lease granted when it exists, ms from now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,
}

/// How many objects a removal took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RemovedResponse {
    /// Objects removed.
    pub removed: u64,
}

/// Lifecycle state of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ObjectStatus {
    /// put-start done, put-end not yet: invisible to readers.
    Processing,
    /// Readable.
    Complete,
}

/// One object as an admin sees it (reading it grants no lease).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ObjectInfo {
    /// Key.
    pub key: String,
    /// Length in bytes.
    pub length: u64,
    /// Lifecycle state.
    pub status: ObjectStatus,
    /// Client that started the put.
    pub client_id: String,
    /// Replicas on mounted segments.
    pub replicas: Vec<Replica>,
    /// Remaining read lease, ms (0: none).
    pub lease_remaining_ms: u64,
    /// Soft pin in force.
    pub soft_pinned: bool,
    /// Hard-pinned.
    pub hard_pinned: bool,
    /// For an unfinished put: ms since its put-start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub put_started_ms_ago: Option<u64>,
}

/// A page of keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeyPage {
    /// Keys, ascending.
    pub keys: Vec<String>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// Totals of the master.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MasterStats {
    /// Bytes allocatable over mounted segments.
    pub capacity_bytes: u64,
    /// Bytes allocated to replicas.
    pub allocated_bytes: u64,
    /// Objects (complete and unfinished).
    pub keys: u64,
    /// Mounted segments.
    pub segments: u64,
    /// Known clients.
    pub clients: u64,
    /// Clients in status `ok`.
    pub clients_ok: u64,
    /// Objects evicted since start.
    pub evicted_objects: u64,
    /// Bytes evicted since start.
    pub evicted_bytes: u64,
    /// Reservations held for clients' next puts (allocated, no object yet).
    #[serde(default)]
    pub reservations: u64,
    /// Bytes those reservations hold (every replica), included in `allocated_bytes`.
    #[serde(default)]
    pub reserved_bytes: u64,
    /// Reads (replica lookups) since start answered from memory.
    #[serde(default)]
    pub reads_from_memory: u64,
    /// Reads since start of a value that lay on a disk tier (read there by its owner, or
    /// loaded back into memory).
    #[serde(default)]
    pub reads_from_disk: u64,
    /// Reads since start of a key the master did not hold.
    #[serde(default)]
    pub read_misses: u64,
    /// Values written to a disk tier since start (offloads reported durable).
    #[serde(default)]
    pub disk_offloads: u64,
    /// Values read back from a disk tier into memory since start.
    #[serde(default)]
    pub disk_loads: u64,
}

/// `GET /health` of a master served alone (`moongate master`): the process is up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MasterHealth {
    /// `alive`.
    pub status: String,
    /// The server's version.
    pub version: String,
}

/// `GET /api/v1/ha`: a master's role in its HA cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HaStatus {
    /// `leader`, `follower` or `candidate` (between leaders); `standalone` without HA.
    pub role: String,
    /// Where the leader serves (its advertise URL), when one is known.
    pub leader_url: Option<String>,
    /// The leader's term (increases with every new leader; 0: none known).
    pub term: i64,
}

/// Query of `GET /api/v1/objects`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListObjectsQuery {
    /// Only keys starting with this.
    pub prefix: Option<String>,
    /// Only keys after this one (the previous page's `next_after`).
    pub after: Option<String>,
    /// Page size (default 1000, at most 10 000).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<usize>,
}

/// Query of `DELETE /api/v1/objects`: exactly one of `all=true` or `regex`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteObjectsQuery {
    /// Remove every complete object without a live lease.
    pub all: Option<bool>,
    /// Remove complete, unleased objects whose key matches (anywhere) this regex.
    #[param(min_length = 1)]
    pub regex: Option<String>,
}

/// Query of `DELETE /api/v1/objects/{key}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RemoveQuery {
    /// Remove even while a read lease is live.
    pub force: Option<bool>,
}

/// Query of the read lookups (`GET /api/v1/objects/{key}/replicas`,
/// `POST /api/v1/batch/replicas`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReplicasQuery {
    /// The reading client's id. A value that lies on that client's own disk tier (and in
    /// no memory replica) is then answered as a `local_disk` replica, which the client
    /// reads from its own disk, instead of being read back into memory first.
    #[param(min_length = 1, max_length = 64)]
    pub reader: Option<String>,
}

/// Query of `/metadata`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MetadataQuery {
    /// Metadata key (e.g. a transfer segment name). Required: without it the answer is 400
    /// (Mooncake's protocol), which is why the field is optional here.
    #[param(required = true, min_length = 1)]
    pub key: Option<String>,
}

/// Opaque bytes of the transfer-metadata store (stored and returned unchanged).
#[derive(Clone, Debug, Default, PartialEq, Eq, ToSchema)]
#[schema(value_type = String, format = Binary, min_length = 1)]
pub struct MetadataValue(pub Vec<u8>);

/// One object of a batch put-start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchPutStartItem {
    /// Object key.
    pub key: String,
    /// Object length in bytes.
    pub length: u64,
}

/// Start puts of many objects with one placement config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchPutStartRequest {
    /// Writing client (UUID).
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub client_id: String,
    /// Objects to start.
    #[serde(deserialize_with = "crate::bounded::vec")]
    pub items: Vec<BatchPutStartItem>,
    /// Placement options for all of them.
    #[serde(default)]
    pub config: ReplicateConfig,
    /// Space to reserve for this client's next puts, placed with the same options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<ReserveRequest>,
    /// The writer's id for these puts (0: none), as [`PutStartRequest::put_id`] is for one:
    /// an item whose key is still unfinished by this client under the same id and length
    /// answers its replicas again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub put_id: u32,
    /// Only renew, as [`PutStartRequest::renew`], each item.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub renew: bool,
}

/// Result of one batch put-start item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchPutStartResult {
    /// Object key.
    pub key: String,
    /// Where to write, on success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<Vec<Replica>>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<MasterErrorDetail>,
}

/// Results of a batch put-start, in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchPutStartResponse {
    /// One per item.
    pub results: Vec<BatchPutStartResult>,
    /// Space reserved as the request's `reserve` asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<Reservation>,
    /// As [`PutStartResponse::write_within_ms`], for every item.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub write_within_ms: u64,
}

/// One value written into a reservation, to commit under its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutCommitItem {
    /// Object key.
    pub key: String,
    /// The reservation holding its bytes.
    pub reservation: u64,
    /// Object length in bytes (the reservation's).
    pub length: u64,
}

/// Commit values written into reservations: each becomes a readable object, as after
/// put-start and put-end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchPutCommitRequest {
    /// The client the reservations were made for (UUID).
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub client_id: String,
    /// Values to commit.
    #[serde(deserialize_with = "crate::bounded::vec")]
    pub items: Vec<PutCommitItem>,
    /// Space to reserve for this client's next puts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<ReserveRequest>,
    /// Placement options of the new reservations.
    #[serde(default)]
    pub config: ReplicateConfig,
}

/// Results of a batch put-commit, in request order, and the new reservations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchPutCommitResponse {
    /// One per item.
    pub results: Vec<BatchKeyResult>,
    /// Space reserved as the request's `reserve` asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<Reservation>,
}

/// Keys, with the client that wrote them (batch put-end / put-revoke).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchClientKeysRequest {
    /// The client that started the puts (UUID).
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub client_id: String,
    /// Object keys.
    #[serde(deserialize_with = "crate::bounded::vec")]
    pub keys: Vec<String>,
}

/// Clear the replicas of a client's own objects (Mooncake's `batch_replica_clear`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplicaClearRequest {
    /// The client that wrote the objects (UUID): another's are skipped.
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub client_id: String,
    /// Object keys.
    #[serde(deserialize_with = "crate::bounded::vec")]
    pub keys: Vec<String>,
    /// Clear only the replicas on this segment (absent: every replica, so the object goes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
}

/// The keys whose replicas were cleared, in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReplicaClearResponse {
    /// Keys cleared (missing, another client's, read-leased, unfinished or without a
    /// replica there: left out).
    pub cleared: Vec<String>,
}

/// Keys (batch replicas / exists).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchKeysRequest {
    /// Object keys.
    #[serde(deserialize_with = "crate::bounded::vec")]
    pub keys: Vec<String>,
}

/// Keys to remove.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRemoveRequest {
    /// Object keys.
    #[serde(deserialize_with = "crate::bounded::vec")]
    pub keys: Vec<String>,
    /// Remove even while a read lease is live.
    #[serde(default)]
    pub force: bool,
}

/// Result of one key of a batch put-end / put-revoke / remove.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchKeyResult {
    /// Object key.
    pub key: String,
    /// Why it failed; absent on success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<MasterErrorDetail>,
}

/// Results of a batch put-end / put-revoke / remove, in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchKeyResponse {
    /// One per key.
    pub results: Vec<BatchKeyResult>,
}

/// Result of one key of a batch replicas lookup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchReplicasResult {
    /// Object key.
    pub key: String,
    /// Object length, on success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    /// Read lease granted, ms from now, on success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,
    /// Readable replicas, on success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<Vec<Replica>>,
    /// As [`ReplicasResponse::release`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release: bool,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<MasterErrorDetail>,
}

impl BatchReplicasResult {
    /// The result of a key that failed with `error`.
    pub fn failed(key: String, error: MasterErrorDetail) -> Self {
        Self {
            key,
            length: None,
            lease_ttl_ms: None,
            replicas: None,
            release: false,
            error: Some(error),
        }
    }
}

/// Results of a batch replicas lookup, in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchReplicasResponse {
    /// One per key.
    pub results: Vec<BatchReplicasResult>,
}

/// Result of one key of a batch exists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchExistsResult {
    /// Object key.
    pub key: String,
    /// Readable object exists.
    pub exists: bool,
    /// Read lease granted when it exists, ms from now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,
    /// Why the key was refused (e.g. invalid key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<MasterErrorDetail>,
}

/// Results of a batch exists, in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchExistsResponse {
    /// One per key.
    pub results: Vec<BatchExistsResult>,
}
