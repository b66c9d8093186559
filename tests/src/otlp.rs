//! An OTLP/HTTP trace collector for tests, and the spans it received, decoded.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
pub use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;

/// An OTLP/HTTP collector on a loopback port: its `/v1/traces` URL, and every body posted
/// there.
pub async fn collector() -> (String, Arc<parking_lot::Mutex<Vec<bytes::Bytes>>>) {
    use axum::extract::State;
    let bodies: Arc<parking_lot::Mutex<Vec<bytes::Bytes>>> = Arc::default();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(
                |State(b): State<Arc<parking_lot::Mutex<Vec<bytes::Bytes>>>>,
                 body: bytes::Bytes| async move {
                    b.lock().push(body);
                    ""
                },
            ),
        )
        .with_state(bodies.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/v1/traces", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, bodies)
}

/// One exported span and the `process.pid` of the process that exported it.
#[derive(Debug, Clone)]
pub struct Exported {
    /// The exporting process's `process.pid` resource attribute (0 when absent).
    pub pid: i64,
    /// The span.
    pub span: Span,
}

/// Every span in `bodies` (OTLP/HTTP protobuf exports), with its process.
pub fn spans(bodies: &[bytes::Bytes]) -> Vec<Exported> {
    let mut out = Vec::new();
    for b in bodies {
        let req = ExportTraceServiceRequest::decode(b.as_ref()).expect("an OTLP export");
        for r in req.resource_spans {
            let pid = r
                .resource
                .iter()
                .flat_map(|res| &res.attributes)
                .find(|a| a.key == "process.pid")
                .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                    Value::IntValue(i) => Some(*i),
                    _ => None,
                })
                .unwrap_or(0);
            for s in r.scope_spans.into_iter().flat_map(|s| s.spans) {
                out.push(Exported { pid, span: s });
            }
        }
    }
    out
}

/// Attribute `key` of `s`, as text.
pub fn attr(s: &Span, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            Value::StringValue(s) => s.clone(),
            Value::IntValue(i) => i.to_string(),
            Value::BoolValue(b) => b.to_string(),
            Value::DoubleValue(d) => d.to_string(),
            other => format!("{other:?}"),
        })
}
