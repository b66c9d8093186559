//! The `tracing` layer: while a span is open its ids, name, kind, start and attributes sit
//! in the registry's extensions (`span::Live`); when it closes they are handed to the export
//! queue. Nothing is done on enter or exit, so a span entered once per poll costs no more
//! than one entered once.
//!
//! Fields map as OpenTelemetry's `tracing` bridge maps them: `otel.name` names the span,
//! `otel.kind` (`server`, `client`, `producer`, `consumer`, `internal`) sets its kind, and
//! every other field with a value is an attribute (strings, integers, floats, booleans;
//! anything else by its `Debug` text). Events are not exported.

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::context::SpanContext;
use crate::export::Queue;
use crate::span::{Kind, Live, Name, Value};

/// The layer; made by [`crate::pipeline`]. Give it a per-layer filter naming the targets to
/// export (it takes every span it is handed).
pub struct OtlpLayer {
    queue: Arc<Queue>,
}

impl OtlpLayer {
    pub(crate) fn new(queue: Arc<Queue>) -> Self {
        Self { queue }
    }
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl<S> tracing_subscriber::Layer<S> for OtlpLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        // The nearest enclosing span this layer takes (the context skips the others).
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Live>().map(|l| l.cx));
        let (cx, parent) = match parent {
            Some(p) => (p.child(), p.span_id),
            None => (SpanContext::new_root(), [0; 8]),
        };
        let mut live = Live {
            cx,
            parent,
            name: Name::Static(attrs.metadata().name()),
            kind: Kind::Internal,
            start: now_nanos(),
            end: 0,
            attrs: Vec::with_capacity(attrs.fields().len()),
        };
        attrs.record(&mut Fields(&mut live));
        span.extensions_mut().insert(live);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if let Some(live) = span.extensions_mut().get_mut::<Live>() {
            values.record(&mut Fields(live));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(mut live) = span.extensions_mut().remove::<Live>() else {
            return;
        };
        if live.cx.sampled {
            live.end = now_nanos();
            self.queue.push(live);
        }
    }
}

/// Records a span's fields on its [`Live`].
struct Fields<'a>(&'a mut Live);

impl Fields<'_> {
    fn set(&mut self, key: &'static str, value: Value) {
        match self.0.attrs.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.0.attrs.push((key, value)),
        }
    }

    /// A text field; `value` is taken as it is (no copy when the caller made it).
    fn text(&mut self, field: &Field, value: std::borrow::Cow<'_, str>) {
        match field.name() {
            "otel.name" => self.0.name = Name::Owned(value.into_owned()),
            "otel.kind" => {
                self.0.kind = match &*value {
                    "server" => Kind::Server,
                    "client" => Kind::Client,
                    "producer" => Kind::Producer,
                    "consumer" => Kind::Consumer,
                    _ => Kind::Internal,
                }
            }
            key => self.set(key, Value::Str(value.into_owned())),
        }
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        use std::fmt::Write;
        let mut s = String::with_capacity(32);
        let _ = write!(s, "{value:?}");
        self.text(field, s.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field.name(), Value::Int(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(
            field.name(),
            Value::Int(i64::try_from(value).unwrap_or(i64::MAX)),
        );
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field.name(), Value::Float(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field.name(), Value::Bool(value));
    }
}

/// Runs `f` on the open span `span`'s [`Live`], if this layer took it.
fn with_live<R>(span: &tracing::Span, f: impl FnOnce(&mut Live) -> R) -> Option<R> {
    let mut f = Some(f);
    span.with_subscriber(|(id, dispatch): (&Id, &Dispatch)| {
        let registry = dispatch.downcast_ref::<tracing_subscriber::Registry>()?;
        let data = registry.span(id)?;
        let mut ext = data.extensions_mut();
        let live = ext.get_mut::<Live>()?;
        f.take().map(|f| f(live))
    })
    .flatten()
}

/// The trace context of `span` as its `traceparent` continues it downstream, when `span`
/// is exported (or was continued from a caller that does not sample: the flag says so).
pub fn span_context(span: &tracing::Span) -> Option<SpanContext> {
    with_live(span, |l| l.cx)
}

/// Makes `span` (just opened, before any child) a child of `remote`, a caller's span in
/// another process: same trace, the caller's span as parent, and the caller's sampling
/// decision (an unsampled span is not exported, and says so downstream).
pub fn set_remote_parent(span: &tracing::Span, remote: SpanContext) {
    with_live(span, |l| {
        l.cx.trace_id = remote.trace_id;
        l.cx.sampled = remote.sampled;
        l.parent = remote.span_id;
    });
}
