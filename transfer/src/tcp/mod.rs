//! TCP transport: the wire format (`frame`, pure), raw socket I/O into registered memory
//! (`io`), the target (`server`), the initiator's connection pool (`client`), the staged
//! path of device memory on both sides (`staged`), and what answers mean (`status`).

pub(crate) mod client;
pub mod frame;
pub(crate) mod io;
pub(crate) mod server;
pub(crate) mod staged;
pub(crate) mod status;
