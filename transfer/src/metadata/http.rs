//! Client of Mooncake's HTTP metadata interface, as served by Mooncake's metadata server
//! (`mooncake_http_metadata_server`, `mooncake_master --enable_http_metadata_server`) and by
//! Moongate's KV master:
//!
//! | request | answer |
//! |---|---|
//! | `GET /metadata?key=K` | 200 with exactly the bytes last PUT; 404 when absent |
//! | `PUT /metadata?key=K` (body) | 200, stores the body |
//! | `DELETE /metadata?key=K` | 200 when removed; 404 when absent |
//! | missing `key` | 400 |
//!
//! `https://` URLs are spoken to over TLS, verified against the system's trust roots plus an
//! optional CA file ([`trust::tls`]). A configured bearer key (Moongate's master wants its
//! store key on `/metadata`) goes with every request to that URL and nowhere else: the
//! client follows no redirect. Mooncake's own server ignores the header.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::auth::ClusterSecret;
use crate::error::{Result, TransferError};
use crate::metadata::{BoxFuture, Metadata, segment_key};
use crate::segment::SegmentDescriptor;
use trust::Secret;

/// Largest metadata value accepted from the server.
const MAX_VALUE: usize = 16 << 20;

/// HTTP metadata client for a base URL such as `http://10.0.0.1:8080/metadata`.
#[derive(Clone)]
pub struct HttpMetadata {
    base: url::Url,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
    /// `Bearer <key>`, marked sensitive (never logged by hyper, never in `Debug`).
    auth: Option<HeaderValue>,
}

impl std::fmt::Debug for HttpMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpMetadata")
            .field("base", &self.base.as_str())
            .field("timeout", &self.timeout)
            .field("auth", &self.auth.is_some())
            .finish()
    }
}

impl HttpMetadata {
    /// A client for `base` (`http://host:port/path` or `https://...`, trusting the system's
    /// roots) that sends no key. Each call is bounded by `timeout`.
    pub fn new(base: &str, timeout: Duration) -> Result<Self> {
        Self::with_auth(base, timeout, None, None)
    }

    /// A client for `base` that sends `api_key` as `Authorization: Bearer` with every
    /// request, and trusts the certificates of the PEM file `ca_cert_file` for an
    /// `https://` base, on top of the system's roots.
    pub fn with_auth(
        base: &str,
        timeout: Duration,
        api_key: Option<&Secret>,
        ca_cert_file: Option<&Path>,
    ) -> Result<Self> {
        let bad = |reason: String| TransferError::Metadata {
            operation: "configure",
            key: base.to_owned(),
            reason,
        };
        let url = url::Url::parse(base).map_err(|e| bad(format!("invalid URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad(format!(
                "scheme {:?} is not supported (use http:// or https://)",
                url.scheme()
            )));
        }
        if url.host_str().is_none() {
            return Err(bad("URL has no host".into()));
        }
        let auth = api_key
            .map(|k| {
                HeaderValue::try_from(format!("Bearer {}", k.expose()))
                    .map(|mut v| {
                        v.set_sensitive(true);
                        v
                    })
                    .map_err(|_| bad("the API key is not a valid header value".into()))
            })
            .transpose()?;
        let roots = trust::tls::trust_roots(ca_cert_file).map_err(bad)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let connector = trust::tls::https_or_http(connector, trust::tls::client_config(roots));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            base: url,
            client,
            timeout,
            auth,
        })
    }

    /// The client an engine uses for `MetadataConfig::Http`: `api_key`, else the store key
    /// derived from the engine's `secret`.
    pub(crate) fn for_engine(
        base: &str,
        api_key: Option<&Secret>,
        ca_cert_file: Option<&Path>,
        secret: &ClusterSecret,
        timeout: Duration,
    ) -> Result<Self> {
        let derived;
        let key = match api_key {
            Some(k) => k,
            None => {
                derived = Secret::new(secret.store_api_key());
                &derived
            }
        };
        Self::with_auth(base, timeout, Some(key), ca_cert_file)
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        self.base.as_str()
    }

    fn uri(&self, key: &str) -> Uri {
        let mut u = self.base.clone();
        u.set_query(Some(&format!("key={}", encode_key(key))));
        u.as_str().parse().expect("a valid URL is a valid URI")
    }

    async fn call(
        &self,
        op: &'static str,
        method: Method,
        key: &str,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Vec<u8>)> {
        let err = |reason: String| TransferError::Metadata {
            operation: op,
            key: key.to_owned(),
            reason,
        };
        let mut req = Request::builder()
            .method(method)
            .uri(self.uri(key))
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(auth) = &self.auth {
            req = req.header(http::header::AUTHORIZATION, auth.clone());
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| err(e.to_string()))?;
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| {
                err(format!(
                    "{} unreachable: {}",
                    self.base,
                    trust::tls::describe(&e)
                ))
            })?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_VALUE)
                .collect()
                .await
                .map_err(|e| err(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok((status, body.to_vec()))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| {
                err(format!(
                    "no answer from {} within {:?}",
                    self.base, self.timeout
                ))
            })?
    }

    fn unexpected(op: &'static str, key: &str, status: StatusCode, body: &[u8]) -> TransferError {
        let text = String::from_utf8_lossy(&body[..body.len().min(256)]).into_owned();
        TransferError::Metadata {
            operation: op,
            key: key.to_owned(),
            reason: format!("HTTP {status}: {text}"),
        }
    }

    /// `GET`: the value under `key`, `None` on 404.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let (status, body) = self.call("fetch", Method::GET, key, Vec::new()).await?;
        match status {
            StatusCode::OK => Ok(Some(body)),
            StatusCode::NOT_FOUND => Ok(None),
            s => Err(Self::unexpected("fetch", key, s, &body)),
        }
    }

    /// `PUT`: stores `value` under `key`.
    pub async fn put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        let (status, body) = self.call("publish", Method::PUT, key, value).await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(Self::unexpected("publish", key, status, &body))
        }
    }

    /// `DELETE`: removes `key`; `false` if it was absent (404).
    pub async fn delete(&self, key: &str) -> Result<bool> {
        let (status, body) = self.call("remove", Method::DELETE, key, Vec::new()).await?;
        match status {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            s => Err(Self::unexpected("remove", key, s, &body)),
        }
    }
}

/// Percent-encodes a key for the query string, leaving every character that is legal there
/// as is: Mooncake's C++ metadata server does not decode the query, so `a/b:1` must be sent
/// literally to name the same key its own clients use (decoding servers see no difference).
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/:@!$'()*,;".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Metadata for HttpMetadata {
    fn publish<'a>(&'a self, desc: &'a SegmentDescriptor) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.put_descriptor(desc))
    }

    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<SegmentDescriptor>>> {
        Box::pin(async move {
            match self.get(&segment_key(name)).await? {
                Some(bytes) => SegmentDescriptor::from_json(&bytes).map(Some),
                None => Ok(None),
            }
        })
    }

    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.delete(&segment_key(name)).await.map(|_| ()) })
    }

    fn kind(&self) -> &'static str {
        "http"
    }
}

impl HttpMetadata {
    async fn put_descriptor(&self, desc: &SegmentDescriptor) -> Result<()> {
        self.put(&segment_key(&desc.name), desc.to_json()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_literal_where_the_query_allows() {
        assert_eq!(
            encode_key("moongate/segment/10.0.0.1:7000"),
            "moongate/segment/10.0.0.1:7000"
        );
        assert_eq!(
            encode_key("mooncake/ram/[::1]:1"),
            "mooncake/ram/%5B::1%5D:1"
        );
        assert_eq!(encode_key("a b&c=d+e#f%"), "a%20b%26c%3Dd%2Be%23f%25");
        assert_eq!(encode_key("é"), "%C3%A9");
        let m = HttpMetadata::new("http://h:1/metadata", Duration::from_secs(1)).unwrap();
        assert_eq!(m.uri("x/y").to_string(), "http://h:1/metadata?key=x/y");
    }

    #[test]
    fn urls_and_keys_are_checked_and_the_key_never_shown() {
        let t = Duration::from_secs(1);
        assert!(HttpMetadata::new("https://h:1/metadata", t).is_ok());
        assert!(HttpMetadata::new("ftp://h:1/metadata", t).is_err());
        assert!(HttpMetadata::new("not a url", t).is_err());
        let bad = Secret::new("bad\nkey");
        assert!(HttpMetadata::with_auth("http://h:1/m", t, Some(&bad), None).is_err());
        let e = HttpMetadata::with_auth("https://h:1/m", t, None, Some(Path::new("/nope.pem")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nope.pem"), "{e}");
        let k = Secret::new("k-secret-1");
        let m = HttpMetadata::with_auth("http://h:1/m", t, Some(&k), None).unwrap();
        let auth = m.auth.as_ref().unwrap();
        assert!(auth.is_sensitive() && auth == "Bearer k-secret-1");
        assert!(!format!("{m:?}").contains("k-secret-1"));
    }

    #[test]
    fn an_engine_sends_its_explicit_key_else_the_derived_one() {
        let t = Duration::from_secs(1);
        let secret = ClusterSecret::from_bytes(b"0123456789abcdef-cluster").unwrap();
        let derived = HttpMetadata::for_engine("http://h:1/m", None, None, &secret, t).unwrap();
        let want = format!("Bearer {}", secret.store_api_key());
        assert_eq!(derived.auth.as_ref().unwrap(), want.as_str());
        let k = Secret::new("explicit");
        let given = HttpMetadata::for_engine("http://h:1/m", Some(&k), None, &secret, t).unwrap();
        assert_eq!(given.auth.as_ref().unwrap(), "Bearer explicit");
    }
}
