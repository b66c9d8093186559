//! The subscribing end: one task per worker, connected to its PUB socket (the `zeromq`
//! crate reconnects a dropped connection by itself; a connection that cannot be made is
//! retried with backoff). Every batch goes to an [`EventSink`] in sequence order:
//! - the first batch after connecting, if the worker has a replay socket, is preceded by
//!   the history the worker still buffers (so a gateway that starts late learns the cache);
//! - a gap (`seq` jumps ahead) is filled from the replay socket; when that is impossible
//!   the sink is told to forget the worker ([`EventSink::resync`]) and starts over;
//! - a sequence that goes back means the worker restarted: resync, then go on.

use backon::BackoffBuilder;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::wire::{END_SEQ, EventBatch};

/// How long a replay may take before the subscriber gives up on it and resyncs.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait between connection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Reconnection delay after a first failure; doubled after each further one.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// Where a subscriber's events go.
pub trait EventSink: Send + Sync + 'static {
    /// A batch, in order.
    fn apply(&self, batch: &EventBatch);
    /// Forget everything known about this worker (events were lost).
    fn resync(&self);
    /// The subscriber is connected (`true`) or gave up on a connection (`false`).
    fn connected(&self, _up: bool) {}
}

/// One worker's event endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The PUB endpoint (`tcp://host:port`).
    pub endpoint: String,
    /// The replay ROUTER endpoint.
    pub replay_endpoint: Option<String>,
    /// The topic to subscribe to (`""`: all).
    pub topic: String,
}

/// Runs a subscriber for `src` until `stop` is cancelled.
pub async fn run(src: Source, sink: Arc<dyn EventSink>, stop: CancellationToken) {
    let backoff = || {
        backon::ExponentialBuilder::new()
            .with_min_delay(FIRST_BACKOFF)
            .with_max_delay(MAX_BACKOFF)
            .without_max_times()
            .build()
    };
    let mut delays = backoff();
    let mut first_connect = true;
    loop {
        let mut sub = SubSocket::new();
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            r = sub.connect(&src.endpoint) => r,
        };
        if let Err(e) = connected {
            sink.connected(false);
            tracing::debug!(endpoint = %src.endpoint, error = %e, "KV events: connect failed");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delays.next().unwrap_or(MAX_BACKOFF)) => {}
            }
            continue;
        }
        if sub.subscribe(&src.topic).await.is_err() {
            continue;
        }
        delays = backoff();
        if !first_connect {
            sink.resync();
        }
        first_connect = false;
        sink.connected(true);
        tracing::info!(endpoint = %src.endpoint, "KV events: subscribed");
        let mut last: Option<u64> = None;
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return,
                m = sub.recv() => m,
            };
            let Ok(msg) = msg else { break };
            let Some((seq, batch)) = parse_pub(msg) else {
                continue;
            };
            match last {
                None if seq > 0 => {
                    if let Some(r) = &src.replay_endpoint {
                        let _ = replay(r, 0, seq, sink.as_ref()).await;
                    }
                }
                Some(l) if seq == l.wrapping_add(1) => {}
                Some(l) if seq > l => {
                    let filled = match &src.replay_endpoint {
                        Some(r) => replay(r, l + 1, seq, sink.as_ref()).await,
                        None => false,
                    };
                    if !filled {
                        tracing::warn!(endpoint = %src.endpoint, missed = seq - l - 1,
                            "KV events: gap without replay, forgetting the worker's cache");
                        sink.resync();
                    }
                }
                Some(_) => {
                    tracing::info!(endpoint = %src.endpoint, "KV events: sequence restarted");
                    sink.resync();
                }
                None => {}
            }
            last = Some(seq);
            if let Some(b) = batch {
                sink.apply(&b);
            }
        }
        sink.connected(false);
    }
}

/// `[topic, seq, payload]` -> the sequence number and the batch (`None` for a payload that
/// does not decode: the sequence still counts).
fn parse_pub(msg: ZmqMessage) -> Option<(u64, Option<EventBatch>)> {
    let parts = msg.into_vec();
    let [_, seq, payload] = parts.as_slice() else {
        return None;
    };
    let seq = u64::from_be_bytes(<[u8; 8]>::try_from(seq.as_ref()).ok()?);
    match EventBatch::decode(payload) {
        Ok(b) => Some((seq, Some(b))),
        Err(e) => {
            tracing::debug!(error = %e, "KV events: undecodable batch");
            Some((seq, None))
        }
    }
}

/// Asks `endpoint` for batches `from..until` and applies them in order; false when the
/// replay failed or did not cover the range.
async fn replay(endpoint: &str, from: u64, until: u64, sink: &dyn EventSink) -> bool {
    let fetch = async {
        let mut d = DealerSocket::new();
        d.connect(endpoint).await.ok()?;
        let req = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&from.to_be_bytes()),
        ])
        .ok()?;
        d.send(req).await.ok()?;
        let mut got = Vec::new();
        loop {
            let m = d.recv().await.ok()?;
            let mut parts = m.into_vec();
            if parts.first().is_some_and(|p| p.is_empty()) {
                parts.remove(0);
            }
            let [seq, payload] = parts.as_slice() else {
                return None;
            };
            if seq.as_ref() == END_SEQ {
                return Some(got);
            }
            let seq = u64::from_be_bytes(<[u8; 8]>::try_from(seq.as_ref()).ok()?);
            if seq >= from && seq < until {
                got.push((seq, EventBatch::decode(payload).ok()));
            }
        }
    };
    let Ok(Some(got)) = tokio::time::timeout(REPLAY_TIMEOUT, fetch).await else {
        return false;
    };
    let complete =
        got.len() as u64 == until - from && got.iter().zip(from..).all(|((s, _), want)| *s == want);
    if !complete {
        return false;
    }
    for (_, b) in got.iter() {
        if let Some(b) = b {
            sink.apply(b);
        }
    }
    true
}
