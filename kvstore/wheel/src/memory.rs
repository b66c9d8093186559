//! Caller memory by raw address: Mooncake's Python API registers numpy arrays and torch
//! tensors by `data_ptr()` and then names bytes by address (`buffer + page * item_len`).
//!
//! [`register_raw`] checks that the range is mapped readable and writable in this process
//! (`/proc/self/maps`) before handing it to the engine, so a null, stale or made-up pointer
//! is refused instead of faulting later. [`register_at`] takes Mooncake's location label
//! too: device memory (`cuda:N`, or a CUDA pointer under `*`) is checked with the CUDA
//! driver instead (its addresses are not host mappings). The caller keeps the memory alive
//! until it unregisters it: that is Mooncake's contract too, and the one thing no check can
//! prove.
//!
//! [`Regions`] resolves an address range to the registration holding it (the local side of
//! a transfer, the source of `put_from`, the destination of `get_into`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use transfer::{Location, RegisteredBuffer, TransferEngine};

/// Registrations of one engine or store, by first address.
#[derive(Default)]
pub struct Regions {
    map: RwLock<BTreeMap<u64, Entry>>,
    seq: AtomicU64,
}

struct Entry {
    buf: RegisteredBuffer,
    /// Registration order (`get_first_buffer_address` answers the oldest).
    seq: u64,
    /// Allocated by `allocate_managed_buffer` (freed by `free_managed_buffer` only).
    managed: bool,
}

impl Regions {
    /// Adds `buf`; refused when it overlaps a registration (Mooncake refuses it too).
    pub fn insert(&self, buf: RegisteredBuffer, managed: bool) -> Result<(), String> {
        let (start, end) = (buf.addr(), buf.addr() + buf.len() as u64);
        let mut map = self.map.write();
        let before = map.range(..end).next_back();
        if let Some((&a, e)) = before
            && a + e.buf.len() as u64 > start
        {
            return Err(format!(
                "[{start:#x}, {end:#x}) overlaps the registered [{a:#x}, {:#x})",
                a + e.buf.len() as u64
            ));
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        map.insert(start, Entry { buf, seq, managed });
        Ok(())
    }

    /// Removes the registration starting at `addr` (of the given kind); returns it.
    pub fn remove(&self, addr: u64, managed: bool) -> Option<RegisteredBuffer> {
        let mut map = self.map.write();
        match map.get(&addr) {
            Some(e) if e.managed == managed => map.remove(&addr).map(|e| e.buf),
            _ => None,
        }
    }

    /// The registration holding `[addr, addr + len)` and the offset of `addr` in it.
    pub fn resolve(&self, addr: u64, len: u64) -> Result<(RegisteredBuffer, usize), String> {
        let map = self.map.read();
        if let Some((&a, e)) = map.range(..=addr).next_back() {
            let end = a + e.buf.len() as u64;
            if addr.checked_add(len).is_some_and(|x| x <= end) {
                return Ok((e.buf.clone(), (addr - a) as usize));
            }
        }
        Err(format!(
            "[{addr:#x}, +{len}) is not inside memory registered with this engine \
             (register_memory / register_buffer it first)"
        ))
    }

    /// Address of the oldest registration, if any.
    pub fn first(&self) -> Option<u64> {
        let map = self.map.read();
        map.values().min_by_key(|e| e.seq).map(|e| e.buf.addr())
    }

    /// Drops every registration.
    pub fn clear(&self) {
        self.map.write().clear();
    }
}

/// Registers `len` bytes of caller memory at `addr` with `engine`, after checking the range
/// is mapped readable and writable in this process.
pub fn register_raw(
    engine: &TransferEngine,
    addr: u64,
    len: u64,
) -> Result<RegisteredBuffer, String> {
    if addr == 0 {
        return Err("null address".into());
    }
    if len == 0 {
        return Err("zero length".into());
    }
    let end = addr
        .checked_add(len)
        .ok_or_else(|| format!("[{addr:#x}, +{len}) overflows the address space"))?;
    let size = usize::try_from(len).map_err(|_| format!("{len} bytes do not fit in memory"))?;
    check_mapped(addr, end)?;
    // SAFETY: the range is mapped readable and writable right now (checked above against
    // the kernel's view of this process). That it stays so until the returned handle is
    // dropped (`unregister_memory` / `unregister_buffer` / the object's end) is the caller's
    // promise under Mooncake's API, the same promise `register_memory` asks of Mooncake's
    // users; the engine never forms Rust references to it.
    unsafe { engine.register_raw(addr as *mut u8, size, ()) }
        .map_err(|e| format!("registering [{addr:#x}, +{len}): {e}"))
}

/// Registers `len` bytes at `addr` with `engine` at Mooncake location `label` (`cpu:N`,
/// `cuda:N`, or `*`: wherever the pointer is). Host memory is checked as [`register_raw`]
/// does; device memory by the driver, which must hold the whole range in one allocation of
/// that device (a device label without a driver is refused with the reason).
pub fn register_at(
    engine: &TransferEngine,
    addr: u64,
    len: u64,
    label: &str,
) -> Result<RegisteredBuffer, String> {
    let location = Location::parse_label(label).map_err(|e| e.to_string())?;
    if addr == 0 {
        return Err("null address".into());
    }
    let location = match location {
        Some(l) => l,
        None => engine.locate(addr).map_err(|e| e.to_string())?,
    };
    let Location::Cuda(_) = location else {
        return register_raw(engine, addr, len);
    };
    if len == 0 {
        return Err("zero length".into());
    }
    let size = usize::try_from(len).map_err(|_| format!("{len} bytes do not fit in memory"))?;
    // SAFETY: the engine checks with the driver that the range is device memory of that
    // device, inside one allocation (refusing it otherwise); that it stays allocated until
    // the handle is dropped (`unregister_memory`) is the caller's promise under Mooncake's
    // API. The CPU never touches it.
    unsafe { engine.register_raw_at(addr as *mut u8, size, Some(location), ()) }
        .map_err(|e| format!("registering [{addr:#x}, +{len}) as {location}: {e}"))
}

/// Whether `[start, end)` is covered by `rw` mappings of this process.
fn check_mapped(start: u64, end: u64) -> Result<(), String> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("reading /proc/self/maps: {e}"))?;
    covered(&maps, start, end)
}

/// Whether the mappings listed in `maps` (the `/proc/<pid>/maps` format) cover
/// `[start, end)` with read and write permission.
fn covered(maps: &str, start: u64, end: u64) -> Result<(), String> {
    let mut at = start;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if hi <= at || lo > at {
            continue;
        }
        if !perms.starts_with("rw") {
            return Err(format!(
                "{at:#x} is mapped {perms}, not readable and writable"
            ));
        }
        at = hi;
        if at >= end {
            return Ok(());
        }
    }
    Err(format!(
        "[{at:#x}, {end:#x}) is not mapped in this process (a stale or made-up pointer)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00401000 r-xp 00000000 08:01 1 /bin/x
10000-20000 rw-p 00000000 00:00 0
20000-30000 rw-s 00000000 00:01 7 /memfd:x (deleted)
40000-50000 r--p 00000000 00:00 0
";

    #[test]
    fn ranges_must_be_mapped_rw_without_holes() {
        assert!(covered(MAPS, 0x10000, 0x30000).is_ok());
        assert!(covered(MAPS, 0x18000, 0x18001).is_ok());
        assert!(
            covered(MAPS, 0x28000, 0x31000)
                .unwrap_err()
                .contains("not mapped")
        );
        assert!(
            covered(MAPS, 0x40000, 0x40010)
                .unwrap_err()
                .contains("r--p")
        );
        assert!(covered(MAPS, 0x1000, 0x2000).is_err());
    }
}
