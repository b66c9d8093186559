//! Pinned host buffers that bytes bound for or coming from device memory pass through on
//! the TCP path, bounded per peer.
//!
//! Each buffer is one chunk (`device_staging_chunk`, 1 MiB by default) of pinned memory.
//! A peer holds at most `device_staging_per_peer` bytes of them at once, as initiator and
//! as target alike (a semaphore per peer name: the authenticated name on the target side):
//! one peer moving much device memory waits for its own buffers and never starves another,
//! and what a peer can make this node pin is bounded by the number of peers it lets in.
//! Freed buffers are kept for reuse (pinning memory is a slow driver call) up to four
//! peers' worth; beyond that they are released.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{Allocation, DeviceBackend};
use crate::error::{Result, TransferError};

/// Idle pinned memory kept for reuse, in peers' worth of staging.
const IDLE_PEERS: usize = 4;

/// What the staging pool holds (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StagingStats {
    /// Size of one staging buffer.
    pub chunk: usize,
    /// Most bytes one peer may hold at once.
    pub per_peer_limit: usize,
    /// Pinned memory allocated now (in use and idle).
    pub allocated: usize,
    /// Pinned memory holding bytes in transit now.
    pub in_use: usize,
    /// The most that was ever in use at once.
    pub peak_in_use: usize,
}

/// The engine's pool of pinned staging buffers.
pub(crate) struct Staging {
    backend: Arc<dyn DeviceBackend>,
    chunk: usize,
    per_peer: usize,
    idle: Mutex<Vec<Allocation>>,
    peers: Mutex<HashMap<String, Arc<Semaphore>>>,
    allocated: AtomicUsize,
    in_use: AtomicUsize,
    peak: AtomicUsize,
}

impl Staging {
    pub(crate) fn new(backend: Arc<dyn DeviceBackend>, chunk: usize, per_peer: usize) -> Arc<Self> {
        let chunk = chunk.max(4096);
        Arc::new(Self {
            backend,
            chunk,
            per_peer: per_peer.max(chunk),
            idle: Mutex::new(Vec::new()),
            peers: Mutex::new(HashMap::new()),
            allocated: AtomicUsize::new(0),
            in_use: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        })
    }

    /// Bytes per buffer.
    pub(crate) fn chunk(&self) -> usize {
        self.chunk
    }

    /// Buffers one peer may hold at once.
    pub(crate) fn per_peer_buffers(&self) -> usize {
        self.per_peer / self.chunk
    }

    pub(crate) fn stats(&self) -> StagingStats {
        StagingStats {
            chunk: self.chunk,
            per_peer_limit: self.per_peer_buffers() * self.chunk,
            allocated: self.allocated.load(Ordering::Relaxed),
            in_use: self.in_use.load(Ordering::Relaxed),
            peak_in_use: self.peak.load(Ordering::Relaxed),
        }
    }

    fn semaphore(&self, peer: &str) -> Arc<Semaphore> {
        self.peers
            .lock()
            .entry(peer.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_peer_buffers().max(1))))
            .clone()
    }

    /// A buffer for traffic with `peer`, waiting while the peer holds its limit.
    pub(crate) async fn take(self: &Arc<Self>, peer: &str) -> Result<StagingBuf> {
        let mut v = self.take_many(peer, 1).await?;
        Ok(v.pop().expect("one buffer"))
    }

    /// `n` buffers (at most the peer's limit) for traffic with `peer`, taken at once: a
    /// caller never holds some while it waits for more, so callers sharing a peer's limit
    /// cannot deadlock.
    pub(crate) async fn take_many(
        self: &Arc<Self>,
        peer: &str,
        n: usize,
    ) -> Result<Vec<StagingBuf>> {
        let n = n.clamp(1, self.per_peer_buffers().max(1));
        let mut permits = self
            .semaphore(peer)
            .acquire_many_owned(n as u32)
            .await
            .map_err(|_| TransferError::Shutdown)?;
        let mut out = Vec::with_capacity(n);
        for _ in 1..n {
            out.push(self.buffer(permits.split(1).expect("n permits held"))?);
        }
        out.push(self.buffer(permits)?);
        Ok(out)
    }

    fn buffer(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Result<StagingBuf> {
        let mem = self.idle.lock().pop();
        let mem = match mem {
            Some(m) => m,
            None => {
                let m = self.backend.alloc_pinned(self.chunk)?;
                self.allocated.fetch_add(self.chunk, Ordering::Relaxed);
                m
            }
        };
        let now = self.in_use.fetch_add(self.chunk, Ordering::Relaxed) + self.chunk;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(StagingBuf {
            mem: Some(mem),
            pool: self.clone(),
            _permit: permit,
        })
    }

    fn put_back(&self, mem: Allocation) {
        self.in_use.fetch_sub(self.chunk, Ordering::Relaxed);
        let mut idle = self.idle.lock();
        if idle.len() < IDLE_PEERS * self.per_peer_buffers() {
            idle.push(mem);
            return;
        }
        drop(idle);
        self.allocated.fetch_sub(self.chunk, Ordering::Relaxed);
        drop(mem);
    }
}

/// One pinned buffer, back to its pool when dropped (and the peer's slot with it).
pub(crate) struct StagingBuf {
    mem: Option<Allocation>,
    pool: Arc<Staging>,
    _permit: OwnedSemaphorePermit,
}

impl StagingBuf {
    /// First byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.mem.as_ref().expect("held until drop").addr() as *mut u8
    }

    /// Its address, as copies name it.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr() as u64
    }

    /// Gives the buffer up for good: a device may still copy into or out of it (its fence
    /// never came), so it is neither reused nor freed. The peer's slot is released.
    pub(crate) fn abandon(mut self) {
        if let Some(m) = self.mem.take() {
            tracing::warn!(
                bytes = self.pool.chunk,
                "a device copy never completed: its staging buffer is leaked, not reused"
            );
            self.pool
                .in_use
                .fetch_sub(self.pool.chunk, Ordering::Relaxed);
            m.leak();
        }
    }
}

impl Drop for StagingBuf {
    fn drop(&mut self) {
        if let Some(m) = self.mem.take() {
            self.pool.put_back(m);
        }
    }
}
