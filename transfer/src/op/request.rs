//! A transfer request: which bytes move, in which direction, between a local buffer and a
//! peer's segment.

use super::segment::Segment;
use crate::error::RemoteRange;
use crate::registry::RegisteredBuffer;

/// Direction of a transfer, seen from the initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Copy from the peer's memory into the local buffer.
    Read,
    /// Copy from the local buffer into the peer's memory.
    Write,
}

/// One transfer: `len` bytes between `local[local_offset..]` and the peer's `remote_addr`.
#[derive(Debug, Clone)]
pub struct TransferRequest {
    /// Direction.
    pub op: Op,
    /// Local buffer (registered with the submitting engine).
    pub local: RegisteredBuffer,
    /// Offset of the first byte in `local`.
    pub local_offset: usize,
    /// The peer (see `TransferEngine::open_segment`).
    pub segment: Segment,
    /// Peer address of the first byte (inside one of its registered regions).
    pub remote_addr: u64,
    /// Bytes to move (0 completes at once).
    pub len: usize,
}

impl TransferRequest {
    /// A request of direction `op`.
    pub fn new(
        op: Op,
        local: &RegisteredBuffer,
        local_offset: usize,
        segment: &Segment,
        remote_addr: u64,
        len: usize,
    ) -> Self {
        Self {
            op,
            local: local.clone(),
            local_offset,
            segment: segment.clone(),
            remote_addr,
            len,
        }
    }

    /// A write of `local[local_offset..+len]` to `remote_addr` on `segment`.
    pub fn write(
        local: &RegisteredBuffer,
        local_offset: usize,
        segment: &Segment,
        remote_addr: u64,
        len: usize,
    ) -> Self {
        Self::new(Op::Write, local, local_offset, segment, remote_addr, len)
    }

    /// A read of `len` bytes at `remote_addr` on `segment` into `local[local_offset..]`.
    pub fn read(
        local: &RegisteredBuffer,
        local_offset: usize,
        segment: &Segment,
        remote_addr: u64,
        len: usize,
    ) -> Self {
        Self::new(Op::Read, local, local_offset, segment, remote_addr, len)
    }

    /// The remote range, as errors name it.
    pub fn remote_range(&self) -> RemoteRange {
        RemoteRange::new(self.remote_addr, self.len as u64)
    }

    /// Pointer to the first local byte (bounds checked at submit).
    pub(crate) fn local_ptr(&self) -> *mut u8 {
        self.local.region().as_ptr().wrapping_add(self.local_offset)
    }
}
