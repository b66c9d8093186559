//! OpenAI's Responses API as SGLang serves it. A worker keeps each response (and the
//! conversation a `previous_response_id` continues) in its own memory, so the gateway
//! sends a response's follow-ups to the worker that made it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Extra;

/// A create-response request (the worker receives it unchanged).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponsesRequest {
    /// Text, or a list of input items (messages, tool outputs, ...).
    pub input: serde_json::Value,
    /// Model to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The response this one continues: the gateway sends the request to the worker
    /// holding it (404 `previous_response_not_found` when that worker is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
    /// Stream the answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Keep the response on the worker for retrieval (SGLang's default: true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    /// Answer at once with status `queued` and run in the background.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<bool>,
    /// Fields this type does not name, passed unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// A response object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseObject {
    /// `resp_...`: the id its follow-ups name.
    pub id: String,
    /// `response`.
    pub object: String,
    /// `queued`, `in_progress`, `completed`, `incomplete`, `failed` or `cancelled`.
    pub status: String,
    /// Fields this type does not name (`output`, `usage`, `model`, ...).
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// The input items of a response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseInputItems {
    /// `list`.
    pub object: String,
    /// The items, as the request gave them.
    pub data: Vec<serde_json::Value>,
    /// Fields this type does not name (`first_id`, `last_id`, `has_more`).
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}
