//! The publishing end (what SGLang's `ZmqEventPublisher` does): a PUB socket bound where
//! the config says, each batch sent as `[topic, seq (u64 BE), payload]` with `seq`
//! counting from 0, the last `buffer_steps` batches kept for the replay ROUTER socket.
//! Batches are queued without blocking the caller; when the queue is full a batch is
//! dropped (subscribers see the gap and replay or resync).

use std::collections::VecDeque;

use anyhow::Context as _;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::wire::{END_SEQ, EventBatch, KvEvent};
use super::{KvEventsConfig, bindable};

/// A running publisher; dropping it stops the task and closes the sockets.
#[derive(Debug)]
pub struct Publisher {
    tx: mpsc::Sender<Vec<KvEvent>>,
    endpoint: String,
    replay_endpoint: Option<String>,
    task: JoinHandle<()>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Publisher {
    /// Binds the PUB socket (and the replay socket) and starts publishing.
    pub async fn start(cfg: &KvEventsConfig) -> anyhow::Result<Self> {
        let mut publ = PubSocket::new();
        let endpoint = publ
            .bind(&bindable(&cfg.endpoint))
            .await
            .with_context(|| format!("binding the KV events endpoint {}", cfg.endpoint))?
            .to_string();
        let (router, replay_endpoint) = match &cfg.replay_endpoint {
            Some(r) => {
                let mut router = RouterSocket::new();
                let bound = router
                    .bind(&bindable(r))
                    .await
                    .with_context(|| format!("binding the KV events replay endpoint {r}"))?;
                (Some(router), Some(bound.to_string()))
            }
            None => (None, None),
        };
        let (tx, rx) = mpsc::channel(cfg.max_queue_size.max(1));
        let task = tokio::spawn(run(
            publ,
            router,
            rx,
            Bytes::from(cfg.topic.clone().into_bytes()),
            cfg.buffer_steps,
        ));
        Ok(Publisher {
            tx,
            endpoint,
            replay_endpoint,
            task,
        })
    }

    /// Where the PUB socket is bound (the port resolved).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Where the replay socket is bound.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Queues `events` as one batch (nothing for none). Never blocks.
    pub fn publish(&self, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        if self.tx.try_send(events).is_err() {
            tracing::warn!("KV events queue full: a batch was dropped");
        }
    }
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

async fn run(
    mut publ: PubSocket,
    mut router: Option<RouterSocket>,
    mut rx: mpsc::Receiver<Vec<KvEvent>>,
    topic: Bytes,
    keep: usize,
) {
    let mut seq: u64 = 0;
    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::with_capacity(keep.min(1024));
    loop {
        let replay = async {
            match router.as_mut() {
                Some(r) => r.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            batch = rx.recv() => {
                let Some(events) = batch else { return };
                let payload = Bytes::from(EventBatch { ts: now_secs(), events, attn_dp_rank: Some(0) }.encode());
                let msg = frames(vec![topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()]);
                if let Err(e) = publ.send(msg).await {
                    tracing::warn!(error = %e, "publishing KV events failed");
                }
                if keep > 0 {
                    if buffer.len() == keep {
                        buffer.pop_front();
                    }
                    buffer.push_back((seq, payload));
                }
                seq += 1;
            }
            req = replay => match req {
                Ok(m) => {
                    if let Some(r) = router.as_mut() {
                        serve_replay(r, m, &buffer).await;
                    }
                }
                Err(e) => tracing::debug!(error = %e, "KV events replay socket"),
            },
        }
    }
}

fn frames(parts: Vec<Bytes>) -> ZmqMessage {
    // Never empty: every caller passes at least two frames.
    ZmqMessage::try_from(parts).unwrap_or_else(|_| ZmqMessage::from(Bytes::new()))
}

/// Answers `[identity, empty, start_seq]` with every buffered batch from `start_seq` on,
/// then the end marker; anything else is ignored (as SGLang does).
async fn serve_replay(router: &mut RouterSocket, req: ZmqMessage, buffer: &VecDeque<(u64, Bytes)>) {
    let parts = req.into_vec();
    let [id, _, start] = parts.as_slice() else {
        tracing::debug!(frames = parts.len(), "invalid KV events replay request");
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
        return;
    };
    for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
        let m = frames(vec![
            id.clone(),
            Bytes::new(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload.clone(),
        ]);
        if router.send(m).await.is_err() {
            return;
        }
    }
    let _ = router
        .send(frames(vec![
            id.clone(),
            Bytes::new(),
            Bytes::from_static(&END_SEQ),
            Bytes::new(),
        ]))
        .await;
}
