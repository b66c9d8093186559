//! The prefill side: compute a room's KV, meet the decode's registration, write the pages
//! into the decode's memory, signal.
//!
//! A room is met from both ends in any order: the HTTP request (which computes the KV into
//! pages of this worker's pool) and the decode's `REGISTER` (its destination pages). Once
//! both are there, a transfer task (which outlives a cancelled HTTP request, so a decode
//! is never left guessing whether writes are still coming) writes the pages, waits for
//! every write to be acknowledged, and sends `DONE` with the checksums, or `FAILED`.
//! `ABORT` from the decode drops a room not yet being written (answered with `FAILED`). A
//! registration no request claims within the KV timeout is dropped with `FAILED`; a request
//! whose registration does not come within it fails. Every path gives the pages back.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;
use transfer::{Segment, TransferEngine, TransferRequest};

use super::kv::{self, Layout};
use super::pool::{KvPool, PageLease};
use super::wire::{self, Message};
use super::{Common, KvEvent, KvFail, KvItem};

/// A decode's destination pages for one room.
#[derive(Debug)]
struct Registration {
    decode: String,
    tokens: u32,
    page_tokens: u32,
    page_bytes: u32,
    runs: Vec<(u64, u32)>,
}

#[derive(Debug)]
enum Slot {
    /// The request is here, the registration is not.
    Waiting(oneshot::Sender<Result<Registration, String>>),
    /// The registration is here, the request is not.
    Registered(Registration, Instant),
    /// Both met; the request owns the room (`decode`: whom to tell if it fails).
    Active { aborted: bool, decode: String },
    /// The request ended before any decode registered: a late registration is answered
    /// `FAILED` at once (until the KV timeout).
    Gone { reason: String, at: Instant },
}

/// The prefill side of one worker.
#[derive(Debug)]
pub struct Prefill {
    common: Common,
    compute_per_token: Duration,
    rooms: Arc<Mutex<HashMap<u64, Slot>>>,
}

/// Removes a room the request gave up before its transfer started, telling the decode.
struct RoomGuard {
    rooms: Arc<Mutex<HashMap<u64, Slot>>>,
    engine: TransferEngine,
    room: u64,
    decode: Option<String>,
    armed: bool,
    reason: String,
}

impl Drop for RoomGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let reason = std::mem::take(&mut self.reason);
        let mut rooms = self.rooms.lock();
        match rooms.get(&self.room) {
            Some(Slot::Waiting(_)) => {
                let at = Instant::now();
                rooms.insert(
                    self.room,
                    Slot::Gone {
                        reason: reason.clone(),
                        at,
                    },
                );
            }
            Some(Slot::Active { .. }) => {
                rooms.remove(&self.room);
            }
            _ => {}
        }
        drop(rooms);
        if let Some(decode) = self.decode.take() {
            let engine = self.engine.clone();
            let msg = Message::Failed {
                room: self.room,
                reason,
            };
            tokio::spawn(async move { send(&engine, &decode, &msg).await });
        }
    }
}

/// Sends `msg` to `segment`, best effort (logged).
pub(super) async fn send(engine: &TransferEngine, segment: &str, msg: &Message) {
    let r = async {
        engine
            .notify(&engine.open_segment(segment).await?, &msg.encode())
            .await
    };
    if let Err(e) = r.await {
        tracing::debug!(peer = segment, room = msg.room(), error = %e, "KV message not delivered");
    }
}

impl Prefill {
    /// The prefill side over `common`'s pool.
    pub fn new(common: Common, compute_per_token: Duration) -> Self {
        Self {
            common,
            compute_per_token,
            rooms: Arc::default(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<KvPool> {
        &self.common.pool
    }

    /// Rooms in progress (either end arrived, not finished).
    pub fn rooms_open(&self) -> usize {
        let rooms = self.rooms.lock();
        rooms
            .values()
            .filter(|s| !matches!(s, Slot::Gone { .. }))
            .count()
    }

    /// A message from a decode worker (`from`: its segment).
    pub fn on_message(&self, from: String, msg: Message) {
        match msg {
            Message::Register {
                room,
                tokens,
                page_tokens,
                page_bytes,
                runs,
            } => {
                let reg = Registration {
                    decode: from,
                    tokens,
                    page_tokens,
                    page_bytes,
                    runs,
                };
                let mut rooms = self.rooms.lock();
                match rooms.remove(&room) {
                    Some(Slot::Waiting(tx)) => {
                        let decode = reg.decode.clone();
                        if let Err(Ok(reg)) = tx.send(Ok(reg)) {
                            // The request left just now: keep the registration for the sweep.
                            rooms.insert(room, Slot::Registered(reg, Instant::now()));
                        } else {
                            rooms.insert(
                                room,
                                Slot::Active {
                                    aborted: false,
                                    decode,
                                },
                            );
                        }
                    }
                    Some(other @ (Slot::Registered(..) | Slot::Active { .. })) => {
                        tracing::warn!(room, "duplicate KV registration ignored");
                        rooms.insert(room, other);
                    }
                    Some(Slot::Gone { reason, .. }) => self.fail_later(room, reg.decode, &reason),
                    None => {
                        rooms.insert(room, Slot::Registered(reg, Instant::now()));
                    }
                }
            }
            Message::Abort { room } => {
                let mut rooms = self.rooms.lock();
                match rooms.get_mut(&room) {
                    Some(Slot::Active { aborted, .. }) => *aborted = true,
                    Some(Slot::Registered(..)) => {
                        if let Some(Slot::Registered(reg, _)) = rooms.remove(&room) {
                            self.fail_later(room, reg.decode, "the decode side gave the room up");
                        }
                    }
                    Some(Slot::Waiting(_)) => {
                        if let Some(Slot::Waiting(tx)) = rooms.remove(&room) {
                            let _ = tx.send(Err("the decode side gave the room up".into()));
                        }
                    }
                    Some(Slot::Gone { .. }) => {
                        rooms.remove(&room);
                    }
                    None => {}
                }
            }
            other => tracing::debug!(
                room = other.room(),
                "unexpected KV message on a prefill worker"
            ),
        }
    }

    fn fail_later(&self, room: u64, decode: String, reason: &str) {
        let engine = self.common.engine.clone();
        let msg = Message::Failed {
            room,
            reason: reason.into(),
        };
        tokio::spawn(async move { send(&engine, &decode, &msg).await });
    }

    /// The decode that registered `room`, if the registration is known (so a failure can
    /// be reported to it).
    fn registered_decode(&self, room: u64) -> Option<String> {
        match self.rooms.lock().get(&room) {
            Some(Slot::Registered(reg, _)) => Some(reg.decode.clone()),
            Some(Slot::Active { decode, .. }) => Some(decode.clone()),
            _ => None,
        }
    }

    /// Drops registrations no request claimed within the KV timeout.
    pub fn sweep(&self) {
        let now = Instant::now();
        let stale: Vec<(u64, String)> = {
            let mut rooms = self.rooms.lock();
            let old: Vec<u64> = rooms
                .iter()
                .filter(|(_, s)| match s {
                    Slot::Registered(_, at) | Slot::Gone { at, .. } => {
                        now - *at > self.common.timeout
                    }
                    _ => false,
                })
                .map(|(r, _)| *r)
                .collect();
            old.into_iter()
                .filter_map(|r| match rooms.remove(&r) {
                    Some(Slot::Registered(reg, _)) => Some((r, reg.decode)),
                    _ => None,
                })
                .collect()
        };
        for (room, decode) in stale {
            self.fail_later(room, decode, "no prefill request arrived for the room");
        }
    }

    /// Computes and delivers one item's KV.
    pub async fn serve(self: &Arc<Self>, item: &KvItem) -> Result<(), KvFail> {
        let room = item.room;
        let (tx, rx) = oneshot::channel();
        let early = {
            let mut rooms = self.rooms.lock();
            match rooms.remove(&room) {
                Some(Slot::Registered(reg, _)) => {
                    let decode = reg.decode.clone();
                    rooms.insert(
                        room,
                        Slot::Active {
                            aborted: false,
                            decode,
                        },
                    );
                    Some(reg)
                }
                None | Some(Slot::Gone { .. }) => {
                    rooms.insert(room, Slot::Waiting(tx));
                    None
                }
                Some(other) => {
                    rooms.insert(room, other);
                    return Err(KvFail::Refused(format!(
                        "bootstrap room {room} is already in use"
                    )));
                }
            }
        };
        let mut guard = RoomGuard {
            rooms: self.rooms.clone(),
            engine: self.common.engine.clone(),
            room,
            decode: early.as_ref().map(|r| r.decode.clone()),
            armed: true,
            reason: "the prefill request was cancelled".into(),
        };
        let tokens = item.tokens.clone();
        let pages = self.common.layout.pages_for(tokens.len());
        let compute = async {
            let lease = self.common.pool.lease(pages).await?;
            let started = Instant::now();
            match item.lane_done {
                Some(done) => tokio::time::sleep_until(done).await,
                None => {
                    let work = self.compute_per_token.saturating_mul(tokens.len() as u32);
                    tokio::time::sleep(work).await;
                }
            }
            let (layout, pool) = (self.common.layout, self.common.pool.clone());
            let t = tokens.clone();
            let (lease, crcs) = tokio::task::spawn_blocking(move || {
                let crcs = compute_pages(&pool, &lease, layout, &t);
                (lease, crcs)
            })
            .await
            .map_err(|e| format!("KV compute failed: {e}"))?;
            Ok::<_, KvFail>((lease, crcs, started.elapsed()))
        };
        let registration = async {
            let reg = match early {
                Some(reg) => Ok(reg),
                None => match tokio::time::timeout(self.common.timeout, rx).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(_)) => Err("the room was dropped".into()),
                    Err(_) => Err(format!(
                        "no decode registered room {room} within {:?}",
                        self.common.timeout
                    )),
                },
            };
            reg.map_err(KvFail::Failed)
        };
        // The first failure of either stops the other (pages are waited for no longer).
        let ((lease, crcs, compute_time), reg) = match tokio::try_join!(compute, registration) {
            Ok(both) => both,
            Err(e) => {
                guard.decode = self.registered_decode(room);
                guard.reason = match &e {
                    KvFail::Refused(m) | KvFail::Failed(m) => m.clone(),
                };
                return Err(e);
            }
        };
        guard.decode = Some(reg.decode.clone());
        if reg.tokens as usize != tokens.len()
            || reg.page_tokens as usize != self.common.layout.page_tokens
            || reg.page_bytes as usize != self.common.layout.page_bytes()
        {
            guard.reason = "the KV layouts of the prefill and the decode differ".into();
            return Err(KvFail::Failed(format!(
                "the decode's KV layout ({} tokens, {} tokens of {} bytes per page) does not \
                 match this prefill's ({} tokens, {} tokens of {} bytes per page)",
                reg.tokens,
                reg.page_tokens,
                reg.page_bytes,
                tokens.len(),
                self.common.layout.page_tokens,
                self.common.layout.page_bytes()
            )));
        }
        // From here the transfer task owns the room: it ends it whatever happens to us.
        guard.armed = false;
        let me = self.clone();
        let task = tokio::spawn(async move {
            let r = me.deliver(room, &reg, &lease, tokens.len(), crcs).await;
            me.rooms.lock().remove(&room);
            drop(lease);
            match &r {
                Ok((bytes, took)) => me.common.stats.moved(tokens.len(), *bytes, *took),
                Err(e) => {
                    me.common.stats.failed();
                    let msg = Message::Failed {
                        room,
                        reason: e.clone(),
                    };
                    send(&me.common.engine, &reg.decode, &msg).await;
                }
            }
            if let Ok((bytes, took)) = &r {
                let _ = me.common.events.send(KvEvent {
                    room,
                    tokens: tokens.len(),
                    pages,
                    bytes: *bytes,
                    took: *took,
                    compute: compute_time,
                });
            }
            r.map(|_| ()).map_err(KvFail::Failed)
        });
        task.await
            .map_err(|e| format!("KV transfer task failed: {e}"))?
    }

    /// Writes the pages and signals `DONE`: `(bytes, transfer time)`.
    async fn deliver(
        &self,
        room: u64,
        reg: &Registration,
        lease: &PageLease,
        tokens: usize,
        crcs: Vec<u32>,
    ) -> Result<(u64, Duration), String> {
        if matches!(
            self.rooms.lock().get(&room),
            Some(Slot::Active { aborted: true, .. })
        ) {
            return Err("the decode side gave the room up".into());
        }
        let page_bytes = self.common.layout.page_bytes() as u64;
        let dst = wire::pages_of(&reg.runs, page_bytes, lease.pages().len())
            .map_err(|e| format!("the decode's registration for {tokens} tokens: {}", e.0))?;
        let peer: Segment = self
            .common
            .engine
            .open_segment(&reg.decode)
            .await
            .map_err(|e| format!("decode {} unreachable: {e}", reg.decode))?;
        let requests = coalesce(
            &self.common.pool,
            lease,
            &dst,
            self.common.layout,
            tokens,
            &peer,
        );
        let bytes: u64 = requests.iter().map(|r| r.len as u64).sum();
        let started = Instant::now();
        let batch = self
            .common
            .engine
            .submit(requests)
            .await
            .map_err(|e| format!("writing KV to decode {} failed: {e}", reg.decode))?;
        batch
            .wait()
            .await
            .map_err(|e| format!("writing KV to decode {} failed: {e}", reg.decode))?;
        let took = started.elapsed();
        let group = kv::checksum_group(lease.pages().len(), MAX_CRCS) as u32;
        let done = Message::Done {
            room,
            group,
            crcs: kv::group_checksums(&crcs, group as usize),
        };
        self.common
            .engine
            .notify(&peer, &done.encode())
            .await
            .map_err(|e| format!("signalling decode {} failed: {e}", reg.decode))?;
        Ok((bytes, took))
    }
}

/// Most checksums in one `DONE` (it must fit in a notification).
pub const MAX_CRCS: usize = (wire::MAX_MESSAGE - 64) / 4;

/// Fills the leased pages with the prompt's KV; returns each page's CRC-32.
fn compute_pages(pool: &KvPool, lease: &PageLease, layout: Layout, tokens: &[u32]) -> Vec<u32> {
    let chains = kv::chains(tokens);
    let mut scratch = vec![0u8; layout.page_bytes()];
    lease
        .pages()
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let used = layout.used_bytes(i, tokens.len());
            layout.fill_page(&mut scratch[..used], i, tokens, &chains);
            // The region is this pool's own and the offset in bounds: this cannot fail.
            let _ = pool.buffer().write_at(pool.offset(p), &scratch[..used]);
            crc32fast::hash(&scratch[..used])
        })
        .collect()
}

/// One write per run of pages contiguous on both sides (a partial last page included).
fn coalesce(
    pool: &KvPool,
    lease: &PageLease,
    dst: &[u64],
    layout: Layout,
    tokens: usize,
    peer: &Segment,
) -> Vec<TransferRequest> {
    let page = layout.page_bytes();
    let mut out: Vec<TransferRequest> = Vec::new();
    let mut run: Option<(usize, u64, usize)> = None; // (src offset, dst addr, len)
    for (i, (&src, &d)) in lease.pages().iter().zip(dst).enumerate() {
        let used = layout.used_bytes(i, tokens);
        let off = pool.offset(src);
        run = match run {
            Some((s, a, len))
                if s + len == off && a.checked_add(len as u64) == Some(d) && len % page == 0 =>
            {
                Some((s, a, len + used))
            }
            Some((s, a, len)) => {
                out.push(TransferRequest::write(pool.buffer(), s, peer, a, len));
                Some((off, d, used))
            }
            None => Some((off, d, used)),
        };
    }
    if let Some((s, a, len)) = run {
        out.push(TransferRequest::write(pool.buffer(), s, peer, a, len));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn prefill(timeout: Duration) -> (Arc<Prefill>, TransferEngine) {
        let common = Common::for_tests(8, timeout).await;
        let engine = common.engine.clone();
        (Arc::new(Prefill::new(common, Duration::ZERO)), engine)
    }

    #[tokio::test(start_paused = true)]
    async fn registrations_nobody_claims_expire_after_the_kv_timeout() {
        let (p, _engine) = prefill(Duration::from_secs(5)).await;
        let reg = Message::Register {
            room: 9,
            tokens: 4,
            page_tokens: 4,
            page_bytes: 512,
            runs: vec![(0x1000, 1)],
        };
        p.on_message("127.0.0.1:9".into(), reg);
        assert_eq!(p.rooms_open(), 1);
        tokio::time::advance(Duration::from_secs(4)).await;
        p.sweep();
        assert_eq!(p.rooms_open(), 1, "kept within the timeout");
        tokio::time::advance(Duration::from_secs(2)).await;
        p.sweep();
        assert_eq!(p.rooms_open(), 0, "dropped after it");
        // An abort drops a registration at once.
        p.on_message(
            "127.0.0.1:9".into(),
            Message::Register {
                room: 10,
                tokens: 4,
                page_tokens: 4,
                page_bytes: 512,
                runs: vec![(0x1000, 1)],
            },
        );
        p.on_message("127.0.0.1:9".into(), Message::Abort { room: 10 });
        assert_eq!(p.rooms_open(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_whose_decode_never_registers_fails_and_frees_everything() {
        let (p, _engine) = prefill(Duration::from_secs(5)).await;
        let item = KvItem {
            room: 3,
            addr: "127.0.0.1:1".into(),
            tokens: Arc::from(vec![7u32; 10]),
            lane_done: None,
        };
        let err = p.serve(&item).await.unwrap_err();
        assert!(
            matches!(&err, KvFail::Failed(m) if m.contains("no decode registered")),
            "{err:?}"
        );
        assert_eq!(p.rooms_open(), 0);
        assert_eq!(p.pool().free_pages(), 8);
        // A prompt larger than the whole pool is refused, not waited for.
        let big = KvItem {
            tokens: Arc::from(vec![7u32; 33]),
            ..item
        };
        let served = {
            let p = p.clone();
            tokio::spawn(async move { p.serve(&big).await })
        };
        tokio::task::yield_now().await;
        p.on_message(
            "127.0.0.1:9".into(),
            Message::Register {
                room: 3,
                tokens: 33,
                page_tokens: 4,
                page_bytes: 512,
                runs: vec![(0x1000, 9)],
            },
        );
        assert!(matches!(served.await.unwrap(), Err(KvFail::Refused(_))));
        // The registration came after the request failed: answered FAILED, not kept.
        assert_eq!((p.rooms_open(), p.pool().free_pages()), (0, 8));
        assert!(p.rooms.lock().is_empty());
    }
}
