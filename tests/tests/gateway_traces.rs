//! OpenTelemetry traces: with `--otlp-traces-endpoint` the gateway exports a server span per
//! inference request over OTLP/HTTP (to an in-test collector on a loopback port), parented on
//! the client's `traceparent`, and sends the worker a `traceparent` of the same trace whose
//! parent is the gateway's span. Its own process: the tracing subscriber is global.

use gateway::config::{LogLevel, ServeConfig};
use moongate_tests::{
    Backend, eventually, fast_config, otlp_collector as collector, start_gateway,
};
use serde_json::json;

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn request_spans_are_exported_and_the_trace_continues_at_the_worker() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (url, bodies) = rt.block_on(collector());
    // The exporter's blocking HTTP client is built (and later flushed) outside the runtime,
    // as `moongate serve` does.
    let traces = gateway::logging::init_with_traces(LogLevel::Warn, Some(&url))
        .unwrap()
        .expect("traces on");
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let seen = rt.block_on(async {
        let b = Backend::start("w", "m").await;
        let gw = start_gateway(ServeConfig {
            worker_urls: vec![b.url()],
            otlp_traces_endpoint: Some(url.clone()),
            ..fast_config()
        })
        .await;
        eventually("worker ready", || gw.state().registry().counts().0 == 1).await;
        let r = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", gw.url()))
            .header("traceparent", format!("00-{client_trace}-{client_span}-01"))
            .header("x-request-id", "trace-me")
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        gw.shutdown().await;
        b.seen()
    });
    // The worker got the same trace, with the gateway's span as its parent.
    let tp = seen[0].headers["traceparent"].to_str().unwrap().to_owned();
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_eq!(parts[1], client_trace, "same trace: {tp}");
    assert_ne!(parts[2], client_span, "a new span, the gateway's: {tp}");
    assert_eq!(parts[3], "01", "sampled: {tp}");

    traces.flush();
    let exported = bodies.lock().concat();
    assert!(!exported.is_empty(), "nothing reached the collector");
    assert!(
        contains(&exported, &hex_bytes(client_trace)),
        "the client's trace id is not in the export"
    );
    assert!(
        contains(&exported, &hex_bytes(parts[2])),
        "the span the worker was given is not in the export"
    );
    assert!(contains(&exported, b"POST /v1/chat/completions"));
    assert!(contains(&exported, b"trace-me"), "the request id attribute");
    // The body is timed on the span: its first chunk and its end after the head.
    assert!(contains(&exported, b"body.first_chunk_ms"));
    assert!(contains(&exported, b"body.duration_ms"));
    assert!(contains(&exported, b"moongate"), "the service name");
    traces.shutdown();
}

#[test]
fn a_traces_endpoint_that_is_not_an_http_url_is_refused_before_start() {
    for bad in ["collector:4318", "grpc://c:4317/v1/traces", "http://"] {
        let cfg = ServeConfig {
            otlp_traces_endpoint: Some(bad.into()),
            ..fast_config()
        };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("otlp_traces_endpoint"), "{bad}: {err}");
    }
}
