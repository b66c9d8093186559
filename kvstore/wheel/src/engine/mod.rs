//! `mooncake.engine.TransferEngine` over Moongate's transfer engine.
//!
//! Segments are named as Mooncake names them: `host:port` with `P2PHANDSHAKE` metadata
//! (the session id SGLang builds from `get_rpc_port()`), the `local_hostname` given with an
//! HTTP metadata server. Local addresses are raw pointers into memory registered with
//! `register_memory` or allocated by `allocate_managed_buffer`; remote addresses are raw
//! pointers into the peer's registered memory, checked by the peer against its regions and
//! their access tokens. Return conventions are Mooncake's: 0 / -1, batch id 0 for a failed
//! submission, `transfer_check_status` 1 done / 0 pending / -1 failed / -2 timed out.

//!
//! # Layout
//! - `config`: `initialize`'s arguments as an engine configuration.
//! - `state`: the started engine, the shared transfer path, and `InnerTransferEngine` (it).
//! - `types`: `TransferOpcode`, `TransferNotify`.

mod config;
mod state;
mod types;

pub use state::EngineState;
pub use state::InnerTransferEngine;
pub use types::{TransferNotify, TransferOpcode};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use transfer::{EngineConfig, MetadataConfig, Op, RequestStatus, TransferError};

use crate::codes::{FAILED, OK};
use crate::memory::{Regions, register_at};
use crate::runtime::block;
use config::{listen_for, metadata_for, transfer_timeout, transports_for};
use state::{fail, triples};
use types::decode_notify;

/// Mooncake's `TransferEngine`: construct, `initialize`, register memory, move bytes.
#[pyclass(module = "moongate.engine", frozen)]
pub struct TransferEngine {
    state: RwLock<Option<Arc<EngineState>>>,
}

impl TransferEngine {
    fn state(&self) -> Option<Arc<EngineState>> {
        self.state.read().clone()
    }

    fn sync(
        &self,
        py: Python<'_>,
        op: &str,
        target: &str,
        items: Result<Vec<(u64, u64, u64)>, String>,
        dir: Op,
        notify: Option<TransferNotify>,
    ) -> i32 {
        let Some(s) = self.state() else {
            return fail(op, "the engine is not initialized");
        };
        let items = match items {
            Ok(i) => i,
            Err(e) => return fail(op, e),
        };
        match block(py, s.run(target, dir, &items, notify.as_ref())) {
            Ok(()) => OK,
            Err(e) => fail(op, e),
        }
    }

    /// Drops the registration at exactly `addr` (a managed buffer or caller memory).
    fn unregister(&self, py: Python<'_>, op: &str, addr: u64, managed: bool) -> i32 {
        let Some(s) = self.state() else {
            return fail(op, "the engine is not initialized");
        };
        match s.regions.remove(addr, managed) {
            Some(_) => s.publish(py).map_or_else(|e| fail(op, e), |()| OK),
            None => fail(
                op,
                format!("{addr:#x} is not registered here (as {op} expects)"),
            ),
        }
    }

    fn submit_async(
        &self,
        py: Python<'_>,
        op: &str,
        target: &str,
        items: Result<Vec<(u64, u64, u64)>, String>,
        dir: Op,
    ) -> u64 {
        let Some(s) = self.state() else {
            fail(op, "the engine is not initialized");
            return 0;
        };
        let r = items.and_then(|items| block(py, s.submit(target, dir, &items)));
        match r.and_then(|b| s.park(b)) {
            Ok(id) => id,
            Err(e) => {
                fail(op, e);
                0
            }
        }
    }
}

/// The methods that differ only in direction and in waiting: one `#[pymethods]` block each
/// (`multiple-pymethods`), Mooncake's signatures, `transport_hint` accepted and unused (one
/// transport serves each peer).
macro_rules! transfer_methods {
    ($($(#[$doc:meta])* $name:ident: one, $op:expr, $run:ident($($extra:expr),*) -> $ret:ty;)*) => {$(
        #[pymethods]
        impl TransferEngine {
            $(#[$doc])*
            #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
            fn $name(&self, py: Python<'_>, target_hostname: &str, buffer: u64, peer_buffer_address: u64, length: u64, transport_hint: &str) -> $ret {
                let _ = transport_hint;
                let items = Ok(vec![(buffer, peer_buffer_address, length)]);
                self.$run(py, stringify!($name), target_hostname, items, $op $(, $extra)*)
            }
        }
    )*};
}

/// The batch forms of [`transfer_methods`]: lists of local addresses, peer addresses and
/// lengths (of one length, else -1 / batch id 0).
macro_rules! batch_transfer_methods {
    ($($(#[$doc:meta])* $name:ident, $op:expr, $run:ident($($extra:expr),*) -> $ret:ty;)*) => {$(
        #[pymethods]
        impl TransferEngine {
            $(#[$doc])*
            #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
            fn $name(&self, py: Python<'_>, target_hostname: &str, buffers: Vec<u64>, peer_buffer_addresses: Vec<u64>, lengths: Vec<u64>, transport_hint: &str) -> $ret {
                let _ = transport_hint;
                let items = triples(&buffers, &peer_buffer_addresses, &lengths);
                self.$run(py, stringify!($name), target_hostname, items, $op $(, $extra)*)
            }
        }
    )*};
}

transfer_methods! {
    /// Writes `length` bytes at `buffer` (registered) to `peer_buffer_address` of
    /// `target_hostname`'s segment and waits. 0 or -1.
    transfer_sync_write: one, Op::Write, sync(None) -> i32;
    /// Reads `length` bytes at the peer's `peer_buffer_address` into `buffer` and waits.
    transfer_sync_read: one, Op::Read, sync(None) -> i32;
    /// Submits one write; its batch id for `transfer_check_status` (0 on failure).
    transfer_submit_write: one, Op::Write, submit_async() -> u64;
}

batch_transfer_methods! {
    /// Writes every `(buffers[i], peer_buffer_addresses[i], lengths[i])` in one batch and
    /// waits for all. 0 or -1.
    batch_transfer_sync_write, Op::Write, sync(None) -> i32;
    /// Reads every range in one batch and waits for all. 0 or -1.
    batch_transfer_sync_read, Op::Read, sync(None) -> i32;
    /// Submits a batch of writes; its id for `get_batch_transfer_status` (0 on failure).
    batch_transfer_async_write, Op::Write, submit_async() -> u64;
    /// Submits a batch of reads; its id for `get_batch_transfer_status` (0 on failure).
    batch_transfer_async_read, Op::Read, submit_async() -> u64;
}

#[pymethods]
impl TransferEngine {
    #[new]
    fn py_new() -> Self {
        Self {
            state: RwLock::new(None),
        }
    }

    /// Starts the engine: `metadata_server` is `P2PHANDSHAKE`, an `http(s)://` URL, or a
    /// bare `host:port` (Mooncake reads that as etcd, which Moongate refuses clearly).
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        self.initialize_ext(
            py,
            local_hostname,
            metadata_server,
            protocol,
            device_name,
            "etcd",
        )
    }

    /// `initialize` with the metadata type given apart (`http`, or `etcd` / `redis`, refused).
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
        metadata_type: &str,
    ) -> i32 {
        let mut slot = self.state.write();
        if slot.is_some() {
            return fail("initialize", "the engine is already initialized");
        }
        let metadata = match metadata_for(metadata_server, metadata_type) {
            Ok(m) => m,
            Err(e) => return fail("initialize", e),
        };
        let (shm, rdma) = match transports_for(protocol) {
            Ok(t) => t,
            Err(e) => return fail("initialize", e),
        };
        let candidates = match listen_for(local_hostname, &metadata) {
            Ok(c) => c,
            Err(e) => return fail("initialize", e),
        };
        let devices: Vec<String> = device_name
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(str::to_owned)
            .collect();
        let mut built: Result<transfer::TransferEngine, String> =
            Err("no address to listen on".into());
        for (listen, advertise, segment_name) in candidates {
            let config = EngineConfig {
                listen,
                advertise_host: Some(advertise),
                segment_name,
                metadata: metadata.clone(),
                shm,
                // Same-host device memory through CUDA IPC goes with shared memory: `rdma`
                // (SGLang's protocol) uses both, plain `tcp` stages everything over TCP, as
                // Mooncake's TCP transport does.
                device_ipc: shm,
                rdma,
                rdma_devices: devices.clone(),
                ..EngineConfig::default()
            };
            built = block(py, transfer::TransferEngine::new(config)).map_err(|e| e.to_string());
            match &built {
                Err(e) if e.contains("in use") => continue,
                _ => break,
            }
        }
        match built {
            Ok(engine) => {
                tracing::info!(segment = engine.segment_name(), transports = ?engine.transports(), "transfer engine started");
                *slot = Some(Arc::new(EngineState {
                    engine,
                    regions: Regions::default(),
                    pending: Mutex::new(HashMap::new()),
                    next_batch: AtomicU64::new(1),
                    timeout: transfer_timeout(),
                }));
                OK
            }
            Err(e) => fail("initialize", e),
        }
    }

    /// The TCP port peers reach this engine on (`host:port` is its P2P session id).
    fn get_rpc_port(&self) -> i32 {
        match self.state() {
            Some(s) => i32::from(s.engine.local_addr().port()),
            None => fail("get_rpc_port", "the engine is not initialized"),
        }
    }

    /// Allocates and registers `length` bytes; returns their address (0 on failure).
    fn allocate_managed_buffer(&self, py: Python<'_>, length: u64) -> u64 {
        let Some(s) = self.state() else {
            fail("allocate_managed_buffer", "the engine is not initialized");
            return 0;
        };
        let r = usize::try_from(length)
            .map_err(|e| e.to_string())
            .and_then(|n| s.engine.alloc(n).map_err(|e| e.to_string()))
            .and_then(|buf| {
                let addr = buf.addr();
                s.regions.insert(buf, true).map(|()| addr)
            })
            .and_then(|addr| s.publish(py).map(|()| addr));
        r.unwrap_or_else(|e| {
            fail("allocate_managed_buffer", e);
            0
        })
    }

    /// Frees a buffer `allocate_managed_buffer` returned.
    fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: u64, length: u64) -> i32 {
        let _ = length;
        self.unregister(py, "free_managed_buffer", buffer_addr, true)
    }

    /// One transfer in direction `opcode`, then `notify` (if given) once it landed.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        opcode: TransferOpcode,
        notify: Option<TransferNotify>,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        let items = Ok(vec![(buffer, peer_buffer_address, length)]);
        self.sync(
            py,
            "transfer_sync",
            target_hostname,
            items,
            opcode.into(),
            notify,
        )
    }

    /// A batch in direction `opcode`, then `notify` (if given) once every byte landed.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: TransferOpcode,
        notify: Option<TransferNotify>,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        let items = triples(&buffers, &peer_buffer_addresses, &lengths);
        self.sync(
            py,
            "batch_transfer_sync",
            target_hostname,
            items,
            opcode.into(),
            notify,
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_async(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: TransferOpcode,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        let items = triples(&buffers, &peer_buffer_addresses, &lengths);
        self.submit_async(
            py,
            "batch_transfer_async",
            target_hostname,
            items,
            opcode.into(),
        )
    }

    /// Waits for every batch in `batch_ids`: 0 when all completed, -1 when one failed, timed
    /// out or is unknown. Every batch named is released.
    fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<u64>) -> i32 {
        let Some(s) = self.state() else {
            return fail("get_batch_transfer_status", "the engine is not initialized");
        };
        let mut batches = Vec::with_capacity(batch_ids.len());
        let mut unknown = Vec::new();
        {
            let mut pending = s.pending.lock();
            for id in &batch_ids {
                match pending.remove(id) {
                    Some(b) => batches.push(b),
                    None => unknown.push(*id),
                }
            }
        }
        let results = block(py, async {
            let mut out = Vec::with_capacity(batches.len());
            for b in &batches {
                out.push(b.wait().await);
            }
            out
        });
        if !unknown.is_empty() {
            return fail(
                "get_batch_transfer_status",
                format!("unknown batch ids {unknown:?}"),
            );
        }
        match results.into_iter().find_map(Result::err) {
            None => OK,
            Some(e) => fail("get_batch_transfer_status", e),
        }
    }

    /// 1 completed, 0 still moving, -1 failed (or unknown id), -2 timed out. A finished
    /// batch is released.
    fn transfer_check_status(&self, batch_id: u64) -> i32 {
        let Some(s) = self.state() else {
            return fail("transfer_check_status", "the engine is not initialized");
        };
        let mut pending = s.pending.lock();
        let Some(batch) = pending.get(&batch_id) else {
            return fail(
                "transfer_check_status",
                format!("unknown batch id {batch_id}"),
            );
        };
        let (mut moving, mut failed, mut timed_out) = (false, false, false);
        for i in 0..batch.len() {
            match batch.status(i) {
                RequestStatus::Completed => {}
                RequestStatus::Pending => moving = true,
                RequestStatus::Failed(TransferError::TimedOut { .. }) => timed_out = true,
                RequestStatus::Failed(e) => {
                    tracing::warn!(op = "transfer_check_status", "{e}");
                    failed = true;
                }
            }
        }
        let rc = if timed_out {
            -2
        } else if failed {
            -1
        } else if moving {
            0
        } else {
            1
        };
        if rc != 0 {
            pending.remove(&batch_id);
        }
        rc
    }

    /// Copies `length` bytes of `src` (bytes or str) to `dest_address`, which must lie in
    /// memory registered with this engine.
    fn write_bytes_to_buffer(
        &self,
        dest_address: u64,
        src: &Bound<'_, PyAny>,
        length: u64,
    ) -> PyResult<i32> {
        let Some(s) = self.state() else {
            return Ok(fail(
                "write_bytes_to_buffer",
                "the engine is not initialized",
            ));
        };
        let text;
        let bytes: &[u8] = if let Ok(b) = src.cast::<PyBytes>() {
            b.as_bytes()
        } else if let Ok(t) = src.cast::<PyString>() {
            text = t.to_cow()?.into_owned();
            text.as_bytes()
        } else {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "src must be bytes or str",
            ));
        };
        let Some(data) = usize::try_from(length).ok().and_then(|n| bytes.get(..n)) else {
            return Ok(fail(
                "write_bytes_to_buffer",
                format!("length {length} exceeds the {} bytes given", bytes.len()),
            ));
        };
        let r = s
            .regions
            .resolve(dest_address, length)
            .and_then(|(buf, off)| buf.write_at(off, data).map_err(|e| e.to_string()));
        Ok(match r {
            Ok(()) => OK,
            Err(e) => fail("write_bytes_to_buffer", e),
        })
    }

    /// `length` bytes at `source_address` (inside memory registered with this engine).
    fn read_bytes_from_buffer<'py>(
        &self,
        py: Python<'py>,
        source_address: u64,
        length: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let s = self
            .state()
            .ok_or_else(|| PyRuntimeError::new_err("the engine is not initialized"))?;
        let (buf, off) = s
            .regions
            .resolve(source_address, length)
            .map_err(PyValueError::new_err)?;
        let v = buf
            .to_vec(off, length as usize)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyBytes::new(py, &v))
    }

    /// Registers caller memory (a numpy array, a torch tensor's `data_ptr()`, on the CPU or
    /// a CUDA device); it must stay alive until `unregister_memory`. `location` is
    /// Mooncake's label: `cpu:N`, `cuda:N`, or `*` (the driver says where the pointer is).
    /// 0, or -1 (null, unmapped, overlapping, not where the label says...).
    #[pyo3(signature = (buffer_addr, capacity, location = "*"))]
    fn register_memory(
        &self,
        py: Python<'_>,
        buffer_addr: u64,
        capacity: u64,
        location: &str,
    ) -> i32 {
        let Some(s) = self.state() else {
            return fail("register_memory", "the engine is not initialized");
        };
        let r = register_at(&s.engine, buffer_addr, capacity, location)
            .and_then(|b| s.regions.insert(b, false))
            .and_then(|()| s.publish(py));
        match r {
            Ok(()) => OK,
            Err(e) => fail("register_memory", e),
        }
    }

    /// Unregisters memory `register_memory` registered at exactly `buffer_addr`.
    fn unregister_memory(&self, py: Python<'_>, buffer_addr: u64) -> i32 {
        self.unregister(py, "unregister_memory", buffer_addr, false)
    }

    /// `register_memory` of each pair; stops at the first failure (-1).
    #[pyo3(signature = (buffer_addresses, capacities, location = "*"))]
    fn batch_register_memory(
        &self,
        py: Python<'_>,
        buffer_addresses: Vec<u64>,
        capacities: Vec<u64>,
        location: &str,
    ) -> i32 {
        if buffer_addresses.len() != capacities.len() {
            return fail(
                "batch_register_memory",
                "buffer_addresses and capacities differ in length",
            );
        }
        for (a, c) in buffer_addresses.into_iter().zip(capacities) {
            if self.register_memory(py, a, c, location) != OK {
                return FAILED;
            }
        }
        OK
    }

    /// `unregister_memory` of each address; -1 if any was not registered.
    fn batch_unregister_memory(&self, py: Python<'_>, buffer_addresses: Vec<u64>) -> i32 {
        let mut rc = OK;
        for a in buffer_addresses {
            if self.unregister_memory(py, a) != OK {
                rc = FAILED;
            }
        }
        rc
    }

    /// Mooncake's topology JSON: Moongate has no NIC-to-CPU matrix; it lists the RDMA
    /// devices in use under `"rdma"`.
    #[pyo3(signature = (device_name = None))]
    fn get_local_topology(&self, device_name: Option<&str>) -> String {
        let _ = device_name;
        let devices = self
            .state()
            .map(|s| {
                s.engine
                    .descriptor()
                    .endpoints
                    .rdma
                    .iter()
                    .map(|d| d.device.clone())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        serde_json::json!({ "rdma": devices }).to_string()
    }

    /// Address of the first buffer registered in segment `segment_name` (this engine's own,
    /// or a peer's); 0 when it has none or cannot be opened.
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: &str) -> u64 {
        let Some(s) = self.state() else {
            fail("get_first_buffer_address", "the engine is not initialized");
            return 0;
        };
        if segment_name == s.engine.segment_name() {
            return s.regions.first().unwrap_or(0);
        }
        let r = block(py, async {
            // A fresh descriptor: the peer may have registered since it was cached.
            s.engine.close_segment(segment_name).await;
            s.engine.open_segment(segment_name).await
        });
        match r {
            Ok(seg) => seg
                .regions()
                .iter()
                .min_by_key(|r| r.id)
                .map(|r| r.addr)
                .unwrap_or(0),
            Err(e) => {
                fail("get_first_buffer_address", e);
                0
            }
        }
    }

    /// EFA only in Mooncake; nothing to warm up here.
    fn warmup_efa_segment(&self, segment_name: &str) -> i32 {
        let _ = segment_name;
        OK
    }

    /// Notifications received since the last call.
    fn get_notifies(&self) -> Vec<TransferNotify> {
        let Some(s) = self.state() else {
            return Vec::new();
        };
        let n = s.engine.notifications();
        let mut out = Vec::new();
        while let Some(m) = n.try_recv() {
            out.push(decode_notify(&m.from, &m.message));
        }
        out
    }

    /// 0 when `peer_server_name` answers (its descriptor is fetched afresh: straight from the
    /// peer with P2P metadata; from the metadata server, then a TCP connect, otherwise).
    fn send_probe(&self, py: Python<'_>, peer_server_name: &str) -> i32 {
        let Some(s) = self.state() else {
            return fail("send_probe", "the engine is not initialized");
        };
        let r = block(py, async {
            s.engine.close_segment(peer_server_name).await;
            let seg = s
                .engine
                .open_segment(peer_server_name)
                .await
                .map_err(|e| e.to_string())?;
            if !matches!(s.engine.config().metadata, MetadataConfig::P2p) && !seg.is_local() {
                let addr = seg.descriptor().tcp_addr().map_err(|e| e.to_string())?;
                tokio::time::timeout(
                    s.engine.config().connect_timeout,
                    tokio::net::TcpStream::connect(addr),
                )
                .await
                .map_err(|_| format!("connecting to {addr} timed out"))?
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            }
            Ok::<(), String>(())
        });
        match r {
            Ok(()) => OK,
            Err(e) => fail("send_probe", e),
        }
    }

    /// The inner engine (for `MooncakeDistributedStore.setup(engine=...)`).
    fn get_engine(&self) -> PyResult<InnerTransferEngine> {
        self.state()
            .map(|state| InnerTransferEngine { state })
            .ok_or_else(|| PyRuntimeError::new_err("the engine is not initialized"))
    }

    /// An opaque non-zero id of the inner engine (Mooncake: its C++ address).
    fn get_engine_ptr(&self) -> u64 {
        self.state().map(|s| Arc::as_ptr(&s) as u64).unwrap_or(0)
    }

    /// This engine's segment name (Moongate addition; Mooncake users build it from
    /// `get_rpc_port()`).
    fn get_session_id(&self) -> Option<String> {
        self.state().map(|s| s.engine.segment_name().to_owned())
    }
}
