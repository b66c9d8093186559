//! Pinned host buffers that bytes bound for or coming from device memory pass through on
//! the TCP path, bounded per peer.
//!
//! Each buffer is one chunk (`device_staging_chunk`, 1 MiB by default) of pinned memory.
//! A peer holds at most `device_staging_per_peer` bytes of them at once, as initiator and
//! as target alike (a semaphore per peer name: the authenticated name on the target side):
//! one peer moving much device memory waits for its own buffers and never starves another.
//! All peers together hold at most `device_staging_total` (a member of the cluster could
//! declare many names). A caller takes its per-peer share first, then the global one, each
//! all at once, so no one holds part of what it waits for. Freed buffers are kept for reuse
//! (pinning memory is a slow driver call) up to four peers' worth; beyond that they are
//! released.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{Allocation, DeviceBackend};
use crate::error::{Result, TransferError};

/// Idle pinned memory kept for reuse, in peers' worth of staging.
const IDLE_PEERS: usize = 4;
/// Peers remembered before idle ones (no buffer out) are forgotten.
const MAX_PEERS: usize = 1024;

/// What the staging pool holds (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StagingStats {
    /// Size of one staging buffer.
    pub chunk: usize,
    /// Most bytes one peer may hold at once.
    pub per_peer_limit: usize,
    /// Most bytes all peers together may hold at once.
    pub total_limit: usize,
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
    total: usize,
    all: Arc<Semaphore>,
    idle: Mutex<Vec<Allocation>>,
    peers: Mutex<HashMap<String, Arc<Semaphore>>>,
    allocated: AtomicUsize,
    in_use: AtomicUsize,
    peak: AtomicUsize,
}

impl Staging {
    pub(crate) fn new(
        backend: Arc<dyn DeviceBackend>,
        chunk: usize,
        per_peer: usize,
        total: usize,
    ) -> Arc<Self> {
        let chunk = chunk.max(4096);
        let per_peer = per_peer.max(chunk) / chunk * chunk;
        let total = total.max(per_peer) / chunk * chunk;
        Arc::new(Self {
            backend,
            chunk,
            per_peer,
            total,
            all: Arc::new(Semaphore::new(total / chunk)),
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
            per_peer_limit: self.per_peer,
            total_limit: self.total,
            allocated: self.allocated.load(Ordering::Relaxed),
            in_use: self.in_use.load(Ordering::Relaxed),
            peak_in_use: self.peak.load(Ordering::Relaxed),
        }
    }

    fn semaphore(&self, peer: &str) -> Arc<Semaphore> {
        let mut peers = self.peers.lock();
        if let Some(s) = peers.get(peer) {
            return s.clone();
        }
        if peers.len() >= MAX_PEERS {
            // Forget peers holding nothing (no permit out, nobody waiting on them).
            let full = self.per_peer_buffers();
            peers.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < full);
        }
        let s = Arc::new(Semaphore::new(self.per_peer_buffers().max(1)));
        peers.insert(peer.to_owned(), s.clone());
        s
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
        let mut mine = self
            .semaphore(peer)
            .acquire_many_owned(n as u32)
            .await
            .map_err(|_| TransferError::Shutdown)?;
        let mut ours = self
            .all
            .clone()
            .acquire_many_owned(n as u32)
            .await
            .map_err(|_| TransferError::Shutdown)?;
        let mut out = Vec::with_capacity(n);
        for _ in 1..n {
            let permits = (
                mine.split(1).expect("n permits held"),
                ours.split(1).expect("n permits held"),
            );
            out.push(self.buffer(permits)?);
        }
        out.push(self.buffer((mine, ours))?);
        Ok(out)
    }

    fn buffer(
        self: &Arc<Self>,
        permit: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    ) -> Result<StagingBuf> {
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
    /// The peer's slot and the global one.
    _permit: (OwnedSemaphorePermit, OwnedSemaphorePermit),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{CopyStream, DevicePointer};

    /// Pinned memory from the heap; nothing else.
    struct HeapPinned;

    impl DeviceBackend for HeapPinned {
        fn name(&self) -> &'static str {
            "heap"
        }
        fn device_count(&self) -> Result<u32> {
            Ok(0)
        }
        fn locate(&self, _: u64) -> Result<Option<DevicePointer>> {
            Ok(None)
        }
        fn stream(&self, _: u32) -> Result<Arc<dyn CopyStream>> {
            Err(TransferError::invalid("no device"))
        }
        unsafe fn copy_blocking(&self, _: u32, _: u64, _: u64, _: usize) -> Result<()> {
            Err(TransferError::invalid("no device"))
        }
        fn alloc_pinned(&self, len: usize) -> Result<Allocation> {
            let mem = vec![0u8; len].into_boxed_slice();
            Ok(Allocation::new(mem.as_ptr() as u64, len, mem))
        }
        fn alloc_device(&self, _: u32, _: usize) -> Result<Allocation> {
            Err(TransferError::invalid("no device"))
        }
        fn ipc_export(&self, _: &DevicePointer) -> Result<Vec<u8>> {
            Err(TransferError::invalid("no device"))
        }
        fn ipc_open(&self, _: u32, _: &[u8]) -> Result<Allocation> {
            Err(TransferError::invalid("no device"))
        }
        fn device_uuid(&self, _: u32) -> Result<String> {
            Err(TransferError::invalid("no device"))
        }
    }

    async fn pending<T>(f: impl std::future::Future<Output = T>) -> bool {
        tokio::time::timeout(std::time::Duration::from_secs(1), f)
            .await
            .is_err()
    }

    #[tokio::test(start_paused = true)]
    async fn buffers_are_bounded_per_peer_and_in_all_and_reused() {
        const C: usize = 4096;
        let s = Staging::new(Arc::new(HeapPinned), C, 2 * C, 3 * C);
        let a = s.take_many("a", 2).await.unwrap();
        assert_eq!(s.stats().in_use, 2 * C);
        // "a" is at its limit; "b" gets what is left in all (one buffer), not two.
        assert!(pending(s.take("a")).await);
        let b1 = s.take("b").await.unwrap();
        assert!(pending(s.take_many("b", 2)).await);
        assert!(pending(s.take("c")).await);
        assert_eq!(s.stats().peak_in_use, 3 * C);
        drop(a);
        let b2 = s.take("b").await.unwrap();
        assert!(pending(s.take("b")).await, "b holds its limit");
        let c = s.take("c").await.unwrap();
        drop((b1, b2, c));
        let st = s.stats();
        assert_eq!((st.in_use, st.peak_in_use), (0, 3 * C));
        assert_eq!(st.allocated, 3 * C, "buffers are kept and reused");
        // More than a peer's limit at once is clamped to it.
        assert_eq!(s.take_many("d", 10).await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn idle_peers_are_forgotten() {
        let s = Staging::new(Arc::new(HeapPinned), 4096, 4096, 4096);
        for i in 0..(MAX_PEERS + 10) {
            drop(s.take(&format!("peer-{i}")).await.unwrap());
        }
        assert!(s.peers.lock().len() <= MAX_PEERS);
        let held = s.take("kept").await.unwrap();
        for i in 0..MAX_PEERS {
            s.semaphore(&format!("other-{i}"));
        }
        assert!(
            s.peers.lock().contains_key("kept"),
            "a peer holding a buffer stays"
        );
        drop(held);
    }
}
