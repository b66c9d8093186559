//! The one interface the engine routes requests through. Every transport is a
//! [`Transport`]: the engine holds them as boxed objects in preference order and offers
//! each request to them in turn; it never names one (the shape of rust-libp2p's
//! `core::transport::Transport`). A transport imports only the layers below it (`op`,
//! `copy`, its own module: `tcp`, `shm`, `ipc`, `rdma`), never the engine.
//!
//! A request reaches the transports resolved ([`Target`]): into the engine's own segment, or
//! into a region of a peer's descriptor (the engine found the region, refetching a stale
//! descriptor). Each transport answers with an [`Offer`]:
//! - `Pass`: not its request (another host, no mapping, no RDMA key...): the next is asked.
//! - `Fallback`: its request, which it cannot carry now (a mapping that does not open): the
//!   last transport, the fallback every peer speaks (TCP), carries it.
//! - `Failed`: its request, refused (a range in none of the engine's own regions).
//! - `Collected`: carried by memory copy: the job is in the batch's [`Copies`], which run
//!   together once the whole batch is dispatched (the host copies spread over the worker
//!   threads as one set, the device copies started and waited for by one task), which is
//!   what their speed depends on.
//! - `Queue`: carried over the network: the future queues it (waiting for room in flight
//!   when the lanes or queue pairs are full), and only then is the next request offered.
//!
//! The transports, in the engine's preference order:
//! - `local`: requests into the engine's own segment, copied (host or device memory).
//! - `ipc`: a same-host peer's device region opened through CUDA IPC, copied device to
//!   device (falls back to TCP, which stages it).
//! - `shm`: a same-host peer's shared region, mapped and copied (falls back to TCP).
//! - `rdma`: one-sided RDMA where both sides have a device with a key for the region.
//! - `tcp`: everything else, and the fallback; a local buffer in device memory is staged
//!   through pinned buffers on its way (`tcp::staged`).

mod ipc;
mod local;
mod rdma;
mod shm;
mod tcp;

pub(crate) use ipc::Ipc;
pub(crate) use local::Local;
pub(crate) use rdma::Rdma;
pub(crate) use shm::Shm;
pub(crate) use tcp::Tcp;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::copy::Copies;
use crate::error::TransferError;
use crate::op::{BatchState, TransferRequest};
use crate::segment::{RegionDescriptor, SegmentDescriptor};

/// Which transport carried a request (the engine counts bytes per kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Copies within the engine's own segment.
    Local,
    /// Copies into or out of a same-host peer's device memory (CUDA IPC).
    Ipc,
    /// Copies into or out of a same-host peer's shared memory.
    Shm,
    /// One-sided RDMA.
    Rdma,
    /// TCP (staged for device memory).
    Tcp,
}

impl Kind {
    /// How many kinds there are (`Tcp` is the last).
    pub(crate) const COUNT: usize = Kind::Tcp as usize + 1;

    /// Its name, lower case (`tcp`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Local => "local",
            Kind::Ipc => "ipc",
            Kind::Shm => "shm",
            Kind::Rdma => "rdma",
            Kind::Tcp => "tcp",
        }
    }
}

/// Where a request goes, as the engine resolved it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target<'a> {
    /// The engine's own segment.
    Own,
    /// A peer's segment: its descriptor as last fetched, and the region of it that holds
    /// the request's remote range.
    Peer {
        /// The peer's descriptor.
        desc: &'a SegmentDescriptor,
        /// The region holding the remote range.
        region: &'a RegionDescriptor,
    },
}

/// A request offered to the transports: request `idx` of `batch`, resolved.
pub(crate) struct Offered<'a> {
    /// The batch (it holds the request, its buffers, and its completion).
    pub(crate) batch: &'a Arc<BatchState>,
    /// The request's index in the batch.
    pub(crate) idx: usize,
    /// Where it goes.
    pub(crate) target: Target<'a>,
}

impl Offered<'_> {
    /// The request.
    pub(crate) fn request(&self) -> &TransferRequest {
        &self.batch.requests[self.idx]
    }
}

/// A transport's answer to an offered request (see the module doc).
pub(crate) enum Offer<'a> {
    /// Not this transport's request: ask the next.
    Pass,
    /// This transport's request, which it cannot carry now: the fallback carries it.
    Fallback,
    /// This transport's request, refused with this error.
    Failed(TransferError),
    /// Taken: collected into the batch's copies.
    Collected,
    /// Taken: queued once this future is done.
    Queue(Pin<Box<dyn Future<Output = ()> + Send + 'a>>),
}

/// A way to move a request's bytes (see the module doc).
pub(crate) trait Transport: Send + Sync {
    /// Which transport this is.
    fn kind(&self) -> Kind;

    /// Takes the request, or passes it on. A transport that carries requests by memory
    /// copy collects them into `copies`, which run once the whole batch is dispatched.
    fn offer<'a>(&'a self, req: &Offered<'a>, copies: &mut Copies) -> Offer<'a>;
}
