//! File I/O straight into and out of a region: positional reads and writes whose bytes the
//! kernel moves between the file and the registered memory (no bounce buffer), and a
//! scoped read-only borrow for checking bytes in place (a checksum).
//!
//! As with `recv` into a region, the kernel's copy is outside the Rust memory model: no
//! Rust slice of the region exists while it runs, and what it races with (a peer's write
//! into the same bytes) is bytes of unspecified value, not undefined behaviour. The borrow
//! of [`MemoryRegion::with_bytes`] holds the region's CPU lock shared, so no copy of this
//! process writes those bytes meanwhile.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use super::{Access, MemoryRegion};
use crate::error::{Result, TransferError};

/// Runs `op(done)` (a `pread` or `pwrite` of the bytes after the first `done`) until `len`
/// bytes moved; a call that moves nothing is `at_end`, an interrupted one is retried.
fn whole(len: usize, at_end: io::ErrorKind, mut op: impl FnMut(usize) -> isize) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        match op(done) {
            0 => return Err(at_end.into()),
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            n => done += n as usize,
        }
    }
    Ok(())
}

impl MemoryRegion {
    fn host_range(&self, offset: usize, len: usize) -> Result<()> {
        self.check(offset, len)?;
        if self.is_device() {
            return Err(TransferError::invalid(
                "file I/O needs host memory; this region is device memory",
            ));
        }
        Ok(())
    }

    /// Reads `len` bytes of `file` from `file_offset` into the region at `offset`, all of
    /// them (a short file is `UnexpectedEof`). Host memory only.
    pub fn read_file_at(
        &self,
        offset: usize,
        len: usize,
        file: &File,
        file_offset: u64,
    ) -> Result<io::Result<()>> {
        self.host_range(offset, len)?;
        Ok(whole(len, io::ErrorKind::UnexpectedEof, |done| {
            // SAFETY: the destination is `len - done` bytes inside the region (bounds
            // checked above), valid for writes while `self` lives; the kernel writes them
            // as it would for `recv`, with no Rust reference to those bytes alive (see the
            // module doc); the fd is open for the call's length (borrowed `file`).
            unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    self.as_ptr().wrapping_add(offset + done).cast(),
                    len - done,
                    (file_offset + done as u64) as libc::off_t,
                )
            }
        }))
    }

    /// Writes `len` bytes of the region at `offset` to `file` at `file_offset`, all of
    /// them. Host memory only.
    pub fn write_file_at(
        &self,
        offset: usize,
        len: usize,
        file: &File,
        file_offset: u64,
    ) -> Result<io::Result<()>> {
        self.host_range(offset, len)?;
        Ok(whole(len, io::ErrorKind::WriteZero, |done| {
            // SAFETY: the source is `len - done` bytes inside the region (bounds checked
            // above), valid for reads while `self` lives; the kernel reads them as it would
            // for `send` (see the module doc); the fd is open for the call (borrowed).
            unsafe {
                libc::pwrite(
                    file.as_raw_fd(),
                    self.as_ptr()
                        .wrapping_add(offset + done)
                        .cast_const()
                        .cast(),
                    len - done,
                    (file_offset + done as u64) as libc::off_t,
                )
            }
        }))
    }

    /// Runs `f` on the region's bytes `[offset, offset + len)`, borrowed read-only while no
    /// copy of this process writes them (a checksum in place). Host memory only.
    pub fn with_bytes<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        self.host_range(offset, len)?;
        let _held = self.cpu.lock(offset, len, Access::Read);
        // SAFETY: bounds checked above; valid for reads while `self` lives; the shared CPU
        // lock excludes this process's writing copies for the borrow's life, which ends
        // with `f` (the slice cannot escape it); other writers are outside the Rust model
        // (module doc).
        let bytes = unsafe { std::slice::from_raw_parts(self.as_ptr().wrapping_add(offset), len) };
        Ok(f(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn bytes_go_between_a_file_and_a_region_without_a_bounce() {
        let r = MemoryRegion::alloc(1 << 16).unwrap();
        r.write_at(100, &[7u8; 5000]).unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[0u8; 10]).unwrap();
        r.write_file_at(100, 5000, &f, 10).unwrap().unwrap();
        assert_eq!(f.metadata().unwrap().len(), 5010);
        r.read_file_at(20_000, 5000, &f, 10).unwrap().unwrap();
        let sum = r.with_bytes(20_000, 5000, |b| b.iter().map(|&x| x as u64).sum::<u64>());
        assert_eq!(sum.unwrap(), 7 * 5000);
        // Past the file's end: an error, not a short read.
        let e = r.read_file_at(0, 100, &f, 5000).unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // Outside the region: refused before any I/O.
        assert!(r.read_file_at(1 << 16, 1, &f, 0).is_err());
        assert!(r.write_file_at(usize::MAX, 2, &f, 0).is_err());
        assert!(r.with_bytes(65_000, 1000, |_| ()).is_err());
    }
}
