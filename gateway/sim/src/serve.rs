//! The accept loop: HTTP/1.1 (what SGLang's uvicorn speaks) with TCP_NODELAY on every
//! connection, and a shutdown that drains open requests for a grace period, then cuts
//! whatever is still open (a stream that would run for an hour must not hold it up).
//! With traces on (`--otlp-traces-endpoint`), each inference request is served in a span
//! ([`traced`]).

use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

/// Serves an inference request (`/v1/...`, `/generate`) in a server span continuing the
/// router's `traceparent`, so the store client's calls and loads it makes are part of the
/// router's trace, as SGLang's `--enable-trace` continues it; other routes (health and
/// load polls) and everything with traces off pass straight through.
pub async fn traced(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use gateway::logging::{Served, request_span, traces_enabled};
    use tracing::Instrument;
    let path = req.uri().path();
    if !traces_enabled() || !(path.starts_with("/v1/") || path == "/generate") {
        return next.run(req).await;
    }
    let id = req
        .headers()
        .get("x-request-id")
        .cloned()
        .unwrap_or(http::HeaderValue::from_static(""));
    let span = request_span(Served::Inference, req.method(), path, req.headers(), &id);
    let answer = next.run(req).instrument(span.clone()).await;
    span.record("http.response.status_code", answer.status().as_u16());
    answer
}

/// Pause after an accept error (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// Serves `app` on `listener` until `stop` delivers a grace period (or its sender is
/// dropped: no grace). Returns once every connection has closed or been cut.
pub async fn serve(listener: TcpListener, app: Router, mut stop: oneshot::Receiver<Duration>) {
    let mut conns = JoinSet::new();
    let (drain, draining) = watch::channel(false);
    let grace = loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _peer)) => {
                    let _ = tcp.set_nodelay(true);
                    conns.spawn(connection(tcp, app.clone(), draining.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            grace = &mut stop => break grace.unwrap_or_default(),
        }
    };
    drop(listener);
    let _ = drain.send(true);
    let drained = tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} });
    if drained.await.is_err() {
        tracing::info!(
            open = conns.len(),
            "grace period over, closing open connections"
        );
        conns.abort_all();
    }
}

/// One keep-alive connection; on drain it finishes the request in progress and closes.
async fn connection(tcp: tokio::net::TcpStream, app: Router, mut draining: watch::Receiver<bool>) {
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app));
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = draining.wait_for(|d| *d) => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}
