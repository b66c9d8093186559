//! The shape of a JSON value, read without copying or keeping anything: what inspection
//! needs to know of a field (how many items a list holds, whether a flag is set, the value
//! of a count), in constant memory whatever the value holds.
//!
//! Counts are read the way SGLang's request models (pydantic, lax mode) read an `int`: an
//! integer, a float without a fraction, or a string holding one. So `"n": 1e11` and
//! `"n": "100000000000"` are the counts they would become on the worker, and are checked
//! as such.

use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The shape of one JSON value (see the module doc).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The key is not in the body.
    #[default]
    Absent,
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number: its value as a count (`None` when negative or fractional; saturated at
    /// `u64::MAX`).
    Num(Option<u64>),
    /// A string: its value as a count when it holds a number.
    Str(Option<u64>),
    /// A list.
    Seq {
        /// Elements.
        len: usize,
        /// The first element is a number (a list of token ids).
        first_num: bool,
        /// An element is `true` (a list of flags with one set).
        any_true: bool,
        /// The largest count among the elements (a count per item).
        max_count: Option<u64>,
    },
    /// An object: its `n` as a count (what `sampling_params` holds).
    Map {
        /// `n`, when it is a count.
        n: Option<u64>,
    },
}

impl Shape {
    /// The value as a count, if it is one (a number or a numeric string).
    pub fn count(&self) -> Option<u64> {
        match *self {
            Shape::Num(c) | Shape::Str(c) => c,
            _ => None,
        }
    }

    /// The largest count it holds: its own, or its elements' (a count per item). An
    /// object's count is its `n`.
    pub fn max_count(&self) -> Option<u64> {
        match *self {
            Shape::Seq { max_count, .. } => max_count,
            Shape::Map { n } => n,
            _ => self.count(),
        }
    }

    /// Elements, when it is a list.
    pub fn list_len(&self) -> Option<usize> {
        match *self {
            Shape::Seq { len, .. } => Some(len),
            _ => None,
        }
    }

    /// As a prompt: `None` for one prompt (a string, or a list of token ids), `Some(n)` for
    /// a batch (a list of strings or of token-id lists).
    pub fn batch(&self) -> Option<usize> {
        match *self {
            Shape::Seq {
                first_num: true, ..
            } => None,
            Shape::Seq { len, .. } => Some(len),
            _ => None,
        }
    }

    /// As a flag or list of flags: one is `true`.
    pub fn any_true(&self) -> bool {
        matches!(self, Shape::Bool(true) | Shape::Seq { any_true: true, .. })
    }

    /// Given with a value other than `null` or `false`.
    pub fn is_given(&self) -> bool {
        !matches!(self, Shape::Absent | Shape::Null | Shape::Bool(false))
    }

    /// Present in the body (any value, `null` included).
    pub fn is_present(&self) -> bool {
        !matches!(self, Shape::Absent)
    }
}

/// A JSON number as a count: non-negative and integral, saturated at `u64::MAX`.
fn float_count(v: f64) -> Option<u64> {
    // `as` saturates: 1e300 becomes u64::MAX, which is over any limit.
    (v >= 0.0 && v.fract() == 0.0).then_some(v as u64)
}

/// A string as a count, when it holds a number (surrounding whitespace allowed).
fn str_count(s: &str) -> Option<u64> {
    let s = s.trim();
    s.parse::<u64>()
        .ok()
        .or_else(|| {
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .and_then(float_count)
        })
        .or_else(|| {
            // Digits beyond u64: a count over any limit.
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then_some(u64::MAX)
        })
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
            fn visit_f64<E>(self, v: f64) -> Result<Shape, E> {
                Ok(Shape::Num(float_count(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Shape, E> {
                Ok(Shape::Str(str_count(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
                let (mut len, mut first_num, mut any_true) = (0usize, false, false);
                let mut max_count: Option<u64> = None;
                while let Some(e) = seq.next_element::<Shape>()? {
                    first_num |= len == 0 && matches!(e, Shape::Num(_));
                    any_true |= e == Shape::Bool(true);
                    let c = match e {
                        Shape::Map { n } => n,
                        _ => e.count(),
                    };
                    max_count = max_count.max(c);
                    len = len.saturating_add(1);
                }
                Ok(Shape::Seq {
                    len,
                    first_num,
                    any_true,
                    max_count,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
                let mut n = None;
                while let Some(IsN(is_n)) = map.next_key()? {
                    if is_n {
                        n = map.next_value::<Shape>()?.count();
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Shape::Map { n })
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether an object key is `n`.
struct IsN(bool);

impl<'de> Deserialize<'de> for IsN {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IsN;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E>(self, v: &str) -> Result<IsN, E> {
                Ok(IsN(v == "n"))
            }
        }
        d.deserialize_str(V)
    }
}
