//! SGLang's native API: `POST /generate` (request, sampling parameters, response, logprobs,
//! finish reasons), in [`server`] the info, load and error bodies of an SGLang server, and
//! in [`bootstrap`] the PD bootstrap server of a prefill worker.
//!
//! Batch requests are explicit: every per-item field is a [`OneOrMany`] (a scalar for the
//! whole request or a list with one entry per batch item), so the PD rewrite can inject
//! `bootstrap_host` / `bootstrap_port` / `bootstrap_room` in the form the batch needs.
//! Unknown fields (`regex`, `json_schema`, `lora_path`, `image_data`, `session_params`,
//! ...) stay in `extra` and are written back unchanged.

pub mod bootstrap;
pub mod server;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::openai::{Extra, FinishReason, MatchedStop};
use crate::shapes::{InputIds, OneOrMany, Routing, StopSequences};

/// `POST /generate`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateRequest {
    /// Prompt text: one string, or a list for a batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<OneOrMany<String>>,
    /// Prompt token ids: one list, or a list of lists for a batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ids: Option<InputIds>,
    /// Sampling parameters: one object, or one per batch item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_params: Option<OneOrMany<SamplingParams>>,
    /// Stream the output as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Return log probabilities in `meta_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_logprob: Option<OneOrMany<bool>>,
    /// First prompt position to return input logprobs for (`-1`: output tokens only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_start_len: Option<OneOrMany<i64>>,
    /// Alternatives to return per position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs_num: Option<OneOrMany<u32>>,
    /// Put the token text in the logprob entries (else `null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_text_in_logprobs: Option<bool>,
    /// SGLang's request id and PD bootstrap fields.
    #[serde(flatten)]
    pub routing: Routing,
    /// Every other field, unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

impl GenerateRequest {
    /// The batch size, or `None` for a single prompt (or when no prompt is given).
    pub fn batch_size(&self) -> Option<usize> {
        match (&self.text, &self.input_ids) {
            (Some(t), _) => t.list_len(),
            (None, Some(ids)) => ids.batch_len(),
            (None, None) => None,
        }
    }

    /// Whether the output is streamed.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }
}

/// `sampling_params` of a `/generate` request. Only the parameters that shape the length
/// and end of the output are named; the rest (`regex`, `json_schema`, `ebnf`,
/// `repetition_penalty`, ...) stay in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SamplingParams {
    /// Token limit (SGLang's default is 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<u32>,
    /// Tokens to generate before a stop may end the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_new_tokens: Option<u32>,
    /// Stop string(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopSequences>,
    /// Token ids that end the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Top-k sampling (`-1`: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Parallel samples per prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Keep going past the end-of-sequence token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// Keep a matched stop string in the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_stop_trim: Option<bool>,
    /// Every other parameter, unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// One output of `/generate` (a batch answers a list of them; a stream sends one per event,
/// with `text` and `output_ids` covering everything generated so far).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GenerateResponse {
    /// The generated text (absent when the server skips tokenizer init).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The generated token ids.
    #[serde(default)]
    pub output_ids: Vec<u32>,
    /// Ids, counts, finish reason, logprobs.
    pub meta_info: MetaInfo,
    /// Batch item of a streamed batch event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// `meta_info` of a `/generate` output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MetaInfo {
    /// Request id of this item.
    pub id: String,
    /// `null` until the item finishes.
    pub finish_reason: Option<GenerateFinishReason>,
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated so far.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Where the cached tokens came from, with HiCache on and some cached (SGLang's
    /// scheduler; `null` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens_details: Option<CachedTokensDetails>,
    /// Version of the weights that produced the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
    /// Seconds from arrival to finish (on the finished output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2e_latency: Option<f64>,
    /// Prompt logprobs from `logprob_start_len` on (the first prompt token has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_token_logprobs: Option<Vec<TokenLogprob>>,
    /// Logprob of each generated token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_token_logprobs: Option<Vec<TokenLogprob>>,
    /// Alternatives at each prompt position (`null` where there are none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_top_logprobs: Option<Vec<Option<Vec<TokenLogprob>>>>,
    /// Alternatives at each output position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_top_logprobs: Option<Vec<Option<Vec<TokenLogprob>>>>,
    /// Fields this type does not name (timings, `total_retractions`, `hidden_states`, ...).
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// `meta_info.cached_tokens_details`: a request's cached prompt tokens by the tier that held
/// them (SGLang HiCache: GPU, host memory, and the L3 storage backend when one is on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CachedTokensDetails {
    /// Tokens found in GPU memory.
    #[serde(default)]
    pub device: u64,
    /// Tokens loaded from host memory (HiCache L2).
    #[serde(default)]
    pub host: u64,
    /// Tokens loaded from the storage backend (L3), when one is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<u64>,
    /// The storage backend's class name (`MooncakeStore`), when one is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_backend: Option<String>,
}

/// SGLang's logprob entry, written as the array `[logprob, token_id, text]`: `logprob` is
/// `null` for the first prompt token, `text` is `null` unless `return_text_in_logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenLogprob(pub Option<f64>, pub u32, pub Option<String>);

/// Why a `/generate` output finished, in SGLang's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum GenerateFinishReason {
    /// `{"type": "length", "length": N}`: the token limit was reached.
    Length {
        /// The limit.
        length: u64,
    },
    /// `{"type": "stop", "matched": id | "text"}`: a stop token, string or EOS.
    Stop {
        /// What matched.
        #[serde(default)]
        matched: Option<MatchedStop>,
    },
    /// `{"type": "abort", "message": ...}`: the request was aborted.
    Abort {
        /// Why.
        #[serde(default)]
        message: Option<String>,
        /// HTTP status of the failure, when it is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status_code: Option<u16>,
        /// Error class.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        err_type: Option<String>,
    },
}

impl GenerateFinishReason {
    /// The OpenAI `finish_reason` and `matched_stop` this finish maps to.
    pub fn to_openai(&self) -> (FinishReason, Option<MatchedStop>) {
        match self {
            GenerateFinishReason::Length { .. } => (FinishReason::Length, None),
            GenerateFinishReason::Stop { matched } => (FinishReason::Stop, matched.clone()),
            GenerateFinishReason::Abort { .. } => (FinishReason::Abort, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn single_and_batch_requests_round_trip() {
        let single = json!({"text": "hi", "sampling_params": {"max_new_tokens": 8, "stop": "\n",
            "regex": "a+", "json_schema": "{}"}, "stream": true, "return_logprob": true,
            "logprob_start_len": 0, "top_logprobs_num": 2, "rid": "r",
            "bootstrap_host": "h", "bootstrap_port": 8998, "bootstrap_room": 9_000_000_000_000_000_000u64,
            "lora_path": "l", "separate_reasoning": true});
        let r: GenerateRequest = serde_json::from_value(single.clone()).unwrap();
        assert_eq!(r.batch_size(), None);
        let sp = r.sampling_params.as_ref().unwrap().get(0).unwrap();
        assert_eq!(sp.max_new_tokens, Some(8));
        assert_eq!(sp.extra["regex"], "a+");
        assert_eq!(r.extra["lora_path"], "l");
        assert_eq!(serde_json::to_value(&r).unwrap(), single);

        let batch = json!({"input_ids": [[1, 2], [3]], "sampling_params": [{"n": 1}, {"n": 1}],
            "rid": ["a", "b"], "bootstrap_host": ["h", "h"], "bootstrap_port": [null, 1],
            "bootstrap_room": [1, 2], "return_logprob": [true, false]});
        let r: GenerateRequest = serde_json::from_value(batch.clone()).unwrap();
        assert_eq!(r.batch_size(), Some(2));
        assert_eq!(
            r.routing.bootstrap_port.as_ref().unwrap().get(0),
            Some(&None)
        );
        assert_eq!(
            r.routing.rid,
            Some(OneOrMany::Many(vec!["a".into(), "b".into()]))
        );
        assert_eq!(serde_json::to_value(&r).unwrap(), batch);

        let texts: GenerateRequest = serde_json::from_str(r#"{"text":["a","b","c"]}"#).unwrap();
        assert_eq!(texts.batch_size(), Some(3));
    }

    #[test]
    fn bad_generate_shapes_are_named() {
        let err = serde_json::from_str::<GenerateRequest>(r#"{"text":5}"#).unwrap_err();
        assert!(err.to_string().contains("expected a string"), "{err}");
        let err = serde_json::from_str::<GenerateRequest>(r#"{"input_ids":"abc"}"#).unwrap_err();
        assert!(err.to_string().contains("list of token ids"), "{err}");
        let err = serde_json::from_str::<GenerateRequest>(
            r#"{"text":"a","sampling_params":{"max_new_tokens":"x"}}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("invalid type"), "{err}");
    }

    #[test]
    fn response_shapes_match_sglang() {
        let v = json!({"text": " a", "output_ids": [5], "meta_info": {"id": "r",
            "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": 2,
            "completion_tokens": 1, "cached_tokens": 0, "weight_version": "default",
            "e2e_latency": 0.5, "input_token_logprobs": [[null, 1, null], [-0.5, 2, "b"]],
            "output_token_logprobs": [[-0.25, 5, null]],
            "input_top_logprobs": [null, [[-0.5, 2, null]]],
            "output_top_logprobs": [[[-0.25, 5, null], [-1.0, 6, null]]],
            "total_retractions": 0}});
        let r: GenerateResponse = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(
            r.meta_info.input_token_logprobs.as_ref().unwrap()[0],
            TokenLogprob(None, 1, None)
        );
        assert_eq!(serde_json::to_value(&r).unwrap(), v);

        for (fr, oai) in [
            (json!({"type": "stop", "matched": 2}), FinishReason::Stop),
            (json!({"type": "stop", "matched": "\n"}), FinishReason::Stop),
            (
                json!({"type": "abort", "message": "x"}),
                FinishReason::Abort,
            ),
        ] {
            let f: GenerateFinishReason = serde_json::from_value(fr.clone()).unwrap();
            assert_eq!(f.to_openai().0, oai);
            assert_eq!(serde_json::to_value(&f).unwrap(), fr);
        }
    }
}
