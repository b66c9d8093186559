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
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};

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
    pub text: Items,
    /// `/generate`'s `input_ids`.
    #[serde(default)]
    pub input_ids: Items,
    /// `/v1/completions`' `prompt`.
    #[serde(default)]
    pub prompt: Items,
    /// Choices per prompt (chat: each choice is an item of its own).
    #[serde(default)]
    pub n: Lenient<u64>,
    /// `/generate`'s `return_logprob` (a flag, or one per item).
    #[serde(default)]
    pub return_logprob: Flags,
    /// `logprobs` (completions: a number of alternatives, present means asked).
    #[serde(default)]
    pub logprobs: Present,
    /// `echo` (completions: the prompt, and with `logprobs` its logprobs, come back).
    #[serde(default)]
    pub echo: Flags,
    /// A bootstrap field the client sent itself (any value, `null` included).
    #[serde(default)]
    pub bootstrap_host: Seen,
    /// A bootstrap field the client sent itself.
    #[serde(default)]
    pub bootstrap_port: Seen,
    /// A bootstrap field the client sent itself.
    #[serde(default)]
    pub bootstrap_room: Seen,
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
            Endpoint::Generate => match (self.text, self.input_ids) {
                (Items::Many(k), _) | (Items::Absent, Items::Many(k)) => Some(k),
                _ => None,
            },
            Endpoint::Completions => match self.prompt {
                Items::Many(k) => Some(k),
                _ => None,
            },
            Endpoint::ChatCompletions => match self.n.0 {
                Some(n) if n > 1 => usize::try_from(n).ok(),
                _ => None,
            },
        }
    }

    /// What logprobs must be merged for this endpoint.
    pub fn merge(&self, endpoint: Endpoint) -> MergeKind {
        match endpoint {
            Endpoint::Generate if self.return_logprob.any => MergeKind::MetaInfo,
            Endpoint::Completions if self.echo.any && self.logprobs.0 => MergeKind::CompletionEcho,
            _ => MergeKind::None,
        }
    }

    /// Whether the client sent any bootstrap field itself.
    pub fn has_bootstrap(&self) -> bool {
        self.bootstrap_host.0 || self.bootstrap_port.0 || self.bootstrap_room.0
    }
}

/// Parses the PD fields of a JSON object body (errors as [`routing_fields_as`] reports them).
pub fn pd_fields(body: &[u8]) -> Result<PdFields<'_>, GatewayError> {
    routing_fields_as(body)
}

/// How many items a prompt field holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Items {
    /// Not sent (or `null`).
    #[default]
    Absent,
    /// One prompt: a string, or a list of token ids.
    One,
    /// A batch: a list of strings or of token-id lists, with its length.
    Many(usize),
}

impl<'de> Deserialize<'de> for Items {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Items;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a prompt")
            }
            fn visit_unit<E>(self) -> Result<Items, E> {
                Ok(Items::Absent)
            }
            fn visit_none<E>(self) -> Result<Items, E> {
                Ok(Items::Absent)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items, A::Error> {
                // A list of numbers is one prompt of token ids; a list of anything else
                // (strings, lists) is a batch.
                let Some(first) = seq.next_element::<Kind>()? else {
                    return Ok(Items::Many(0));
                };
                let mut len = 1;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    len += 1;
                }
                Ok(match first {
                    Kind::Number => Items::One,
                    Kind::Other => Items::Many(len),
                })
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Items, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Items::One)
            }
            fn visit_str<E>(self, _: &str) -> Result<Items, E> {
                Ok(Items::One)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Items, E> {
                Ok(Items::One)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Items, E> {
                Ok(Items::One)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Items, E> {
                Ok(Items::One)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Items, E> {
                Ok(Items::One)
            }
        }
        d.deserialize_any(V)
    }
}

/// The first element of a prompt list: a number, or anything else.
enum Kind {
    Number,
    Other,
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Kind;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a prompt item")
            }
            fn visit_i64<E>(self, _: i64) -> Result<Kind, E> {
                Ok(Kind::Number)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Kind, E> {
                Ok(Kind::Number)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Kind, E> {
                Ok(Kind::Number)
            }
            fn visit_str<E>(self, _: &str) -> Result<Kind, E> {
                Ok(Kind::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Kind, E> {
                Ok(Kind::Other)
            }
            fn visit_unit<E>(self) -> Result<Kind, E> {
                Ok(Kind::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Kind::Other)
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Kind::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// A flag, or a list of flags (one per item): `any` is whether one of them is `true`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Flags {
    /// At least one `true`.
    pub any: bool,
}

impl<'de> Deserialize<'de> for Flags {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Flags;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a flag or a list of flags")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Flags, E> {
                Ok(Flags { any: v })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Flags, A::Error> {
                let mut any = false;
                while let Some(f) = seq.next_element::<Flags>()? {
                    any |= f.any;
                }
                Ok(Flags { any })
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Flags, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Flags::default())
            }
            fn visit_unit<E>(self) -> Result<Flags, E> {
                Ok(Flags::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Flags, E> {
                Ok(Flags::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Flags, E> {
                Ok(Flags::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Flags, E> {
                Ok(Flags::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Flags, E> {
                Ok(Flags::default())
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether a key is present with a value other than `null` or `false`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Present(pub bool);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Present;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_unit<E>(self) -> Result<Present, E> {
                Ok(Present(false))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Present, E> {
                Ok(Present(v))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Present, E> {
                Ok(Present(true))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Present, E> {
                Ok(Present(true))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Present, E> {
                Ok(Present(true))
            }
            fn visit_str<E>(self, _: &str) -> Result<Present, E> {
                Ok(Present(true))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Present, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Present(true))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Present, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Present(true))
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether a key is present at all (whatever its value, `null` included).
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen(pub bool);

impl<'de> Deserialize<'de> for Seen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(d).map(|_| Seen(true))
    }
}

/// A number when it is one (anything else reads as absent).
#[derive(Debug, Default, Clone, Copy)]
pub struct Lenient<T>(pub Option<T>);

impl<'de> Deserialize<'de> for Lenient<u64> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Lenient<u64>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Lenient(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Lenient(u64::try_from(v).ok()))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Lenient(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Lenient(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Lenient(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Lenient(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
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
