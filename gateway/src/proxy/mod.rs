//! The request path, in the order a request takes it:
//! [`inspect`] (read the body, pull `model`/`stream`) -> [`prompt`] (the prompt key, for
//! `cache_aware` only) -> [`crate::select`] (pick a worker) -> rewrite (none in regular
//! mode; the PD router injects bootstrap fields here) -> [`dispatch`] (send over the pooled
//! client) -> [`retry`] (another worker after a backoff, while nothing reached the client)
//! -> [`respond`] (relay the response, release the load guard at body end; a worker's error
//! answer put into the OpenAI envelope by [`envelope`]; answers rewritten on their way by
//! [`body`]).
//!
//! [`RegularRouter`] composes them for regular workers; [`pd::PdRouter`] for prefill/decode
//! pairs (`select` twice, the bootstrap rewrite, `dispatch` to both, decode's response).
//! Both record each attempt's outcome with the worker's circuit breaker.

pub mod body;
pub mod dispatch;
pub mod envelope;
pub mod inspect;
pub mod members;
pub mod pd;
pub mod prompt;
pub mod rerank;
pub mod respond;
pub mod response_id;
pub mod retry;

use openapi::routes::gateway as routes;
use std::sync::Arc;

use axum::response::Response;
use bytes::Bytes;
use http::HeaderValue;
use http::request::Parts;
use http::uri::PathAndQuery;
use openapi::workers::WorkerType;

use hyper::body::Incoming;

use crate::error::GatewayError;
use crate::select::{NoWorker, Policy, Want};
use crate::workers::{LoadGuard, Outcome, Registry};
use dispatch::{DispatchError, Dispatcher, Outgoing};
use inspect::RoutingFields;
use retry::{RetryPolicy, Tries, is_retryable_status};

/// The inference endpoints the gateway proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /generate` (SGLang native).
    Generate,
    /// `POST /v1/embeddings` (regular mode only: PD workers generate).
    Embeddings,
    /// `POST /rerank` (the router's form: `top_k`, `return_documents`, `rid`).
    Rerank,
    /// `POST /v1/rerank` (SGLang's form).
    V1Rerank,
    /// `POST /v1/classify` (regular mode only).
    Classify,
    /// `POST /v1/score` (regular mode only).
    Score,
    /// `POST /v1/tokenize` (PD mode: a prefill worker).
    Tokenize,
    /// `POST /v1/detokenize` (PD mode: a prefill worker).
    Detokenize,
    /// `POST /v1/responses` (regular mode only; the response id stays with its worker).
    Responses,
}

/// How PD mode serves an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdServing {
    /// A prefill/decode pair, with the bootstrap rewrite (generation, rerank).
    Pair,
    /// One prefill worker alone (it holds the tokenizer; nothing is generated).
    Prefill,
    /// Not at all: `501 not_served_in_pd_mode` (models PD workers do not run, or state a
    /// pair cannot keep).
    No,
}

impl Endpoint {
    /// The route path.
    pub fn path(self) -> &'static str {
        match self {
            Self::ChatCompletions => routes::ChatCompletions::PATH,
            Self::Completions => routes::Completions::PATH,
            Self::Generate => routes::Generate::PATH,
            Self::Embeddings => routes::Embeddings::PATH,
            Self::Rerank => routes::Rerank::PATH,
            Self::V1Rerank => routes::V1Rerank::PATH,
            Self::Classify => routes::Classify::PATH,
            Self::Score => routes::Score::PATH,
            Self::Tokenize => routes::Tokenize::PATH,
            Self::Detokenize => routes::Detokenize::PATH,
            Self::Responses => routes::Responses::PATH,
        }
    }

    /// The path on the worker: the route's own, but `/rerank` goes to SGLang's
    /// `/v1/rerank` (as sglang-router sends it).
    pub fn worker_path(self) -> &'static str {
        match self {
            Self::Rerank => routes::V1Rerank::PATH,
            other => other.path(),
        }
    }

    /// How PD mode serves it.
    pub fn pd(self) -> PdServing {
        match self {
            Self::ChatCompletions
            | Self::Completions
            | Self::Generate
            | Self::Rerank
            | Self::V1Rerank => PdServing::Pair,
            Self::Tokenize | Self::Detokenize => PdServing::Prefill,
            Self::Embeddings | Self::Classify | Self::Score | Self::Responses => PdServing::No,
        }
    }

    /// Whether a `POST` body of this endpoint carries the chosen data-parallel rank
    /// (`--dp-aware`): every one that runs on a rank's scheduler, not tokenize and
    /// detokenize (the worker's tokenizer answers those alone).
    pub fn takes_dp_rank(self) -> bool {
        !matches!(self, Self::Tokenize | Self::Detokenize)
    }

    /// Whether the answer is rewritten into the router's rerank envelope.
    pub fn is_rerank(self) -> bool {
        matches!(self, Self::Rerank | Self::V1Rerank)
    }

    /// The worker path with the client's query string, if it sent one.
    pub fn worker_path_and_query(self, uri: &http::Uri) -> PathAndQuery {
        match uri.path_and_query() {
            Some(pq) if pq.path() == self.worker_path() => pq.clone(),
            Some(pq) => match pq.query() {
                Some(q) => format!("{}?{q}", self.worker_path())
                    .parse()
                    .unwrap_or_else(|_| PathAndQuery::from_static(self.worker_path())),
                None => PathAndQuery::from_static(self.worker_path()),
            },
            None => PathAndQuery::from_static(self.worker_path()),
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
    /// The one worker (URL) the request must go to, whatever the headers say: the holder
    /// of the response a Responses API request continues.
    pub target: Option<&'a str>,
}

/// The worker that answered: put on the response of a route whose answer the gateway
/// remembers the worker of (the Responses API).
#[derive(Debug, Clone)]
pub struct ServedBy(pub Arc<crate::workers::Worker>);

/// Routes requests to regular workers.
#[derive(Debug)]
pub struct RegularRouter {
    registry: Arc<Registry>,
    policy: Policy,
    dispatcher: Dispatcher,
    retry: RetryPolicy,
}

/// What a failed attempt leaves for the client if no later attempt succeeds.
enum Last {
    /// The gateway's error.
    Error(GatewayError),
    /// The worker's own (retryable) answer, relayed as it is.
    Answer(http::Response<Incoming>, LoadGuard),
}

/// The breaker outcome of a response status: a server error counts against the worker.
#[inline]
pub fn outcome_of(status: http::StatusCode) -> Outcome {
    if status.is_server_error() {
        Outcome::Failure
    } else {
        Outcome::Success
    }
}

impl RegularRouter {
    /// A router over `registry`, retrying per `retry`.
    pub fn new(
        registry: Arc<Registry>,
        policy: Policy,
        dispatcher: Dispatcher,
        retry: RetryPolicy,
    ) -> Self {
        Self {
            registry,
            policy,
            dispatcher,
            retry,
        }
    }

    /// The load-balancing policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Selects a worker, sends the request, relays the response; retries (another worker
    /// when there is one, after a backoff) while no byte reached the client.
    pub async fn route(&self, req: Inbound<'_>) -> Result<Response, GatewayError> {
        let model = req.fields.model();
        let key = if self.policy.needs_key() {
            prompt::routing_key_off_thread(req.endpoint, &req.body, self.policy.tokenizer()).await
        } else {
            None
        };
        let mut affinity = self.policy.affinity(&req.parts.headers);
        if req.target.is_some() {
            affinity.target = req.target;
        }
        let mut tries = Tries::default();
        let mut last: Option<Last> = None;
        let mut deadline = self.dispatcher.deadline();
        let out = Outgoing {
            method: &req.parts.method,
            path_and_query: req.endpoint.worker_path_and_query(&req.parts.uri),
            headers: &req.parts.headers,
            request_id: &req.request_id,
            body: &req.body,
            ranked: req.endpoint.takes_dp_rank() && req.parts.method == http::Method::POST,
        };
        loop {
            let want = Want {
                worker_type: WorkerType::Regular,
                model,
                exclude: &[],
                key: key.as_deref(),
                affinity,
            };
            let pick = match tries.select(&self.policy, &self.registry.snapshot(), want) {
                Ok(p) => p,
                Err(e) => {
                    return match last {
                        // After failures, report the last one rather than "none ready".
                        Some(Last::Answer(resp, guard)) => {
                            Ok(respond::relay(resp, guard, deadline))
                        }
                        Some(Last::Error(err)) => Err(err),
                        None => Err(no_worker(e, model)),
                    };
                }
            };
            let worker = pick.worker.clone();
            let Some(mut guard) = pick.admit() else {
                tries.refused(worker);
                continue;
            };
            tries.attempts += 1;
            let sent = self.dispatcher.send(&worker, &out, &mut deadline).await;
            match sent {
                Ok(resp) => {
                    let status = resp.status();
                    worker.record(outcome_of(status));
                    if is_retryable_status(status)
                        && self.retry.pause(tries.attempts, deadline.deadline()).await
                    {
                        tracing::debug!(worker = worker.url().as_str(), %status,
                            "retryable answer, retrying");
                        tries.failed(worker);
                        // Kept in case every retry fails too; the worker's prefill is over.
                        guard.prefill_done();
                        last = Some(Last::Answer(resp, guard));
                        continue;
                    }
                    let mut resp = respond::relay(resp, guard, deadline);
                    if req.endpoint == Endpoint::Responses {
                        resp.extensions_mut().insert(ServedBy(worker));
                    }
                    return Ok(resp);
                }
                Err(e) => {
                    drop(guard);
                    let retryable =
                        matches!(e, DispatchError::Connect(_) | DispatchError::Failed(_));
                    if !matches!(e, DispatchError::Build(_)) {
                        worker.record(Outcome::Failure);
                    }
                    let err = e.into_gateway_error(&worker, self.dispatcher.timeout());
                    if !(retryable && self.retry.pause(tries.attempts, deadline.deadline()).await) {
                        return Err(err);
                    }
                    tracing::debug!(worker = worker.url().as_str(), "worker failed, retrying");
                    tries.failed(worker);
                    last = Some(Last::Error(err));
                }
            }
        }
    }
}

/// The error for a selection that found no worker.
fn no_worker(e: NoWorker, model: Option<&str>) -> GatewayError {
    match e {
        NoWorker::NoneReady => GatewayError::NoReadyWorker {
            model: model.map(str::to_string),
        },
        other => other.into(),
    }
}
