//! The OpenAPI documentation of the proxied routes besides generation: rerank, classify,
//! score, tokenize and the Responses API's create. The front door's one entry serves
//! them all ([`super::front::Entry`], then `inference::proxy`); these functions are
//! their documentation only.

use openapi::error::ErrorResponse;
use openapi::openai::pooling::{ClassifyRequest, ClassifyResponse, ScoreRequest, ScoreResponse};
use openapi::openai::rerank::{RerankRequest, RerankResponse};
use openapi::openai::responses::{ResponseObject, ResponsesRequest};
use openapi::openai::tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
};
use openapi::routes::gateway as routes;

use super::inference::ProxyErrors;

/// Rerank, the router's form: sent unchanged to a worker's `/v1/rerank` (PD mode: to a
/// prefill/decode pair), its list of results answered as `{results, model, object, id,
/// created}` with `top_k` and `return_documents` applied.
#[utoipa::path(post, operation_id = routes::Rerank::OPERATION_ID,
    path = routes::Rerank::PATH, tag = "inference",
    request_body(content = RerankRequest, description = "Query and documents; unknown fields are passed through unchanged"),
    responses(
        (status = 200, description = "The results, best first", body = RerankResponse),
        ProxyErrors,
    ))]
pub fn rerank() {}

/// Rerank, SGLang's form (`top_n`, `instruct`, ...), answered like `/rerank`.
#[utoipa::path(post, operation_id = routes::V1Rerank::OPERATION_ID,
    path = routes::V1Rerank::PATH, tag = "inference",
    request_body(content = RerankRequest, description = "Query and documents; unknown fields are passed through unchanged"),
    responses(
        (status = 200, description = "The results, best first", body = RerankResponse),
        ProxyErrors,
    ))]
pub fn v1_rerank() {}

/// Classification by a classifier model, proxied (regular mode).
#[utoipa::path(post, operation_id = routes::Classify::OPERATION_ID,
    path = routes::Classify::PATH, tag = "inference",
    request_body(content = ClassifyRequest, description = "What to classify; unknown fields are passed through unchanged"),
    responses(
        (status = 200, description = "The worker's answer", body = ClassifyResponse),
        (status = 501, description = "PD mode serves no classifier (`not_served_in_pd_mode`)", body = ErrorResponse),
        ProxyErrors,
    ))]
pub fn classify() {}

/// Label-token scores of a query with each item, proxied (regular mode).
#[utoipa::path(post, operation_id = routes::Score::OPERATION_ID,
    path = routes::Score::PATH, tag = "inference",
    request_body(content = ScoreRequest, description = "Query, items and label tokens; unknown fields are passed through unchanged"),
    responses(
        (status = 200, description = "The worker's answer", body = ScoreResponse),
        (status = 501, description = "PD mode serves no scoring (`not_served_in_pd_mode`)", body = ErrorResponse),
        ProxyErrors,
    ))]
pub fn score() {}

/// The model's tokenizer, on a worker serving it (PD mode: a prefill worker).
#[utoipa::path(post, operation_id = routes::Tokenize::OPERATION_ID,
    path = routes::Tokenize::PATH, tag = "inference",
    request_body(content = TokenizeRequest, description = "`prompt` or `messages`; unknown fields are passed through unchanged"),
    responses(
        (status = 200, description = "The worker's answer", body = TokenizeResponse),
        ProxyErrors,
    ))]
pub fn tokenize() {}

/// The model's detokenizer, on a worker serving it (PD mode: a prefill worker).
#[utoipa::path(post, operation_id = routes::Detokenize::OPERATION_ID,
    path = routes::Detokenize::PATH, tag = "inference",
    request_body(content = DetokenizeRequest, description = "Token ids; unknown fields are passed through unchanged"),
    responses(
        (status = 200, description = "The worker's answer", body = DetokenizeResponse),
        ProxyErrors,
    ))]
pub fn detokenize() {}

/// A response (OpenAI's Responses API), made by a worker that keeps it: the gateway
/// remembers which, and sends the response's routes by id and its `previous_response_id`
/// follow-ups there (regular mode).
#[utoipa::path(post, operation_id = routes::Responses::OPERATION_ID,
    path = routes::Responses::PATH, tag = "inference",
    request_body(content = ResponsesRequest, description = "The request; unknown fields are passed through unchanged"),
    responses(
        (status = 200, description = "The response: JSON, or `text/event-stream` of `event:`/`data:` events from `response.created` to `response.completed`", body = ResponseObject),
        (status = 404, description = "The `previous_response_id`'s worker has left (`previous_response_not_found`)", body = ErrorResponse),
        (status = 501, description = "PD mode serves no Responses API (`not_served_in_pd_mode`)", body = ErrorResponse),
        ProxyErrors,
    ))]
pub fn create_response() {}
