//! The disk tier's exchange between the master and the owner of a segment with a disk
//! (`disk_bytes > 0` in its [`SegmentSpec`](super::SegmentSpec)).
//!
//! The master decides what moves between a segment and its disk; the owner moves the
//! bytes, between its own memory and its own disk, and reports. One route carries both
//! ways: the owner posts what it finished (and, after a mount or a master change, every
//! record its disk holds), and the answer is the next tasks, held back up to `wait_ms`
//! while there are none.
//!
//! - **offload**: the value at `address` (in the segment) is written to disk; once it is
//!   durable the master frees the memory and the object lives on in the disk tier.
//! - **load**: the disk record is read into `address` (space the master allocated on the
//!   segment) and checked; then the object is readable from memory again.
//! - **delete**: the object is gone; its disk record is removed.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a tier task asks of the segment's owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TierTaskKind {
    /// Write the value at `address` to disk.
    Offload,
    /// Read the disk record into `address`.
    Load,
    /// Remove the disk record.
    Delete,
}

/// One task for the owner of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TierTask {
    /// What to do.
    pub kind: TierTaskKind,
    /// The object's key.
    pub key: String,
    /// Address in the segment (offload: the value's first byte; load: where it goes;
    /// delete: 0).
    pub address: u64,
    /// The value's length in bytes.
    pub length: u64,
    /// The task's number, echoed in its [`TierDone`]: a report of an earlier task of the
    /// same key (removed and put again meanwhile) settles nothing of this one.
    #[serde(default)]
    pub id: u64,
    /// A load's reader's W3C `traceparent`, when its read sent one: an owner that exports
    /// traces runs the load in a span of the reader's trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// A task the owner finished.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TierDone {
    /// The task's kind.
    pub kind: TierTaskKind,
    /// The object's key.
    pub key: String,
    /// Whether it succeeded (an offload: the record is durable; a load: the bytes are in
    /// memory and their checksum held).
    pub ok: bool,
    /// The task's [`TierTask::id`] (0: settles the key's task whatever its number).
    #[serde(default)]
    pub id: u64,
}

/// A record the owner's disk holds, reported so the master serves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DiskRecord {
    /// The object's key.
    pub key: String,
    /// The value's length in bytes.
    pub length: u64,
}

/// The owner's side of the exchange: `POST /api/v1/segments/{name}/tier`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TierExchange {
    /// The segment's owner (UUID).
    #[schema(
        format = "uuid",
        pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub client_id: String,
    /// Tasks finished since the last exchange.
    #[serde(default, deserialize_with = "crate::bounded::vec")]
    pub done: Vec<TierDone>,
    /// Keys whose records the owner dropped on its own (its disk was full, a record failed
    /// its checksum): the master stops serving them from this disk.
    #[serde(default, deserialize_with = "crate::bounded::vec")]
    pub dropped: Vec<String>,
    /// Records the disk holds, for the master to serve (sent after a mount, a remount or a
    /// master change, in chunks).
    #[serde(default, deserialize_with = "crate::bounded::vec")]
    pub records: Vec<DiskRecord>,
    /// Longest the master holds the answer back while it has no task, ms (capped by the
    /// master).
    #[serde(default)]
    pub wait_ms: u64,
}

/// The master's side: the next tasks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TierTasks {
    /// Tasks, oldest first.
    pub tasks: Vec<TierTask>,
    /// Records of `records` the master took (the others: a key it holds already, or an
    /// object it cannot take now).
    pub adopted: u64,
    /// The master's view version: a change means a new master, which learns the disk's
    /// records again.
    pub view_version: u64,
    /// Changes whenever the master forgot the objects of a segment that went away (its
    /// owner left or expired): owners report their records again, so values whose only
    /// memory copy was there are served from the disks that hold them.
    #[serde(default)]
    pub report_epoch: u64,
}
