//! The PD router: each request goes to a prefill worker and a decode worker at once.
//!
//! In the order a request takes it: [`fields`] (what PD routing reads from the body) ->
//! [`crate::select`] twice (a prefill worker by the prefill policy, a decode worker by the
//! decode policy) -> [`rewrite`] (bootstrap host, port and fresh rooms spliced into the
//! body) -> [`exchange`] (both requests in flight, the first failure cancels the other,
//! decode's answer relayed) -> [`merge`] (the prefill's prompt logprobs put into decode's
//! answer when asked for).
//!
//! A side that could not be reached is excluded and the request retried (up to
//! `--retry-max-retries`) on a new pair with new rooms; the other side's request was
//! dropped. Any other failure answers at once.

pub mod exchange;
pub mod fields;
pub mod merge;
pub mod rewrite;

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use http::uri::PathAndQuery;
use openapi::workers::WorkerType;

use super::Inbound;
use super::dispatch::{Dispatcher, Outgoing};
use crate::error::{GatewayError, PdSide};
use crate::metrics::{self, Route};
use crate::select::{NoWorker, Policy, Want};
use crate::workers::{LoadGuard, Registry, Worker};
use exchange::{Plan, PrefillSide};
use fields::{MergeKind, PdFields};
use rewrite::Rooms;

/// A client request after PD inspection.
pub type PdInbound<'a> = Inbound<'a, PdFields<'a>>;

/// Routes requests to prefill/decode pairs.
#[derive(Debug)]
pub struct PdRouter {
    registry: Arc<Registry>,
    prefill_policy: Policy,
    decode_policy: Policy,
    dispatcher: Dispatcher,
    max_retries: u32,
}

impl PdRouter {
    /// A router over `registry`'s prefill and decode workers.
    pub fn new(
        registry: Arc<Registry>,
        prefill_policy: Policy,
        decode_policy: Policy,
        dispatcher: Dispatcher,
        max_retries: u32,
    ) -> Self {
        Self {
            registry,
            prefill_policy,
            decode_policy,
            dispatcher,
            max_retries,
        }
    }

    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        self.dispatcher.timeout()
    }

    /// Picks a worker of `side` for `model`, skipping `failed`.
    fn pick(
        &self,
        side: PdSide,
        model: Option<&str>,
        failed: &[Arc<Worker>],
    ) -> Result<Arc<Worker>, NoWorker> {
        let (policy, worker_type) = match side {
            PdSide::Prefill => (&self.prefill_policy, WorkerType::Prefill),
            PdSide::Decode => (&self.decode_policy, WorkerType::Decode),
        };
        let want = Want {
            worker_type,
            model,
            exclude: failed,
        };
        policy.select(&self.registry.snapshot(), &want)
    }

    /// Selects a pair, sends the request to both, relays decode's answer.
    pub async fn route(&self, req: PdInbound<'_>) -> Result<Response, GatewayError> {
        metrics::pd_request(Route::of(req.endpoint.path()));
        let model = req.fields.model();
        let batch = req.fields.batch(req.endpoint);
        let plan = Plan {
            merge: req.fields.merge(req.endpoint),
            stream: req.fields.is_stream(),
            timeout_secs: self.dispatcher.timeout().as_secs(),
        };
        let replace = req.fields.has_bootstrap();
        let path_and_query = req
            .parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static(req.endpoint.path()));
        let mut failed: Vec<Arc<Worker>> = Vec::new();
        let mut last_error: Option<GatewayError> = None;
        let mut deadline = self.dispatcher.deadline();
        loop {
            let pair = self
                .pick(PdSide::Prefill, model, &failed)
                .map_err(|e| (PdSide::Prefill, e))
                .and_then(|p| {
                    let d = self
                        .pick(PdSide::Decode, model, &failed)
                        .map_err(|e| (PdSide::Decode, e))?;
                    Ok((p, d))
                });
            let (prefill, decode) = match pair {
                Ok(pair) => pair,
                Err((side, e)) => {
                    return Err(last_error.unwrap_or_else(|| match e {
                        NoWorker::UnknownModel(m) => GatewayError::ModelNotFound(m),
                        NoWorker::NoneReady => GatewayError::NoReadyPdWorker {
                            side,
                            model: model.map(str::to_string),
                        },
                    }));
                }
            };
            // A new pair gets new rooms: a retried request never reuses a cancelled room.
            let rooms = Rooms::mint(batch);
            let host = prefill.url().authority().host();
            let body = rewrite::inject(&req.body, host, prefill.bootstrap_port(), &rooms, replace)?;
            let out = Outgoing {
                method: &req.parts.method,
                path_and_query: path_and_query.clone(),
                headers: &req.parts.headers,
                request_id: &req.request_id,
                body: &body,
            };
            let built = self
                .dispatcher
                .build(&prefill, &out)
                .and_then(|p| Ok((p, self.dispatcher.build(&decode, &out)?)));
            let (p_req, d_req) =
                built.map_err(|e| e.into_gateway_error(&prefill, self.timeout()))?;
            let client = self.dispatcher.client();
            let p_side = PrefillSide::new(
                client.request(p_req),
                LoadGuard::new(prefill.clone()),
                plan.merge != MergeKind::None,
            );
            let d_guard = LoadGuard::new(decode.clone());
            let d_fut = client.request(d_req);
            match exchange::run(p_side, d_fut, d_guard, plan, &mut deadline).await {
                Ok(resp) => return Ok(resp),
                Err(f) => {
                    f.charge();
                    let retry = f.retryable && (failed.len() as u32) < self.max_retries;
                    if !retry {
                        return Err(f.into_error());
                    }
                    tracing::debug!(side = %f.side, worker = f.worker.url().as_str(),
                        "PD worker unreachable, retrying on a new pair");
                    metrics::retry();
                    failed.push(f.worker.clone());
                    last_error = Some(f.into_error());
                }
            }
        }
    }
}
