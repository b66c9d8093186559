//! Traces of Moongate's processes: `tracing` spans exported as OpenTelemetry spans over
//! OTLP/HTTP (protobuf), and the W3C trace context that links them across processes,
//! without the OpenTelemetry SDK.
//!
//! Why not the SDK and its `tracing` bridge: measured on the gateway's request path
//! (`TRACES=1 gateway/bench/gateway_bench.sh`), they cost 1.3 times the CPU of an
//! untraced request for one span per request: a builder with its attribute list per
//! span, a context attached and detached on every poll, span data converted into the
//! protocol's message structs, string by string, before encoding. Here a span is a few
//! fields in the registry while it is open and is written straight into the request body
//! when it is sent.
//!
//! # Layout
//! - [`context`]: a span's place in a trace ([`SpanContext`]); `traceparent` read and
//!   written.
//! - [`layer`]: the `tracing` layer ([`OtlpLayer`]): a span's ids, name, kind, times and
//!   attributes (`span::Live`) while it is open; handed to the queue when it closes.
//!   [`set_remote_parent`] continues a caller's trace, [`span_context`] gives a span's
//!   context to propagate.
//! - `encode`: finished spans as an `ExportTraceServiceRequest`.
//! - [`export`]: the bounded queue and the thread that sends it ([`Exporter`]).

pub mod context;
mod encode;
pub mod export;
pub mod layer;
mod span;

pub use context::{SpanContext, TraceParent};
pub use export::{Error, ExportConfig, Exporter, endpoint_problem};
pub use layer::{OtlpLayer, set_remote_parent, span_context};

/// Starts the export thread for `cfg`: the layer to install (with a per-layer filter) and
/// the handle that flushes and stops it.
pub fn pipeline(cfg: ExportConfig) -> Result<(OtlpLayer, Exporter), Error> {
    let (queue, exporter) = Exporter::start(cfg)?;
    Ok((OtlpLayer::new(queue), exporter))
}
