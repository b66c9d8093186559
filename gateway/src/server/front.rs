//! The front door: the gateway's one middleware stack, in one place, and the fast path.
//!
//! Every request passes through [`Front`], in this order: CORS (with
//! `--cors-allowed-origins`: preflights answered here, the allowed origin echoed on every
//! answer) -> request id (the client's, from the first of `--request-id-headers` it sent,
//! else a minted one; forwarded to workers as `x-request-id` and echoed on the response) ->
//! the request's log span (`request{request_id=...}`: every log line written while the
//! request is served, its response body included, carries the id) -> dispatch (a `POST` to
//! an inference route is checked against the client keys and goes straight to the proxy,
//! without the generic router's per-request boxing; everything else goes to the axum
//! router, whose guarded routes check their plane's key) -> metrics (count by route and
//! status, time to the response head) and a debug log line.
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
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, header};
use http_body::{Frame, SizeHint};
use tower::ServiceExt;
use tower_http::cors::{AllowOrigin, Cors, CorsLayer};
use tracing::Instrument;

use super::{AppState, inference};
use crate::auth::{self, Plane};
use crate::metrics::{self, Route};
use crate::proxy::Endpoint;
use crate::proxy::dispatch::X_REQUEST_ID;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The complete gateway service (see the module doc). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Front {
    inner: Stack,
}

#[derive(Clone, Debug)]
enum Stack {
    Plain(Core),
    Cors(Box<Cors<Core>>),
}

/// Everything after CORS.
#[derive(Clone, Debug)]
struct Core {
    state: AppState,
    router: Router,
}

impl Front {
    /// Wraps `router` (all non-inference routes, and the inference routes' documentation),
    /// with CORS when the configuration allows origins.
    pub fn new(state: AppState, router: Router) -> Self {
        let cors = cors_layer(state.config());
        let core = Core { state, router };
        let inner = match cors {
            Some(layer) => Stack::Cors(Box::new(tower::Layer::layer(&layer, core))),
            None => Stack::Plain(core),
        };
        Self { inner }
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

fn endpoint(route: Route, method: &Method) -> Option<Endpoint> {
    if method != Method::POST {
        return None;
    }
    match route {
        Route::ChatCompletions => Some(Endpoint::ChatCompletions),
        Route::Completions => Some(Endpoint::Completions),
        Route::Generate => Some(Endpoint::Generate),
        _ => None,
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl<B> tower::Service<Request<B>> for Front
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

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match &mut self.inner {
            Stack::Plain(core) => core.call(req),
            Stack::Cors(cors) => Box::pin(cors.call(req)),
        }
    }
}

impl<B> tower::Service<Request<B>> for Core
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

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let start = Instant::now();
        let (mut parts, body) = req.into_parts();
        let route = Route::of(parts.uri.path());
        let id = self.state.request_ids().ensure(&mut parts.headers);
        let fast = endpoint(route, &parts.method);
        let span = if fast.is_some() && crate::logging::traces_enabled() {
            crate::logging::request_span(&parts.method, parts.uri.path(), &parts.headers, &id)
        } else {
            crate::logging::log_span(&id)
        };
        let state = self.state.clone();
        let router = self.router.clone();
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(a)| *a);
        let in_span = span.clone();
        Box::pin(
            async move {
                let mut resp = match fast {
                    Some(ep) => match state.auth().admit(Plane::Client, &mut parts.headers, peer) {
                        Ok(()) => inference::proxy(&state, ep, parts, body, id.clone()).await,
                        Err(refusal) => {
                            tracing::debug!(?refusal, "inference refused");
                            auth::refuse(&super::gateway_rejection(), Plane::Client, refusal)
                        }
                    },
                    None => match router
                        .oneshot(Request::from_parts(parts, Body::new(body)))
                        .await
                    {
                        Ok(r) => r,
                        Err(never) => match never {},
                    },
                };
                let status = resp.status().as_u16();
                in_span.record("http.response.status_code", status);
                metrics::request(route, status, start.elapsed());
                tracing::debug!(
                    status,
                    ?route,
                    elapsed_us = start.elapsed().as_micros() as u64,
                    "request"
                );
                resp.headers_mut().insert(X_REQUEST_ID.clone(), id);
                let (parts, body) = resp.into_parts();
                Ok(Response::from_parts(
                    parts,
                    Body::new(InSpan {
                        inner: body,
                        span: in_span,
                    }),
                ))
            }
            .instrument(span),
        )
    }
}

/// A response body polled inside its request's span, so what is logged while it streams
/// (a worker breaking mid-stream, a stream cut at the deadline) names the request.
struct InSpan {
    inner: Body,
    span: tracing::Span,
}

impl http_body::Body for InSpan {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let _entered = this.span.enter();
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
