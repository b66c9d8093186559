//! The object feed: every change of what the store holds under a key, in order, for the
//! routers that score store hits without hosting this master (`GET /api/v1/events`, and the
//! gateway's SGLang-format ZMQ publisher).
//!
//! A key's state is [`Held`] or nothing: a put becoming readable, a value moved to a disk
//! tier or read back from one, a removal (by a client, an admin, eviction, a client's
//! expiry) each make one event. The state ignores whether a replica's segment is mounted
//! this instant: a segment that goes away takes its objects with it at the next sweep, and
//! that sweep is the event.
//!
//! Events are found where they happen: a locked shard notes the state of each object it
//! hands out for writing, and on unlock compares it with the state after
//! ([`super::ShardGuard`]). So no code path can change an object without the feed seeing it,
//! and each key's events reach the feed in the order of its changes (the shard lock is held
//! while they are pushed).
//!
//! Sequence numbers count events from 0 per master instance; the instance's view version
//! is the feed's epoch. The last `events_buffer` events are kept: a subscriber behind them,
//! or of another epoch, takes a snapshot ([`Master::held_all`]) and goes on from the
//! sequence number it was taken at. Applying the events after a snapshot to it is exact:
//! each event sets its key's state, and a key changed while the snapshot was read has an
//! event after it.

use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::sync::Notify;

use super::object::{Object, ShardInner};
use super::{Held, Master};

/// One change of a key's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectEvent {
    /// The key.
    pub key: Box<str>,
    /// Where its value is now (`None`: no longer held).
    pub held: Option<Held>,
    /// Where it was before (`None`: not held).
    pub was: Option<Held>,
}

/// What [`Master::events_since`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Since {
    /// The events from `first` on (possibly none), and the sequence number after them.
    Events {
        /// Sequence number of `events[0]`.
        first: u64,
        /// The events, in order.
        events: Vec<ObjectEvent>,
        /// The sequence number to ask from next.
        next: u64,
    },
    /// Events before the oldest one kept were asked for: take a snapshot.
    Gone {
        /// The oldest sequence number kept.
        oldest: u64,
    },
    /// This master keeps no feed (`events_buffer` 0).
    Off,
}

/// One kept event; its key's buffer is reused when the slot is written again.
#[derive(Debug, Default)]
struct Slot {
    key: String,
    held: Option<Held>,
    was: Option<Held>,
}

/// The events kept: a circular buffer of slots written in place (no allocation once each
/// slot's key buffer has grown to the keys' length).
#[derive(Debug, Default)]
struct Ring {
    slots: Vec<Slot>,
    /// Index in `slots` of the oldest event (0 until the ring is full).
    head: usize,
    /// Sequence number of the oldest event.
    first: u64,
}

impl Ring {
    fn next(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    fn push(&mut self, capacity: usize, key: &str, held: Option<Held>, was: Option<Held>) {
        // Slots are only ever added until the ring is full: every slot holds an event.
        let at = if self.slots.len() < capacity {
            self.slots.push(Slot::default());
            self.slots.len() - 1
        } else {
            // Full: the oldest slot takes the new event.
            let at = self.head;
            self.head = (self.head + 1) % capacity;
            self.first += 1;
            at
        };
        let slot = &mut self.slots[at];
        slot.key.clear();
        slot.key.push_str(key);
        slot.held = held;
        slot.was = was;
    }

    /// The kept event at `i` (0: the oldest).
    fn get(&self, i: usize) -> &Slot {
        &self.slots[(self.head + i) % self.slots.len()]
    }
}

/// An object noted by a locked shard whose state changed: its index, before, after.
type Change = (u32, Option<Held>, Option<Held>);

/// The feed a master keeps (see the module doc).
#[derive(Debug)]
pub(crate) struct Feed {
    capacity: usize,
    ring: Mutex<Ring>,
    wake: Notify,
    /// Subscribers waiting in [`Master::events_wait`]: a push wakes them only when there
    /// are some (waking takes a lock of its own).
    waiting: AtomicUsize,
}

impl Feed {
    pub(crate) fn new(capacity: usize) -> Self {
        Feed {
            capacity,
            ring: Mutex::new(Ring::default()),
            wake: Notify::new(),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Appends a locked shard's events: `removed` (taken out meanwhile), then the objects
    /// noted in `touched` whose state changed (callers hold the shard lock).
    pub(crate) fn push(&self, shard: &ShardInner, touched: &mut Touched) {
        let changed: SmallVec<[Change; 2]> = touched
            .before
            .drain(..)
            .filter_map(|(idx, before)| {
                let after = state_of(shard.try_get(idx)?);
                (after != before).then_some((idx, before, after))
            })
            .collect();
        if changed.is_empty() && touched.removed.is_empty() {
            return;
        }
        let mut ring = self.ring.lock();
        for e in touched.removed.drain(..) {
            ring.push(self.capacity, &e.key, None, e.was);
        }
        for (idx, before, after) in changed {
            ring.push(self.capacity, shard.get(idx).key.as_str(), after, before);
        }
        drop(ring);
        // A waiter counts itself before it looks at the ring, and this looks at the count
        // after the ring changed: one that was missed sees the new events when it looks.
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.wake.notify_waiters();
        }
    }

    fn next(&self) -> u64 {
        self.ring.lock().next()
    }
}

/// The state the feed reports for `o` (see the module doc).
pub(crate) fn state_of(o: &Object) -> Option<Held> {
    if !o.is_complete() {
        None
    } else if o.is_on_disk() || o.is_loading() {
        Some(Held::Disk)
    } else {
        Some(Held::Memory)
    }
}

impl Master {
    /// The feed's epoch: events and sequence numbers of another epoch (another master
    /// instance) mean nothing here.
    pub fn events_epoch(&self) -> u64 {
        self.view_version
    }

    /// The sequence number the next event will get (`None`: no feed).
    pub fn events_next(&self) -> Option<u64> {
        self.feed.as_ref().map(Feed::next)
    }

    /// At most `max` events from sequence number `from` on.
    pub fn events_since(&self, from: u64, max: usize) -> Since {
        let Some(feed) = &self.feed else {
            return Since::Off;
        };
        let ring = feed.ring.lock();
        if from < ring.first {
            return Since::Gone { oldest: ring.first };
        }
        let skip = usize::try_from(from - ring.first).unwrap_or(usize::MAX);
        let events: Vec<ObjectEvent> = (skip..ring.slots.len())
            .take(max)
            .map(|i| {
                let s = ring.get(i);
                ObjectEvent {
                    key: s.key.as_str().into(),
                    held: s.held,
                    was: s.was,
                }
            })
            .collect();
        let first = from.min(ring.next());
        Since::Events {
            first,
            next: first + events.len() as u64,
            events,
        }
    }

    /// Waits until an event with sequence number `from` or later exists, at most `wait`.
    /// True when one does.
    pub async fn events_wait(&self, from: u64, wait: Duration) -> bool {
        let Some(feed) = &self.feed else {
            return false;
        };
        /// Counts a waiter until it is dropped (an abandoned wait included).
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        feed.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&feed.waiting);
        let notified = feed.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if feed.next() <= from {
            let _ = tokio::time::timeout(wait, notified).await;
        }
        feed.next() > from
    }

    /// Every key held, with where, and the sequence number to follow the feed from after
    /// it (`None` without a feed).
    pub fn held_all(&self) -> (Option<u64>, Vec<(String, Held)>) {
        // Read before the shards: a change made while they are read has a later number.
        let next = self.events_next();
        (next, self.held_part(0, usize::MAX).0)
    }

    /// Part of a snapshot: the keys held in whole shards from shard `cursor` on, until at
    /// least `max` are gathered (or the shards end), and the cursor of the next part
    /// (`None`: the snapshot is complete). The snapshot's sequence number is
    /// [`Master::events_next`] read before its first part: the parts may be taken apart,
    /// as each change made meanwhile has a later number.
    pub fn held_part(&self, cursor: u64, max: usize) -> (Vec<(String, Held)>, Option<u64>) {
        let mut out = Vec::new();
        let mut s = usize::try_from(cursor).unwrap_or(usize::MAX);
        while s < self.shards.len() && out.len() < max {
            let shard = self.lock_shard(s);
            out.extend(shard.indices().filter_map(|i| {
                let o = shard.get(i);
                state_of(o).map(|h| (o.key.as_str().to_owned(), h))
            }));
            s += 1;
        }
        let more = (s < self.shards.len()).then_some(s as u64);
        (out, more)
    }
}

/// Events the feed gives a subscriber at most per call (the REST route's cap).
pub const MAX_EVENTS_PER_CALL: usize = 65_536;

/// The notes a locked shard keeps for the feed (see [`super::ShardGuard`]).
#[derive(Debug, Default)]
pub(crate) struct Touched {
    /// Objects handed out for writing, with their state before (most guards hand out one
    /// or two: no allocation).
    before: SmallVec<[(u32, Option<Held>); 2]>,
    /// Objects removed while held (their keys, and where they were).
    removed: SmallVec<[Removed; 1]>,
}

/// An object removed while held.
#[derive(Debug)]
struct Removed {
    key: Box<str>,
    was: Option<Held>,
}

impl Touched {
    /// Notes `idx` about to be written, in state `state` (the first note of an index wins).
    pub(crate) fn note(&mut self, idx: u32, state: impl FnOnce() -> Option<Held>) {
        if !self.before.iter().any(|(i, _)| *i == idx) {
            let s = state();
            self.before.push((idx, s));
        }
    }

    /// Notes `idx` inserted (nothing held under its key before).
    pub(crate) fn inserted(&mut self, idx: u32) {
        self.before.retain(|(i, _)| *i != idx);
        self.before.push((idx, None));
    }

    /// Notes `obj` removed from `idx`.
    pub(crate) fn removed(&mut self, idx: u32, obj: &Object) {
        let before = match self.before.iter().position(|(i, _)| *i == idx) {
            Some(p) => self.before.swap_remove(p).1,
            None => state_of(obj),
        };
        if before.is_some() {
            self.removed.push(Removed {
                key: obj.key.as_str().into(),
                was: before,
            });
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.before.is_empty() && self.removed.is_empty()
    }
}
