//! When a rank's KV events leave: as SGLang sends them, a prompt's new pages once its
//! prefill has run, not when the request is admitted. SGLang inserts a request's pages into
//! its radix tree (and queues their `BlockStored`) after the forward pass that computed
//! them; a router reading the events knows a prefix only from then on, which is the window
//! the gateway's predicted pages cover. Batches leave in the order the cache changed:
//! a batch whose prefill ends early still waits for the batches queued before it, so a
//! subscriber never sees a page before its parent.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use sglang::kv_events::publish::Publisher;
use sglang::kv_events::wire::KvEvent;

/// One rank's queue of batches waiting for their prefill; dropping it stops the queue.
#[derive(Debug)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Pending>,
    task: JoinHandle<()>,
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Pending {
    events: Vec<KvEvent>,
    at: oneshot::Receiver<Instant>,
}

/// When a queued batch may leave: [`Release::at`] the end of its prefill, or now when
/// dropped unsent (a request whose prompt was all cached, or that went away).
#[derive(Debug)]
pub struct Release(Option<oneshot::Sender<Instant>>);

impl Release {
    /// A release for a batch that was not queued (nothing to wait for).
    pub fn none() -> Self {
        Release(None)
    }

    /// The batch leaves at `when` (now for `None`).
    pub fn at(mut self, when: Option<Instant>) {
        if let (Some(tx), Some(when)) = (self.0.take(), when) {
            // The queue may be gone (the worker is stopping): nothing left to send to.
            let _ = tx.send(when);
        }
    }
}

impl Outbox {
    /// A queue in front of `publisher`. Needs a tokio runtime.
    pub fn new(publisher: Arc<Publisher>) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending>();
        let task = tokio::spawn(async move {
            while let Some(p) = rx.recv().await {
                // A dropped sender means "now".
                if let Ok(at) = p.at.await {
                    tokio::time::sleep_until(at).await;
                }
                publisher.publish(p.events);
            }
        });
        Outbox { tx, task }
    }

    /// Queues `events` behind every batch queued before; they leave once the returned
    /// [`Release`] says when (and the batches before them have left). Nothing is queued
    /// for no events. Call it under the lock that ordered the changes.
    pub fn queue(&self, events: Vec<KvEvent>) -> Release {
        if events.is_empty() {
            return Release::none();
        }
        let (tx, at) = oneshot::channel();
        // The receiving task only ends when the outbox is dropped.
        let _ = self.tx.send(Pending { events, at });
        Release(Some(tx))
    }
}
