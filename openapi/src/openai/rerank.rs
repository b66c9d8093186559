//! Rerank: SGLang's `/v1/rerank` (a reranker model scores documents against a query) and
//! the router's answer to it. A worker answers a bare list of [`RerankResult`]s; the
//! gateway answers both `/rerank` and `/v1/rerank` with a [`RerankResponse`] around that
//! list (as sglang-router does), applying `top_k` and `return_documents`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Extra;

/// A rerank request (`/rerank` and `/v1/rerank`; the worker receives it unchanged).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankRequest {
    /// The query the documents are scored against.
    pub query: String,
    /// The documents (at most the gateway's `--max-batch-size`).
    pub documents: Vec<String>,
    /// Model to use (the router's form; SGLang's ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The router's form: keep the best `top_k` results (the worker sorts them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// SGLang's form: the worker keeps the best `top_n`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_n: Option<u32>,
    /// Whether each result carries its document (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_documents: Option<bool>,
    /// The router's form: a request id, echoed as the answer's `id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rid: Option<serde_json::Value>,
    /// Fields this type does not name (`instruct`, ...), passed to the worker unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// One document's score, as a worker answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankResult {
    /// Relevance to the query.
    pub score: f64,
    /// The document (absent when `return_documents` is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<String>,
    /// Its position in the request's `documents`.
    pub index: u32,
    /// Worker details (token counts, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta_info: Option<serde_json::Value>,
}

/// The gateway's rerank answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankResponse {
    /// The results, best first, cut to `top_k`.
    pub results: Vec<RerankResult>,
    /// The model asked for (or the one the workers serve, when the request names none).
    pub model: String,
    /// `rerank`.
    pub object: String,
    /// The request's `rid`, if it sent one.
    pub id: Option<serde_json::Value>,
    /// Unix seconds.
    pub created: u64,
}
