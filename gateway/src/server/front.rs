//! The front door: the gateway's one middleware stack, in one place, and the fast path.
//!
//! Every request passes through [`Front`], in this order: request id (the client's, from
//! the first of `--request-id-headers` it sent, else a minted one; forwarded to workers as
//! `x-request-id` and echoed on the response) ->
//! dispatch (a `POST` to an inference route goes straight to the proxy, without the generic
//! router's per-request boxing; everything else goes to the axum router) -> metrics (count
//! by route and status, time to the response head) and a debug log line.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{Method, Request};
use tower::ServiceExt;

use super::{AppState, inference};
use crate::metrics::{self, Route};
use crate::proxy::Endpoint;
use crate::proxy::dispatch::X_REQUEST_ID;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The complete gateway service (see the module doc). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Front {
    state: AppState,
    router: Router,
}

impl Front {
    /// Wraps `router` (all non-inference routes, and the inference routes' documentation).
    pub fn new(state: AppState, router: Router) -> Self {
        Self { state, router }
    }
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

impl<B> tower::Service<Request<B>> for Front
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let start = Instant::now();
        let (mut parts, body) = req.into_parts();
        let route = Route::of(parts.uri.path());
        let id = self.state.request_ids().ensure(&mut parts.headers);
        let fast = endpoint(route, &parts.method);
        let state = self.state.clone();
        let router = self.router.clone();
        Box::pin(async move {
            let mut resp = match fast {
                Some(ep) => inference::proxy(&state, ep, parts, body, id.clone()).await,
                None => match router
                    .oneshot(Request::from_parts(parts, Body::new(body)))
                    .await
                {
                    Ok(r) => r,
                    Err(never) => match never {},
                },
            };
            let status = resp.status().as_u16();
            metrics::request(route, status, start.elapsed());
            tracing::debug!(request_id = ?id, status, ?route,
                elapsed_us = start.elapsed().as_micros() as u64, "request");
            resp.headers_mut().insert(X_REQUEST_ID.clone(), id);
            Ok(resp)
        })
    }
}
