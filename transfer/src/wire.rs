//! The transfer protocol's wire format, and nothing else: fixed-size little-endian headers,
//! their opcodes, status codes and limits, encoded and decoded without I/O, so the decoder
//! can be fuzzed on its own. Its public name is [`crate::tcp::frame`], where the format is
//! written down.
//!
//! It sits at the bottom of the crate because more than the TCP transport speaks it: the
//! handshake (`auth::handshake`) refuses a peer with a response header, the registration
//! table (`registry`) answers a lookup with a status code, the settings bound a slice by
//! [`MAX_DATA_LEN`].

/// Request header magic, "MGTQ" read as little-endian bytes.
pub const REQUEST_MAGIC: u32 = u32::from_le_bytes(*b"MGTQ");
/// Response header magic, "MGTR".
pub const RESPONSE_MAGIC: u32 = u32::from_le_bytes(*b"MGTR");
/// Protocol version spoken by this build.
pub const VERSION: u8 = 2;
/// Encoded request header size.
pub const REQUEST_HEADER_LEN: usize = 40;
/// Encoded response header size.
pub const RESPONSE_HEADER_LEN: usize = 24;
/// Largest data payload of one Write or Read frame (bigger requests are sliced).
pub const MAX_DATA_LEN: u64 = 64 << 20;
/// Largest control payload (notification, RDMA handshake) and error message.
pub const MAX_CONTROL_LEN: u64 = 64 << 10;
/// Largest descriptor a peer may answer with.
pub const MAX_DESCRIPTOR_LEN: u64 = 16 << 20;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Store the payload at `remote address` (ack once in memory).
    Write = 1,
    /// Send back `length` bytes from `remote address`.
    Read = 2,
    /// Send back the node's segment descriptor (peer-to-peer metadata).
    Descriptor = 3,
    /// Deliver the payload to the node's notification queue.
    Notify = 4,
    /// RDMA queue-pair handshake (payload: JSON handshake).
    RdmaConnect = 5,
}

impl Opcode {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Opcode::Write,
            2 => Opcode::Read,
            3 => Opcode::Descriptor,
            4 => Opcode::Notify,
            5 => Opcode::RdmaConnect,
            _ => return None,
        })
    }

    /// Bytes that follow a request header with this opcode and `len`.
    pub fn payload_len(self, len: u64) -> u64 {
        match self {
            Opcode::Write | Opcode::Notify | Opcode::RdmaConnect => len,
            Opcode::Read | Opcode::Descriptor => 0,
        }
    }
}

/// Outcome carried by a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// The address is in no registered region.
    UnknownRegion = 1,
    /// The range starts in a region but runs past its end.
    OutOfBounds = 2,
    /// The token does not match the region's.
    BadToken = 3,
    /// The request is malformed (header rules, payload encoding).
    BadRequest = 4,
    /// The length exceeds the protocol limit.
    TooLarge = 5,
    /// The node does not support this operation (e.g. RDMA not enabled).
    Unsupported = 6,
    /// The node's notification queue is full.
    Busy = 7,
    /// The node is shutting down.
    ShuttingDown = 8,
    /// The handshake failed (only ever sent before the connection closes).
    Unauthenticated = 9,
    /// The target could not copy into or out of its device memory (the message says why).
    DeviceError = 10,
}

impl Status {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::UnknownRegion,
            2 => Status::OutOfBounds,
            3 => Status::BadToken,
            4 => Status::BadRequest,
            5 => Status::TooLarge,
            6 => Status::Unsupported,
            7 => Status::Busy,
            8 => Status::ShuttingDown,
            9 => Status::Unauthenticated,
            10 => Status::DeviceError,
            _ => return None,
        })
    }
}

/// Why bytes are not a valid header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes than a header.
    #[error("truncated header ({0} bytes)")]
    Truncated(usize),
    /// Not this protocol.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// A version this build does not speak.
    #[error("unsupported protocol version {0} (this build speaks {VERSION})")]
    UnsupportedVersion(u8),
    /// Unknown opcode.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
    /// Unknown status.
    #[error("unknown status {0}")]
    UnknownStatus(u8),
    /// Reserved flag bits set.
    #[error("reserved flags {0:#06x} set")]
    ReservedFlags(u16),
    /// A length over the limit for its frame kind.
    #[error("length {len} exceeds the {limit}-byte limit for {what}")]
    TooLong {
        /// Frame kind.
        what: &'static str,
        /// Announced length.
        len: u64,
        /// Limit.
        limit: u64,
    },
    /// A field that must be zero is not.
    #[error("{0} must be zero")]
    NonZero(&'static str),
}

/// A decoded request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Operation.
    pub op: Opcode,
    /// Echoed in the response.
    pub request_id: u64,
    /// Target address (Write/Read), else 0.
    pub remote_addr: u64,
    /// Data length (Write/Read) or payload length (Notify/RdmaConnect).
    pub len: u64,
    /// Region access token (Write/Read), else 0.
    pub token: u64,
}

/// A decoded response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHeader {
    /// Outcome.
    pub status: Status,
    /// The request's id.
    pub request_id: u64,
    /// Bytes that follow.
    pub len: u64,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn check_prefix(buf: &[u8], need: usize, magic: u32) -> Result<(u8, u16), FrameError> {
    if buf.len() < need {
        return Err(FrameError::Truncated(buf.len()));
    }
    let m = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes"));
    if m != magic {
        return Err(FrameError::BadMagic(m));
    }
    if buf[4] != VERSION {
        return Err(FrameError::UnsupportedVersion(buf[4]));
    }
    let flags = u16::from_le_bytes([buf[6], buf[7]]);
    if flags != 0 {
        return Err(FrameError::ReservedFlags(flags));
    }
    Ok((buf[5], flags))
}

impl RequestHeader {
    /// Encodes into exactly [`REQUEST_HEADER_LEN`] bytes.
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut b = [0u8; REQUEST_HEADER_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.op as u8;
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.remote_addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.token.to_le_bytes());
        b
    }

    /// Decodes the first [`REQUEST_HEADER_LEN`] bytes of `buf` and checks every header rule
    /// (magic, version, opcode, flags, per-opcode length limits, zero fields).
    pub fn decode(buf: &[u8]) -> Result<Self, FrameError> {
        let (op, _) = check_prefix(buf, REQUEST_HEADER_LEN, REQUEST_MAGIC)?;
        let op = Opcode::from_u8(op).ok_or(FrameError::UnknownOpcode(op))?;
        let h = RequestHeader {
            op,
            request_id: u64_at(buf, 8),
            remote_addr: u64_at(buf, 16),
            len: u64_at(buf, 24),
            token: u64_at(buf, 32),
        };
        let (what, limit) = match op {
            Opcode::Write | Opcode::Read => ("data", MAX_DATA_LEN),
            Opcode::Notify | Opcode::RdmaConnect => ("control payload", MAX_CONTROL_LEN),
            Opcode::Descriptor => {
                if h.len != 0 {
                    return Err(FrameError::NonZero("descriptor request length"));
                }
                ("descriptor request", 0)
            }
        };
        if h.len > limit {
            return Err(FrameError::TooLong {
                what,
                len: h.len,
                limit,
            });
        }
        if !matches!(op, Opcode::Write | Opcode::Read) && (h.remote_addr != 0 || h.token != 0) {
            return Err(FrameError::NonZero(
                "address and token of a control request",
            ));
        }
        Ok(h)
    }
}

impl ResponseHeader {
    /// Encodes into exactly [`RESPONSE_HEADER_LEN`] bytes.
    pub fn encode(&self) -> [u8; RESPONSE_HEADER_LEN] {
        let mut b = [0u8; RESPONSE_HEADER_LEN];
        b[0..4].copy_from_slice(&RESPONSE_MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.status as u8;
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes the first [`RESPONSE_HEADER_LEN`] bytes of `buf`. Error responses may carry
    /// at most [`MAX_CONTROL_LEN`] message bytes; Ok responses up to the data or descriptor
    /// limit (the caller checks the length against what it asked for).
    pub fn decode(buf: &[u8]) -> Result<Self, FrameError> {
        let (status, _) = check_prefix(buf, RESPONSE_HEADER_LEN, RESPONSE_MAGIC)?;
        let status = Status::from_u8(status).ok_or(FrameError::UnknownStatus(status))?;
        let h = ResponseHeader {
            status,
            request_id: u64_at(buf, 8),
            len: u64_at(buf, 16),
        };
        let limit = if status == Status::Ok {
            MAX_DATA_LEN.max(MAX_DESCRIPTOR_LEN)
        } else {
            MAX_CONTROL_LEN
        };
        if h.len > limit {
            return Err(FrameError::TooLong {
                what: "response payload",
                len: h.len,
                limit,
            });
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_op() -> impl Strategy<Value = Opcode> {
        prop_oneof![
            Just(Opcode::Write),
            Just(Opcode::Read),
            Just(Opcode::Descriptor),
            Just(Opcode::Notify),
            Just(Opcode::RdmaConnect)
        ]
    }

    #[test]
    fn request_round_trip_and_rules() {
        let h = RequestHeader {
            op: Opcode::Write,
            request_id: 9,
            remote_addr: 0xdead_beef,
            len: 4096,
            token: 77,
        };
        let b = h.encode();
        assert_eq!(&b[0..4], b"MGTQ");
        assert_eq!(RequestHeader::decode(&b).unwrap(), h);
        assert_eq!(
            RequestHeader::decode(&b[..39]),
            Err(FrameError::Truncated(39))
        );
        let mut bad = b;
        bad[4] = 1;
        assert_eq!(
            RequestHeader::decode(&bad),
            Err(FrameError::UnsupportedVersion(1))
        );
        let mut bad = b;
        bad[5] = 99;
        assert_eq!(
            RequestHeader::decode(&bad),
            Err(FrameError::UnknownOpcode(99))
        );
        let mut bad = b;
        bad[7] = 1;
        assert!(matches!(
            RequestHeader::decode(&bad),
            Err(FrameError::ReservedFlags(_))
        ));
        let big = RequestHeader {
            len: MAX_DATA_LEN + 1,
            ..h
        };
        assert!(matches!(
            RequestHeader::decode(&big.encode()),
            Err(FrameError::TooLong { .. })
        ));
        let d = RequestHeader {
            op: Opcode::Descriptor,
            request_id: 1,
            remote_addr: 0,
            len: 1,
            token: 0,
        };
        assert!(RequestHeader::decode(&d.encode()).is_err());
        let n = RequestHeader {
            op: Opcode::Notify,
            request_id: 1,
            remote_addr: 5,
            len: 1,
            token: 0,
        };
        assert!(RequestHeader::decode(&n.encode()).is_err());
    }

    #[test]
    fn response_round_trip_and_rules() {
        let h = ResponseHeader {
            status: Status::BadToken,
            request_id: 3,
            len: 12,
        };
        assert_eq!(ResponseHeader::decode(&h.encode()).unwrap(), h);
        let dev = ResponseHeader {
            status: Status::DeviceError,
            ..h
        };
        assert_eq!(ResponseHeader::decode(&dev.encode()).unwrap(), dev);
        let long_err = ResponseHeader {
            len: MAX_CONTROL_LEN + 1,
            ..h
        };
        assert!(ResponseHeader::decode(&long_err.encode()).is_err());
        let mut b = h.encode();
        b[5] = 200;
        assert_eq!(
            ResponseHeader::decode(&b),
            Err(FrameError::UnknownStatus(200))
        );
        let req = RequestHeader {
            op: Opcode::Read,
            request_id: 1,
            remote_addr: 0,
            len: 0,
            token: 0,
        };
        assert!(matches!(
            ResponseHeader::decode(&req.encode()),
            Err(FrameError::BadMagic(_))
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn decoders_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = RequestHeader::decode(&bytes);
            let _ = ResponseHeader::decode(&bytes);
        }

        #[test]
        fn decoders_never_panic_on_mutated_valid_headers(
            op in any_op(), id in any::<u64>(), addr in any::<u64>(), len in any::<u64>(), token in any::<u64>(),
            flips in proptest::collection::vec((0usize..40, any::<u8>()), 0..4),
        ) {
            let mut b = RequestHeader { op, request_id: id, remote_addr: addr, len, token }.encode();
            for (i, v) in flips { b[i] = v; }
            if let Ok(h) = RequestHeader::decode(&b) {
                // Whatever decodes re-encodes to the same bytes and respects the limits.
                prop_assert_eq!(h.encode(), b);
                prop_assert!(h.len <= MAX_DATA_LEN);
            }
            let r = ResponseHeader::decode(&b[..24]);
            if let Ok(h) = r { prop_assert_eq!(&h.encode()[..], &b[..24]); }
        }

        #[test]
        fn valid_requests_round_trip(
            op in any_op(), id in any::<u64>(), addr in any::<u64>(), len in 0..=MAX_CONTROL_LEN, token in any::<u64>(),
        ) {
            let (addr, token, len) = match op {
                Opcode::Write | Opcode::Read => (addr, token, len),
                Opcode::Descriptor => (0, 0, 0),
                _ => (0, 0, len),
            };
            let h = RequestHeader { op, request_id: id, remote_addr: addr, len, token };
            prop_assert_eq!(RequestHeader::decode(&h.encode()).unwrap(), h);
        }
    }
}
