//! Where segment descriptors are published and fetched.
//!
//! - [`P2pMetadata`] (the default): no central service; a peer's descriptor is asked of the
//!   peer itself over its TCP port (the segment name is its `host:port`). Publishing is
//!   implicit: the engine serves its live descriptor.
//! - [`HttpMetadata`]: Mooncake's HTTP metadata interface (`GET/PUT/DELETE
//!   /metadata?key=...`), served by the KV master or Mooncake's own metadata server.
//! - [`InMemoryMetadata`]: a map shared by engines in one process (tests, embedding).
//!
//! The engine caches fetched descriptors and drops them when the peer fails or refuses a
//! request as stale.

mod http;
mod p2p;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use parking_lot::Mutex;

use crate::error::Result;
use crate::segment::SegmentDescriptor;

pub use http::HttpMetadata;
pub use p2p::P2pMetadata;

/// A boxed, sendable future (what [`Metadata`] methods return, so the trait is object safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Prefix of the keys descriptors are stored under in a key-value metadata service.
pub const SEGMENT_KEY_PREFIX: &str = "moongate/segment/";

/// The key of segment `name`'s descriptor in a key-value metadata service.
pub fn segment_key(name: &str) -> String {
    format!("{SEGMENT_KEY_PREFIX}{name}")
}

/// Publishes this node's descriptor and fetches peers' descriptors.
pub trait Metadata: Send + Sync + 'static {
    /// Stores (or replaces) `desc` under its segment name.
    fn publish<'a>(&'a self, desc: &'a SegmentDescriptor) -> BoxFuture<'a, Result<()>>;
    /// The descriptor of segment `name`, `None` if the service has none.
    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<SegmentDescriptor>>>;
    /// Removes segment `name`'s descriptor (absent is not an error).
    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>>;
    /// Short name for logs (`p2p`, `http`, `memory`).
    fn kind(&self) -> &'static str;
}

/// Descriptors in a process-local map. Share one (in an `Arc`) between engines.
#[derive(Debug, Default)]
pub struct InMemoryMetadata {
    map: Mutex<HashMap<String, Vec<u8>>>,
}

impl InMemoryMetadata {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names of the segments currently published.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<_> = self.map.lock().keys().cloned().collect();
        v.sort();
        v
    }
}

impl Metadata for InMemoryMetadata {
    fn publish<'a>(&'a self, desc: &'a SegmentDescriptor) -> BoxFuture<'a, Result<()>> {
        // Stored encoded, so the in-memory path exercises the same encoding as the others.
        self.map.lock().insert(desc.name.clone(), desc.to_json());
        Box::pin(async { Ok(()) })
    }

    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<SegmentDescriptor>>> {
        let bytes = self.map.lock().get(name).cloned();
        Box::pin(async move { bytes.map(|b| SegmentDescriptor::from_json(&b)).transpose() })
    }

    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>> {
        self.map.lock().remove(name);
        Box::pin(async { Ok(()) })
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}
