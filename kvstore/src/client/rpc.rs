//! The client's side of the master's REST API: one typed call per route, over a pooled
//! keep-alive HTTP/1.1 client with `TCP_NODELAY` (small requests must not wait for Nagle).
//!
//! Every call is one request. A 2xx answer is decoded into its wire type; an error answer
//! is decoded into the [`MasterError`] the master raised; anything else (connect failure,
//! timeout, undecodable body) is [`StoreError::Rpc`].

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use openapi::master as wire;
use serde::Serialize;

use super::error::{StoreError, StoreResult};
use crate::Secret;
use crate::master::{ClientId, MasterError};

/// Typed calls to one master.
#[derive(Clone)]
pub(crate) struct MasterRpc {
    http: Client<HttpConnector, Full<Bytes>>,
    base: String,
    timeout: Duration,
    /// `Bearer <key>` when the master wants its admin key (marked sensitive).
    auth: Option<HeaderValue>,
}

impl std::fmt::Debug for MasterRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterRpc")
            .field("base", &self.base)
            .finish()
    }
}

/// Appends `s` to `out` percent-encoded as one path segment (everything but RFC 3986's
/// unreserved characters is escaped, so `/`, `?`, `%` and spaces survive the trip).
pub(crate) fn push_segment(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
}

/// A body that is empty or JSON; `()` decodes from an empty (204) answer.
pub(crate) trait Answer: Sized {
    fn decode(body: &[u8]) -> Result<Self, String>;
}

impl Answer for () {
    fn decode(_: &[u8]) -> Result<Self, String> {
        Ok(())
    }
}

macro_rules! json_answers {
    ($($t:ty),* $(,)?) => {$(
        impl Answer for $t {
            fn decode(body: &[u8]) -> Result<Self, String> {
                serde_json::from_slice(body).map_err(|e| e.to_string())
            }
        }
    )*};
}

json_answers!(
    wire::Segment,
    wire::Client,
    wire::PingResponse,
    wire::PutStartResponse,
    wire::ReplicasResponse,
    wire::ExistsResponse,
    wire::RemovedResponse,
    wire::BatchPutStartResponse,
    wire::BatchKeyResponse,
    wire::BatchReplicasResponse,
    wire::BatchExistsResponse,
);

impl MasterRpc {
    /// A client of the master at `base` (`http://host:port`, optionally with a path prefix),
    /// sending `api_key` (the master's admin key) with every request when given.
    pub(crate) fn new(
        base: &str,
        timeout: Duration,
        api_key: Option<&Secret>,
    ) -> StoreResult<Self> {
        let auth = api_key
            .map(|k| {
                let mut v =
                    HeaderValue::try_from(format!("Bearer {}", k.expose())).map_err(|_| {
                        StoreError::InvalidArgument(
                            "master_api_key is not a valid header value".into(),
                        )
                    })?;
                v.set_sensitive(true);
                Ok::<_, StoreError>(v)
            })
            .transpose()?;
        let base = base.trim_end_matches('/').to_owned();
        let uri: http::Uri = base
            .parse()
            .map_err(|e| StoreError::InvalidArgument(format!("master URL {base:?}: {e}")))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(StoreError::InvalidArgument(format!(
                "master URL {base:?} must be http://host:port"
            )));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(64)
            .build(connector);
        Ok(Self {
            http,
            base,
            timeout,
            auth,
        })
    }

    /// The master's base URL.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    fn fail(&self, reason: impl std::fmt::Display) -> StoreError {
        StoreError::Rpc {
            url: self.base.clone(),
            reason: reason.to_string(),
        }
    }

    fn url(&self, parts: &[&str], encoded: &[&str]) -> String {
        let mut u = String::with_capacity(self.base.len() + 96);
        u.push_str(&self.base);
        let mut enc = encoded.iter();
        for p in parts {
            u.push_str(p);
            if let Some(s) = enc.next() {
                push_segment(&mut u, s);
            }
        }
        u
    }

    async fn send<T: Answer>(
        &self,
        method: Method,
        uri: String,
        body: Option<Vec<u8>>,
    ) -> StoreResult<T> {
        let mut req = Request::builder().method(method).uri(uri);
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(auth) = &self.auth {
            req = req.header(header::AUTHORIZATION, auth.clone());
        }
        let req = req
            .body(Full::new(body.map(Bytes::from).unwrap_or_default()))
            .map_err(|e| self.fail(e))?;
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| self.fail(e))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| self.fail(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok::<_, StoreError>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| self.fail(format!("no answer within {:?}", self.timeout)))??;
        if status.is_success() {
            return T::decode(&body).map_err(|e| self.fail(format!("bad answer ({status}): {e}")));
        }
        Err(self.refusal(status, &body))
    }

    fn refusal(&self, status: StatusCode, body: &[u8]) -> StoreError {
        match serde_json::from_slice::<wire::MasterErrorResponse>(body) {
            Ok(r) => StoreError::Master(MasterError::from_wire(&r.error.kind, &r.error.message)),
            Err(_) => self.fail(format!(
                "status {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(256)])
            )),
        }
    }

    async fn post<T: Answer>(&self, uri: String, body: &impl Serialize) -> StoreResult<T> {
        let json = serde_json::to_vec(body).map_err(|e| self.fail(e))?;
        self.send(Method::POST, uri, Some(json)).await
    }

    // --- clients and segments ---------------------------------------------------------

    pub(crate) async fn mount(
        &self,
        client: ClientId,
        spec: &wire::SegmentSpec,
    ) -> StoreResult<wire::Segment> {
        let id = client.to_string();
        self.post(self.url(&["/api/v1/clients/", "/segments"], &[&id]), spec)
            .await
    }

    pub(crate) async fn remount(
        &self,
        client: ClientId,
        specs: &[wire::SegmentSpec],
    ) -> StoreResult<wire::Client> {
        let body = wire::RemountRequest {
            segments: specs.to_vec(),
        };
        let id = client.to_string();
        self.post(self.url(&["/api/v1/clients/", "/remount"], &[&id]), &body)
            .await
    }

    pub(crate) async fn ping(&self, client: ClientId) -> StoreResult<wire::PingResponse> {
        let id = client.to_string();
        self.send(
            Method::POST,
            self.url(&["/api/v1/clients/", "/ping"], &[&id]),
            None,
        )
        .await
    }

    pub(crate) async fn remove_client(&self, client: ClientId) -> StoreResult<()> {
        let id = client.to_string();
        self.send(
            Method::DELETE,
            self.url(&["/api/v1/clients/"], &[&id]),
            None,
        )
        .await
    }

    // --- objects ------------------------------------------------------------------------

    pub(crate) async fn put_start(
        &self,
        key: &str,
        body: &wire::PutStartRequest,
    ) -> StoreResult<wire::PutStartResponse> {
        self.post(self.url(&["/api/v1/objects/", "/put-start"], &[key]), body)
            .await
    }

    pub(crate) async fn put_end(&self, key: &str, body: &wire::ClientRequest) -> StoreResult<()> {
        self.post(self.url(&["/api/v1/objects/", "/put-end"], &[key]), body)
            .await
    }

    pub(crate) async fn put_revoke(
        &self,
        key: &str,
        body: &wire::ClientRequest,
    ) -> StoreResult<()> {
        self.post(self.url(&["/api/v1/objects/", "/put-revoke"], &[key]), body)
            .await
    }

    pub(crate) async fn replicas(&self, key: &str) -> StoreResult<wire::ReplicasResponse> {
        self.send(
            Method::GET,
            self.url(&["/api/v1/objects/", "/replicas"], &[key]),
            None,
        )
        .await
    }

    pub(crate) async fn exists(&self, key: &str) -> StoreResult<wire::ExistsResponse> {
        self.send(
            Method::GET,
            self.url(&["/api/v1/objects/", "/exists"], &[key]),
            None,
        )
        .await
    }

    pub(crate) async fn remove(
        &self,
        key: &str,
        force: bool,
    ) -> StoreResult<wire::RemovedResponse> {
        let q = if force { "?force=true" } else { "" };
        self.send(
            Method::DELETE,
            self.url(&["/api/v1/objects/", q], &[key]),
            None,
        )
        .await
    }

    pub(crate) async fn remove_all(&self) -> StoreResult<wire::RemovedResponse> {
        self.send(
            Method::DELETE,
            self.url(&["/api/v1/objects?all=true"], &[]),
            None,
        )
        .await
    }

    // --- batches: one request each ----------------------------------------------------

    pub(crate) async fn batch_put_start(
        &self,
        body: &wire::BatchPutStartRequest,
    ) -> StoreResult<wire::BatchPutStartResponse> {
        self.post(self.url(&["/api/v1/batch/put-start"], &[]), body)
            .await
    }

    pub(crate) async fn batch_put_end(
        &self,
        body: &wire::BatchClientKeysRequest,
    ) -> StoreResult<wire::BatchKeyResponse> {
        self.post(self.url(&["/api/v1/batch/put-end"], &[]), body)
            .await
    }

    pub(crate) async fn batch_put_revoke(
        &self,
        body: &wire::BatchClientKeysRequest,
    ) -> StoreResult<wire::BatchKeyResponse> {
        self.post(self.url(&["/api/v1/batch/put-revoke"], &[]), body)
            .await
    }

    pub(crate) async fn batch_replicas(
        &self,
        body: &wire::BatchKeysRequest,
    ) -> StoreResult<wire::BatchReplicasResponse> {
        self.post(self.url(&["/api/v1/batch/replicas"], &[]), body)
            .await
    }

    pub(crate) async fn batch_exists(
        &self,
        body: &wire::BatchKeysRequest,
    ) -> StoreResult<wire::BatchExistsResponse> {
        self.post(self.url(&["/api/v1/batch/exists"], &[]), body)
            .await
    }

    pub(crate) async fn batch_remove(
        &self,
        body: &wire::BatchRemoveRequest,
    ) -> StoreResult<wire::BatchKeyResponse> {
        self.post(self.url(&["/api/v1/batch/remove"], &[]), body)
            .await
    }
}

/// The error of one batch item, as the master reported it.
pub(crate) fn item_error(e: wire::MasterErrorDetail) -> StoreError {
    StoreError::Master(MasterError::from_wire(&e.kind, &e.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_escaped_as_one_path_segment() {
        let mut s = String::new();
        push_segment(&mut s, "a/b c?d%e_f-g.h~i");
        assert_eq!(s, "a%2Fb%20c%3Fd%25e_f-g.h~i");
        let mut u = String::new();
        push_segment(&mut u, "ключ");
        assert_eq!(u, "%D0%BA%D0%BB%D1%8E%D1%87");
    }

    #[test]
    fn master_urls_are_checked() {
        assert!(MasterRpc::new("http://127.0.0.1:1", Duration::from_secs(1), None).is_ok());
        assert!(MasterRpc::new("https://m:1", Duration::from_secs(1), None).is_err());
        assert!(MasterRpc::new("not a url", Duration::from_secs(1), None).is_err());
        let r = MasterRpc::new("http://m:1/prefix/", Duration::from_secs(1), None).unwrap();
        assert_eq!(
            r.url(&["/api/v1/objects/", "/replicas"], &["k/1"]),
            "http://m:1/prefix/api/v1/objects/k%2F1/replicas"
        );
    }

    #[test]
    fn the_api_key_must_fit_in_a_header() {
        let key =
            |k: &str| MasterRpc::new("http://m:1", Duration::from_secs(1), Some(&Secret::new(k)));
        let ok = key("k-1").unwrap();
        let auth = ok.auth.as_ref().unwrap();
        assert!(auth.is_sensitive() && auth == "Bearer k-1");
        assert!(key("bad\nkey").is_err());
        assert!(!format!("{ok:?}").contains("k-1"));
    }
}
