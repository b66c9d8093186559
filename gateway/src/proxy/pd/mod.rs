//! The PD router: each request goes to a prefill worker and a decode worker at once.
//!
//! In the order a request takes it: [`fields`] (what PD routing reads from the body) ->
//! [`crate::select`] twice (a prefill worker by the prefill policy, a decode worker by the
//! decode policy) -> [`rewrite`] (bootstrap host, port and fresh rooms spliced into the
//! body) -> [`exchange`] (both requests in flight, the first failure cancels the other,
//! decode's answer relayed) -> [`merge`] (the prefill's prompt logprobs put into decode's
//! answer when asked for). [`raw`] reads JSON without building values, for the rewrites.
//!
//! A failure before decode's answer is relayed (a side unreachable, broken, or answering
//! 408/429/500/502/503/504) is retried after a backoff (up to `--retry-max-retries`
//! attempts) on a new pair with new rooms, preferring workers not tried yet; the other
//! side's request was dropped. Only the failing side is charged (its breaker too).

pub mod decide;
pub mod exchange;
pub mod fields;
pub mod merge;
pub mod raw;
pub mod rewrite;

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use http::uri::PathAndQuery;
use openapi::workers::WorkerType;

use super::dispatch::{Dispatcher, Outgoing};
use super::prompt;
use super::retry::{RetryPolicy, Tries};
use super::{Inbound, PdServing};
use crate::error::{GatewayError, PdSide};
use crate::metrics::{self, Route};
use crate::outcome::PdPath;
use crate::select::Pick;
use crate::select::kv_aware::key_tokens;
use crate::select::{NoWorker, Policy, Want};
use crate::workers::{Registry, Worker};
use exchange::{Failure, Plan, PrefillSide};
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
    retry: RetryPolicy,
    bounds: Bounds,
}

/// What a PD request may size.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Items of a batch, each with its room (`--max-batch-size`).
    pub max_batch: usize,
    /// Bytes of an answer held for a logprob merge (`--max-payload-size`).
    pub hold: usize,
    /// Disaggregate or not.
    pub decider: decide::Decider,
}

impl From<&crate::config::ServeConfig> for Bounds {
    fn from(c: &crate::config::ServeConfig) -> Self {
        Self {
            max_batch: c.max_batch_size,
            hold: c.max_payload_size,
            decider: decide::Decider::from(c),
        }
    }
}

impl PdRouter {
    /// A router over `registry`'s prefill and decode workers, within `bounds`.
    pub fn new(
        registry: Arc<Registry>,
        [prefill_policy, decode_policy]: [Policy; 2],
        dispatcher: Dispatcher,
        retry: RetryPolicy,
        bounds: Bounds,
    ) -> Self {
        Self {
            registry,
            prefill_policy,
            decode_policy,
            dispatcher,
            retry,
            bounds,
        }
    }

    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        self.dispatcher.timeout()
    }

    /// The prefill and decode policies.
    pub fn policies(&self) -> [&Policy; 2] {
        [&self.prefill_policy, &self.decode_policy]
    }

    /// Picks a worker of `side` for `model`, given what this request went through.
    fn pick(
        &self,
        side: PdSide,
        model: Option<&str>,
        key: Option<&[u8]>,
        headers: &http::HeaderMap,
        tries: &Tries,
    ) -> Result<Pick, (PdSide, NoWorker)> {
        let (policy, worker_type) = match side {
            PdSide::Prefill => (&self.prefill_policy, WorkerType::Prefill),
            PdSide::Decode => (&self.decode_policy, WorkerType::Decode),
        };
        let want = Want {
            worker_type,
            model,
            exclude: &[],
            key: key.filter(|_| policy.needs_key()),
            affinity: policy.affinity(headers),
        };
        tries
            .select(policy, &self.registry.snapshot(), want)
            .map_err(|e| (side, e))
    }

    /// Disaggregate or not, for a request with prompt `key` and decode worker `decode`.
    fn path_for(&self, key: Option<&[u8]>, decode: &Arc<Worker>) -> PdPath {
        let tokens = key.and_then(key_tokens);
        let cached = match (&tokens, self.decode_policy.kv_aware()) {
            (Some(t), Some(kv)) => kv.cached_tokens(&[decode], t)[0],
            _ => None,
        };
        let prefill_load = self
            .registry
            .snapshot()
            .iter()
            .filter(|w| w.worker_type() == WorkerType::Prefill && w.is_available())
            .map(|w| w.load())
            .min()
            .unwrap_or(0);
        self.bounds.decider.decide(&decide::Facts {
            prompt_tokens: tokens.as_ref().map(|t| t.len() as u64),
            cached_on_decode: cached,
            prefill_load,
            decode_load: decode.load(),
        })
    }

    /// Sends the request, unchanged, to one worker of `side` alone: decode computing the
    /// prompt itself (the decider's choice), or prefill answering what needs no generation
    /// (tokenize). The worker is charged what its policy expects it to compute.
    async fn alone(
        &self,
        req: &PdInbound<'_>,
        path_and_query: PathAndQuery,
        (side, pick): (PdSide, Pick),
        tries: &mut Tries,
        deadline: &mut std::pin::Pin<Box<tokio::time::Sleep>>,
    ) -> Result<Response, GatewayError> {
        let decode = pick.worker.clone();
        let Some(guard) = pick.admit() else {
            return Err(GatewayError::PdCircuitOpen { side });
        };
        tries.attempts += 1;
        let out = Outgoing {
            method: &req.parts.method,
            path_and_query,
            headers: &req.parts.headers,
            request_id: &req.request_id,
            body: &req.body,
            ranked: req.endpoint.takes_dp_rank() && req.parts.method == http::Method::POST,
        };
        match self.dispatcher.send(&decode, &out, deadline).await {
            Ok(resp) => {
                decode.record(super::outcome_of(resp.status()));
                let left = std::mem::replace(deadline, self.dispatcher.deadline());
                Ok(super::respond::relay(resp, guard, left))
            }
            Err(e) => {
                decode.record(crate::workers::Outcome::Failure);
                Err(e.into_gateway_error(&decode, self.dispatcher.timeout()))
            }
        }
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
            hold_limit: self.bounds.hold,
        };
        let replace = req.fields.has_bootstrap();
        let headers = &req.parts.headers;
        let key = if self.prefill_policy.needs_key() || self.decode_policy.needs_key() {
            let tokenizer = self
                .prefill_policy
                .tokenizer()
                .or(self.decode_policy.tokenizer());
            prompt::routing_key_off_thread(req.endpoint, &req.body, tokenizer).await
        } else {
            None
        };
        let path_and_query = req.endpoint.worker_path_and_query(&req.parts.uri);
        let mut tries = Tries::default();
        let mut last: Option<Failure> = None;
        let mut deadline = self.dispatcher.deadline();
        if req.endpoint.pd() == PdServing::Prefill {
            let prefill = self
                .pick(PdSide::Prefill, model, None, headers, &tries)
                .map_err(|(side, e)| no_pair(side, e, model))?;
            let to = (PdSide::Prefill, prefill);
            return self
                .alone(&req, path_and_query, to, &mut tries, &mut deadline)
                .await;
        }
        loop {
            let pair = self
                .pick(PdSide::Prefill, model, key.as_deref(), headers, &tries)
                .and_then(|p| {
                    let d = self.pick(PdSide::Decode, model, key.as_deref(), headers, &tries)?;
                    Ok((p, d))
                });
            let (prefill_pick, decode_pick) = match pair {
                Ok(pair) => pair,
                Err((side, e)) => {
                    if let Some(f) = last {
                        return f.finish(&mut deadline);
                    }
                    return Err(no_pair(side, e, model));
                }
            };
            if self.bounds.decider.enabled() {
                let path = self.path_for(key.as_deref(), &decode_pick.worker);
                metrics::pd_path(path);
                if path != PdPath::Disaggregated {
                    return self
                        .alone(
                            &req,
                            path_and_query.clone(),
                            (PdSide::Decode, decode_pick),
                            &mut tries,
                            &mut deadline,
                        )
                        .await;
                }
            }
            // The prefill worker computes the prompt: its backlog is charged until its
            // answer (the KV sent). The decode worker computes none of it; both keep
            // their predicted pages while the request runs.
            let prefill = prefill_pick.worker.clone();
            let decode = decode_pick.worker.clone();
            let Some(p_guard) = prefill_pick.admit() else {
                tries.refused(prefill);
                continue;
            };
            let decode_pick = Pick {
                prefill_tokens: 0,
                ..decode_pick
            };
            let Some(d_guard) = decode_pick.admit() else {
                tries.refused(decode);
                continue;
            };
            tries.attempts += 1;
            // A new pair gets new rooms: a retried request never reuses a cancelled room.
            let mut rooms = Rooms::mint(batch, self.bounds.max_batch)?;
            if let Some(dp) = prefill.dp_rank() {
                rooms.align(dp.rank, dp.size);
            }
            let host = prefill.url().authority().host();
            let body = rewrite::inject(&req.body, host, prefill.bootstrap_port(), &rooms, replace)?;
            let out = Outgoing {
                method: &req.parts.method,
                path_and_query: path_and_query.clone(),
                headers: &req.parts.headers,
                request_id: &req.request_id,
                body: &body,
                ranked: true,
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
                p_guard,
                (plan.merge != MergeKind::None).then_some(plan.hold_limit),
            );
            let d_fut = client.request(d_req);
            match exchange::run(p_side, d_fut, d_guard, plan, &mut deadline).await {
                Ok(resp) => return Ok(resp),
                Err(f) => {
                    f.charge();
                    if !(f.retryable && self.retry.pause(tries.attempts, deadline.deadline()).await)
                    {
                        return f.finish(&mut deadline);
                    }
                    tracing::debug!(side = %f.side, worker = f.worker.url().as_str(),
                        cause = %f.cause, "PD attempt failed, retrying on a new pair");
                    tries.failed(f.worker.clone());
                    last = Some(f);
                }
            }
        }
    }
}

/// The error for a side that found no worker.
fn no_pair(side: PdSide, e: NoWorker, model: Option<&str>) -> GatewayError {
    match e {
        NoWorker::UnknownModel(m) => GatewayError::ModelNotFound(m),
        NoWorker::NoneReady => GatewayError::NoReadyPdWorker {
            side,
            model: model.map(str::to_string),
        },
        NoWorker::CircuitOpen => GatewayError::PdCircuitOpen { side },
        NoWorker::TargetUnavailable(t) => GatewayError::TargetUnavailable(t),
    }
}
