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
