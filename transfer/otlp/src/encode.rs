//! Finished spans as an OTLP `ExportTraceServiceRequest` (protobuf), written straight from
//! them with protobuf's wire primitives: building `opentelemetry-proto`'s message structs
//! first would copy every name and attribute into new strings, per span.
//!
//! Field numbers are those of `opentelemetry/proto/trace/v1/trace.proto`,
//! `common/v1/common.proto` and `resource/v1/resource.proto`; the tests decode the output
//! with `opentelemetry-proto`'s generated messages.

use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

use crate::span::{Live, Value};

/// Who exports: the resource's attributes and the instrumentation scope's name.
pub(crate) struct Resource {
    pub(crate) service_name: String,
    pub(crate) pid: u32,
    pub(crate) scope: &'static str,
}

/// Reusable buffers for [`Encoder::request`].
#[derive(Default)]
pub(crate) struct Encoder {
    span: Vec<u8>,
    spans: Vec<u8>,
    head: Vec<u8>,
}

impl Encoder {
    /// The request carrying `spans` (one resource, one scope), into `out` (cleared first).
    /// The spans are written once into a buffer of their own, then copied once after the
    /// enclosing messages' heads, whose lengths they set.
    pub(crate) fn request(&mut self, res: &Resource, spans: &[Live], out: &mut Vec<u8>) {
        self.spans.clear();
        for s in spans {
            self.span.clear();
            span(s, &mut self.span);
            bytes(2, &self.span, &mut self.spans);
        }
        // Resource: attributes (1).
        let mut resource = Vec::with_capacity(64);
        let service = Value::Str(res.service_name.clone());
        key_value(1, "service.name", &service, &mut resource);
        key_value(
            1,
            "process.pid",
            &Value::Int(i64::from(res.pid)),
            &mut resource,
        );
        // ScopeSpans: scope (1: InstrumentationScope, name 1), spans (2).
        self.head.clear();
        let scope_len = 1 + encoded_len_varint(res.scope.len() as u64) + res.scope.len();
        encode_key(1, WireType::LengthDelimited, &mut self.head);
        encode_varint(scope_len as u64, &mut self.head);
        string(1, res.scope, &mut self.head);
        let scope_spans_len = self.head.len() + self.spans.len();
        // ResourceSpans: resource (1), scope_spans (2).
        let resource_spans_len = field_len(resource.len()) + field_len(scope_spans_len);
        // ExportTraceServiceRequest: resource_spans (1).
        out.clear();
        out.reserve(field_len(resource_spans_len));
        encode_key(1, WireType::LengthDelimited, out);
        encode_varint(resource_spans_len as u64, out);
        bytes(1, &resource, out);
        encode_key(2, WireType::LengthDelimited, out);
        encode_varint(scope_spans_len as u64, out);
        out.extend_from_slice(&self.head);
        out.extend_from_slice(&self.spans);
    }
}

/// The bytes a length-delimited field of `len` bytes takes (a one-byte key).
fn field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// `Span`: trace_id 1, span_id 2, parent_span_id 4, name 5, kind 6, start 7, end 8,
/// attributes 9.
fn span(s: &Live, out: &mut Vec<u8>) {
    bytes(1, &s.cx.trace_id, out);
    bytes(2, &s.cx.span_id, out);
    if s.parent != [0; 8] {
        bytes(4, &s.parent, out);
    }
    string(5, s.name.as_str(), out);
    encode_key(6, WireType::Varint, out);
    encode_varint(s.kind as u64, out);
    fixed64(7, s.start, out);
    fixed64(8, s.end.max(s.start), out);
    for (k, v) in &s.attrs {
        key_value(9, k, v, out);
    }
}

/// An attribute (`KeyValue`: key 1, value 2) as field `tag` of its message (9 of a span, 1
/// of a resource).
fn key_value(tag: u32, key: &str, value: &Value, out: &mut Vec<u8>) {
    // AnyValue: string 1, bool 2, int 3, double 4.
    let any_len = match value {
        Value::Str(s) => 1 + encoded_len_varint(s.len() as u64) + s.len(),
        Value::Bool(_) => 2,
        Value::Int(i) => 1 + encoded_len_varint(*i as u64),
        Value::Float(_) => 9,
    };
    let kv_len = 1
        + encoded_len_varint(key.len() as u64)
        + key.len()
        + 1
        + encoded_len_varint(any_len as u64)
        + any_len;
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(kv_len as u64, out);
    string(1, key, out);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(any_len as u64, out);
    match value {
        Value::Str(s) => string(1, s, out),
        Value::Bool(b) => {
            encode_key(2, WireType::Varint, out);
            encode_varint(u64::from(*b), out);
        }
        Value::Int(i) => {
            encode_key(3, WireType::Varint, out);
            encode_varint(*i as u64, out);
        }
        Value::Float(f) => {
            encode_key(4, WireType::SixtyFourBit, out);
            out.extend_from_slice(&f.to_le_bytes());
        }
    }
}

fn bytes(tag: u32, data: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

fn string(tag: u32, s: &str, out: &mut Vec<u8>) {
    bytes(tag, s.as_bytes(), out);
}

fn fixed64(tag: u32, v: u64, out: &mut Vec<u8>) {
    encode_key(tag, WireType::SixtyFourBit, out);
    out.extend_from_slice(&v.to_le_bytes());
}
