//! The gateway's workers: who the workers are, their state, the swappable set requests are
//! routed over, and the pooled HTTP client the gateway speaks to them with. The gateway
//! re-exports this crate as `gateway::workers` (and its client as `gateway::client`).
//!
//! # Layout
//! In the order a worker meets them:
//! - [`manager`]: the control plane (add, update, drain, remove; with `--dp-aware`, one
//!   entry per data-parallel rank).
//! - [`Worker`]: one backend (URL, type, model, health status, in-flight load, api key,
//!   circuit breaker, data-parallel rank).
//! - [`Registry`]: the current set of workers, an atomically swapped snapshot; readers on
//!   the request path never lock.
//! - [`health`]: the per-worker probe loop and its `pending -> ready <-> not_ready` rules.
//! - [`discovery`]: learns a worker's model from `/v1/models` or `/get_model_info`, and its
//!   data-parallel size from `/get_server_info`.
//! - [`client`]: the pooled upstream HTTP client (plain or TLS).
//! - [`breaker`]: the per-worker circuit breaker (`closed -> open -> half_open`), fed by
//!   request outcomes.
//! - [`pods`]: Kubernetes service discovery's reconcile step (pods to workers); the
//!   watch that feeds it is `k8s` (cargo feature `kubernetes`).
//! - `testing` (cargo feature `testing`): workers for other crates' tests.

pub mod breaker;
pub mod client;
pub mod discovery;
pub mod health;
#[cfg(feature = "kubernetes")]
pub mod k8s;
pub mod manager;
pub mod pods;
pub mod registry;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use arc_swap::ArcSwapOption;
use http::HeaderValue;
use openapi::workers::{WorkerHealth, WorkerInfo, WorkerStatus, WorkerType};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use breaker::{Breaker, BreakerConfig, Outcome};
pub use manager::WorkerManager;
pub use registry::Registry;

pub use settings::{UrlError, WorkerUrl};

/// What a worker said of its load in its `/v1/loads` (summed over its ranks), and when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReportedLoad {
    /// When it was read.
    pub at: tokio::time::Instant,
    /// KV tokens in use.
    pub used_tokens: u64,
    /// Requests waiting in its queues.
    pub waiting_reqs: u64,
    /// Tokens generated per second.
    pub gen_throughput: f64,
    /// The fullest rank's KV usage (0 to 1).
    pub token_usage: f64,
}

/// One data-parallel rank of a worker (`--dp-aware`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DpRank {
    /// The rank requests to this entry go to (`data_parallel_rank`).
    pub rank: u32,
    /// The worker's `dp_size`.
    pub size: u32,
}

/// What registering a worker needs (the admin API's `CreateWorkerRequest`, validated).
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Base URL.
    pub url: WorkerUrl,
    /// Role.
    pub worker_type: WorkerType,
    /// Prefill bootstrap port.
    pub bootstrap_port: Option<u16>,
    /// Known model, if given.
    pub model_id: Option<String>,
    /// The worker's own api key.
    pub api_key: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Priority.
    pub priority: u32,
}

/// How a worker came to be registered, which decides whether the gateway's `--api-key`
/// applies to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// From the configuration (`--worker-urls`, `--prefill`, `--decode`): the gateway's
    /// `--api-key` is its key unless it has its own.
    Static,
    /// Registered through the worker API: only the key given with it, never the
    /// gateway's (an admin could register any URL, and the key would go there).
    Api,
    /// Found by Kubernetes service discovery (`--service-discovery`): pods the operator's
    /// label selector picks in the gateway's namespace, so the gateway's `--api-key` is its
    /// key as for a static worker (not when discovery watches every namespace: see
    /// [`WorkerManager::set_discovered_keyed`]). Discovery removes it; a reload leaves it
    /// alone.
    Discovered,
}

/// Default priority of a worker registered without one.
pub const DEFAULT_PRIORITY: u32 = 50;

const PENDING: u8 = 0;
const READY: u8 = 1;
const NOT_READY: u8 = 2;

/// One backend worker. Shared (`Arc`) by the registry, the health loop and every request
/// routed to it; the request path touches only atomics.
#[derive(Debug)]
pub struct Worker {
    id: String,
    uid: u64,
    url: WorkerUrl,
    worker_type: WorkerType,
    bootstrap_port: Option<u16>,
    model: ArcSwapOption<String>,
    status: AtomicU8,
    in_flight: AtomicUsize,
    /// Prompt tokens its requests in flight still have to prefill, as the policy that
    /// picked them estimated (see [`LoadGuard::charge_prefill`]).
    prefill_backlog: AtomicU64,
    /// What the worker last said of its load (`least_load`'s poll).
    reported: parking_lot::Mutex<Option<ReportedLoad>>,
    /// `--dp-aware`: unset until the worker's `dp_size` is known; then the rank this entry
    /// routes to, or `None` for a worker with one rank.
    dp: std::sync::OnceLock<Option<DpRank>>,
    failures: AtomicU64,
    breaker: Breaker,
    draining: AtomicBool,
    origin: Origin,
    own_key: AtomicBool,
    bearer: ArcSwapOption<HeaderValue>,
    admin: Mutex<AdminFields>,
    health: Mutex<WorkerHealth>,
    drained: Notify,
    probe_now: Notify,
    cancel: CancellationToken,
}

#[derive(Debug)]
struct AdminFields {
    labels: BTreeMap<String, String>,
    priority: u32,
}

impl Worker {
    /// A new worker in `pending` state, of [`Origin::Api`] unless changed with
    /// [`Worker::with_origin`]. `default_key` is the key used when the spec has none (the
    /// gateway's `--api-key` for a static worker, `None` for an API one). `cancel` stops
    /// the worker's background tasks.
    pub fn new(spec: WorkerSpec, default_key: Option<&str>, cancel: CancellationToken) -> Self {
        static NEXT_UID: AtomicU64 = AtomicU64::new(1);
        let w = Self {
            id: uuid::Uuid::new_v4().to_string(),
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            url: spec.url,
            worker_type: spec.worker_type,
            bootstrap_port: spec.bootstrap_port,
            model: ArcSwapOption::new(spec.model_id.map(Arc::new)),
            status: AtomicU8::new(PENDING),
            in_flight: AtomicUsize::new(0),
            prefill_backlog: AtomicU64::new(0),
            reported: parking_lot::Mutex::new(None),
            dp: std::sync::OnceLock::new(),
            failures: AtomicU64::new(0),
            breaker: Breaker::default(),
            draining: AtomicBool::new(false),
            origin: Origin::Api,
            own_key: AtomicBool::new(false),
            bearer: ArcSwapOption::empty(),
            admin: Mutex::new(AdminFields {
                labels: spec.labels,
                priority: spec.priority,
            }),
            health: Mutex::new(WorkerHealth::default()),
            drained: Notify::new(),
            probe_now: Notify::new(),
            cancel,
        };
        w.set_api_key(spec.api_key.as_deref(), default_key);
        w
    }

    /// Another data-parallel rank of this worker (`--dp-aware`): the same URL, role,
    /// model, key, labels and priority, its own load, breaker and health, routed to `rank`.
    pub fn rank_sibling(&self, rank: u32, size: u32, cancel: CancellationToken) -> Self {
        let admin = self.admin.lock();
        let spec = WorkerSpec {
            url: self.url.clone(),
            worker_type: self.worker_type,
            bootstrap_port: self.bootstrap_port,
            model_id: self.model().map(|m| m.to_string()),
            api_key: None,
            labels: admin.labels.clone(),
            priority: admin.priority,
        };
        let w = Self {
            origin: self.origin,
            breaker: self.breaker.fresh(),
            ..Self::new(spec, None, cancel)
        };
        w.own_key
            .store(self.own_key.load(Ordering::Acquire), Ordering::Release);
        w.bearer.store(self.bearer.load_full());
        let _ = w.dp.set(Some(DpRank { rank, size }));
        w
    }

    /// The data-parallel rank requests to this entry carry (`--dp-aware`, a worker with
    /// more than one rank).
    #[inline]
    pub fn dp_rank(&self) -> Option<DpRank> {
        self.dp.get().copied().flatten()
    }

    /// The entry's name: its URL, with `@<rank>` for a data-parallel rank (as
    /// sglang-router names them). What routing keys hash and targets name.
    pub fn name(&self) -> std::borrow::Cow<'_, str> {
        match self.dp_rank() {
            Some(dp) => format!("{}@{}", self.url.as_str(), dp.rank).into(),
            None => self.url.as_str().into(),
        }
    }

    /// Whether the worker's `dp_size` is known (always, unless `--dp-aware` is still
    /// learning it).
    pub fn dp_known(&self) -> bool {
        self.dp.get().is_some()
    }

    /// Records what `--dp-aware` learnt: this entry is `rank` of `size` (`None`: one
    /// rank). Set once; later calls change nothing.
    pub fn set_dp(&self, dp: Option<DpRank>) {
        let _ = self.dp.set(dp);
    }

    /// The same worker, registered by `origin`.
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
        self
    }

    /// How it was registered.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The same worker with its circuit breaker set up by `cfg` (a new worker's breaker
    /// has sglang-router's default settings).
    pub fn with_breaker(mut self, cfg: Arc<BreakerConfig>) -> Self {
        self.breaker = Breaker::new(cfg);
        self
    }

    /// Gateway-assigned id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A small number unique to this worker in this process (never reused), for data
    /// structures that key on workers.
    #[inline]
    pub fn uid(&self) -> u64 {
        self.uid
    }

    /// Base URL.
    pub fn url(&self) -> &WorkerUrl {
        &self.url
    }

    /// Role.
    pub fn worker_type(&self) -> WorkerType {
        self.worker_type
    }

    /// Prefill bootstrap port.
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.bootstrap_port
    }

    /// The served model, once known.
    pub fn model(&self) -> Option<Arc<String>> {
        self.model.load_full()
    }

    /// Records the served model (discovery).
    pub fn set_model(&self, model: String) {
        self.model.store(Some(Arc::new(model)));
        bump_epoch();
    }

    /// Whether this worker can serve `model` (`None`: any). A worker whose model is not
    /// known (its discovery failed) serves any model.
    pub fn serves(&self, model: Option<&str>) -> bool {
        match (model, &*self.model.load()) {
            (Some(want), Some(have)) => want == have.as_str(),
            _ => true,
        }
    }

    /// Health life-cycle state.
    pub fn status(&self) -> WorkerStatus {
        match self.status.load(Ordering::Acquire) {
            PENDING => WorkerStatus::Pending,
            READY => WorkerStatus::Ready,
            _ => WorkerStatus::NotReady,
        }
    }

    /// Sets the health life-cycle state.
    pub fn set_status(&self, s: WorkerStatus) {
        let v = match s {
            WorkerStatus::Pending => PENDING,
            WorkerStatus::Ready => READY,
            WorkerStatus::NotReady => NOT_READY,
        };
        if self.status.swap(v, Ordering::AcqRel) != v {
            bump_epoch();
        }
    }

    /// Ready and not draining: may take a new request.
    #[inline]
    pub fn is_available(&self) -> bool {
        self.status.load(Ordering::Acquire) == READY && !self.draining.load(Ordering::Acquire)
    }

    /// Requests in flight.
    #[inline]
    pub fn load(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// What the worker last said of its load, if it ever answered the load poll.
    pub fn reported(&self) -> Option<ReportedLoad> {
        *self.reported.lock()
    }

    /// Keeps what the worker said of its load.
    pub fn set_reported(&self, r: ReportedLoad) {
        *self.reported.lock() = Some(r);
    }

    /// Prompt tokens its requests in flight still have to prefill, by the estimates of the
    /// policy that routed them: charged when a request is sent, released when its answer's
    /// first frame arrives (a streamed answer's first token) or the request ends.
    #[inline]
    pub fn prefill_backlog(&self) -> u64 {
        self.prefill_backlog.load(Ordering::Relaxed)
    }

    /// Ready, not draining and its breaker not open: counts as serving (readiness).
    #[inline]
    pub fn is_usable(&self) -> bool {
        self.is_available() && self.breaker.is_usable()
    }

    /// Charges one failed request to this worker (it could not be reached, answered a
    /// server error, broke the connection or timed out): the failure count, the circuit
    /// breaker, and a health probe.
    pub fn record_failure(&self) {
        self.record(Outcome::Failure);
    }

    /// Records one request's outcome with the worker's circuit breaker (and, for a
    /// failure, its failure count and a health probe).
    #[inline]
    pub fn record(&self, outcome: Outcome) {
        self.breaker.record(outcome);
        if outcome == Outcome::Failure {
            self.failures.fetch_add(1, Ordering::Relaxed);
            self.request_probe();
        }
    }

    /// The circuit breaker.
    #[inline]
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Requests charged to this worker as failed since it was registered.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Being removed.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// The `Authorization` header value to send, if any.
    #[inline]
    pub fn bearer(&self) -> Option<Arc<HeaderValue>> {
        self.bearer.load_full()
    }

    /// Sets (rotates) the worker's own api key; `None` falls back to `default_key`.
    pub fn set_api_key(&self, own: Option<&str>, default_key: Option<&str>) {
        self.own_key.store(own.is_some(), Ordering::Release);
        self.bearer
            .store(own.or(default_key).and_then(bearer_header));
    }

    /// Replaces the key a worker without its own key uses (a reloaded `--api-key`).
    pub fn set_default_key(&self, default_key: Option<&str>) {
        if !self.own_key.load(Ordering::Acquire) {
            self.bearer.store(default_key.and_then(bearer_header));
        }
    }

    /// Replaces labels and/or priority.
    pub fn update_admin(&self, labels: Option<BTreeMap<String, String>>, priority: Option<u32>) {
        let mut a = self.admin.lock();
        if let Some(l) = labels {
            a.labels = l;
        }
        if let Some(p) = priority {
            a.priority = p;
        }
    }

    /// Health probe details (for the admin API), mutable by the health loop.
    pub fn health(&self) -> parking_lot::MutexGuard<'_, WorkerHealth> {
        self.health.lock()
    }

    /// Asks the health loop for a probe now (e.g. after a connection failure).
    pub fn request_probe(&self) {
        self.probe_now.notify_one();
    }

    /// Stops this worker's background tasks.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }

    pub(crate) fn probe_requested(&self) -> &Notify {
        &self.probe_now
    }

    /// Marks the worker draining and waits until nothing is in flight.
    pub async fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        bump_epoch();
        while self.in_flight.load(Ordering::Acquire) > 0 {
            let notified = self.drained.notified();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                break;
            }
            notified.await;
        }
    }

    /// The admin API view.
    pub fn info(&self) -> WorkerInfo {
        let admin = self.admin.lock();
        WorkerInfo {
            id: self.id.clone(),
            url: self.url.as_str().to_string(),
            worker_type: self.worker_type,
            bootstrap_port: self.bootstrap_port,
            model_id: self.model().map(|m| m.to_string()),
            labels: admin.labels.clone(),
            priority: admin.priority,
            status: self.status(),
            health: self.health.lock().clone(),
            load: self.load() as u64,
            draining: self.is_draining(),
            circuit: self.breaker.info(),
            has_api_key: self.own_key.load(Ordering::Acquire),
            dp_rank: self.dp_rank().map(|d| d.rank),
            dp_size: self.dp_rank().map(|d| d.size),
        }
    }
}

/// `Bearer <key>`, marked sensitive (never logged by hyper or the HTTP/2 table).
fn bearer_header(key: &str) -> Option<Arc<HeaderValue>> {
    let mut h = HeaderValue::try_from(format!("Bearer {key}")).ok()?;
    h.set_sensitive(true);
    Some(Arc::new(h))
}

/// Counts one request in flight on a worker for as long as it lives: created when a
/// request is dispatched, dropped when its response body ends or the client goes away.
/// A guard made by [`LoadGuard::admit`] on a half-open breaker also holds one of its trial
/// slots until then.
#[derive(Debug)]
pub struct LoadGuard {
    worker: Arc<Worker>,
    trial: bool,
    /// Tokens charged to the worker's prefill backlog, until released.
    prefill: u64,
    /// What the policy keeps until the request ends ([`LoadGuard::keep`]).
    kept: Option<Box<dyn std::fmt::Debug + Send + Sync>>,
}

impl LoadGuard {
    /// Counts one more request on `worker` (whatever its breaker says).
    #[inline]
    pub fn new(worker: Arc<Worker>) -> Self {
        worker.in_flight.fetch_add(1, Ordering::AcqRel);
        Self {
            worker,
            trial: false,
            prefill: 0,
            kept: None,
        }
    }

    /// Counts one more request on `worker` if its circuit breaker lets it through (taking a
    /// trial slot when half-open); `None` if the breaker refuses.
    #[inline]
    pub fn admit(worker: Arc<Worker>) -> Option<Self> {
        let trial = worker.breaker.try_acquire()?;
        worker.in_flight.fetch_add(1, Ordering::AcqRel);
        Some(Self {
            worker,
            trial,
            prefill: 0,
            kept: None,
        })
    }

    /// The worker this guard counts on.
    #[inline]
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// Adds `tokens` (the prompt tokens the worker is expected to compute for this
    /// request) to the worker's prefill backlog until [`LoadGuard::prefill_done`] or the
    /// guard's end.
    #[inline]
    pub fn charge_prefill(&mut self, tokens: u64) {
        self.worker
            .prefill_backlog
            .fetch_add(tokens, Ordering::Relaxed);
        self.prefill += tokens;
    }

    /// Keeps `it` until the request ends (the guard drops): what the policy that routed
    /// the request holds for as long as it runs (`kv_aware`'s predicted pages).
    pub fn keep(&mut self, it: Box<dyn std::fmt::Debug + Send + Sync>) {
        self.kept = Some(it);
    }

    /// The request's prefill is over (its first output arrived): releases its charge.
    #[inline]
    pub fn prefill_done(&mut self) {
        if self.prefill > 0 {
            self.worker
                .prefill_backlog
                .fetch_sub(std::mem::take(&mut self.prefill), Ordering::Relaxed);
        }
    }
}

impl Drop for LoadGuard {
    #[inline]
    fn drop(&mut self) {
        self.prefill_done();
        if self.trial {
            self.worker.breaker.release_trial();
        }
        let before = self.worker.in_flight.fetch_sub(1, Ordering::AcqRel);
        if before == 1 && self.worker.draining.load(Ordering::Acquire) {
            self.worker.drained.notify_one();
        }
    }
}

/// Changes of any worker's state that decide whether it may take a request.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// A number that changes whenever any worker of this process changes in a way that can
/// change whether it takes requests: its status, model, draining, or an explicit circuit
/// breaker transition. (A breaker whose open period simply ran out becomes half-open when
/// next asked, without a change here.) What a selection keeps between requests (the
/// `round_robin` candidates) is valid while this stays the same.
pub fn state_epoch() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

/// Notes a change for [`state_epoch`].
pub(crate) fn bump_epoch() {
    EPOCH.fetch_add(1, Ordering::AcqRel);
}

/// Workers for tests (cargo feature `testing`; always in this crate's own tests).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use super::*;

    /// The spec of a regular worker at `url`, nothing else given.
    pub fn spec(url: &str) -> WorkerSpec {
        WorkerSpec {
            url: WorkerUrl::parse(url).unwrap(),
            worker_type: WorkerType::Regular,
            bootstrap_port: None,
            model_id: None,
            api_key: None,
            labels: BTreeMap::new(),
            priority: DEFAULT_PRIORITY,
        }
    }

    /// `n` ready regular workers `http://w{i}:1` serving model `m`.
    pub fn ready_workers(n: usize) -> Vec<Arc<Worker>> {
        (0..n)
            .map(|i| {
                let w = Worker::new(
                    spec(&format!("http://w{i}:1")),
                    None,
                    CancellationToken::new(),
                );
                w.set_status(WorkerStatus::Ready);
                w.set_model("m".into());
                Arc::new(w)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::spec;
    use super::*;

    #[test]
    fn guard_counts_and_model_matching() {
        let w = Arc::new(Worker::new(
            spec("http://a:1"),
            Some("gk"),
            CancellationToken::new(),
        ));
        assert_eq!(w.bearer().unwrap().to_str().unwrap(), "Bearer gk");
        assert!(!w.info().has_api_key);
        w.set_api_key(Some("own"), Some("gk"));
        assert_eq!(w.bearer().unwrap().to_str().unwrap(), "Bearer own");
        assert!(w.serves(Some("anything")), "unknown model serves any");
        w.set_model("m".into());
        assert!(w.serves(Some("m")) && !w.serves(Some("x")) && w.serves(None));
        let g1 = LoadGuard::new(w.clone());
        let g2 = LoadGuard::new(w.clone());
        assert_eq!(w.load(), 2);
        drop(g1);
        assert_eq!(w.load(), 1);
        drop(g2);
        assert_eq!(w.info().load, 0);
        // A prefill charge lasts until the first output or the guard's end, once.
        let (mut g1, mut g2) = (LoadGuard::new(w.clone()), LoadGuard::new(w.clone()));
        g1.charge_prefill(100);
        g2.charge_prefill(30);
        assert_eq!(w.prefill_backlog(), 130);
        g1.prefill_done();
        g1.prefill_done();
        assert_eq!(w.prefill_backlog(), 30);
        drop(g1);
        drop(g2);
        assert_eq!(w.prefill_backlog(), 0);
        assert!(!w.is_available());
        w.set_status(WorkerStatus::Ready);
        assert!(w.is_available());
    }

    #[tokio::test]
    async fn drain_waits_for_in_flight() {
        let w = Arc::new(Worker::new(
            spec("http://a:1"),
            None,
            CancellationToken::new(),
        ));
        w.set_status(WorkerStatus::Ready);
        let g = LoadGuard::new(w.clone());
        let w2 = w.clone();
        let t = tokio::spawn(async move { w2.drain().await });
        tokio::task::yield_now().await;
        assert!(w.is_draining() && !w.is_available() && !t.is_finished());
        drop(g);
        t.await.unwrap();
    }
}
