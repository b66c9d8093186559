//! Moongate transfer engine: moves bytes between registered memory of different processes
//! and hosts (KV pages from prefill to decode, values between store clients and storage
//! nodes). It knows nothing about keys, models or HTTP routes.
//!
//! # Layout
//! Modules arrive with the transfer-engine issue (registered memory, segments, metadata,
//! TCP / shared-memory / RDMA transports).
