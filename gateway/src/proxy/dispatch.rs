//! Dispatch: send one request to one worker over the pooled client.
//!
//! The upstream request is the client's request with the same method, path, query and body
//! bytes (with `--dp-aware`, the entry's rank added to a JSON body that takes one:
//! [`Outgoing::ranked`]); hop-by-hop headers are dropped, `x-request-id` is set, and the worker's api key
//! (if any) replaces `Authorization`.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::time::Sleep;

use crate::client::{HttpClient, describe};
use crate::error::GatewayError;
use crate::proxy::members;
use crate::workers::Worker;

/// The request id header.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Headers never forwarded in either direction (RFC 9110 §7.6.1 plus `host`/`content-length`,
/// which the client sets for the new hop).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::TE
        || name == header::TRAILER
        || name == header::UPGRADE
        || name == header::PROXY_AUTHORIZATION
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// One dispatch failure.
#[derive(Debug)]
pub enum DispatchError {
    /// The connection could not be made: nothing reached the worker; safe to retry elsewhere.
    Connect(String),
    /// The request may have reached the worker, which failed before answering.
    Failed(String),
    /// No response head before the deadline.
    Timeout,
    /// The upstream request could not be built.
    Build(String),
}

/// One request to send: the client's method, path, headers and (possibly rewritten) body.
#[derive(Debug, Clone)]
pub struct Outgoing<'a> {
    /// Method.
    pub method: &'a Method,
    /// Path and query (starting with `/`), appended to the worker's base URL.
    pub path_and_query: PathAndQuery,
    /// The client's headers (filtered on the way out).
    pub headers: &'a HeaderMap,
    /// Set as `x-request-id`.
    pub request_id: &'a HeaderValue,
    /// The body bytes.
    pub body: &'a Bytes,
    /// The body is a JSON object that takes the worker's data-parallel rank: sent to an
    /// entry of `--dp-aware` with a rank, it carries `data_parallel_rank`.
    pub ranked: bool,
}

/// Sends requests to workers.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    client: HttpClient,
    timeout: Duration,
}

impl Dispatcher {
    /// A dispatcher over `client`; `timeout` bounds each whole request.
    pub fn new(client: HttpClient, timeout: Duration) -> Self {
        Self { client, timeout }
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A deadline timer for one request (shared by its attempts and its response body).
    pub fn deadline(&self) -> Pin<Box<Sleep>> {
        Box::pin(tokio::time::sleep(self.timeout))
    }

    /// The pooled client.
    pub fn client(&self) -> &HttpClient {
        &self.client
    }

    /// The upstream request for `out` on `worker` (see the module doc).
    pub fn build(
        &self,
        worker: &Worker,
        out: &Outgoing<'_>,
    ) -> Result<Request<Full<Bytes>>, DispatchError> {
        let uri = worker
            .url()
            .join_pq(out.path_and_query.clone())
            .map_err(|e| DispatchError::Build(e.to_string()))?;
        let body = match worker.dp_rank() {
            Some(dp) if out.ranked => members::with_dp_rank(out.body, dp.rank)
                .map_err(|e| DispatchError::Build(e.to_string()))?,
            _ => out.body.clone(),
        };
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = out.method.clone();
        *req.uri_mut() = uri;
        let (headers, request_id) = (out.headers, out.request_id);
        let out = req.headers_mut();
        out.reserve(headers.len() + 2);
        let bearer = worker.bearer();
        for (name, value) in headers {
            if is_hop_by_hop(name)
                || name == header::HOST
                || name == header::CONTENT_LENGTH
                || name == X_REQUEST_ID
                || (bearer.is_some() && name == header::AUTHORIZATION)
            {
                continue;
            }
            out.append(name.clone(), value.clone());
        }
        out.insert(X_REQUEST_ID.clone(), request_id.clone());
        if let Some(b) = bearer {
            out.insert(header::AUTHORIZATION, (*b).clone());
        }
        if crate::logging::traces_enabled() {
            crate::logging::propagate(out, worker.url().as_str());
        }
        Ok(req)
    }

    /// Sends `out` to `worker`, waiting for the response head until `deadline`.
    pub async fn send(
        &self,
        worker: &Worker,
        out: &Outgoing<'_>,
        deadline: &mut Pin<Box<Sleep>>,
    ) -> Result<Response<Incoming>, DispatchError> {
        let req = self.build(worker, out)?;
        tokio::select! {
            biased;
            r = self.client.request(req) => r.map_err(DispatchError::from_client),
            _ = deadline.as_mut() => Err(DispatchError::Timeout),
        }
    }
}

impl DispatchError {
    /// Classifies a client error: nothing sent (connect) or failed after sending.
    pub fn from_client(e: hyper_util::client::legacy::Error) -> Self {
        if e.is_connect() {
            DispatchError::Connect(describe(&e))
        } else {
            DispatchError::Failed(describe(&e))
        }
    }

    /// The client-facing error for a failure on `worker`.
    pub fn into_gateway_error(self, worker: &Worker, timeout: Duration) -> GatewayError {
        let worker = worker.url().as_str().to_string();
        match self {
            Self::Connect(cause) | Self::Failed(cause) => {
                GatewayError::WorkerUnreachable { worker, cause }
            }
            Self::Timeout => GatewayError::WorkerTimeout {
                worker,
                secs: timeout.as_secs(),
            },
            Self::Build(cause) => {
                GatewayError::Internal(format!("building request to {worker}: {cause}"))
            }
        }
    }
}
