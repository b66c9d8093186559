//! Moongate integration tests and the in-process cluster harness.
//!
//! Everything listens on `127.0.0.1:0` and is driven over real sockets.
//!
//! # Layout
//! - [`start_gateway`]: a real `moongate serve` (the library behind it) on a free port;
//!   [`start_regular_gateway`] and [`start_pd_gateway`] in front of given workers.
//! - [`Backend`]: a scripted SGLang-shaped HTTP backend that records what reaches it
//!   byte for byte and can be made slow, unhealthy or dead (for the fault tests that a
//!   well-behaved simulated worker cannot play).
//! - [`fast_config`]: a gateway configuration with short health intervals for tests.
//! - [`tls`]: a TLS front that makes any backend an `https://` worker (test certificates
//!   in `tests/fixtures/tls`).
//! - [`attack`]: a hostile host against a transfer port (raw frames, a blind handshake).
//! - [`store_sims`]: simulated workers with HiCache's L3 on a Moongate store.
//! - `browser` (feature `browser`): headless Chromium, the DOM after a page's scripts ran,
//!   screenshots.
//!
//! The tests themselves live in `tests/tests/*.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, get};
use bytes::Bytes;
use gateway::config::ServeConfig;
use gateway::launch::Gateway;
use http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub mod attack;
#[cfg(feature = "browser")]
pub mod browser;
pub mod otlp;
pub mod store_sims;
pub mod tls;

pub use otlp::collector as otlp_collector;

/// A gateway configuration suited to tests: loopback, port 0, fast health checks.
pub fn fast_config() -> ServeConfig {
    ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        health_check_interval_secs: 1,
        health_check_pending_interval_ms: 50,
        health_check_timeout_secs: 1,
        health_failure_threshold: 2,
        health_success_threshold: 1,
        shutdown_grace_period_secs: 2,
        ..ServeConfig::default()
    }
}

/// Starts a gateway on `127.0.0.1:0`.
pub async fn start_gateway(cfg: ServeConfig) -> Gateway {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind gateway");
    gateway::launch::spawn(cfg, listener)
        .await
        .expect("start gateway")
}

/// Starts a PD gateway in front of `prefill` (URL, bootstrap port) and `decode` URLs, with
/// [`fast_config`] changed by `tweak`.
pub async fn start_pd_gateway(
    prefill: &[(&str, Option<u16>)],
    decode: &[&str],
    tweak: impl FnOnce(&mut ServeConfig),
) -> Gateway {
    let mut cfg = ServeConfig {
        pd_disaggregation: true,
        prefill: prefill
            .iter()
            .map(|(u, p)| vec![u.to_string(), p.map_or("none".into(), |p| p.to_string())])
            .collect(),
        decode: decode.iter().map(|s| s.to_string()).collect(),
        ..fast_config()
    };
    tweak(&mut cfg);
    cfg.validate().expect("valid PD config");
    start_gateway(cfg).await
}

/// Two scripted prefills (`p1`, `p2`, bootstrap port 8998) and a decode behind a ready PD
/// gateway configured by `tweak`.
pub async fn start_two_prefill_pd(
    tweak: impl FnOnce(&mut ServeConfig),
) -> (Backend, Backend, Backend, Gateway) {
    let p1 = Backend::start("p1", "m").await;
    let p2 = Backend::start("p2", "m").await;
    let d = Backend::start("decode", "m").await;
    let gw = start_pd_gateway(
        &[(&p1.url(), Some(8998)), (&p2.url(), Some(8998))],
        &[&d.url()],
        tweak,
    )
    .await;
    eventually("workers ready", || gw.state().registry().counts().0 == 3).await;
    (p1, p2, d, gw)
}

/// Starts a regular gateway in front of `workers` (static `--worker-urls`), with
/// [`fast_config`] changed by `tweak`, and waits until they are all ready.
pub async fn start_regular_gateway(
    workers: &[&Backend],
    tweak: impl FnOnce(&mut ServeConfig),
) -> Gateway {
    let mut cfg = ServeConfig {
        worker_urls: workers.iter().map(|b| b.url()).collect(),
        ..fast_config()
    };
    tweak(&mut cfg);
    cfg.validate().expect("valid config");
    let gw = start_gateway(cfg).await;
    let n = workers.len();
    eventually("workers ready", || gw.state().registry().counts().0 == n).await;
    gw
}

/// Polls `cond` every 20 ms for up to 5 s.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..250 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// A request as the backend received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Path and query.
    pub path: String,
    /// Headers.
    pub headers: HeaderMap,
    /// Body bytes.
    pub body: Bytes,
}

/// What a [`Backend`] does; change it any time through [`Backend::knobs`].
#[derive(Debug)]
pub struct Knobs {
    /// `/health` answers 200 (else 503).
    pub healthy: AtomicBool,
    /// SSE chunks per streamed answer.
    pub chunks: AtomicUsize,
    /// Milliseconds between SSE chunks.
    pub chunk_delay_ms: AtomicUsize,
    /// Milliseconds before the response head.
    pub head_delay_ms: AtomicUsize,
    /// Status of inference answers (non-2xx answers carry `{"error":{"message"}}`).
    pub status: AtomicU16,
    /// A streamed answer breaks (the connection is cut) after this many chunks.
    pub break_after: AtomicUsize,
    /// The `dp_size` its `/get_server_info` reports (0: none, and 503 while
    /// [`Knobs::info_down`]).
    pub dp_size: AtomicUsize,
    /// `/get_server_info` answers 503.
    pub info_down: AtomicBool,
    /// Inference requests wait (after being recorded) until [`Backend::release`].
    held: AtomicBool,
    gate: tokio::sync::Notify,
}

/// A scripted answer: the JSON body of a non-streamed answer, the events of a stream.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    /// The whole answer.
    pub json: Option<serde_json::Value>,
    /// The `data:` events of a streamed answer (`[DONE]` is appended).
    pub events: Option<Vec<serde_json::Value>>,
    /// The content type and body of a non-2xx answer (default: JSON
    /// `{"error":{"message":"scripted <status>"}}`).
    pub error: Option<(String, String)>,
}

struct Shared {
    name: String,
    model: String,
    knobs: Knobs,
    seen: Mutex<Vec<Seen>>,
    probes: Mutex<Vec<(String, HeaderMap)>>,
    reply: Mutex<Reply>,
    in_flight: Arc<AtomicUsize>,
}

/// Counts an inference request in flight until its answer ended or was dropped.
struct Flight(Arc<AtomicUsize>);

impl Flight {
    fn new(c: &Arc<AtomicUsize>) -> Self {
        c.fetch_add(1, Ordering::SeqCst);
        Self(c.clone())
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A scripted backend on a real socket (see the crate doc).
pub struct Backend {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Backend {
    /// Starts a backend named `name` serving `model`.
    pub async fn start(name: &str, model: &str) -> Self {
        let shared = Arc::new(Shared {
            name: name.into(),
            model: model.into(),
            knobs: Knobs {
                healthy: AtomicBool::new(true),
                chunks: AtomicUsize::new(4),
                chunk_delay_ms: AtomicUsize::new(0),
                head_delay_ms: AtomicUsize::new(0),
                status: AtomicU16::new(200),
                break_after: AtomicUsize::new(usize::MAX),
                dp_size: AtomicUsize::new(0),
                info_down: AtomicBool::new(false),
                held: AtomicBool::new(false),
                gate: tokio::sync::Notify::new(),
            },
            seen: Mutex::new(Vec::new()),
            probes: Mutex::new(Vec::new()),
            reply: Mutex::new(Reply::default()),
            in_flight: Arc::new(AtomicUsize::new(0)),
        });
        let app = Router::new()
            .route("/health", get(health))
            .route("/v1/models", get(models))
            .route("/v1/chat/completions", routing::post(infer))
            .route("/v1/completions", routing::post(infer))
            .route("/v1/embeddings", routing::post(infer))
            .route("/v1/rerank", routing::post(infer))
            .route("/v1/classify", routing::post(infer))
            .route("/v1/score", routing::post(infer))
            .route("/v1/tokenize", routing::post(infer))
            .route("/v1/detokenize", routing::post(infer))
            .route("/v1/responses", routing::post(infer))
            .route("/generate", routing::post(infer))
            .route("/get_server_info", get(info))
            .route("/get_model_info", get(info))
            .with_state(shared.clone());
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind backend");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(s.cancelled_owned())
                .await;
        });
        Self { addr, shared, stop }
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The behaviour knobs.
    pub fn knobs(&self) -> &Knobs {
        &self.shared.knobs
    }

    /// Inference requests received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().clone()
    }

    /// The other requests received so far (health probes, model discovery, server info):
    /// path and headers.
    pub fn probes(&self) -> Vec<(String, HeaderMap)> {
        self.shared.probes.lock().clone()
    }

    /// Number of inference requests received.
    pub fn hits(&self) -> usize {
        self.shared.seen.lock().len()
    }

    /// Inference requests whose answer has not ended (nor been dropped by the client).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Scripts the answers (JSON body, stream events) from now on.
    pub fn reply(&self, reply: Reply) {
        *self.shared.reply.lock() = reply;
    }

    /// Stops listening (idle connections close; new connections are refused).
    pub fn kill(&self) {
        self.stop.cancel();
    }

    /// Waits until the backend refuses connections (after [`Backend::kill`]).
    pub async fn wait_refusing(&self) {
        for _ in 0..250 {
            if tokio::net::TcpStream::connect(self.addr).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{} still accepts connections", self.url());
    }

    /// Inference requests from now on wait, once recorded, until [`Backend::release`].
    pub fn hold(&self) {
        self.shared.knobs.held.store(true, Ordering::SeqCst);
    }

    /// Lets every held request (and the ones to come) go on.
    pub fn release(&self) {
        self.shared.knobs.held.store(false, Ordering::SeqCst);
        self.shared.knobs.gate.notify_waiters();
    }
}

/// Records a request that is not an inference request.
fn probed(s: &Shared, req: &Request) {
    let path = req.uri().path().to_string();
    s.probes.lock().push((path, req.headers().clone()));
}

async fn health(State(s): State<Arc<Shared>>, req: Request) -> StatusCode {
    probed(&s, &req);
    if s.knobs.healthy.load(Ordering::Relaxed) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn models(State(s): State<Arc<Shared>>, req: Request) -> Response {
    probed(&s, &req);
    axum::Json(serde_json::json!({"object": "list", "data": [{"id": s.model, "object": "model"}]}))
        .into_response()
}

async fn info(State(s): State<Arc<Shared>>, req: Request) -> Response {
    probed(&s, &req);
    if s.knobs.info_down.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let mut info = serde_json::json!({"worker": s.name, "model_path": s.model});
    match s.knobs.dp_size.load(Ordering::SeqCst) {
        0 => {}
        n => info["dp_size"] = n.into(),
    }
    axum::Json(info).into_response()
}

async fn infer(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let flight = Flight::new(&s.in_flight);
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let stream = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("stream").and_then(|s| s.as_bool()))
        .unwrap_or(false);
    s.seen.lock().push(Seen {
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts.headers,
        body: body.clone(),
    });
    loop {
        let released = s.knobs.gate.notified();
        if !s.knobs.held.load(Ordering::SeqCst) {
            break;
        }
        released.await;
    }
    let head_delay = s.knobs.head_delay_ms.load(Ordering::Relaxed);
    if head_delay > 0 {
        tokio::time::sleep(Duration::from_millis(head_delay as u64)).await;
    }
    let status = s.knobs.status.load(Ordering::Relaxed);
    let reply = s.reply.lock().clone();
    if status != 200 {
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if let Some((content_type, body)) = reply.error {
            return (code, [(http::header::CONTENT_TYPE, content_type)], body).into_response();
        }
        let body = serde_json::json!({"error": {"message": format!("scripted {status}")}});
        return (code, axum::Json(body)).into_response();
    }
    if !stream {
        let v = reply.json.unwrap_or_else(
            || serde_json::json!({"worker": s.name, "model": s.model, "body_len": body.len()}),
        );
        return axum::Json(v).into_response();
    }
    let n = s.knobs.chunks.load(Ordering::Relaxed);
    let break_after = s.knobs.break_after.load(Ordering::Relaxed);
    let delay = Duration::from_millis(s.knobs.chunk_delay_ms.load(Ordering::Relaxed) as u64);
    let name = s.name.clone();
    let lines: Vec<String> = match reply.events {
        Some(events) => events.iter().map(|e| format!("data: {e}\n\n")).collect(),
        None => (0..n)
            .map(|i| format!("data: {{\"worker\":\"{name}\",\"i\":{i}}}\n\n"))
            .collect(),
    };
    let n = lines.len();
    let frames = futures::stream::unfold((0usize, flight), move |(i, flight)| {
        let line = lines.get(i).cloned();
        async move {
            if i > n {
                return None;
            }
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if i >= break_after {
                let cut =
                    std::io::Error::new(std::io::ErrorKind::ConnectionReset, "scripted break");
                return Some((Err(cut), (n + 1, flight)));
            }
            let line = line.unwrap_or_else(|| "data: [DONE]\n\n".to_string());
            Some((Ok::<_, std::io::Error>(Bytes::from(line)), (i + 1, flight)))
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(frames))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// `GET url`, the body as JSON (panics on a transport error or non-JSON body).
pub async fn get_json(c: &reqwest::Client, url: &str) -> serde_json::Value {
    json_answer(c.get(url)).await
}

/// `GET url` with `Authorization: Bearer key`, the answer as JSON (panics on a transport
/// error or non-JSON body).
pub async fn get_json_as(c: &reqwest::Client, url: &str, key: &str) -> serde_json::Value {
    json_answer(c.get(url).bearer_auth(key)).await
}

/// Sends `req` and reads its answer as JSON (panics on a transport error or non-JSON body).
async fn json_answer(req: reqwest::RequestBuilder) -> serde_json::Value {
    req.send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("JSON body")
}

/// `POST url` with a JSON body, the answer as JSON (panics on a transport error or non-JSON body).
pub async fn post_json(
    c: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    c.post(url)
        .json(body)
        .send()
        .await
        .expect("POST")
        .json()
        .await
        .expect("JSON body")
}

/// `POST url` with a JSON body: the status and the JSON answer, whatever the status.
pub async fn send_json(
    c: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = c.post(url).json(body).send().await.expect("POST");
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON body"))
}

/// `POST {base}/generate` of the token ids `ids` for one new token; asserts a 200 and
/// returns the answer.
pub async fn generate_ids(c: &reqwest::Client, base: &str, ids: &[u32]) -> serde_json::Value {
    let body = serde_json::json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}});
    let r = post(c, &format!("{base}/generate"), &body).await;
    assert_eq!(r.status(), 200);
    r.json().await.expect("JSON body")
}

/// `POST url` with a JSON body (panics on a transport error).
pub async fn post(c: &reqwest::Client, url: &str, body: &serde_json::Value) -> reqwest::Response {
    c.post(url).json(body).send().await.expect("POST")
}

/// `GET url`, the body as text (panics on a transport error).
pub async fn get_text(c: &reqwest::Client, url: &str) -> String {
    c.get(url)
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("text body")
}

/// The JSON `data:` events of an SSE body, without the final `[DONE]` (panics on an
/// event that is not JSON).
pub fn sse_json(text: &str) -> Vec<serde_json::Value> {
    text.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).expect("JSON event"))
        .collect()
}

/// One operation of an OpenAPI document.
#[derive(Debug, Clone)]
pub struct Operation {
    /// HTTP method.
    pub method: http::Method,
    /// Path template, e.g. `/workers/{id}`.
    pub path: String,
    /// `operationId`.
    pub id: String,
    /// Its first tag.
    pub tag: String,
    /// Whether it carries a security requirement (some key is checked).
    pub secured: bool,
    /// The schemes of its security requirement (alternatives: any one opens it).
    pub schemes: Vec<String>,
    /// Its `x-moongate-plane` (`client`, `store`, `admin`), if it is on one.
    pub plane: Option<String>,
    /// The statuses it documents.
    pub statuses: Vec<String>,
}

impl Operation {
    /// The path with every `{param}` replaced by a plausible value.
    pub fn concrete_path(&self) -> String {
        let mut out = String::new();
        for (i, part) in self.path.split('/').enumerate() {
            if i > 0 {
                out.push('/');
            }
            out.push_str(match part {
                "{client_id}" => "0d1f8a3e-5b6c-4d7e-8f90-a1b2c3d4e5f6",
                "{file}" => "index.html",
                p if p.starts_with('{') => "x",
                p => p,
            });
        }
        if self.path == "/metadata" {
            out.push_str("?key=k");
        }
        out
    }
}

/// Every operation of `doc` (an OpenAPI document as JSON), in document order.
pub fn operations(doc: &serde_json::Value) -> Vec<Operation> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths").iter() {
        for (method, op) in item.as_object().expect("path item").iter() {
            let Ok(method) = method.to_ascii_uppercase().parse::<http::Method>() else {
                continue;
            };
            ops.push(Operation {
                method,
                path: path.clone(),
                id: op["operationId"].as_str().unwrap_or_default().to_string(),
                tag: op["tags"][0].as_str().unwrap_or_default().to_string(),
                secured: op["security"].as_array().is_some_and(|s| !s.is_empty()),
                schemes: op["security"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|req| req.as_object())
                    .flat_map(|req| req.keys().cloned())
                    .collect(),
                plane: op["x-moongate-plane"].as_str().map(str::to_string),
                statuses: op["responses"]
                    .as_object()
                    .map(|r| r.keys().cloned().collect())
                    .unwrap_or_default(),
            });
        }
    }
    ops
}

/// The JSON pointer of the first place where `a` and `b` differ (`None` when equal).
pub fn first_difference(a: &serde_json::Value, b: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k)));
            for k in keys {
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => {
                        if let Some(rest) = first_difference(p, q) {
                            return Some(format!("/{k}{rest}"));
                        }
                    }
                    _ => return Some(format!("/{k}")),
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                if let Some(rest) = first_difference(p, q) {
                    return Some(format!("/{i}{rest}"));
                }
            }
            (x.len() != y.len()).then(|| format!("/{}", x.len().min(y.len())))
        }
        _ => (a != b).then(String::new),
    }
}

/// The committed `openapi/openapi.json` (`moongate serve`'s document, default settings).
pub fn committed_openapi() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    let text = std::fs::read_to_string(path).expect("openapi/openapi.json is committed");
    serde_json::from_str(&text).expect("openapi/openapi.json is JSON")
}

/// A client that never uses a proxy (a request to this host's own non-loopback address
/// must leave from it), with a 10 s timeout.
pub fn direct() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .expect("a reqwest client")
}

/// Sends `method path` (a `{}` JSON body for methods that take one) with `auth` as the
/// `Authorization` header; returns the status, the `WWW-Authenticate` header and the body.
pub async fn call(
    c: &reqwest::Client,
    base: &str,
    method: http::Method,
    path: &str,
    auth: Option<&str>,
) -> (u16, Option<String>, String) {
    let mut req = c.request(method.clone(), format!("{base}{path}"));
    if matches!(
        method,
        http::Method::POST | http::Method::PUT | http::Method::PATCH
    ) {
        req = req.header("content-type", "application/json").body("{}");
    }
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let www = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap_or_default().to_string());
    (status, www, resp.text().await.unwrap_or_default())
}

/// Checks every operation of the document `base` serves against what the server enforces:
/// an operation with a security requirement refuses a request without a key, with a wrong
/// one and with each key of `keys` (scheme name, key) its requirement does not name (401,
/// `WWW-Authenticate: Bearer`, the owner's envelope: the master's for `kv-master`, else
/// OpenAI's; the key never echoed) and documents that 401; it takes each key its
/// requirement names; an operation without one never answers 401. Returns how many
/// operations were secured.
pub async fn check_planes(base: &str, doc: &serde_json::Value, keys: &[(&str, &str)]) -> usize {
    let c = reqwest::Client::new();
    let mut secured = 0;
    for op in operations(doc) {
        let path = op.concrete_path();
        let what = format!("{} {path}", op.method);
        if !op.secured {
            for auth in [None].into_iter().chain(keys.iter().map(|(_, k)| Some(*k))) {
                let bearer = auth.map(|k| format!("Bearer {k}"));
                let (status, _, body) =
                    call(&c, base, op.method.clone(), &path, bearer.as_deref()).await;
                assert_ne!(status, 401, "{what} is documented open: {body}");
            }
            assert!(
                !op.statuses.iter().any(|s| s == "401"),
                "{what} documents a 401"
            );
            continue;
        }
        secured += 1;
        assert!(
            op.statuses.iter().any(|s| s == "401"),
            "{what} does not document its 401"
        );
        let refused = keys
            .iter()
            .filter(|(scheme, _)| !op.schemes.iter().any(|s| s == scheme))
            .map(|(_, k)| format!("Bearer {k}"));
        let wrong = ["Bearer nope".to_string(), "Basic YWRtaW4=".to_string()];
        let mut tries: Vec<Option<String>> = vec![None];
        tries.extend(wrong.into_iter().chain(refused).map(Some));
        for auth in tries {
            let (status, www, body) =
                call(&c, base, op.method.clone(), &path, auth.as_deref()).await;
            assert_eq!(status, 401, "{what} with {auth:?}: {body}");
            assert_eq!(www.as_deref(), Some("Bearer"), "{what}");
            let v: serde_json::Value = serde_json::from_str(&body).expect("JSON refusal");
            if op.tag == "kv-master" {
                assert_eq!(
                    (v["error"]["type"].as_str(), v["error"]["code"].as_i64()),
                    (Some("UNAUTHORIZED"), Some(-2001)),
                    "{what}: master envelope: {body}"
                );
            } else {
                assert_eq!(v["error"]["code"], "invalid_api_key", "{what}: {body}");
                assert_eq!(v["error"]["type"], "authentication_error", "{what}: {body}");
            }
            for (_, k) in keys {
                assert!(!body.contains(k), "{what} echoes a key");
            }
        }
        for (scheme, key) in keys
            .iter()
            .filter(|(s, _)| op.schemes.iter().any(|o| o == s))
        {
            let bearer = format!("Bearer {key}");
            let (status, _, body) = call(&c, base, op.method.clone(), &path, Some(&bearer)).await;
            assert!(
                status != 401 && status != 403,
                "{what} with the {scheme}: {status} {body}"
            );
        }
    }
    secured
}

/// A non-loopback address of this host: the source address the kernel picks to reach a
/// documentation-range address (nothing is sent). `None` on a host with no such route.
pub fn non_loopback_ip() -> Option<std::net::IpAddr> {
    for (bind, far) in [("0.0.0.0:0", "192.0.2.1:9"), ("[::]:0", "[2001:db8::1]:9")] {
        let Ok(sock) = std::net::UdpSocket::bind(bind) else {
            continue;
        };
        if sock.connect(far).is_err() {
            continue;
        }
        if let Ok(local) = sock.local_addr()
            && !local.ip().is_loopback()
            && !local.ip().is_unspecified()
        {
            return Some(local.ip());
        }
    }
    None
}
