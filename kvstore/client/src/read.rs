//! The get pipeline: one lookup request (the master grants a read lease per object), one
//! transfer batch reading every object from its nearest replica (more rounds only for
//! replicas that fail), then a check of every lease held to the end of the read.
//!
//! A big batch is not cut into parts whose lookups run while the part before is read.
//! Tried on 64 x 1 MiB `batch_get_into` from the own segment (parts of 4, 16 and 44 keys):
//! no gain on this project's 2-vCPU VMs (18.1-19.2 GB/s against 18.4-19.7 unpipelined),
//! since the copy takes both CPUs and the memory bus, and the caller-driven master
//! connection sends a request only once the caller's thread is free of the copy.

use std::time::Instant;

use futures::StreamExt;
use openapi::master::{self as wire, MasterError};
use transfer::{Op, TransferError, TransferRequest};

use super::disk::{DiskError, DiskStore};
use super::error::{StoreError, StoreResult};
use super::io::{Opened, Side, abandoned, label, lease_check};
use super::results::{align, fail_all};
use super::rpc::item_error;
use super::{BufRange, StoreClient};

/// Replicas of an object to read, with the lease that protects the read.
pub(super) struct Lookup {
    pub(super) length: u64,
    pub(super) lease_ms: u64,
    pub(super) replicas: Vec<wire::Replica>,
    /// Release the read when done (a memory copy of a value on disk).
    pub(super) release: bool,
}

impl Lookup {
    /// Whether the value lies on the disk tier below `own` (this client's segment): the
    /// master answered that disk instead of reading it back into memory.
    pub(super) fn on_own_disk(&self, own: Option<&str>) -> bool {
        matches!(self.replicas.as_slice(), [r] if r.kind == wire::ReplicaKind::LocalDisk
            && own == Some(r.segment.as_str()))
    }
}

impl StoreClient {
    /// Looks objects up (granting read leases): single-key or batch route.
    pub(super) async fn lookups(&self, keys: &[&str]) -> Vec<StoreResult<Lookup>> {
        let rpc = &self.inner.rpc;
        // With a disk tier of its own, the client reads the values there itself.
        let reader = self.inner.disk.as_ref().map(|_| wire::ReplicasQuery {
            reader: Some(self.inner.id.to_string()),
        });
        if let [key] = keys {
            return vec![rpc.replicas(key, reader.as_ref()).await.map(|r| Lookup {
                length: r.length,
                lease_ms: r.lease_ttl_ms,
                replicas: r.replicas,
                release: r.release,
            })];
        }
        let body = wire::BatchKeysRequest {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        };
        match rpc.batch_replicas(&body, reader.as_ref()).await {
            Ok(r) => align(keys.len(), r.results, |r| {
                match (r.error, r.length, r.lease_ttl_ms, r.replicas) {
                    (Some(e), ..) => Err(item_error(e)),
                    (None, Some(length), Some(lease_ms), Some(replicas)) => Ok(Lookup {
                        length,
                        lease_ms,
                        replicas,
                        release: r.release,
                    }),
                    _ => Err(StoreError::Rpc {
                        url: rpc.base().to_owned(),
                        reason: format!(
                            "replicas of {:?} answered without length, lease or replicas",
                            r.key
                        ),
                    }),
                }
            }),
            Err(e) => fail_all(keys.len(), e),
        }
    }

    /// Where each of `keys` lies: its length and replicas, as the master answers a read
    /// lookup (granting a read lease, as Mooncake's `get_replica_desc` does).
    pub async fn replicas_of(&self, keys: &[&str]) -> Vec<StoreResult<(u64, Vec<wire::Replica>)>> {
        self.lookups(keys)
            .await
            .into_iter()
            .map(|r| r.map(|l| (l.length, l.replicas)))
            .collect()
    }

    /// Where each of `keys` lies as the master holds it, in memory and on disk
    /// ([`wire::ReplicaKind`]), without a lease and without reading anything back from
    /// disk (Mooncake's replica descriptions of `LOCAL_DISK` replicas).
    pub async fn describe_replicas(
        &self,
        keys: &[&str],
    ) -> Vec<StoreResult<(u64, Vec<wire::Replica>)>> {
        let rpc = &self.inner.rpc;
        let body = wire::BatchKeysRequest {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        };
        match rpc.replica_descs(&body).await {
            Ok(r) => align(keys.len(), r.results, |r| {
                match (r.error, r.length, r.replicas) {
                    (Some(e), ..) => Err(item_error(e)),
                    (None, Some(length), Some(replicas)) => Ok((length, replicas)),
                    _ => Err(StoreError::Rpc {
                        url: rpc.base().to_owned(),
                        reason: format!("description of {:?} answered without replicas", r.key),
                    }),
                }
            }),
            Err(e) => fail_all(keys.len(), e),
        }
    }

    /// The get pipeline: looks every key up, reads each from its nearest replica (trying
    /// the next replica of those that fail), then checks every lease held to the end.
    /// `dest(i, length)` says where object `i` goes once its length is known.
    async fn get_pipeline<'a>(
        &self,
        keys: &[&'a str],
        dest: impl FnMut(usize, u64) -> StoreResult<Side<'a>>,
    ) -> Vec<StoreResult<(u64, Side<'a>)>> {
        let granted = Instant::now();
        let looked = self.lookups(keys).await;
        self.read_looked(keys, looked, granted, dest).await
    }

    /// The get pipeline after its lookups (`looked`, granted at `granted`): reads each
    /// object from its nearest replica (trying the next replica of those that fail), then
    /// checks every lease held to the end.
    pub(super) async fn read_looked<'a>(
        &self,
        keys: &[&'a str],
        looked: Vec<StoreResult<Lookup>>,
        granted: Instant,
        mut dest: impl FnMut(usize, u64) -> StoreResult<Side<'a>>,
    ) -> Vec<StoreResult<(u64, Side<'a>)>> {
        let t_lookup = granted.elapsed();
        let mut out: Vec<StoreResult<(u64, Side<'a>)>> = Vec::with_capacity(keys.len());
        let mut pending = Vec::new(); // (index, candidates, next candidate, lease ms)
        let mut opened = Opened::default();
        // Reads of memory copies of values on disk, released once done (so their memory
        // can go before the lease ends).
        let mut release: Vec<String> = Vec::new();
        // Values on this client's own disk tier: (index, lease ms), read from the disk.
        let mut own_disk = Vec::new();
        let own = self.inner.segment.as_ref().map(|(_, s)| s.name.as_str());
        for (i, r) in looked.into_iter().enumerate() {
            let item = r.and_then(|l| {
                let side = dest(i, l.length)?;
                Ok((l, side))
            });
            match item {
                Ok((l, mut side)) => {
                    if l.release {
                        release.push(keys[i].to_owned());
                    }
                    side.arm();
                    out.push(Ok((l.length, side)));
                    if l.on_own_disk(own) {
                        own_disk.push((i, l.lease_ms));
                        continue;
                    }
                    pending.push((
                        i,
                        self.candidates(&mut opened, &l.replicas).await,
                        0usize,
                        l.lease_ms,
                    ));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        let t_prep = granted.elapsed();
        self.read_own_disk(keys, &mut out, own_disk, granted).await;
        // Rounds: each pending object's next candidate, all in one transfer batch.
        let mut last_err: Vec<Option<TransferError>> = vec![None; keys.len()];
        // Whether any round's transfer of an object was abandoned (see `Side::settle`).
        let mut gone = vec![false; keys.len()];
        while !pending.is_empty() {
            let mut reqs = Vec::new();
            let mut round = Vec::new();
            for (i, cands, next, _) in pending.iter_mut() {
                while *next < cands.len() {
                    let c = &cands[*next];
                    *next += 1;
                    match c {
                        Ok((seg, addr)) => {
                            let Ok((len, side)) = &out[*i] else { break };
                            let (buf, off) = side.buf_offset();
                            reqs.push(TransferRequest::new(
                                Op::Read,
                                buf,
                                off,
                                seg,
                                *addr,
                                *len as usize,
                            ));
                            round.push(*i);
                            break;
                        }
                        Err(e) => last_err[*i] = Some(e.clone()),
                    }
                }
            }
            let mut done = vec![false; keys.len()];
            for (r, i) in self.run_transfers(reqs).await.into_iter().zip(&round) {
                match r {
                    Ok(()) => done[*i] = true,
                    Err(e) => {
                        gone[*i] |= abandoned(&e);
                        last_err[*i] = Some(e);
                    }
                }
            }
            pending.retain(|(i, cands, next, lease_ms)| {
                let i = *i;
                let r = if done[i] {
                    lease_check(keys[i], granted, *lease_ms)
                } else if *next < cands.len() {
                    return true;
                } else {
                    let e = last_err[i]
                        .take()
                        .unwrap_or_else(|| TransferError::UnknownSegment {
                            segment: String::new(),
                            reason: "no replica to read".into(),
                        });
                    Err(StoreError::transfer(keys[i], e))
                };
                if let Ok((_, side)) = &mut out[i] {
                    side.settle(gone[i]);
                }
                if let Err(e) = r {
                    out[i] = Err(e);
                }
                false
            });
        }
        self.release_reads(release).await;
        tracing::debug!(
            items = keys.len(),
            lookup_us = t_lookup.as_micros() as u64,
            prep_us = (t_prep - t_lookup).as_micros() as u64,
            transfer_us = (granted.elapsed() - t_prep).as_micros() as u64,
            "get pipeline"
        );
        out
    }

    /// Reads the values the master answered as lying on this client's own disk tier
    /// (`items`: index, lease ms) straight into their destinations.
    async fn read_own_disk(
        &self,
        keys: &[&str],
        out: &mut [StoreResult<(u64, Side<'_>)>],
        items: Vec<(usize, u64)>,
        granted: Instant,
    ) {
        let items = items
            .into_iter()
            .filter_map(|(i, lease_ms)| {
                let Ok((len, side)) = &out[i] else {
                    return None;
                };
                let (buf, off) = side.buf_offset();
                let (buf, len) = (buf.clone(), *len as usize);
                let read = move |disk: &DiskStore, key: &str| disk.read_into(key, &buf, off, len);
                Some((i, lease_ms, read))
            })
            .collect();
        for (i, r) in self.on_own_disk(keys, items, granted).await {
            if let Ok((_, side)) = &mut out[i] {
                side.settle(false);
            }
            if let Err(e) = r {
                out[i] = Err(e);
            }
        }
    }

    /// Runs each item's `read` ((index, lease ms, read)) of a value on this client's own
    /// disk tier on a blocking thread, up to the tier's queue depth at once; answers each
    /// index with its outcome, the lease checked. A record gone or failing its checks is a
    /// miss.
    pub(super) async fn on_own_disk<T, F>(
        &self,
        keys: &[&str],
        items: Vec<(usize, u64, F)>,
        granted: Instant,
    ) -> Vec<(usize, StoreResult<T>)>
    where
        T: Send + 'static,
        F: FnOnce(&DiskStore, &str) -> Result<T, DiskError> + Send + 'static,
    {
        let Some(disk) = &self.inner.disk else {
            let gone = || StoreError::Master(MasterError::ObjectNotFound("no disk tier".into()));
            return items.into_iter().map(|(i, ..)| (i, Err(gone()))).collect();
        };
        // One read, by a caller driving its own runtime (the Python wheel): on its own
        // thread, sparing the hand-off to a blocking thread and back.
        let inline = items.len() == 1 && crate::caller::active();
        let reads = items.into_iter().map(|(i, lease_ms, read)| {
            let (disk, key) = (disk.clone(), keys[i].to_owned());
            async move {
                let r = if inline {
                    Ok(read(&disk, &key))
                } else {
                    tokio::task::spawn_blocking(move || read(&disk, &key)).await
                };
                (i, lease_ms, r)
            }
        });
        let done: Vec<_> = futures::stream::iter(reads)
            .buffer_unordered(crate::disk::QUEUE_DEPTH)
            .collect()
            .await;
        done.into_iter()
            .map(|(i, lease_ms, r)| {
                let key = keys[i];
                let miss = |why: String| {
                    StoreError::Master(MasterError::ObjectNotFound(format!("{key}: {why}")))
                };
                let r = match r {
                    Ok(Ok(v)) => lease_check(key, granted, lease_ms).map(|()| v),
                    Ok(Err(e)) => {
                        if !matches!(e, DiskError::Missing(_) | DiskError::Corrupt { .. }) {
                            tracing::warn!(key, error = %e, "reading from the own disk tier failed: a miss");
                        }
                        Err(miss(e.to_string()))
                    }
                    Err(e) => Err(miss(format!("the disk read stopped: {e}"))),
                };
                (i, r)
            })
            .collect()
    }

    /// Tells the master these reads of memory copies of values on disk are over (each
    /// once), so their memory can go before their leases end. A failure only leaves the
    /// leases to end on their own.
    pub(super) async fn release_reads(&self, keys: Vec<String>) {
        if keys.is_empty() {
            return;
        }
        let body = wire::BatchKeysRequest { keys };
        if let Err(e) = self.inner.rpc.release_reads(&body).await {
            tracing::debug!(error = %e, "releasing reads failed; their leases end on their own");
        }
    }

    pub(super) fn copy_side(&self, len: u64) -> StoreResult<Side<'static>> {
        let len = usize::try_from(len).map_err(|_| {
            StoreError::InvalidArgument(format!("{len} bytes do not fit in memory"))
        })?;
        Ok(Side::Copy(self.inner.staging.slot(len)?))
    }

    /// Reads many values straight into registered memory (zero-copy); each destination
    /// must have room for its value. Returns each value's length.
    pub async fn batch_get_into<K: AsRef<str>>(
        &self,
        items: &[(K, BufRange<'_>)],
    ) -> Vec<StoreResult<u64>> {
        if items.is_empty() {
            return Vec::new();
        }
        let ks: Vec<&str> = items.iter().map(|(k, _)| k.as_ref()).collect();
        let got = self
            .get_pipeline(&ks, |i, len| {
                let (key, r) = (ks[i], &items[i].1);
                r.check(key)?;
                if len > r.len as u64 {
                    return Err(StoreError::BufferOverflow {
                        key: key.to_owned(),
                        need: len,
                        have: r.len as u64,
                    });
                }
                Ok(Side::Registered(r.buf, r.offset))
            })
            .await;
        let out: Vec<_> = got.into_iter().map(|r| r.map(|(len, _)| len)).collect();
        crate::metrics::record_client_batch(label(items.len(), "get_into", "batch_get_into"), &out);
        out
    }
}
