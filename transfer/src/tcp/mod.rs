//! TCP transport: the wire format (`frame`, pure), raw socket I/O into registered memory
//! (`io`), the target (`server`), the initiator's connection pool (`client`) and its
//! connections (`lane`), the staged path of device memory on both sides (`staged`), and
//! what answers mean (`status`).

pub(crate) mod client;
pub mod frame;
pub(crate) mod io;
mod lane;
pub(crate) mod server;
pub(crate) mod staged;
pub(crate) mod status;
