//! Reads and writes with one copy from and to memory this engine maps: its own segment, or
//! a same-host peer's region in shared memory.
//!
//! A copying read (a store's `get`) otherwise lands the bytes in a registered buffer by a
//! transfer and then copies them out, and a copying write (`put`) stages them in one first:
//! two copies of every byte. Where the other side is mapped into this process anyway,
//! [`TransferEngine::append_mapped`] copies it straight into the caller's vector and
//! [`TransferEngine::write_mapped`] straight from the caller's slice, with the checks a
//! transfer makes (the peer's registration before and after the copy, the CPU locks of
//! the bytes touched in this process). They copy on the calling thread, synchronously: a
//! caller's borrowed bytes are never touched after the call returns, so they need no
//! registration.

use std::sync::atomic::Ordering;

use super::TransferEngine;
use crate::engine::segments::Segment;
use crate::error::{RemoteRange, Result};
use crate::memory::{Access, CpuLock};
use crate::shm::CopyTarget;
use crate::tcp::io::SendPtr;

/// A range this engine maps, resolved and checked.
struct Mapped {
    target: CopyTarget,
    /// The range's first byte in this process.
    ptr: SendPtr,
    /// The range's offset in its region (for the region's CPU lock).
    off: usize,
}

impl Mapped {
    /// The CPU lock of the region, where the region is this process's memory.
    fn lock(&self) -> Option<&CpuLock> {
        match &self.target {
            CopyTarget::Peer(m) => m.owner_lock.as_deref(),
            CopyTarget::Local(e) => Some(&**e.region.cpu()),
            CopyTarget::Ipc(_) => None,
        }
    }
}

impl TransferEngine {
    /// Appends the `len` bytes at `addr` of `seg` to `out` with one copy on the calling
    /// thread, where this engine maps them: its own segment, or (shared memory on) a
    /// same-host peer's shared region. `None` where only a transfer reaches them (over the
    /// network, device memory, a range the cached descriptor does not hold, shared memory
    /// unusable): the caller transfers them instead, which also reports what is wrong with
    /// a bad range. `Some(Err)` where the mapped region failed its checks (unregistered,
    /// its owner gone); nothing is appended then.
    pub fn append_mapped(
        &self,
        seg: &Segment,
        addr: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Option<Result<()>> {
        let m = match self.mapped(seg, addr, len, false)? {
            Ok(m) => m,
            Err(e) => return Some(Err(e)),
        };
        out.reserve(len);
        let dst = out.spare_capacity_mut().as_mut_ptr().cast::<u8>();
        let held = m.lock().map(|l| l.lock(m.off, len, Access::Read));
        // SAFETY: `m.ptr` points at `len` bytes inside a region registered for them (see
        // `mapped`), mapped while `m` holds its target. The destination is the spare
        // capacity of `out` (reserved above: at least `len` bytes), private memory of the
        // caller's vector, so the two cannot overlap. No other thread of this process
        // writes the source meanwhile: its CPU stripes are held for reading (another
        // process's writes to shared memory are as for every shared-memory transfer; a
        // region retired meanwhile fails the check after the copy, and nothing counts).
        unsafe { copy_spread(m.ptr.0, dst, len) };
        drop(held);
        if let Err(e) = self.settle_mapped(seg, addr, len, &m) {
            return Some(Err(e));
        }
        // SAFETY: the `len` bytes after the vector's length were written just above.
        unsafe { out.set_len(out.len() + len) };
        Some(Ok(()))
    }

    /// Writes `src` at `addr` of `seg` with one copy on the calling thread, where this
    /// engine maps that range (as for [`TransferEngine::append_mapped`]); `None` where only
    /// a transfer reaches it. `Some(Err)` where the mapped region failed its checks; the
    /// bytes then count as not written.
    pub fn write_mapped(&self, seg: &Segment, addr: u64, src: &[u8]) -> Option<Result<()>> {
        let len = src.len();
        let m = match self.mapped(seg, addr, len, true)? {
            Ok(m) => m,
            Err(e) => return Some(Err(e)),
        };
        let held = m.lock().map(|l| l.lock(m.off, len, Access::Write));
        let (s, d) = (src.as_ptr(), m.ptr.0);
        if (s as usize) < (d as usize).wrapping_add(len) && (d as usize) < (s as usize) + len {
            // SAFETY: as below; `copy` tolerates the overlap (the caller's slice views the
            // very memory it writes, which only unsafe code can arrange).
            unsafe { std::ptr::copy(s, d, len) };
        } else {
            // SAFETY: `d` points at `len` bytes inside a region registered for them (see
            // `mapped`), mapped while `m` holds its target; `s` is the caller's slice of
            // `len` bytes, borrowed for the call; the two do not overlap. No other thread
            // of this process touches the destination meanwhile: its CPU stripes are held
            // exclusively where the region is this process's memory (a region of another
            // process is written as every shared-memory transfer writes it).
            unsafe { copy_spread(s, d, len) };
        }
        drop(held);
        Some(self.settle_mapped(seg, addr, len, &m))
    }

    /// Resolves `len` bytes at `addr` of `seg` to memory this engine maps, checked as a
    /// transfer's copy is before it starts (see [`TransferEngine::append_mapped`] for
    /// `None`).
    fn mapped(&self, seg: &Segment, addr: u64, len: usize, write: bool) -> Option<Result<Mapped>> {
        if let Err(e) = self.check_open() {
            return Some(Err(e));
        }
        let name = seg.name();
        if seg.same(&self.inner.local_segment) {
            let target =
                crate::shm::local_target(&self.inner.regions, name, addr, len as u64).ok()?;
            let CopyTarget::Local(e) = &target else {
                return None;
            };
            if e.region.is_device() {
                return None;
            }
            let off = (addr - e.region.addr()) as usize;
            let ptr = SendPtr(e.region.as_ptr().wrapping_add(off));
            return Some(Ok(Mapped { target, ptr, off }));
        }
        if !self.inner.config.shm || !seg.is_same_host() || seg.is_stale() {
            return None;
        }
        let desc = seg.descriptor();
        let region = desc.find_region(addr, len as u64).ok()?;
        if !region.location.is_host() || region.cuda_ipc.is_some() {
            return None;
        }
        let shm = region.shm.as_ref()?;
        let m = seg.state().shm.get(name, region, shm).ok()?;
        let range = RemoteRange::new(addr, len as u64);
        if let Err(e) = m.check(name, range).and_then(|()| m.check_owner(name)) {
            return Some(Err(e));
        }
        m.prefault(addr, len, write);
        let (ptr, off) = (m.ptr_of(addr), (addr - m.region.addr) as usize);
        Some(Ok(Mapped {
            target: CopyTarget::Peer(m),
            ptr,
            off,
        }))
    }

    /// After a copy through `m`: a peer's region must still be the one registered (a
    /// region retired meanwhile does not count as read or written); counts the bytes.
    fn settle_mapped(&self, seg: &Segment, addr: u64, len: usize, m: &Mapped) -> Result<()> {
        let c = &self.inner.counters;
        if let CopyTarget::Peer(p) = &m.target {
            p.check(seg.name(), RemoteRange::new(addr, len as u64))?;
            c.shm.fetch_add(len as u64, Ordering::Relaxed);
        } else {
            c.local.fetch_add(len as u64, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Copies this large or more on two threads (where the process may use two CPUs): one
/// core's copy does not saturate the memory bus (see `hostcopy`; a 16 MiB `put` to a
/// same-host node from a source out of cache ran at 6 GB/s on one thread, against 13 for
/// the same bytes copied by `hostcopy` on two).
const SPREAD_MIN: usize = 8 << 20;

/// Copies `len` bytes from `src` to `dst`: the upper half on a scoped helper thread when
/// the copy is [`SPREAD_MIN`] or more, the lower half on this one (all of it here when no
/// thread can be started).
///
/// # Safety
/// As for [`crate::memory::copy_nonoverlapping_large`]: `src` readable and `dst` writable
/// for `len` bytes, not overlapping, and no one else writing either meanwhile. The helper
/// is joined before this returns, so it touches them only while the caller's guarantees
/// (and any CPU stripes the caller holds) last.
unsafe fn copy_spread(src: *const u8, dst: *mut u8, len: usize) {
    if len >= SPREAD_MIN && crate::hostcopy::cpus() > 1 {
        let half = (len / 2).next_multiple_of(4096);
        let upper = (
            SendPtr(src.wrapping_add(half).cast_mut()),
            SendPtr(dst.wrapping_add(half)),
        );
        let spread = std::thread::scope(|scope| {
            let helper = std::thread::Builder::new()
                .name("moongate-copy".into())
                .spawn_scoped(scope, move || {
                    let (s, d) = upper;
                    // SAFETY: [half, len) of both ranges, inside them (half < len), under the
                    // caller's contract; the lower half copied below does not overlap it.
                    unsafe { crate::memory::copy_nonoverlapping_large(s.0, d.0, len - half) };
                });
            if helper.is_err() {
                return false;
            }
            // SAFETY: [0, half) of both ranges, under the caller's contract.
            unsafe { crate::memory::copy_nonoverlapping_large(src, dst, half) };
            true
        });
        if spread {
            return;
        }
    }
    // SAFETY: forwarded caller contract.
    unsafe { crate::memory::copy_nonoverlapping_large(src, dst, len) };
}
