//! Notifications: small messages a peer sends to this node after its transfers completed
//! (e.g. "the KV pages of request R are in your memory"). They travel over the TCP control
//! path after the writes they describe were acknowledged, so a notification is never seen
//! before the bytes it announces.

use std::sync::Arc;

use tokio::sync::{Mutex, mpsc};

/// A message from a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sender's segment name, as it authenticated (bound to its proof of the cluster
    /// secret in the connection's handshake; never taken from the message).
    pub from: String,
    /// The sender's socket address (`None` for a notification this engine sent itself).
    pub peer_addr: Option<std::net::SocketAddr>,
    /// The message bytes (at most 64 KiB).
    pub message: Vec<u8>,
}

/// The receiving end of this engine's notification queue (cheap to clone; clones share
/// the queue, each message goes to one receiver).
#[derive(Debug, Clone)]
pub struct Notifications {
    rx: Arc<Mutex<mpsc::Receiver<Notification>>>,
}

impl Notifications {
    pub(crate) fn new(rx: mpsc::Receiver<Notification>) -> Self {
        Self {
            rx: Arc::new(Mutex::new(rx)),
        }
    }

    /// Waits for the next notification; `None` once the engine shut down and the queue is
    /// empty.
    pub async fn recv(&self) -> Option<Notification> {
        self.rx.lock().await.recv().await
    }

    /// The next notification if one is queued.
    pub fn try_recv(&self) -> Option<Notification> {
        self.rx.try_lock().ok()?.try_recv().ok()
    }
}
