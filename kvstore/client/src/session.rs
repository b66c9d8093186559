//! Sessions: objects looked up (to read) or started (to write) once, then moved in byte
//! ranges by many calls that ask the master nothing (Mooncake's get and put sessions;
//! SGLang's layer-wise loader reads one layer of every page per call).
//!
//! - **Reads.** [`StoreClient::hold`] looks objects up as a get does: the master grants a
//!   read lease per object, and the nearest replicas are opened once. [`StoreClient::read_held`]
//!   reads ranges of held objects into registered memory, trying the next replica of an
//!   object whose read fails. A read that starts or ends past the lease answers
//!   [`StoreError::LeaseExpired`] (the bytes may have been overwritten: evicted and reused);
//!   holding again renews the lease. Nothing else is pinned: a holder that stops or dies
//!   leaves only leases, which run out.
//! - **Writes.** [`StoreClient::start_writes`] starts puts (the master allocates their
//!   replicas; the objects stay invisible), [`StoreClient::write_ranges`] writes ranges to
//!   every replica, [`StoreClient::end_writes`] makes the objects readable and
//!   [`StoreClient::revoke_writes`] gives the space back. A range is written only within
//!   the master's write window (`write_within_ms`) of the put-start: past it, a master that
//!   restarted or took over may have given the space out again. A session outlasts it by
//!   renewing: half through a window, the next write first asks the master for the put
//!   again under its put id (`renew`), which answers the same replicas and a new window
//!   while it still holds that very put, and `INVALID_WRITE` once it does not (revoke
//!   and start again). A writer that dies leaves unfinished
//!   puts that the master discards after `put_start_discard_timeout_ms` and frees after
//!   `put_start_release_timeout_ms`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openapi::master::{MasterError, Replica};
use parking_lot::Mutex;
use transfer::{Op, Segment, TransferError, TransferRequest};

use super::error::{StoreError, StoreResult};
use super::io::{Opened, abandoned, lease_check};
use super::{BufRange, StoreClient};

/// An object held for ranged reads: its length, its lease and its opened replicas.
#[derive(Debug, Clone)]
pub struct Held {
    key: String,
    length: u64,
    granted: Instant,
    lease_ms: u64,
    /// Opened replicas, nearest first.
    replicas: Vec<(Segment, u64)>,
}

impl Held {
    /// The object's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The object's length in bytes.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Whether the read lease has run out.
    pub fn expired(&self) -> bool {
        lease_check(&self.key, self.granted, self.lease_ms).is_err()
    }
}

/// When a put may be written: from its put-start (or last renewal) request, for the
/// master's write window.
#[derive(Debug, Clone, Copy)]
struct Window {
    asked: Instant,
    /// `None`: the master gave no window.
    within: Option<Duration>,
}

/// A put started for ranged writes: its length, its replicas and its write window (shared
/// by its clones: a renewal made through one serves them all).
#[derive(Debug, Clone)]
pub struct Writable {
    key: String,
    length: u64,
    /// The put-start's id, under which the master renews it.
    put_id: u32,
    /// Where the master placed it: (segment, address) of each replica.
    placed: Vec<(String, u64)>,
    window: Arc<Mutex<Window>>,
    /// Every replica, opened: each range goes to all of them.
    replicas: Vec<(Segment, u64)>,
}

impl Writable {
    /// The object's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The object's length in bytes.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Whether half the write window has gone: the next write renews it first.
    fn renewal_due(&self) -> bool {
        let w = *self.window.lock();
        w.within.is_some_and(|d| w.asked.elapsed() >= d / 2)
    }

    /// Refused when the write window has passed (a renewal failed or came too late).
    fn check_window(&self) -> StoreResult<()> {
        let w = *self.window.lock();
        match w.within {
            Some(d) if w.asked.elapsed() >= d => {
                Err(StoreError::Master(MasterError::InvalidWrite(format!(
                    "{:?}: the put was started or renewed {} ms ago, past the master's write \
                     window of {} ms (its space may be given out again): revoke it and start \
                     again",
                    self.key,
                    w.asked.elapsed().as_millis(),
                    d.as_millis()
                ))))
            }
            _ => Ok(()),
        }
    }
}

/// One range of a session call: the bytes of `buf`, at `offset` in the object.
#[derive(Debug, Clone, Copy)]
pub struct Range<'a> {
    /// Registered memory: the destination of a read, the source of a write (its `len`
    /// bytes).
    pub buf: BufRange<'a>,
    /// Offset in the object.
    pub offset: u64,
}

/// Checks `ranges` against the object's `length` and their buffers; their total bytes.
fn check_ranges(key: &str, length: u64, ranges: &[Range<'_>]) -> StoreResult<u64> {
    let mut total = 0u64;
    for r in ranges {
        r.buf.check(key)?;
        let end = r.offset.checked_add(r.buf.len as u64);
        if end.is_none_or(|e| e > length) {
            return Err(StoreError::InvalidArgument(format!(
                "{key:?}: range [{}, +{}) is outside the {length}-byte object",
                r.offset, r.buf.len
            )));
        }
        total += r.buf.len as u64;
    }
    Ok(total)
}

/// The transfer requests moving `ranges` between their buffers and the replica at `addr`.
fn requests(op: Op, seg: &Segment, addr: u64, ranges: &[Range<'_>]) -> Vec<TransferRequest> {
    ranges
        .iter()
        .map(|r| TransferRequest::new(op, r.buf.buf, r.buf.offset, seg, addr + r.offset, r.buf.len))
        .collect()
}

impl StoreClient {
    /// Looks `keys` up (the master grants a read lease on each) and opens their replicas:
    /// held objects for [`StoreClient::read_held`]. Holding a key again renews its lease.
    pub async fn hold(&self, keys: &[&str]) -> Vec<StoreResult<Held>> {
        let granted = Instant::now();
        let looked = self.lookups(keys).await;
        let mut opened = Opened::default();
        let mut out = Vec::with_capacity(keys.len());
        for (key, r) in keys.iter().zip(looked) {
            let held = match r {
                Ok(l) => {
                    let cands = self.candidates(&mut opened, &l.replicas).await;
                    let mut last = None;
                    let mut replicas = Vec::with_capacity(cands.len());
                    for c in cands {
                        match c {
                            Ok(rep) => replicas.push(rep),
                            Err(e) => last = Some(e),
                        }
                    }
                    match (replicas.is_empty(), last) {
                        (true, Some(e)) => Err(StoreError::transfer(key, e)),
                        _ => Ok(Held {
                            key: (*key).to_owned(),
                            length: l.length,
                            granted,
                            lease_ms: l.lease_ms,
                            replicas,
                        }),
                    }
                }
                Err(e) => Err(e),
            };
            out.push(held);
        }
        crate::metrics::record_client_batch("hold", &out);
        out
    }

    /// Reads each item's ranges of its held object into registered memory, one transfer
    /// batch per round (an object whose read fails is read again from its next replica).
    /// Answers the bytes read per item, or why not: a range outside its object or buffer,
    /// an expired lease ([`StoreError::LeaseExpired`]: hold it again), a failed transfer.
    pub async fn read_held(&self, items: &[(&Held, &[Range<'_>])]) -> Vec<StoreResult<u64>> {
        let mut out: Vec<StoreResult<u64>> = items
            .iter()
            .map(|(h, ranges)| {
                let total = check_ranges(&h.key, h.length, ranges)?;
                lease_check(&h.key, h.granted, h.lease_ms)?;
                Ok(total)
            })
            .collect();
        // (item, next replica to try)
        let mut pending: Vec<(usize, usize)> = (0..items.len())
            .filter(|&i| out[i].is_ok() && !items[i].0.replicas.is_empty())
            .map(|i| (i, 0))
            .collect();
        for (i, (h, _)) in items.iter().enumerate() {
            if out[i].is_ok() && h.replicas.is_empty() {
                out[i] = Err(StoreError::transfer(&h.key, no_replica()));
            }
        }
        let mut last_err: Vec<Option<TransferError>> = vec![None; items.len()];
        while !pending.is_empty() {
            let mut reqs = Vec::new();
            let mut spans = Vec::with_capacity(pending.len()); // (item, first req, count)
            for &(i, next) in &pending {
                let (h, ranges) = items[i];
                let (seg, addr) = &h.replicas[next];
                let first = reqs.len();
                reqs.extend(requests(Op::Read, seg, *addr, ranges));
                spans.push((i, first, ranges.len()));
            }
            let results = self.run_transfers(reqs).await;
            // An object with a range whose transfer was abandoned (it may still land later)
            // is not read again into the same memory in this call.
            let mut gone = vec![false; items.len()];
            for &(i, first, n) in &spans {
                let errs = || {
                    results[first..first + n]
                        .iter()
                        .filter_map(|r| r.as_ref().err())
                };
                gone[i] = errs().any(abandoned);
                last_err[i] = errs().next().cloned();
            }
            pending = pending
                .into_iter()
                .filter_map(|(i, next)| {
                    let h = items[i].0;
                    match last_err[i].take() {
                        None => {
                            if let Err(e) = lease_check(&h.key, h.granted, h.lease_ms) {
                                out[i] = Err(e);
                            }
                            None
                        }
                        Some(e) if gone[i] || next + 1 >= h.replicas.len() => {
                            out[i] = Err(StoreError::transfer(&h.key, e));
                            None
                        }
                        Some(_) => Some((i, next + 1)),
                    }
                })
                .collect();
        }
        crate::metrics::record_client_batch("read_held", &out);
        out
    }

    /// Starts puts of `items` (key, length): the master allocates every replica, the
    /// objects stay invisible until [`StoreClient::end_writes`]. A put whose replicas
    /// cannot be opened, or whose put-start answered past its write window, is revoked.
    pub async fn start_writes(&self, items: &[(&str, u64)]) -> Vec<StoreResult<Writable>> {
        let asked = Instant::now();
        let put_id = self.next_put_id();
        let (started, _, within_ms) = self.put_starts_as(items, None, put_id, false).await;
        let window = Window {
            asked,
            within: (within_ms > 0).then(|| Duration::from_millis(within_ms)),
        };
        let mut opened = Opened::default();
        let mut out = Vec::with_capacity(items.len());
        let mut revoke = Vec::new();
        for (&(key, length), r) in items.iter().zip(started) {
            let w = match r {
                Ok(replicas) => {
                    let mut opened_all = Vec::with_capacity(replicas.len());
                    let mut failed = None;
                    for rep in &replicas {
                        match self.open_replica(&mut opened, rep).await {
                            Ok(seg) => opened_all.push((seg, rep.address)),
                            Err(e) => failed = Some(e),
                        }
                    }
                    let w = Writable {
                        key: key.to_owned(),
                        length,
                        put_id,
                        placed: placed(&replicas),
                        window: Arc::new(Mutex::new(window)),
                        replicas: opened_all,
                    };
                    match failed {
                        Some(e) => Err(StoreError::transfer(key, e)),
                        None => w.check_window().map(|()| w),
                    }
                }
                Err(e) => {
                    out.push(Err(e));
                    continue;
                }
            };
            if w.is_err() {
                revoke.push(key);
            }
            out.push(w);
        }
        if !revoke.is_empty() {
            let _ = self.revoke_writes(&revoke).await;
        }
        crate::metrics::record_client_batch("start_writes", &out);
        out
    }

    /// Writes each item's ranges into every replica of its started put, one transfer
    /// batch. A put half through its write window is renewed first (one request per put
    /// id: the master answers the same replicas and a new window, allocating nothing).
    /// Answers the bytes written per item, or why not: a range outside its object or
    /// buffer, a put the master no longer holds or whose window passed (`INVALID_WRITE`:
    /// revoke it and start again), a failed transfer (the put stays started: write again,
    /// or revoke it).
    pub async fn write_ranges(&self, items: &[(&Writable, &[Range<'_>])]) -> Vec<StoreResult<u64>> {
        let mut out: Vec<StoreResult<u64>> = items
            .iter()
            .map(|(w, ranges)| check_ranges(&w.key, w.length, ranges))
            .collect();
        self.renew_due(items, &mut out).await;
        for (r, (w, _)) in out.iter_mut().zip(items) {
            if let (Ok(_), Err(e)) = (&r, w.check_window()) {
                *r = Err(e);
            }
        }
        let mut reqs = Vec::new();
        let mut spans = Vec::new();
        for (i, (w, ranges)) in items.iter().enumerate() {
            if out[i].is_err() {
                continue;
            }
            let first = reqs.len();
            for (seg, addr) in &w.replicas {
                reqs.extend(requests(Op::Write, seg, *addr, ranges));
            }
            spans.push((i, first, reqs.len() - first));
        }
        let results = self.run_transfers(reqs).await;
        for (i, first, n) in spans {
            if let Some(e) = results[first..first + n]
                .iter()
                .find_map(|r| r.clone().err())
            {
                out[i] = Err(StoreError::transfer(&items[i].0.key, e));
            }
        }
        crate::metrics::record_client_batch("write_ranges", &out);
        out
    }

    /// Renews the puts of `items` half through their write window (those still `Ok` in
    /// `out`), one request per put id; a put the master no longer holds as it placed it
    /// gets its error in `out`.
    async fn renew_due(&self, items: &[(&Writable, &[Range<'_>])], out: &mut [StoreResult<u64>]) {
        let mut due: HashMap<u32, Vec<usize>> = HashMap::new();
        for (i, (w, _)) in items.iter().enumerate() {
            if out[i].is_ok() && w.renewal_due() {
                due.entry(w.put_id).or_default().push(i);
            }
        }
        for (put_id, idx) in due {
            let asked = Instant::now();
            let ask: Vec<(&str, u64)> = idx
                .iter()
                .map(|&i| (items[i].0.key.as_str(), items[i].0.length))
                .collect();
            let (rs, _, within_ms) = self.put_starts_as(&ask, None, put_id, true).await;
            let window = Window {
                asked,
                within: (within_ms > 0).then(|| Duration::from_millis(within_ms)),
            };
            for (&i, r) in idx.iter().zip(rs) {
                let w = items[i].0;
                match r {
                    Ok(replicas) if placed(&replicas) == w.placed => *w.window.lock() = window,
                    Ok(_) => {
                        out[i] = Err(StoreError::Master(MasterError::InvalidWrite(format!(
                            "{:?}: the master placed the put elsewhere on renewal",
                            w.key
                        ))))
                    }
                    Err(e) => out[i] = Err(e),
                }
            }
        }
    }

    /// Ends started puts: their objects become readable.
    pub async fn end_writes(&self, keys: &[&str]) -> Vec<StoreResult<()>> {
        self.put_finish(keys, true).await
    }

    /// Revokes started puts: their space is given back, nothing becomes readable.
    pub async fn revoke_writes(&self, keys: &[&str]) -> Vec<StoreResult<()>> {
        self.put_finish(keys, false).await
    }
}

/// Where `replicas` are: (segment, address) of each.
fn placed(replicas: &[Replica]) -> Vec<(String, u64)> {
    replicas
        .iter()
        .map(|r| (r.segment.clone(), r.address))
        .collect()
}

fn no_replica() -> TransferError {
    TransferError::UnknownSegment {
        segment: String::new(),
        reason: "no replica to read".into(),
    }
}
