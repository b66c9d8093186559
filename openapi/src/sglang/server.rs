//! Bodies of an SGLang server's control endpoints: `/get_model_info`, `/get_server_info`,
//! `/get_load`, `/v1/loads`, and the two error shapes (OpenAI routes and `/generate`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::openai::Extra;

/// `GET /get_model_info` (also `/model_info`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelInfo {
    /// Path or hub name the weights were loaded from.
    pub model_path: String,
    /// Path or hub name of the tokenizer.
    #[serde(default)]
    pub tokenizer_path: Option<String>,
    /// True for generative models (false for embedding / reward models).
    #[serde(default = "yes")]
    pub is_generation: bool,
    /// Sampling defaults the model ships with.
    #[serde(default)]
    pub preferred_sampling_params: Option<Value>,
    /// Version of the loaded weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
    /// Accepts images.
    #[serde(default)]
    pub has_image_understanding: bool,
    /// Accepts audio.
    #[serde(default)]
    pub has_audio_understanding: bool,
    /// Hugging Face `model_type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
    /// Hugging Face `architectures`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architectures: Option<Vec<String>>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

fn yes() -> bool {
    true
}

/// `GET /get_server_info` (also `/server_info`): the server's arguments plus live state.
/// Only the fields a router reads are named; SGLang sends many more, kept in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServerInfo {
    /// Path or hub name of the weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_path: Option<String>,
    /// Path or hub name of the tokenizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_path: Option<String>,
    /// Name the OpenAI routes serve the model under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_model_name: Option<String>,
    /// Bind host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Bind port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Tensor-parallel size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_size: Option<u32>,
    /// Data-parallel size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_size: Option<u32>,
    /// Context length override (`null`: the model's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u64>,
    /// `"null"` (regular), `"prefill"` or `"decode"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disaggregation_mode: Option<String>,
    /// KV transfer backend of PD mode (`mooncake`, `nixl`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disaggregation_transfer_backend: Option<String>,
    /// Port of the prefill worker's bootstrap server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disaggregation_bootstrap_port: Option<u16>,
    /// KV cache capacity in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_num_tokens: Option<u64>,
    /// Longest accepted prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_req_input_len: Option<u64>,
    /// Concurrent request cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running_requests: Option<u64>,
    /// SGLang version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Per-scheduler live state (`last_gen_throughput`, `load`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_states: Option<Vec<Value>>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// One entry of `GET /get_load` (the body is a list, one entry per data-parallel rank).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LoadReport {
    /// Data-parallel rank.
    #[serde(default)]
    pub dp_rank: u32,
    /// Requests running or waiting.
    #[serde(default)]
    pub num_reqs: u64,
    /// Requests waiting in the queue.
    #[serde(default)]
    pub num_waiting_reqs: u64,
    /// Tokens held by those requests.
    #[serde(default)]
    pub num_tokens: u64,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// `GET /v1/loads`: detailed per-rank scheduler load (newer SGLang; smg polls it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Loads {
    /// When the loads were read (RFC 3339).
    #[serde(default)]
    pub timestamp: String,
    /// Server version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Number of data-parallel ranks reported.
    #[serde(default)]
    pub dp_rank_count: u32,
    /// One entry per data-parallel rank.
    #[serde(default)]
    pub loads: Vec<RankLoad>,
    /// Totals and averages over the ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<LoadAggregate>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// The load of one data-parallel rank in [`Loads`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct RankLoad {
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Requests being decoded.
    pub num_running_reqs: u64,
    /// Requests queued.
    pub num_waiting_reqs: u64,
    /// `num_running_reqs + num_waiting_reqs`.
    pub num_total_reqs: u64,
    /// KV tokens in use.
    pub num_used_tokens: u64,
    /// KV cache capacity in tokens.
    pub max_total_num_tokens: u64,
    /// `num_used_tokens / max_total_num_tokens`.
    pub token_usage: f64,
    /// Recent generation throughput, tokens per second.
    pub gen_throughput: f64,
    /// Prefix cache hit rate.
    pub cache_hit_rate: f64,
    /// Running requests over the running-request cap.
    pub utilization: f64,
    /// Running-request cap.
    pub max_running_requests: u64,
    /// Fields this type does not name (`memory`, `speculative`, `disaggregation`, ...).
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// Totals and averages of [`Loads`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct LoadAggregate {
    /// Running requests over all ranks.
    pub total_running_reqs: u64,
    /// Waiting requests over all ranks.
    pub total_waiting_reqs: u64,
    /// Running plus waiting.
    pub total_reqs: u64,
    /// Mean token usage.
    pub avg_token_usage: f64,
    /// Mean generation throughput.
    pub avg_throughput: f64,
    /// Mean utilization.
    pub avg_utilization: f64,
}

/// The error body of SGLang's OpenAI routes:
/// `{"object": "error", "message", "type", "param", "code"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorResponse {
    /// Always `"error"`.
    pub object: String,
    /// What went wrong.
    pub message: String,
    /// Error class, e.g. `"BadRequestError"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The offending parameter, when known.
    #[serde(default)]
    pub param: Option<String>,
    /// The HTTP status code.
    pub code: u16,
}

impl ErrorResponse {
    /// A 400 `BadRequestError` with `message`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ErrorResponse {
            object: "error".to_owned(),
            message: message.into(),
            kind: "BadRequestError".to_owned(),
            param: None,
            code: 400,
        }
    }
}

/// The error body of `/generate`: `{"error": {"message": ...}}` (also sent as a `data:`
/// event when a stream fails after it started).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateError {
    /// The error.
    pub error: GenerateErrorBody,
}

/// The inside of [`GenerateError`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateErrorBody {
    /// What went wrong.
    pub message: String,
}

impl GenerateError {
    /// An error with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        GenerateError {
            error: GenerateErrorBody {
                message: message.into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn info_bodies_round_trip() {
        let mi = json!({"model_path": "/m", "tokenizer_path": "/m", "is_generation": true,
            "preferred_sampling_params": null, "weight_version": "default",
            "has_image_understanding": false, "has_audio_understanding": false,
            "model_type": "llama", "architectures": ["LlamaForCausalLM"]});
        let m: ModelInfo = serde_json::from_value(mi.clone()).unwrap();
        assert_eq!(serde_json::to_value(&m).unwrap(), mi);

        let si = json!({"model_path": "/m", "served_model_name": "m", "port": 30000,
            "disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 8998,
            "internal_states": [{"load": 0}], "enable_metrics": false, "chunked_prefill_size": 8192});
        let s: ServerInfo = serde_json::from_value(si.clone()).unwrap();
        assert_eq!(s.disaggregation_bootstrap_port, Some(8998));
        assert_eq!(serde_json::to_value(&s).unwrap(), si);

        let load: Vec<LoadReport> = serde_json::from_value(
            json!([{"dp_rank": 0, "num_reqs": 3, "num_waiting_reqs": 1, "num_tokens": 300}]),
        )
        .unwrap();
        assert_eq!(load[0].num_reqs, 3);

        let loads = json!({"timestamp": "2026-01-01T00:00:00Z", "version": "0.5", "dp_rank_count": 1,
            "loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 1, "num_total_reqs": 3,
                "num_used_tokens": 10, "max_total_num_tokens": 100, "token_usage": 0.1,
                "gen_throughput": 5.0, "cache_hit_rate": 0.0, "utilization": 0.5,
                "max_running_requests": 4, "memory": {"weight_gb": 1.0}}],
            "aggregate": {"total_running_reqs": 2, "total_waiting_reqs": 1, "total_reqs": 3,
                "avg_token_usage": 0.1, "avg_throughput": 5.0, "avg_utilization": 0.5}});
        let l: Loads = serde_json::from_value(loads.clone()).unwrap();
        assert_eq!(l.loads[0].num_total_reqs, 3);
        assert_eq!(serde_json::to_value(&l).unwrap(), loads);
    }

    #[test]
    fn error_shapes() {
        assert_eq!(
            serde_json::to_value(ErrorResponse::bad_request("bad")).unwrap(),
            json!({"object": "error", "message": "bad", "type": "BadRequestError", "param": null, "code": 400})
        );
        assert_eq!(
            serde_json::to_value(GenerateError::new("bad")).unwrap(),
            json!({"error": {"message": "bad"}})
        );
    }
}
