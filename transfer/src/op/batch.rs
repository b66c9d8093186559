//! Batches and their completion tracking.
//!
//! A batch holds its requests (and so their local buffers and segments) until the last
//! slice of the last request is done. Each request is decided exactly once: the first error
//! of any of its slices, or success when every slice succeeded, or cancellation, or its
//! timeout; and it is reported (settled) once no transport writes into its local buffer any
//! more. A slice that is dropped without completing (its connection died, its queue was
//! closed) fails its request: nothing can wait forever.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::request::TransferRequest;
use crate::error::{Result, TransferError};

/// Where a request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestStatus {
    /// Still moving.
    Pending,
    /// All bytes are where they were asked to go (a write: in the peer's memory).
    Completed,
    /// Failed, cancelled or timed out (the error says which).
    Failed(TransferError),
}

/// A way to stop a landing in progress at once (kill the connection or queue pair that is
/// writing into the local buffer), used when its request times out or is cancelled.
pub(crate) type Abort = Arc<dyn Fn() + Send + Sync>;

/// Distinct abort handles with counts.
#[derive(Default)]
struct Aborts {
    first: Option<(Abort, u32)>,
    more: Vec<(Abort, u32)>,
}

impl Aborts {
    fn add(&mut self, a: &Abort) {
        for e in self.first.iter_mut().chain(self.more.iter_mut()) {
            if Arc::ptr_eq(&e.0, a) {
                e.1 += 1;
                return;
            }
        }
        if self.first.is_none() {
            self.first = Some((a.clone(), 1));
        } else {
            self.more.push((a.clone(), 1));
        }
    }

    fn remove(&mut self, a: &Abort) {
        if let Some(e) = &mut self.first
            && Arc::ptr_eq(&e.0, a)
        {
            e.1 -= 1;
            if e.1 == 0 {
                self.first = self.more.pop();
            }
            return;
        }
        if let Some(i) = self.more.iter().position(|e| Arc::ptr_eq(&e.0, a)) {
            self.more[i].1 -= 1;
            if self.more[i].1 == 0 {
                self.more.swap_remove(i);
            }
        }
    }

    fn all(&self) -> Vec<Abort> {
        self.first
            .iter()
            .chain(self.more.iter())
            .map(|e| e.0.clone())
            .collect()
    }
}

#[derive(Default)]
struct SlotState {
    /// The outcome, once decided (first error, all slices done, cancel or timeout).
    result: Option<Result<()>>,
    /// Slices that must still succeed for the request to succeed.
    slices_left: u32,
    /// Landings in progress: transports writing into the request's local buffer now.
    landing: u32,
    /// Abort handles of the landings in progress, each with its count of landings (one
    /// handle per connection or queue pair; the first kept inline, no allocation).
    aborts: Aborts,
    /// Decided and no landing in progress: final, visible to waiters.
    settled: bool,
}

struct Slot {
    /// `state.result.is_some()`, readable without the lock (slices check it before sending).
    decided: AtomicBool,
    state: Mutex<SlotState>,
}

/// Shared state of a submitted batch.
///
/// A request is **settled** once its outcome is decided and no transport is writing into
/// its local buffer any more: only then do waiters see it. A transport that writes into a
/// local buffer (a TCP read's data, a shared-memory copy, an RDMA READ) brackets the writes
/// with [`Completion::begin_landing`], which refuses once the outcome is decided; a timeout
/// or cancellation aborts the landings in progress (their connection or queue pair is
/// killed), so waiting for them is short. So a read that timed out never goes on landing
/// bytes in a buffer its caller took back.
pub(crate) struct BatchState {
    pub(crate) requests: Vec<TransferRequest>,
    slots: Box<[Slot]>,
    remaining: AtomicUsize,
    notify: Notify,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    /// The batch's span, in a process that exports traces (TRACE, target `transfer`: no
    /// other layer wants it): from the submit to the last request settled, with its bytes,
    /// requests, peer and transport. `None` otherwise (no lock taken for it).
    span: Option<Mutex<Option<tracing::Span>>>,
}

impl BatchState {
    pub(crate) fn new(requests: Vec<TransferRequest>, timeout: Duration) -> Arc<Self> {
        let slots = requests
            .iter()
            .map(|_| Slot {
                decided: AtomicBool::new(false),
                state: Mutex::new(SlotState {
                    slices_left: 1,
                    ..SlotState::default()
                }),
            })
            .collect();
        let span = tracing::trace_span!(
            target: "transfer",
            "transfer batch",
            requests = requests.len(),
            bytes = requests.iter().map(|r| r.len as u64).sum::<u64>(),
            peer = requests.first().map_or("", |r| r.segment.name()),
            transport = tracing::field::Empty,
        );
        let span = (!span.is_disabled() && !requests.is_empty()).then(|| Mutex::new(Some(span)));
        Arc::new(Self {
            remaining: AtomicUsize::new(requests.len()),
            requests,
            slots,
            notify: Notify::new(),
            deadline: Instant::now() + timeout,
            timeout,
            span,
        })
    }

    /// Names a transport that carries the batch on its span (with several, the last named).
    pub(crate) fn carried_by(&self, transport: &'static str) {
        if let Some(span) = &self.span
            && let Some(s) = span.lock().as_ref()
        {
            s.record("transport", transport);
        }
    }

    /// Sets how many slices request `idx` was cut into (before any is dispatched).
    pub(crate) fn set_slices(&self, idx: usize, n: u32) {
        self.slots[idx].state.lock().slices_left = n.max(1);
    }

    /// Whether request `idx` is still undecided (its slices should still run).
    pub(crate) fn is_live(&self, idx: usize) -> bool {
        !self.slots[idx].decided.load(Ordering::Acquire)
    }

    /// Decides request `idx` unless it already is; returns whether this call did.
    pub(crate) fn finish(&self, idx: usize, r: Result<()>) -> bool {
        self.decide(idx, r, false)
    }

    /// Decides `idx` as `r`; with `abort`, also aborts its landings in progress.
    fn decide(&self, idx: usize, r: Result<()>, abort: bool) -> bool {
        let slot = &self.slots[idx];
        let (settle, aborts) = {
            let mut st = slot.state.lock();
            if st.result.is_some() {
                return false;
            }
            if let Err(e) = &r
                && e.invalidates_descriptor()
            {
                self.requests[idx].segment.mark_stale();
            }
            st.result = Some(r);
            slot.decided.store(true, Ordering::Release);
            let aborts = if abort && st.landing > 0 {
                st.aborts.all()
            } else {
                Vec::new()
            };
            (self.try_settle(&mut st), aborts)
        };
        for a in aborts {
            a();
        }
        if settle {
            self.settled_one();
        }
        true
    }

    /// Marks the slot settled if it is decided and nothing lands; true if this call did.
    fn try_settle(&self, st: &mut SlotState) -> bool {
        if st.settled || st.result.is_none() || st.landing > 0 {
            return false;
        }
        st.settled = true;
        true
    }

    fn settled_one(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(span) = &self.span {
                // The batch's span ends with its last request.
                drop(span.lock().take());
            }
            self.notify.notify_waiters();
        }
    }

    /// Records one slice's outcome: the first error fails the request, the last success
    /// completes it.
    pub(crate) fn slice_done(&self, idx: usize, r: Result<()>) {
        match r {
            Err(e) => {
                self.finish(idx, Err(e));
            }
            Ok(()) => {
                let last = {
                    let mut st = self.slots[idx].state.lock();
                    st.slices_left = st.slices_left.saturating_sub(1);
                    st.slices_left == 0
                };
                if last {
                    self.finish(idx, Ok(()));
                }
            }
        }
    }

    /// A completion token for one slice of request `idx`.
    pub(crate) fn completion(self: &Arc<Self>, idx: usize) -> Completion {
        Completion {
            batch: self.clone(),
            idx,
            done: false,
        }
    }

    /// Starts writing into request `idx`'s local buffer, unless the request is decided
    /// (then the caller must not write, and should discard what it was about to land).
    pub(crate) fn begin_landing(
        self: &Arc<Self>,
        idx: usize,
        abort: Option<Abort>,
    ) -> Option<Landing> {
        let mut st = self.slots[idx].state.lock();
        if st.result.is_some() {
            return None;
        }
        st.landing += 1;
        if let Some(a) = &abort {
            st.aborts.add(a);
        }
        Some(Landing {
            batch: self.clone(),
            idx,
            abort,
            armed: true,
        })
    }

    /// One slice succeeded and its landing (if any) ended: both recorded under one lock.
    fn landed_ok(&self, idx: usize, landing: Option<Landing>) {
        let slot = &self.slots[idx];
        let settle = {
            let mut st = slot.state.lock();
            if let Some(mut l) = landing {
                l.armed = false;
                st.landing -= 1;
                if let Some(a) = &l.abort {
                    st.aborts.remove(a);
                }
            }
            st.slices_left = st.slices_left.saturating_sub(1);
            if st.slices_left == 0 && st.result.is_none() {
                st.result = Some(Ok(()));
                slot.decided.store(true, Ordering::Release);
            }
            self.try_settle(&mut st)
        };
        if settle {
            self.settled_one();
        }
    }

    fn end_landing(&self, idx: usize, abort: Option<&Abort>) {
        let settle = {
            let mut st = self.slots[idx].state.lock();
            st.landing -= 1;
            if let Some(a) = abort {
                st.aborts.remove(a);
            }
            self.try_settle(&mut st)
        };
        if settle {
            self.settled_one();
        }
    }

    /// Fails every undecided request with `TimedOut`, aborting their landings.
    fn expire(&self) {
        for (i, req) in self.requests.iter().enumerate() {
            if self.is_live(i) {
                self.decide(
                    i,
                    Err(TransferError::TimedOut {
                        segment: req.segment.name().to_owned(),
                        range: req.remote_range(),
                        timeout: self.timeout,
                    }),
                    true,
                );
            }
        }
    }

    fn all_settled(&self) -> bool {
        self.remaining.load(Ordering::Acquire) == 0
    }

    async fn wait_settled(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.all_settled() {
                return;
            }
            notified.await;
        }
    }
}

/// A transport writing into a request's local buffer; dropping it ends the landing.
pub(crate) struct Landing {
    batch: Arc<BatchState>,
    idx: usize,
    abort: Option<Abort>,
    armed: bool,
}

impl Drop for Landing {
    fn drop(&mut self) {
        if self.armed {
            self.batch.end_landing(self.idx, self.abort.as_ref());
        }
    }
}

/// Completes one slice of one request exactly once; dropping it uncompleted fails the
/// request as "peer unreachable" (its connection or queue went away).
pub(crate) struct Completion {
    batch: Arc<BatchState>,
    idx: usize,
    done: bool,
}

impl Completion {
    /// Whether the request still wants this slice.
    pub(crate) fn is_live(&self) -> bool {
        self.batch.is_live(self.idx)
    }

    /// The request this slice belongs to.
    pub(crate) fn request(&self) -> &TransferRequest {
        &self.batch.requests[self.idx]
    }

    /// The batch (keeps the request's buffers alive).
    pub(crate) fn batch(&self) -> Arc<BatchState> {
        self.batch.clone()
    }

    /// Starts landing this slice's bytes in the local buffer (see
    /// [`BatchState::begin_landing`]); `None`: the request is decided, discard the bytes.
    pub(crate) fn begin_landing(&self, abort: Option<Abort>) -> Option<Landing> {
        self.batch.begin_landing(self.idx, abort)
    }

    /// Reports the slice's success together with the end of its landing (one lock).
    pub(crate) fn complete_landed(mut self, landing: Option<Landing>) {
        self.done = true;
        self.batch.landed_ok(self.idx, landing);
    }

    /// Reports the slice's outcome.
    pub(crate) fn complete(mut self, r: Result<()>) {
        self.done = true;
        self.batch.slice_done(self.idx, r);
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if !self.done {
            let seg = self.request().segment.name().to_owned();
            self.batch.slice_done(
                self.idx,
                Err(TransferError::unreachable(
                    &seg,
                    "connection closed before the request completed",
                )),
            );
        }
    }
}

/// A submitted batch: wait for it, poll each request, or cancel it.
///
/// Dropping the handle does not cancel anything: the transfers run to completion.
pub struct Batch {
    pub(crate) state: Arc<BatchState>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("len", &self.len())
            .field("complete", &self.is_complete())
            .finish()
    }
}

impl Batch {
    /// Number of requests.
    pub fn len(&self) -> usize {
        self.state.requests.len()
    }

    /// Whether the batch has no requests.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Status of request `i`. A pending request past its deadline is failed with
    /// `TimedOut` (its landings aborted); like every outcome, that is reported once nothing
    /// writes into its local buffer any more (until then: `Pending`).
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn status(&self, i: usize) -> RequestStatus {
        if self.state.is_live(i) && Instant::now() >= self.state.deadline {
            self.state.expire();
        }
        let st = self.state.slots[i].state.lock();
        match &st.result {
            _ if !st.settled => RequestStatus::Pending,
            None => RequestStatus::Pending,
            Some(Ok(())) => RequestStatus::Completed,
            Some(Err(e)) => RequestStatus::Failed(e.clone()),
        }
    }

    /// Whether every request has completed (successfully or not).
    pub fn is_complete(&self) -> bool {
        self.state.all_settled()
    }

    /// Waits until every request completed or the batch deadline passed (pending requests
    /// then fail with `TimedOut`); returns the first failed request's error, by index.
    pub async fn wait(&self) -> Result<()> {
        self.wait_all().await.into_iter().collect()
    }

    /// Like [`Batch::wait`], but returns every request's outcome, in request order.
    pub async fn wait_all(&self) -> Vec<Result<()>> {
        if tokio::time::timeout_at(self.state.deadline, self.state.wait_settled())
            .await
            .is_err()
        {
            self.state.expire();
            // Landings in progress were aborted: they end promptly.
            self.state.wait_settled().await;
        }
        self.state
            .slots
            .iter()
            .map(|s| {
                s.state
                    .lock()
                    .result
                    .clone()
                    .expect("every request is settled")
            })
            .collect()
    }

    /// Cancels every pending request: slices not yet sent are dropped, landings in
    /// progress are aborted (their connection is closed), and the requests fail with
    /// `Cancelled` once nothing writes into their local buffers any more ([`Batch::wait`]
    /// returns then). A cancelled write may still have reached the peer; a cancelled
    /// read's local range holds unspecified bytes, but nothing lands there after the
    /// request is reported failed.
    pub fn cancel(&self) {
        for (i, req) in self.state.requests.iter().enumerate() {
            if self.state.is_live(i) {
                self.state.decide(
                    i,
                    Err(TransferError::Cancelled {
                        segment: req.segment.name().to_owned(),
                        range: req.remote_range(),
                    }),
                    true,
                );
            }
        }
    }

    /// Total bytes the batch moves.
    pub fn bytes(&self) -> u64 {
        self.state.requests.iter().map(|r| r.len as u64).sum()
    }
}
