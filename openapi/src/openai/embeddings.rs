//! `POST /v1/embeddings`: request and response (OpenAI's shapes, as SGLang serves them for
//! embedding models).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Extra;
use crate::shapes::Prompt;

/// An embeddings request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    /// What to embed: a string, a list of strings (at most the gateway's
    /// `--max-batch-size`), token ids, or a list of token-id lists.
    pub input: Prompt,
    /// Model to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `float` (default) or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<String>,
    /// Dimensions of the output (models that support truncation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    /// An end-user id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Fields this type does not name, passed to the worker unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// One input's embedding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Embedding {
    /// `embedding`.
    pub object: String,
    /// The vector.
    pub embedding: Vec<f32>,
    /// Which input it embeds.
    pub index: u32,
}

/// Token counts of an embeddings request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingUsage {
    /// Tokens in the inputs.
    pub prompt_tokens: u64,
    /// The same (nothing is generated).
    pub total_tokens: u64,
}

/// An embeddings response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingResponse {
    /// `list`.
    pub object: String,
    /// One embedding per input, in order.
    pub data: Vec<Embedding>,
    /// The model that made them.
    pub model: String,
    /// Token counts.
    pub usage: EmbeddingUsage,
}
