//! The client side of Moongate's KV store: the store client, Mooncake's `Client` (and its
//! Python `MooncakeDistributedStore`) over the master's REST API and the `transfer`
//! engine, and the storage node behind `moongate store`. It knows the master only through
//! the wire (`openapi::master`): it does not depend on the master's crate.
//!
//! A [`StoreClient`] connects to the master, registers and mounts its own segment of
//! `segment_size` bytes (none for a pure client), keeps a registered copy buffer for the
//! byte-slice forms, heartbeats every second and remounts when the master asks.
//!
//! - **put** = `put-start` (the master allocates replicas), write every replica (one copy
//!   into the memory the engine maps, own segment or a same-host node's shared memory;
//!   through `transfer` in one batch otherwise), `put-end`; any failure revokes the put
//!   and the error says why. Each put-start request carries a new `put_id`: sent on to
//!   another master after a timeout (HA), it is recognised where it was already done.
//!   Its replicas are written only if the answer came within the master's
//!   `write_within_ms` of the request (else the put is revoked, `RPC_FAIL`): past it, a
//!   master that restarted or took over may give the space out again.
//!   A value of a length the client holds reserved space for skips put-start: written
//!   into the reservation, then one `put-commit` (see `reserve`).
//! - **get** = `replicas` (the master grants a read lease), read the nearest complete
//!   replica (own segment: memcpy; same host: shared memory; else the network; the next one
//!   if a replica fails), then check the lease did not run out during the read: an expired
//!   lease is `LEASE_EXPIRED` and the bytes are discarded. The copying `get` copies a value
//!   in memory the engine maps (own segment, a same-host node's shared memory) straight out
//!   of it (see `values`). A value on this client's own disk tier is read from there:
//!   the lookup names the client (`?reader=`), the master answers the disk, no load.
//! - Batches are one master request per step, and one transfer batch for all their bytes.
//! - `put_from` / `get_into` move bytes straight from and into caller-registered memory:
//!   nothing proportional to the value is allocated.
//!
//! # Layout
//! - `config`: [`ClientConfig`] and its defaults.
//! - `error`: [`StoreError`], Mooncake's client-side codes.
//! - [`discover`]: the masters of an HA cluster found in etcd (`etcd://` master URLs).
//! - `caller`: master calls driven by the calling thread's own runtime ([`caller_driven`]).
//! - `rpc`: typed calls to the master's REST routes (pooled keep-alive HTTP/1.1), following
//!   the leader of an HA cluster of masters.
//! - `staging`: the registered copy buffer and its slots.
//! - `io`: the put pipeline shared by single and batch forms, and what gets share with it.
//! - `read`: the get pipeline (lookups, reads, lease checks, reads of the own disk tier)
//!   and `batch_get_into`.
//! - `session`: objects held (reads) or started (writes) once, then moved in byte ranges by
//!   many calls ([`Held`], [`Writable`], [`Range`]; Mooncake's get and put sessions).
//! - `reserve`: space held reserved at the master, so a put is one request (a commit).
//! - `results`: per-item results of batch calls, in request order.
//! - `values`: the buffers `batch_get`'s values live in, recycled once released.
//! - [`disk`]: the disk tier below the segment (checksummed records, direct reads).
//! - [`tier`]: the owner's exchange of disk tasks (offload, load, delete) with the master.
//! - `heartbeat`: ping, remount, and the health the storage node reports.
//! - [`metrics`]: the `moongate_store_*` series.
//! - [`node`]: the storage node behind `moongate store` ([`node::run`], [`node::StoreNodeConfig`]).

mod caller;
mod config;
pub mod discover;
pub mod disk;
mod error;
mod heartbeat;
mod io;
pub mod metrics;
pub mod node;
mod read;
mod reserve;
mod results;
mod rpc;
mod session;
mod staging;
pub mod tier;
mod values;

#[cfg(test)]
mod failover_tests;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openapi::master as wire;
use tokio_util::sync::CancellationToken;
use transfer::{AllocOptions, MemoryRegion, RegisteredBuffer, TransferEngine, Warm};

pub use caller::caller_driven;
pub use config::{ClientConfig, DiskWritePolicy, Prefault, Protocol, env, parse_size};
pub use config::{
    DEFAULT_DISK_CAPACITY, DEFAULT_HEARTBEAT_INTERVAL_MS, DEFAULT_LISTEN,
    DEFAULT_LOCAL_BUFFER_SIZE, DEFAULT_MASTER, DEFAULT_PUT_RESERVE_BYTES, DEFAULT_REPLICA_NUM,
    DEFAULT_RPC_BUSY_POLL_US, DEFAULT_RPC_TIMEOUT_MS, DEFAULT_SEGMENT_SIZE,
};
pub use error::{StoreError, StoreResult};
pub use heartbeat::ClientHealth;
pub use rpc::traced_by;
pub use session::{Held, Range, Writable};

use heartbeat::HealthState;
use openapi::master::{ReplicateConfig, SegmentSpec};
use rpc::MasterRpc;
use staging::Staging;
use uuid::Uuid as ClientId;

/// A range of caller-registered memory: the source of `put_from`, the destination of
/// `get_into`.
#[derive(Debug, Clone, Copy)]
pub struct BufRange<'a> {
    /// The registered buffer (from [`StoreClient::alloc`] / [`StoreClient::register`]).
    pub buf: &'a RegisteredBuffer,
    /// First byte.
    pub offset: usize,
    /// Bytes (for `get_into`: room available).
    pub len: usize,
}

impl<'a> BufRange<'a> {
    /// `len` bytes of `buf` from `offset`.
    pub fn new(buf: &'a RegisteredBuffer, offset: usize, len: usize) -> Self {
        Self { buf, offset, len }
    }

    /// All of `buf`.
    pub fn whole(buf: &'a RegisteredBuffer) -> Self {
        Self::new(buf, 0, buf.len())
    }

    fn check(&self, key: &str) -> StoreResult<()> {
        match self.offset.checked_add(self.len) {
            Some(end) if end <= self.buf.len() => Ok(()),
            _ => Err(StoreError::InvalidArgument(format!(
                "{key:?}: range [{}, +{}) is outside the {}-byte buffer",
                self.offset,
                self.len,
                self.buf.len()
            ))),
        }
    }
}

struct Inner {
    config: ClientConfig,
    id: ClientId,
    rpc: MasterRpc,
    engine: TransferEngine,
    segment: Option<(RegisteredBuffer, SegmentSpec)>,
    /// The disk tier below the segment (`--disk-path`).
    disk: Option<Arc<disk::DiskStore>>,
    staging: Arc<Staging>,
    values: Arc<values::ValuePool>,
    health: Arc<HealthState>,
    reserved: reserve::Pool,
    /// The last put id given (see `io`: a put-start sent again after a lost answer
    /// carries the same id, so the master answers it instead of refusing the key).
    put_ids: std::sync::atomic::AtomicU32,
    stop: CancellationToken,
    /// The segment's spec as the heartbeat remounts it (without a disk once detached).
    specs: Arc<parking_lot::Mutex<Vec<SegmentSpec>>>,
    /// The disk tier's task loop and what stops it alone ([`StoreClient::unmount_disk`]).
    tier: parking_lot::Mutex<Option<(CancellationToken, tokio::task::JoinHandle<()>)>>,
    /// The heartbeat task, awaited by [`StoreClient::close`].
    heartbeat: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A client of the distributed KV store. Cheap to clone (clones share the connection, the
/// segment and the engine); every method takes `&self` and may run concurrently.
///
/// Call [`StoreClient::close`] to leave: dropping the last clone stops the heartbeat but
/// leaves the segment mounted until the master's client TTL expires it (as a crash would).
#[derive(Clone)]
pub struct StoreClient {
    inner: Arc<Inner>,
    replicate: ReplicateConfig,
}

impl std::fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreClient")
            .field("id", &self.inner.id)
            .field("master", &self.inner.rpc.base())
            .field("segment", &self.segment().map(|s| &s.name))
            .finish()
    }
}

/// How [`StoreClient`] opens: [`StoreClient::connect`], [`StoreClient::start`], or as a
/// storage node (`start_node`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opening {
    /// The master must answer now.
    Connect,
    /// A segment the master does not take yet is mounted when it does.
    Start,
    /// [`Opening::Start`] for a node: no resident value buffer, and with the background
    /// prefault the segment is mounted once resident.
    Node,
}

impl StoreClient {
    /// Starts the transfer engine, registers the segment and the copy buffer, mounts the
    /// segment at the master and starts heartbeating. Fails if the master cannot be reached.
    pub async fn connect(config: ClientConfig) -> StoreResult<Self> {
        Self::open(config, Opening::Connect).await
    }

    /// Like [`StoreClient::connect`], but a segment that cannot be mounted yet is not an
    /// error: the heartbeat keeps trying and mounts it as soon as the master answers and
    /// accepts it (a storage node started before its master, or restarted while the master
    /// still holds its dead predecessor's segment at the same addresses).
    pub async fn start(config: ClientConfig) -> StoreResult<Self> {
        Self::open(config, Opening::Start).await
    }

    /// [`StoreClient::start`] for a storage node, whose job is its segment: it serves no
    /// copying reads, so it keeps no resident value buffer (see the `values` module), and
    /// with the background prefault it mounts its segment once the segment is resident.
    pub(crate) async fn start_node(config: ClientConfig) -> StoreResult<Self> {
        Self::open(config, Opening::Node).await
    }

    async fn open(mut config: ClientConfig, opening: Opening) -> StoreResult<Self> {
        let wait_for_master = opening != Opening::Connect;
        let warm_values = opening != Opening::Node;
        config.validate()?;
        if crate::discover::is_etcd_url(&config.master) {
            config.master = crate::discover::discover_masters(&config.master)
                .await
                .map_err(StoreError::InvalidArgument)?;
            tracing::info!(masters = %config.master, "masters found in etcd");
        }
        let engine = TransferEngine::new(config.engine_config()?)
            .await
            .map_err(|e| StoreError::setup("starting the transfer engine", e))?;
        let rpc = master_rpc(&config, &engine)?;
        let ec = engine.config();
        // Late bytes of an abandoned transfer cannot arrive after its connection's I/O
        // timeout (the connection is closed) or its own timeout.
        let quarantine = ec.request_timeout.max(ec.io_timeout) + Duration::from_secs(1);
        let staging = Staging::new(
            &engine,
            to_usize(config.local_buffer_size)?,
            config.prefault == Prefault::Start,
            quarantine,
        )?;
        let id = ClientId::new_v4();
        let segment = if config.segment_size > 0 {
            let opts = AllocOptions {
                shared: ec.shm,
                huge_pages: config.hugepages,
                populate: config.prefault == Prefault::Start,
            };
            let buf = engine
                .alloc_with(to_usize(config.segment_size)?, opts)
                .map_err(|e| {
                    let what = if config.hugepages {
                        "allocating the segment on huge pages (reserve them in /proc/sys/vm/nr_hugepages)"
                    } else {
                        "allocating the segment"
                    };
                    StoreError::setup(what, e)
                })?;
            // Named after this engine instance (see `io::incarnation`): a node restarted at
            // the same address mounts a new segment, never its predecessor's.
            let spec = SegmentSpec {
                name: format!(
                    "{}#{:016x}",
                    engine.segment_name(),
                    engine.descriptor().engine_id
                ),
                base: buf.addr(),
                size: config.segment_size,
                endpoint: engine.segment_name().to_owned(),
                disk_bytes: if config.disk_path.is_some() {
                    config.disk_capacity
                } else {
                    0
                },
                disk_write_through: config.disk_path.is_some()
                    && config.disk_write_policy == DiskWritePolicy::WriteThrough,
            };
            Some((buf, spec))
        } else {
            None
        };
        // With a metadata service, peers must find the segment before the master hands it out.
        engine
            .publish()
            .await
            .map_err(|e| StoreError::setup("publishing the segment descriptor", e))?;
        // A storage node exists to hold values: with the background prefault its segment is
        // mounted (and written to) only once it is resident. Mounted at once, the first
        // writes into a node started seconds before ran at half the speed of a warm node's
        // (`store-bench --storage node --cold-node`): every first touch of a page is a fault
        // on the writer's path. The cost is start-up time, about a second per few GiB (more
        // on a VM whose host backs memory lazily); the memory is resident either way.
        let mount_when_warm = opening == Opening::Node
            && config.prefault == Prefault::Background
            && segment.is_some();
        if mount_when_warm {
            // The mount comes later; a key the master refuses is still an error now (a
            // ping names this client, unknown there, and is refused like a mount).
            match rpc.ping(id).await {
                Err(e @ StoreError::Master(openapi::master::MasterError::Unauthorized(_))) => {
                    return Err(e);
                }
                Err(e @ StoreError::Rpc { .. }) => {
                    tracing::warn!(error = %e, "master unreachable; the segment is mounted once it answers");
                }
                _ => {}
            }
        }
        let mut mounted = false;
        if let Some((_, spec)) = segment.as_ref().filter(|_| !mount_when_warm) {
            match rpc.mount(id, spec).await {
                Ok(_) => mounted = true,
                Err(e @ StoreError::Rpc { .. }) if wait_for_master => {
                    tracing::warn!(error = %e, "master unreachable; the segment is mounted once it answers");
                }
                // A wrong or missing admin key does not fix itself: fail at once.
                Err(e @ StoreError::Master(openapi::master::MasterError::Unauthorized(_))) => {
                    return Err(e);
                }
                // E.g. a dead predecessor's segment still covers the range: the heartbeat
                // remounts once the master has expired it.
                Err(e @ StoreError::Master(_)) if wait_for_master => {
                    tracing::warn!(error = %e, "the master refused the segment; retrying at every heartbeat");
                }
                Err(e) => return Err(e),
            }
        }
        // Idle big batch buffers are kept up to the copy buffer's size (what a batch can
        // carry), small ones up to 16 MiB more.
        let values = values::ValuePool::new(to_usize(config.local_buffer_size)?);
        // The thread faulting the segment in, when the mount waits for it.
        let mut warming = None;
        let warm_values = warm_values && config.local_buffer_size > 0;
        match config.prefault {
            Prefault::Background => {
                // What the data path needs first, first: the segment (every put placed
                // there lands in it, this client's own written straight from the caller's
                // bytes), the copy buffer (only values a transfer moves: a far node's, or
                // without shared memory), then the buffer for this client's own copying
                // reads. On a VM whose host backs memory lazily this takes seconds a GiB: a
                // 1 GiB value buffer ahead of the segment cut store-bench's single-client 16
                // MiB puts from 2-4 to 0.1 GB/s, and the 1 GiB copy buffer ahead of it kept
                // its 1 MiB puts at 1.5 GB/s against 7.9 with the segment first.
                let mut jobs: Vec<Warm<'_>> =
                    segment.iter().map(|(b, _)| Warm::Buffer(b)).collect();
                jobs.push(Warm::Buffer(staging.buffer()));
                if warm_values {
                    jobs.push(values.warm_job());
                }
                match RegisteredBuffer::warm_in_background(jobs) {
                    Ok(thread) => warming = Some(thread).filter(|_| mount_when_warm),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start faulting the segment in; first writes pay the page faults")
                    }
                }
            }
            Prefault::Start if warm_values => values.warm_now(),
            Prefault::Start | Prefault::Off => {}
        }
        let health = Arc::new(HealthState::new(segment.is_some()));
        health.set_mounted(mounted);
        let stop = CancellationToken::new();
        let specs = Arc::new(parking_lot::Mutex::new(
            segment.iter().map(|(_, s)| s.clone()).collect(),
        ));
        let mut tier_task = None;
        let disk = match (&config.disk_path, &segment) {
            (Some(path), Some((memory, spec))) => {
                let (disk, found) =
                    disk::DiskStore::open(path, config.disk_capacity).map_err(|e| {
                        StoreError::setup("opening the disk tier", std::io::Error::other(e))
                    })?;
                tracing::info!(dir = %path.display(), records = found.len(), capacity = config.disk_capacity, "disk tier open");
                let disk = Arc::new(disk);
                let tier_stop = stop.child_token();
                let task = tokio::spawn(tier::run(
                    tier::Owner {
                        rpc: rpc.clone(),
                        id,
                        segment: spec.name.clone(),
                        memory: memory.clone(),
                        disk: disk.clone(),
                        health: health.clone(),
                        retry: config.heartbeat_interval(),
                        specs: specs.clone(),
                    },
                    tier_stop.clone(),
                ));
                tier_task = Some((tier_stop, task));
                Some(disk)
            }
            _ => None,
        };
        if warming.is_some() {
            health.defer_mount();
        } else if mount_when_warm {
            // No background thread: the heartbeat's first answer (`need_remount`: the
            // master does not know this client yet) mounts the segment.
            tracing::warn!("the segment is mounted without being faulted in first");
        }
        let heartbeat = {
            let (rpc, specs, health, stop) =
                (rpc.clone(), specs.clone(), health.clone(), stop.clone());
            let period = config.heartbeat_interval();
            tokio::spawn(async move {
                if let Some(thread) = warming {
                    heartbeat::mount_when_warm(thread, &rpc, id, &specs, &health, &stop).await;
                }
                heartbeat::run(rpc, id, specs, health, period, stop).await
            })
        };
        tracing::info!(client = %id, master = rpc.base(), segment = ?segment.as_ref().map(|(_, s)| &s.name), bytes = config.segment_size, "store client connected");
        let replicate = ReplicateConfig {
            replica_num: config.replica_num,
            ..ReplicateConfig::default()
        };
        let config_reserve = config.put_reserve_bytes;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                id,
                rpc,
                engine,
                segment,
                disk,
                staging,
                values,
                health,
                reserved: reserve::Pool::new(config_reserve),
                put_ids: std::sync::atomic::AtomicU32::new(0),
                stop,
                specs,
                tier: parking_lot::Mutex::new(tier_task),
                heartbeat: parking_lot::Mutex::new(Some(heartbeat)),
            }),
            replicate,
        })
    }

    /// A handle on the same client whose puts use `config` (replicas, preferred segments,
    /// pins) instead of the configured default.
    pub fn with_replication(&self, config: ReplicateConfig) -> Self {
        Self {
            inner: self.inner.clone(),
            replicate: config,
        }
    }

    /// The placement this handle's puts use.
    pub fn replication(&self) -> &ReplicateConfig {
        &self.replicate
    }

    /// This client's id at the master.
    pub fn id(&self) -> ClientId {
        self.inner.id
    }

    /// The settings in force.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The transfer engine (to register memory, or to move bytes outside the store).
    pub fn engine(&self) -> &TransferEngine {
        &self.inner.engine
    }

    /// The disk tier below the segment, if `--disk-path` set one.
    pub fn disk(&self) -> Option<&Arc<disk::DiskStore>> {
        self.inner.disk.as_ref()
    }

    /// The mounted segment, unless this is a pure client.
    pub fn segment(&self) -> Option<&SegmentSpec> {
        self.inner.segment.as_ref().map(|(_, s)| s)
    }

    /// Heartbeat and mount state.
    pub fn health(&self) -> ClientHealth {
        self.inner.health.snapshot()
    }

    /// Waits until a storage node's first mount, deferred until its segment is faulted in,
    /// was tried (at once for any other client).
    pub(crate) async fn mount_settled(&self) {
        self.inner.health.settled().await
    }

    /// Bytes of the registered copy buffer held by operations in flight (or quarantined
    /// after an abandoned transfer); 0 when the client is idle.
    pub fn copy_buffer_in_use(&self) -> u64 {
        self.inner.staging.used_bytes()
    }

    /// Allocates and registers `len` bytes for `put_from` / `get_into`.
    pub fn alloc(&self, len: usize) -> StoreResult<RegisteredBuffer> {
        self.inner
            .engine
            .alloc(len)
            .map_err(|e| StoreError::setup("allocating a buffer", e))
    }

    /// Registers caller memory for `put_from` / `get_into`.
    pub fn register(&self, region: MemoryRegion) -> StoreResult<RegisteredBuffer> {
        self.inner
            .engine
            .register(region)
            .map_err(|e| StoreError::setup("registering a buffer", e))
    }

    /// Stores `value` under `key` (copied: straight into a replica the engine maps, else
    /// through the registered copy buffer).
    pub async fn put(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        self.batch_put(&[(key, value)])
            .await
            .pop()
            .expect("one result")
    }

    /// Stores `src` under `key`, straight from registered memory.
    pub async fn put_from(&self, key: &str, src: BufRange<'_>) -> StoreResult<()> {
        self.batch_put_from(&[(key, src)])
            .await
            .pop()
            .expect("one result")
    }

    /// The value of `key`. A value of 64 KiB or more is a view of a buffer the client
    /// reuses once the value (and every clone of it) is dropped, so a loop of `get`s does
    /// not allocate fresh memory for every value. A value kept keeps its whole buffer,
    /// which for one of 4 MiB or more may be the client's warm buffer of the copy buffer's
    /// size: copy it out (`Vec::from(&value[..])`) to keep it long.
    pub async fn get(&self, key: &str) -> StoreResult<Bytes> {
        self.batch_get(&[key]).await.pop().expect("one result")
    }

    /// Reads the value of `key` into `dst` (which must have room for it); returns its length.
    /// On error the destination's content is unspecified.
    pub async fn get_into(&self, key: &str, dst: BufRange<'_>) -> StoreResult<u64> {
        self.batch_get_into(&[(key, dst)])
            .await
            .pop()
            .expect("one result")
    }

    /// Whether `key` is readable (grants a read lease when it is).
    pub async fn exists(&self, key: &str) -> StoreResult<bool> {
        let r = self.inner.rpc.exists(key).await;
        crate::metrics::record_client_op("exists", r.as_ref().err());
        Ok(r?.exists)
    }

    /// Existence of many keys, one master request.
    pub async fn batch_exists<K: AsRef<str>>(&self, keys: &[K]) -> Vec<StoreResult<bool>> {
        if keys.is_empty() {
            return Vec::new();
        }
        let body = wire::BatchKeysRequest {
            keys: keys.iter().map(|k| k.as_ref().to_owned()).collect(),
        };
        let out = match self.inner.rpc.batch_exists(&body).await {
            Ok(r) => results::align(keys.len(), r.results, |r| match r.error {
                Some(e) => Err(rpc::item_error(e)),
                None => Ok(r.exists),
            }),
            Err(e) => results::fail_all(keys.len(), e),
        };
        crate::metrics::record_client_batch("exists", &out);
        out
    }

    /// Length of the value of `key` (as Mooncake's `get_size`; a value on disk stays there).
    pub async fn size(&self, key: &str) -> StoreResult<u64> {
        let r = self
            .describe_replicas(&[key])
            .await
            .pop()
            .unwrap_or_else(|| {
                Err(StoreError::InvalidArgument(
                    "one key asked, none answered".into(),
                ))
            });
        crate::metrics::record_client_op("size", r.as_ref().err());
        Ok(r?.0)
    }

    /// Removes `key`; refused with `OBJECT_HAS_LEASE` while a read lease is live unless
    /// `force`.
    pub async fn remove(&self, key: &str, force: bool) -> StoreResult<()> {
        let r = self.inner.rpc.remove(key, force).await.map(|_| ());
        crate::metrics::record_client_op("remove", r.as_ref().err());
        r
    }

    /// Removes many keys, one master request.
    pub async fn batch_remove<K: AsRef<str>>(
        &self,
        keys: &[K],
        force: bool,
    ) -> Vec<StoreResult<()>> {
        if keys.is_empty() {
            return Vec::new();
        }
        let body = wire::BatchRemoveRequest {
            keys: keys.iter().map(|k| k.as_ref().to_owned()).collect(),
            force,
        };
        let out = results::key_results(keys.len(), self.inner.rpc.batch_remove(&body).await);
        crate::metrics::record_client_batch("remove", &out);
        out
    }

    /// Clears the replicas this client's objects `keys` have on the segment named `segment`
    /// (every replica when `None`: the objects go); read-leased and unfinished objects,
    /// another client's and missing ones are left alone. Answers the keys cleared.
    pub async fn replica_clear<K: AsRef<str>>(
        &self,
        keys: &[K],
        segment: Option<&str>,
    ) -> StoreResult<Vec<String>> {
        let body = wire::ReplicaClearRequest {
            client_id: self.inner.id.to_string(),
            keys: keys.iter().map(|k| k.as_ref().to_owned()).collect(),
            segment: segment.map(str::to_owned),
        };
        self.inner
            .rpc
            .batch_replica_clear(&body)
            .await
            .map(|r| r.cleared)
    }

    /// Removes every complete object without a live lease; returns how many went.
    pub async fn remove_all(&self) -> StoreResult<u64> {
        let r = self.inner.rpc.remove_all().await.map(|r| r.removed);
        crate::metrics::record_client_op("remove_all", r.as_ref().err());
        r
    }

    /// Removes every complete object without a live lease whose key `pattern` matches
    /// (anywhere in the key, Rust `regex` syntax); returns how many went. An admin-plane
    /// call, like [`StoreClient::remove_all`].
    pub async fn remove_by_regex(&self, pattern: &str) -> StoreResult<u64> {
        let r = self
            .inner
            .rpc
            .remove_by_regex(pattern)
            .await
            .map(|r| r.removed);
        crate::metrics::record_client_op("remove_by_regex", r.as_ref().err());
        r
    }

    /// Graceful shutdown: stops heartbeating (a heartbeat under way is finished first, at
    /// most the RPC timeout), unmounts the segment (the master drops the replicas on it) and
    /// drains the transfer engine. Other clones stop working.
    pub async fn close(&self) -> StoreResult<()> {
        self.inner.stop.cancel();
        // A heartbeat under way ends first: a ping the master answers after the removal
        // below would be told to remount, and a remount that landed after it would leave
        // this client's segment mounted with no one serving it, until the client TTL.
        let heartbeat = self.inner.heartbeat.lock().take();
        if let Some(h) = heartbeat {
            let _ = h.await;
        }
        let r = self.inner.rpc.remove_client(self.inner.id).await;
        self.inner.health.set_mounted(false);
        self.inner.engine.shutdown().await;
        match r {
            // A master that forgot us (restart, TTL) has nothing mounted for us either.
            Err(StoreError::Master(openapi::master::MasterError::ClientNotFound(_))) => Ok(()),
            other => other,
        }
    }
}

/// The master client `config` asks for: the explicit store key, else the one derived from
/// the secret `engine` authenticates its peers with (the same file, so one setting serves
/// both). Warns when that key would cross a network unencrypted.
fn master_rpc(config: &ClientConfig, engine: &TransferEngine) -> StoreResult<MasterRpc> {
    let derived;
    let store_key = match &config.store_api_key {
        Some(k) => k,
        None => {
            derived = trust::Secret::new(engine.secret().store_api_key());
            &derived
        }
    };
    let rpc = MasterRpc::new(
        &config.master,
        config.rpc_timeout(),
        store_key,
        config.admin_api_key.as_ref(),
        config.master_ca_cert.as_deref(),
    )?
    .with_busy_poll(config.rpc_busy_poll());
    for base in rpc.bases() {
        if trust::tls::in_the_clear_off_host(base) {
            tracing::warn!(
                master = %base,
                "the store key goes to a master on another host over plain HTTP; give it an https:// URL"
            );
        }
    }
    Ok(rpc)
}

fn to_usize(n: u64) -> StoreResult<usize> {
    usize::try_from(n)
        .map_err(|_| StoreError::InvalidArgument(format!("{n} bytes does not fit in memory")))
}
