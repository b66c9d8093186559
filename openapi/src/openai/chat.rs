//! `POST /v1/chat/completions`: request, response, streaming chunk, logprobs.

use std::fmt;

use serde::de::value::SeqAccessDeserializer;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{Extra, FinishReason, MatchedStop, StreamOptions, Usage};
use crate::shapes::Routing;
use crate::shapes::StopSequences;

/// A chat completion request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    /// The conversation so far (at least one message).
    #[schema(min_items = 1)]
    pub messages: Vec<ChatMessage>,
    /// Model to use; SGLang serves its one model whatever the name, the gateway routes on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Stream the answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Options of a streamed answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Number of choices to generate (at least 1; at most the gateway's `--max-batch-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub n: Option<u32>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Token limit (deprecated by OpenAI in favour of `max_completion_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Token limit for the completion; wins over `max_tokens` when both are set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// Stop string(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopSequences>,
    /// Return log probabilities of the output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// Alternatives to return per output token (needs `logprobs: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Tool definitions, passed through as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
    /// `"none"`, `"auto"`, `"required"` or a named tool, passed through as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// SGLang's request id and PD bootstrap fields.
    #[serde(flatten)]
    pub routing: Routing,
    /// Every other field (`frequency_penalty`, `response_format`, `regex`, `ebnf`,
    /// `separate_reasoning`, `lora_path`, `chat_template_kwargs`, ...), unchanged.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

impl ChatCompletionRequest {
    /// The effective token limit: `max_completion_tokens`, else `max_tokens`.
    pub fn max_output_tokens(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
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

/// One message of the conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant`, `tool` or `function`.
    pub role: String,
    /// Text, or a list of content parts; absent or `null` for tool-calling assistant turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// Optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls made by an assistant turn, passed through as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Fields this type does not name (`reasoning_content`, ...).
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// A message's content: plain text or a list of typed parts.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed parts (`text`, `image_url`, `video_url`, `audio_url`, ...).
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// Calls `f` with each piece of text, in order (the text parts of a part list).
    pub fn for_each_text(&self, mut f: impl FnMut(&str)) {
        match self {
            MessageContent::Text(t) => f(t),
            MessageContent::Parts(parts) => {
                parts.iter().filter_map(|p| p.text.as_deref()).for_each(f)
            }
        }
    }
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MessageContent;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of content parts")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(MessageContent::Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(MessageContent::Text(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::<ContentPart>::deserialize(SeqAccessDeserializer::new(seq))
                    .map(MessageContent::Parts)
            }
        }
        d.deserialize_any(V)
    }
}

/// One typed part of a message's content. Only `type` and `text` are named; the payload
/// of other part types (`image_url: {url, detail}`, ...) stays in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ContentPart {
    /// Part type: `text`, `image_url`, `video_url`, `audio_url`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The rest of the part.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// A complete (non-streamed) chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionResponse {
    /// Request id.
    pub id: String,
    /// Always `"chat.completion"`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model name the request asked for.
    pub model: String,
    /// One entry per choice.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Fields this type does not name (SGLang: `metadata`, `sglext`).
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// One choice of a complete chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatChoice {
    /// Position of the choice.
    pub index: u32,
    /// The generated message.
    pub message: ChatResponseMessage,
    /// Log probabilities, when asked for.
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    /// Why generation stopped.
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

/// The message of a complete choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatResponseMessage {
    /// Always `"assistant"`.
    pub role: String,
    /// The generated text.
    #[serde(default)]
    pub content: Option<String>,
    /// SGLang: reasoning text separated from the answer.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// Tool calls, as JSON.
    #[serde(default)]
    pub tool_calls: Option<Value>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// One `data:` event of a streamed chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionChunk {
    /// Request id (the same on every chunk).
    pub id: String,
    /// Always `"chat.completion.chunk"`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model name the request asked for.
    pub model: String,
    /// The choices this chunk advances (empty on the final usage chunk).
    pub choices: Vec<ChatChunkChoice>,
    /// Token counts (the final chunk, with `stream_options.include_usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// One choice's step in a streamed chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatChunkChoice {
    /// Position of the choice.
    pub index: u32,
    /// What this step adds to the message.
    pub delta: ChatDelta,
    /// Log probabilities of the tokens in this step.
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the choice's last step.
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

/// The increment of a streamed message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatDelta {
    /// `"assistant"` on a choice's first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// New text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// SGLang writes this key on every delta (`null` without a reasoning parser).
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// Tool call increments, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// Fields this type does not name.
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// `choices[].logprobs` of a chat completion.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatLogprobs {
    /// One entry per output token.
    pub content: Vec<ChatTokenLogprob>,
}

/// Log probability of one output token, with its most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// The token's UTF-8 bytes.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    /// Natural-log probability.
    pub logprob: f64,
    /// The most likely tokens at this position (`top_logprobs` of them).
    #[serde(default)]
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative at an output position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// The token's UTF-8 bytes.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    /// Natural-log probability.
    pub logprob: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn request_round_trips_with_unknown_fields() {
        let v = json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:...", "detail": "low"}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{}"}}], "reasoning_content": "hm"},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}
            ],
            "stream": true, "stream_options": {"include_usage": true},
            "n": 2, "temperature": 0.7, "top_p": 0.9, "max_tokens": 10, "max_completion_tokens": 8,
            "stop": ["\n", "END"], "logprobs": true, "top_logprobs": 3, "seed": 42,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": "auto",
            "rid": "r1", "bootstrap_host": "10.0.0.1", "bootstrap_port": null, "bootstrap_room": 123,
            "regex": "[a-z]+", "separate_reasoning": false, "lora_path": "a",
            "chat_template_kwargs": {"enable_thinking": false}
        });
        let r: ChatCompletionRequest = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(r.max_output_tokens(), Some(8));
        assert!(r.is_stream() && r.include_usage());
        assert_eq!(r.extra["regex"], "[a-z]+");
        assert!(matches!(&r.messages[1].content, Some(MessageContent::Parts(p)) if p.len() == 2));
        assert_eq!(r.messages[2].content, None);
        let mut texts = Vec::new();
        r.messages[1]
            .content
            .as_ref()
            .unwrap()
            .for_each_text(|t| texts.push(t.to_owned()));
        assert_eq!(texts, ["what is this?"]);
        // Explicit nulls of named optional fields come back absent; all else is unchanged.
        let mut expected = v;
        expected.as_object_mut().unwrap().remove("bootstrap_port");
        expected["messages"][2]
            .as_object_mut()
            .unwrap()
            .remove("content");
        assert_eq!(serde_json::to_value(&r).unwrap(), expected);
    }

    #[test]
    fn minimal_request_stays_minimal() {
        let s = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        let r: ChatCompletionRequest = serde_json::from_str(s).unwrap();
        assert_eq!(serde_json::to_string(&r).unwrap(), s);
        assert!(!r.is_stream() && !r.include_usage());
    }

    #[test]
    fn bad_shapes_name_the_problem() {
        let err = serde_json::from_str::<ChatCompletionRequest>(r#"{"model":"m"}"#).unwrap_err();
        assert!(
            err.to_string().contains("missing field `messages`"),
            "{err}"
        );
        let err = serde_json::from_str::<ChatCompletionRequest>(
            r#"{"messages":[{"role":"user","content":5}]}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("a string or a list of content parts"),
            "{err}"
        );
        let err =
            serde_json::from_str::<ChatCompletionRequest>(r#"{"messages":[],"max_tokens":-1}"#)
                .unwrap_err();
        assert!(err.to_string().contains("-1"), "{err}");
        let err = serde_json::from_str::<ChatCompletionRequest>(r#"{"messages":[],"stop":7}"#)
            .unwrap_err();
        assert!(err.to_string().contains("stop string"), "{err}");
    }

    #[test]
    fn response_and_chunk_shapes() {
        let v = json!({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0,
                "message": {"role": "assistant", "content": "hi", "reasoning_content": null, "tool_calls": null},
                "logprobs": {"content": [{"token": " hi", "bytes": [32, 104, 105], "logprob": -0.5,
                    "top_logprobs": [{"token": " hi", "bytes": [32, 104, 105], "logprob": -0.5}]}]},
                "finish_reason": "stop", "matched_stop": 2}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            "metadata": {"weight_version": "default"}});
        let r: ChatCompletionResponse = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(r.choices[0].matched_stop, Some(MatchedStop::Token(2)));
        assert_eq!(serde_json::to_value(&r).unwrap(), v);

        let c = json!({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "reasoning_content": null},
                "logprobs": null, "finish_reason": null, "matched_stop": null}]});
        let chunk: ChatCompletionChunk = serde_json::from_value(c.clone()).unwrap();
        assert_eq!(serde_json::to_value(&chunk).unwrap(), c);
    }
}
