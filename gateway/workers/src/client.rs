//! The upstream HTTP client: one pooled, keep-alive HTTP/1.1 client (TCP_NODELAY) shared by
//! the proxy, the health checker and model discovery. `http://` workers are spoken to in
//! the clear, `https://` ones over TLS (rustls), verified against the system's trust roots
//! plus the ones `--worker-ca-cert` adds.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{Client, ResponseFuture, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};

pub use trust::tls::{ca_certificates, describe};

/// Largest control-plane response read (health, model discovery).
const SMALL_BODY_LIMIT: usize = 1024 * 1024;

/// The shared client (cheap to clone).
#[derive(Clone, Debug)]
pub struct HttpClient {
    inner: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

/// The trust roots for `https://` workers: the system's, plus every certificate in the PEM
/// file `extra` (`--worker-ca-cert`, a private CA); see [`trust::tls::trust_roots`].
pub fn worker_roots(extra: Option<&Path>) -> Result<rustls::RootCertStore, String> {
    trust::tls::trust_roots(extra)
}

impl HttpClient {
    /// A client with keep-alive pooling, no Nagle, and connect timeout, trusting the
    /// system's roots for `https://` workers.
    pub fn new() -> Self {
        Self::with_roots(worker_roots(None).unwrap_or_else(|_| rustls::RootCertStore::empty()))
    }

    /// [`HttpClient::new`] trusting `roots` (see [`worker_roots`]) for `https://` workers.
    pub fn with_roots(roots: rustls::RootCertStore) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.set_keepalive(Some(Duration::from_secs(60)));
        conn.set_connect_timeout(Some(Duration::from_secs(5)));
        let https = trust::tls::https_or_http(conn, trust::tls::client_config(roots));
        let inner = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(https);
        Self { inner }
    }

    /// Sends a request (the proxy path).
    #[inline]
    pub fn request(&self, req: Request<Full<Bytes>>) -> ResponseFuture {
        self.inner.request(req)
    }

    /// `GET uri` with an optional bearer, bounded by `timeout`; reads at most 1 MiB of body.
    /// For control-plane calls; errors are rendered as text for the admin API.
    pub async fn get_small(
        &self,
        uri: Uri,
        bearer: Option<&HeaderValue>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        self.call(Call {
            method: Method::GET,
            uri,
            bearer,
            body: Bytes::new(),
            timeout,
            limit: SMALL_BODY_LIMIT,
        })
        .await
    }

    /// One control-plane call: a JSON body (when not empty) and a bearer, the answer's body
    /// read up to `limit` bytes, all within `timeout`. Errors are rendered as text.
    pub async fn call(&self, call: Call<'_>) -> Result<(StatusCode, Bytes), String> {
        let mut req = Request::builder()
            .method(call.method)
            .uri(call.uri)
            .body(Full::new(call.body.clone()))
            .map_err(|e| e.to_string())?;
        if let Some(b) = call.bearer {
            req.headers_mut().insert(header::AUTHORIZATION, b.clone());
        }
        if !call.body.is_empty() {
            req.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        let limit = call.limit;
        let work = async {
            let resp = self.inner.request(req).await.map_err(|e| describe(&e))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map_err(|e| format!("reading body: {e}"))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(call.timeout, work)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {}s", call.timeout.as_secs_f32())))
    }
}

/// A control-plane call ([`HttpClient::call`]).
#[derive(Debug)]
pub struct Call<'a> {
    /// The method.
    pub method: Method,
    /// Where.
    pub uri: Uri,
    /// `Authorization` to send.
    pub bearer: Option<&'a HeaderValue>,
    /// A JSON body (empty: none).
    pub body: Bytes,
    /// The whole call's deadline.
    pub timeout: Duration,
    /// The most body bytes read from the answer.
    pub limit: usize,
}
