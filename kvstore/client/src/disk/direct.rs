//! Direct reads of records (`O_DIRECT`): the page cache is skipped, so a cold record comes
//! off the device in requests as large as the read (the buffered path reads ahead in small
//! requests, one at a time: 0.49 GB/s against 2.1 GB/s for 1 MiB direct reads at queue
//! depth 1 on this project's VMs, `fio`), and records do not take the page cache from the
//! segment a second time.
//!
//! Direct I/O moves whole aligned blocks between aligned memory and aligned file offsets.
//! A record's value starts at an [`ALIGN`]ed offset and its file is padded to a multiple of
//! it, so every read of a value is of whole blocks. The bytes land in the destination
//! itself when it is aligned; otherwise (and for the last partial block, which must not
//! spill past the destination) they come through a bounce buffer: page-aligned memory of
//! the transfer engine's, pooled.
//!
//! A file system without `O_DIRECT` (tmpfs before Linux 6.6, some network file systems)
//! is read through the page cache, the same way.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use parking_lot::Mutex;
use transfer::memory::MemoryRegion;

/// Alignment of a value's first byte and of a record's length in its file: direct I/O's
/// unit on any device (4 KiB covers 512-byte and 4 KiB sectors).
pub(super) const ALIGN: u64 = 4096;
/// Bytes of one bounce buffer (one request of a read through it): a record of a value up
/// to 2 MiB is read whole in one request.
pub(super) const BOUNCE: usize = (2 << 20) + (64 << 10);
/// Bounce buffers kept for reuse (one per disk task in flight).
const POOLED: usize = super::QUEUE_DEPTH;

/// `n` rounded up to a multiple of [`ALIGN`].
pub(super) fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// Where a value's bytes go.
pub(super) enum Dest<'a> {
    /// Appended to a vector.
    Vec(&'a mut Vec<u8>),
    /// Into a region at an offset, with room for the whole value.
    Region(&'a MemoryRegion, usize),
}

/// Opens record files for reading, direct when the file system allows, and lends bounce
/// buffers.
#[derive(Debug)]
pub(super) struct Reader {
    direct: bool,
    pool: Mutex<Vec<MemoryRegion>>,
}

/// A bounce buffer lent by a [`Reader`], given back when dropped.
pub(super) struct Bounce<'a> {
    region: Option<MemoryRegion>,
    reader: &'a Reader,
}

impl std::ops::Deref for Bounce<'_> {
    type Target = MemoryRegion;
    fn deref(&self) -> &MemoryRegion {
        self.region.as_ref().expect("held until dropped")
    }
}

impl Drop for Bounce<'_> {
    fn drop(&mut self) {
        let mut pool = self.reader.pool.lock();
        if pool.len() < POOLED
            && let Some(r) = self.region.take()
        {
            pool.push(r);
        }
    }
}

fn outside(e: transfer::TransferError) -> io::Error {
    io::Error::other(e)
}

impl Reader {
    /// A reader of the records in `dir`: direct if a file there opens with `O_DIRECT`
    /// (`probe`, a scratch file name in it, is created and removed).
    pub(super) fn new(probe: &Path) -> io::Result<Self> {
        let direct = match OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_DIRECT)
            .open(probe)
        {
            Ok(_) => true,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => false,
            Err(e) => return Err(e),
        };
        let _ = std::fs::remove_file(probe);
        if !direct {
            tracing::info!(dir = %probe.parent().unwrap_or(probe).display(), "the disk tier's file system has no direct I/O: records are read through the page cache");
        }
        Ok(Self {
            direct,
            pool: Mutex::new(Vec::new()),
        })
    }

    /// Whether records are read with `O_DIRECT`.
    pub(super) fn is_direct(&self) -> bool {
        self.direct
    }

    /// Opens a record for reading.
    pub(super) fn open(&self, path: &Path) -> io::Result<File> {
        let mut o = OpenOptions::new();
        o.read(true);
        if self.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    }

    /// A bounce buffer of [`BOUNCE`] bytes.
    pub(super) fn bounce(&self) -> io::Result<Bounce<'_>> {
        let region = match self.pool.lock().pop() {
            Some(r) => r,
            None => MemoryRegion::alloc(BOUNCE).map_err(outside)?,
        };
        Ok(Bounce {
            region: Some(region),
            reader: self,
        })
    }

    /// Hands the `len` value bytes at `at` in `bounce` (read there whole with the header)
    /// to `dest`; answers their CRC-32.
    pub(super) fn deliver(
        &self,
        bounce: &MemoryRegion,
        at: usize,
        len: usize,
        dest: Dest<'_>,
    ) -> io::Result<u32> {
        bounce
            .with_bytes(at, len, |b| {
                let crc = crc32fast::hash(b);
                match dest {
                    Dest::Vec(v) => v.extend_from_slice(b),
                    Dest::Region(m, off) => m.write_at(off, b)?,
                }
                Ok(crc)
            })
            .map_err(outside)?
            .map_err(outside)
    }

    /// Reads `len` value bytes of `f` from `start` (aligned; the file padded past them to
    /// a whole block) into `dest`, through `bounce` where the destination is not aligned;
    /// answers the CRC-32 of the bytes delivered. A file cut short is `UnexpectedEof`.
    pub(super) fn read_value(
        &self,
        f: &File,
        start: u64,
        len: u64,
        bounce: &MemoryRegion,
        mut dest: Dest<'_>,
    ) -> io::Result<u32> {
        let mut crc = crc32fast::Hasher::new();
        let mut done = 0u64;
        if let Dest::Region(m, off) = &dest
            && (m.addr() + *off as u64).is_multiple_of(ALIGN)
        {
            // The whole blocks straight into the destination.
            let body = (len / ALIGN * ALIGN) as usize;
            if body > 0 {
                m.read_file_at(*off, body, f, start).map_err(outside)??;
                m.with_bytes(*off, body, |b| crc.update(b))
                    .map_err(outside)?;
                done = body as u64;
            }
        }
        while done < len {
            let take = (len - done).min(BOUNCE as u64);
            let n = align_up(take) as usize;
            bounce
                .read_file_at(0, n, f, start + done)
                .map_err(outside)??;
            bounce
                .with_bytes(0, take as usize, |b| {
                    crc.update(b);
                    match &mut dest {
                        Dest::Vec(v) => {
                            v.extend_from_slice(b);
                            Ok(())
                        }
                        Dest::Region(m, off) => m.write_at(*off + done as usize, b),
                    }
                })
                .map_err(outside)?
                .map_err(outside)?;
            done += take;
        }
        Ok(crc.finalize())
    }
}
