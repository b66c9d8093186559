//! The concurrency slots (`--max-concurrent-requests`) and their wait queue, by priority
//! class: a freed slot goes to the waiter with the highest effective class, its class plus
//! one for every `aging` it has waited (so a low class still moves under a steady stream of
//! higher ones), the longest waiting first among equals.
//!
//! Waiters sit in one FIFO per class; only each class's oldest can be the best of it, so a
//! hand-off looks at one waiter per class. A waiter that leaves (timeout, client gone) is
//! taken out of its FIFO at once, so the FIFOs hold only live waiters.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::auth::Priority;

/// One waiter.
#[derive(Debug)]
struct Waiter {
    seq: u64,
    since: Instant,
    grant: oneshot::Sender<Slot>,
}

#[derive(Debug)]
struct State {
    free: usize,
    queues: [VecDeque<Waiter>; Priority::ALL.len()],
    next_seq: u64,
}

/// The slots and their queue.
#[derive(Debug)]
pub struct Slots {
    state: Mutex<State>,
    aging: Duration,
}

/// One slot, held until dropped (then handed to the best waiter, or freed).
#[derive(Debug)]
pub struct Slot(Option<Arc<Slots>>);

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slots) = self.0.take() {
            slots.release();
        }
    }
}

/// A place in the queue: removed from it when dropped before its slot came.
#[derive(Debug)]
pub struct Waiting {
    slots: Arc<Slots>,
    class: Priority,
    seq: u64,
    grant: oneshot::Receiver<Slot>,
}

impl Slots {
    /// `n` slots; a waiter's class rises by one every `aging` (zero: never).
    pub fn new(n: usize, aging: Duration) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: n,
                queues: Default::default(),
                next_seq: 0,
            }),
            aging,
        })
    }

    /// Slots free right now.
    pub fn free(&self) -> usize {
        self.state.lock().free
    }

    /// A slot now, if one is free and nobody waits for it.
    pub fn try_take(self: &Arc<Self>) -> Option<Slot> {
        let mut s = self.state.lock();
        if s.free > 0 && s.queues.iter().all(VecDeque::is_empty) {
            s.free -= 1;
            return Some(Slot(Some(self.clone())));
        }
        None
    }

    /// Joins the queue of `class` (the caller bounds how many wait).
    pub fn wait(self: &Arc<Self>, class: Priority) -> Waiting {
        let (tx, rx) = oneshot::channel();
        let mut s = self.state.lock();
        let seq = s.next_seq;
        s.next_seq += 1;
        s.queues[class.index()].push_back(Waiter {
            seq,
            since: Instant::now(),
            grant: tx,
        });
        // A slot may be free with only this waiter queued (a release raced the try).
        if s.free > 0 {
            s.free -= 1;
            drop(s);
            self.hand_off();
        }
        Waiting {
            slots: self.clone(),
            class,
            seq,
            grant: rx,
        }
    }

    /// A freed slot: to the best waiter, or back to the free count.
    fn release(self: &Arc<Self>) {
        self.hand_off();
    }

    /// Gives one slot (already taken from `free`, or being released) to the best live
    /// waiter; frees it when there is none.
    fn hand_off(self: &Arc<Self>) {
        let mut slot = Slot(Some(self.clone()));
        loop {
            let mut s = self.state.lock();
            let Some(i) = self.best(&s) else {
                s.free += 1;
                slot.0 = None;
                return;
            };
            let Some(w) = s.queues[i].pop_front() else {
                continue;
            };
            drop(s);
            match w.grant.send(slot) {
                Ok(()) => return,
                // Its future is gone (the drop that removes it is racing): the next one.
                Err(back) => slot = back,
            }
        }
    }

    /// The class whose oldest waiter ranks first.
    fn best(&self, s: &State) -> Option<usize> {
        let now = Instant::now();
        let step = self.aging.as_secs_f64();
        s.queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| q.front().map(|w| (i, w)))
            .max_by(|(ia, a), (ib, b)| {
                let rank = |i: usize, w: &Waiter| {
                    let aged = match step > 0.0 {
                        true => {
                            (now.saturating_duration_since(w.since).as_secs_f64() / step).floor()
                        }
                        false => 0.0,
                    };
                    i as f64 + aged
                };
                rank(*ia, a)
                    .total_cmp(&rank(*ib, b))
                    .then(b.seq.cmp(&a.seq))
            })
            .map(|(i, _)| i)
    }
}

impl Waiting {
    /// The slot, when it comes (`None` only if the queue dropped this waiter, which it
    /// does not: its sender leaves the queue by being granted or by this waiter's drop).
    pub async fn granted(mut self) -> Option<Slot> {
        (&mut self.grant).await.ok()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut s = self.slots.state.lock();
        let q = &mut s.queues[self.class.index()];
        if let Some(pos) = q.iter().position(|w| w.seq == self.seq) {
            q.remove(pos);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queues one waiter per `(name, class)` in order; each records its name when served
    /// and gives its slot back at once.
    fn queue(
        slots: &Arc<Slots>,
        who: &[(&'static str, Priority)],
    ) -> (
        Arc<Mutex<Vec<&'static str>>>,
        Vec<tokio::task::JoinHandle<()>>,
    ) {
        let served = Arc::new(Mutex::new(Vec::new()));
        let tasks = who
            .iter()
            .map(|&(name, class)| {
                let w = slots.wait(class);
                let served = served.clone();
                tokio::spawn(async move {
                    let slot = w.granted().await.unwrap();
                    served.lock().push(name);
                    drop(slot);
                })
            })
            .collect();
        (served, tasks)
    }

    #[tokio::test(start_paused = true)]
    async fn freed_slots_go_to_the_highest_class_then_the_oldest() {
        use Priority::*;
        let slots = Slots::new(1, Duration::from_secs(5));
        let held = slots.try_take().unwrap();
        assert!(slots.try_take().is_none());
        let order = [
            ("b1", Bulk),
            ("d1", Default),
            ("s1", System),
            ("d2", Default),
            ("i1", Interactive),
        ];
        let (served, tasks) = queue(&slots, &order);
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*served.lock(), ["s1", "i1", "d1", "d2", "b1"]);
        assert_eq!(slots.free(), 1);
        assert!(slots.try_take().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_wait_lifts_a_low_class() {
        use Priority::*;
        let slots = Slots::new(1, Duration::from_secs(1));
        let held = slots.try_take().unwrap();
        let (served, mut tasks) = queue(&slots, &[("old_bulk", Bulk)]);
        tokio::time::advance(Duration::from_secs(3)).await;
        // Three seconds waited: bulk ranks with system; the older goes first.
        let (served2, more) = queue(
            &slots,
            &[("new_system", System), ("new_interactive", Interactive)],
        );
        tasks.extend(more);
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*served.lock(), ["old_bulk"]);
        assert_eq!(*served2.lock(), ["new_system", "new_interactive"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_leaves_takes_nothing_with_it() {
        let slots = Slots::new(1, Duration::ZERO);
        let held = slots.try_take().unwrap();
        let gone = slots.wait(Priority::System);
        let (served, tasks) = queue(&slots, &[("stays", Priority::Bulk)]);
        drop(gone);
        assert_eq!(
            slots
                .state
                .lock()
                .queues
                .iter()
                .map(VecDeque::len)
                .sum::<usize>(),
            1
        );
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*served.lock(), ["stays"]);
        assert_eq!(slots.free(), 1);
        // A grant that finds its waiter gone comes back as a free slot.
        let held = slots.try_take().unwrap();
        let w = slots.wait(Priority::Default);
        drop(held);
        drop(w);
        assert_eq!(slots.free(), 1);
    }
}
