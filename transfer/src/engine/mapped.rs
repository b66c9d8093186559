//! Reads and writes with one copy from and to memory this engine maps: its own segment, or
//! a same-host peer's region in shared memory.
//!
//! A copying read (a store's `get`) otherwise lands the bytes in a registered buffer by a
//! transfer and then copies them out, and a copying write (`put`) stages them in one first:
//! two copies of every byte. Where the other side is mapped into this process anyway,
//! [`TransferEngine::append_mapped`] copies it straight into the caller's vector and
//! [`TransferEngine::write_mapped`] straight from the caller's slice, with the checks a
//! transfer makes (the peer's registration before and after the copy, the CPU locks of
//! the bytes touched in this process). They copy synchronously, on the calling thread and
//! (from 2 MiB in all) the process's copier thread (`copier`): a caller's borrowed
//! bytes are never touched after the call returns, so they need no registration. The batch
//! forms ([`TransferEngine::append_mapped_batch`], [`TransferEngine::write_mapped_batch`])
//! spread a whole batch's copies over both threads at once.

use std::ops::Range;

use super::TransferEngine;
use crate::copy::CopyTarget;
use crate::copy::copier::{MemCopy, Stripes, copy_all};
use crate::error::{RemoteRange, Result};
use crate::memory::{Access, CpuLock, SendPtr};
use crate::op::Segment;
use crate::shm::ShmMaps;
use crate::transport::Kind;

/// A range this engine maps, resolved and checked.
struct Mapped {
    target: CopyTarget,
    /// The range's first byte in this process.
    ptr: SendPtr,
    /// The range's offset in its region (for the region's CPU lock).
    off: usize,
    /// Whether the copy writes the range.
    access: Access,
}

impl Stripes for Mapped {
    /// The CPU lock of the region, where the region is this process's memory.
    fn stripes(&self) -> Option<(&CpuLock, usize, Access)> {
        let lock = match &self.target {
            CopyTarget::Peer(m) => m.owner_lock.as_deref(),
            CopyTarget::Local(e) => Some(&**e.region.cpu()),
            CopyTarget::Ipc(_) => None,
        };
        lock.map(|l| (l, self.off, self.access))
    }
}

impl TransferEngine {
    /// Appends the `len` bytes at `addr` of `seg` to `out` with one copy, where this engine
    /// maps them: its own segment, or (shared memory on) a same-host peer's shared region.
    /// `None` where only a transfer reaches them (over the network, device memory, a range
    /// the cached descriptor does not hold, shared memory unusable): the caller transfers
    /// them instead, which also reports what is wrong with a bad range. `Some(Err)` where
    /// the mapped region failed its checks (unregistered, its owner gone); nothing is
    /// appended then.
    pub fn append_mapped(
        &self,
        seg: &Segment,
        addr: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Option<Result<()>> {
        let at = out.len();
        let [r] = <[_; 1]>::try_from(self.append_mapped_batch(&[(seg, addr, len)], out))
            .unwrap_or_else(|_| unreachable!("one answer per item"));
        if let Some(Err(_)) = &r {
            out.truncate(at);
        }
        r.map(|r| r.map(drop))
    }

    /// [`TransferEngine::append_mapped`] for many ranges ((segment, address, length)) at
    /// once, appended to `out` in order; their copies are spread over two threads. Per
    /// range: `Some(Ok)` with where its bytes are in `out`; `None` where only a transfer
    /// reaches it (nothing appended for it); `Some(Err)` where its region failed its checks
    /// (its bytes, if copied, are a gap in `out` that no answer names).
    pub fn append_mapped_batch(
        &self,
        items: &[(&Segment, u64, usize)],
        out: &mut Vec<u8>,
    ) -> Vec<Option<Result<Range<usize>>>> {
        let mut answers = Vec::with_capacity(items.len());
        // (answer, offset in `out`) of each copy.
        let (mut copies, mut placed) = (Vec::new(), Vec::new());
        let mut at = out.len();
        for &(seg, addr, len) in items {
            let end = at.checked_add(len);
            match (self.mapped(seg, addr, len, false), end) {
                (Some(Ok(m)), Some(end)) => {
                    // The destination is set once `out` has room for all.
                    let src = m.ptr;
                    copies.push(MemCopy {
                        owner: m,
                        src,
                        dst: src,
                        len,
                    });
                    placed.push((answers.len(), at));
                    answers.push(Some(Ok(at..end)));
                    at = end;
                }
                (Some(Err(e)), _) => answers.push(Some(Err(e))),
                _ => answers.push(None),
            }
        }
        out.reserve(at - out.len());
        let base = out.as_mut_ptr();
        for (c, &(_, off)) in copies.iter_mut().zip(&placed) {
            c.dst = SendPtr(base.wrapping_add(off));
        }
        // SAFETY: each source is `len` bytes inside a region registered for them (see
        // `mapped`), mapped while its `Mapped` holds the target; each destination is a
        // distinct range of `out`'s spare capacity (reserved above up to `at`), private
        // memory of the caller's vector, so no destination overlaps another or a source. No
        // other thread of this process writes a source meanwhile: `copy_all` holds their
        // stripes for reading (another process's writes to shared memory are as for every
        // shared-memory transfer; a region retired meanwhile fails the check after the copy,
        // and nothing counts).
        unsafe { copy_all(&copies) };
        for (c, &(i, _)) in copies.iter().zip(&placed) {
            let (seg, addr, len) = items[i];
            if let Err(e) = self.settle_mapped(seg, addr, len, &c.owner) {
                answers[i] = Some(Err(e));
            }
        }
        // SAFETY: every byte up to `at` was written by the copies above (the ranges of the
        // answers, back to back from the old length).
        unsafe { out.set_len(at) };
        answers
    }

    /// Writes `src` at `addr` of `seg` with one copy, where this engine maps that range (as
    /// for [`TransferEngine::append_mapped`]); `None` where only a transfer reaches it.
    /// `Some(Err)` where the mapped region failed its checks; the bytes then count as not
    /// written.
    pub fn write_mapped(&self, seg: &Segment, addr: u64, src: &[u8]) -> Option<Result<()>> {
        let [r] = <[_; 1]>::try_from(self.write_mapped_batch(&[(seg, addr, src)]))
            .unwrap_or_else(|_| unreachable!("one answer per item"));
        r
    }

    /// [`TransferEngine::write_mapped`] for many (segment, address, bytes) at once, their
    /// copies spread over two threads; one answer per item, in order.
    pub fn write_mapped_batch(&self, items: &[(&Segment, u64, &[u8])]) -> Vec<Option<Result<()>>> {
        let mut answers = Vec::with_capacity(items.len());
        let (mut copies, mut index) = (Vec::new(), Vec::new());
        for &(seg, addr, src) in items {
            match self.mapped(seg, addr, src.len(), true) {
                Some(Ok(m)) => {
                    let (s, dst) = (SendPtr(src.as_ptr().cast_mut()), m.ptr);
                    copies.push(MemCopy {
                        owner: m,
                        src: s,
                        dst,
                        len: src.len(),
                    });
                    index.push(answers.len());
                    answers.push(Some(Ok(())));
                }
                other => answers.push(other.map(|r| r.map(drop))),
            }
        }
        // SAFETY: each destination is `len` bytes inside a region registered for them (see
        // `mapped`), mapped while its `Mapped` holds the target; each source is a caller's
        // slice of `len` bytes, borrowed for the call (one that views the very memory it
        // writes, which only unsafe code can arrange, is copied as a `memmove`). No other
        // thread of this process touches a destination meanwhile: `copy_all` holds their
        // stripes exclusively where the region is this process's memory (a region of
        // another process is written as every shared-memory transfer writes it). The caller
        // names distinct replicas' ranges, which the master never overlaps.
        unsafe { copy_all(&copies) };
        for (c, &i) in copies.iter().zip(&index) {
            let (seg, addr, src) = items[i];
            if let Err(e) = self.settle_mapped(seg, addr, src.len(), &c.owner) {
                answers[i] = Some(Err(e));
            }
        }
        answers
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
            let target = CopyTarget::local(&self.inner.regions, name, addr, len as u64).ok()?;
            let CopyTarget::Local(e) = &target else {
                return None;
            };
            if e.region.is_device() {
                return None;
            }
            let off = (addr - e.region.addr()) as usize;
            let ptr = SendPtr(e.region.as_ptr().wrapping_add(off));
            return Some(Ok(Mapped {
                target,
                ptr,
                off,
                access: access(write),
            }));
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
        let m = seg.cache::<ShmMaps>().get(name, region, shm).ok()?;
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
            access: access(write),
        }))
    }

    /// After a copy through `m`: a peer's region must still be the one registered (a
    /// region retired meanwhile does not count as read or written); counts the bytes.
    fn settle_mapped(&self, seg: &Segment, addr: u64, len: usize, m: &Mapped) -> Result<()> {
        let c = &self.inner.counters;
        if let CopyTarget::Peer(p) = &m.target {
            p.check(seg.name(), RemoteRange::new(addr, len as u64))?;
            c.add(Kind::Shm, len as u64);
        } else {
            c.add(Kind::Local, len as u64);
        }
        Ok(())
    }
}

/// How a copy that writes (or reads) a mapped range touches it.
fn access(write: bool) -> Access {
    if write { Access::Write } else { Access::Read }
}
