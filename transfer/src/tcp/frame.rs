//! The TCP wire format: fixed-size little-endian headers, encoded and decoded without I/O,
//! so the decoder can be fuzzed on its own. (The codec lives in the crate's bottom layer,
//! below the handshake and the registration table, which speak it too.)
//!
//! ```text
//! request  (40 bytes): magic "MGTQ" u32 | version u8 | opcode u8 | flags u16 (0)
//!                      | request id u64 | remote address u64 | length u64 | token u64
//!                      then `length` payload bytes for Write, Notify and RdmaConnect
//! response (24 bytes): magic "MGTR" u32 | version u8 | status u8 | flags u16 (0)
//!                      | request id u64 | length u64
//!                      then `length` bytes: the data of a Read, the JSON of a Descriptor,
//!                      the RDMA handshake reply, or an error message (status != Ok)
//! ```
//!
//! Every connection first runs the handshake of [`crate::auth::handshake`]; frames follow
//! only once both sides proved they hold the cluster secret. A Notify payload is the
//! message alone: its sender is the name the peer authenticated with.
//!
//! Responses on one connection come in request order. A Write is answered only once its
//! bytes are in the target's memory; a Read's status comes before its data, so a refused
//! read carries no data.

pub use crate::wire::*;
