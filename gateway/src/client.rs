//! The upstream HTTP client: one pooled, keep-alive HTTP/1.1 client (TCP_NODELAY) shared by
//! the proxy, the health checker and model discovery. `http://` workers are spoken to in
//! the clear, `https://` ones over TLS (rustls), verified against the system's trust roots
//! plus the ones `--worker-ca-cert` adds.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{Client, ResponseFuture, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

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
/// file `extra` (a private CA). An unreadable file, or one without a certificate, is an
/// error naming it; system roots that do not load are skipped (a host without any can still
/// trust `extra`).
pub fn worker_roots(extra: Option<&Path>) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    let system = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(system.certs);
    if let Some(path) = extra {
        for c in ca_certificates(path)? {
            roots
                .add(c)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(roots)
}

/// The certificates of the PEM file `path` (`--worker-ca-cert`): at least one, or an error
/// naming the file.
pub fn ca_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
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
        conn.enforce_http(false);
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("aws-lc-rs supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(conn);
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
        let mut req = Request::get(uri)
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        if let Some(b) = bearer {
            req.headers_mut().insert(header::AUTHORIZATION, b.clone());
        }
        let work = async {
            let resp = self.inner.request(req).await.map_err(|e| describe(&e))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), SMALL_BODY_LIMIT)
                .collect()
                .await
                .map_err(|e| format!("reading body: {e}"))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {}s", timeout.as_secs_f32())))
    }
}

/// A one-line description of a client error including its cause chain.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}
