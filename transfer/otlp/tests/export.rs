//! The layer and exporter end to end: spans made through `tracing`, sent over real HTTP to
//! a collector on a loopback port, read back with `opentelemetry-proto`'s decoder.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use otlp::{ExportConfig, SpanContext, pipeline, set_remote_parent, span_context};
use prost::Message;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;

type Bodies = Arc<Mutex<Vec<Vec<u8>>>>;

/// An HTTP/1.1 collector (keep-alive): every request body, answered 200 (or `status`).
fn collector(status: u16) -> (String, Bodies) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    let bodies: Bodies = Arc::default();
    let b = bodies.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let b = b.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                loop {
                    let mut len = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; len];
                    r.read_exact(&mut body).unwrap();
                    b.lock().unwrap().push(body);
                    let head = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                    if conn.write_all(head.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, bodies)
}

/// Every span the collector received, with its resource's attributes.
fn received(bodies: &Bodies) -> Vec<(Vec<(String, String)>, Span)> {
    let mut out = Vec::new();
    for b in bodies.lock().unwrap().iter() {
        let req = ExportTraceServiceRequest::decode(b.as_slice()).expect("a valid export");
        for rs in req.resource_spans {
            let res: Vec<(String, String)> = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .map(|a| {
                    (
                        a.key.clone(),
                        text(a.value.as_ref().and_then(|v| v.value.as_ref())),
                    )
                })
                .collect();
            for ss in rs.scope_spans {
                assert_eq!(ss.scope.as_ref().map(|s| s.name.as_str()), Some("moongate"));
                for s in ss.spans {
                    out.push((res.clone(), s));
                }
            }
        }
    }
    out
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => format!("int {i}"),
        Some(Value::DoubleValue(d)) => format!("double {d}"),
        Some(Value::BoolValue(b)) => format!("bool {b}"),
        other => format!("{other:?}"),
    }
}

fn attr(s: &Span, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .map(|a| text(a.value.as_ref().and_then(|v| v.value.as_ref())))
}

#[test]
fn spans_reach_the_collector_as_one_tree_with_their_fields() {
    let (url, bodies) = collector(200);
    let (layer, exporter) = pipeline(ExportConfig::new(&url)).unwrap();
    let subscriber = tracing_subscriber::registry()
        .with(layer.with_filter(Targets::new().with_target("app", tracing::Level::TRACE)));
    let caller =
        SpanContext::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    let unsampled = SpanContext {
        sampled: false,
        ..caller
    };
    let (propagated, quiet) = tracing::subscriber::with_default(subscriber, || {
        let root = tracing::info_span!(target: "app", "request", otel.name = tracing::field::Empty,
            otel.kind = "server", path = "/v1/chat", status = tracing::field::Empty,
            ratio = 0.5, ok = true, big = u64::MAX, method = %"POST");
        set_remote_parent(&root, caller);
        root.record("otel.name", "POST /v1/chat");
        root.record("status", 200);
        let propagated = root.in_scope(|| {
            // A span no filter of this layer takes sits between: its child hangs on root.
            let hidden = tracing::info_span!(target: "elsewhere", "hidden");
            hidden.in_scope(|| {
                let call = tracing::trace_span!(target: "app", "call", otel.name = "master_put",
                    otel.kind = "client");
                let cx = span_context(&call);
                drop(call);
                cx
            })
        });
        drop(root);
        let quiet = tracing::info_span!(target: "app", "unsampled");
        set_remote_parent(&quiet, unsampled);
        let quiet_cx = span_context(&quiet);
        drop(quiet);
        (propagated, quiet_cx)
    });
    assert!(exporter.flush());
    let spans = received(&bodies);
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let (res, root) = spans
        .iter()
        .find(|(_, s)| s.name == "POST /v1/chat")
        .unwrap();
    assert!(res.contains(&("service.name".into(), "moongate".into())));
    assert!(res.contains(&("process.pid".into(), format!("int {}", std::process::id()))));
    assert_eq!(root.trace_id, caller.trace_id);
    assert_eq!(root.parent_span_id, caller.span_id);
    assert_eq!(root.kind, 2);
    assert!(root.start_time_unix_nano > 0 && root.start_time_unix_nano <= root.end_time_unix_nano);
    assert_eq!(attr(root, "path").as_deref(), Some("/v1/chat"));
    assert_eq!(attr(root, "status").as_deref(), Some("int 200"));
    assert_eq!(attr(root, "ratio").as_deref(), Some("double 0.5"));
    assert_eq!(attr(root, "ok").as_deref(), Some("bool true"));
    assert_eq!(
        attr(root, "big").as_deref(),
        Some(&*format!("int {}", i64::MAX))
    );
    assert_eq!(attr(root, "method").as_deref(), Some("POST"));
    assert_eq!(attr(root, "otel.name"), None);
    let (_, call) = spans.iter().find(|(_, s)| s.name == "master_put").unwrap();
    assert_eq!((call.kind, &call.trace_id), (3, &root.trace_id));
    assert_eq!(call.parent_span_id, root.span_id);
    // What the call sends downstream names it, sampled.
    let propagated = propagated.expect("an exported span's context");
    assert_eq!(propagated.span_id.as_slice(), call.span_id.as_slice());
    assert!(propagated.traceparent().as_str().ends_with("-01"));
    // An unsampled caller: nothing exported, and its decision passed on.
    let quiet = quiet.unwrap();
    assert_eq!(quiet.trace_id, caller.trace_id);
    assert!(quiet.traceparent().as_str().ends_with("-00"));
    assert_eq!(exporter.sent(), 2);
    exporter.shutdown();
}

#[test]
fn a_full_queue_and_a_dead_collector_drop_spans_and_hold_nothing_up() {
    // Nothing listens here.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v1/traces", l.local_addr().unwrap())
    };
    let cfg = ExportConfig {
        max_queue: 3,
        batch: 3,
        interval: Duration::from_secs(3600),
        timeout: Duration::from_secs(2),
        ..ExportConfig::new(&dead)
    };
    let (layer, exporter) = pipeline(cfg).unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..10 {
            drop(tracing::info_span!("s"));
        }
    });
    assert!(exporter.flush(), "a failed export still ends the flush");
    assert_eq!(exporter.sent(), 0);
    assert_eq!(exporter.dropped(), 10, "queued or sent, every span is gone");
    exporter.shutdown();

    let (url, bodies) = collector(500);
    let (layer, exporter) = pipeline(ExportConfig::new(&url)).unwrap();
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        drop(tracing::info_span!("s"));
    });
    assert!(exporter.flush());
    assert_eq!(
        (exporter.sent(), exporter.dropped()),
        (0, 1),
        "a 500 counts as dropped"
    );
    assert_eq!(bodies.lock().unwrap().len(), 1);
    drop(exporter);
}

#[test]
fn an_endpoint_that_is_not_an_http_url_is_refused() {
    for bad in ["collector:4318", "ftp://c/v1/traces", "http://"] {
        assert!(pipeline(ExportConfig::new(bad)).is_err(), "{bad}");
    }
}
