//! `POST /v1/completions`: request, response (also the streaming chunk), logprobs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{Extra, FinishReason, MatchedStop, StreamOptions, Usage};
use crate::shapes::Routing;
use crate::shapes::{Prompt, StopSequences};

/// A (legacy) text completion request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionRequest {
    /// Prompt(s): a string, a list of strings, token ids, or a list of token-id lists.
    pub prompt: Prompt,
    /// Model to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Stream the answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Options of a streamed answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Choices per prompt (at least 1; prompts x choices at most the gateway's
    /// `--max-batch-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub n: Option<u32>,
    /// Token limit per choice (OpenAI's default is 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Stop string(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopSequences>,
    /// Return this many top alternatives (and the chosen token's log probability) per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Put the prompt in front of the generated text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// SGLang's request id and PD bootstrap fields.
    #[serde(flatten)]
    pub routing: Routing,
    /// Every other field (`best_of`, `suffix`, `logit_bias`, `regex`, `json_schema`, ...).
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

impl CompletionRequest {
    /// A request for `prompt` with every optional field absent.
    pub fn new(prompt: Prompt) -> Self {
        CompletionRequest {
            prompt,
            model: None,
            stream: None,
            stream_options: None,
            n: None,
            max_tokens: None,
            temperature: None,
            top_p: None,
            stop: None,
            logprobs: None,
            echo: None,
            seed: None,
            routing: Routing::default(),
            extra: Extra::new(),
        }
    }

    /// Whether the answer is streamed.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a streamed answer ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }
}

/// A text completion; the same shape is each `data:` event of a streamed one
/// (`object` is `"text_completion"` in both).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionResponse {
    /// Request id.
    pub id: String,
    /// Always `"text_completion"`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model name the request asked for.
    pub model: String,
    /// One entry per choice (a chunk carries the choices it advances; the usage chunk none).
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// A streamed completion's chunk has the completion's shape.
pub type CompletionChunk = CompletionResponse;

/// One choice of a completion (or its step in a stream).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionChoice {
    /// Position of the choice: prompt index × n + sample index.
    pub index: u32,
    /// The generated text (the increment, in a stream).
    pub text: String,
    /// Log probabilities, when asked for.
    #[serde(default)]
    pub logprobs: Option<CompletionLogprobs>,
    /// Why generation stopped (on the last step).
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    /// SGLang: the stop token or string that ended the choice.
    #[serde(default)]
    pub matched_stop: Option<MatchedStop>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// OpenAI's completions `logprobs`: parallel lists, one entry per token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionLogprobs {
    /// Each token's text.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Each token's log probability (`null` for a prompt's first token).
    #[serde(default)]
    pub token_logprobs: Vec<Option<f64>>,
    /// The most likely tokens at each position, text to log probability.
    #[serde(default)]
    pub top_logprobs: Vec<Option<BTreeMap<String, f64>>>,
    /// Byte offset of each token in the choice's text (SGLang sends -1).
    #[serde(default)]
    pub text_offset: Vec<i64>,
}

impl CompletionLogprobs {
    /// Appends the entries of `other` (a later step of the same choice).
    pub fn extend(&mut self, other: CompletionLogprobs) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_prompt_form_parses_and_round_trips() {
        for prompt in [
            json!("hi"),
            json!(["a", "b"]),
            json!([1, 2]),
            json!([[1], [2, 3]]),
        ] {
            let v = json!({"model": "m", "prompt": prompt, "max_tokens": 4, "best_of": 1,
                           "ebnf": "root ::= x", "logprobs": 2, "echo": false});
            let r: CompletionRequest = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(r.extra["ebnf"], "root ::= x");
            assert_eq!(serde_json::to_value(&r).unwrap(), v);
        }
    }

    #[test]
    fn bad_prompts_are_rejected_clearly() {
        let err = serde_json::from_str::<CompletionRequest>(r#"{"model":"m"}"#).unwrap_err();
        assert!(err.to_string().contains("missing field `prompt`"), "{err}");
        let err = serde_json::from_str::<CompletionRequest>(r#"{"prompt":{"a":1}}"#).unwrap_err();
        assert!(err.to_string().contains("list of token-id lists"), "{err}");
        let err = serde_json::from_str::<CompletionRequest>(r#"{"prompt":["a",[1]]}"#).unwrap_err();
        assert!(err.to_string().contains("only strings"), "{err}");
    }

    #[test]
    fn response_with_logprobs_round_trips() {
        let v = json!({"id": "c", "object": "text_completion", "created": 2, "model": "m",
            "choices": [{"index": 0, "text": " a b",
                "logprobs": {"tokens": [" a", " b"], "token_logprobs": [-0.1, null],
                             "top_logprobs": [{" a": -0.1}, null], "text_offset": [0, 2]},
                "finish_reason": "length", "matched_stop": null}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}});
        let r: CompletionResponse = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(r.choices[0].finish_reason, Some(FinishReason::Length));
        assert_eq!(serde_json::to_value(&r).unwrap(), v);
        let mut lp = r.choices[0].logprobs.clone().unwrap();
        lp.extend(lp.clone());
        assert_eq!(lp.tokens.len(), 4);
    }
}
