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
//!
//! Up to `--ha-txns-in-flight` transactions are under way at once (a single writer waiting
//! for each commit would leave etcd idle between them). They never write the same key: a
//! change whose key a transaction in flight writes waits, with everything queued after it,
//! so two writes of one key commit in the order they were made. Whatever order etcd
//! commits them in, changes are applied and reported durable in the order they were
//! appended (a change is durable once it and everything before it is).

use backon::BackoffBuilder;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use futures::StreamExt;
use futures::stream::FuturesOrdered;
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

/// One transaction's changes (with their sequence numbers) and the writes they make.
#[derive(Default)]
struct Batch {
    changes: Vec<(u64, Change)>,
    writes: Vec<Write>,
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

    /// The next transaction's changes, taken off the queue: as many as fit, stopping at a
    /// key this batch or a transaction in flight (`busy`) already writes, which must wait
    /// (two writes of one key commit in the order they were made).
    fn take_batch(&self, layout: &Layout, max_ops: usize, busy: &HashMap<Vec<u8>, usize>) -> Batch {
        let mut q = self.queue.lock();
        let mut batch = Batch::default();
        let (mut bytes, mut keys) = (0usize, HashSet::new());
        while let Some((_, change)) = q.items.front() {
            let write = layout.write(&change.record);
            if busy.contains_key(write.key()) {
                break;
            }
            let full = batch.writes.len() >= max_ops || bytes + write.bytes() > MAX_TXN_BYTES;
            if !batch.writes.is_empty() && (full || keys.contains(write.key())) {
                break;
            }
            bytes += write.bytes();
            keys.insert(write.key().to_vec());
            batch
                .changes
                .push(q.items.pop_front().expect("front exists"));
            batch.writes.push(write);
        }
        batch
    }

    /// Commits queued changes until `stop`, or until a fence fails. Up to `in_flight`
    /// transactions are under way at once, on disjoint keys; their changes are applied and
    /// reported durable in the order they were appended.
    pub(crate) async fn run(
        self: Arc<Self>,
        master: Arc<Master>,
        client: Client,
        layout: Layout,
        term: i64,
        limits: (usize, usize),
        stop: CancellationToken,
    ) -> Exit {
        let (max_ops, in_flight) = limits;
        let fence = Compare::create_revision(layout.leader(), CompareOp::Equal, term);
        let mut pending = FuturesOrdered::new();
        let mut busy: HashMap<Vec<u8>, usize> = HashMap::new();
        loop {
            while pending.len() < in_flight.max(1) {
                let batch = self.take_batch(&layout, max_ops, &busy);
                if batch.writes.is_empty() {
                    break;
                }
                for w in &batch.writes {
                    *busy.entry(w.key().to_vec()).or_default() += 1;
                }
                let (client, fence, stop) = (client.clone(), fence.clone(), stop.clone());
                pending.push_back(async move {
                    let exit = commit(client, fence, &batch.writes, stop).await;
                    (batch, exit)
                });
            }
            if pending.is_empty() {
                tokio::select! {
                    _ = stop.cancelled() => return Exit::Stopped,
                    _ = self.wake.notified() => continue,
                }
            }
            let (batch, exit) = tokio::select! {
                _ = stop.cancelled() => return Exit::Stopped,
                _ = self.wake.notified(), if pending.len() < in_flight => continue,
                done = pending.next() => done.expect("not empty"),
            };
            if let Some(exit) = exit {
                return exit;
            }
            crate::metrics::record_ha_commit(batch.writes.len());
            let mut last = 0;
            for ((seq, change), w) in batch.changes.into_iter().zip(&batch.writes) {
                if let Some(n) = busy.get_mut(w.key()) {
                    *n -= 1;
                    if *n == 0 {
                        busy.remove(w.key());
                    }
                }
                if let Some(apply) = change.on_commit {
                    apply(&master);
                }
                last = seq;
            }
            self.progress.send_modify(|p| p.0 = p.0.max(last));
        }
    }
}

/// Commits one batch in a fenced transaction, retrying errors with backoff: `None` once
/// committed, `Some(why)` when it must not or cannot be.
async fn commit(
    mut client: Client,
    fence: Compare,
    batch: &[Write],
    stop: CancellationToken,
) -> Option<Exit> {
    let mut delays = backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_millis(500))
        .without_max_times()
        .build();
    loop {
        let ops: Vec<TxnOp> = batch
            .iter()
            .map(|w| match w {
                Write::Put(k, v) => TxnOp::put(k.clone(), v.clone(), None),
                Write::Delete(k) => TxnOp::delete(k.clone(), None),
            })
            .collect();
        let txn = Txn::new().when(vec![fence.clone()]).and_then(ops);
        let answer = tokio::select! {
            _ = stop.cancelled() => return Some(Exit::Stopped),
            r = client.txn(txn) => r,
        };
        match answer {
            Ok(r) if r.succeeded() => return None,
            Ok(_) => {
                tracing::warn!("etcd refused a write: another master leads now");
                return Some(Exit::Deposed);
            }
            Err(e) => {
                tracing::warn!(error = %e, changes = batch.len(), "etcd commit failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return Some(Exit::Stopped),
                    _ = tokio::time::sleep(delays.next().unwrap_or(Duration::from_millis(500))) => {}
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::{ObjectRecord, Record};

    fn put(key: &str) -> Change {
        Change::record(Record::Put(ObjectRecord {
            key: key.into(),
            length: 1,
            client: uuid::Uuid::nil(),
            soft_pin: false,
            hard_pin: false,
            replicas: Vec::new(),
        }))
    }

    fn remove(key: &str) -> Change {
        Change::record(Record::Remove { key: key.into() })
    }

    fn seqs(batch: &Batch) -> Vec<u64> {
        batch.changes.iter().map(|(s, _)| *s).collect()
    }

    #[test]
    fn batches_keep_each_key_in_order_and_within_limits() {
        let j = EtcdJournal::new(Duration::from_secs(1));
        let layout = Layout::new("/moongate/t/".into());
        assert_eq!(j.append(vec![put("a"), remove("a"), put("b"), put("c")]), 4);
        let none = HashMap::new();
        // A key twice in one transaction is refused by etcd: the batch stops there.
        let first = j.take_batch(&layout, 128, &none);
        assert_eq!(seqs(&first), [1]);
        // While that transaction is in flight, the next change of its key waits, and so
        // does everything after it.
        let busy: HashMap<Vec<u8>, usize> =
            first.writes.iter().map(|w| (w.key().to_vec(), 1)).collect();
        assert!(j.take_batch(&layout, 128, &busy).writes.is_empty());
        assert_eq!(seqs(&j.take_batch(&layout, 2, &none)), [2, 3]);
        assert_eq!(seqs(&j.take_batch(&layout, 2, &none)), [4]);
        assert!(j.take_batch(&layout, 2, &none).writes.is_empty());
        assert_eq!(j.appended(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_fail_once_the_journal_closes_and_time_out_otherwise() {
        let j = EtcdJournal::new(Duration::from_millis(50));
        let seq = j.append(vec![put("a")]);
        let timed_out = j.durable(seq).await.unwrap_err().to_string();
        assert!(timed_out.contains("not committed"), "{timed_out}");
        let waiting = j.durable(seq);
        j.close();
        let closed = waiting.await.unwrap_err().to_string();
        assert!(closed.contains("stopped leading"), "{closed}");
        j.progress.send_modify(|p| p.0 = 1);
        assert!(j.durable(0).await.is_ok());
    }
}
