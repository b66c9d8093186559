//! Shapes shared by the OpenAI and SGLang bodies: a value or a list of values, stop
//! sequences, the four ways to spell a prompt, and SGLang's routing fields ([`Routing`]),
//! which every generation body carries.
//!
//! Each type here has a hand-written `Deserialize` that looks at the JSON once (no
//! buffering of large prompts) and names the accepted shapes when the input matches none.
//! `Serialize` writes the same shape back, so a body parsed and re-serialized keeps its
//! form (a scalar stays a scalar, a list stays a list).

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{
    BoolDeserializer, F64Deserializer, I64Deserializer, MapAccessDeserializer,
    SeqAccessDeserializer, StrDeserializer, StringDeserializer, U64Deserializer, UnitDeserializer,
};
use serde::de::{self, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// SGLang's request id, PD bootstrap fields and data-parallel rank, shared by `/generate`, chat completions
/// and completions (flattened into each body). Each is a scalar for a single request or a
/// list with one entry per batch item; the PD rewrite injects the bootstrap fields here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Routing {
    /// Request id(s); for a batch, a string becomes `{rid}_{i}` per item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rid: Option<OneOrMany<String>>,
    /// PD: host of the prefill worker's bootstrap server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_host: Option<OneOrMany<String>>,
    /// PD: bootstrap port (`null` for the prefill worker's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<OneOrMany<Option<u16>>>,
    /// PD: the room pairing one prefill with one decode (random 63-bit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_room: Option<OneOrMany<u64>>,
    /// The data-parallel rank to run the request on (a router's `--dp-aware` writes it;
    /// absent: the worker's own balancing picks one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_parallel_rank: Option<u32>,
}

/// A field that is either one value (single request) or a list (one per item of a batch).
///
/// SGLang accepts both forms for `text`, `rid`, `sampling_params`, `return_logprob`,
/// `bootstrap_host`, `bootstrap_port`, `bootstrap_room` and more: a scalar applies to the
/// whole request, a list carries one entry per batch item.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// A single value.
    One(T),
    /// One value per batch item.
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    /// The value for batch item `i`: the scalar for every item, or the `i`-th list entry.
    pub fn get(&self, i: usize) -> Option<&T> {
        match self {
            OneOrMany::One(v) => Some(v),
            OneOrMany::Many(v) => v.get(i),
        }
    }

    /// Number of list entries, or `None` for a scalar.
    pub fn list_len(&self) -> Option<usize> {
        match self {
            OneOrMany::One(_) => None,
            OneOrMany::Many(v) => Some(v.len()),
        }
    }

    /// Every value, in order (one for a scalar).
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        match self {
            OneOrMany::One(v) => std::slice::from_ref(v).iter(),
            OneOrMany::Many(v) => v.iter(),
        }
    }
}

impl<T> From<T> for OneOrMany<T> {
    fn from(v: T) -> Self {
        OneOrMany::One(v)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OneOrManyVisitor(PhantomData))
    }
}

struct OneOrManyVisitor<T>(PhantomData<T>);

/// Hands a scalar the visitor received to `T`'s own `Deserialize`, so `T`'s error
/// messages reach the user unchanged.
macro_rules! forward_scalar {
    ($($method:ident($ty:ty) => $de:ident),* $(,)?) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            T::deserialize(Present($de::<E>::new(v))).map(OneOrMany::One)
        }
    )*};
}

/// A scalar that is there: `Option<T>` reads it as `Some` (serde's value deserializers
/// alone would refuse a number where an option is expected).
struct Present<D>(D);

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Present<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(v)
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        v.visit_some(self.0)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_enum(name, variants, v)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier
        ignored_any
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrManyVisitor<T> {
    type Value = OneOrMany<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a value or a list of values (one per batch item)")
    }

    forward_scalar! {
        visit_bool(bool) => BoolDeserializer,
        visit_i64(i64) => I64Deserializer,
        visit_u64(u64) => U64Deserializer,
        visit_f64(f64) => F64Deserializer,
        visit_str(&str) => StrDeserializer,
        visit_string(String) => StringDeserializer,
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        T::deserialize(UnitDeserializer::<E>::new()).map(OneOrMany::One)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Vec::<T>::deserialize(SeqAccessDeserializer::new(seq)).map(OneOrMany::Many)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(OneOrMany::One)
    }
}

/// `stop`: one stop string or a list of them.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum StopSequences {
    /// A single stop string.
    One(String),
    /// Several stop strings; generation ends at the first one produced.
    Many(Vec<String>),
}

impl StopSequences {
    /// Every stop string.
    pub fn as_slice(&self) -> &[String] {
        match self {
            StopSequences::One(s) => std::slice::from_ref(s),
            StopSequences::Many(v) => v,
        }
    }
}

impl<'de> Deserialize<'de> for StopSequences {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StopSequences;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a stop string or a list of stop strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(StopSequences::One(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(StopSequences::One(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::<String>::deserialize(SeqAccessDeserializer::new(seq)).map(StopSequences::Many)
            }
        }
        d.deserialize_any(V)
    }
}

/// A prompt in any of the four forms OpenAI's `/v1/completions` accepts; SGLang's
/// `/generate` uses the same forms split over `text` (strings) and `input_ids` (token ids).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    /// One prompt as text.
    Text(String),
    /// A batch of text prompts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// A batch of prompts as token ids.
    TokenBatch(Vec<Vec<u32>>),
}

impl Prompt {
    /// Number of prompts (1 for the single forms).
    pub fn len(&self) -> usize {
        match self {
            Prompt::Text(_) | Prompt::Tokens(_) => 1,
            Prompt::Texts(v) => v.len(),
            Prompt::TokenBatch(v) => v.len(),
        }
    }

    /// True for a batch with no prompts in it.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True for the single forms (`Text`, `Tokens`).
    pub fn is_single(&self) -> bool {
        matches!(self, Prompt::Text(_) | Prompt::Tokens(_))
    }
}

/// One element of a prompt list, before the list's form is known.
enum PromptItem {
    Text(String),
    Token(u32),
    Tokens(Vec<u32>),
}

impl<'de> Deserialize<'de> for PromptItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PromptItem;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, a token id, or a list of token ids")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(PromptItem::Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(PromptItem::Text(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                u32::deserialize(v.into_deserializer()).map(PromptItem::Token)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u32::deserialize(v.into_deserializer()).map(PromptItem::Token)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::<u32>::deserialize(SeqAccessDeserializer::new(seq)).map(PromptItem::Tokens)
            }
        }
        d.deserialize_any(V)
    }
}

const MIXED_PROMPT: &str =
    "a prompt list must hold only strings, only token ids, or only lists of token ids";

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Prompt;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a string, a list of strings, a list of token ids, or a list of token-id lists",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Prompt::Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Prompt::Text(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let Some(first) = seq.next_element::<PromptItem>()? else {
                    return Ok(Prompt::Texts(Vec::new()));
                };
                let mixed = || de::Error::custom(MIXED_PROMPT);
                match first {
                    PromptItem::Text(t) => {
                        let mut out = vec![t];
                        while let Some(item) = seq.next_element::<PromptItem>()? {
                            let PromptItem::Text(t) = item else {
                                return Err(mixed());
                            };
                            out.push(t);
                        }
                        Ok(Prompt::Texts(out))
                    }
                    PromptItem::Token(t) => {
                        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0) + 1);
                        out.push(t);
                        while let Some(item) = seq.next_element::<PromptItem>()? {
                            let PromptItem::Token(t) = item else {
                                return Err(mixed());
                            };
                            out.push(t);
                        }
                        Ok(Prompt::Tokens(out))
                    }
                    PromptItem::Tokens(t) => {
                        let mut out = vec![t];
                        while let Some(item) = seq.next_element::<PromptItem>()? {
                            let PromptItem::Tokens(t) = item else {
                                return Err(mixed());
                            };
                            out.push(t);
                        }
                        Ok(Prompt::TokenBatch(out))
                    }
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// SGLang's `input_ids`: token ids of one prompt, or one list per batch item.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum InputIds {
    /// Token ids of a single prompt.
    Single(Vec<u32>),
    /// Token ids of each prompt of a batch.
    Batch(Vec<Vec<u32>>),
}

impl InputIds {
    /// The batch size, or `None` for a single prompt.
    pub fn batch_len(&self) -> Option<usize> {
        match self {
            InputIds::Single(_) => None,
            InputIds::Batch(v) => Some(v.len()),
        }
    }
}

impl<'de> Deserialize<'de> for InputIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = InputIds;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of token ids or a list of token-id lists")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                match Prompt::deserialize(SeqAccessDeserializer::new(seq))? {
                    Prompt::Tokens(t) => Ok(InputIds::Single(t)),
                    Prompt::TokenBatch(t) => Ok(InputIds::Batch(t)),
                    Prompt::Texts(t) if t.is_empty() => Ok(InputIds::Single(Vec::new())),
                    _ => Err(de::Error::custom(
                        "input_ids must be a list of token ids or a list of token-id lists",
                    )),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_or_many_keeps_its_form() {
        let one: OneOrMany<u64> = serde_json::from_value(json!(7)).unwrap();
        assert_eq!(one, OneOrMany::One(7));
        assert_eq!(serde_json::to_value(&one).unwrap(), json!(7));
        let many: OneOrMany<u64> = serde_json::from_value(json!([1, 2])).unwrap();
        assert_eq!(many.list_len(), Some(2));
        assert_eq!(many.get(1), Some(&2));
        assert_eq!(serde_json::to_value(&many).unwrap(), json!([1, 2]));
        let ports: OneOrMany<Option<u16>> = serde_json::from_value(json!([8998, null])).unwrap();
        assert_eq!(ports, OneOrMany::Many(vec![Some(8998), None]));
        let obj: OneOrMany<serde_json::Map<String, serde_json::Value>> =
            serde_json::from_value(json!({"a": 1})).unwrap();
        assert!(matches!(obj, OneOrMany::One(_)));
    }

    #[test]
    fn one_or_many_reports_the_inner_error() {
        let err = serde_json::from_str::<OneOrMany<u16>>("70000").unwrap_err();
        assert!(err.to_string().contains("70000"), "{err}");
        let err = serde_json::from_str::<OneOrMany<String>>("[1]").unwrap_err();
        assert!(err.to_string().contains("expected a string"), "{err}");
    }

    #[test]
    fn stop_forms() {
        let s: StopSequences = serde_json::from_str(r#""\n""#).unwrap();
        assert_eq!(s.as_slice(), ["\n"]);
        let s: StopSequences = serde_json::from_str(r#"["a","b"]"#).unwrap();
        assert_eq!(s.as_slice(), ["a", "b"]);
        let err = serde_json::from_str::<StopSequences>("3").unwrap_err();
        assert!(err.to_string().contains("stop string"), "{err}");
    }

    #[test]
    fn prompt_forms() {
        let p: Prompt = serde_json::from_str(r#""hi""#).unwrap();
        assert_eq!(p, Prompt::Text("hi".into()));
        let p: Prompt = serde_json::from_str(r#"["a","b"]"#).unwrap();
        assert_eq!(p, Prompt::Texts(vec!["a".into(), "b".into()]));
        let p: Prompt = serde_json::from_str("[1,2,3]").unwrap();
        assert_eq!(p, Prompt::Tokens(vec![1, 2, 3]));
        let p: Prompt = serde_json::from_str("[[1],[2,3]]").unwrap();
        assert_eq!(p, Prompt::TokenBatch(vec![vec![1], vec![2, 3]]));
        assert_eq!(p.len(), 2);
        assert!(!p.is_single());
        for bad in [r#"["a",1]"#, r#"[1,"a"]"#, "[[1],2]"] {
            let err = serde_json::from_str::<Prompt>(bad).unwrap_err();
            assert!(err.to_string().contains("only strings"), "{bad}: {err}");
        }
        let err = serde_json::from_str::<Prompt>("{}").unwrap_err();
        assert!(err.to_string().contains("list of token-id lists"), "{err}");
        let err = serde_json::from_str::<Prompt>("[-1]").unwrap_err();
        assert!(err.to_string().contains("-1"), "{err}");
    }

    #[test]
    fn input_ids_forms() {
        let i: InputIds = serde_json::from_str("[5,6]").unwrap();
        assert_eq!(i, InputIds::Single(vec![5, 6]));
        assert_eq!(i.batch_len(), None);
        let i: InputIds = serde_json::from_str("[[5],[6]]").unwrap();
        assert_eq!(i.batch_len(), Some(2));
        assert_eq!(serde_json::to_string(&i).unwrap(), "[[5],[6]]");
        assert!(serde_json::from_str::<InputIds>(r#"["x"]"#).is_err());
        assert!(serde_json::from_str::<InputIds>(r#""x""#).is_err());
    }
}
