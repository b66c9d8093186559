//! Moongate KV store: the master service with Mooncake Store semantics (segments, objects,
//! replicas, leases, eviction), its REST routes, the store client and the storage node.
//!
//! # Layout
//! - `master`: the master core, pure logic with an injectable clock ([`Master`]).
//! - `client`: the store client ([`StoreClient`]): put / get and their zero-copy and batch
//!   forms over the master's REST API and `transfer`.
//! - `metadata`: the Mooncake-compatible transfer-metadata store ([`MetadataStore`]).
//! - `metrics`: `moongate_master_*` metric names and recording helpers.
//! - `rest`: the REST API as self-contained `utoipa_axum` routers, one per plane
//!   ([`rest::store_router`], [`rest::admin_router`]; [`router`] is both, unguarded).
//! - `background`: the periodic work the host spawns ([`run_background`]).
//! - `busy_poll`: polling a socket a bounded while before sleeping on it, for the store
//!   client's master calls and the master's listeners.
//! - `hosting`: a master served alone on a listener ([`MasterServer`]: tests, benches, tools).
//! - `ha`: the HA master on etcd ([`ha::HaConfig`] always; `ha::HaNode` with the
//!   feature `etcd`).
//! - `node`: the storage node behind `moongate store` ([`node::run`], [`node::StoreNodeConfig`]).
//!
//! # Hosting the master
//! ```no_run
//! # async fn host() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! let master = Arc::new(kvstore::Master::new(kvstore::MasterConfig::default())?);
//! let (router, _openapi) = kvstore::router(master.clone()).split_for_parts();
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! tokio::spawn(kvstore::run_background(master, async move { let _ = stopped.await; }));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! axum::serve(listener, router).await?;
//! # drop(stop); Ok(()) }
//! ```

mod background;
pub mod busy_poll;
pub mod client;
pub mod ha;
mod hosting;
pub mod master;
pub mod metadata;
pub mod metrics;
pub mod node;
pub mod rest;

pub use background::run_background;
pub use client::{BufRange, ClientConfig, StoreClient, StoreError, StoreResult};
pub use ha::HaConfig;
pub use hosting::MasterServer;
pub use master::{Master, MasterConfig, MasterError};
pub use metadata::MetadataStore;
pub use rest::router;
/// A setting never printed (API keys): the transfer crate's, shared by every config.
pub use trust::Secret;
