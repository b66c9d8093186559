//! Moongate's KV master: Mooncake Store's master service (segments, objects, replicas,
//! leases, eviction), its REST routes, and the HA master on etcd.
//!
//! The core ([`master`]) is plain structs and methods over an injectable clock: no I/O, no
//! HTTP, no store client. The REST layer ([`rest`]) only parses, calls the core and renders;
//! the store client on the other side knows these routes only through `openapi`.
//!
//! # Layout
//! - [`master`]: the master core ([`Master`]), Mooncake Store semantics.
//! - [`metadata`]: the Mooncake-compatible transfer-metadata store ([`MetadataStore`]).
//! - [`metrics`]: `moongate_master_*` metric names and how each is recorded.
//! - [`rest`]: the REST API as self-contained `utoipa_axum` routers, one per plane
//!   ([`rest::store_router`], [`rest::admin_router`]; [`router`] is both, unguarded).
//! - [`ha`]: the HA master on etcd ([`ha::HaConfig`] always; `ha::HaNode` with the
//!   feature `etcd`).
//! - [`background`]: the periodic work the host spawns ([`run_background`]) and the gauges
//!   it publishes.
//! - [`server`]: a master served alone on a listener ([`MasterServer`]: tests, benches,
//!   tools).
//!
//! # Hosting the master
//! ```no_run
//! # async fn host() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! let master = Arc::new(kvmaster::Master::new(kvmaster::MasterConfig::default())?);
//! let (router, _openapi) = kvmaster::router(master.clone()).split_for_parts();
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! tokio::spawn(kvmaster::run_background(master, async move { let _ = stopped.await; }));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! axum::serve(listener, router).await?;
//! # drop(stop); Ok(()) }
//! ```

pub mod background;
pub mod ha;
pub mod master;
pub mod metadata;
pub mod metrics;
pub mod rest;
pub mod server;

pub use background::{publish_gauges, run_background};
pub use ha::HaConfig;
pub use master::{Held, Master, MasterConfig, MasterError};
pub use metadata::MetadataStore;
pub use rest::router;
pub use server::MasterServer;
/// How the master's listeners and its clients poll for the next message (the transfer
/// crate's, where the prefaulting it waits for lives).
pub use transfer::busy_poll;
/// A setting never printed (API keys): the `trust` crate's, shared by every config.
pub use trust::Secret;
