//! The export queue and its thread: finished spans wait in a bounded queue; one thread
//! sends them in batches, each as one OTLP/HTTP request, when a batch is full, a second
//! has passed, or [`Exporter::flush`] asks.
//!
//! A full queue drops spans (counted) instead of holding up the request that closed
//! them. A failed export is dropped too (after one logged warning per failure streak): a
//! collector that is down must not grow the process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::encode::{Encoder, Resource};
use crate::span::Live;

/// Where and how spans are exported.
#[derive(Clone, Debug)]
pub struct ExportConfig {
    /// The OTLP/HTTP traces URL (`http://collector:4318/v1/traces`).
    pub endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Most finished spans waiting; more are dropped.
    pub max_queue: usize,
    /// Spans that start an export at once.
    pub batch: usize,
    /// Longest a finished span waits to be sent.
    pub interval: Duration,
    /// Longest one export may take.
    pub timeout: Duration,
}

impl ExportConfig {
    /// Defaults for `endpoint`: service `moongate`, 65,536 spans queued, exports of 2,048
    /// or every second, 10 s each at most.
    pub fn new(endpoint: &str) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            service_name: "moongate".to_owned(),
            max_queue: 65_536,
            batch: 2_048,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Default)]
struct State {
    spans: Vec<Live>,
    /// Flushes asked for, and done (an export taken after the ask has finished).
    asked: u64,
    done: u64,
    stop: bool,
}

/// The finished spans, shared by the layer and the exporter thread.
pub(crate) struct Queue {
    state: Mutex<State>,
    /// Wakes the thread: a batch is full, a flush is asked, or it should stop.
    wake: Condvar,
    /// Wakes flushers: an export finished.
    exported: Condvar,
    max: usize,
    batch: usize,
    dropped: AtomicU64,
    sent: AtomicU64,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, span: Live) {
        let mut st = self.lock();
        if st.spans.len() >= self.max {
            drop(st);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        st.spans.push(span);
        if st.spans.len() == self.batch {
            self.wake.notify_one();
        }
    }
}

/// What is wrong with `url` as an OTLP/HTTP traces endpoint (it must be an `http://` or
/// `https://` URL with a host), if anything: the check every `--otlp-traces-endpoint`
/// flag makes.
pub fn endpoint_problem(url: &str) -> Option<String> {
    match url.parse::<http::Uri>() {
        Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => None,
        _ => Some(format!(
            "otlp_traces_endpoint {url:?} is not an http(s):// URL"
        )),
    }
}

/// The export pipeline's handle: flush it, shut it down (which flushes).
pub struct Exporter {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
}

/// Why the pipeline could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint is not an `http://` or `https://` URL.
    #[error("OTLP endpoint {0:?} is not an http(s):// URL")]
    Endpoint(String),
    /// The HTTP client or the thread could not be made.
    #[error("starting the OTLP exporter: {0}")]
    Start(String),
}

impl Exporter {
    pub(crate) fn start(cfg: ExportConfig) -> Result<(Arc<Queue>, Self), Error> {
        if endpoint_problem(&cfg.endpoint).is_some() {
            return Err(Error::Endpoint(cfg.endpoint.clone()));
        }
        let url: http::Uri = cfg
            .endpoint
            .parse()
            .map_err(|_| Error::Endpoint(cfg.endpoint.clone()))?;
        let tls = trust::tls::trust_roots(None).map_err(Error::Start)?;
        let queue = Arc::new(Queue {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            exported: Condvar::new(),
            max: cfg.max_queue.max(1),
            batch: cfg.batch.clamp(1, cfg.max_queue.max(1)),
            dropped: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        });
        // The thread's own runtime drives its HTTP client: the export never runs on (or
        // waits for) the process's async runtime, which may be busy or gone at shutdown.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Start(e.to_string()))?;
        let q = queue.clone();
        let thread = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                let client = rt.block_on(async {
                    Client::builder(TokioExecutor::new()).build(trust::tls::https_or_http(
                        HttpConnector::new(),
                        trust::tls::client_config(tls),
                    ))
                });
                run(&q, &rt, &client, &url, &cfg);
            })
            .map_err(|e| Error::Start(e.to_string()))?;
        Ok((
            queue.clone(),
            Self {
                queue,
                thread: Some(thread),
            },
        ))
    }

    /// Sends every span finished so far, and waits (up to `timeout`) until it is sent.
    /// Returns whether it was in time.
    pub fn flush_within(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.queue.lock();
        st.asked += 1;
        let want = st.asked;
        self.queue.wake.notify_one();
        while st.done < want {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .queue
                .exported
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// [`Exporter::flush_within`] 10 s.
    pub fn flush(&self) -> bool {
        self.flush_within(Duration::from_secs(10))
    }

    /// Flushes, then stops the export thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    /// Spans dropped so far (queue full, or their export failed).
    pub fn dropped(&self) -> u64 {
        self.queue.dropped.load(Ordering::Relaxed)
    }

    /// Spans exported so far.
    pub fn sent(&self) -> u64 {
        self.queue.sent.load(Ordering::Relaxed)
    }

    fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.flush();
        self.queue.lock().stop = true;
        self.queue.wake.notify_one();
        let _ = thread.join();
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop();
    }
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

fn run(
    q: &Queue,
    rt: &tokio::runtime::Runtime,
    client: &HttpClient,
    url: &http::Uri,
    cfg: &ExportConfig,
) {
    let resource = Resource {
        service_name: cfg.service_name.clone(),
        pid: std::process::id(),
        scope: "moongate",
    };
    let mut encoder = Encoder::default();
    let mut spare: Vec<Live> = Vec::new();
    let mut body = Vec::new();
    let mut failing = false;
    loop {
        let (mut spans, asked, stop) = {
            let mut st = q.lock();
            let until = Instant::now() + cfg.interval;
            while st.spans.len() < q.batch && st.asked == st.done && !st.stop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                st = q
                    .wake
                    .wait_timeout(st, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            (std::mem::replace(&mut st.spans, spare), st.asked, st.stop)
        };
        for chunk in spans.chunks(q.batch) {
            encoder.request(&resource, chunk, &mut body);
            // The body goes as it is (no copy); the next is written into a new buffer.
            let body = Bytes::from(std::mem::take(&mut body));
            let sent = rt.block_on(post(client, url, body, cfg.timeout));
            match sent {
                Ok(()) => {
                    q.sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    failing = false;
                }
                Err(e) => {
                    q.dropped.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    if !failing {
                        tracing::warn!(target: "otlp", endpoint = %url, error = %e,
                            "exporting traces failed; dropping spans until it works again");
                    }
                    failing = true;
                }
            }
        }
        spans.clear();
        spare = spans;
        let mut st = q.lock();
        st.done = st.done.max(asked);
        q.exported.notify_all();
        if stop && st.spans.is_empty() {
            return;
        }
    }
}

/// One export: POST `body`, a 2xx answer within `timeout`.
async fn post(
    client: &HttpClient,
    url: &http::Uri,
    body: Bytes,
    timeout: Duration,
) -> Result<(), String> {
    let req = http::Request::post(url.clone())
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let answer = tokio::time::timeout(timeout, async {
        let r = client
            .request(req)
            .await
            .map_err(|e| trust::tls::describe(&e))?;
        let status = r.status();
        // Read the answer out, so the connection is kept for the next export.
        let _ = r.into_body().collect().await;
        match status.is_success() {
            true => Ok(()),
            false => Err(format!("HTTP {status}")),
        }
    })
    .await;
    answer.unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
}
