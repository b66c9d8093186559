//! What a peer's answers mean: a refusal status, or a failed handshake, as the error it is
//! for the request (the wire encoding itself is `frame`'s).

use std::net::SocketAddr;

use crate::auth::handshake::HandshakeError;
use crate::error::{RemoteRange, TransferError};
use crate::wire::Status;

/// What a failed handshake means: a connection problem (retryable) or a peer that is not,
/// or does not accept us as, a member of this cluster.
pub(crate) fn handshake_error(segment: &str, addr: SocketAddr, e: HandshakeError) -> TransferError {
    match e {
        HandshakeError::TimedOut(_) | HandshakeError::Io(_) => {
            TransferError::unreachable(segment, format!("handshake with {addr}: {e}"))
        }
        HandshakeError::BadMagic(_)
        | HandshakeError::Malformed(_)
        | HandshakeError::UnsupportedVersion(_) => {
            TransferError::protocol(segment, format!("handshake with {addr}: {e}"))
        }
        other => TransferError::Unauthenticated {
            segment: segment.to_owned(),
            reason: format!("{addr}: {other}"),
        },
    }
}

/// Maps a refusal from the peer to the error it means for the request.
pub(crate) fn status_error(
    status: Status,
    segment: &str,
    range: RemoteRange,
    message: &str,
) -> TransferError {
    let segment = segment.to_owned();
    match status {
        Status::UnknownRegion | Status::OutOfBounds => TransferError::OutOfBounds {
            segment,
            range,
            reason: format!("refused by peer: {message}"),
        },
        Status::BadToken => TransferError::BadToken { segment, range },
        Status::Busy => TransferError::Busy {
            segment,
            reason: message.to_owned(),
        },
        Status::ShuttingDown => TransferError::PeerUnreachable {
            segment,
            reason: "peer is shutting down".into(),
        },
        Status::Unsupported => TransferError::TransportUnavailable {
            transport: "peer",
            reason: message.to_owned(),
        },
        Status::Unauthenticated => TransferError::Unauthenticated {
            segment,
            reason: message.to_owned(),
        },
        Status::DeviceError => TransferError::Device {
            reason: format!("segment {segment}, range {range}: {message}"),
        },
        Status::Ok | Status::BadRequest | Status::TooLarge => TransferError::Protocol {
            segment,
            reason: format!("peer answered {status:?}: {message}"),
        },
    }
}
