//! Moongate KV store: the master service with Mooncake Store semantics (segments, objects,
//! replicas, leases, eviction), its REST routes, the store client and the storage node.
//!
//! # Layout
//! - `master`: the master core, pure logic with an injectable clock ([`Master`]).
//! - `metadata`: the Mooncake-compatible transfer-metadata store ([`MetadataStore`]).
//! - `metrics`: `moongate_master_*` metric names and recording helpers.

pub mod master;
pub mod metadata;
pub mod metrics;

pub use master::{Master, MasterConfig, MasterError};
pub use metadata::MetadataStore;
