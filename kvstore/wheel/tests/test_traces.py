"""A caller's OpenTelemetry span is the parent of the master's spans for the store calls
it makes: a `moongate master --otlp-traces-endpoint` exports them into the caller's trace,
as an OpenTelemetry-instrumented SGLang or RL process would see them. Needs
`opentelemetry-sdk` and `opentelemetry-proto` (`.ci/run` installs them)."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider

from conftest import Master, new_store


def collector():
    """An OTLP/HTTP collector on a free port: its server and the bodies it received."""
    bodies = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            bodies.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, bodies


def test_the_callers_span_is_the_parent_of_the_masters_spans():
    server, bodies = collector()
    master = Master("--otlp-traces-endpoint",
                    f"http://127.0.0.1:{server.server_port}/v1/traces")
    try:
        tracer = TracerProvider().get_tracer("test")
        store = new_store(master)
        with tracer.start_as_current_span("load") as span:
            assert store.put("traced", b"v" * 64) == 0
            assert store.get("traced") == b"v" * 64
        caller = span.get_span_context()
        # Outside any span: the master's spans are traces of their own.
        assert store.is_exist("traced") == 1
        assert store.close() == 0
    finally:
        master.stop()  # SIGTERM: the master flushes its spans as it exits
        server.shutdown()
    spans = [s for body in bodies
             for rs in ExportTraceServiceRequest.FromString(body).resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    trace_id = caller.trace_id.to_bytes(16, "big")
    mine = [s for s in spans if s.trace_id == trace_id]
    names = sorted(s.name for s in mine)
    assert any("put" in n for n in names) and any("get_replicas" in n for n in names), names
    for s in mine:
        assert s.parent_span_id == caller.span_id.to_bytes(8, "big"), s.name
        assert s.kind == 2, s.name  # the master's server span
    exists = [s for s in spans if "exists" in s.name]
    assert exists, sorted({s.name for s in spans})
    assert all(s.trace_id != trace_id for s in exists)
