//! The front door: every request `moongate serve` answers goes through one `tower`
//! `ServiceBuilder` stack, built in [`Front::new`], in this order:
//!
//! 1. CORS (`tower_http::cors`, with `--cors-allowed-origins`): preflights answered here,
//!    the allowed origin echoed on every answer.
//! 2. The request id ([`RequestIdLayer`]): the client's, from the first of
//!    `--request-id-headers` it sent, else minted, here only; the request's `x-request-id`
//!    and [`RequestId`] extension from then on (forwarded to workers), echoed on the answer.
//! 3. The request's span (`tower_http::trace`, [`RequestSpan`]): every log line written
//!    while the request is served, its response body included, carries the id; an
//!    inference request or a hosted master call with traces on gets the OpenTelemetry
//!    server span.
//! 4. Metrics ([`Record`]): count by route and status, time to the response head, the
//!    status on the span, a debug log line.
//! 5. The one entry ([`Entry`]): a `POST` to an inference route is checked against the
//!    client keys and goes to the proxy (`inference::proxy`) without the router's
//!    per-request boxing; any other method there is 405; everything else goes to the axum
//!    router, whose guarded routes check their plane's key.
//!
//! The accept loop puts the peer's address on every request as `ConnectInfo<SocketAddr>`
//! ([`crate::listen::WithPeer`]), which the key checks read (the admin plane answers
//! loopback peers only when the server has no admin key).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::ConnectInfo;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, header};
use tower::ServiceExt;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceBuilder};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::trace::{MakeSpan, TraceLayer};

use crate::logging::Served;

use super::{AppState, inference};
use crate::auth::{self, Plane};
use crate::error::GatewayError;
use crate::metrics::{self, Route};
use crate::proxy::Endpoint;
use crate::proxy::dispatch::X_REQUEST_ID;
use crate::request_id::{RequestId, RequestIdLayer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// The complete gateway service (see the module doc). Cheap to clone.
#[derive(Clone)]
pub struct Front {
    stack: BoxCloneSyncService<Request<Body>, Response, Infallible>,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Front")
    }
}

impl Front {
    /// The stack over `router` (every route but the inference `POST`s, and the inference
    /// routes' documentation), with CORS when the configuration allows origins.
    pub fn new(state: AppState, router: Router) -> Self {
        let cors = cors_layer(state.config());
        let ids = state.request_ids().clone();
        let stack = ServiceBuilder::new()
            .layer(tower::util::option_layer(cors))
            .map_response(|r: Response<_>| r.map(Body::new))
            .layer(RequestIdLayer::new(ids))
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(RequestSpan)
                    .on_request(())
                    .on_response(())
                    .on_body_chunk(BodyTiming::default())
                    .on_eos(BodyTiming::default())
                    .on_failure(()),
            )
            .layer(RecordLayer)
            .service(Entry { state, router });
        Self {
            stack: BoxCloneSyncService::new(stack),
        }
    }
}

impl<B> tower::Service<Request<B>> for Front
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.stack.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.stack.call(req.map(Body::new))
    }
}

/// The CORS layer `cfg.cors_allowed_origins` asks for (none when empty). Origins are
/// validated with the configuration; one that still fails to be a header value is skipped.
fn cors_layer(cfg: &crate::config::ServeConfig) -> Option<CorsLayer> {
    if cfg.cors_allowed_origins.is_empty() {
        return None;
    }
    let origin = if cfg.cors_allowed_origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            cfg.cors_allowed_origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok()),
        )
    };
    let mut allow_headers = vec![
        header::AUTHORIZATION,
        header::CONTENT_TYPE,
        header::ACCEPT,
        X_REQUEST_ID.clone(),
        HeaderName::from_static("traceparent"),
        HeaderName::from_static("tracestate"),
    ];
    for h in &cfg.request_id_headers {
        if let Ok(name) = HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes())
            && !allow_headers.contains(&name)
        {
            allow_headers.push(name);
        }
    }
    Some(
        CorsLayer::new()
            .allow_origin(origin)
            .allow_methods([
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ])
            .allow_headers(allow_headers)
            .expose_headers([
                X_REQUEST_ID.clone(),
                header::RETRY_AFTER,
                header::LOCATION,
                header::WWW_AUTHENTICATE,
            ])
            .max_age(Duration::from_secs(600)),
    )
}

/// The inference endpoint a request is for: a `POST` to one of the proxied routes.
fn endpoint(path: &str, method: &Method) -> Option<Endpoint> {
    if method != Method::POST {
        return None;
    }
    inference_route(path)
}

/// The proxied inference endpoint of `path`, whatever the method.
fn inference_route(path: &str) -> Option<Endpoint> {
    use openapi::routes::gateway as gw;
    Some(match path {
        gw::ChatCompletions::PATH => Endpoint::ChatCompletions,
        gw::Completions::PATH => Endpoint::Completions,
        gw::Generate::PATH => Endpoint::Generate,
        gw::Embeddings::PATH => Endpoint::Embeddings,
        gw::Rerank::PATH => Endpoint::Rerank,
        gw::V1Rerank::PATH => Endpoint::V1Rerank,
        gw::Classify::PATH => Endpoint::Classify,
        gw::Score::PATH => Endpoint::Score,
        gw::Tokenize::PATH => Endpoint::Tokenize,
        gw::Detokenize::PATH => Endpoint::Detokenize,
        gw::Responses::PATH => Endpoint::Responses,
        _ => return None,
    })
}

/// The span each request is served in: the OpenTelemetry server span of an inference
/// request or a master call when traces are on, else the plain log span (both carry the
/// request id).
#[derive(Clone, Copy, Debug)]
pub struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, req: &Request<B>) -> tracing::Span {
        let empty = HeaderValue::from_static("");
        let id = req.extensions().get::<RequestId>().map_or(&empty, |r| &r.0);
        let path = req.uri().path();
        if !crate::logging::traces_enabled() {
            return crate::logging::log_span(id);
        }
        let method = req.method();
        let served = if endpoint(path, method).is_some() {
            Some(Served::Inference)
        } else {
            openapi::routes::operation_of(openapi::routes::master::ALL, method.as_str(), path)
                .map(Served::Master)
        };
        if let Some(served) = served {
            crate::logging::request_span(served, method, path, req.headers(), id)
        } else {
            crate::logging::log_span(id)
        }
    }
}

/// Times a response's body on its span when traces are on: the first chunk after the head
/// (`body.first_chunk_ms`: a stream's first token) and the whole body (`body.duration_ms`:
/// its last). Off, a relaxed load per chunk.
#[derive(Clone, Copy, Debug, Default)]
pub struct BodyTiming {
    seen: bool,
}

impl<B> tower_http::trace::OnBodyChunk<B> for BodyTiming {
    fn on_body_chunk(&mut self, _: &B, latency: Duration, span: &tracing::Span) {
        if !self.seen && crate::logging::traces_enabled() {
            self.seen = true;
            span.record("body.first_chunk_ms", latency.as_secs_f64() * 1000.0);
        }
    }
}

impl tower_http::trace::OnEos for BodyTiming {
    fn on_eos(self, _: Option<&http::HeaderMap>, body: Duration, span: &tracing::Span) {
        if crate::logging::traces_enabled() {
            span.record("body.duration_ms", body.as_secs_f64() * 1000.0);
        }
    }
}

/// The layer of [`Record`].
#[derive(Clone, Copy, Debug)]
pub struct RecordLayer;

impl<S> Layer<S> for RecordLayer {
    type Service = Record<S>;

    fn layer(&self, inner: S) -> Record<S> {
        Record { inner }
    }
}

/// Counts each request by route and status with its time to the response head, records
/// the status on the request's span and logs a debug line.
#[derive(Clone, Debug)]
pub struct Record<S> {
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for Record<S>
where
    S: tower::Service<Request<B>, Response = Response, Error = Infallible, Future = BoxFuture>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Recorded;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Recorded {
        Recorded {
            route: Route::of(req.uri().path()),
            start: Instant::now(),
            inner: self.inner.call(req),
        }
    }
}

/// The answer of [`Record`], recorded once its head is there.
pub struct Recorded {
    route: Route,
    start: Instant,
    inner: BoxFuture,
}

impl Future for Recorded {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let resp = std::task::ready!(self.inner.as_mut().poll(cx))?;
        let status = resp.status().as_u16();
        let elapsed = self.start.elapsed();
        tracing::Span::current().record("http.response.status_code", status);
        metrics::request(self.route, status, elapsed);
        tracing::debug!(
            status,
            route = ?self.route,
            elapsed_us = elapsed.as_micros() as u64,
            "request"
        );
        Poll::Ready(Ok(resp))
    }
}

/// The one entry past the layers: inference `POST`s to the proxy, the rest to the router.
#[derive(Clone, Debug)]
pub struct Entry {
    state: AppState,
    router: Router,
}

impl<B> tower::Service<Request<B>> for Entry
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> BoxFuture {
        let (mut parts, body) = req.into_parts();
        let Some(ep) = inference_route(parts.uri.path()) else {
            let router = self.router.clone();
            return Box::pin(async move {
                let req = Request::from_parts(parts, Body::new(body));
                Ok(router
                    .oneshot(req)
                    .await
                    .unwrap_or_else(|never| match never {}))
            });
        };
        if parts.method != Method::POST {
            return Box::pin(async { Ok(GatewayError::MethodNotAllowed.into_response()) });
        }
        let state = self.state.clone();
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(a)| *a);
        let id = parts
            .extensions
            .get::<RequestId>()
            .map(|r| r.0.clone())
            .unwrap_or_else(|| HeaderValue::from_static(""));
        Box::pin(async move {
            Ok(
                match state
                    .auth()
                    .admit_owner(Plane::Client, &mut parts.headers, peer)
                {
                    Ok(owner) => {
                        if let Some(o) = owner {
                            parts
                                .extensions
                                .insert(crate::admission::tenants::ClientOwner(o));
                        }
                        inference::proxy(&state, ep, parts, body, id).await
                    }
                    Err(refusal) => {
                        tracing::debug!(?refusal, "inference refused");
                        auth::refuse(&super::gateway_rejection(), Plane::Client, refusal)
                    }
                },
            )
        })
    }
}
