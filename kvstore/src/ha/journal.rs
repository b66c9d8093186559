//! The leader's journal: changes queued by the master, committed to etcd in fenced group
//! transactions, applied, then reported durable.
//!
//! One task (the *pipeline*) takes queued changes in order, as many as fit one transaction
//! (`max_txn_ops`, [`MAX_TXN_BYTES`], and no key twice, which etcd refuses), and commits
//! them with `Compare(create_revision(leader) == term)`: a master that is no longer the
//! leader cannot write, whatever it believes. While a transaction is in flight, new changes
//! queue up and go together in the next one (group commit). A failed transaction is retried
//! (with backoff) until it commits or this master stops leading; waiters give up after the
//! commit timeout with `UNAVAILABLE`, and nothing they asked for was acknowledged.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::config::MAX_TXN_BYTES;
use super::layout::{Layout, Write};
use crate::master::{Change, Durable, Journal, Master, MasterError};

/// Committed sequence number, and whether the journal is closed (no more commits).
type Progress = (u64, bool);

/// A journal committing to etcd; see the module doc.
pub(crate) struct EtcdJournal {
    queue: Mutex<Queue>,
    wake: Notify,
    progress: watch::Sender<Progress>,
    timeout: Duration,
}

#[derive(Default)]
struct Queue {
    last: u64,
    items: VecDeque<(u64, Change)>,
}

/// Why the pipeline stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Asked to.
    Stopped,
    /// A transaction's fence failed: another master leads.
    Deposed,
}

impl EtcdJournal {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            progress: watch::Sender::new((0, false)),
            timeout,
        }
    }

    /// No change will be committed any more: every waiter fails at once.
    pub(crate) fn close(&self) {
        self.progress.send_modify(|p| p.1 = true);
    }

    /// The next transaction's changes, taken off the queue.
    fn take_batch(&self, layout: &Layout, max_ops: usize) -> Vec<(u64, Change, Write)> {
        let mut q = self.queue.lock();
        let mut batch = Vec::new();
        let (mut bytes, mut keys) = (0usize, HashSet::new());
        while let Some((_, change)) = q.items.front() {
            let write = layout.write(&change.record);
            let full = batch.len() >= max_ops || bytes + write.bytes() > MAX_TXN_BYTES;
            if !batch.is_empty() && (full || keys.contains(write.key())) {
                break;
            }
            bytes += write.bytes();
            keys.insert(write.key().to_vec());
            let (seq, change) = q.items.pop_front().expect("front exists");
            batch.push((seq, change, write));
        }
        batch
    }

    /// Commits queued changes until `stop`, or until a fence fails.
    pub(crate) async fn run(
        self: Arc<Self>,
        master: Arc<Master>,
        mut client: Client,
        layout: Layout,
        term: i64,
        max_ops: usize,
        stop: CancellationToken,
    ) -> Exit {
        let fence = Compare::create_revision(layout.leader(), CompareOp::Equal, term);
        loop {
            let batch = self.take_batch(&layout, max_ops);
            if batch.is_empty() {
                tokio::select! {
                    _ = stop.cancelled() => return Exit::Stopped,
                    _ = self.wake.notified() => continue,
                }
            }
            let mut backoff = Duration::from_millis(20);
            loop {
                let ops: Vec<TxnOp> = batch
                    .iter()
                    .map(|(_, _, w)| match w {
                        Write::Put(k, v) => TxnOp::put(k.clone(), v.clone(), None),
                        Write::Delete(k) => TxnOp::delete(k.clone(), None),
                    })
                    .collect();
                let txn = Txn::new().when(vec![fence.clone()]).and_then(ops);
                let answer = tokio::select! {
                    _ = stop.cancelled() => return Exit::Stopped,
                    r = client.txn(txn) => r,
                };
                match answer {
                    Ok(r) if r.succeeded() => break,
                    Ok(_) => {
                        tracing::warn!(term, "etcd refused a write: another master leads now");
                        return Exit::Deposed;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, changes = batch.len(), "etcd commit failed; retrying");
                        tokio::select! {
                            _ = stop.cancelled() => return Exit::Stopped,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_millis(500));
                    }
                }
            }
            crate::metrics::record_ha_commit(batch.len());
            let mut last = 0;
            for (seq, change, _) in batch {
                if let Some(apply) = change.on_commit {
                    apply(&master);
                }
                last = seq;
            }
            self.progress.send_modify(|p| p.0 = p.0.max(last));
        }
    }
}

impl Journal for EtcdJournal {
    fn append(&self, changes: Vec<Change>) -> u64 {
        let mut q = self.queue.lock();
        for c in changes {
            q.last += 1;
            let seq = q.last;
            q.items.push_back((seq, c));
        }
        let last = q.last;
        drop(q);
        self.wake.notify_one();
        last
    }

    fn appended(&self) -> u64 {
        self.queue.lock().last
    }

    fn durable(&self, seq: u64) -> Durable {
        let mut rx = self.progress.subscribe();
        let timeout = self.timeout;
        Box::pin(async move {
            let reached = tokio::time::timeout(timeout, rx.wait_for(|p| p.0 >= seq || p.1)).await;
            match reached {
                Ok(Ok(p)) if p.0 >= seq => Ok(()),
                Ok(_) => Err(MasterError::Unavailable(
                    "this master stopped leading before the change was committed; retry".into(),
                )),
                Err(_) => Err(MasterError::Unavailable(format!(
                    "the change was not committed to etcd within {} ms; retry",
                    timeout.as_millis()
                ))),
            }
        })
    }
}
