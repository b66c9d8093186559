//! The load poll behind `least_load`: every `--load-poll-interval-secs` each available
//! worker's `/v1/loads` is read ([`super::fanout`]'s bounded fan-out, within
//! `--health-check-timeout-secs`) and kept on the worker ([`Worker::set_reported`]): its
//! ranks' used tokens, waiting requests and generation throughput summed, its KV usage the
//! fullest rank's. A worker that does not answer keeps its last report, which goes stale
//! (see [`crate::select::least_load`]). Runs only while some policy is `least_load`
//! (`AppState::spawn_load_poll`).

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use http::Method;
use openapi::sglang::server::Loads;
use tokio::time::Instant;

use super::AppState;
use super::fanout::{LOAD_LIMIT, asking};
use crate::workers::{ReportedLoad, Worker};

/// A worker's `/v1/loads` answer as the policy reads it.
pub fn reported(loads: &Loads, at: Instant) -> ReportedLoad {
    let ranks = &loads.loads;
    ReportedLoad {
        at,
        used_tokens: ranks.iter().map(|r| r.num_used_tokens).sum(),
        waiting_reqs: ranks.iter().map(|r| r.num_waiting_reqs).sum(),
        gen_throughput: ranks.iter().map(|r| r.gen_throughput).sum(),
        token_usage: ranks.iter().map(|r| r.token_usage).fold(0.0, f64::max),
    }
}

/// One poll of every available worker.
pub async fn poll_once(st: &AppState) {
    let workers: Vec<Arc<Worker>> = st
        .registry()
        .snapshot()
        .iter()
        .filter(|w| w.is_available())
        .cloned()
        .collect();
    let mut answers = asking(
        st,
        &workers,
        Method::GET,
        "/v1/loads",
        Bytes::new(),
        LOAD_LIMIT,
    )
    .enumerate();
    while let Some((i, answer)) = answers.next().await {
        let parsed = match answer {
            Ok((s, body)) if s.is_success() => serde_json::from_slice::<Loads>(&body).ok(),
            _ => None,
        };
        match parsed {
            Some(l) => workers[i].set_reported(reported(&l, Instant::now())),
            None => tracing::debug!(worker = workers[i].url().as_str(), "no /v1/loads answer"),
        }
    }
}
