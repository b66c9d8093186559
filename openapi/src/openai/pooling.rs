//! What reward and classifier models serve: SGLang's `/v1/classify` and `/v1/score`.
//! The gateway proxies both unchanged; these types document them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Extra;
use crate::shapes::Prompt;

/// A classify request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClassifyRequest {
    /// What to classify: a string, a list of strings (at most `--max-batch-size`), or
    /// token ids.
    pub input: Prompt,
    /// Model to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Fields this type does not name (`user`, `rid`, `priority`), passed unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// One input's class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Classification {
    /// Which input.
    pub index: u32,
    /// The most likely label.
    pub label: String,
    /// The probability of each class.
    pub probs: Vec<f64>,
    /// Classes the model knows.
    pub num_classes: u32,
}

/// A classify answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClassifyResponse {
    /// `classify-...`.
    pub id: String,
    /// `list`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// One class per input, in order.
    pub data: Vec<Classification>,
    /// Token counts.
    pub usage: super::Usage,
}

/// A score request: the probability of each label token after query + item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScoreRequest {
    /// The query (text or token ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<serde_json::Value>,
    /// The items (a string, strings, or token-id lists; at most `--max-batch-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<serde_json::Value>,
    /// The tokens whose probabilities are scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_token_ids: Option<Vec<u32>>,
    /// Model to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Fields this type does not name (`apply_softmax`, `item_first`, ...), passed unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// A score answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScoreResponse {
    /// One list per item, in `label_token_ids` order.
    pub scores: Vec<Vec<f64>>,
    /// The model.
    pub model: String,
    /// `scoring`.
    pub object: String,
    /// Fields this type does not name (`usage`, `pooled_hidden_states`).
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}
