//! `mooncake.store.MooncakeDistributedStore` over [`kvclient::StoreClient`]: the same
//! heartbeat, remount, leases and zero-copy paths as Rust users get.
//!
//! This file holds the life cycle (setup, close, health) and the metadata calls
//! (existence, size, removal); `store_io` the data path. A store used before `setup` or
//! after `close` answers `INVALID_PARAMS` (-600), as Mooncake's does.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kvclient::StoreClient;
use parking_lot::RwLock;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::codes::{self, OK};
use crate::memory::{Regions, register_raw};
use crate::runtime::{block, block_here, runtime};
use crate::setup::{DEFAULT_SIZE, SetupArgs, listen_ports};
use kvclient::parse_size;

/// A set-up store.
pub struct StoreState {
    pub(crate) client: StoreClient,
    /// Buffers registered with `register_buffer` (and the temporary ones of `get_buffer`).
    pub(crate) regions: Regions,
    /// `local_buffer_size` was 0: the copying forms (`put`, `get`...) are refused.
    pub(crate) zero_copy_only: bool,
    /// `host:port` as Mooncake names this client (`local_hostname`'s host, the engine's port).
    pub(crate) hostname: String,
    /// Get and put sessions.
    pub(crate) sessions: Sessions,
}

/// A put session: the started put and its ranged writes under way.
pub(crate) struct PutSession {
    pub(crate) put: kvclient::Writable,
    pub(crate) writing: usize,
}

impl StoreState {
    /// The segment name the master knows for `name`: this client's own mounted segment
    /// when `name` is how Mooncake names this client (`get_hostname()`, or its engine's
    /// segment name), else `name` as given.
    pub(crate) fn segment_named(&self, name: &str) -> String {
        match self.client.segment() {
            Some(seg) if name == self.hostname || name == self.client.engine().segment_name() => {
                seg.name.clone()
            }
            _ => name.to_owned(),
        }
    }
}

/// The get and put sessions of one store (`session`).
#[derive(Default)]
pub struct Sessions {
    pub(crate) gets: parking_lot::Mutex<std::collections::HashMap<String, kvclient::Held>>,
    pub(crate) puts: parking_lot::Mutex<std::collections::HashMap<String, PutSession>>,
    /// Signalled when a ranged write ends.
    pub(crate) written: parking_lot::Condvar,
}

/// Mooncake's store client.
#[pyclass(module = "moongate.store", frozen, subclass)]
pub struct MooncakeDistributedStore {
    state: RwLock<Option<Arc<StoreState>>>,
}

impl MooncakeDistributedStore {
    /// The set-up state, or `None` (the caller answers `INVALID_PARAMS`).
    pub(crate) fn state(&self) -> Option<Arc<StoreState>> {
        self.state.read().clone()
    }

    /// Leaves with `s`: its registered buffers are forgotten, its segment unmounted (its
    /// objects go) and its heartbeat stopped.
    fn leave(s: &StoreState) -> impl Future<Output = kvclient::StoreResult<()>> + Send + '_ {
        s.regions.clear();
        s.client.close()
    }

    fn open(&self, py: Python<'_>, args: SetupArgs) -> i32 {
        self.open_with(py, args, |_| {}, None)
    }

    /// [`Self::open`], with `tweak` applied to the client's settings, and puts placed on
    /// the segment `prefer` first when one is given.
    pub(crate) fn open_with(
        &self,
        py: Python<'_>,
        args: SetupArgs,
        tweak: impl Fn(&mut kvclient::ClientConfig),
        prefer: Option<String>,
    ) -> i32 {
        if self.state.read().is_some() {
            return codes::invalid("setup", "the store is already set up (close it first)");
        }
        let mut config = match args.client_config() {
            Ok(c) => c,
            Err(e) => return codes::invalid("setup", e),
        };
        tweak(&mut config);
        let mut result = Err(kvclient::StoreError::Setup("no port to listen on".into()));
        for port in listen_ports(&args.local_hostname) {
            config.listen.set_port(port);
            result = block(py, StoreClient::connect(config.clone()));
            match &result {
                Err(kvclient::StoreError::Setup(m)) if m.contains("in use") => continue,
                _ => break,
            }
        }
        match result {
            Ok(client) => {
                let client = match prefer {
                    Some(seg) => {
                        let mut placement = client.replication().clone();
                        placement.preferred_segments = vec![seg];
                        client.with_replication(placement)
                    }
                    None => client,
                };
                let port = client.engine().local_addr().port();
                *self.state.write() = Some(Arc::new(StoreState {
                    client,
                    regions: Regions::default(),
                    zero_copy_only: args.local_buffer_size == 0,
                    hostname: format!("{}:{}", crate::setup::host_of(&args.local_hostname), port),
                    sessions: Default::default(),
                }));
                OK
            }
            Err(e) => codes::store_code("setup", &e),
        }
    }
}

/// Longest a store freed without `close` waits for the master to unmount it (the GIL held,
/// see the `Drop` below). Past it the segment is left to the master's client TTL, as a crash
/// leaves it: a master that accepts connections but does not answer held a `del` for the
/// whole master-call timeout (10 s), every Python thread with it.
const LEAVE_ON_DROP: Duration = Duration::from_secs(2);

/// A store freed while set up leaves, as Mooncake's does (its destructor tears the client
/// down). Mooncake's own tests and SGLang's HiCache backend (whose `close` does nothing)
/// count on it: a store dropped without `close` would otherwise stay mounted until the
/// master's client TTL, and the master would go on placing other clients' new values in a
/// segment nobody serves any more (their puts answer `TRANSFER_FAIL`). This runs inside
/// Python's deallocation with the GIL held, as Mooncake's destructor does (the GIL is not
/// released here, where the interpreter may be shutting down), so the wait is bounded by
/// [`LEAVE_ON_DROP`].
impl Drop for MooncakeDistributedStore {
    fn drop(&mut self) {
        let Some(s) = self.state.get_mut().take() else {
            return;
        };
        match runtime()
            .block_on(async { tokio::time::timeout(LEAVE_ON_DROP, Self::leave(&s)).await })
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                codes::store_code("close", &e);
            }
            Err(_) => tracing::warn!(
                client = %s.hostname,
                wait_ms = LEAVE_ON_DROP.as_millis() as u64,
                "a store freed without close() could not leave the master in time; its segment stays mounted until the master's client TTL"
            ),
        }
    }
}

fn dict_str(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Option<String>> {
    match d.get_item(key)? {
        Some(v) if !v.is_none() => Ok(Some(v.str()?.to_string())),
        _ => Ok(None),
    }
}

fn dict_size(d: &Bound<'_, PyDict>, key: &str) -> Result<u64, String> {
    match dict_str(d, key).map_err(|e| e.to_string())? {
        Some(s) => parse_size(&s).map_err(|e| format!("{key}: {e}")),
        None => Ok(DEFAULT_SIZE),
    }
}

/// `setup(config_dict)`: Mooncake's keys, values as strings or ints.
fn args_from_dict(d: &Bound<'_, PyDict>) -> Result<SetupArgs, String> {
    let get = |k: &str| dict_str(d, k).map_err(|e| e.to_string());
    let required = |k: &str| get(k)?.ok_or_else(|| format!("config needs {k:?}"));
    Ok(SetupArgs {
        local_hostname: required("local_hostname")?,
        metadata_server: required("metadata_server")?,
        global_segment_size: dict_size(d, "global_segment_size")?,
        local_buffer_size: dict_size(d, "local_buffer_size")?,
        protocol: get("protocol")?.unwrap_or_else(|| "tcp".into()),
        rdma_devices: get("rdma_devices")?.unwrap_or_default(),
        master_server_addr: get("master_server_addr")?.unwrap_or_else(|| "127.0.0.1:50051".into()),
        ssd_offload: match get("enable_ssd_offload")?.as_deref() {
            Some("true" | "True" | "1") => Some(get("ssd_offload_path")?.unwrap_or_default()),
            _ => None,
        },
    })
}

#[pymethods]
impl MooncakeDistributedStore {
    #[new]
    fn py_new() -> Self {
        Self {
            state: RwLock::new(None),
        }
    }

    /// `setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
    /// protocol, rdma_devices, master_server_addr, engine=None, ...)` or `setup(config)` with
    /// a dict. Connects to the master, mounts a `global_segment_size` segment, starts the
    /// heartbeat. 0, or a negative Mooncake code.
    #[pyo3(signature = (
        local_hostname, metadata_server = None, global_segment_size = None,
        local_buffer_size = None, protocol = None, rdma_devices = None,
        master_server_addr = None, engine = None, enable_ssd_offload = false,
        ssd_offload_path = String::new(), tenant_id = String::from("default"),
        enable_client_http_server = false, client_http_port = 9300
    ))]
    #[allow(clippy::too_many_arguments)]
    fn setup(
        &self,
        py: Python<'_>,
        local_hostname: &Bound<'_, PyAny>,
        metadata_server: Option<String>,
        global_segment_size: Option<u64>,
        local_buffer_size: Option<u64>,
        protocol: Option<String>,
        rdma_devices: Option<String>,
        master_server_addr: Option<String>,
        engine: Option<&Bound<'_, PyAny>>,
        enable_ssd_offload: bool,
        ssd_offload_path: String,
        tenant_id: String,
        enable_client_http_server: bool,
        client_http_port: u16,
    ) -> PyResult<i32> {
        let _ = client_http_port;
        if let Ok(d) = local_hostname.cast::<PyDict>() {
            return Ok(match args_from_dict(d) {
                Ok(a) => self.open(py, a),
                Err(e) => codes::invalid("setup", e),
            });
        }
        let missing = || {
            PyTypeError::new_err(
                "setup() takes local_hostname, metadata_server, global_segment_size, \
                 local_buffer_size, protocol, rdma_devices, master_server_addr (or one config dict)",
            )
        };
        let args = SetupArgs {
            local_hostname: local_hostname.extract()?,
            metadata_server: metadata_server.ok_or_else(missing)?,
            global_segment_size: global_segment_size.ok_or_else(missing)?,
            local_buffer_size: local_buffer_size.ok_or_else(missing)?,
            protocol: protocol.ok_or_else(missing)?,
            rdma_devices: rdma_devices.ok_or_else(missing)?,
            master_server_addr: master_server_addr.ok_or_else(missing)?,
            ssd_offload: enable_ssd_offload.then_some(ssd_offload_path),
        };
        if tenant_id != "default" {
            return Ok(codes::invalid(
                "setup",
                format!("tenant {tenant_id:?}: Moongate has one tenant per master (\"default\")"),
            ));
        }
        if enable_client_http_server {
            tracing::warn!("enable_client_http_server: the metrics are on the master's /metrics");
        }
        if engine.is_some_and(|e| !e.is_none()) {
            tracing::info!("setup(engine=...): the store client runs its own transfer engine");
        }
        Ok(self.open(py, args))
    }

    /// Leaves the store: unmounts the segment (its objects go), stops the heartbeat. 0, or
    /// a negative code; closing a store that is not set up is 0.
    fn close(&self, py: Python<'_>) -> i32 {
        let Some(s) = self.state.write().take() else {
            return OK;
        };
        match block(py, Self::leave(&s)) {
            Ok(()) => OK,
            Err(e) => codes::store_code("close", &e),
        }
    }

    /// Moongate's own (Mooncake has none): waits, without the GIL, up to `timeout` seconds
    /// for this process's memory to be resident: `setup` faults the segment, the copy
    /// buffer and a value buffer in on idle-priority threads (seconds a GiB), and until
    /// then the first writes into a page pay its first touch. True once done (at once when
    /// nothing is being faulted in), false at the timeout. A timeout that is negative, not
    /// finite or past `Duration`'s range (about 1.8e19 s) raises `ValueError`.
    #[pyo3(signature = (timeout = 60.0))]
    fn wait_memory_resident(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let timeout = std::time::Duration::try_from_secs_f64(timeout).map_err(|_| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "timeout must be a number of seconds from 0 to about 1.8e19, not {timeout}"
            ))
        })?;
        Ok(py.detach(|| transfer::memory::wait_for_background_prefaults(timeout)))
    }

    /// 0 healthy, 1 not set up or closed, 2 master unreachable.
    fn health_check(&self, py: Python<'_>) -> i32 {
        let Some(s) = self.state() else {
            return 1;
        };
        let h = s.client.health();
        let alive = h.consecutive_failures == 0
            && (h.pings > 0 || h.mounted || s.client.segment().is_none());
        if alive {
            return 0;
        }
        // No answered ping yet: ask the master directly.
        match block_here(py, s.client.exists("moongate-health-check")) {
            Ok(_) => 0,
            Err(_) => 2,
        }
    }

    /// Moongate's own: the copy buffer `setup` asked for (`local_buffer_size`), or `None`
    /// when the store is not set up (what `BufferPool` sizes itself by).
    fn local_buffer_size(&self) -> Option<u64> {
        self.state().map(|s| match s.zero_copy_only {
            true => 0,
            false => s.client.config().local_buffer_size,
        })
    }

    /// `host:port` of this client's transfer engine, as Mooncake names a client (what
    /// `ReplicateConfig.preferred_segment` takes to place a put on this client's segment).
    fn get_hostname(&self) -> String {
        self.state().map(|s| s.hostname.clone()).unwrap_or_default()
    }

    /// Values this client's disk tier (`enable_ssd_offload`) read back for readers since
    /// setup: what Mooncake counts as its offload RPC reads. 0 without a disk tier.
    fn get_offload_rpc_read_count(&self) -> u64 {
        self.state()
            .and_then(|s| {
                s.client.disk().map(|d| {
                    d.counters()
                        .reads
                        .load(std::sync::atomic::Ordering::Relaxed)
                })
            })
            .unwrap_or(0)
    }

    /// Stops this client's disk tier (`enable_ssd_offload`), as Mooncake's call of the
    /// name: nothing more goes to the disk, the values that lived only there are gone,
    /// and the call returns after `grace_period_seconds` more (for reads of the disk under
    /// way). The files stay. 0 (also without a disk tier, or once stopped), or a negative
    /// code.
    #[pyo3(signature = (grace_period_seconds = 0))]
    fn unmount_local_disk_segment(&self, py: Python<'_>, grace_period_seconds: u64) -> i32 {
        let Some(s) = self.state() else {
            return codes::invalid("unmount_local_disk_segment", "the store is not set up");
        };
        let grace = std::time::Duration::from_secs(grace_period_seconds);
        match block_here(py, s.client.unmount_disk(grace)) {
            Ok(_) => OK,
            Err(e) => codes::store_code("unmount_local_disk_segment", &e),
        }
    }

    /// 1 readable, 0 not, negative code on error.
    fn is_exist(&self, py: Python<'_>, key: &str) -> i32 {
        let Some(s) = self.state() else {
            return codes::invalid("is_exist", "the store is not set up");
        };
        match block_here(py, s.client.exists(key)) {
            Ok(true) => 1,
            Ok(false) => 0,
            Err(e) => codes::store_code("is_exist", &e),
        }
    }

    /// One master request: 1 / 0 / negative code per key.
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let Some(s) = self.state() else {
            return vec![codes::invalid("batch_is_exist", "the store is not set up"); keys.len()];
        };
        block_here(py, s.client.batch_exists(&keys))
            .into_iter()
            .map(|r| match r {
                Ok(true) => 1,
                Ok(false) => 0,
                Err(e) => codes::store_code("batch_is_exist", &e),
            })
            .collect()
    }

    /// Length of the value, or a negative code (-704 not found).
    fn get_size(&self, py: Python<'_>, key: &str) -> i64 {
        let Some(s) = self.state() else {
            return i64::from(codes::invalid("get_size", "the store is not set up"));
        };
        match block_here(py, s.client.size(key)) {
            Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
            Err(e) => i64::from(codes::store_code("get_size", &e)),
        }
    }

    /// 0, or a negative code (-704 not found, -706 a read lease is live and not `force`).
    #[pyo3(signature = (key, force = false))]
    fn remove(&self, py: Python<'_>, key: &str, force: bool) -> i32 {
        let Some(s) = self.state() else {
            return codes::invalid("remove", "the store is not set up");
        };
        match block_here(py, s.client.remove(key, force)) {
            Ok(()) => OK,
            Err(e) => codes::store_code("remove", &e),
        }
    }

    /// One master request: 0 / negative code per key.
    #[pyo3(signature = (keys, force = false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> Vec<i32> {
        let Some(s) = self.state() else {
            return vec![codes::invalid("batch_remove", "the store is not set up"); keys.len()];
        };
        block_here(py, s.client.batch_remove(&keys, force))
            .into_iter()
            .map(|r| match r {
                Ok(()) => OK,
                Err(e) => codes::store_code("batch_remove", &e),
            })
            .collect()
    }

    /// Removes every complete object without a live lease; returns how many (or a negative
    /// code). `force` is accepted; leased objects stay either way.
    #[pyo3(signature = (force = false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
        let _ = force;
        let Some(s) = self.state() else {
            return i64::from(codes::invalid("remove_all", "the store is not set up"));
        };
        match block_here(py, s.client.remove_all()) {
            Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
            Err(e) => i64::from(codes::store_code("remove_all", &e)),
        }
    }

    /// Removes the complete, unleased objects whose keys the regex matches; returns how
    /// many (or a negative code, -600 for a bad regex).
    #[pyo3(signature = (regex_pattern, force = false))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: &str, force: bool) -> i64 {
        let _ = force;
        let Some(s) = self.state() else {
            return i64::from(codes::invalid("remove_by_regex", "the store is not set up"));
        };
        match block_here(py, s.client.remove_by_regex(regex_pattern)) {
            Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
            Err(e) => i64::from(codes::store_code("remove_by_regex", &e)),
        }
    }

    /// Registers caller memory (a whole host KV pool) for the zero-copy forms; it must stay
    /// alive until `unregister_buffer` or `close`. 0, or -600.
    fn register_buffer(&self, buffer_ptr: u64, size: u64) -> i32 {
        let Some(s) = self.state() else {
            return codes::invalid("register_buffer", "the store is not set up");
        };
        match register_raw(s.client.engine(), buffer_ptr, size)
            .and_then(|b| s.regions.insert(b, false))
        {
            Ok(()) => OK,
            Err(e) => codes::invalid("register_buffer", e),
        }
    }

    /// Unregisters memory `register_buffer` registered at exactly `buffer_ptr`.
    fn unregister_buffer(&self, buffer_ptr: u64) -> i32 {
        let Some(s) = self.state() else {
            return codes::invalid("unregister_buffer", "the store is not set up");
        };
        match s.regions.remove(buffer_ptr, false) {
            Some(_) => OK,
            None => codes::invalid(
                "unregister_buffer",
                format!("{buffer_ptr:#x} is not registered"),
            ),
        }
    }
}
