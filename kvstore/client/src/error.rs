//! What a store operation can fail with, classified once with Mooncake's names and codes.
//!
//! The master's refusals arrive over REST and are decoded into the very [`MasterError`] the
//! master raised (same names, same codes); the client adds the failures only it can see:
//! the master unreachable (`RPC_FAIL`), a transfer that failed (`TRANSFER_FAIL`), a read
//! lease that ran out during the read (`LEASE_EXPIRED`), a destination too small
//! (`BUFFER_OVERFLOW`), and bad arguments caught before anything is sent.

use transfer::TransferError;

use openapi::master::MasterError;

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// A failed store operation. Cloneable: a batch-wide failure is reported for every item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The master refused the request (its error, as the master named it).
    #[error("master: {0}")]
    Master(#[from] MasterError),
    /// The master could not be reached, timed out, or answered something undecodable.
    #[error("master {url} unreachable: {reason}")]
    Rpc {
        /// The master's base URL.
        url: String,
        /// Connect error, timeout, bad answer...
        reason: String,
    },
    /// Moving the bytes of `key` failed (the transfer error names the peer and range).
    #[error("transfer of {key:?} failed: {source}")]
    Transfer {
        /// The object.
        key: String,
        /// What the transfer engine reported.
        source: TransferError,
    },
    /// The read lease ran out before the read finished: the bytes read are discarded.
    #[error("lease on {key:?} expired during the read ({elapsed_ms} ms, lease {lease_ms} ms)")]
    LeaseExpired {
        /// The object.
        key: String,
        /// The lease the master granted, in ms.
        lease_ms: u64,
        /// How long the lookup and read took, in ms.
        elapsed_ms: u64,
    },
    /// The destination buffer cannot hold the object.
    #[error("{key:?} is {need} bytes, the destination holds {have}")]
    BufferOverflow {
        /// The object.
        key: String,
        /// Object length.
        need: u64,
        /// Room in the destination.
        have: u64,
    },
    /// An argument was refused before anything was sent (bad config, range outside its
    /// buffer, empty value...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Setting up the client's memory or transfer engine failed.
    #[error("setup: {0}")]
    Setup(String),
}

impl StoreError {
    /// Mooncake's numeric code (`ErrorCode` in `types.h`).
    pub fn code(&self) -> i32 {
        match self {
            Self::Master(e) => e.code(),
            Self::Rpc { .. } => -900,
            Self::Transfer { .. } => -800,
            Self::LeaseExpired { .. } => -707,
            Self::BufferOverflow { .. } => -10,
            Self::InvalidArgument(_) => -600,
            Self::Setup(_) => -1,
        }
    }

    /// Mooncake's name for the code, e.g. `LEASE_EXPIRED`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Master(e) => e.name(),
            Self::Rpc { .. } => "RPC_FAIL",
            Self::Transfer { .. } => "TRANSFER_FAIL",
            Self::LeaseExpired { .. } => "LEASE_EXPIRED",
            Self::BufferOverflow { .. } => "BUFFER_OVERFLOW",
            Self::InvalidArgument(_) => "INVALID_PARAMS",
            Self::Setup(_) => "INTERNAL_ERROR",
        }
    }

    /// Whether the same call may succeed later unchanged (master back, space freed, lease
    /// over, peer reachable again).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Master(e) => e.is_retryable(),
            Self::Rpc { .. } | Self::LeaseExpired { .. } => true,
            Self::Transfer { source, .. } => source.is_retryable(),
            Self::BufferOverflow { .. } | Self::InvalidArgument(_) | Self::Setup(_) => false,
        }
    }

    /// The master error, when the master refused.
    pub fn master(&self) -> Option<&MasterError> {
        match self {
            Self::Master(e) => Some(e),
            _ => None,
        }
    }

    pub(crate) fn transfer(key: &str, source: TransferError) -> Self {
        Self::Transfer {
            key: key.to_owned(),
            source,
        }
    }

    pub(crate) fn setup(what: &str, e: impl std::fmt::Display) -> Self {
        Self::Setup(format!("{what}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_follow_mooncake() {
        let cases = [
            (
                StoreError::Master(MasterError::ObjectNotFound("k".into())),
                -704,
                "OBJECT_NOT_FOUND",
            ),
            (
                StoreError::Rpc {
                    url: "u".into(),
                    reason: "r".into(),
                },
                -900,
                "RPC_FAIL",
            ),
            (
                StoreError::transfer(
                    "k",
                    TransferError::PeerUnreachable {
                        segment: "s".into(),
                        reason: "r".into(),
                    },
                ),
                -800,
                "TRANSFER_FAIL",
            ),
            (
                StoreError::LeaseExpired {
                    key: "k".into(),
                    lease_ms: 1,
                    elapsed_ms: 2,
                },
                -707,
                "LEASE_EXPIRED",
            ),
            (
                StoreError::BufferOverflow {
                    key: "k".into(),
                    need: 2,
                    have: 1,
                },
                -10,
                "BUFFER_OVERFLOW",
            ),
            (
                StoreError::InvalidArgument("x".into()),
                -600,
                "INVALID_PARAMS",
            ),
        ];
        for (e, code, name) in cases {
            assert_eq!((e.code(), e.name()), (code, name), "{e}");
        }
        assert!(StoreError::Master(MasterError::ObjectHasLease("k".into())).is_retryable());
        assert!(!StoreError::Master(MasterError::ObjectAlreadyExists("k".into())).is_retryable());
    }
}
