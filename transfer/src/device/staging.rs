//! Pinned host buffers that bytes bound for or coming from device memory pass through on
//! the TCP path, bounded per peer.
//!
//! Each buffer is one chunk (`device_staging_chunk`, 1 MiB by default) of pinned memory.
//! A peer holds at most `device_staging_per_peer` bytes of them at once (a semaphore per
//! peer name: the authenticated name on the target side): one peer moving much device
//! memory waits for its own buffers and never starves another. All peers together hold at
//! most `device_staging_total` (a member of the cluster could declare many names). A caller
//! takes its per-peer share first, then the global one, each all at once, so no one holds
//! part of what it waits for.
//!
//! The two [`Role`]s have budgets of their own: an initiator's write slice holds its buffer
//! until the slice is sent, and the target it goes to needs a buffer to receive it. Were
//! the budgets shared, two engines writing device memory to each other could each spend
//! theirs on outgoing slices and wait for the other's target side forever.
//!
//! A buffer a device copy may still use is an [`InFlight`]: it goes back to the pool only
//! once the copy's fence resolved, even when the request or connection it served is gone.
//! Freed buffers are kept for reuse (pinning memory is a slow driver call) up to four
//! peers' worth; beyond that they are released.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{Allocation, DeviceBackend, Fence};
use crate::error::{Result, TransferError};

/// Which side of a transfer a buffer serves; each has its own budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    /// This engine's requests to a peer.
    Initiator,
    /// A peer's requests to this engine.
    Target,
}

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
    /// The global budget of each role (initiator, target).
    all: [Arc<Semaphore>; 2],
    idle: Mutex<Vec<Allocation>>,
    peers: Mutex<HashMap<(Role, String), Arc<Semaphore>>>,
    allocated: AtomicUsize,
    in_use: AtomicUsize,
    peak: AtomicUsize,
    /// The engine's runtime, where buffers whose copies outlive their request wait.
    runtime: Option<tokio::runtime::Handle>,
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
            all: [(); 2].map(|()| Arc::new(Semaphore::new(total / chunk))),
            idle: Mutex::new(Vec::new()),
            peers: Mutex::new(HashMap::new()),
            allocated: AtomicUsize::new(0),
            in_use: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            runtime: tokio::runtime::Handle::try_current().ok(),
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

    fn semaphore(&self, role: Role, peer: &str) -> Arc<Semaphore> {
        let mut peers = self.peers.lock();
        let key = (role, peer.to_owned());
        if let Some(s) = peers.get(&key) {
            return s.clone();
        }
        if peers.len() >= MAX_PEERS {
            // Forget peers holding nothing (no permit out, nobody waiting on them).
            let full = self.per_peer_buffers();
            peers.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < full);
        }
        let s = Arc::new(Semaphore::new(self.per_peer_buffers().max(1)));
        peers.insert(key, s.clone());
        s
    }

    /// A buffer for traffic with `peer` in `role`, waiting while the peer holds its limit.
    pub(crate) async fn take(self: &Arc<Self>, role: Role, peer: &str) -> Result<StagingBuf> {
        let mut v = self.take_many(role, peer, 1).await?;
        Ok(v.pop().expect("one buffer"))
    }

    /// `n` buffers (at most the peer's limit) for traffic with `peer` in `role`, taken at
    /// once: a caller never holds some while it waits for more, so callers sharing a peer's
    /// limit cannot deadlock.
    pub(crate) async fn take_many(
        self: &Arc<Self>,
        role: Role,
        peer: &str,
        n: usize,
    ) -> Result<Vec<StagingBuf>> {
        let n = n.clamp(1, self.per_peer_buffers().max(1));
        let mut mine = self
            .semaphore(role, peer)
            .acquire_many_owned(n as u32)
            .await
            .map_err(|_| TransferError::Shutdown)?;
        let mut ours = self.all[role as usize]
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

/// A staging buffer a device copy was enqueued on, with the fence after that copy and
/// what must outlive the copy (the registration of its device side).
///
/// [`InFlight::settle`] waits for the fence and hands the buffer back. Dropped unsettled
/// (its request cancelled, its connection gone, an error on the way, a settle that was
/// itself cancelled or ran out of time), it is parked on the engine's runtime: a task
/// waits for the fence, at most [`PARK_GRACE`], then returns the buffer to the pool, or
/// abandons it when the fence never comes. No buffer is reused, and no registration
/// released, while a copy may still touch it: an abandoned buffer is leaked, and so is the
/// registration its copy was for.
pub(crate) struct InFlight {
    buf: Option<StagingBuf>,
    fence: Option<Fence>,
    keep: Option<Box<dyn Any + Send>>,
}

/// How long a parked buffer's fence is waited for before the buffer is abandoned.
pub(crate) const PARK_GRACE: Duration = Duration::from_secs(10);

impl InFlight {
    /// `buf` with the fence of the copy enqueued on it; `keep` lives until that fence.
    pub(crate) fn new(buf: StagingBuf, fence: Fence, keep: Option<Box<dyn Any + Send>>) -> Self {
        Self {
            buf: Some(buf),
            fence: Some(fence),
            keep,
        }
    }

    /// Waits for the fence, at most `within`: the buffer (its copy over) and the copy's
    /// result. A fence that does not come parks the buffer (`None`). Cancelling the wait
    /// parks it too: the buffer stays with the copy until its fence.
    pub(crate) async fn settle(mut self, within: Duration) -> (Option<StagingBuf>, Result<()>) {
        let fence = self
            .fence
            .as_mut()
            .expect("an unsettled copy has its fence");
        match tokio::time::timeout(within, fence).await {
            Ok(r) => {
                self.fence = None;
                (self.buf.take(), r)
            }
            Err(_) => (
                None,
                Err(TransferError::Device {
                    reason: format!("a device copy did not complete within {within:?}"),
                }),
            ),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let (Some(buf), Some(fence)) = (self.buf.take(), self.fence.take()) else {
            return;
        };
        let parked = Parked {
            buf: Some(buf),
            keep: self.keep.take(),
        };
        let rt = parked.pool().runtime.clone();
        match rt.or_else(|| tokio::runtime::Handle::try_current().ok()) {
            // A task the runtime drops unrun (it is shutting down) drops `parked`, which
            // abandons the buffer.
            Some(rt) => drop(rt.spawn(parked.wait(fence))),
            None => drop(parked),
        }
    }
}

/// A parked buffer: returned to the pool once its fence resolved, abandoned (and its
/// registration leaked) when dropped before.
struct Parked {
    buf: Option<StagingBuf>,
    keep: Option<Box<dyn Any + Send>>,
}

impl Parked {
    fn pool(&self) -> &Staging {
        &self.buf.as_ref().expect("parked").pool
    }

    async fn wait(mut self, fence: Fence) {
        if tokio::time::timeout(PARK_GRACE, fence).await.is_ok() {
            drop(self.buf.take()); // back to the pool
            drop(self.keep.take());
        }
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            buf.abandon();
            std::mem::forget(self.keep.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{CopyStream, DevicePointer};

    const I: Role = Role::Initiator;

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
        let a = s.take_many(I, "a", 2).await.unwrap();
        assert_eq!(s.stats().in_use, 2 * C);
        // "a" is at its limit; "b" gets what is left in all (one buffer), not two.
        assert!(pending(s.take(I, "a")).await);
        let b1 = s.take(I, "b").await.unwrap();
        assert!(pending(s.take_many(I, "b", 2)).await);
        assert!(pending(s.take(I, "c")).await);
        assert_eq!(s.stats().peak_in_use, 3 * C);
        drop(a);
        let b2 = s.take(I, "b").await.unwrap();
        assert!(pending(s.take(I, "b")).await, "b holds its limit");
        let c = s.take(I, "c").await.unwrap();
        drop((b1, b2, c));
        let st = s.stats();
        assert_eq!((st.in_use, st.peak_in_use), (0, 3 * C));
        assert_eq!(st.allocated, 3 * C, "buffers are kept and reused");
        // More than a peer's limit at once is clamped to it.
        assert_eq!(s.take_many(I, "d", 10).await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn idle_peers_are_forgotten() {
        let s = Staging::new(Arc::new(HeapPinned), 4096, 4096, 4096);
        for i in 0..(MAX_PEERS + 10) {
            drop(s.take(I, &format!("peer-{i}")).await.unwrap());
        }
        assert!(s.peers.lock().len() <= MAX_PEERS);
        let held = s.take(I, "kept").await.unwrap();
        for i in 0..MAX_PEERS {
            s.semaphore(I, &format!("other-{i}"));
        }
        assert!(
            s.peers.lock().contains_key(&(I, "kept".to_owned())),
            "a peer holding a buffer stays"
        );
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn initiator_and_target_budgets_are_separate() {
        const C: usize = 4096;
        let s = Staging::new(Arc::new(HeapPinned), C, C, C);
        // Every initiator buffer is out (slices on their way to "b")...
        let out = s.take(Role::Initiator, "b").await.unwrap();
        assert!(pending(s.take(Role::Initiator, "c")).await);
        // ...and "b"'s own writes to this engine still get a buffer to land in.
        let inbound = s.take(Role::Target, "b").await.unwrap();
        assert!(pending(s.take(Role::Target, "c")).await);
        drop((out, inbound));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_in_flight_buffer_waits_for_its_fence() {
        const C: usize = 4096;
        let s = Staging::new(Arc::new(HeapPinned), C, C, C);
        let buf = s.take(I, "a").await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let keep = Arc::new(());
        let fence = Fence::new(async move { rx.await.map_err(|_| TransferError::Shutdown) });
        drop(InFlight::new(buf, fence, Some(Box::new(keep.clone()))));
        // The copy still runs: the buffer is not back, the registration still held.
        assert!(pending(s.take(I, "a")).await);
        assert_eq!((s.stats().in_use, Arc::strong_count(&keep)), (C, 2));
        tx.send(()).unwrap();
        let again = s.take(I, "a").await.unwrap();
        assert_eq!(Arc::strong_count(&keep), 1, "released with the fence");
        drop(again);
        assert_eq!(s.stats().allocated, C, "the same buffer, reused");

        // A fence that never comes: the buffer is abandoned after the grace, not reused.
        let buf = s.take(I, "a").await.unwrap();
        let fence = Fence::new(std::future::pending());
        drop(InFlight::new(buf, fence, None));
        tokio::time::sleep(PARK_GRACE + std::time::Duration::from_secs(1)).await;
        let fresh = s.take(I, "a").await.unwrap();
        let st = s.stats();
        assert_eq!(
            (st.allocated, st.in_use),
            (2 * C, C),
            "a new buffer: the old one leaked"
        );
        drop(fresh);
    }

    #[tokio::test(start_paused = true)]
    async fn a_settle_that_times_out_or_is_cancelled_leaves_the_buffer_with_its_copy() {
        const C: usize = 4096;
        let s = Staging::new(Arc::new(HeapPinned), C, 2 * C, 2 * C);
        let f = InFlight::new(s.take(I, "a").await.unwrap(), Fence::ready(Ok(())), None);
        let (b, r) = f.settle(std::time::Duration::from_secs(1)).await;
        assert!(b.is_some() && r.is_ok());
        drop(b);
        assert_eq!(s.stats().in_use, 0);

        // Timed out: parked, not abandoned at once (the copy may be about to finish).
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let fence = Fence::new(async move { rx.await.map_err(|_| TransferError::Shutdown) });
        let keep = Arc::new(());
        let f = InFlight::new(
            s.take(I, "a").await.unwrap(),
            fence,
            Some(Box::new(keep.clone())),
        );
        let (b, r) = f.settle(std::time::Duration::from_secs(1)).await;
        assert!(b.is_none());
        assert!(matches!(r, Err(TransferError::Device { .. })), "{r:?}");
        assert_eq!((s.stats().in_use, Arc::strong_count(&keep)), (C, 2));
        tx.send(()).unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!((s.stats().in_use, Arc::strong_count(&keep)), (0, 1));

        // Cancelled while it waits: the same.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let fence = Fence::new(async move { rx.await.map_err(|_| TransferError::Shutdown) });
        let f = InFlight::new(s.take(I, "a").await.unwrap(), fence, None);
        let waiting = f.settle(std::time::Duration::from_secs(100));
        assert!(pending(waiting).await, "cancelled after a second");
        assert_eq!(s.stats().in_use, C, "the buffer stays with its copy");
        tx.send(()).unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(s.stats().in_use, 0);

        // A fence that never comes: abandoned after the grace, with its registration.
        let keep = Arc::new(());
        let f = InFlight::new(
            s.take(I, "a").await.unwrap(),
            Fence::new(std::future::pending()),
            Some(Box::new(keep.clone())),
        );
        let _ = f.settle(std::time::Duration::from_secs(1)).await;
        tokio::time::sleep(PARK_GRACE + std::time::Duration::from_secs(1)).await;
        let st = s.stats();
        assert_eq!((st.in_use, st.allocated), (0, C), "abandoned, not reused");
        assert_eq!(
            Arc::strong_count(&keep),
            2,
            "the registration is leaked with it"
        );
    }
}
