//! The request path, in the order a request takes it:
//! [`inspect`] (read the body, pull `model`/`stream`) -> [`crate::select`] (pick a worker)
//! -> rewrite (none in regular mode; the PD router injects bootstrap fields here) ->
//! [`dispatch`] (send over the pooled client, retry elsewhere if the worker cannot be
//! reached) -> [`respond`] (relay the response, release the load guard at body end).
//!
//! [`RegularRouter`] composes them for regular workers; [`pd::PdRouter`] for prefill/decode
//! pairs (`select` twice, the bootstrap rewrite, `dispatch` to both, decode's response).

pub mod dispatch;
pub mod inspect;
pub mod pd;
pub mod respond;

use std::sync::Arc;

use axum::response::Response;
use bytes::Bytes;
use http::HeaderValue;
use http::request::Parts;
use http::uri::PathAndQuery;
use openapi::workers::WorkerType;

use crate::error::GatewayError;
use crate::select::{NoWorker, Policy, Want};
use crate::workers::{LoadGuard, Registry, Worker};
use dispatch::{DispatchError, Dispatcher, Outgoing};
use inspect::RoutingFields;

/// The inference endpoints the gateway proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /generate` (SGLang native).
    Generate,
}

impl Endpoint {
    /// The route path (also the path on the worker).
    pub fn path(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
            Self::Generate => "/generate",
        }
    }
}

/// A client request after inspection, ready for a router (`F`: what the router read from
/// the body).
#[derive(Debug)]
pub struct Inbound<'a, F = RoutingFields<'a>> {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// Method, URI and headers as the client sent them.
    pub parts: &'a Parts,
    /// The body bytes exactly as received.
    pub body: Bytes,
    /// What routing reads from the body.
    pub fields: F,
    /// The request id (the client's `x-request-id`, or one minted by the gateway).
    pub request_id: HeaderValue,
}

/// Routes requests to regular workers.
#[derive(Debug)]
pub struct RegularRouter {
    registry: Arc<Registry>,
    policy: Policy,
    dispatcher: Dispatcher,
    max_retries: u32,
}

impl RegularRouter {
    /// A router over `registry`; `max_retries` other workers are tried when one cannot be
    /// reached.
    pub fn new(
        registry: Arc<Registry>,
        policy: Policy,
        dispatcher: Dispatcher,
        max_retries: u32,
    ) -> Self {
        Self {
            registry,
            policy,
            dispatcher,
            max_retries,
        }
    }

    /// Selects a worker, sends the request, relays the response.
    pub async fn route(&self, req: Inbound<'_>) -> Result<Response, GatewayError> {
        let model = req.fields.model();
        let mut failed: Vec<Arc<Worker>> = Vec::new();
        let mut last_error: Option<GatewayError> = None;
        let mut deadline = self.dispatcher.deadline();
        let out = Outgoing {
            method: &req.parts.method,
            path_and_query: req
                .parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static(req.endpoint.path())),
            headers: &req.parts.headers,
            request_id: &req.request_id,
            body: &req.body,
        };
        loop {
            let want = Want {
                worker_type: WorkerType::Regular,
                model,
                exclude: &failed,
            };
            let worker = match self.policy.select(&self.registry.snapshot(), &want) {
                Ok(w) => w,
                // After failures, report the last one rather than "none ready".
                Err(NoWorker::NoneReady) => {
                    return Err(last_error.unwrap_or_else(|| GatewayError::NoReadyWorker {
                        model: model.map(str::to_string),
                    }));
                }
                Err(e) => return Err(e.into()),
            };
            let guard = LoadGuard::new(worker);
            let sent = self
                .dispatcher
                .send(guard.worker(), &out, &mut deadline)
                .await;
            match sent {
                Ok(resp) => return Ok(respond::relay(resp, guard, deadline)),
                Err(e) => {
                    let worker = guard.worker().clone();
                    drop(guard);
                    let retry = matches!(e, DispatchError::Connect(_))
                        && (failed.len() as u32) < self.max_retries;
                    if matches!(e, DispatchError::Connect(_) | DispatchError::Failed(_)) {
                        worker.record_failure();
                    }
                    let err = e.into_gateway_error(&worker, self.dispatcher.timeout());
                    if !retry {
                        return Err(err);
                    }
                    tracing::debug!(
                        worker = worker.url().as_str(),
                        "worker unreachable, retrying on another"
                    );
                    crate::metrics::retry();
                    last_error = Some(err);
                    failed.push(worker);
                }
            }
        }
    }
}
