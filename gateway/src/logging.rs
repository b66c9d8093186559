//! Logging and tracing setup: `tracing` to stderr at `--log-level` (or as `RUST_LOG` says
//! when set), as text or, with `--log-json`, one JSON object per line; and, with
//! `--otlp-traces-endpoint`, OpenTelemetry traces exported over OTLP/HTTP (protobuf).
//!
//! Every request is served inside a span named `request` with its `request_id` (`log_span`,
//! entered by the front door for the handler and for each poll of the response body), so
//! every line logged while serving it names it: `request{request_id=...}:` in text, and the
//! `span` / `spans` members in JSON (`{"span":{"name":"request","request_id":"..."}, ...}`).
//! The span has level ERROR so that it is kept at any `--log-level`, and a target outside
//! `gateway`, so that it is never exported as a trace span.
//!
//! With traces on, every inference request gets a server span (`POST /v1/chat/completions`
//! ...: method, path, request id, the chosen worker, the answer's status), parented on the
//! client's W3C `traceparent` when it sends one, and each upstream request carries the
//! span's own `traceparent`, so a worker that traces (SGLang with OpenTelemetry) continues
//! the same trace. The span lasts until the answer's body is sent, and says when its first
//! chunk (a stream's first token) and its end went out after the head
//! (`body.first_chunk_ms`, `body.duration_ms`). Every call of the hosted KV master's REST
//! API gets one too, named by its route's operation id (`master_put_start`: keys stay out
//! of span names), parented on the store client's span when that client traces (`kvclient`
//! sends its `traceparent`), and so do the store client's calls and the transfer engine's
//! batches in a process that exports traces (TRACE-level spans of targets `kvclient` and
//! `transfer`), and a simulated worker's requests and store loads (`sim::l3`). Every
//! exported span names its process (`process.pid`): one trace crosses several. With
//! traces off no span is created on the request path.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LogLevel;

/// Set once traces are exported (read on the request path: one relaxed load).
static TRACES: AtomicBool = AtomicBool::new(false);

/// Whether request spans are created and propagated.
#[inline]
pub fn traces_enabled() -> bool {
    TRACES.load(Ordering::Relaxed)
}

/// The trace export pipeline; [`Traces::shutdown`] flushes what is still buffered.
pub struct Traces {
    exporter: otlp::Exporter,
}

impl Traces {
    /// Flushes the buffered spans and stops the exporter (blocking: call it outside the
    /// async runtime, or from `spawn_blocking`).
    pub fn shutdown(self) {
        // It flushes first.
        self.exporter.shutdown();
    }

    /// Exports every finished span now (blocking, as [`Traces::shutdown`]).
    pub fn flush(&self) {
        if !self.exporter.flush() {
            eprintln!("moongate: flushing traces timed out");
        }
    }
}

/// Installs the global subscriber (no-op if one is installed already).
pub fn init(level: LogLevel) {
    let _ = init_logging(level, false, None);
}

/// Installs the global subscriber (text lines) and, when `otlp_endpoint` is given, the
/// trace exporter: [`init_logging`] without JSON.
pub fn init_with_traces(
    level: LogLevel,
    otlp_endpoint: Option<&str>,
) -> anyhow::Result<Option<Traces>> {
    init_logging(level, false, otlp_endpoint)
}

/// Installs the global subscriber, writing JSON lines when `json`, and, when
/// `otlp_endpoint` is given (an OTLP/HTTP traces URL such as
/// `http://collector:4318/v1/traces`), the span exporter ([`otlp`]: its own thread and
/// blocking HTTP client).
pub fn init_logging(
    level: LogLevel,
    json: bool,
    otlp_endpoint: Option<&str>,
) -> anyhow::Result<Option<Traces>> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level.to_string()));
    let fmt: Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync> = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed()
    };
    let Some(endpoint) = otlp_endpoint else {
        let _ = tracing_subscriber::registry().with(fmt).try_init();
        return Ok(None);
    };
    let (otel, exporter) = otlp::pipeline(otlp::ExportConfig::new(endpoint))
        .map_err(|e| anyhow::anyhow!("OTLP exporter for {endpoint}: {e}"))?;
    // Moongate's own spans only, whatever `--log-level` keeps on stderr: the gateway's
    // (INFO), and the TRACE-level spans of the store client's master calls, the transfer
    // engine's batches and a simulated worker's store loads, made only for this layer
    // (off, they cost a disabled callsite's check).
    let otel = otel.with_filter(
        Targets::new()
            .with_target("gateway", tracing::Level::INFO)
            .with_target("kvclient", tracing::Level::TRACE)
            .with_target("sim::l3", tracing::Level::TRACE)
            .with_target("transfer", tracing::Level::TRACE),
    );
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the tracing subscriber: {e}"))?;
    TRACES.store(true, Ordering::Relaxed);
    Ok(Some(Traces { exporter }))
}

/// The span a request is served in when traces are off or it is not an inference request
/// (see the module doc).
pub(crate) fn log_span(request_id: &http::HeaderValue) -> tracing::Span {
    tracing::span!(
        target: "moongate::request",
        tracing::Level::ERROR,
        "request",
        request_id = request_id.to_str().unwrap_or(""),
        http.response.status_code = tracing::field::Empty,
    )
}

/// The server span a request is served in, parented on the client's `traceparent`.
pub enum Served {
    /// An inference request: named by its method and path.
    Inference,
    /// A call of the KV master's REST API: named by its route's operation id, without its
    /// path (which holds object keys).
    Master(&'static str),
}

/// The server span of one request `served` names (see [`Served`]).
pub fn request_span(
    served: Served,
    method: &http::Method,
    path: &str,
    headers: &http::HeaderMap,
    request_id: &http::HeaderValue,
) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        otel.name = tracing::field::Empty,
        otel.kind = "server",
        http.request.method = method.as_str(),
        url.path = tracing::field::Empty,
        request_id = request_id.to_str().unwrap_or(""),
        worker = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        body.first_chunk_ms = tracing::field::Empty,
        body.duration_ms = tracing::field::Empty,
    );
    match served {
        Served::Inference => {
            span.record("otel.name", format_args!("{method} {path}"));
            span.record("url.path", path);
        }
        Served::Master(op) => {
            span.record("otel.name", op);
        }
    }
    if let Some(parent) = headers
        .get("traceparent")
        .and_then(|v| otlp::SpanContext::parse(v.as_bytes()))
    {
        otlp::set_remote_parent(&span, parent);
    }
    span
}

/// Writes the current span's `traceparent` (and `tracestate`) into an upstream request to
/// `worker`, and names the worker on the span.
pub(crate) fn propagate(headers: &mut http::HeaderMap, worker: &str) {
    let span = tracing::Span::current();
    span.record("worker", worker);
    if let Some(cx) = otlp::span_context(&span)
        && let Ok(v) = http::HeaderValue::from_bytes(cx.traceparent().as_bytes())
    {
        headers.insert("traceparent", v);
    }
}
