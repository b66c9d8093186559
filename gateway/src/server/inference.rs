//! Inference routes: read and inspect the body, hand it to the router, relay the answer.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::HeaderValue;
use http::request::Parts;
use openapi::error::ErrorResponse;
use openapi::openai::chat::{ChatCompletionRequest, ChatCompletionResponse};
use openapi::openai::completions::{CompletionRequest, CompletionResponse};
use openapi::openai::embeddings::{EmbeddingRequest, EmbeddingResponse};
use openapi::openai::{ModelCard, ModelList};
use openapi::sglang::GenerateRequest;
use openapi::sglang::server::{ModelInfo, ServerInfo};
use openapi::workers::WorkerType;
use std::time::Duration;

use super::AppState;
use crate::admission::Permit;
use crate::admission::tenants::ClientOwner;
use crate::error::{GatewayError, PdSide};
use crate::metrics;
use crate::proxy::body::rewrite_response;
use crate::proxy::envelope;
use crate::proxy::inspect::{read_body, routing_fields};
use crate::proxy::pd::PdInbound;
use crate::proxy::pd::fields::pd_fields;
use crate::proxy::rerank::Envelope;
use crate::proxy::response_id::IdTap;
use crate::proxy::{Endpoint, Inbound, PdServing, ServedBy};

/// Inspects and routes one inference request: the one entry of the inference path
/// ([`super::front::Entry`], which checked the client key; this runs inside the request's
/// span). The three `POST` routes below are their documentation only.
pub(crate) async fn proxy<B>(
    st: &AppState,
    endpoint: Endpoint,
    parts: Parts,
    body: B,
    request_id: HeaderValue,
) -> Response
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // PD workers generate; embedding, classifier and reward models are served by regular
    // workers (as smg), and a response's state by the one worker that made it.
    if endpoint.pd() == PdServing::No && st.pd_router().is_some() {
        return GatewayError::NotInPdMode(endpoint.path()).into_response();
    }
    admit(st, endpoint, parts, body, request_id).await
}

/// Admission control, then the request.
async fn admit<B>(
    st: &AppState,
    endpoint: Endpoint,
    parts: Parts,
    body: B,
    request_id: HeaderValue,
) -> Response
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // Admission first: a queued request holds no body in memory (so its class comes from a
    // header, as smg's). The permit rides on the response body, so the slot and the
    // tenant's count are held until the answer is over.
    let gate = parts
        .extensions
        .get::<ClientOwner>()
        .and_then(|o| st.tenants().gate(&st.auth().settings().tenants, o.0));
    let tenant = match &gate {
        Some(g) => match g.enter() {
            Ok(p) => {
                metrics::tenant_request(&g.tenant().name, "admitted");
                Some(p)
            }
            Err(r) => {
                metrics::tenant_request(&g.tenant().name, r.label());
                return GatewayError::Overloaded(r).into_response();
            }
        },
        None => None,
    };
    let admission = st.admission();
    let permit = if admission.is_active() {
        let max = gate.as_ref().and_then(|g| g.tenant().max_priority);
        match admission
            .admit(admission.class_of(&parts.headers, max))
            .await
        {
            Ok(p) => p.with_tenant(tenant),
            Err(r) => return GatewayError::Overloaded(r).into_response(),
        }
    } else {
        Permit::default().with_tenant(tenant)
    };
    permit.attach(admitted(st, endpoint, parts, body, request_id).await)
}

/// The request, admitted: read, inspect, route.
async fn admitted<B>(
    st: &AppState,
    endpoint: Endpoint,
    parts: Parts,
    body: B,
    request_id: HeaderValue,
) -> Response
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let body = match read_body(body, &parts.headers, st.config().max_payload_size).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let limit = st.config().max_batch_size;
    let resp = if let Some(pd) = st.pd_router() {
        let fields = match pd_fields(&body).and_then(|f| f.check(endpoint, limit).map(|()| f)) {
            Ok(f) => f,
            Err(e) => return e.into_response(),
        };
        let inbound = PdInbound {
            endpoint,
            parts: &parts,
            body: body.clone(),
            fields,
            request_id,
            target: None,
        };
        pd.route(inbound).await
    } else {
        let fields = match routing_fields(&body).and_then(|f| f.check(endpoint, limit).map(|()| f))
        {
            Ok(f) => f,
            Err(e) => return e.into_response(),
        };
        // A follow-up goes to the worker holding the response it continues.
        let home = match fields.previous_response_id.as_deref() {
            Some(id) if endpoint == Endpoint::Responses => {
                match super::responses::home_of(st, id, true).await {
                    Ok(w) => Some(w.url().as_str().to_owned()),
                    Err(e) => return e.into_response(),
                }
            }
            _ => None,
        };
        let inbound = Inbound {
            endpoint,
            parts: &parts,
            body: body.clone(),
            fields,
            request_id,
            target: home.as_deref(),
        };
        st.router().route(inbound).await
    };
    match resp {
        Ok(resp) => answered(st, endpoint, &body, resp),
        Err(e) => e.into_response(),
    }
}

/// A successful answer on its way: rerank's put into the router's envelope; a response's
/// id remembered with the worker that made it.
fn answered(st: &AppState, endpoint: Endpoint, body: &[u8], resp: Response) -> Response {
    if !resp.status().is_success() {
        return resp;
    }
    if endpoint.is_rerank() {
        let registry = st.registry().clone();
        let served = move || match registry.models().as_slice() {
            [one] => one.clone(),
            _ => "unknown".to_string(),
        };
        let envelope = Envelope::of(body).rewrite(served, st.config().max_payload_size);
        return rewrite_response(resp, envelope, false);
    }
    if endpoint == Endpoint::Responses {
        let Some(ServedBy(worker)) = resp.extensions().get::<ServedBy>().cloned() else {
            return resp;
        };
        let stream = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let tap = IdTap::new(st.homes().clone(), worker.url().as_str().to_owned(), stream);
        return rewrite_response(resp, Box::new(tap), true);
    }
    resp
}

/// The error answers of every proxied inference route (the OpenAI envelope; a worker's own
/// 4xx is relayed as it answered). In PD mode the 502 / 504 codes name the side:
/// `prefill_unavailable`, `decode_bad_gateway`, `prefill_timeout`, ...
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // a description for the OpenAPI document, never built
pub(super) enum ProxyErrors {
    /// Malformed JSON, or a count over the limit.
    #[response(
        status = 400,
        description = "Malformed JSON (with the parser's message), or a count over --max-batch-size (`too_many_items`: n, the items of a batch, logprob alternatives)"
    )]
    BadRequest(ErrorResponse),
    /// The body came too slowly.
    #[response(
        status = 408,
        description = "The body did not arrive within --client-body-timeout-secs (`request_timeout`), or no admission slot freed within --queue-timeout-secs (`queue_timeout`)"
    )]
    TooSlow(ErrorResponse),
    /// Unknown model.
    #[response(status = 404, description = "No worker serves the model")]
    NotFound(ErrorResponse),
    /// Too large.
    #[response(status = 413, description = "Body over --max-payload-size")]
    TooLarge(ErrorResponse),
    /// Admission control.
    #[response(
        status = 429,
        description = "Admission refused: queue full, over the rate limit, or over the key's tenant rate or concurrency (`Retry-After` set)"
    )]
    Overloaded(ErrorResponse),
    /// Worker unreachable.
    #[response(
        status = 502,
        description = "Worker unreachable, or its connection broke"
    )]
    BadGateway(ErrorResponse),
    /// No ready worker.
    #[response(
        status = 503,
        description = "No ready worker, every ready worker's circuit breaker is open, or the worker the target header names cannot take the request (`target_worker_unavailable`)"
    )]
    Unavailable(ErrorResponse),
    /// Worker timeout.
    #[response(status = 504, description = "No answer before --request-timeout-secs")]
    Timeout(ErrorResponse),
    /// A worker's own error, relayed.
    #[response(
        status = "default",
        description = "Any other error status a worker answered (its 4xx, or its 5xx once retries are spent), with its message in the OpenAI envelope"
    )]
    Worker(ErrorResponse),
}

/// OpenAI chat completions, streamed (SSE) or not, proxied to a worker unchanged.
#[utoipa::path(post, operation_id = openapi::routes::gateway::ChatCompletions::OPERATION_ID,
    path = openapi::routes::gateway::ChatCompletions::PATH, tag = "inference",
    request_body(content = ChatCompletionRequest, description = "OpenAI chat completion request; fields the gateway does not know are passed through unchanged"),
    responses(
        (status = 200, description = "The worker's answer: JSON, or `text/event-stream` of `ChatCompletionChunk`s ending with `data: [DONE]`", body = ChatCompletionResponse),
        ProxyErrors,
    ))]
pub fn chat_completions() {}

/// OpenAI text completions, proxied.
#[utoipa::path(post, operation_id = openapi::routes::gateway::Completions::OPERATION_ID,
    path = openapi::routes::gateway::Completions::PATH, tag = "inference",
    request_body(content = CompletionRequest, description = "OpenAI completion request; unknown fields are passed through unchanged"),
    responses(
        (status = 200, description = "The worker's answer (JSON or SSE)", body = CompletionResponse),
        ProxyErrors,
    ))]
pub fn completions() {}

/// OpenAI embeddings, proxied to a worker serving an embedding model (regular mode only).
#[utoipa::path(post, operation_id = openapi::routes::gateway::Embeddings::OPERATION_ID,
    path = openapi::routes::gateway::Embeddings::PATH, tag = "inference",
    request_body(content = EmbeddingRequest, description = "OpenAI embeddings request; unknown fields are passed through unchanged"),
    responses(
        (status = 200, description = "The worker's answer", body = EmbeddingResponse),
        (status = 501, description = "PD mode serves no embeddings (`not_served_in_pd_mode`)", body = ErrorResponse),
        ProxyErrors,
    ))]
pub fn embeddings() {}

/// SGLang native generation, proxied.
#[utoipa::path(post, operation_id = openapi::routes::gateway::Generate::OPERATION_ID,
    path = openapi::routes::gateway::Generate::PATH, tag = "inference",
    request_body(content = GenerateRequest, description = "SGLang /generate request (text or input_ids, single or batch); unknown fields are passed through unchanged"),
    responses(
        (status = 200, description = "The worker's answer (JSON or SSE)"),
        ProxyErrors,
    ))]
pub fn generate() {}

/// The models served by ready workers (union, de-duplicated).
#[utoipa::path(get, operation_id = openapi::routes::gateway::Models::OPERATION_ID,
    path = openapi::routes::gateway::Models::PATH, tag = "inference",
    responses((status = 200, description = "OpenAI model list", body = ModelList)))]
pub async fn models(State(st): State<AppState>) -> Json<ModelList> {
    let data = st
        .registry()
        .models()
        .into_iter()
        .map(|id| ModelCard {
            root: Some(id.clone()),
            id,
            object: "model".into(),
            created: 0,
            owned_by: "moongate".into(),
            parent: None,
            max_model_len: None,
            extra: Default::default(),
        })
        .collect();
    Json(ModelList::new(data))
}

/// SGLang's `/get_server_info` of a worker: a prefill worker in PD mode (as sglang-router
/// answers it), else a regular one.
#[utoipa::path(get, operation_id = openapi::routes::gateway::ServerInfoRoute::OPERATION_ID,
    path = openapi::routes::gateway::ServerInfoRoute::PATH, tag = "inference",
    responses(
        (status = 200, description = "The worker's server info, as it answered", body = ServerInfo),
        (status = 502, description = "Worker unreachable", body = ErrorResponse),
        (status = 503, description = "No ready worker", body = ErrorResponse),
        (status = "default", description = "The worker's own error status, its message in the OpenAI envelope", body = ErrorResponse),
    ))]
pub async fn server_info(State(st): State<AppState>) -> Response {
    from_one_worker(&st, "/get_server_info").await
}

/// SGLang's `/get_model_info` of a worker (a prefill worker in PD mode).
#[utoipa::path(get, operation_id = openapi::routes::gateway::ModelInfoRoute::OPERATION_ID,
    path = openapi::routes::gateway::ModelInfoRoute::PATH, tag = "inference",
    responses(
        (status = 200, description = "The worker's model info, as it answered", body = ModelInfo),
        (status = 502, description = "Worker unreachable", body = ErrorResponse),
        (status = 503, description = "No ready worker", body = ErrorResponse),
        (status = "default", description = "The worker's own error status, its message in the OpenAI envelope", body = ErrorResponse),
    ))]
pub async fn model_info(State(st): State<AppState>) -> Response {
    from_one_worker(&st, "/get_model_info").await
}

/// `GET path` on the first ready worker of the mode's answering type, relayed.
async fn from_one_worker(st: &AppState, path: &str) -> Response {
    let pd = st.pd_router().is_some();
    let kind = if pd {
        WorkerType::Prefill
    } else {
        WorkerType::Regular
    };
    let Some(worker) = st.registry().first_available(kind) else {
        let e = if pd {
            GatewayError::NoReadyPdWorker {
                side: PdSide::Prefill,
                model: None,
            }
        } else {
            GatewayError::NoReadyWorker { model: None }
        };
        return e.into_response();
    };
    let uri = match worker.url().join(path) {
        Ok(u) => u,
        Err(e) => return GatewayError::Internal(e.to_string()).into_response(),
    };
    let timeout = Duration::from_secs(st.config().health_check_timeout_secs);
    let bearer = worker.bearer();
    match st.client().get_small(uri, bearer.as_deref(), timeout).await {
        Ok((status, body)) => envelope::small_answer(status, body),
        Err(cause) => {
            worker.record_failure();
            GatewayError::WorkerUnreachable {
                worker: worker.url().as_str().to_string(),
                cause,
            }
            .into_response()
        }
    }
}
