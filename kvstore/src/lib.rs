//! Moongate KV store: the master service with Mooncake Store semantics (segments, objects,
//! replicas, leases, eviction), its REST routes, the store client and the storage node.
//!
//! # Layout
//! Modules arrive with the KV-master and store issues.
