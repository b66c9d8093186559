//! Durable changes: what a master with a [`Journal`] (the HA master's etcd log, see
//! `crate::ha`) must make durable, and the records it writes.
//!
//! Without a journal the master is the plain in-memory master and nothing here runs.
//! With one, every change that must survive the master's host goes through it, in one of
//! two orders:
//! - **durable first, then visible**: `put_end`, mount and remount. The change is
//!   appended with an apply step ([`Change::on_commit`]) that the journal runs once the
//!   record is committed; until then the object stays unreadable (flagged *ending*) and the
//!   segment unusable (its name reserved). A reader never sees what a failover would lose.
//! - **invisible first, then durable**: remove, eviction, unmount and client expiry. The
//!   object or segment leaves memory at once, but the space of a removed object is only
//!   given back to its allocator by the apply step, after its delete is committed: no new
//!   put can overwrite bytes that a failover would bring back as a live object.
//!
//! A host answers a request that changed something only after [`Master::durable`]: every
//! change appended before it is committed (or it fails with
//! [`MasterError::Unavailable`], retryable, and nothing was acknowledged).

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::segment::SegmentSpec;
use super::{Master, MasterResult};

/// A mounted segment as made durable: who mounted it, where, under which mount id (a
/// remount of the same name gets a new id, so records of the old one are recognisably stale).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRecord {
    /// Owning client.
    pub client: Uuid,
    /// Mount id, unique per mount.
    pub mount: u64,
    /// Name, endpoint, base and size.
    pub spec: SegmentSpec,
}

/// One replica of a durable object: on which mount, at which offset (alignment units).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    /// Segment name.
    pub segment: String,
    /// Mount id of the segment the replica was written to.
    pub mount: u64,
    /// Offset from the segment base, in alignment units.
    pub offset: u64,
}

/// A readable object as made durable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    /// Key.
    pub key: String,
    /// Length in bytes.
    pub length: u64,
    /// Client that wrote it.
    pub client: Uuid,
    /// Soft-pinned at write.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub soft_pin: bool,
    /// Hard-pinned (never evicted).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hard_pin: bool,
    /// Its replicas.
    pub replicas: Vec<ReplicaRecord>,
}

/// One durable change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A segment was mounted.
    Mount(SegmentRecord),
    /// The mount `mount` of segment `name` ended.
    Unmount {
        /// Segment name.
        name: String,
        /// Its mount id.
        mount: u64,
    },
    /// An object became readable.
    Put(ObjectRecord),
    /// An object was removed (by a client, an admin or eviction) or lost its last replica.
    Remove {
        /// Its key.
        key: String,
    },
}

/// What runs on the master once a change is committed.
pub type Apply = Box<dyn FnOnce(&Master) + Send>;

/// A record and what to do once it is committed.
pub struct Change {
    /// The record to make durable.
    pub record: Record,
    /// Run by the journal right after the commit (before [`Journal::durable`] reports it).
    pub on_commit: Option<Apply>,
}

impl std::fmt::Debug for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Change")
            .field("record", &self.record)
            .field("on_commit", &self.on_commit.is_some())
            .finish()
    }
}

impl Change {
    /// A change with nothing to apply afterwards.
    pub fn record(record: Record) -> Self {
        Self {
            record,
            on_commit: None,
        }
    }

    /// A change that runs `f` once committed.
    pub fn then(record: Record, f: impl FnOnce(&Master) + Send + 'static) -> Self {
        Self {
            record,
            on_commit: Some(Box::new(f)),
        }
    }
}

/// A future the journal answers [`Journal::durable`] with.
pub type Durable = Pin<Box<dyn Future<Output = MasterResult<()>> + Send>>;

/// Where a master's durable changes go (see the module doc). Changes are committed in the
/// order they were appended; a journal never drops one while its master lives (it retries),
/// and it runs each change's apply step exactly once, after the commit.
pub trait Journal: Send + Sync {
    /// Queues changes; returns the sequence number of the last one (0 when `changes` is
    /// empty and nothing was ever appended). Cheap: callers hold master locks.
    fn append(&self, changes: Vec<Change>) -> u64;

    /// The sequence number of the last change appended so far.
    fn appended(&self) -> u64;

    /// Resolves once every change up to `seq` is committed and applied, or fails with
    /// [`MasterError::Unavailable`](super::MasterError::Unavailable) when that does not
    /// happen in time or cannot happen.
    fn durable(&self, seq: u64) -> Durable;
}

impl Master {
    /// The journal this master writes through, if any.
    pub fn journal(&self) -> Option<&std::sync::Arc<dyn Journal>> {
        self.journal.as_ref()
    }

    /// Waits until every change made so far is durable (at once without a journal). Hosts
    /// call it after each changing operation and before answering.
    pub fn durable(&self) -> Durable {
        match &self.journal {
            None => Box::pin(std::future::ready(Ok(()))),
            Some(j) => j.durable(j.appended()),
        }
    }

    /// Appends `changes` when journaled; no-op otherwise.
    pub(crate) fn journal_append(&self, changes: Vec<Change>) {
        if let Some(j) = &self.journal
            && !changes.is_empty()
        {
            j.append(changes);
        }
    }
}
