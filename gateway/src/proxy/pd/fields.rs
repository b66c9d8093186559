//! What PD routing reads from a request body, in one pass and without copying: the
//! routing fields (`model`, `stream`), how many items the request carries (each needs its
//! own bootstrap room), whether the prefill side's input logprobs must be merged, and
//! whether the client already sent bootstrap fields (then the body is rewritten instead of
//! spliced, so no key appears twice).
//!
//! Every field besides `model` and `stream` is read leniently: a value of an unexpected
//! shape counts as "not asked" rather than failing the request (the workers judge the
//! request; the gateway only routes it).

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::error::GatewayError;
use crate::proxy::Endpoint;
use crate::proxy::inspect::{RoutingFields, routing_fields_as};

/// The fields a PD request is routed by.
#[derive(Debug, Default, Deserialize)]
pub struct PdFields<'a> {
    /// `model`.
    #[serde(
        borrow,
        default,
        deserialize_with = "crate::proxy::inspect::borrowed_str"
    )]
    pub model: Option<Cow<'a, str>>,
    /// `stream`.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `/generate`'s `text`.
    #[serde(default)]
    pub text: Shape,
    /// `/generate`'s `input_ids`.
    #[serde(default)]
    pub input_ids: Shape,
    /// `/v1/completions`' `prompt`.
    #[serde(default)]
    pub prompt: Shape,
    /// Choices per prompt (chat: each choice is an item of its own).
    #[serde(default)]
    pub n: Shape,
    /// `/generate`'s `return_logprob` (a flag, or one per item).
    #[serde(default)]
    pub return_logprob: Shape,
    /// `logprobs` (completions: a number of alternatives; present means asked).
    #[serde(default)]
    pub logprobs: Shape,
    /// `echo` (completions: the prompt, and with `logprobs` its logprobs, come back).
    #[serde(default)]
    pub echo: Shape,
    /// A bootstrap field the client sent itself (any value, `null` included).
    #[serde(default)]
    pub bootstrap_host: Shape,
    /// A bootstrap field the client sent itself.
    #[serde(default)]
    pub bootstrap_port: Shape,
    /// A bootstrap field the client sent itself.
    #[serde(default)]
    pub bootstrap_room: Shape,
}

/// Which logprobs the gateway merges from the prefill side into decode's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeKind {
    /// Nothing to merge.
    None,
    /// SGLang's `meta_info.input_token_logprobs` / `input_top_logprobs` (`/generate`).
    MetaInfo,
    /// OpenAI completions' `logprobs` of the echoed prompt (`echo` with `logprobs`).
    CompletionEcho,
}

impl PdFields<'_> {
    /// The routing view (`model`, `stream`).
    pub fn routing(&self) -> RoutingFields<'_> {
        RoutingFields {
            model: self.model.as_deref().map(Cow::Borrowed),
            stream: self.stream,
        }
    }

    /// The model asked for; an empty string counts as none.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref().filter(|m| !m.is_empty())
    }

    /// Whether the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// `None` for a single request; `Some(n)` for a batch of `n` items, each of which gets
    /// its own bootstrap room: `/generate` with a list of texts or of token-id lists,
    /// `/v1/completions` with a list of prompts, chat with `n > 1`.
    pub fn batch(&self, endpoint: Endpoint) -> Option<usize> {
        match endpoint {
            // `text` wins over `input_ids` when both are sent (as SGLang reads them).
            Endpoint::Generate => match self.text {
                Shape::Absent | Shape::Null => self.input_ids.batch(),
                _ => self.text.batch(),
            },
            Endpoint::Completions => self.prompt.batch(),
            Endpoint::ChatCompletions => match self.n {
                Shape::Num(Some(n)) if n > 1 => usize::try_from(n).ok(),
                _ => None,
            },
        }
    }

    /// What logprobs must be merged for this endpoint.
    pub fn merge(&self, endpoint: Endpoint) -> MergeKind {
        match endpoint {
            Endpoint::Generate if self.return_logprob.any_true() => MergeKind::MetaInfo,
            Endpoint::Completions if self.echo.any_true() && self.logprobs.is_given() => {
                MergeKind::CompletionEcho
            }
            _ => MergeKind::None,
        }
    }

    /// Whether the client sent any bootstrap field itself.
    pub fn has_bootstrap(&self) -> bool {
        [
            &self.bootstrap_host,
            &self.bootstrap_port,
            &self.bootstrap_room,
        ]
        .iter()
        .any(|s| !matches!(s, Shape::Absent))
    }
}

/// Parses the PD fields of a JSON object body (errors as [`routing_fields_as`] reports them).
pub fn pd_fields(body: &[u8]) -> Result<PdFields<'_>, GatewayError> {
    routing_fields_as(body)
}

/// The shape of a JSON value, read without copying anything: what the PD fields need to
/// know of a value (how many items a list holds, whether it is a flag that is set).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The key is not in the body.
    #[default]
    Absent,
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number (its value when it is a non-negative integer).
    Num(Option<u64>),
    /// A string.
    Str,
    /// A list: its length, whether its first element is a number, whether one element is
    /// `true`.
    Seq {
        /// Elements.
        len: usize,
        /// The first element is a number (a list of token ids).
        first_num: bool,
        /// An element is `true` (a list of flags with one set).
        any_true: bool,
    },
    /// An object.
    Map,
}

impl Shape {
    /// As a prompt: `None` for one prompt (a string, or a list of token ids), `Some(n)` for
    /// a batch (a list of strings or of token-id lists).
    fn batch(&self) -> Option<usize> {
        match *self {
            Shape::Seq {
                first_num: true, ..
            } => None,
            Shape::Seq { len, .. } => Some(len),
            _ => None,
        }
    }

    /// As a flag or list of flags: one is `true`.
    fn any_true(&self) -> bool {
        matches!(self, Shape::Bool(true) | Shape::Seq { any_true: true, .. })
    }

    /// Given with a value other than `null` or `false`.
    fn is_given(&self) -> bool {
        !matches!(self, Shape::Absent | Shape::Null | Shape::Bool(false))
    }
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Shape;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_unit<E>(self) -> Result<Shape, E> {
                Ok(Shape::Null)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Shape, E> {
                Ok(Shape::Bool(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Shape, E> {
                Ok(Shape::Num(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Shape, E> {
                Ok(Shape::Num(u64::try_from(v).ok()))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
                Ok(Shape::Num(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Shape, E> {
                Ok(Shape::Str)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
                let (mut len, mut first_num, mut any_true) = (0, false, false);
                while let Some(e) = seq.next_element::<Shape>()? {
                    first_num |= len == 0 && matches!(e, Shape::Num(_));
                    any_true |= e == Shape::Bool(true);
                    len += 1;
                }
                Ok(Shape::Seq {
                    len,
                    first_num,
                    any_true,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Shape::Map)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(body: &str) -> PdFields<'_> {
        pd_fields(body.as_bytes()).unwrap()
    }

    #[test]
    fn batches_by_endpoint() {
        use Endpoint::*;
        for (body, ep, batch) in [
            (r#"{"text":"a"}"#, Generate, None),
            (r#"{"text":["a","b","c"]}"#, Generate, Some(3)),
            (r#"{"text":[]}"#, Generate, Some(0)),
            (r#"{"input_ids":[1,2,3]}"#, Generate, None),
            (r#"{"input_ids":[[1],[2,3]]}"#, Generate, Some(2)),
            (r#"{"text":null,"input_ids":[[1],[2]]}"#, Generate, Some(2)),
            (r#"{"text":"a","input_ids":[[1],[2]]}"#, Generate, None),
            (r#"{"prompt":"x"}"#, Completions, None),
            (r#"{"prompt":[1,2]}"#, Completions, None),
            (r#"{"prompt":["x","y"]}"#, Completions, Some(2)),
            (r#"{"prompt":[[1],[2],[3]],"n":2}"#, Completions, Some(3)),
            (r#"{"messages":[],"n":1}"#, ChatCompletions, None),
            (r#"{"messages":[],"n":4}"#, ChatCompletions, Some(4)),
            (r#"{"messages":[],"n":"x"}"#, ChatCompletions, None),
        ] {
            assert_eq!(f(body).batch(ep), batch, "{body}");
        }
    }

    #[test]
    fn merges_and_bootstrap_presence() {
        use Endpoint::*;
        for (body, ep, merge) in [
            (r#"{"return_logprob":true}"#, Generate, MergeKind::MetaInfo),
            (
                r#"{"return_logprob":[false,true]}"#,
                Generate,
                MergeKind::MetaInfo,
            ),
            (r#"{"return_logprob":[false]}"#, Generate, MergeKind::None),
            (
                r#"{"logprobs":0,"echo":true}"#,
                Completions,
                MergeKind::CompletionEcho,
            ),
            (r#"{"logprobs":2}"#, Completions, MergeKind::None),
            (
                r#"{"logprobs":null,"echo":true}"#,
                Completions,
                MergeKind::None,
            ),
            (
                r#"{"logprobs":true,"echo":true}"#,
                ChatCompletions,
                MergeKind::None,
            ),
        ] {
            assert_eq!(f(body).merge(ep), merge, "{body}");
        }
        assert!(!f(r#"{"text":"a"}"#).has_bootstrap());
        assert!(f(r#"{"bootstrap_room":null}"#).has_bootstrap());
        assert!(f(r#"{"bootstrap_room":[1,2]}"#).has_bootstrap());
        let m = f(r#"{"model":"m\u0031","stream":true}"#);
        assert_eq!((m.model(), m.is_stream()), (Some("m1"), true));
        assert_eq!(m.routing().model(), Some("m1"));
    }

    #[test]
    fn bad_json_is_still_refused() {
        assert_eq!(
            pd_fields(b"{\"text\": [1,").unwrap_err().kind_and_code().1,
            "invalid_json"
        );
        assert_eq!(
            pd_fields(br#"{"stream":"yes"}"#)
                .unwrap_err()
                .kind_and_code()
                .1,
            "invalid_request"
        );
    }
}
