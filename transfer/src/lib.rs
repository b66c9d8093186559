//! Moongate transfer engine: moves bytes between registered memory of different processes
//! and hosts (KV pages from prefill to decode, values between store clients and storage
//! nodes) over TCP, shared memory and RDMA. It knows nothing about keys, models or HTTP
//! routes.
//!
//! A node builds a [`TransferEngine`], registers memory ([`TransferEngine::alloc`],
//! [`TransferEngine::register`]) and is addressed by peers through its **segment** (named
//! `host:port`), whose [`SegmentDescriptor`] lists its endpoints and regions. An initiator
//! opens a peer's segment, submits a batch of [`TransferRequest`]s (read or write, local
//! range, remote address) and waits for the [`Batch`] or polls each request. Every remote
//! access is checked by the target against its registered regions and their access
//! tokens; failures are typed ([`TransferError`]) and name the peer and range.
//!
//! # Layout
//! - [`auth`]: the cluster secret and the mutual handshake every transfer connection opens
//!   with (the security design is written down there).
//! - [`error`]: the crate's error type (`TransferError`, `RemoteRange`).
//! - [`memory`]: memory regions (anonymous, shared-memory, hugepage, caller-owned, device),
//!   RAII.
//! - [`device`]: device (GPU) memory: locations, the backend trait and its CUDA driver
//!   implementation (loaded at run time), pinned staging buffers, CUDA IPC.
//! - `registry`: the engine's registration table and the [`RegisteredBuffer`] handle.
//! - [`segment`]: segment descriptors (serde, versioned) and the host id.
//! - [`metadata`]: publishing and fetching descriptors: peer-to-peer, HTTP (Mooncake's
//!   interface), in-memory.
//! - `engine`: the engine: `config` (every default), `builder` (start-up, descriptor
//!   publication), registration, `segments` (opened peers), `batch` (requests and their
//!   completion), routing, `notify` (notifications), shutdown.
//! - [`tcp`]: TCP transport: `frame` (pure wire codec), raw socket I/O, target server,
//!   initiator pool with lanes and slicing.
//! - `home`: the runtime an engine was built on, where its connections and background
//!   tasks live whichever runtime drives its calls.
//! - `shm`: shared-memory transport (same-host peers) and local copy targets.
//! - `hostcopy`: a batch's host memory copies, spread over the runtime's worker threads.
//! - `copier`: synchronous copies (the engine's mapped reads and writes) spread over the
//!   calling thread and one long-lived copier thread.
//! - `devcopy`: the memory-copy routes with device memory on either side (stream copies,
//!   CUDA IPC).
//! - [`rdma`]: RDMA transport (feature `rdma`): detection and fallback, handshake, slicing
//!   (tested everywhere); `device` (verbs resources) and `verbs` (the data path), compiled
//!   with the feature only.
//! - [`busy_poll`]: polling a socket a bounded while before sleeping on it (the store
//!   client's master calls, the master's listeners), held off while memory is faulted in.
//! - `bin/transfer-bench`: the benchmark tool (target and initiator modes).

pub mod auth;
pub mod busy_poll;
pub mod device;
pub mod error;
pub mod memory;
pub mod metadata;
pub mod rdma;
pub mod segment;
pub mod tcp;

mod config;
mod copy;
mod engine;
mod home;
mod ipc;
mod notify;
mod op;
mod registry;
mod shm;
mod transport;
mod wire;

pub use auth::ClusterSecret;
pub use config::{EngineConfig, MetadataConfig, RdmaMode};
pub use device::{DeviceBackend, Location, StagingStats};
pub use engine::{ActiveTransports, EngineBuilder, TransferEngine, TransferStats};
pub use error::{RemoteRange, Result, TransferError};
pub use memory::{AllocOptions, MemoryRegion};
pub use metadata::{HttpMetadata, InMemoryMetadata, Metadata, P2pMetadata};
pub use notify::{Notification, Notifications};
pub use op::{Batch, Op, RequestStatus, Segment, TransferRequest};
pub use registry::{RegisteredBuffer, Warm};
pub use segment::{CudaIpcRegion, RegionDescriptor, SegmentDescriptor};
/// A setting that is never printed (API keys); the `trust` crate's.
pub use trust::Secret;
