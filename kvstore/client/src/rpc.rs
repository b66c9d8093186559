//! The client's side of the master's REST API: one typed call per route, over a pooled
//! keep-alive HTTP/1.1 client with `TCP_NODELAY` (small requests must not wait for Nagle),
//! plain to an `http://` master, TLS to an `https://` one (the system's roots plus the
//! client's `master_ca_cert`).
//!
//! Every call is one request. A 2xx answer is decoded into its wire type; an error answer
//! is decoded into the [`MasterError`] the master raised; anything else (connect failure,
//! TLS failure, timeout, undecodable body) is [`StoreError::Rpc`]. A call polls for its
//! answer for up to `rpc_busy_poll_us` before it sleeps ([`transfer::busy_poll`]).
//!
//! In a process that exports traces, each call is a client span named by its route's
//! operation id and carries its `traceparent`, which the master continues.
//!
//! Every call carries the store key (`Authorization: Bearer`), but for the admin plane's
//! ([`MasterRpc::remove_all`]), which carries the admin key when one is configured. Keys go
//! to the configured master URLs only: hyper's client follows no redirect, and this one
//! follows an HA follower's `307` only to a master on its own list.
//!
//! # Several masters (HA)
//! The master URL may be a comma-separated list of the masters of one HA cluster. Calls go
//! to the one that answered last; a master that cannot be reached, answers `503
//! UNAVAILABLE` (no leader yet, or a change not committed in time) or redirects to the
//! leader makes the call move on (the next on the list, or the redirect's target) until it
//! is answered or the call's timeout passes. With one URL nothing is retried.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use openapi::master as wire;
use openapi::routes::master as route;
use openapi::routes::{Endpoint, Plane};
use serde::Serialize;
use tracing::Instrument;

use super::caller::LocalClients;
use super::error::{StoreError, StoreResult};
use openapi::master::MasterError;
use transfer::busy_poll::{self, Adaptive};
use trust::Secret;
use uuid::Uuid as ClientId;

/// The pooled HTTP/1.1 client master calls go through.
type Http = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A pool of keep-alive connections to the masters through `connector`.
fn http_client(connector: HttpsConnector<HttpConnector>) -> Http {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(64)
        .build(connector)
}

/// Typed calls to a master (or to the leader of an HA cluster's masters).
#[derive(Clone)]
pub(crate) struct MasterRpc {
    http: Http,
    /// What `http` connects with, for the per-thread clients of caller-driven calls.
    connector: HttpsConnector<HttpConnector>,
    /// The clients of threads whose calls are [`super::caller_driven`].
    local: LocalClients<Http>,
    /// Every master's base URL (one without HA).
    bases: Arc<[String]>,
    /// Index in `bases` of the master calls go to.
    current: Arc<AtomicUsize>,
    timeout: Duration,
    /// `Bearer <store key>` (marked sensitive).
    store_auth: HeaderValue,
    /// `Bearer <admin key>` when one is configured (marked sensitive).
    admin_auth: Option<HeaderValue>,
    /// How long a call polls for its answer before sleeping ([`busy_poll`]).
    busy_poll: Duration,
    /// Whether polling pays, shared by every call.
    spin: Arc<Adaptive>,
}

impl std::fmt::Debug for MasterRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterRpc")
            .field("bases", &self.bases)
            .finish()
    }
}

/// The master URL `base` without its trailing `/`, checked: `http://` or `https://` with a
/// host.
pub(crate) fn master_url(base: &str) -> StoreResult<String> {
    let base = base.trim_end_matches('/').to_owned();
    let uri: http::Uri = base
        .parse()
        .map_err(|e| StoreError::InvalidArgument(format!("master URL {base:?}: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(StoreError::InvalidArgument(format!(
            "master URL {base:?} must be http://host:port or https://host:port"
        )));
    }
    Ok(base)
}

/// Every master URL of a comma-separated list, checked (at least one).
pub(crate) fn master_urls(list: &str) -> StoreResult<Vec<String>> {
    let urls: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(master_url)
        .collect::<StoreResult<_>>()?;
    if urls.is_empty() {
        return Err(StoreError::InvalidArgument("no master URL given".into()));
    }
    Ok(urls)
}

/// `Bearer <key>`, marked sensitive, or an error naming the setting.
fn bearer(name: &str, key: &Secret) -> StoreResult<HeaderValue> {
    let mut v = HeaderValue::try_from(format!("Bearer {}", key.expose()))
        .map_err(|_| StoreError::InvalidArgument(format!("{name} is not a valid header value")))?;
    v.set_sensitive(true);
    Ok(v)
}

tokio::task_local! {
    /// The trace a caller outside `tracing` runs its calls in (see [`traced_by`]).
    static CALLER_TRACE: otlp::SpanContext;
}

/// Runs `fut` with `caller` (when given) as the parent of its master calls: each carries
/// `caller`'s `traceparent` unless a span of this process that is exported encloses it.
/// For callers whose tracing is their own, such as a Python process with OpenTelemetry
/// (the wheel reads its current span), so that the master's spans join their trace.
pub async fn traced_by<F: Future>(caller: Option<otlp::SpanContext>, fut: F) -> F::Output {
    match caller {
        Some(cx) => CALLER_TRACE.scope(cx, fut).await,
        None => fut.await,
    }
}

/// Writes a W3C `traceparent` into `headers`: the current span's when it is exported,
/// else the caller's ([`traced_by`]); nothing otherwise. The master continues the trace.
fn traceparent(headers: &mut http::HeaderMap) {
    let span = tracing::Span::current();
    let cx = match span.is_disabled() {
        true => None,
        false => otlp::span_context(&span),
    };
    if let Some(cx) = cx.or_else(|| CALLER_TRACE.try_with(|c| *c).ok())
        && let Ok(v) = http::HeaderValue::from_bytes(cx.traceparent().as_bytes())
    {
        headers.insert("traceparent", v);
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
    wire::BatchPutCommitResponse,
    wire::BatchKeyResponse,
    wire::BatchReplicasResponse,
    wire::BatchExistsResponse,
    wire::ReplicaClearResponse,
    wire::TierTasks,
);

impl MasterRpc {
    /// A client of the master at `base` (`http(s)://host:port`, optionally with a path
    /// prefix) sending `store_key` with every call and `admin_key` instead with the admin
    /// plane's, trusting `ca_cert` for an `https://` master on top of the system's roots.
    pub(crate) fn new(
        base: &str,
        timeout: Duration,
        store_key: &Secret,
        admin_key: Option<&Secret>,
        ca_cert: Option<&Path>,
    ) -> StoreResult<Self> {
        let bases = master_urls(base)?;
        let store_auth = bearer("store_api_key", store_key)?;
        let admin_auth = admin_key.map(|k| bearer("admin_api_key", k)).transpose()?;
        let roots = trust::tls::trust_roots(ca_cert)
            .map_err(|e| StoreError::InvalidArgument(format!("master_ca_cert: {e}")))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let connector = trust::tls::https_or_http(connector, trust::tls::client_config(roots));
        Ok(Self {
            http: http_client(connector.clone()),
            connector,
            local: LocalClients::default(),
            bases: bases.into(),
            current: Arc::new(AtomicUsize::new(0)),
            timeout,
            store_auth,
            admin_auth,
            busy_poll: Duration::from_micros(busy_poll::DEFAULT_BUSY_POLL_US),
            spin: Arc::default(),
        })
    }

    /// These calls poll for their answers for up to `window` (zero: they sleep at once).
    pub(crate) fn with_busy_poll(mut self, window: Duration) -> Self {
        self.busy_poll = window;
        self
    }

    /// The base URL of the master calls go to now.
    pub(crate) fn base(&self) -> &str {
        &self.bases[self.current.load(Ordering::Relaxed) % self.bases.len()]
    }

    /// Index in the master list of the master calls go to now.
    pub(crate) fn current_index(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.bases.len()
    }

    /// Every master's base URL.
    pub(crate) fn bases(&self) -> &[String] {
        &self.bases
    }

    fn fail(&self, reason: impl std::fmt::Display) -> StoreError {
        StoreError::Rpc {
            url: self.base().to_owned(),
            reason: reason.to_string(),
        }
    }

    /// A request that got no answer: the whole cause chain (a TLS refusal is only in the
    /// innermost cause), with a hint when the master's certificate did not verify.
    fn unreachable(&self, e: &hyper_util::client::legacy::Error) -> StoreError {
        let mut why = trust::tls::describe(e);
        if why.contains("certificate") {
            why.push_str(
                " (the master's certificate must verify against the system's roots or \
                 --master-ca-cert)",
            );
        }
        self.fail(why)
    }

    /// The path (and query) of a call of `E`: its declared path with `params` filled in,
    /// then `query` as a query string; [`MasterRpc::send_on`] puts the master's base before it.
    fn path<E: Endpoint>(params: &[&str], query: Option<&E::Query>) -> Result<String, String>
    where
        E::Query: Serialize,
    {
        let mut u = String::with_capacity(96);
        E::ROUTE.fill(&mut u, params);
        if let Some(q) = query {
            let q = serde_urlencoded::to_string(q).map_err(|e| e.to_string())?;
            if !q.is_empty() {
                u.push('?');
                u.push_str(&q);
            }
        }
        Ok(u)
    }

    /// One call of the declared route `E`: its method, its plane's key, its path with
    /// `params` and `query`, `body` as JSON; the answer decoded as `E`'s.
    async fn call<E: Endpoint>(
        &self,
        params: &[&str],
        query: Option<&E::Query>,
        body: Option<&E::Body>,
    ) -> StoreResult<E::Response>
    where
        E::Query: Serialize,
        E::Body: Serialize,
        E::Response: Answer,
    {
        let path = Self::path::<E>(params, query).map_err(|e| self.fail(e))?;
        let body = match body {
            Some(b) => Some(serde_json::to_vec(b).map_err(|e| self.fail(e))?),
            None => None,
        };
        let method = match E::ROUTE.method {
            openapi::routes::Method::Get => Method::GET,
            openapi::routes::Method::Post => Method::POST,
            openapi::routes::Method::Put => Method::PUT,
            openapi::routes::Method::Patch => Method::PATCH,
            openapi::routes::Method::Delete => Method::DELETE,
        };
        // A client span per call, for a process that exports traces (TRACE: no other
        // layer wants it; otherwise a disabled callsite's check).
        let span = tracing::trace_span!(
            target: "kvclient::rpc",
            "master call",
            otel.name = E::ROUTE.operation_id,
            otel.kind = "client",
        );
        self.send_on(E::ROUTE.plane, method, path, body)
            .instrument(span)
            .await
    }

    async fn send_on<T: Answer>(
        &self,
        plane: Plane,
        method: Method,
        path: String,
        body: Option<Vec<u8>>,
    ) -> StoreResult<T> {
        let body = body.map(Bytes::from);
        let ha = self.bases.len() > 1;
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut moves = 0usize;
        // A master that stopped answering (frozen, partitioned) may take one attempt's
        // share of the timeout, not the whole call's.
        let attempt = if ha { self.timeout / 2 } else { self.timeout };
        loop {
            let at = self.current.load(Ordering::Relaxed) % self.bases.len();
            let until = deadline.min(tokio::time::Instant::now() + attempt);
            let sent = self
                .exchange(plane, &method, &self.bases[at], &path, body.clone(), until)
                .await;
            // Where to go next, if this master did not answer the call.
            let next = match &sent {
                _ if !ha => None,
                Err(_) => Some((at + 1) % self.bases.len()),
                Ok((status, headers, _)) if *status == StatusCode::TEMPORARY_REDIRECT => {
                    let location = headers
                        .get(header::LOCATION)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default();
                    let known = self
                        .bases
                        .iter()
                        .position(|b| location.starts_with(b.as_str()));
                    if known.is_none() {
                        return Err(self.fail(format!(
                            "redirected to {location:?}, which is not on this client's master \
                             list (keys go to listed masters only)"
                        )));
                    }
                    known
                }
                Ok((status, _, _)) if *status == StatusCode::SERVICE_UNAVAILABLE => {
                    Some((at + 1) % self.bases.len())
                }
                Ok(_) => None,
            };
            if let Some(to) = next {
                // The next call starts there too, even when this one has no time left.
                let _ = self
                    .current
                    .compare_exchange(at, to, Ordering::Relaxed, Ordering::Relaxed);
            }
            match next {
                Some(_) if tokio::time::Instant::now() < deadline => {
                    moves += 1;
                    // A full round without an answer: the cluster is between leaders.
                    if moves.is_multiple_of(self.bases.len()) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
                _ => {}
            }
            let (status, _, body) = sent?;
            if status.is_success() {
                return T::decode(&body)
                    .map_err(|e| self.fail(format!("bad answer ({status}): {e}")));
            }
            return Err(self.refusal(status, &body));
        }
    }

    /// One request to the master at `base`, answered before `deadline`.
    async fn exchange(
        &self,
        plane: Plane,
        method: &Method,
        base: &str,
        path: &str,
        body: Option<Bytes>,
        deadline: tokio::time::Instant,
    ) -> StoreResult<(StatusCode, http::HeaderMap, Bytes)> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(format!("{base}{path}"));
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        req = req.header(header::AUTHORIZATION, self.auth(plane).clone());
        if let Some(headers) = req.headers_mut() {
            traceparent(headers);
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| self.fail(e))?;
        let exchange = async {
            let http = self
                .local
                .pick(&self.http, || http_client(self.connector.clone()));
            let resp = http.request(req).await.map_err(|e| self.unreachable(&e))?;
            let (parts, body) = resp.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| self.fail(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok::<_, StoreError>((parts.status, parts.headers, body))
        };
        tokio::time::timeout_at(
            deadline,
            busy_poll::spin(exchange, self.busy_poll, &self.spin),
        )
        .await
        .map_err(|_| self.fail(format!("no answer within {:?}", self.timeout)))?
    }

    /// How many threads hold their own client (for tests).
    #[cfg(test)]
    pub(crate) fn local_threads(&self) -> usize {
        self.local.threads()
    }

    /// The `Authorization` value a call of `plane` carries.
    fn auth(&self, plane: Plane) -> &HeaderValue {
        match (plane, &self.admin_auth) {
            (Plane::Admin, Some(admin)) => admin,
            _ => &self.store_auth,
        }
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

    // --- clients and segments ---------------------------------------------------------

    pub(crate) async fn mount(
        &self,
        client: ClientId,
        spec: &wire::SegmentSpec,
    ) -> StoreResult<wire::Segment> {
        let id = client.to_string();
        self.call::<route::MountSegment>(&[&id], None, Some(spec))
            .await
    }

    /// The disk tier's exchange for `segment` (see `crate::tier`).
    pub(crate) async fn tier_exchange(
        &self,
        segment: &str,
        body: &wire::TierExchange,
    ) -> StoreResult<wire::TierTasks> {
        self.call::<route::TierExchangeRoute>(&[segment], None, Some(body))
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
        self.call::<route::Remount>(&[&id], None, Some(&body)).await
    }

    pub(crate) async fn ping(&self, client: ClientId) -> StoreResult<wire::PingResponse> {
        let id = client.to_string();
        self.call::<route::Ping>(&[&id], None, None).await
    }

    pub(crate) async fn remove_client(&self, client: ClientId) -> StoreResult<()> {
        let id = client.to_string();
        self.call::<route::RemoveClient>(&[&id], None, None).await
    }

    // --- objects ------------------------------------------------------------------------

    pub(crate) async fn put_start(
        &self,
        key: &str,
        body: &wire::PutStartRequest,
    ) -> StoreResult<wire::PutStartResponse> {
        self.call::<route::PutStart>(&[key], None, Some(body)).await
    }

    pub(crate) async fn put_end(&self, key: &str, body: &wire::ClientRequest) -> StoreResult<()> {
        self.call::<route::PutEnd>(&[key], None, Some(body)).await
    }

    pub(crate) async fn put_revoke(
        &self,
        key: &str,
        body: &wire::ClientRequest,
    ) -> StoreResult<()> {
        self.call::<route::PutRevoke>(&[key], None, Some(body))
            .await
    }

    /// `reader`: this client's id, when its own disk tier may hold the value.
    pub(crate) async fn replicas(
        &self,
        key: &str,
        reader: Option<&wire::ReplicasQuery>,
    ) -> StoreResult<wire::ReplicasResponse> {
        self.call::<route::GetReplicas>(&[key], reader, None).await
    }

    pub(crate) async fn exists(&self, key: &str) -> StoreResult<wire::ExistsResponse> {
        self.call::<route::Exists>(&[key], None, None).await
    }

    pub(crate) async fn remove(
        &self,
        key: &str,
        force: bool,
    ) -> StoreResult<wire::RemovedResponse> {
        let query = wire::RemoveQuery {
            force: force.then_some(true),
        };
        self.call::<route::Remove>(&[key], Some(&query), None).await
    }

    pub(crate) async fn remove_all(&self) -> StoreResult<wire::RemovedResponse> {
        let query = wire::DeleteObjectsQuery {
            all: Some(true),
            regex: None,
        };
        self.call::<route::RemoveObjects>(&[], Some(&query), None)
            .await
    }

    pub(crate) async fn remove_by_regex(&self, regex: &str) -> StoreResult<wire::RemovedResponse> {
        let query = wire::DeleteObjectsQuery {
            all: None,
            regex: Some(regex.to_owned()),
        };
        self.call::<route::RemoveObjects>(&[], Some(&query), None)
            .await
    }

    // --- batches: one request each ----------------------------------------------------

    pub(crate) async fn batch_put_start(
        &self,
        body: &wire::BatchPutStartRequest,
    ) -> StoreResult<wire::BatchPutStartResponse> {
        self.call::<route::BatchPutStart>(&[], None, Some(body))
            .await
    }

    pub(crate) async fn batch_put_end(
        &self,
        body: &wire::BatchClientKeysRequest,
    ) -> StoreResult<wire::BatchKeyResponse> {
        self.call::<route::BatchPutEnd>(&[], None, Some(body)).await
    }

    pub(crate) async fn batch_put_commit(
        &self,
        body: &wire::BatchPutCommitRequest,
    ) -> StoreResult<wire::BatchPutCommitResponse> {
        self.call::<route::BatchPutCommit>(&[], None, Some(body))
            .await
    }

    pub(crate) async fn batch_put_revoke(
        &self,
        body: &wire::BatchClientKeysRequest,
    ) -> StoreResult<wire::BatchKeyResponse> {
        self.call::<route::BatchPutRevoke>(&[], None, Some(body))
            .await
    }

    pub(crate) async fn batch_replicas(
        &self,
        body: &wire::BatchKeysRequest,
        reader: Option<&wire::ReplicasQuery>,
    ) -> StoreResult<wire::BatchReplicasResponse> {
        self.call::<route::BatchGetReplicas>(&[], reader, Some(body))
            .await
    }

    pub(crate) async fn detach_disk(
        &self,
        segment: &str,
        body: &wire::ClientRequest,
    ) -> StoreResult<wire::RemovedResponse> {
        self.call::<route::DetachDisk>(&[segment], None, Some(body))
            .await
    }

    pub(crate) async fn release_reads(&self, body: &wire::BatchKeysRequest) -> StoreResult<()> {
        self.call::<route::BatchReleaseReads>(&[], None, Some(body))
            .await
    }

    pub(crate) async fn replica_descs(
        &self,
        body: &wire::BatchKeysRequest,
    ) -> StoreResult<wire::BatchReplicasResponse> {
        self.call::<route::BatchReplicaDescs>(&[], None, Some(body))
            .await
    }

    pub(crate) async fn batch_exists(
        &self,
        body: &wire::BatchKeysRequest,
    ) -> StoreResult<wire::BatchExistsResponse> {
        self.call::<route::BatchExists>(&[], None, Some(body)).await
    }

    pub(crate) async fn batch_remove(
        &self,
        body: &wire::BatchRemoveRequest,
    ) -> StoreResult<wire::BatchKeyResponse> {
        self.call::<route::BatchRemove>(&[], None, Some(body)).await
    }

    pub(crate) async fn batch_replica_clear(
        &self,
        body: &wire::ReplicaClearRequest,
    ) -> StoreResult<wire::ReplicaClearResponse> {
        self.call::<route::BatchReplicaClear>(&[], None, Some(body))
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
    fn calls_are_the_declared_paths_with_keys_as_one_segment_and_typed_queries() {
        let p = MasterRpc::path::<route::GetReplicas>(&["a/b c?d%e"], None).unwrap();
        assert_eq!(p, "/api/v1/objects/a%2Fb%20c%3Fd%25e/replicas");
        let p = MasterRpc::path::<route::PutStart>(&["ключ"], None).unwrap();
        assert_eq!(p, "/api/v1/objects/%D0%BA%D0%BB%D1%8E%D1%87/put-start");
        let force = wire::RemoveQuery { force: Some(true) };
        let p = MasterRpc::path::<route::Remove>(&["k"], Some(&force)).unwrap();
        assert_eq!(p, "/api/v1/objects/k?force=true");
        let none = wire::RemoveQuery { force: None };
        let p = MasterRpc::path::<route::Remove>(&["k"], Some(&none)).unwrap();
        assert_eq!(p, "/api/v1/objects/k");
        let regex = wire::DeleteObjectsQuery {
            all: None,
            regex: Some("^a b&c".into()),
        };
        let p = MasterRpc::path::<route::RemoveObjects>(&[], Some(&regex)).unwrap();
        assert_eq!(p, "/api/v1/objects?regex=%5Ea+b%26c");
    }

    fn rpc(base: &str, store: &str, admin: Option<&str>) -> StoreResult<MasterRpc> {
        let admin = admin.map(Secret::new);
        MasterRpc::new(
            base,
            Duration::from_secs(1),
            &Secret::new(store),
            admin.as_ref(),
            None,
        )
    }

    #[test]
    fn master_urls_are_checked() {
        assert!(rpc("http://127.0.0.1:1", "k", None).is_ok());
        assert!(rpc("https://m:1", "k", None).is_ok());
        assert!(rpc("ftp://m:1", "k", None).is_err());
        assert!(rpc("not a url", "k", None).is_err());
        let r = rpc("http://m:1/prefix/", "k", None).unwrap();
        assert_eq!(r.base(), "http://m:1/prefix");
        // An HA cluster: every master, checked; calls start at the first.
        let ha = rpc(" http://a:1, https://b:2/ ,", "k", None).unwrap();
        assert_eq!(ha.bases(), ["http://a:1", "https://b:2"]);
        assert_eq!(ha.base(), "http://a:1");
        assert!(rpc("http://a:1,ftp://b:2", "k", None).is_err());
        assert!(rpc(" , ", "k", None).is_err());
    }

    #[test]
    fn each_plane_carries_its_key_which_must_fit_in_a_header() {
        let both = rpc("http://m:1", "store-1", Some("admin-1")).unwrap();
        let (store, admin) = (both.auth(Plane::Store), both.auth(Plane::Admin));
        assert!(store.is_sensitive() && store == "Bearer store-1");
        assert!(admin.is_sensitive() && admin == "Bearer admin-1");
        let store_only = rpc("http://m:1", "store-1", None).unwrap();
        assert_eq!(store_only.auth(Plane::Admin), "Bearer store-1");
        assert!(rpc("http://m:1", "bad\nkey", None).is_err());
        assert!(rpc("http://m:1", "k", Some("bad\nkey")).is_err());
        let shown = format!("{both:?}");
        assert!(!shown.contains("store-1") && !shown.contains("admin-1"));
    }

    #[test]
    fn an_unreadable_ca_file_is_named() {
        let e = MasterRpc::new(
            "https://m:1",
            Duration::from_secs(1),
            &Secret::new("k"),
            None,
            Some(Path::new("/nonexistent/ca.pem")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("master_ca_cert") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
    }
}
