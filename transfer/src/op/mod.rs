//! Operations and their completion: what the engine hands a transport, and how a transport
//! reports back. Every transport and every copy path imports this layer; it imports none
//! of them.
//!
//! - `request`: one transfer ([`Op`], [`TransferRequest`]): which bytes move, in which
//!   direction, between a registered buffer and a peer's segment.
//! - `segment`: the [`Segment`] handle a request names: a peer's descriptor, refreshed when
//!   stale, and what transports keep for that peer (`PeerCache`, known only as a trait).
//! - `batch`: a submitted batch's shared state, the completion of each slice a transport
//!   sends (`Completion`), the landings that write into local buffers (`Landing`), and
//!   the caller's handle ([`Batch`]).

mod batch;
mod request;
mod segment;

pub(crate) use batch::{Abort, BatchState, Completion, Landing};
pub use batch::{Batch, RequestStatus};
pub use request::{Op, TransferRequest};
pub use segment::Segment;
pub(crate) use segment::{DescribeFn, PeerCache};
