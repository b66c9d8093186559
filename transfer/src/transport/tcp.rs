//! TCP (`crate::tcp`): every request into a peer that no transport before it took, and the
//! fallback of those that took one and could not carry it. A local buffer in device memory
//! is staged through pinned buffers on its way (`tcp::staged`).

use std::sync::Arc;

use super::{Kind, Offer, Offered, Target, Transport};
use crate::copy::Copies;
use crate::tcp::client::TcpClient;

/// TCP, over the engine's pool of peers.
pub(crate) struct Tcp {
    client: Arc<TcpClient>,
}

impl Tcp {
    /// TCP through `client`'s lanes.
    pub(crate) fn new(client: Arc<TcpClient>) -> Self {
        Self { client }
    }
}

impl Transport for Tcp {
    fn kind(&self) -> Kind {
        Kind::Tcp
    }

    fn offer<'a>(&'a self, req: &Offered<'a>, _: &mut Copies) -> Offer<'a> {
        let Target::Peer { desc, region } = req.target else {
            return Offer::Pass;
        };
        match desc.tcp_addr() {
            Ok(addr) => {
                let peer = self.client.peer(addr, req.request().segment.name());
                let (batch, idx, token) = (req.batch, req.idx, region.token);
                Offer::Queue(Box::pin(async move {
                    peer.send_request(batch, idx, token).await
                }))
            }
            Err(e) => Offer::Failed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::op::BatchState;
    use crate::tcp::client::ClientConfig;

    /// The TCP transport boxes one `send_request` future per request: it must stay small
    /// (within the allocator's per-thread cache, 1 KiB), so connecting and staging, which
    /// are large and rare, are boxed apart inside it.
    #[tokio::test]
    async fn the_future_boxed_per_request_stays_small() {
        let client = TcpClient::new(ClientConfig::for_tests());
        let peer = client.peer("127.0.0.1:1".parse().unwrap(), "p:1");
        let batch = BatchState::new(Vec::new(), Duration::from_secs(1));
        let queued = peer.send_request(&batch, 0, 1);
        let size = std::mem::size_of_val(&queued);
        assert!(size <= 1024, "send_request's future is {size} bytes");
    }
}
