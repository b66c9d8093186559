//! The client's registered copy buffer: where `put` stages a caller's bytes before a
//! transfer and where `get` lands an object before copying it out (for replicas that only
//! a transfer reaches: one the engine maps is copied directly, see
//! `TransferEngine::append_mapped`).
//!
//! Ranges are handed out by the same O(1) offset allocator the master uses for segments.
//! A [`Slot`] frees its range when dropped, except while a transfer may still touch it: a
//! slot is *armed* for the duration of a transfer, and one dropped armed (its transfer
//! failed, timed out, or the caller's future was dropped mid-way) is quarantined for the
//! engine's I/O timeout before its range can be reused, so late bytes of an abandoned
//! transfer never land in another operation's data. When the buffer has no room, a slot
//! gets a registered buffer of its own (slower, never wrong).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use transfer::{AllocOptions, RegisteredBuffer, TransferEngine};

use super::error::{StoreError, StoreResult};
use transfer::memory::{Allocation, OffsetAllocator};

/// Granularity of staging ranges.
const UNIT_SHIFT: u32 = 6;

/// Most bytes a copying batch stages at once (see [`parts`]): small enough to still be in
/// the CPU's cache when the transfer reads them back.
pub(crate) const STAGE_BYTES: usize = 4 << 20;

/// Most bytes copied straight into or out of mapped memory (the own segment, a same-host
/// node's shared memory) in one go, spread over two threads: the copies of such a part
/// hold the runtime's thread (and their CPU stripes) until they are over.
pub(crate) const MAPPED_PART: usize = 64 << 20;

/// Splits values of `lens` into consecutive parts of at most `max` bytes in all (a value
/// longer than that is a part alone). A copying batch of large values is put part by part:
/// staging 64 MiB and then writing it out read every byte back from memory, while a 4 MiB
/// part is read back from cache (a 64 x 1 MiB `batch_put` ran at 0.68x 64 single `put`s).
/// Each part costs its own master requests, which is little next to copying `max` bytes.
pub(crate) fn parts(
    lens: impl IntoIterator<Item = usize>,
    max: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes, mut n) = (0, 0usize, 0);
    for len in lens {
        if n > start && bytes.saturating_add(len) > max {
            out.push(start..n);
            (start, bytes) = (n, 0);
        }
        bytes = bytes.saturating_add(len);
        n += 1;
    }
    if n > start {
        out.push(start..n);
    }
    out
}

/// The shared copy buffer of one client.
pub(crate) struct Staging {
    buf: RegisteredBuffer,
    alloc: Mutex<OffsetAllocator>,
    engine: TransferEngine,
    quarantine: Duration,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("len", &self.buf.len())
            .finish()
    }
}

/// A range of registered memory for one value.
pub(crate) struct Slot {
    buf: RegisteredBuffer,
    offset: usize,
    len: usize,
    /// Where the range came from: the shared buffer (freed on drop) or its own buffer.
    owner: Option<(Arc<Staging>, Allocation)>,
    armed: bool,
}

impl Staging {
    /// A copy buffer of `len` bytes registered with `engine` (faulted in at once when
    /// `prefault`).
    pub(crate) fn new(
        engine: &TransferEngine,
        len: usize,
        prefault: bool,
        quarantine: Duration,
    ) -> StoreResult<Arc<Self>> {
        let opts = AllocOptions {
            shared: engine.config().shm,
            populate: prefault,
            ..AllocOptions::default()
        };
        let buf = engine
            .alloc_with(len, opts)
            .map_err(|e| StoreError::setup("allocating the local copy buffer", e))?;
        Ok(Arc::new(Self {
            alloc: Mutex::new(OffsetAllocator::new((len >> UNIT_SHIFT) as u64)),
            buf,
            engine: engine.clone(),
            quarantine,
        }))
    }

    /// The registered copy buffer.
    pub(crate) fn buffer(&self) -> &RegisteredBuffer {
        &self.buf
    }

    /// A slot of `len` bytes: from the shared buffer when it has room, else a buffer of
    /// its own.
    pub(crate) fn slot(self: &Arc<Self>, len: usize) -> StoreResult<Slot> {
        let units = (len.max(1) as u64).div_ceil(1 << UNIT_SHIFT);
        if let Some(a) = self.alloc.lock().allocate(units) {
            return Ok(Slot {
                buf: self.buf.clone(),
                offset: (a.offset << UNIT_SHIFT) as usize,
                len,
                owner: Some((self.clone(), a)),
                armed: false,
            });
        }
        let buf = self
            .engine
            .alloc(len.max(1))
            .map_err(|e| StoreError::setup("allocating a copy buffer", e))?;
        Ok(Slot {
            buf,
            offset: 0,
            len,
            owner: None,
            armed: false,
        })
    }

    /// Bytes of the shared buffer in use (tests and metrics).
    pub(crate) fn used_bytes(&self) -> u64 {
        self.alloc.lock().used_units() << UNIT_SHIFT
    }
}

impl Slot {
    /// The registered buffer holding the slot.
    pub(crate) fn buf(&self) -> &RegisteredBuffer {
        &self.buf
    }

    /// Offset of the slot in [`Slot::buf`].
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// Marks the slot as the target or source of a transfer about to be submitted.
    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    /// The transfer using the slot completed: its range is safe to reuse.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Copies `src` (at most the slot's length) into the slot.
    pub(crate) fn fill(&self, src: &[u8]) -> StoreResult<()> {
        self.buf
            .write_at(self.offset, &src[..src.len().min(self.len)])
            .map_err(|e| StoreError::setup("staging copy", e))
    }

    /// Appends the first `len` bytes of the slot to `out`.
    pub(crate) fn append_to(&self, len: usize, out: &mut Vec<u8>) -> StoreResult<()> {
        self.buf
            .append_to(self.offset, len.min(self.len), out)
            .map_err(|e| StoreError::setup("staging copy", e))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some((staging, a)) = self.owner.take() else {
            return;
        };
        if !self.armed {
            staging.alloc.lock().free(a);
            return;
        }
        // A transfer may still write here: keep the range out of use until it cannot. The
        // wait runs where the engine runs its background work, not on the caller's runtime
        // (which may run only during its calls, see `caller_driven`); if that runtime is
        // gone (the process is exiting) the task is dropped unrun and the range stays
        // allocated, which is safe.
        let wait = staging.quarantine;
        let engine = staging.engine.clone();
        engine.spawn(async move {
            tokio::time::sleep(wait).await;
            staging.alloc.lock().free(a);
        });
    }
}

#[cfg(test)]
mod tests {
    /// A slot dropped while armed (its transfer abandoned) on a runtime that runs only
    /// during its caller's calls is still freed once its quarantine is over: the wait runs
    /// on the engine's runtime, not on the caller's, which nothing drives afterwards.
    #[test]
    fn a_quarantine_begun_on_a_callers_runtime_ends_on_the_engines() {
        use std::time::{Duration, Instant};
        let engine_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let staging = engine_rt.block_on(async {
            let cfg = transfer::EngineConfig::listening_on("127.0.0.1:0".parse().unwrap());
            let engine = transfer::TransferEngine::new(cfg).await.unwrap();
            super::Staging::new(&engine, 1 << 20, false, Duration::from_millis(20)).unwrap()
        });
        let caller = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        caller.block_on(async {
            let mut slot = staging.slot(4096).unwrap();
            slot.arm();
            drop(slot); // armed: quarantined, not freed
        });
        assert!(staging.used_bytes() > 0, "freed before its quarantine");
        let deadline = Instant::now() + Duration::from_secs(10);
        while staging.used_bytes() > 0 {
            assert!(Instant::now() < deadline, "the quarantine never ended");
            std::thread::yield_now();
        }
        drop(caller);
    }

    #[test]
    fn parts_hold_at_most_max_bytes_and_every_value_once() {
        use super::parts;
        assert!(parts([], 10).is_empty());
        assert_eq!(parts([4, 4, 4], 10), vec![0..2, 2..3]);
        assert_eq!(parts([1; 64], 1 << 20), vec![0..64]);
        // A value over the limit is a part of its own.
        assert_eq!(parts([3, 20, 3, 3], 10), vec![0..1, 1..2, 2..4]);
        assert_eq!(parts([1 << 20; 64], 4 << 20).len(), 16);
    }
}
