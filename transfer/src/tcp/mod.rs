//! TCP transport: the wire format (`frame`, pure), raw socket I/O into registered memory
//! (`io`), the target (`server`) with its staged path for device memory (`staged`), and the
//! initiator's connection pool (`client`).

pub(crate) mod client;
pub mod frame;
pub(crate) mod io;
pub(crate) mod server;
pub(crate) mod staged;
