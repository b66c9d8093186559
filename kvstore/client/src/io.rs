//! The put pipeline, and what it shares with the get pipeline (`read`). Single operations
//! are batches of one, so every form shares one path: one master request per step (the
//! single-key route for one item, the batch route for more) and one transfer batch for all
//! the bytes of a step.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::StreamExt;
use openapi::master as wire;
use transfer::{Op, RegisteredBuffer, Segment, TransferError, TransferRequest};

use super::error::{StoreError, StoreResult};
use super::reserve::{Held, Maker};
use super::results::{align, fail_all, key_results};
use super::rpc::item_error;
use super::staging::{MAPPED_PART, STAGE_BYTES, Slot, Staging, parts};
use super::{BufRange, StoreClient};
use openapi::master::MasterError;

/// Where one object's bytes come from (put) or go to (get) on this side.
pub(super) enum Side<'a> {
    /// Through a slot of the copy buffer.
    Copy(Slot),
    /// Caller-registered memory.
    Registered(&'a RegisteredBuffer, usize),
    /// A put's bytes in the caller's memory, not registered: written straight into the
    /// replicas this client's engine maps, and staged in a copy-buffer slot (made on first
    /// need) for the others.
    Bytes(&'a [u8], Option<Slot>),
}

impl Side<'_> {
    /// The copy-buffer slot of a side that reads through the copy buffer.
    pub(super) fn copy_slot(&self) -> &Slot {
        match self {
            Side::Copy(slot) => slot,
            Side::Registered(..) | Side::Bytes(..) => {
                unreachable!("a copying read has a copy-buffer side")
            }
        }
    }

    pub(super) fn buf_offset(&self) -> (&RegisteredBuffer, usize) {
        match self {
            Side::Copy(s) | Side::Bytes(_, Some(s)) => (s.buf(), s.offset()),
            Side::Registered(b, o) => (b, *o),
            Side::Bytes(_, None) => unreachable!("a put's bytes are staged before a transfer"),
        }
    }

    /// The registered memory a transfer of this side uses: a put's bytes are staged in a
    /// slot of `staging` first (once).
    fn staged(&mut self, staging: &Arc<Staging>) -> StoreResult<(RegisteredBuffer, usize)> {
        if let Side::Bytes(src, slot @ None) = self {
            let s = staging.slot(src.len())?;
            s.fill(src)?;
            *slot = Some(s);
        }
        let (b, o) = self.buf_offset();
        Ok((b.clone(), o))
    }

    pub(super) fn arm(&mut self) {
        if let Side::Copy(s) | Side::Bytes(_, Some(s)) = self {
            s.arm();
        }
    }

    /// The transfers touching this side are over: unless one of them was `abandoned`
    /// (timed out or cancelled: late bytes may still move), its slot may be reused at once.
    pub(super) fn settle(&mut self, abandoned: bool) {
        if let (Side::Copy(s) | Side::Bytes(_, Some(s)), false) = (self, abandoned) {
            s.disarm();
        }
    }
}

/// Whether a transfer that failed with `e` may still move bytes (timed out, cancelled).
pub(super) fn abandoned(e: &TransferError) -> bool {
    matches!(
        e,
        TransferError::TimedOut { .. } | TransferError::Cancelled { .. }
    )
}

/// The metric label of a call: the single form for one item, the batch form for more.
pub(super) fn label(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

/// A read of `key` under a lease of `lease_ms` granted at `granted` that ends now: an
/// error when it outlasted the lease (its bytes may have been overwritten meanwhile).
pub(super) fn lease_check(key: &str, granted: Instant, lease_ms: u64) -> StoreResult<()> {
    let elapsed = granted.elapsed().as_millis() as u64;
    if elapsed < lease_ms {
        Ok(())
    } else {
        Err(StoreError::LeaseExpired {
            key: key.to_owned(),
            lease_ms,
            elapsed_ms: elapsed,
        })
    }
}

/// How a value of a put is under way.
#[derive(Clone, Copy)]
enum Kind {
    /// Its put-start failed.
    Failed,
    /// Started: ended or revoked at the end.
    Started,
    /// Written into this reservation: committed at the end.
    Reserved(u64),
}

/// Segments opened during one call, by endpoint: a batch touches few segments, so each is
/// looked up once.
#[derive(Default)]
pub(super) struct Opened(Vec<(String, Result<Segment, TransferError>)>);

/// The transfer engine instance a segment name carries: this client names its segment
/// `{endpoint}#{engine id}`, so a replica written to a node that has since restarted at
/// the same address is told apart from the new node's memory. `None` for other names.
pub(super) fn incarnation(segment: &str) -> Option<u64> {
    let (_, id) = segment.rsplit_once('#')?;
    u64::from_str_radix(id, 16).ok()
}

impl StoreClient {
    async fn open_endpoint(
        &self,
        opened: &mut Opened,
        endpoint: &str,
    ) -> Result<Segment, TransferError> {
        if let Some((_, r)) = opened.0.iter().find(|(e, _)| e == endpoint) {
            return r.clone();
        }
        let r = self.inner.engine.open_segment(endpoint).await;
        opened.0.push((endpoint.to_owned(), r.clone()));
        r
    }

    /// Opens the segment holding `replica` and checks it is the very engine instance the
    /// replica was allocated on (refetching a descriptor that predates a restart once): a
    /// node restarted at the same address must never serve its predecessor's objects.
    pub(super) async fn open_replica(
        &self,
        opened: &mut Opened,
        replica: &wire::Replica,
    ) -> Result<Segment, TransferError> {
        let seg = self.open_endpoint(opened, &replica.endpoint).await?;
        let Some(want) = incarnation(&replica.segment) else {
            return Ok(seg);
        };
        if seg.descriptor().engine_id == want {
            return Ok(seg);
        }
        self.inner.engine.close_segment(&replica.endpoint).await;
        opened.0.retain(|(e, _)| *e != replica.endpoint);
        let seg = self.open_endpoint(opened, &replica.endpoint).await?;
        if seg.descriptor().engine_id == want {
            return Ok(seg);
        }
        Err(TransferError::UnknownSegment {
            segment: replica.endpoint.clone(),
            reason: format!(
                "replica on {} belongs to an earlier instance of the node (it restarted)",
                replica.segment
            ),
        })
    }

    /// Opens the segments of `replicas`, nearest first (own segment, same host, remote);
    /// a replica whose segment cannot be opened keeps its error, last.
    pub(super) async fn candidates(
        &self,
        opened: &mut Opened,
        replicas: &[wire::Replica],
    ) -> Vec<Result<(Segment, u64), TransferError>> {
        let mut out = Vec::with_capacity(replicas.len());
        for r in replicas {
            out.push(self.open_replica(opened, r).await.map(|s| (s, r.address)));
        }
        out.sort_by_key(|c| match c {
            Ok((s, _)) if s.is_local() => 0,
            Ok((s, _)) if s.is_same_host() => 1,
            Ok(_) => 2,
            Err(_) => 3,
        });
        out
    }

    /// Submits `reqs` as one transfer batch; the outcome of each, in order.
    pub(super) async fn run_transfers(
        &self,
        reqs: Vec<TransferRequest>,
    ) -> Vec<Result<(), TransferError>> {
        let n = reqs.len();
        if n == 0 {
            return Vec::new();
        }
        match self.inner.engine.submit(reqs).await {
            Ok(batch) => batch.wait_all().await,
            Err(e) => vec![Err(e); n],
        }
    }

    /// A new nonzero id for one put-start request. Its RPC may send the request to more
    /// than one master (HA: the first did not answer in time, yet may have done it); the
    /// id lets the master recognise the repeat and answer the same replicas.
    pub(super) fn next_put_id(&self) -> u32 {
        loop {
            let id = self
                .inner
                .put_ids
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1);
            if id != 0 {
                return id;
            }
        }
    }

    /// Starts puts: the single-key route for one item, the batch route for more; asks for
    /// `reserve` along. Answers per item its replicas, then the reservations it got, then
    /// the master's `write_within_ms` (0: none given).
    pub(super) async fn put_starts(
        &self,
        items: &[(&str, u64)],
        reserve: Option<wire::ReserveRequest>,
    ) -> (
        Vec<StoreResult<Vec<wire::Replica>>>,
        Vec<wire::Reservation>,
        u64,
    ) {
        self.put_starts_as(items, reserve, self.next_put_id(), false)
            .await
    }

    /// [`StoreClient::put_starts`] under `put_id`; with `renew`, only renewals of this
    /// client's unfinished puts under that id (nothing allocated, nothing reserved).
    pub(super) async fn put_starts_as(
        &self,
        items: &[(&str, u64)],
        reserve: Option<wire::ReserveRequest>,
        put_id: u32,
        renew: bool,
    ) -> (
        Vec<StoreResult<Vec<wire::Replica>>>,
        Vec<wire::Reservation>,
        u64,
    ) {
        let rpc = &self.inner.rpc;
        let client_id = self.inner.id.to_string();
        if let [(key, length)] = items {
            let body = wire::PutStartRequest {
                client_id,
                length: *length,
                config: self.replicate.clone(),
                reserve,
                put_id,
                renew,
            };
            return match rpc.put_start(key, &body).await {
                Ok(r) => (vec![Ok(r.replicas)], r.reservations, r.write_within_ms),
                Err(e) => (vec![Err(e)], Vec::new(), 0),
            };
        }
        let body = wire::BatchPutStartRequest {
            client_id,
            items: items
                .iter()
                .map(|(k, l)| wire::BatchPutStartItem {
                    key: (*k).to_owned(),
                    length: *l,
                })
                .collect(),
            config: self.replicate.clone(),
            reserve,
            put_id,
            renew,
        };
        match rpc.batch_put_start(&body).await {
            Ok(r) => {
                let results = align(items.len(), r.results, |r| match (r.replicas, r.error) {
                    (_, Some(e)) => Err(item_error(e)),
                    (Some(reps), None) => Ok(reps),
                    (None, None) => Err(StoreError::Rpc {
                        url: rpc.base().to_owned(),
                        reason: format!(
                            "put-start of {:?} answered neither replicas nor error",
                            r.key
                        ),
                    }),
                });
                (results, r.reservations, r.write_within_ms)
            }
            Err(e) => (fail_all(items.len(), e), Vec::new(), 0),
        }
    }

    /// Ends (`end`) or revokes puts of `keys`, one request.
    pub(super) async fn put_finish(&self, keys: &[&str], end: bool) -> Vec<StoreResult<()>> {
        let rpc = &self.inner.rpc;
        let client_id = self.inner.id.to_string();
        match keys {
            [] => Vec::new(),
            [key] => {
                let body = wire::ClientRequest { client_id };
                vec![if end {
                    rpc.put_end(key, &body).await
                } else {
                    rpc.put_revoke(key, &body).await
                }]
            }
            _ => {
                let body = wire::BatchClientKeysRequest {
                    client_id,
                    keys: keys.iter().map(|k| (*k).to_owned()).collect(),
                };
                let r = if end {
                    rpc.batch_put_end(&body).await
                } else {
                    rpc.batch_put_revoke(&body).await
                };
                key_results(keys.len(), r)
            }
        }
    }

    /// The put pipeline for `items` (key, length, where the bytes are).
    async fn put_pipeline<'a>(
        &self,
        items: Vec<(&'a str, u64, Result<Side<'a>, StoreError>)>,
    ) -> Vec<StoreResult<()>> {
        self.put_items(items, true).await.0
    }

    /// The put pipeline: values with a reservation held for their length are written into
    /// it and committed; the others are started, written and ended. `reserve`: whether
    /// reservations are used and asked for (a value whose reservation turned out gone is
    /// put again without). Also answers whether every replica was written by a mapped copy
    /// (none went through the copy buffer and a transfer).
    async fn put_items<'a>(
        &self,
        items: Vec<(&'a str, u64, Result<Side<'a>, StoreError>)>,
        reserve: bool,
    ) -> (Vec<StoreResult<()>>, bool) {
        let mut out: Vec<StoreResult<()>> = Vec::with_capacity(items.len());
        let mut live = Vec::with_capacity(items.len()); // (index, key, side)
        for (i, (key, len, side)) in items.into_iter().enumerate() {
            match side {
                Ok(side) => {
                    out.push(Ok(()));
                    live.push((i, key, len, side));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        if live.is_empty() {
            return (out, false);
        }
        let t0 = Instant::now();
        let pool = &self.inner.reserved;
        let maker = Maker {
            index: self.inner.rpc.current_index(),
            view: self.inner.health.view_version(),
        };
        let held: Vec<Option<Held>> = live
            .iter()
            .map(|(_, _, len, _)| {
                reserve
                    .then(|| pool.take(*len, &self.replicate, maker))
                    .flatten()
            })
            .collect();
        // Ask for what this call would have used: its first eligible length, as many times
        // as it has values of that length.
        let mut ask = live
            .iter()
            .map(|(_, _, len, _)| *len)
            .find(|len| reserve && pool.eligible(*len))
            .and_then(|len| {
                let want = live.iter().filter(|x| x.2 == len).count();
                pool.ask(len, want, &self.replicate)
            });
        let starts: Vec<(&str, u64)> = live
            .iter()
            .zip(&held)
            .filter(|(_, h)| h.is_none())
            .map(|((_, key, len, _), _)| (*key, *len))
            .collect();
        // Until when the started values' replicas may be written, if the master said.
        let mut write_by = None;
        let mut started = if starts.is_empty() {
            Vec::new()
        } else {
            let asked = Instant::now();
            let (r, got, within) = self.put_starts(&starts, ask.take()).await;
            pool.add(got, &self.replicate, maker, asked);
            if within > 0 {
                write_by = asked.checked_add(std::time::Duration::from_millis(within));
            }
            r
        }
        .into_iter();
        let t_start = t0.elapsed();
        // Every replica of every value: (index into `live`, segment, address).
        let mut targets: Vec<(usize, Segment, u64)> = Vec::new();
        let mut kind = Vec::with_capacity(live.len());
        let mut opened = Opened::default();
        for (j, ((i, key, _, _), h)) in live.iter().zip(held).enumerate() {
            let (replicas, k) = match h {
                Some(h) => (Ok(h.replicas), Kind::Reserved(h.id)),
                None => {
                    let r = started.next().unwrap_or_else(|| {
                        Err(StoreError::Rpc {
                            url: String::new(),
                            reason: "put-start answered too few items".into(),
                        })
                    });
                    let k = if r.is_ok() {
                        Kind::Started
                    } else {
                        Kind::Failed
                    };
                    (r, k)
                }
            };
            kind.push(k);
            let replicas = match replicas {
                Ok(reps) => reps,
                Err(e) => {
                    out[*i] = Err(e);
                    continue;
                }
            };
            for c in self.candidates(&mut opened, &replicas).await {
                match c {
                    Ok((seg, addr)) => targets.push((j, seg, addr)),
                    Err(e) => out[*i] = Err(StoreError::transfer(key, e)),
                }
            }
        }
        if write_by.is_some_and(|by| Instant::now() >= by) {
            // Too late to write what the put-starts gave: a master that took over since
            // may hand that space out again. Nothing is written; the puts are revoked.
            let late = late_put_start(&self.inner.rpc, t0.elapsed());
            for (j, (i, ..)) in live.iter().enumerate() {
                if matches!(kind[j], Kind::Started) {
                    out[*i] = Err(late.clone());
                }
            }
            targets.retain(|(j, ..)| !matches!(kind[*j], Kind::Started));
        }
        // The replicas this engine maps of values in the caller's memory: written straight
        // from it, one copy each, all at once (spread over two threads).
        let bytes: Vec<Option<&[u8]>> = live
            .iter()
            .map(|(.., side)| match side {
                Side::Bytes(src, _) => Some(*src),
                _ => None,
            })
            .collect();
        let (mut direct, mut picks) = (Vec::new(), Vec::new());
        for (t, (j, seg, addr)) in targets.iter().enumerate() {
            if let Some(src) = bytes[*j] {
                direct.push((seg, *addr, src));
                picks.push(t);
            }
        }
        let mut written = vec![false; targets.len()];
        if !direct.is_empty() {
            for (t, r) in picks
                .into_iter()
                .zip(self.inner.engine.write_mapped_batch(&direct))
            {
                let (i, key, ..) = &live[targets[t].0];
                match r {
                    Some(Ok(())) => written[t] = true,
                    Some(Err(e)) => {
                        written[t] = true;
                        out[*i] = Err(StoreError::transfer(key, e));
                    }
                    None => {}
                }
            }
        }
        let mapped = !targets.is_empty() && written.iter().all(|w| *w);
        // The others, in one transfer batch (a put's bytes staged in the copy buffer first).
        let mut reqs = Vec::new();
        let mut owner = Vec::new(); // request -> index into `live`
        for ((j, seg, addr), _) in targets.iter().zip(&written).filter(|(_, w)| !**w) {
            let (i, _, len, side) = &mut live[*j];
            let (buf, off) = match side.staged(&self.inner.staging) {
                Ok(b) => b,
                Err(e) => {
                    out[*i] = Err(e);
                    continue;
                }
            };
            reqs.push(TransferRequest::new(
                Op::Write,
                &buf,
                off,
                seg,
                *addr,
                *len as usize,
            ));
            owner.push(*j);
        }
        for (.., side) in &mut live {
            side.arm();
        }
        let t_prep = t0.elapsed();
        let n_reqs = reqs.len();
        // Per value: whether a transfer of it was abandoned (its slot then waits out the
        // quarantine whatever else failed first).
        let mut gone = vec![false; live.len()];
        for (r, j) in self.run_transfers(reqs).await.into_iter().zip(owner) {
            let (i, key, ..) = &live[j];
            if let Err(e) = r {
                gone[j] |= abandoned(&e);
                if out[*i].is_ok() {
                    out[*i] = Err(StoreError::transfer(key, e));
                }
            }
        }
        let t_xfer = t0.elapsed();
        let (mut ends, mut revokes, mut commits) = (Vec::new(), Vec::new(), Vec::new());
        for (j, (i, key, len, side)) in live.iter_mut().enumerate() {
            side.settle(gone[j]);
            match (kind[j], out[*i].is_ok()) {
                (Kind::Started, true) => ends.push((*i, *key)),
                (Kind::Started, false) => revokes.push(*key),
                (Kind::Reserved(id), true) => commits.push((j, (*key, id, *len))),
                // A reservation written in vain is left to the master's TTL.
                (Kind::Reserved(_) | Kind::Failed, _) => {}
            }
        }
        let end_keys: Vec<&str> = ends.iter().map(|(_, k)| *k).collect();
        let commit_items: Vec<(&str, u64, u64)> = commits.iter().map(|(_, c)| *c).collect();
        let (ended, committed) = tokio::join!(
            self.put_finish(&end_keys, true),
            self.put_commits(&commit_items, ask, maker)
        );
        for ((i, _), r) in ends.iter().zip(ended) {
            out[*i] = r;
        }
        let mut again = vec![false; live.len()];
        for ((j, _), r) in commits.iter().zip(committed) {
            match r {
                Err(StoreError::Master(MasterError::ReservationNotFound(_))) => {
                    pool.clear();
                    again[*j] = true;
                }
                r => out[live[*j].0] = r,
            }
        }
        for (key, r) in revokes.iter().zip(self.put_finish(&revokes, false).await) {
            if let Err(e) = r {
                tracing::warn!(key, error = %e, "revoking a failed put failed; the master releases it after its timeout");
            }
        }
        tracing::debug!(
            items = live.len(),
            transfers = n_reqs,
            committed = commit_items.len(),
            put_start_us = t_start.as_micros() as u64,
            prep_us = (t_prep - t_start).as_micros() as u64,
            transfer_us = (t_xfer - t_prep).as_micros() as u64,
            put_end_us = (t0.elapsed() - t_xfer).as_micros() as u64,
            "put pipeline"
        );
        if again.contains(&true) {
            // Their reservations are gone (master restarted, failed over, or unmounted the
            // segment): put those values again, the two-request way.
            let mut redo = Vec::new();
            let mut at = Vec::new();
            for ((i, key, len, side), again) in live.into_iter().zip(again) {
                if again {
                    redo.push((key, len, Ok(side)));
                    at.push(i);
                }
            }
            let (results, _) = Box::pin(self.put_items(redo, false)).await;
            for (i, r) in at.into_iter().zip(results) {
                out[i] = r;
            }
        }
        (out, mapped)
    }

    /// Stores many values (copied): one put-start request, one transfer batch, one put-end
    /// request (and one put-revoke request for failures) per part of at most
    /// `STAGE_BYTES` (see `parts`); two parts are under way at once. A replica in memory
    /// this client's engine maps (its own segment, a same-host node's shared memory) is
    /// written straight from `items` (one copy; a part's copies at once, spread over two
    /// threads from 2 MiB); the others are staged in the copy buffer
    /// for their transfer (a 16 MiB `put` to a same-host node ran at 5.2 GB/s through the
    /// copy buffer where `put_from` ran at 11.6).
    ///
    /// Parts exist for the staged bytes (read back from cache, not memory). When every
    /// replica of the first part was a mapped copy, the rest goes in parts of up to
    /// `MAPPED_PART`, one after the other: a mapped copy holds the calling thread, so the
    /// next part's put-start waited behind it, and 4 MiB parts cost a 64 x 1 MiB
    /// `batch_put` into the own segment two master round trips per 4 MiB (0.70x
    /// `batch_put_from`).
    pub async fn batch_put<K: AsRef<str>, V: AsRef<[u8]>>(
        &self,
        items: &[(K, V)],
    ) -> Vec<StoreResult<()>> {
        if items.is_empty() {
            return Vec::new();
        }
        let sides = |range: std::ops::Range<usize>| -> Vec<_> {
            items[range]
                .iter()
                .map(|(k, v)| {
                    let v = v.as_ref();
                    (k.as_ref(), v.len() as u64, Ok(Side::Bytes(v, None)))
                })
                .collect()
        };
        let lens = |from: usize| items[from..].iter().map(|(_, v)| v.as_ref().len());
        let mut ranges = parts(lens(0), STAGE_BYTES);
        let first = ranges.remove(0);
        let rest = first.end;
        let (mut out, mapped) = self.put_items(sides(first), true).await;
        if mapped {
            for r in parts(lens(rest), MAPPED_PART) {
                let r = r.start + rest..r.end + rest;
                out.extend(self.put_pipeline(sides(r)).await);
            }
        } else if !ranges.is_empty() {
            let more: Vec<Vec<StoreResult<()>>> = futures::stream::iter(ranges)
                .map(|r| self.put_pipeline(sides(r)))
                .buffered(2)
                .collect()
                .await;
            out.extend(more.into_iter().flatten());
        }
        crate::metrics::record_client_batch(label(items.len(), "put", "batch_put"), &out);
        out
    }

    /// Stores many values straight from registered memory (zero-copy).
    pub async fn batch_put_from<K: AsRef<str>>(
        &self,
        items: &[(K, BufRange<'_>)],
    ) -> Vec<StoreResult<()>> {
        let sides = items
            .iter()
            .map(|(k, r)| {
                let k = k.as_ref();
                (
                    k,
                    r.len as u64,
                    r.check(k).map(|()| Side::Registered(r.buf, r.offset)),
                )
            })
            .collect();
        let out = self.put_pipeline(sides).await;
        crate::metrics::record_client_batch(label(items.len(), "put_from", "batch_put_from"), &out);
        out
    }
}

/// The error of puts whose put-start answered after its write window (`elapsed` after the
/// pipeline began).
fn late_put_start(rpc: &super::rpc::MasterRpc, elapsed: std::time::Duration) -> StoreError {
    StoreError::Rpc {
        url: rpc.base().to_owned(),
        reason: format!(
            "put-start answered too late to write ({} ms into the put): its space is safe \
             to write only within the master's write_within_ms of the request; not written, \
             revoked",
            elapsed.as_millis()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::incarnation;

    #[test]
    fn segment_names_carry_their_engine_instance() {
        assert_eq!(incarnation("10.0.0.1:7000#00000000000000ff"), Some(255));
        assert_eq!(incarnation("[::1]:7000#abc"), Some(0xabc));
        assert_eq!(incarnation("10.0.0.1:7000"), None);
        assert_eq!(incarnation("name#not-hex"), None);
    }
}
