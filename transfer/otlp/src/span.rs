//! A span as it is exported ([`Live`]): made and filled by the layer while the span is
//! open, queued when it closes, written out by the encoder.

use crate::context::SpanContext;

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// OTLP's span kinds (`SpanKind` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
    Producer = 4,
    Consumer = 5,
}

/// A span as it is exported: kept in the registry while open.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) cx: SpanContext,
    /// The parent's span id (zeros: a root).
    pub(crate) parent: [u8; 8],
    pub(crate) name: Name,
    pub(crate) kind: Kind,
    /// Unix nanoseconds.
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) attrs: Vec<(&'static str, Value)>,
}

/// A span's name: its callsite's, or the `otel.name` recorded on it.
#[derive(Debug)]
pub(crate) enum Name {
    Static(&'static str),
    Owned(String),
}

impl Name {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Name::Static(s) => s,
            Name::Owned(s) => s,
        }
    }
}
