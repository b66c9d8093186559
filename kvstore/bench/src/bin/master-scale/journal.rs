//! The journal of the takeover measurement: an HA leader's log kept in memory.
//!
//! It records what a real journal makes durable (segments mounted, objects put) and runs
//! each change's apply step on [`BenchJournal::commit`], as the etcd journal does after a
//! group commit. It keeps the objects as an HA follower's copy does (`kvmaster::ha`: a map
//! by key in arrival order) and hands them over as a new leader does (moved out, in order): what a
//! takeover restores from, minus the reads from etcd.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use kvmaster::Master;
use kvmaster::master::{Change, Durable, Journal, ObjectRecord, Record, SegmentRecord, Snapshot};

/// Changes queued, and the committed state.
#[derive(Default)]
pub struct BenchJournal {
    queue: Mutex<Vec<Change>>,
    appended: AtomicU64,
    segments: Mutex<Vec<SegmentRecord>>,
    objects: Mutex<IndexMap<String, ObjectRecord>>,
}

impl BenchJournal {
    /// A journal to hand to [`Master::with_journal`].
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Commits everything queued in order and runs the apply steps (no lock of `m` held).
    pub fn commit(&self, m: &Master) {
        let changes = std::mem::take(&mut *self.queue.lock_ok());
        for c in changes {
            match c.record {
                Record::Mount(s) => self.segments.lock_ok().push(s),
                Record::Put(o) => {
                    self.objects.lock_ok().insert(o.key.clone(), o);
                }
                // The bench removes nothing from the journaled master.
                Record::Unmount { .. } | Record::Remove { .. } => {}
            }
            if let Some(apply) = c.on_commit {
                apply(m);
            }
        }
    }

    /// Runs `f` on the committed state taken as a snapshot the way a new leader takes its
    /// copy's (timed: the second of `f`'s arguments), then puts the state back.
    pub fn with_snapshot<T>(&self, f: impl FnOnce(&Snapshot, Duration) -> T) -> T {
        let t = Instant::now();
        let snapshot = Snapshot {
            segments: self.segments.lock_ok().clone(),
            objects: std::mem::take(&mut *self.objects.lock_ok())
                .into_values()
                .collect(),
        };
        let took = t.elapsed();
        let out = f(&snapshot, took);
        *self.objects.lock_ok() = snapshot
            .objects
            .into_iter()
            .map(|o| (o.key.clone(), o))
            .collect();
        out
    }
}

/// Locks a mutex; a panic elsewhere poisons nothing the bench would go on with.
trait LockOk<T> {
    fn lock_ok(&self) -> MutexGuard<'_, T>;
}

impl<T> LockOk<T> for Mutex<T> {
    fn lock_ok(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Journal for BenchJournal {
    fn append(&self, changes: Vec<Change>) -> u64 {
        let n = changes.len() as u64;
        self.queue.lock_ok().extend(changes);
        self.appended.fetch_add(n, Ordering::Relaxed) + n
    }

    fn appended(&self) -> u64 {
        self.appended.load(Ordering::Relaxed)
    }

    fn durable(&self, _seq: u64) -> Durable {
        // The bench commits by hand between steps; nothing waits on it.
        Box::pin(std::future::ready(Ok(())))
    }
}
