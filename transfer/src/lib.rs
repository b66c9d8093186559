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
//! From the bottom layer up to the engine, in the order a request's bytes meet them; each
//! module uses only modules listed before it (the workspace's architecture check holds the
//! crate to a module graph without cycles).
//! - [`error`]: the crate's error type (`TransferError`, `RemoteRange`).
//! - `wire`: the wire format's codec: headers, opcodes, status codes, limits (public as
//!   [`tcp::frame`]).
//! - [`device`]: device (GPU) memory: locations, the backend trait and its CUDA driver
//!   implementation (loaded at run time), copy streams and fences, pinned staging buffers.
//! - [`segment`]: segment descriptors (serde, versioned) and the host id.
//! - `config`: every setting of an engine and its default ([`EngineConfig`]).
//! - `home`: the runtime an engine was built on, where its connections and background
//!   tasks live whichever runtime drives its calls.
//! - `notify`: the messages peers send after their transfers ([`Notification`]).
//! - [`memory`]: memory regions (anonymous, shared-memory, hugepage, caller-owned, device),
//!   RAII, with what a device region exports for same-host peers.
//! - [`auth`]: the cluster secret and the mutual handshake every transfer connection opens
//!   with (the security design is written down there).
//! - `registry`: the engine's registration table and the [`RegisteredBuffer`] handle.
//! - `op`: operations and their completion: requests, batches, the completion and landing
//!   of each slice a transport moves, and the [`Segment`] handle requests name.
//! - `shm`: same-host peers' shared regions mapped into this process, and their checks.
//! - `ipc`: same-host peers' device regions opened through CUDA IPC, and their checks.
//! - `copy`: requests carried by memory copy and how a batch's copies run: `hostcopy`
//!   (host copies spread over the runtime's worker threads), `devcopy` (copies with device
//!   memory on either side, on device streams), `copier` (the synchronous copies of the
//!   engine's mapped reads and writes, over the calling thread and one copier thread).
//! - [`tcp`]: TCP transport: `frame` (the wire format), raw socket I/O, target server,
//!   initiator pool with lanes and slicing, staging of device memory.
//! - [`rdma`]: RDMA transport (feature `rdma`): detection and fallback, handshake, slicing
//!   (tested everywhere); `device` (verbs resources) and `verbs` (the data path), compiled
//!   with the feature only.
//! - `transport`: the `Transport` trait every transport is behind, and one implementation
//!   each (local copies, CUDA IPC, shared memory, RDMA, TCP), which the engine holds in
//!   preference order and offers each request to.
//! - [`metadata`]: publishing and fetching descriptors: peer-to-peer (over the TCP
//!   client), HTTP (Mooncake's interface), in-memory.
//! - `engine`: the engine: `builder` (start-up, its transports, descriptor publication),
//!   registration, opened segments, batch submission (each request resolved and offered to
//!   the transports), mapped reads and writes, notifications, shutdown.
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
pub use config::{EngineConfig, MetadataConfig, RdmaMode, parse_size};
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
