//! `MooncakeDistributedStore`'s get and put sessions over [`kvclient::Held`] and
//! [`kvclient::Writable`]: SGLang's layer-wise loader starts a get session on a batch of
//! pages, reads one layer of each per `batch_get_into_multi_buffer_ranges` call, and ends
//! it. The master is asked only by the start and end calls.
//!
//! Answers are Mooncake's: per key 0 or the bytes moved, or a negative code
//! (`INVALID_PARAMS` for a key without a session, mismatched lists or a range outside the
//! object; `LEASE_EXPIRED` when a held object's lease ran out, which also ends its session:
//! start it again). A store that is not set up answers an empty list (`-1` for
//! `batch_get_session_end`), as Mooncake's does. A put session's end and revoke wait for
//! ranged writes of its keys still under way in other threads.

use kvclient::{BufRange, Range, StoreError};
use pyo3::prelude::*;
use transfer::RegisteredBuffer;

use crate::codes::{self, INVALID_PARAMS, OK};
use crate::replicate::ReplicateConfig;
use crate::runtime::block_here;
use crate::store::{MooncakeDistributedStore, PutSession, Sessions, StoreState};

/// Mooncake's `LEASE_EXPIRED`.
const LEASE_EXPIRED: i32 = -707;

/// One key's ranges resolved to registered memory: `(buffer, offset, len, object offset)`.
type Resolved = Vec<(RegisteredBuffer, usize, usize, u64)>;

/// Resolves each key's `(ptr, size, offset)` lists, or the code of the first problem.
fn resolve(
    s: &StoreState,
    op: &str,
    key: &str,
    ptrs: &[u64],
    sizes: &[u64],
    offsets: &[u64],
) -> Result<Resolved, i32> {
    if ptrs.len() != sizes.len() || ptrs.len() != offsets.len() {
        return Err(codes::invalid(
            op,
            format!("{key:?}: pointers, sizes and offsets differ in length"),
        ));
    }
    let mut out = Vec::with_capacity(ptrs.len());
    for ((&p, &n), &o) in ptrs.iter().zip(sizes).zip(offsets) {
        let (buf, off) = s
            .regions
            .resolve(p, n)
            .map_err(|e| codes::invalid(op, format!("{key:?}: {e}")))?;
        out.push((buf, off, n as usize, o));
    }
    Ok(out)
}

fn ranges(r: &Resolved) -> Vec<Range<'_>> {
    r.iter()
        .map(|(buf, off, len, at)| Range {
            buf: BufRange::new(buf, *off, *len),
            offset: *at,
        })
        .collect()
}

/// The answer of a ranged call for one key.
fn moved(op: &str, r: Result<u64, StoreError>) -> i64 {
    match r {
        Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
        Err(StoreError::InvalidArgument(why)) => i64::from(codes::invalid(op, why)),
        Err(e) => i64::from(codes::store_code(op, &e)),
    }
}

fn lists_match(op: &str, n: usize, lens: [usize; 3]) -> Result<(), i32> {
    if lens.iter().all(|&l| l == n) {
        Ok(())
    } else {
        Err(codes::invalid(
            op,
            format!("keys ({n}), pointer, size and offset lists ({lens:?}) differ in length"),
        ))
    }
}

/// The arguments of a ranged call: per key its pointers, sizes and object offsets.
struct RangedArgs {
    keys: Vec<String>,
    ptrs: Vec<Vec<u64>>,
    sizes: Vec<Vec<u64>>,
    offsets: Vec<Vec<u64>>,
}

/// What a ranged call works on: the answer so far per key (`INVALID_PARAMS` until set),
/// and the keys to move with their session entry and resolved ranges.
type Work<T> = (Vec<i64>, Vec<(usize, T, Resolved)>);

impl RangedArgs {
    /// Checks the lists agree and resolves each key's ranges; `take` gives a key's
    /// session entry (called with its ranges resolved), or the code to answer.
    fn prepare<T>(
        &self,
        s: &StoreState,
        op: &str,
        mut take: impl FnMut(&str) -> Result<T, i64>,
    ) -> Work<T> {
        let n = self.keys.len();
        let lens = [self.ptrs.len(), self.sizes.len(), self.offsets.len()];
        if let Err(code) = lists_match(op, n, lens) {
            return (vec![i64::from(code); n], Vec::new());
        }
        let mut out = vec![i64::from(INVALID_PARAMS); n];
        let mut work = Vec::with_capacity(n);
        for (i, key) in self.keys.iter().enumerate() {
            let r = resolve(s, op, key, &self.ptrs[i], &self.sizes[i], &self.offsets[i]);
            match r.map_err(i64::from).and_then(|r| Ok((take(key)?, r))) {
                Ok((t, r)) => work.push((i, t, r)),
                Err(code) => out[i] = code,
            }
        }
        (out, work)
    }
}

/// The (entry, ranges) items of `work` for a client call, over `rs` (its ranges).
fn items<'a, T>(
    work: &'a [(usize, T, Resolved)],
    rs: &'a [Vec<Range<'a>>],
) -> Vec<(&'a T, &'a [Range<'a>])> {
    work.iter()
        .zip(rs)
        .map(|((_, t, _), r)| (t, r.as_slice()))
        .collect()
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Starts a get session on `keys`: looks them up once (a read lease each) for the
    /// ranged reads that follow. Per key 0, or a negative code; starting again renews.
    fn batch_get_session_start(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let op = "batch_get_session_start";
        let Some(s) = self.set_up(op) else {
            return Vec::new();
        };
        let names: Vec<&str> = keys.iter().map(String::as_str).collect();
        let held = block_here(py, s.client.hold(&names));
        let mut gets = s.sessions.gets.lock();
        keys.iter()
            .zip(held)
            .map(|(key, r)| match r {
                Ok(h) => {
                    gets.insert(key.clone(), h);
                    OK
                }
                Err(e) => {
                    gets.remove(key);
                    codes::store_code(op, &e)
                }
            })
            .collect()
    }

    /// Ranged reads under a get session: for key `i`, `all_sizes[i][j]` bytes at offset
    /// `all_src_offsets[i][j]` of the object into `all_buffer_ptrs[i][j]` (registered
    /// memory). Per key the bytes read, or a negative code.
    fn batch_get_into_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<u64>>,
        all_sizes: Vec<Vec<u64>>,
        all_src_offsets: Vec<Vec<u64>>,
    ) -> Vec<i64> {
        let op = "batch_get_into_multi_buffer_ranges";
        let Some(s) = self.set_up(op) else {
            return Vec::new();
        };
        let args = RangedArgs {
            keys,
            ptrs: all_buffer_ptrs,
            sizes: all_sizes,
            offsets: all_src_offsets,
        };
        let (mut out, work) = {
            let mut gets = s.sessions.gets.lock();
            args.prepare(&s, op, |key| match gets.get(key) {
                None => Err(i64::from(codes::invalid(
                    op,
                    format!("{key:?} has no get session"),
                ))),
                Some(h) if h.expired() => {
                    gets.remove(key);
                    Err(i64::from(LEASE_EXPIRED))
                }
                Some(h) => Ok(h.clone()),
            })
        };
        let rs: Vec<Vec<Range<'_>>> = work.iter().map(|(_, _, r)| ranges(r)).collect();
        let items = items(&work, &rs);
        let results = block_here(py, s.client.read_held(&items));
        let mut gets = s.sessions.gets.lock();
        for ((i, h, _), r) in work.iter().zip(results) {
            if matches!(r, Err(StoreError::LeaseExpired { .. })) {
                gets.remove(h.key());
                out[*i] = i64::from(LEASE_EXPIRED);
            } else {
                out[*i] = moved(op, r);
            }
        }
        out
    }

    /// Ends the get sessions of `keys` (their leases simply run out). 0.
    fn batch_get_session_end(&self, keys: Vec<String>) -> i32 {
        let Some(s) = self.set_up("batch_get_session_end") else {
            return -1;
        };
        let mut gets = s.sessions.gets.lock();
        for k in &keys {
            gets.remove(k);
        }
        OK
    }

    /// Starts a put session on `keys` of `sizes` bytes: the master allocates their
    /// replicas; the objects stay invisible until `batch_put_session_end`. Per key 0 or a
    /// negative code (`INVALID_PARAMS` for a key that already has a put session).
    #[pyo3(signature = (keys, sizes, config = None))]
    fn batch_put_session_start(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        sizes: Vec<u64>,
        config: Option<ReplicateConfig>,
    ) -> Vec<i32> {
        let op = "batch_put_session_start";
        let Some(s) = self.set_up(op) else {
            return Vec::new();
        };
        if keys.len() != sizes.len() {
            return vec![codes::invalid(op, "keys and sizes differ in length"); keys.len()];
        }
        let client = match crate::store_io::placed(&s, config.as_ref()) {
            Ok(c) => c,
            Err(code) => return vec![code; keys.len()],
        };
        let mut out = vec![OK; keys.len()];
        let mut start = Vec::new();
        {
            let puts = s.sessions.puts.lock();
            for (i, key) in keys.iter().enumerate() {
                if puts.contains_key(key) || start.iter().any(|&(j, _)| keys[j] == *key) {
                    out[i] = codes::invalid(op, format!("{key:?} already has a put session"));
                } else {
                    start.push((i, sizes[i]));
                }
            }
        }
        let items: Vec<(&str, u64)> = start.iter().map(|&(i, n)| (keys[i].as_str(), n)).collect();
        let started = block_here(py, client.start_writes(&items));
        let mut puts = s.sessions.puts.lock();
        for (&(i, _), r) in start.iter().zip(started) {
            match r {
                Ok(put) => {
                    puts.insert(keys[i].clone(), PutSession { put, writing: 0 });
                }
                Err(e) => out[i] = codes::put_code(op, &Err(e)),
            }
        }
        out
    }

    /// Ranged writes under a put session: for key `i`, `all_sizes[i][j]` bytes of
    /// `all_buffer_ptrs[i][j]` (registered memory) at offset `all_dst_offsets[i][j]` of the
    /// object, on every replica. Per key the bytes written, or a negative code.
    fn batch_put_from_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<u64>>,
        all_sizes: Vec<Vec<u64>>,
        all_dst_offsets: Vec<Vec<u64>>,
    ) -> Vec<i64> {
        let op = "batch_put_from_multi_buffer_ranges";
        let Some(s) = self.set_up(op) else {
            return Vec::new();
        };
        let args = RangedArgs {
            keys,
            ptrs: all_buffer_ptrs,
            sizes: all_sizes,
            offsets: all_dst_offsets,
        };
        let (mut out, work) = {
            let mut puts = s.sessions.puts.lock();
            args.prepare(&s, op, |key| match puts.get_mut(key) {
                None => Err(i64::from(codes::invalid(
                    op,
                    format!("{key:?} has no put session"),
                ))),
                Some(p) => {
                    p.writing += 1;
                    Ok(p.put.clone())
                }
            })
        };
        // Ends the writes even if the call unwinds, so that end and revoke never wait forever.
        struct Done<'a>(&'a Sessions, Vec<String>);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut puts = self.0.puts.lock();
                for k in &self.1 {
                    if let Some(p) = puts.get_mut(k) {
                        p.writing = p.writing.saturating_sub(1);
                    }
                }
                self.0.written.notify_all();
            }
        }
        let _done = Done(
            &s.sessions,
            work.iter().map(|(_, w, _)| w.key().to_owned()).collect(),
        );
        let rs: Vec<Vec<Range<'_>>> = work.iter().map(|(_, _, r)| ranges(r)).collect();
        let items = items(&work, &rs);
        let results = block_here(py, s.client.write_ranges(&items));
        for ((i, _, _), r) in work.iter().zip(results) {
            out[*i] = moved(op, r);
        }
        out
    }

    /// Ends put sessions: once their ranged writes under way are done, the objects become
    /// readable. Per key 0 or a negative code (`INVALID_PARAMS` without a session).
    fn batch_put_session_end(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        self.finish_puts(py, "batch_put_session_end", keys, true)
    }

    /// Revokes put sessions: their space is given back. Per key 0 or a negative code.
    fn batch_put_session_revoke(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        self.finish_puts(py, "batch_put_session_revoke", keys, false)
    }
}

impl MooncakeDistributedStore {
    /// The set-up state, or `None` (logged: the caller answers as Mooncake's does).
    fn set_up(&self, op: &str) -> Option<std::sync::Arc<StoreState>> {
        let s = self.state();
        if s.is_none() {
            codes::invalid(op, "the store is not set up");
        }
        s
    }

    fn finish_puts(&self, py: Python<'_>, op: &str, keys: Vec<String>, end: bool) -> Vec<i32> {
        let Some(s) = self.set_up(op) else {
            return Vec::new();
        };
        let mut out = vec![OK; keys.len()];
        let mut mine: Vec<(usize, PutSession)> = Vec::new();
        py.detach(|| {
            let mut puts = s.sessions.puts.lock();
            while keys
                .iter()
                .any(|k| puts.get(k).is_some_and(|p| p.writing > 0))
            {
                s.sessions.written.wait(&mut puts);
            }
            for (i, k) in keys.iter().enumerate() {
                match puts.remove(k) {
                    Some(p) => mine.push((i, p)),
                    None => out[i] = codes::invalid(op, format!("{k:?} has no put session")),
                }
            }
        });
        let names: Vec<&str> = mine.iter().map(|(i, _)| keys[*i].as_str()).collect();
        let client = &s.client;
        let rs = block_here(py, async {
            match end {
                true => client.end_writes(&names).await,
                false => client.revoke_writes(&names).await,
            }
        });
        let mut puts = s.sessions.puts.lock();
        for ((i, p), r) in mine.into_iter().zip(rs) {
            out[i] = match r {
                Ok(()) => OK,
                // The master's state is unknown: the session stays, to end or revoke again.
                Err(e) => {
                    puts.insert(keys[i].clone(), p);
                    codes::store_code(op, &e)
                }
            };
        }
        out
    }
}
