//! The crate's one error type, classified once: every failure names the peer (segment) and
//! the remote range it concerns, and says whether retrying can help.

use std::fmt;
use std::time::Duration;

/// A remote byte range `[addr, addr + len)` in a peer's segment, as named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRange {
    /// First byte (the peer's virtual address, as published in its descriptor).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteRange {
    /// The range `[addr, addr + len)`.
    pub fn new(addr: u64, len: u64) -> Self {
        Self { addr, len }
    }
}

impl fmt::Display for RemoteRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}, +{})", self.addr, self.len)
    }
}

/// Everything that can go wrong in the transfer engine.
///
/// Cloneable because one failure (a connection dying) fails many requests at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// No descriptor is known for this segment name (metadata has no entry, or the peer
    /// did not answer the descriptor request).
    #[error("unknown segment {segment:?}: {reason}")]
    UnknownSegment {
        /// Segment name as asked.
        segment: String,
        /// Why it could not be resolved.
        reason: String,
    },
    /// The remote range is not inside one registered region of the peer (never registered,
    /// unregistered since, or crossing a region's end).
    #[error("segment {segment}: range {range} is outside every registered region ({reason})")]
    OutOfBounds {
        /// Peer segment.
        segment: String,
        /// Offending remote range.
        range: RemoteRange,
        /// Which check failed.
        reason: String,
    },
    /// The peer refused the access token for this range (stale or forged descriptor).
    #[error("segment {segment}: access token rejected for range {range}")]
    BadToken {
        /// Peer segment.
        segment: String,
        /// Remote range of the refused request.
        range: RemoteRange,
    },
    /// The peer could not be reached, or its connection broke while the request was in flight.
    #[error("segment {segment}: peer unreachable ({reason})")]
    PeerUnreachable {
        /// Peer segment.
        segment: String,
        /// Connect error, reset, EOF, dead process...
        reason: String,
    },
    /// The request did not complete within its timeout.
    #[error("segment {segment}: request on {range} timed out after {timeout:?}")]
    TimedOut {
        /// Peer segment.
        segment: String,
        /// Remote range of the request.
        range: RemoteRange,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The request was cancelled by its submitter before it completed.
    #[error("segment {segment}: request on {range} cancelled")]
    Cancelled {
        /// Peer segment.
        segment: String,
        /// Remote range of the request.
        range: RemoteRange,
    },
    /// The peer spoke something that is not this protocol, or broke its rules.
    #[error("segment {segment}: protocol error: {reason}")]
    Protocol {
        /// Peer segment (or peer address when no segment is known yet).
        segment: String,
        /// What was wrong.
        reason: String,
    },
    /// The request itself is malformed before anything is sent (local range out of its
    /// buffer, buffer registered with another engine, zero-sized allocation...).
    #[error("invalid request: {reason}")]
    InvalidRequest {
        /// What is wrong with it.
        reason: String,
    },
    /// Allocating, mapping or registering memory failed.
    #[error("memory: {reason}")]
    Memory {
        /// The failing call and its OS error.
        reason: String,
    },
    /// The metadata service failed (HTTP error, unreachable, undecodable descriptor).
    #[error("metadata {operation} {key:?}: {reason}")]
    Metadata {
        /// `publish`, `fetch` or `remove`.
        operation: &'static str,
        /// The key or segment concerned.
        key: String,
        /// What failed.
        reason: String,
    },
    /// A transport was asked for but cannot run here (e.g. `rdma` with no RDMA device).
    #[error("transport {transport} unavailable: {reason}")]
    TransportUnavailable {
        /// `rdma`, `shm`, `tcp`.
        transport: &'static str,
        /// Why, and what to use instead.
        reason: String,
    },
    /// The peer is busy (its notification queue is full); retry later.
    #[error("segment {segment}: peer busy ({reason})")]
    Busy {
        /// Peer segment.
        segment: String,
        /// What is full.
        reason: String,
    },
    /// Local I/O setup failed (binding the listener, socket options).
    #[error("{context}: {reason}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        reason: String,
    },
    /// The engine (or the peer) is shutting down and takes no new requests.
    #[error("engine is shut down")]
    Shutdown,
    /// The peer and this node could not authenticate each other (different cluster
    /// secrets, a peer of protocol v1, or a peer that is not a transfer engine).
    #[error("segment {segment}: not authenticated: {reason}")]
    Unauthenticated {
        /// Peer segment (or address).
        segment: String,
        /// What failed.
        reason: String,
    },
    /// Device (GPU) memory cannot be used as asked: no driver, a pointer that is not where
    /// it was said to be, or a device copy that failed.
    #[error("device memory: {reason}")]
    Device {
        /// What failed, with the driver's error.
        reason: String,
    },
    /// The cluster secret could not be read or created.
    #[error("transfer secret: {reason}")]
    Secret {
        /// The file and what is wrong with it.
        reason: String,
    },
}

impl From<trust::SecretError> for TransferError {
    fn from(e: trust::SecretError) -> Self {
        Self::Secret { reason: e.reason }
    }
}

impl TransferError {
    /// Whether retrying the same request later (possibly after re-opening the segment) can
    /// succeed: connection loss, timeouts, a busy peer, a peer shutting down.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            TransferError::PeerUnreachable { .. }
                | TransferError::TimedOut { .. }
                | TransferError::Busy { .. }
                | TransferError::Shutdown
        )
    }

    /// Whether this error means the cached descriptor of the peer is probably stale (the peer
    /// restarted or re-registered): the engine drops it so the next `open_segment` refetches.
    pub fn invalidates_descriptor(&self) -> bool {
        matches!(
            self,
            TransferError::OutOfBounds { .. }
                | TransferError::BadToken { .. }
                | TransferError::PeerUnreachable { .. }
        )
    }

    pub(crate) fn io(context: impl Into<String>, err: &std::io::Error) -> Self {
        TransferError::Io {
            context: context.into(),
            reason: err.to_string(),
        }
    }

    pub(crate) fn memory(what: &str, err: &std::io::Error) -> Self {
        TransferError::Memory {
            reason: format!("{what}: {err}"),
        }
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        TransferError::InvalidRequest {
            reason: reason.into(),
        }
    }

    pub(crate) fn unreachable(segment: &str, reason: impl fmt::Display) -> Self {
        TransferError::PeerUnreachable {
            segment: segment.to_owned(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn protocol(segment: &str, reason: impl fmt::Display) -> Self {
        TransferError::Protocol {
            segment: segment.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// `Result` with [`TransferError`].
pub type Result<T, E = TransferError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_peer_and_range() {
        let e = TransferError::BadToken {
            segment: "10.0.0.1:7000".into(),
            range: RemoteRange::new(0x1000, 64),
        };
        assert_eq!(
            e.to_string(),
            "segment 10.0.0.1:7000: access token rejected for range [0x1000, +64)"
        );
        assert!(!e.is_retryable());
        assert!(e.invalidates_descriptor());
        let t = TransferError::TimedOut {
            segment: "p".into(),
            range: RemoteRange::new(16, 1),
            timeout: Duration::from_secs(2),
        };
        assert!(t.is_retryable());
        assert!(t.to_string().contains("timed out after 2s"));
    }
}
