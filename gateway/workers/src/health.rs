//! Health checking: one probe loop per worker.
//!
//! Rules (`pending -> ready <-> not_ready`):
//! - `pending` becomes `ready` on its first successful probe, `not_ready` after
//!   `failure_threshold` failures in a row;
//! - `ready` becomes `not_ready` after `failure_threshold` failures in a row;
//! - `not_ready` becomes `ready` after `success_threshold` successes in a row.
//!
//! Cadence: `interval` normally; `pending_interval` while pending or while a ready worker
//! has failures counting up, so new workers join and dead ones leave in about a second. A
//! connection failure seen by the proxy asks for a probe at once
//! ([`Worker::request_probe`]).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openapi::workers::{WorkerHealth, WorkerStatus};

use super::{Worker, discovery};
use crate::client::HttpClient;
use settings::ServeConfig;

/// Health-check settings (from [`ServeConfig`]).
#[derive(Debug, Clone)]
pub struct HealthConfig {
    /// Between probes of a settled worker.
    pub interval: Duration,
    /// Between probes of a pending or failing worker.
    pub pending_interval: Duration,
    /// Per probe.
    pub timeout: Duration,
    /// Failures in a row that make a worker `not_ready`.
    pub failure_threshold: u32,
    /// Successes in a row that make a `not_ready` worker `ready`.
    pub success_threshold: u32,
    /// Path probed.
    pub endpoint: String,
    /// No probing: workers are ready on registration.
    pub disabled: bool,
}

impl From<&ServeConfig> for HealthConfig {
    fn from(c: &ServeConfig) -> Self {
        Self {
            interval: Duration::from_secs(c.health_check_interval_secs),
            pending_interval: Duration::from_millis(c.health_check_pending_interval_ms),
            timeout: Duration::from_secs(c.health_check_timeout_secs),
            failure_threshold: c.health_failure_threshold.max(1),
            success_threshold: c.health_success_threshold.max(1),
            endpoint: c.health_check_endpoint.clone(),
            disabled: c.disable_health_check,
        }
    }
}

/// The next status after one probe outcome; updates the counters in `h`.
pub fn transition(
    status: WorkerStatus,
    h: &mut WorkerHealth,
    outcome: &Result<(), String>,
    cfg: &HealthConfig,
) -> WorkerStatus {
    h.last_checked_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64);
    match outcome {
        Ok(()) => {
            h.consecutive_successes = h.consecutive_successes.saturating_add(1);
            h.consecutive_failures = 0;
            h.last_error = None;
            match status {
                WorkerStatus::Pending => WorkerStatus::Ready,
                WorkerStatus::NotReady if h.consecutive_successes >= cfg.success_threshold => {
                    WorkerStatus::Ready
                }
                s => s,
            }
        }
        Err(e) => {
            h.consecutive_failures = h.consecutive_failures.saturating_add(1);
            h.consecutive_successes = 0;
            h.last_error = Some(e.clone());
            if h.consecutive_failures >= cfg.failure_threshold {
                WorkerStatus::NotReady
            } else {
                status
            }
        }
    }
}

/// How long to wait before the next probe.
pub fn next_delay(status: WorkerStatus, h: &WorkerHealth, cfg: &HealthConfig) -> Duration {
    let unsettled = status == WorkerStatus::Pending
        || (status == WorkerStatus::Ready && h.consecutive_failures > 0);
    if unsettled {
        cfg.pending_interval.min(cfg.interval)
    } else {
        cfg.interval
    }
}

/// One health check of a worker.
pub trait Probe: Send + Sync + 'static {
    /// `Ok` if the worker is healthy (and, once, its model was looked up).
    fn check(&self, worker: &Arc<Worker>) -> impl Future<Output = Result<(), String>> + Send;
}

/// The real probe: `GET <endpoint>` must answer 2xx within the timeout; then, with
/// `--dp-aware`, the worker's `dp_size` once (the worker is not healthy until it is
/// known; one of several ranks is sent on to be expanded); then, if the worker's model is
/// unknown, model discovery.
#[derive(Debug, Clone)]
pub struct HttpProbe {
    client: HttpClient,
    endpoint: String,
    timeout: Duration,
    /// `--dp-aware`: where a worker found to have several ranks goes (as rank 0), for its
    /// other ranks to be registered.
    ranks: Option<tokio::sync::mpsc::UnboundedSender<Arc<Worker>>>,
}

impl HttpProbe {
    /// A probe over `client`.
    pub fn new(client: HttpClient, cfg: &HealthConfig) -> Self {
        Self {
            client,
            endpoint: cfg.endpoint.clone(),
            timeout: cfg.timeout,
            ranks: None,
        }
    }

    /// The same probe learning each worker's data-parallel ranks (`--dp-aware`): a worker
    /// with several is sent to `ranks` once, as rank 0.
    pub fn learning_ranks(
        mut self,
        ranks: tokio::sync::mpsc::UnboundedSender<Arc<Worker>>,
    ) -> Self {
        self.ranks = Some(ranks);
        self
    }

    /// With `--dp-aware`, learns `worker`'s ranks unless known: `Err` while the worker
    /// does not say (it must not take requests without a rank).
    pub async fn learn_ranks(&self, worker: &Arc<Worker>) -> Result<(), String> {
        let Some(ranks) = &self.ranks else {
            return Ok(());
        };
        if worker.dp_known() {
            return Ok(());
        }
        let size = discovery::dp_size(&self.client, worker, self.timeout)
            .await
            .map_err(|e| format!("--dp-aware: its data-parallel size is not known: {e}"))?;
        self.discover(worker).await;
        if size > 1 {
            worker.set_dp(Some(super::DpRank { rank: 0, size }));
            tracing::info!(worker = %worker.url().as_str(), dp_size = size,
                "data-parallel ranks learnt; each is routed to on its own");
            let _ = ranks.send(worker.clone());
        } else {
            worker.set_dp(None);
        }
        Ok(())
    }

    /// Model discovery only (used when probing is disabled).
    pub async fn discover(&self, worker: &Worker) {
        if worker.model().is_some() {
            return;
        }
        match discovery::discover(&self.client, worker, self.timeout).await {
            Ok(m) => {
                tracing::info!(worker = %worker.url().as_str(), model = %m, "discovered model");
                worker.set_model(m);
            }
            Err(e) => tracing::warn!(worker = %worker.url().as_str(), error = %e,
                "model discovery failed; the worker will take requests for any model"),
        }
    }
}

impl Probe for HttpProbe {
    async fn check(&self, worker: &Arc<Worker>) -> Result<(), String> {
        let uri = worker
            .url()
            .join(&self.endpoint)
            .map_err(|e| e.to_string())?;
        let bearer = worker.bearer();
        let (status, _) = self
            .client
            .get_small(uri, bearer.as_deref(), self.timeout)
            .await?;
        if !status.is_success() {
            return Err(format!("{} answered {status}", self.endpoint));
        }
        self.learn_ranks(worker).await?;
        self.discover(worker).await;
        Ok(())
    }
}

/// Probes `worker` until its cancel token fires.
pub async fn run<P: Probe>(worker: Arc<Worker>, probe: Arc<P>, cfg: HealthConfig) {
    let cancel = worker.cancel_token().clone();
    loop {
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            r = probe.check(&worker) => r,
        };
        let before = worker.status();
        let (after, delay) = {
            let mut h = worker.health();
            let after = transition(before, &mut h, &outcome, &cfg);
            (after, next_delay(after, &h, &cfg))
        };
        if after != before {
            worker.set_status(after);
            match &outcome {
                Ok(()) => tracing::info!(worker = %worker.url().as_str(), from = before.as_str(),
                    to = after.as_str(), "worker health changed"),
                Err(e) => tracing::warn!(worker = %worker.url().as_str(), from = before.as_str(),
                    to = after.as_str(), error = %e, "worker health changed"),
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
            _ = worker.probe_requested().notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::spec;
    use parking_lot::Mutex;
    use std::collections::VecDeque;
    use tokio_util::sync::CancellationToken;

    fn cfg() -> HealthConfig {
        HealthConfig {
            interval: Duration::from_secs(10),
            pending_interval: Duration::from_millis(500),
            timeout: Duration::from_secs(1),
            failure_threshold: 3,
            success_threshold: 2,
            endpoint: "/health".into(),
            disabled: false,
        }
    }

    #[test]
    fn state_machine() {
        use WorkerStatus::*;
        let c = cfg();
        let ok = Ok(());
        let bad = Err("down".to_string());
        let mut h = WorkerHealth::default();
        assert_eq!(transition(Pending, &mut h, &ok, &c), Ready);
        assert_eq!(transition(Ready, &mut h, &bad, &c), Ready);
        assert_eq!(h.last_error.as_deref(), Some("down"));
        assert_eq!(transition(Ready, &mut h, &bad, &c), Ready);
        assert_eq!(
            transition(Ready, &mut h, &ok, &c),
            Ready,
            "a success resets the count"
        );
        for _ in 0..2 {
            assert_eq!(transition(Ready, &mut h, &bad, &c), Ready);
        }
        assert_eq!(transition(Ready, &mut h, &bad, &c), NotReady);
        assert_eq!(transition(NotReady, &mut h, &ok, &c), NotReady);
        assert_eq!(transition(NotReady, &mut h, &ok, &c), Ready);
        assert!(h.last_error.is_none() && h.last_checked_unix_ms.is_some());
        let mut h = WorkerHealth::default();
        for _ in 0..2 {
            assert_eq!(transition(Pending, &mut h, &bad, &c), Pending);
        }
        assert_eq!(transition(Pending, &mut h, &bad, &c), NotReady);
    }

    /// A probe that answers from a script and records when it was called.
    struct Scripted {
        answers: Mutex<VecDeque<bool>>,
        calls: Mutex<Vec<tokio::time::Instant>>,
    }

    impl Probe for Scripted {
        async fn check(&self, _: &Arc<Worker>) -> Result<(), String> {
            self.calls.lock().push(tokio::time::Instant::now());
            if self.answers.lock().pop_front().unwrap_or(true) {
                Ok(())
            } else {
                Err("refused".into())
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn loop_follows_thresholds_and_cadence() {
        let w = Arc::new(Worker::new(
            spec("http://a:1"),
            None,
            CancellationToken::new(),
        ));
        // pending: fail, fail, ok -> ready; then fail x3 -> not_ready; then ok, ok -> ready.
        let script = [false, false, true, false, false, false, true, true];
        let probe = Arc::new(Scripted {
            answers: Mutex::new(script.into_iter().collect()),
            calls: Mutex::new(Vec::new()),
        });
        let start = tokio::time::Instant::now();
        let task = tokio::spawn(run(w.clone(), probe.clone(), cfg()));
        let at = |ms: u64| start + Duration::from_millis(ms);
        tokio::time::sleep_until(at(1)).await;
        assert_eq!(w.status(), WorkerStatus::Pending);
        tokio::time::sleep_until(at(1001)).await; // third probe at 1000 ms succeeds
        assert_eq!(w.status(), WorkerStatus::Ready);
        // settled: next probe 10 s later fails, then the 500 ms cadence until not_ready.
        tokio::time::sleep_until(at(11_001)).await;
        assert_eq!(w.status(), WorkerStatus::Ready);
        tokio::time::sleep_until(at(12_001)).await;
        assert_eq!(w.status(), WorkerStatus::NotReady);
        assert_eq!(w.health().consecutive_failures, 3);
        // not_ready: back to 10 s; two successes bring it back.
        tokio::time::sleep_until(at(22_001)).await;
        assert_eq!(w.status(), WorkerStatus::NotReady);
        tokio::time::sleep_until(at(32_001)).await;
        assert_eq!(w.status(), WorkerStatus::Ready);
        let offsets: Vec<u128> = probe
            .calls
            .lock()
            .iter()
            .map(|t| (*t - start).as_millis())
            .collect();
        assert_eq!(
            offsets,
            vec![0, 500, 1000, 11_000, 11_500, 12_000, 22_000, 32_000]
        );
        // A requested probe runs at once.
        w.request_probe();
        tokio::time::sleep_until(at(32_002)).await;
        assert_eq!(probe.calls.lock().len(), 9);
        w.cancel_token().cancel();
        task.await.unwrap();
    }
}
