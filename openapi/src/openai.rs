//! OpenAI-compatible bodies as SGLang serves them: chat completions, completions, models.
//!
//! Request types keep every field they do not name in `extra` (`#[serde(flatten)]`), so a
//! body parsed by the gateway and written again reaches the worker with SGLang's many
//! extension fields (`regex`, `json_schema`, `ebnf`, `separate_reasoning`, `lora_path`,
//! ...) unchanged. Named optional fields that were absent stay absent; a named field sent
//! as an explicit `null` is written back as absent (the same meaning to SGLang).
//!
//! Response types follow what SGLang emits (`matched_stop`, `reasoning_content`,
//! `usage.reasoning_tokens` are SGLang's additions to OpenAI's shapes) and also keep
//! unknown fields, so a response can be parsed, amended and written back.

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod pooling;
pub mod rerank;
pub mod responses;
pub mod tokenize;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// Unknown fields of a body, written back unchanged (key order may differ).
pub type Extra = Map<String, Value>;

/// `stream_options` of a streaming request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and empty `choices`) before `[DONE]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
    /// SGLang extension: put running `usage` on every chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuous_usage_stats: Option<bool>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// Token counts of a response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    /// Tokens in the prompt(s), counted once per prompt even when `n > 1`.
    pub prompt_tokens: u64,
    /// Tokens generated over all choices.
    pub completion_tokens: u64,
    /// `prompt_tokens + completion_tokens`.
    pub total_tokens: u64,
    /// Breakdown of the prompt tokens (SGLang fills `cached_tokens` with `--enable-cache-report`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// SGLang extension: tokens spent in reasoning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

impl Usage {
    /// Usage with `total_tokens` filled in and SGLang's `reasoning_tokens: 0`.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
            reasoning_tokens: Some(0),
            extra: Extra::new(),
        }
    }
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// Why a choice stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop string, stop token or end-of-sequence token was produced.
    Stop,
    /// The token limit (`max_tokens` / `max_completion_tokens`) was reached.
    Length,
    /// The model called tools.
    ToolCalls,
    /// Output was filtered.
    ContentFilter,
    /// Legacy function call.
    FunctionCall,
    /// SGLang: the request was aborted.
    Abort,
}

/// SGLang's `matched_stop`: the stop token id or the stop string that ended a choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MatchedStop {
    /// A stop token id (including end-of-sequence).
    Token(u32),
    /// A stop string.
    Text(String),
}

/// One entry of `/v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelCard {
    /// The served model name.
    pub id: String,
    /// Always `"model"`.
    #[serde(default = "model_object")]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// Owner; SGLang says `"sglang"`.
    #[serde(default)]
    pub owned_by: String,
    /// The model the served name is rooted at (SGLang: the model path).
    #[serde(default)]
    pub root: Option<String>,
    /// Parent model (LoRA adapters name their base model here).
    #[serde(default)]
    pub parent: Option<String>,
    /// Context length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

fn model_object() -> String {
    "model".to_owned()
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelList {
    /// Always `"list"`.
    #[serde(default = "list_object")]
    pub object: String,
    /// The models.
    pub data: Vec<ModelCard>,
}

fn list_object() -> String {
    "list".to_owned()
}

impl ModelList {
    /// A list of the given cards.
    pub fn new(data: Vec<ModelCard>) -> Self {
        ModelList {
            object: list_object(),
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usage_round_trips_with_extensions() {
        let v = json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                       "reasoning_tokens": 0, "completion_tokens_details": {"x": 1}});
        let u: Usage = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(u.total_tokens, 5);
        assert_eq!(serde_json::to_value(&u).unwrap(), v);
        assert_eq!(
            serde_json::to_value(Usage::new(3, 2)).unwrap()["total_tokens"],
            5
        );
    }

    #[test]
    fn finish_reason_and_matched_stop() {
        let f: FinishReason = serde_json::from_str(r#""tool_calls""#).unwrap();
        assert_eq!(f, FinishReason::ToolCalls);
        assert!(serde_json::from_str::<FinishReason>(r#""nope""#).is_err());
        let m: MatchedStop = serde_json::from_str("2").unwrap();
        assert_eq!(m, MatchedStop::Token(2));
        let m: MatchedStop = serde_json::from_str(r#""\n""#).unwrap();
        assert_eq!(m, MatchedStop::Text("\n".into()));
    }

    #[test]
    fn model_list_round_trips() {
        let v = json!({"object": "list", "data": [{"id": "m", "object": "model", "created": 1,
                       "owned_by": "sglang", "root": "m", "parent": null, "max_model_len": 4096}]});
        let l: ModelList = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(l.data[0].max_model_len, Some(4096));
        assert_eq!(serde_json::to_value(&l).unwrap(), v);
    }
}
