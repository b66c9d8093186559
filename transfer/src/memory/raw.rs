//! The operating-system side of memory: page sizes, raw pointers that cross threads, owned
//! mappings, fast large copies, populating fresh mappings, and the open-file-description
//! lock that tells a shared region's peers that its owner is alive.

use std::ptr::NonNull;

use crate::error::{Result, TransferError};

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

/// Default huge page size from `/proc/meminfo` (2 MiB when it cannot be read).
pub fn huge_page_size() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Hugepagesize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(2 << 20)
}

/// A raw destination pointer that may cross await points (and threads).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut u8);

// SAFETY: the pointer is only dereferenced by the kernel (recv) or a bounds-checked copy,
// under the validity contract of the function it is handed to.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The null pointer (discard).
    pub(crate) const NULL: SendPtr = SendPtr(std::ptr::null_mut());

    /// `ptr + n` (wrapping, never dereferenced here).
    pub(crate) fn add(self, n: usize) -> SendPtr {
        SendPtr(self.0.wrapping_add(n))
    }

    pub(crate) fn is_null(self) -> bool {
        self.0.is_null()
    }
}

/// Vectors of at least this capacity get huge pages from [`bulk_vec`].
pub const BULK_VEC_MIN: usize = 4 << 20;

/// An empty vector with room for `capacity` bytes, for filling at once with many bytes
/// (a batch of values). From [`BULK_VEC_MIN`] on, the allocation's whole huge pages are
/// advised `MADV_HUGEPAGE`: filling fresh memory then takes one fault per huge page instead
/// of one per page (measured on a 2-vCPU VM: 64 MiB filled at 3.5-4.6 GB/s instead of
/// 1.0 GB/s). Costs no memory beyond the capacity: only whole huge pages inside it are
/// advised. Best effort: where transparent huge pages are off it is a plain vector.
pub fn bulk_vec(capacity: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(capacity);
    if capacity >= BULK_VEC_MIN {
        let huge = huge_page_size();
        let start = (v.as_mut_ptr() as usize).next_multiple_of(huge);
        let end = (v.as_mut_ptr() as usize + capacity) / huge * huge;
        if end > start {
            // SAFETY: [start, end) lies inside the vector's own allocation of `capacity`
            // bytes, which nothing else uses; the advice changes only how the kernel backs
            // the range, never its content or its mapping.
            let rc = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE)
            };
            if rc != 0 {
                tracing::trace!(error = %std::io::Error::last_os_error(), "no huge pages for a bulk vector");
            }
        }
    }
    v
}

/// A [`bulk_vec`] whose memory is already resident: every page of its capacity written once
/// (the vector stays empty). Filling it later pays no page fault; faulting it in here pays
/// the kernel's zeroing, and on a VM whose host backs guest memory lazily the host's own
/// first touch too (measured on this project's 2-vCPU VMs, where freed memory is handed
/// back to the host: 8-13 s a GiB, against 0.2 s for memory touched before).
pub fn resident_bulk_vec(capacity: usize) -> Vec<u8> {
    let mut v = bulk_vec(capacity);
    let page = page_size();
    for byte in v.spare_capacity_mut().iter_mut().step_by(page) {
        byte.write(0);
    }
    v
}

/// Pages resident in memory (`mincore`) among those overlapping `[ptr, ptr + len)`, which
/// must all be mapped (tests).
#[cfg(test)]
pub(crate) fn resident_pages(ptr: *const u8, len: usize) -> usize {
    let page = page_size();
    let start = ptr as usize / page * page;
    let end = (ptr as usize + len).next_multiple_of(page);
    let mut vec = vec![0u8; (end - start) / page];
    // SAFETY: the caller vouches that every page of [start, end) is mapped; `mincore` only
    // reads the page tables and writes one byte per page into `vec`, which has that many.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, end - start, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|b| **b & 1 == 1).count()
}

/// An owned `mmap` (unmapped on drop).
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is an address range plus its length; it is unmapped exactly once, in
// Drop, and all access to the bytes goes through raw pointers (see the module doc).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the address and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `mmap(NULL, len, RW, flags, fd, 0)`.
    pub(crate) fn map(len: usize, flags: libc::c_int, fd: libc::c_int, what: &str) -> Result<Self> {
        // SAFETY: a fresh mapping at a kernel-chosen address aliases no Rust object; the
        // arguments are plain integers and the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(TransferError::memory(
                what,
                &std::io::Error::last_os_error(),
            ));
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| TransferError::Memory {
            reason: format!("{what}: mmap returned null"),
        })?;
        Ok(Self { base, len })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len came from a successful mmap and are unmapped only here; every user
        // of the bytes holds (through an Arc) the owner of this Mapping.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Copies of at least this many bytes use non-temporal stores.
pub(crate) const STREAM_COPY_MIN: usize = 1 << 20;

/// Copies `len` bytes from `src` to `dst`, which must not overlap; the bytes are a piece of
/// one copy of `whole` bytes (cut up to be spread over threads; `whole == len` for a copy
/// in one piece). Large copies on x86-64 write with non-temporal (streaming) stores: the
/// destination is not read first and not left in this core's cache (the bytes are for
/// another process, or too many to stay cached anyway), which is what makes a big copy
/// into cold memory fast. Every piece of a large copy is streamed, even one short of
/// [`STREAM_COPY_MIN`] alone: written through the cache, a batch of 16 MiB values copied in
/// 512 KiB pieces ran at 12 GB/s where streamed it ran at 18.
///
/// # Safety
/// `src` must be valid for `len` bytes of reads, `dst` for `len` bytes of writes, and the
/// ranges must not overlap.
pub(crate) unsafe fn copy_nonoverlapping_part(
    src: *const u8,
    dst: *mut u8,
    len: usize,
    whole: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if whole.max(len) >= STREAM_COPY_MIN {
        // SAFETY: forwarded caller contract.
        unsafe { stream_copy(src, dst, len) };
        return;
    }
    let _ = whole;
    // SAFETY: forwarded caller contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Streams `len` bytes from `src` to `dst` (non-overlapping): with AVX2 where the CPU has it,
/// else with SSE2 (the x86-64 baseline).
///
/// Why AVX2 with a prefetch: on this project's VMs (AMD EPYC, 2 vCPUs), copying 64 MiB in
/// 1 MiB pieces measured, one thread, 19.7-21.1 GB/s with 16-byte streaming stores, 21.9-23.5
/// with 32-byte ones and 23.3-25.2 with 32-byte ones and a non-temporal prefetch 1 KiB ahead;
/// two threads, 24.1-25.3 against 25.3-26.4 (64-byte AVX-512 stores gained nothing more).
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(src: *const u8, dst: *mut u8, len: usize) {
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: forwarded caller contract; the CPU has AVX2 (checked just above).
        unsafe { stream_copy_avx2(src, dst, len) };
    } else {
        // SAFETY: forwarded caller contract.
        unsafe { stream_copy_sse2(src, dst, len) };
    }
}

#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy_sse2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // SAFETY: forwarded caller contract.
    let head = unsafe { stream_head(src, dst, len, 16) };
    let mut off = head;
    while off + 64 <= len {
        for k in 0..4 {
            let at = off + 16 * k;
            let s = src.wrapping_add(at) as *const __m128i;
            let d = dst.wrapping_add(at) as *mut __m128i;
            // SAFETY: at + 16 <= len, so the unaligned 16-byte load stays inside src.
            let v = unsafe { _mm_loadu_si128(s) };
            // SAFETY: d is 16-byte aligned (dst + head is, and `at - head` is a multiple of
            // 16) and its 16 bytes are inside dst; SSE2 is part of the x86-64 baseline.
            unsafe { _mm_stream_si128(d, v) };
        }
        off += 64;
    }
    // SAFETY: off <= len; caller contract.
    unsafe { stream_tail(src, dst, off, len) };
}

/// [`stream_copy_sse2`] with 32-byte stores and the source prefetched 1 KiB ahead.
///
/// # Safety
/// As [`copy_nonoverlapping_part`], and the CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_copy_avx2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{
        __m256i, _MM_HINT_NTA, _mm_prefetch, _mm256_loadu_si256, _mm256_stream_si256,
    };
    /// How far ahead of the loads the source is prefetched.
    const AHEAD: usize = 1024;
    // SAFETY: forwarded caller contract.
    let head = unsafe { stream_head(src, dst, len, 32) };
    let mut off = head;
    while off + 128 <= len {
        // A prefetch is a hint that never faults, so one past the end of `src` is harmless;
        // the address is formed with `wrapping_add` and never dereferenced.
        _mm_prefetch::<_MM_HINT_NTA>(src.wrapping_add(off + AHEAD) as *const i8);
        _mm_prefetch::<_MM_HINT_NTA>(src.wrapping_add(off + AHEAD + 64) as *const i8);
        for k in 0..4 {
            let at = off + 32 * k;
            let s = src.wrapping_add(at) as *const __m256i;
            let d = dst.wrapping_add(at) as *mut __m256i;
            // SAFETY: at + 32 <= len, so the unaligned 32-byte load stays inside src; the
            // caller guarantees AVX2.
            let v = unsafe { _mm256_loadu_si256(s) };
            // SAFETY: d is 32-byte aligned (dst + head is, and `at - head` is a multiple of
            // 32) and its 32 bytes are inside dst.
            unsafe { _mm256_stream_si256(d, v) };
        }
        off += 128;
    }
    // SAFETY: off <= len; caller contract.
    unsafe { stream_tail(src, dst, off, len) };
}

/// Starts a streaming copy: copies the bytes before `dst`'s first `align`-byte boundary
/// (at most `len`) the ordinary way, and returns how many, so that the streaming stores
/// from there on are aligned.
///
/// # Safety
/// As [`copy_nonoverlapping_part`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream_head(src: *const u8, dst: *mut u8, len: usize, align: usize) -> usize {
    let head = dst.align_offset(align).min(len);
    // SAFETY: head <= len; caller contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    head
}

/// Ends a streaming copy: copies the bytes from `off` to `len` the ordinary way, then fences.
/// Streaming stores are weakly ordered: the fence orders later stores (and the caller's
/// release of the completion) after them.
///
/// # Safety
/// As [`copy_nonoverlapping_part`], and `off <= len`.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_tail(src: *const u8, dst: *mut u8, off: usize, len: usize) {
    // SAFETY: off <= len, so the tail lies inside both ranges.
    unsafe {
        std::ptr::copy_nonoverlapping(src.wrapping_add(off), dst.wrapping_add(off), len - off)
    };
    // SAFETY: sfence has no preconditions (SSE is part of the x86-64 baseline).
    unsafe { std::arch::x86_64::_mm_sfence() };
}

/// Faults every page of a fresh private mapping in (`MADV_POPULATE_WRITE`, or by touching
/// one byte per page where the kernel lacks it).
pub(crate) fn populate(map: &Mapping, len: usize) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: advising on our own mapping of `len` bytes.
    if unsafe { libc::madvise(map.ptr().cast(), len, MADV_POPULATE_WRITE) } == 0 {
        return;
    }
    let page = page_size();
    for off in (0..len).step_by(page) {
        // SAFETY: off < len, inside our fresh private mapping that nothing else uses yet.
        unsafe { map.ptr().wrapping_add(off).write_volatile(0) };
    }
}

/// Faults `len` bytes at `ptr` in as a write would (`MADV_POPULATE_WRITE`) without changing
/// a byte, so it may run while other threads, peers or devices use the memory. `Ok(false)`
/// when the kernel lacks the advice (before Linux 5.14): nothing was done.
///
/// # Safety
/// `[ptr, ptr + len)` must lie inside a live read-write mapping for the whole call.
pub(crate) unsafe fn populate_live(ptr: *mut u8, len: usize) -> std::io::Result<bool> {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    let page = page_size();
    let start = ptr as usize;
    let aligned = start - start % page;
    // SAFETY: the caller guarantees the range is mapped read-write for the call; the
    // advice only populates page tables and backing pages, it never writes data.
    let rc = unsafe {
        libc::madvise(
            aligned as *mut libc::c_void,
            len + (start - aligned),
            MADV_POPULATE_WRITE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINVAL) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Takes an OFD write lock on byte 0 of `fd` (released when every descriptor of this open
/// file description is closed, including by process death).
pub(crate) fn lock_ofd(fd: libc::c_int) -> std::io::Result<()> {
    let mut fl = ofd_flock(libc::F_WRLCK as libc::c_short);
    // SAFETY: fl is a valid flock for the duration of the call.
    let rc = unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether some other open file description holds the write lock taken by [`lock_ofd`]:
/// the owner of a shared region is alive.
pub(crate) fn ofd_lock_held(fd: libc::c_int) -> std::io::Result<bool> {
    let mut fl = ofd_flock(libc::F_WRLCK as libc::c_short);
    // SAFETY: fl is a valid flock for the duration of the call.
    let rc = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn ofd_flock(kind: libc::c_short) -> libc::flock {
    // SAFETY: flock is plain old data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    fl.l_pid = 0;
    fl
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VmFlags line of the mapping of `/proc/self/smaps` that holds `addr`.
    fn vm_flags_at(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((a, b)) = range.split_once('-')
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                inside = (a..b).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.trim().to_owned();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn bulk_vectors_ask_for_huge_pages_inside_their_own_allocation() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        let mut v = bulk_vec(3 * BULK_VEC_MIN);
        assert!(v.is_empty() && v.capacity() >= 3 * BULK_VEC_MIN);
        let inner = (v.as_ptr() as usize).next_multiple_of(huge_page_size());
        if thp.contains('[') && !thp.contains("[never]") {
            assert!(
                vm_flags_at(inner).split(' ').any(|f| f == "hg"),
                "{}",
                vm_flags_at(inner)
            );
        }
        v.extend((0..3 * BULK_VEC_MIN).map(|i| i as u8));
        assert!(v.iter().enumerate().all(|(i, b)| *b == i as u8));
        // A small one is a plain vector.
        let small = bulk_vec(BULK_VEC_MIN / 2);
        assert!(small.capacity() >= BULK_VEC_MIN / 2);
    }

    /// Both streaming copies, whichever this CPU would pick, at every alignment of source
    /// and destination and lengths around their 64- and 128-byte steps.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn both_streaming_copies_are_exact() {
        let src: Vec<u8> = (0..9000).map(|i| (i * 7 % 253) as u8).collect();
        let avx2 = std::arch::is_x86_feature_detected!("avx2");
        for len in [
            0usize,
            1,
            31,
            63,
            64,
            65,
            127,
            128,
            129,
            255,
            1000,
            1024 + 96,
            8191,
        ] {
            for so in 0..33 {
                for dof in [0usize, 1, 15, 16, 17, 31, 32] {
                    for (name, avx) in [("sse2", false), ("avx2", true)] {
                        if avx && !avx2 {
                            continue;
                        }
                        let mut dst = vec![0u8; len + 64];
                        let (s, d) = (
                            src.as_ptr().wrapping_add(so),
                            dst.as_mut_ptr().wrapping_add(dof),
                        );
                        if avx {
                            // SAFETY: src has so + len <= 9000 bytes readable, dst has
                            // dof + len <= len + 64 writable; distinct vectors; the CPU has
                            // AVX2 (checked above).
                            unsafe { stream_copy_avx2(s, d, len) };
                        } else {
                            // SAFETY: as above; SSE2 is baseline.
                            unsafe { stream_copy_sse2(s, d, len) };
                        }
                        assert_eq!(
                            &dst[dof..dof + len],
                            &src[so..so + len],
                            "{name} len {len} src+{so} dst+{dof}"
                        );
                        assert!(
                            dst[..dof].iter().all(|&b| b == 0)
                                && dst[dof + len..].iter().all(|&b| b == 0),
                            "{name} wrote outside len {len} src+{so} dst+{dof}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn large_copies_are_exact_at_every_alignment() {
        let len = STREAM_COPY_MIN + 777;
        let src: Vec<u8> = (0..len + 64).map(|i| (i * 31 % 251) as u8).collect();
        // Whole copies, then a short piece of a large copy (streamed too).
        for (so, dof, len, whole) in [
            (0usize, 0usize, len, len),
            (1, 0, len, len),
            (0, 3, len, len),
            (5, 11, len, len),
            (15, 1, len, len),
            (3, 7, 4099, len),
            (9, 0, 63, len),
        ] {
            let mut dst = vec![0u8; len + 64];
            let (s, d) = (
                src.as_ptr().wrapping_add(so),
                dst.as_mut_ptr().wrapping_add(dof),
            );
            // SAFETY: both vectors have len + 64 bytes; offsets are below 16; distinct vectors.
            unsafe { copy_nonoverlapping_part(s, d, len, whole) };
            assert_eq!(
                &dst[dof..dof + len],
                &src[so..so + len],
                "src+{so} dst+{dof}"
            );
            assert!(dst[..dof].iter().all(|&b| b == 0) && dst[dof + len..].iter().all(|&b| b == 0));
        }
    }
}
