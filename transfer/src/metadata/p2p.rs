//! Peer-to-peer metadata: ask the peer for its descriptor over its TCP port.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Result, TransferError};
use crate::metadata::{BoxFuture, Metadata};
use crate::segment::SegmentDescriptor;
use crate::tcp::client::{TcpClient, status_error};
use crate::wire::{Opcode, Status};

/// Fetches descriptors from the peers themselves; the segment name is the peer's
/// `host:port`. Publishing is a no-op: every engine serves its own live descriptor.
pub struct P2pMetadata {
    client: Arc<TcpClient>,
    timeout: Duration,
}

impl std::fmt::Debug for P2pMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("P2pMetadata")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl P2pMetadata {
    pub(crate) fn new(client: Arc<TcpClient>, timeout: Duration) -> Self {
        Self { client, timeout }
    }

    async fn ask(&self, name: &str) -> Result<SegmentDescriptor> {
        let unknown = |reason: String| TransferError::UnknownSegment {
            segment: name.to_owned(),
            reason,
        };
        let addr = tokio::net::lookup_host(name)
            .await
            .map_err(|e| unknown(format!("peer-to-peer segment names are host:port ({e})")))?
            .next()
            .ok_or_else(|| unknown("name resolves to no address".into()))?;
        let peer = self.client.peer(addr, name);
        let (status, payload) = peer
            .call(
                Opcode::Descriptor,
                Vec::new(),
                Instant::now() + self.timeout,
            )
            .await
            .map_err(|e| match e {
                // A dead peer stays "unreachable" (retryable), not "unknown"; one that is not
                // of this cluster says so.
                TransferError::PeerUnreachable { .. } | TransferError::Unauthenticated { .. } => e,
                other => unknown(format!("descriptor request failed: {other}")),
            })?;
        if status != Status::Ok {
            let msg = String::from_utf8_lossy(&payload);
            return Err(status_error(
                status,
                name,
                crate::error::RemoteRange::new(0, 0),
                &msg,
            ));
        }
        SegmentDescriptor::from_json(&payload)
    }
}

impl Metadata for P2pMetadata {
    fn publish<'a>(&'a self, _desc: &'a SegmentDescriptor) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<SegmentDescriptor>>> {
        Box::pin(async move { self.ask(name).await.map(Some) })
    }

    fn remove<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn kind(&self) -> &'static str {
        "p2p"
    }
}
