//! The decode side: find the prefill, take destination pages, register them for the room,
//! wait for the prefill's signal, check every page.
//!
//! Waiting ends with `DONE` (then every page is checked against the checksums and against
//! the token headers this worker computes from its own prompt), `FAILED`, the prefill's
//! heartbeats stopping, or the KV timeout. Pages the prefill may still be writing are
//! never handed to another request: a room given up before `DONE` (timeout, or the request
//! cancelled) sends `ABORT` and keeps its pages in quarantine until the prefill answers
//! for the room (`DONE` or `FAILED`), its heartbeats stop, or twice the KV timeout passed
//! (the prefill's own bound on a room: waiting for its request, then writing).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;
use transfer::TransferEngine;

use super::bootstrap::{Links, PrefillLink};
use super::kv::{self, Layout};
use super::pool::{KvPool, PageLease};
use super::prefill::send;
use super::wire::{self, Message};
use super::{Common, KvEvent, KvFail, KvItem};

/// How a room's wait ended, from the prefill.
type Outcome = Result<(u32, Vec<u32>), String>;

#[derive(Debug)]
struct Quarantined {
    _lease: PageLease,
    link: Arc<PrefillLink>,
    since: Instant,
}

#[derive(Debug, Default)]
struct Rooms {
    waiting: HashMap<u64, oneshot::Sender<Outcome>>,
    quarantine: HashMap<u64, Quarantined>,
}

/// The decode side of one worker.
#[derive(Debug)]
pub struct Decode {
    common: Common,
    links: Arc<Links>,
    rooms: Arc<Mutex<Rooms>>,
}

/// Gives up a room whose wait did not end with `DONE`.
struct WaitGuard {
    rooms: Arc<Mutex<Rooms>>,
    engine: TransferEngine,
    room: u64,
    link: Arc<PrefillLink>,
    lease: Option<PageLease>,
    registered: bool,
}

impl WaitGuard {
    /// The pages, the wait having ended with `DONE`.
    fn take(mut self) -> Option<PageLease> {
        self.rooms.lock().waiting.remove(&self.room);
        self.lease.take()
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let mut rooms = self.rooms.lock();
        rooms.waiting.remove(&self.room);
        if !self.registered || self.link.dead.is_cancelled() {
            return;
        }
        // The prefill may still write into these pages: keep them until it answers.
        rooms.quarantine.insert(
            self.room,
            Quarantined {
                _lease: lease,
                link: self.link.clone(),
                since: Instant::now(),
            },
        );
        drop(rooms);
        let (engine, segment, msg) = (
            self.engine.clone(),
            self.link.segment.clone(),
            Message::Abort { room: self.room },
        );
        tokio::spawn(async move { send(&engine, &segment, &msg).await });
    }
}

impl Decode {
    /// The decode side over `common`'s pool, finding prefills through `links`.
    pub fn new(common: Common, links: Arc<Links>) -> Self {
        Self {
            common,
            links,
            rooms: Arc::default(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<KvPool> {
        &self.common.pool
    }

    /// Rooms waiting for KV, and rooms in quarantine.
    pub fn rooms_open(&self) -> usize {
        let r = self.rooms.lock();
        r.waiting.len() + r.quarantine.len()
    }

    /// A message from a prefill worker.
    pub fn on_message(&self, msg: Message) {
        let (room, outcome) = match msg {
            Message::Done { room, group, crcs } => (room, Ok((group, crcs))),
            Message::Failed { room, reason } => (room, Err(reason)),
            other => {
                tracing::debug!(
                    room = other.room(),
                    "unexpected KV message on a decode worker"
                );
                return;
            }
        };
        let mut rooms = self.rooms.lock();
        if rooms.quarantine.remove(&room).is_some() {
            return;
        }
        if let Some(tx) = rooms.waiting.remove(&room) {
            let _ = tx.send(outcome);
        }
    }

    /// Releases quarantined pages whose prefill died or whose time is up.
    pub fn sweep(&self) {
        let limit = self.common.timeout * 2;
        self.rooms
            .lock()
            .quarantine
            .retain(|_, q| !q.link.dead.is_cancelled() && q.since.elapsed() < limit);
    }

    /// Receives one item's KV into pages of the pool; the pages are the caller's until it
    /// drops them (when its answer ends).
    pub async fn receive(&self, item: &KvItem) -> Result<PageLease, KvFail> {
        let started = Instant::now();
        let room = item.room;
        let link = self.links.get(&item.addr).await?;
        if link.page_size as usize != self.common.layout.page_tokens {
            return Err(KvFail::Failed(format!(
                "prefill {} uses pages of {} tokens, this decode worker {}",
                link.addr, link.page_size, self.common.layout.page_tokens
            )));
        }
        let tokens = &item.tokens;
        let n = self.common.layout.pages_for(tokens.len());
        let lease = tokio::select! {
            l = self.common.pool.lease(n) => l?,
            _ = link.dead.cancelled() => return Err(dead(&link).into()),
            _ = tokio::time::sleep(self.common.timeout) => {
                return Err(format!("no KV pages free within {:?}", self.common.timeout).into());
            }
        };
        let (tx, rx) = oneshot::channel();
        {
            let mut rooms = self.rooms.lock();
            if rooms.waiting.contains_key(&room) || rooms.quarantine.contains_key(&room) {
                return Err(KvFail::Refused(format!(
                    "bootstrap room {room} is already in use"
                )));
            }
            rooms.waiting.insert(room, tx);
        }
        let addrs = lease.pages().iter().map(|&p| self.common.pool.addr(p));
        let register = Message::Register {
            room,
            tokens: tokens.len() as u32,
            page_tokens: self.common.layout.page_tokens as u32,
            page_bytes: self.common.layout.page_bytes() as u32,
            runs: wire::runs(addrs, self.common.layout.page_bytes() as u64),
        };
        let mut guard = WaitGuard {
            rooms: self.rooms.clone(),
            engine: self.common.engine.clone(),
            room,
            link: link.clone(),
            lease: Some(lease),
            registered: false,
        };
        let msg = register.encode();
        if msg.len() > wire::MAX_MESSAGE {
            return Err(format!("{n} scattered KV pages do not fit in one registration").into());
        }
        let peer = self
            .common
            .engine
            .open_segment(&link.segment)
            .await
            .map_err(|e| format!("prefill KV endpoint {} unreachable: {e}", link.segment))?;
        guard.registered = true;
        self.common.engine.notify(&peer, &msg).await.map_err(|e| {
            format!(
                "registering pages with prefill {} failed: {e}",
                link.segment
            )
        })?;
        let outcome = tokio::select! {
            o = rx => o.unwrap_or_else(|_| Err("the room was dropped".into())),
            _ = link.dead.cancelled() => Err(dead(&link)),
            _ = tokio::time::sleep(self.common.timeout) => {
                // The prefill may still be writing: the guard quarantines the pages.
                self.common.stats.failed();
                return Err(format!("no KV arrived for room {room} within {:?}", self.common.timeout).into());
            }
        };
        let (group, sums) = match outcome {
            Ok(done) => done,
            Err(e) => {
                // The prefill said it stopped, or is dead: nothing more will be written.
                self.common.stats.failed();
                guard.registered = false;
                return Err(e.into());
            }
        };
        let waited = started.elapsed();
        let lease = guard.take().ok_or("the pages were lost")?;
        let (pool, layout, toks) = (self.common.pool.clone(), self.common.layout, tokens.clone());
        let (lease, check) = tokio::task::spawn_blocking(move || {
            let r = verify(&pool, &lease, layout, &toks, group as usize, &sums);
            (lease, r)
        })
        .await
        .map_err(|e| format!("KV check failed: {e}"))?;
        if let Err(e) = check {
            self.common.stats.failed();
            return Err(e.into());
        }
        let bytes = (tokens.len() * self.common.layout.bytes_per_token) as u64;
        self.common.stats.moved(tokens.len(), bytes, waited);
        let _ = self.common.events.send(KvEvent {
            room,
            tokens: tokens.len(),
            pages: n,
            bytes,
            took: waited,
            compute: Duration::ZERO,
        });
        Ok(lease)
    }
}

fn dead(link: &PrefillLink) -> String {
    format!("prefill {} stopped answering heartbeats", link.addr)
}

/// Checks every page against the checksums and the token headers.
fn verify(
    pool: &KvPool,
    lease: &PageLease,
    layout: Layout,
    tokens: &[u32],
    group: usize,
    sums: &[u32],
) -> Result<(), String> {
    let chains = kv::chains(tokens);
    let mut scratch = vec![0u8; layout.page_bytes()];
    let mut crcs = Vec::with_capacity(lease.pages().len());
    for (i, &p) in lease.pages().iter().enumerate() {
        let used = layout.used_bytes(i, tokens.len());
        pool.buffer()
            .read_at(pool.offset(p), &mut scratch[..used])
            .map_err(|e| format!("reading KV page {i}: {e}"))?;
        if !layout.page_matches(&scratch[..used], i, tokens, &chains) {
            return Err(format!("KV page {i} does not hold this prompt's tokens"));
        }
        crcs.push(crc32fast::hash(&scratch[..used]));
    }
    let got = kv::group_checksums(&crcs, group);
    if got != sums {
        let bad = got.iter().zip(sums).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "KV checksum mismatch in page group {bad} ({} groups received, {} computed)",
            sums.len(),
            got.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pd::bootstrap::Heartbeat;
    use gateway::client::HttpClient;
    use tokio_util::sync::CancellationToken;

    #[tokio::test(start_paused = true)]
    async fn quarantined_pages_come_back_when_the_prefill_answers_dies_or_times_out() {
        let timeout = Duration::from_secs(5);
        let hb = Heartbeat {
            interval: Duration::from_secs(1),
            max_failures: 2,
        };
        let links = Arc::new(Links::new(HttpClient::new(), hb, CancellationToken::new()));
        let common = Common::for_tests(6, timeout).await;
        let pool = common.pool.clone();
        let d = Decode::new(common, links);
        let link = || {
            Arc::new(PrefillLink {
                addr: "127.0.0.1:1".into(),
                segment: "127.0.0.1:2".into(),
                page_size: 4,
                dead: CancellationToken::new(),
            })
        };
        let quarantine = |room: u64, link: &Arc<PrefillLink>, lease: PageLease| {
            d.rooms.lock().quarantine.insert(
                room,
                Quarantined {
                    _lease: lease,
                    link: link.clone(),
                    since: Instant::now(),
                },
            );
        };
        let (a, b, c) = (link(), link(), link());
        quarantine(1, &a, pool.lease(2).await.unwrap());
        quarantine(2, &b, pool.lease(2).await.unwrap());
        quarantine(3, &c, pool.lease(2).await.unwrap());
        assert_eq!((pool.free_pages(), d.rooms_open()), (0, 3));
        // The prefill answers for room 1: its pages are safe to reuse.
        d.on_message(Message::Failed {
            room: 1,
            reason: "gave up".into(),
        });
        assert_eq!(pool.free_pages(), 2);
        // Room 2's prefill is dead: nothing more will be written.
        b.dead.cancel();
        d.sweep();
        assert_eq!(pool.free_pages(), 4);
        // Room 3 waits out twice the KV timeout (the prefill's own bound on a room).
        tokio::time::advance(timeout * 2 - Duration::from_millis(1)).await;
        d.sweep();
        assert_eq!(pool.free_pages(), 4);
        tokio::time::advance(Duration::from_millis(2)).await;
        d.sweep();
        assert_eq!((pool.free_pages(), d.rooms_open()), (6, 0));
    }
}
