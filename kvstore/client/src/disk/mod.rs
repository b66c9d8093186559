//! The disk below a segment (`--disk-path`, `--disk-capacity`): one file per value, named
//! by the SHA-256 of its key, each a checksummed record.
//!
//! ```text
//! record = header (32 bytes) | key | zeros to 4 KiB | value | zeros to 4 KiB
//! header = "MGKVREC2" | key length u32 | 0u32 | value length u64 | CRC-32 of the value u32
//!          | CRC-32 of the first 28 header bytes and the key u32          (little endian)
//! ```
//!
//! The value starts, and the file ends, on a 4 KiB boundary, so that reads are direct
//! (`O_DIRECT`, see `direct`).
//!
//! - **Durable before visible**: a record is written to `<name>.tmp`, its data synced,
//!   renamed to `<name>.rec`; the caller syncs the directory ([`DiskStore::sync`]) before
//!   it reports the record to the master. A crash leaves a `.tmp` (removed at the next
//!   open) or a whole record.
//! - **Never served torn or corrupt**: the header checksum is checked when the directory
//!   is scanned at open and at every read, the value's at every read; a record that fails
//!   is removed and counted, and the read is a miss.
//! - **Bounded**: at most `capacity` bytes of records; writing past it drops the least
//!   recently used records first (their keys are returned, for the master). A full file
//!   system (`ENOSPC`) lowers the bound to what is written, with a warning.
//! - **Safe directory**: created `0700`; an existing one must belong to this user and not
//!   be writable by others, and every file in it must belong to this user.
//!
//! I/O is positional (`pread`/`pwrite`), on blocking threads the caller provides: between
//! the file and the segment's registered memory directly (the kernel copies; the checksum
//! is taken in place), or from and into caller slices. Reads skip the page cache
//! (`direct`); writes go through it and are synced.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use openapi::master::DiskRecord;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use transfer::RegisteredBuffer;

mod direct;

use direct::{ALIGN, Dest, Reader, align_up};

/// Disk reads or writes in flight at once, per disk (enough requests to keep an NVMe
/// queue busy).
pub const QUEUE_DEPTH: usize = 16;

const MAGIC: &[u8; 8] = b"MGKVREC2";
const HEADER: usize = 32;
const RECORD: &str = "rec";
const PARTIAL: &str = "tmp";

/// Where a record's value starts: past the header and a key of `key_len` bytes, aligned.
fn data_offset(key_len: usize) -> u64 {
    align_up((HEADER + key_len) as u64)
}

/// Bytes of a record's file: header, key, value, each end aligned.
fn record_bytes(key_len: usize, len: u64) -> u64 {
    data_offset(key_len) + align_up(len)
}

/// What went wrong with a disk-tier operation.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The store holds no record of the key.
    #[error("no disk record of {0:?}")]
    Missing(String),
    /// The record failed a check (torn, corrupt, another key's); it was removed.
    #[error("disk record of {key:?} is corrupt ({why}); removed")]
    Corrupt {
        /// The key.
        key: String,
        /// Which check failed.
        why: String,
    },
    /// The value is larger than the whole disk tier.
    #[error("a {0}-byte value does not fit the disk tier's capacity")]
    TooLarge(u64),
    /// The file system said no.
    #[error("disk tier I/O: {0}")]
    Io(#[from] io::Error),
}

#[derive(Debug)]
struct Entry {
    length: u64,
    /// Bytes the record's file takes (header, key, value, padding).
    bytes: u64,
    /// Last use, for least-recently-used dropping.
    stamp: u64,
}

#[derive(Debug, Default)]
struct Index {
    entries: HashMap<String, Entry>,
    used: u64,
    clock: u64,
}

/// Totals of one disk store since it opened.
#[derive(Debug, Default)]
pub struct DiskCounters {
    /// Records written.
    pub writes: AtomicU64,
    /// Records read back whole.
    pub reads: AtomicU64,
    /// Records that failed a check (at a scan or a read) and were removed.
    pub corrupt: AtomicU64,
    /// Records dropped to stay within the capacity.
    pub evicted: AtomicU64,
    /// Records found at open (a warm restart).
    pub adopted: AtomicU64,
    /// Writes that failed (a full or failing disk).
    pub write_failures: AtomicU64,
}

/// One directory of records; see the module doc. Share it by `Arc`; calls block.
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    capacity: AtomicU64,
    index: Mutex<Index>,
    counters: DiskCounters,
    reader: Reader,
    /// Keys whose records a read found torn or corrupt (and removed), not yet told to the
    /// master ([`DiskStore::take_lost`]). At most one per record the disk held.
    lost: Mutex<Vec<String>>,
}

fn header(key: &[u8], len: u64, crc: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&(key.len() as u32).to_le_bytes());
    h[16..24].copy_from_slice(&len.to_le_bytes());
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    let mut c = crc32fast::Hasher::new();
    c.update(&h[..28]);
    c.update(key);
    h[28..32].copy_from_slice(&c.finalize().to_le_bytes());
    h
}

/// A parsed header: (key length, value length, value CRC), once its own CRC held.
fn parse(h: &[u8; HEADER], key: &[u8]) -> Result<(u64, u32), String> {
    if &h[..8] != MAGIC {
        return Err("not a record".into());
    }
    let mut c = crc32fast::Hasher::new();
    c.update(&h[..28]);
    c.update(key);
    if c.finalize().to_le_bytes() != h[28..32] {
        return Err("header checksum".into());
    }
    let len = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(h[24..28].try_into().expect("4 bytes"));
    Ok((len, crc))
}

fn key_len(h: &[u8; HEADER]) -> usize {
    u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")) as usize
}

/// Longest key a record holds (the master's own bound is lower).
const MAX_KEY: usize = 64 << 10;

impl DiskStore {
    /// Opens (creating it `0700` if absent) the directory `dir` holding at most
    /// `capacity` bytes of records, and scans it: leftover partial writes and records that
    /// fail their header check are removed; the rest are answered, to be reported to the
    /// master.
    pub fn open(dir: &Path, capacity: u64) -> Result<(Self, Vec<DiskRecord>), DiskError> {
        if !dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        // This process's effective user: the owner of its /proc entry.
        let me = fs::metadata("/proc/self")?.uid();
        let meta = fs::metadata(dir)?;
        if !meta.is_dir() {
            return Err(io::Error::other(format!("{} is not a directory", dir.display())).into());
        }
        if meta.uid() != me || meta.permissions().mode() & 0o022 != 0 {
            return Err(io::Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "{} must belong to this user (uid {me}) and not be writable by others (it is uid {}, mode {:o})",
                    dir.display(),
                    meta.uid(),
                    meta.permissions().mode() & 0o7777
                ),
            )
            .into());
        }
        let store = Self {
            dir: dir.to_owned(),
            capacity: AtomicU64::new(capacity),
            index: Mutex::new(Index::default()),
            counters: DiskCounters::default(),
            reader: Reader::new(&dir.join(format!("direct-probe.{PARTIAL}")))?,
            lost: Mutex::new(Vec::new()),
        };
        let mut found = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            let meta = entry.metadata()?;
            if meta.uid() != me {
                return Err(io::Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "{} belongs to another user (uid {})",
                        path.display(),
                        meta.uid()
                    ),
                )
                .into());
            }
            match path.extension().and_then(|e| e.to_str()) {
                Some(PARTIAL) => fs::remove_file(&path)?,
                Some(RECORD) if meta.is_file() => match store.scan_one(&path, meta.len()) {
                    Some((key, length)) => found.push((meta.mtime(), key, length, meta.len())),
                    None => {
                        store.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                        fs::remove_file(&path)?;
                    }
                },
                _ => {}
            }
        }
        // Oldest first, so the least recently written go first when space runs out.
        found.sort_by_key(|f| f.0);
        let mut records = Vec::with_capacity(found.len());
        {
            let mut index = store.index.lock();
            for (_, key, length, bytes) in found {
                index.clock += 1;
                let stamp = index.clock;
                index.used += bytes;
                index.entries.insert(
                    key.clone(),
                    Entry {
                        length,
                        bytes,
                        stamp,
                    },
                );
                records.push(DiskRecord { key, length });
            }
        }
        store
            .counters
            .adopted
            .store(records.len() as u64, Ordering::Relaxed);
        Ok((store, records))
    }

    /// A record's key and value length, if its header holds and its size is whole.
    fn scan_one(&self, path: &Path, size: u64) -> Option<(String, u64)> {
        let f = self.reader.open(path).ok()?;
        let mut bounce = self.reader.bounce();
        if size < ALIGN {
            return None;
        }
        bounce.fill(&f, ALIGN as usize, 0).ok()?;
        let klen = key_len(bounce.bytes(HEADER).try_into().expect("header"));
        if klen > MAX_KEY || data_offset(klen) > size {
            return None;
        }
        if data_offset(klen) > ALIGN {
            bounce.fill(&f, data_offset(klen) as usize, 0).ok()?;
        }
        let b = bounce.bytes(HEADER + klen);
        let h: &[u8; HEADER] = b[..HEADER].try_into().expect("header");
        let (length, _) = parse(h, &b[HEADER..]).ok()?;
        let key = String::from_utf8(b[HEADER..].to_vec()).ok()?;
        (size == record_bytes(klen, length) && self.path(&key) == path).then_some((key, length))
    }

    fn path(&self, key: &str) -> PathBuf {
        let name = hex::encode(Sha256::digest(key.as_bytes()));
        self.dir.join(format!("{name}.{RECORD}"))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Totals since open.
    pub fn counters(&self) -> &DiskCounters {
        &self.counters
    }

    /// Bytes of records held and their number.
    pub fn usage(&self) -> (u64, usize) {
        let i = self.index.lock();
        (i.used, i.entries.len())
    }

    /// The bound on record bytes (lowered after the file system ran out of space).
    pub fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// The value length of `key`'s record, if one is held.
    pub fn length_of(&self, key: &str) -> Option<u64> {
        self.index.lock().entries.get(key).map(|e| e.length)
    }

    /// Whether a record of `key` is held.
    pub fn contains(&self, key: &str) -> bool {
        self.index.lock().entries.contains_key(key)
    }

    /// Every record held.
    pub fn records(&self) -> Vec<DiskRecord> {
        self.index
            .lock()
            .entries
            .iter()
            .map(|(k, e)| DiskRecord {
                key: k.clone(),
                length: e.length,
            })
            .collect()
    }

    /// Writes `value` as `key`'s record (replacing one there). Answers the keys of the
    /// records dropped to make room. Durable once [`DiskStore::sync`] returned.
    pub fn write(&self, key: &str, value: &[u8]) -> Result<Vec<String>, DiskError> {
        let crc = crc32fast::hash(value);
        self.write_with(key, value.len() as u64, crc, |f, at| {
            f.write_all_at(value, at)
        })
    }

    /// [`DiskStore::write`] of the `len` bytes at `offset` of registered memory, which the
    /// kernel copies to the file itself (no bounce buffer).
    pub fn write_from(
        &self,
        key: &str,
        memory: &RegisteredBuffer,
        offset: usize,
        len: usize,
    ) -> Result<Vec<String>, DiskError> {
        let crc = memory
            .with_bytes(offset, len, crc32fast::hash)
            .map_err(|e| DiskError::Io(io::Error::other(e)))?;
        self.write_with(key, len as u64, crc, |f, at| {
            memory
                .write_file_at(offset, len, f, at)
                .map_err(io::Error::other)?
        })
    }

    /// A record of `len` value bytes whose CRC is `crc`, the value written by `value(file,
    /// at)`: to a partial file, synced, renamed.
    fn write_with(
        &self,
        key: &str,
        len: u64,
        crc: u32,
        value: impl FnOnce(&File, u64) -> io::Result<()>,
    ) -> Result<Vec<String>, DiskError> {
        let bytes = record_bytes(key.len(), len);
        if bytes > self.capacity() || key.len() > MAX_KEY {
            return Err(DiskError::TooLarge(len));
        }
        let dropped = self.make_room(key, bytes);
        let path = self.path(key);
        let partial = path.with_extension(PARTIAL);
        let written = (|| {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&partial)?;
            f.write_all_at(&header(key.as_bytes(), len, crc), 0)?;
            f.write_all_at(key.as_bytes(), HEADER as u64)?;
            value(&f, data_offset(key.len()))?;
            // Zeros to the end of the last block (read whole by direct reads).
            f.set_len(bytes)?;
            f.sync_data()?;
            fs::rename(&partial, &path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&partial);
            self.counters.write_failures.fetch_add(1, Ordering::Relaxed);
            if e.kind() == ErrorKind::StorageFull {
                let (used, _) = self.usage();
                self.capacity.store(used, Ordering::Relaxed);
                tracing::warn!(dir = %self.dir.display(), bound = used, "the disk tier's file system is full: holding no more than what is written");
            }
            return Err(e.into());
        }
        let mut index = self.index.lock();
        index.clock += 1;
        let stamp = index.clock;
        index.used += bytes;
        if let Some(old) = index.entries.insert(
            key.to_owned(),
            Entry {
                length: len,
                bytes,
                stamp,
            },
        ) {
            index.used -= old.bytes;
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        Ok(dropped)
    }

    /// Drops least recently used records (not `key`'s) until `bytes` more fit.
    fn make_room(&self, key: &str, bytes: u64) -> Vec<String> {
        let cap = self.capacity();
        let mut index = self.index.lock();
        let mut dropped = Vec::new();
        if index.used + bytes <= cap {
            return dropped;
        }
        let mut by_age: Vec<(u64, String)> = index
            .entries
            .iter()
            .filter(|(k, _)| k.as_str() != key)
            .map(|(k, e)| (e.stamp, k.clone()))
            .collect();
        by_age.sort_unstable();
        for (_, k) in by_age {
            if index.used + bytes <= cap {
                break;
            }
            if let Some(e) = index.entries.remove(&k) {
                index.used -= e.bytes;
                let _ = fs::remove_file(self.path(&k));
                self.counters.evicted.fetch_add(1, Ordering::Relaxed);
                dropped.push(k);
            }
        }
        dropped
    }

    /// Makes the records written so far durable (syncs the directory's entries).
    pub fn sync(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    /// Reads `key`'s value into `out` (cleared first), checking both checksums; a record
    /// that fails is removed.
    pub fn read(&self, key: &str, out: &mut Vec<u8>) -> Result<(), DiskError> {
        out.clear();
        self.read_to(key, None, Dest::Vec(out))
    }

    /// [`DiskStore::read`] straight into registered memory at `offset`, where `len` bytes
    /// (the value's length) are reserved for it: the device writes the whole blocks there
    /// itself when the destination is aligned (else they come through a bounce buffer),
    /// and the checksum is taken of the bytes delivered.
    pub fn read_into(
        &self,
        key: &str,
        memory: &RegisteredBuffer,
        offset: usize,
        len: usize,
    ) -> Result<(), DiskError> {
        self.read_to(key, Some(len as u64), Dest::Region(memory.region(), offset))
    }

    /// Whether reads skip the page cache (`O_DIRECT`; not on every file system).
    pub fn is_direct(&self) -> bool {
        self.reader.is_direct()
    }

    /// `key`'s value as [`Bytes`]: a record that fits a bounce buffer is read whole in one
    /// request and its value handed out as a view of that buffer, with no copy (the buffer
    /// goes back to the pool once the value is dropped); a larger one is read into a
    /// vector.
    pub fn read_bytes(&self, key: &str) -> Result<Bytes, DiskError> {
        let (f, length, crc, mut bounce, whole) = self.read_head(key, None)?;
        let start = data_offset(key.len()) as usize;
        if whole {
            let sum = crc32fast::hash(&bounce.bytes(start + length as usize)[start..]);
            self.check_value(key, sum == crc)?;
            return Ok(bounce.into_bytes(start..start + length as usize));
        }
        let mut v = Vec::with_capacity(length as usize);
        let read = self
            .reader
            .read_value(&f, start as u64, length, &mut bounce, Dest::Vec(&mut v));
        self.settle_read(key, crc, read)?;
        Ok(Bytes::from(v))
    }

    /// Reads `key`'s value (of `expect` bytes, if given) into `dest`.
    fn read_to(&self, key: &str, expect: Option<u64>, dest: Dest<'_>) -> Result<(), DiskError> {
        let (f, length, crc, mut bounce, whole) = self.read_head(key, expect)?;
        let start = data_offset(key.len());
        let read = if whole {
            self.reader
                .deliver(&bounce, start as usize, length as usize, dest)
        } else {
            self.reader.read_value(&f, start, length, &mut bounce, dest)
        };
        self.settle_read(key, crc, read)
    }

    /// Opens `key`'s record (of a value of `expect` bytes, if given) and reads its head
    /// into a bounce buffer, checked: the whole record in the same request when it fits.
    /// Answers (file, value length, value CRC, the buffer, whether it holds the value).
    fn read_head(
        &self,
        key: &str,
        expect: Option<u64>,
    ) -> Result<(File, u64, u32, direct::Bounce, bool), DiskError> {
        let mut bounce = self.reader.bounce();
        let (f, length) = self.open_record(key)?;
        if let Some(want) = expect.filter(|&w| w != length) {
            return Err(DiskError::Corrupt {
                key: key.to_owned(),
                why: format!("{length} bytes on disk, {want} asked for"),
            });
        }
        let whole = record_bytes(key.len(), length);
        let one_read = whole <= direct::BOUNCE as u64;
        let first = if one_read {
            whole
        } else {
            data_offset(key.len())
        };
        match bounce.fill(&f, first as usize, 0) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                return Err(self.corrupt(key, "record cut short"));
            }
            Err(e) => return Err(e.into()),
        }
        let crc = self.check_head(key, length, bounce.bytes(HEADER + key.len()))?;
        Ok((f, length, crc, bounce, one_read))
    }

    /// The outcome of reading a value whose CRC should be `crc`.
    fn settle_read(&self, key: &str, crc: u32, read: io::Result<u32>) -> Result<(), DiskError> {
        match read {
            Ok(sum) => self.check_value(key, sum == crc),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                Err(self.corrupt(key, "value cut short"))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// A record that failed a check is removed, counted and kept for the master to hear
    /// of; one removed meanwhile (a delete raced the read) is only missing.
    fn corrupt(&self, key: &str, why: &str) -> DiskError {
        if !self.delete(key) {
            return DiskError::Missing(key.to_owned());
        }
        self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
        self.lost.lock().push(key.to_owned());
        DiskError::Corrupt {
            key: key.to_owned(),
            why: why.to_owned(),
        }
    }

    fn check_value(&self, key: &str, crc_held: bool) -> Result<(), DiskError> {
        if !crc_held {
            return Err(self.corrupt(key, "value checksum"));
        }
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// `key`'s record file opened for reading, and its value length as indexed.
    fn open_record(&self, key: &str) -> Result<(File, u64), DiskError> {
        let length = {
            let mut index = self.index.lock();
            index.clock += 1;
            let stamp = index.clock;
            let e = index
                .entries
                .get_mut(key)
                .ok_or_else(|| DiskError::Missing(key.to_owned()))?;
            e.stamp = stamp;
            e.length
        };
        match self.reader.open(&self.path(key)) {
            Ok(f) => Ok((f, length)),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(self.corrupt(key, "file missing")),
            Err(e) => Err(e.into()),
        }
    }

    /// Checks a record's header and key (`head`) against `key` and its indexed `length`:
    /// the value's CRC.
    fn check_head(&self, key: &str, length: u64, head: &[u8]) -> Result<u32, DiskError> {
        let h: &[u8; HEADER] = head[..HEADER].try_into().expect("header");
        let parsed = if key_len(h) != key.len() || &head[HEADER..] != key.as_bytes() {
            Err("another key".to_owned())
        } else {
            parse(h, &head[HEADER..])
        };
        match parsed {
            Ok((len, crc)) if len == length => Ok(crc),
            Ok(_) => Err(self.corrupt(key, "another length")),
            Err(why) => Err(self.corrupt(key, &why)),
        }
    }

    /// Keys whose records reads found torn or corrupt (and removed) since the last call:
    /// records the master must hear are gone.
    pub fn take_lost(&self) -> Vec<String> {
        std::mem::take(&mut *self.lost.lock())
    }

    /// Removes `key`'s record; whether it was held.
    pub fn delete(&self, key: &str) -> bool {
        let gone = {
            let mut index = self.index.lock();
            let e = index.entries.remove(key);
            if let Some(e) = &e {
                index.used -= e.bytes;
            }
            e.is_some()
        };
        if gone
            && let Err(e) = fs::remove_file(self.path(key))
            && e.kind() != ErrorKind::NotFound
        {
            tracing::warn!(key, error = %e, "cannot remove a disk record");
        }
        gone
    }
}

#[cfg(test)]
mod tests;
