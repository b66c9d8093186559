//! `moongate._native`: Moongate's Python API, a drop-in for Mooncake's two Python classes
//! (`mooncake.engine.TransferEngine` and `mooncake.store.MooncakeDistributedStore`) over
//! Moongate's Rust `transfer::TransferEngine` and `kvclient::StoreClient`, with Mooncake's
//! method sets, argument shapes and return codes, so SGLang (PD disaggregation, HiCache L3)
//! switches to Moongate with no code change.
//!
//! Every method that moves bytes or waits on the network releases the GIL while it does
//! (`runtime::block`); every class is safe to share between Python threads.
//!
//! # Layout
//! - `runtime`: the one tokio runtime of the process, blocking calls with the GIL released,
//!   logging set-up.
//! - `memory`: caller memory registered by raw address (checked against the process's
//!   mappings first) and the address table that resolves a raw pointer to its registration.
//! - `engine`: `TransferEngine`, `TransferOpcode`, `TransferNotify`, `InnerTransferEngine`.
//! - `replicate`: `ReplicateConfig` and `SoftPinAction`.
//! - `replica`: replica descriptions (`get_replica_desc`) and Mooncake's descriptor and
//!   enum classes.
//! - `setup`: the arguments of `MooncakeDistributedStore.setup` (positional and dict forms)
//!   turned into a `kvclient::ClientConfig`.
//! - `store`: `MooncakeDistributedStore` (setup, close, health, existence, removal).
//! - `store_io`: its data path (put / get and their zero-copy, batch and multi-buffer forms).
//! - `parts`: puts of one object from several pieces (`put_parts`, `put_from_with_metadata`).
//! - `session`: its get and put sessions and their ranged reads and writes.
//! - `standalone`: `setup_dummy` beside a local store process, `MooncakeHostMemAllocator`.
//! - `codes`: Mooncake's return codes.

use pyo3::prelude::*;

mod codes;
mod engine;
mod memory;
mod parts;
mod replica;
mod replicate;
mod runtime;
mod session;
mod setup;
mod standalone;
mod store;
mod store_io;

/// The extension module; `moongate.engine` and `moongate.store` re-export its classes.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    runtime::init_logging();
    m.add_class::<engine::TransferEngine>()?;
    m.add_class::<engine::TransferOpcode>()?;
    m.add_class::<engine::TransferNotify>()?;
    m.add_class::<engine::InnerTransferEngine>()?;
    m.add_class::<replicate::ReplicateConfig>()?;
    m.add_class::<replicate::SoftPinAction>()?;
    m.add_class::<replica::ReplicaStatus>()?;
    m.add_class::<replica::ObjectDataType>()?;
    m.add_class::<replica::Descriptor>()?;
    m.add_class::<replica::MemoryDescriptor>()?;
    m.add_class::<replica::DiskDescriptor>()?;
    m.add_class::<replica::ReplicaDescriptor>()?;
    m.add_class::<store::MooncakeDistributedStore>()?;
    m.add_class::<store_io::BufferHandle>()?;
    m.add_class::<standalone::MooncakeHostMemAllocator>()?;
    m.add_function(wrap_pyfunction!(standalone::get_alloc_func_addr, m)?)?;
    m.add_function(wrap_pyfunction!(standalone::get_free_func_addr, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
