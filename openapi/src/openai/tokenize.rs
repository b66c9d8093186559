//! SGLang's `/v1/tokenize` and `/v1/detokenize`: the model's tokenizer, served by a
//! worker. The gateway proxies both unchanged; these types document them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Extra;

/// A tokenize request: `prompt`, or chat `messages` (rendered with the chat template).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenizeRequest {
    /// Text, or a list of texts (at most `--max-batch-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<serde_json::Value>,
    /// Chat messages instead of `prompt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<serde_json::Value>>,
    /// Model to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Add the tokenizer's special tokens (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_special_tokens: Option<bool>,
    /// Fields this type does not name, passed unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// A tokenize answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenizeResponse {
    /// The ids (a list per prompt when `prompt` was a list).
    pub tokens: serde_json::Value,
    /// How many (one count per prompt when `prompt` was a list).
    pub count: serde_json::Value,
    /// The model's context length.
    pub max_model_len: i64,
}

/// A detokenize request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DetokenizeRequest {
    /// Token ids, or a list of them.
    pub tokens: serde_json::Value,
    /// Model to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Drop special tokens (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// Fields this type does not name, passed unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// A detokenize answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DetokenizeResponse {
    /// The text (a list when `tokens` was a list of lists).
    pub text: serde_json::Value,
}
