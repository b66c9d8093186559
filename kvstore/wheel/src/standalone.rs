//! Standalone storage (SGLang's `MOONCAKE_STANDALONE_STORAGE=1`): a local store process
//! holds the cache, so it outlives the processes that use it, and each of those sets up a
//! light client beside it with `setup_dummy`, its host KV pool allocated by
//! `MooncakeHostMemAllocator`.
//!
//! On Moongate the local store process is a storage node (`moongate store`, or the wheel's
//! `mooncake_client`, which runs one). `setup_dummy(mem_pool_size, local_buffer_size,
//! server_address)` reads the node's `/health` at `server_address` for its master and its
//! segment, and sets up a client with no segment of its own whose puts go to that segment
//! first. Bytes move as between any two processes of one host: the node's segment is shared
//! memory the client maps, so a put or a get is one copy, done by the client, between the
//! node's segment and the caller's registered memory (the pool SGLang allocates with
//! `MooncakeHostMemAllocator` and registers with `register_buffer`). The master, not the
//! node, answers the client's metadata calls, so a node restart costs the client nothing
//! but the pages it held: its gets miss and its puts go to other segments until the node
//! is back. Mooncake's dummy client instead asks its `mooncake_client` over RPC for every
//! call, and `mem_pool_size` sizes a pool that process shares out; here memory comes from
//! the allocator, so `mem_pool_size` only has to be positive.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;
use transfer::MemoryRegion;

use crate::codes;
use crate::runtime::block;
use crate::setup::SetupArgs;
use crate::store::MooncakeDistributedStore;

/// How long `setup_dummy` waits for the node's `/health`.
const NODE_TIMEOUT: Duration = Duration::from_secs(5);

/// Mooncake's host memory allocator: page-aligned shared memory, zeroed, that a store can
/// register (`register_buffer`) and move bytes into and out of. The memory stays until
/// `free`, whatever becomes of the allocator object (as Mooncake's: code that allocates
/// through a temporary allocator keeps a valid pointer).
#[pyclass(module = "moongate.store", frozen)]
#[derive(Default)]
pub struct MooncakeHostMemAllocator;

/// Every region an allocator gave and nobody freed, by address.
fn regions() -> &'static Mutex<HashMap<u64, MemoryRegion>> {
    static REGIONS: OnceLock<Mutex<HashMap<u64, MemoryRegion>>> = OnceLock::new();
    REGIONS.get_or_init(Mutex::default)
}

#[pymethods]
impl MooncakeHostMemAllocator {
    #[new]
    fn new() -> Self {
        Self
    }

    /// `size` bytes of shared memory: their address, or 0 when they cannot be had.
    fn alloc(&self, size: u64) -> u64 {
        let r = usize::try_from(size)
            .map_err(|e| e.to_string())
            .and_then(|n| MemoryRegion::alloc_shared(n).map_err(|e| e.to_string()));
        match r {
            Ok(region) => {
                let addr = region.addr();
                regions().lock().insert(addr, region);
                addr
            }
            Err(e) => {
                tracing::warn!(size, "MooncakeHostMemAllocator.alloc failed: {e}");
                0
            }
        }
    }

    /// Frees memory `alloc` gave (unregister it from every store first): 0, or -1 for an
    /// address it did not give.
    fn free(&self, ptr: u64) -> i32 {
        match regions().lock().remove(&ptr) {
            Some(_) => 0,
            None => {
                tracing::warn!(
                    ptr,
                    "MooncakeHostMemAllocator.free of an address it did not give"
                );
                -1
            }
        }
    }
}

/// `void *alloc(size_t size)` for C callers (the address `get_alloc_func_addr()` gives):
/// `size` bytes of the allocator's shared memory, or NULL.
extern "C" fn host_alloc(size: usize) -> *mut std::ffi::c_void {
    match MemoryRegion::alloc_shared(size) {
        Ok(region) => {
            let ptr = region.as_ptr();
            regions().lock().insert(region.addr(), region);
            ptr.cast()
        }
        Err(_) => std::ptr::null_mut(),
    }
}

/// `void free(void *ptr)` for C callers (`get_free_func_addr()`): frees what `host_alloc`
/// or `MooncakeHostMemAllocator.alloc` gave; anything else is left alone.
extern "C" fn host_free(ptr: *mut std::ffi::c_void) {
    regions().lock().remove(&(ptr as u64));
}

/// The address of a C function `void *alloc(size_t)` handing out the host memory
/// `MooncakeHostMemAllocator` gives (Mooncake's is its NVMe-oF hugepage allocator, which
/// answers NULL in builds without NVMe-oF).
#[pyfunction]
pub fn get_alloc_func_addr() -> u64 {
    host_alloc as extern "C" fn(usize) -> *mut std::ffi::c_void as usize as u64
}

/// The address of the matching C function `void free(void *)`.
#[pyfunction]
pub fn get_free_func_addr() -> u64 {
    host_free as extern "C" fn(*mut std::ffi::c_void) as usize as u64
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Sets up a client beside the local store process whose `/health` is at
    /// `server_address` (`host:port`): no segment of its own, puts placed on the process's
    /// segment first, `local_buffer_size` for the copying calls. 0 or a negative code.
    fn setup_dummy(
        &self,
        py: Python<'_>,
        mem_pool_size: u64,
        local_buffer_size: u64,
        server_address: &str,
    ) -> i32 {
        let op = "setup_dummy";
        if mem_pool_size == 0 {
            return codes::invalid(op, "mem_pool_size must be positive");
        }
        let node = match block(
            py,
            kvclient::node::node_health(server_address, NODE_TIMEOUT),
        ) {
            Ok(h) => h,
            Err(e) => return codes::store_code(op, &e),
        };
        let host = server_address
            .rsplit_once(':')
            .map_or("127.0.0.1", |(h, _)| h.trim_matches(['[', ']']));
        let args = SetupArgs {
            local_hostname: host.to_owned(),
            metadata_server: "P2PHANDSHAKE".into(),
            global_segment_size: 0,
            local_buffer_size,
            protocol: "tcp".into(),
            rdma_devices: String::new(),
            master_server_addr: node.master,
            ssd_offload: None,
        };
        // Shared memory with the node on this host (and RDMA or TCP with others).
        let auto = |c: &mut kvclient::ClientConfig| c.protocol = kvclient::Protocol::Auto;
        self.open_with(py, args, auto, Some(node.segment))
    }
}
