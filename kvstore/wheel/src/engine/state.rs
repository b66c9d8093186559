//! What a started engine holds (the Rust engine, Python's registrations, the async batches
//! waiting for their status) and the transfer path every method shares: resolve the local
//! addresses, open the segment, submit, wait, notify.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;
use transfer::{Batch, MetadataConfig, Op, TransferRequest};

use super::types::{TransferNotify, encode_notify};
use crate::codes::FAILED;
use crate::memory::Regions;
use crate::runtime::block;

/// Most async batches waiting for `get_batch_transfer_status` / `transfer_check_status`.
const MAX_PENDING_BATCHES: usize = 1 << 16;

/// A started engine and what Python registered with it.
pub struct EngineState {
    pub(super) engine: transfer::TransferEngine,
    pub(super) regions: Regions,
    pub(super) pending: Mutex<HashMap<u64, Batch>>,
    pub(super) next_batch: AtomicU64,
    pub(super) timeout: Duration,
}

/// Logs `e` for `op` and answers Mooncake's -1.
pub(super) fn fail(op: &str, e: impl std::fmt::Display) -> i32 {
    tracing::warn!(op, "{e}");
    FAILED
}

impl EngineState {
    /// Opens `target` and turns `(local, remote, len)` triples into requests.
    pub(super) async fn requests(
        &self,
        target: &str,
        op: Op,
        items: &[(u64, u64, u64)],
    ) -> Result<Vec<TransferRequest>, String> {
        let mut resolved = Vec::with_capacity(items.len());
        for &(local, remote, len) in items {
            let (buf, off) = self.regions.resolve(local, len)?;
            resolved.push((buf, off, remote, len));
        }
        let seg = self
            .engine
            .open_segment(target)
            .await
            .map_err(|e| format!("opening segment {target:?}: {e}"))?;
        resolved
            .into_iter()
            .map(|(buf, off, remote, len)| {
                let len = usize::try_from(len).map_err(|_| format!("length {len} too large"))?;
                Ok(TransferRequest::new(op, &buf, off, &seg, remote, len))
            })
            .collect()
    }

    /// Submits a batch; the timeout is Mooncake's: the base plus 1 ns per byte (1 GB/s).
    pub(super) async fn submit(
        &self,
        target: &str,
        op: Op,
        items: &[(u64, u64, u64)],
    ) -> Result<Batch, String> {
        let reqs = self.requests(target, op, items).await?;
        let bytes: u64 = items.iter().map(|i| i.2).sum();
        let timeout = self.timeout + Duration::from_nanos(bytes);
        self.engine
            .submit_with_timeout(reqs, timeout)
            .await
            .map_err(|e| e.to_string())
    }

    /// Submits, waits, then sends `notify` (after the bytes landed).
    pub(super) async fn run(
        &self,
        target: &str,
        op: Op,
        items: &[(u64, u64, u64)],
        notify: Option<&TransferNotify>,
    ) -> Result<(), String> {
        let batch = self.submit(target, op, items).await?;
        batch.wait().await.map_err(|e| e.to_string())?;
        if let Some(n) = notify {
            let seg = self
                .engine
                .open_segment(target)
                .await
                .map_err(|e| e.to_string())?;
            self.engine
                .notify(&seg, &encode_notify(n))
                .await
                .map_err(|e| format!("notifying {target:?}: {e}"))?;
        }
        Ok(())
    }

    /// With a metadata server, peers find new registrations only once the descriptor is
    /// republished: do it before answering (Mooncake's registration is synchronous too).
    pub(super) fn publish(&self, py: Python<'_>) -> Result<(), String> {
        if matches!(self.engine.config().metadata, MetadataConfig::P2p) {
            return Ok(());
        }
        block(py, self.engine.publish()).map_err(|e| format!("publishing the descriptor: {e}"))
    }

    pub(super) fn park(&self, batch: Batch) -> Result<u64, String> {
        let mut pending = self.pending.lock();
        if pending.len() >= MAX_PENDING_BATCHES {
            return Err(format!(
                "{MAX_PENDING_BATCHES} batches are waiting for their status to be read"
            ));
        }
        let id = self.next_batch.fetch_add(1, Ordering::Relaxed);
        pending.insert(id, batch);
        Ok(id)
    }
}

pub(super) fn triples(
    buffers: &[u64],
    peers: &[u64],
    lengths: &[u64],
) -> Result<Vec<(u64, u64, u64)>, String> {
    if buffers.len() != peers.len() || buffers.len() != lengths.len() {
        return Err(format!(
            "buffers, peer_buffer_addresses and lengths have different sizes ({}, {}, {})",
            buffers.len(),
            peers.len(),
            lengths.len()
        ));
    }
    Ok(buffers
        .iter()
        .zip(peers)
        .zip(lengths)
        .map(|((&b, &p), &l)| (b, p, l))
        .collect())
}

/// The object `get_engine()` returns (Mooncake: the inner C++ engine), accepted by
/// `MooncakeDistributedStore.setup(engine=...)`.
#[pyclass(module = "moongate.engine", frozen)]
pub struct InnerTransferEngine {
    #[allow(dead_code)]
    pub(crate) state: Arc<EngineState>,
}

#[pymethods]
impl InnerTransferEngine {
    fn __repr__(&self) -> String {
        format!("InnerTransferEngine({})", self.state.engine.segment_name())
    }
}
