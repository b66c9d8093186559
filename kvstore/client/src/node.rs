//! The storage node (`moongate store`): a store client that contributes `--segment-size`
//! bytes of memory (optionally hugepage-backed) to the store, serves transfers into and out
//! of it, heartbeats the master (remounting when told to), exposes `/health` and
//! `/metrics`, and unmounts on a graceful shutdown (SIGINT / SIGTERM).
//!
//! It announces itself on stdout with one line once it serves (scripts and tests wait for
//! it):
//!
//! ```text
//! moongate store ready: segment 10.0.0.5:40123 bytes 4294967296 http 0.0.0.0:30100 client <uuid> mounted true
//! ```

use openapi::routes;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use openapi::store::{NodeHealth, NodeStatus};
use serde::{Deserialize, Serialize};

use crate::{ClientConfig, StoreClient, StoreError, StoreResult, env};

/// Default address of `/health` and `/metrics`.
pub const DEFAULT_HTTP_LISTEN: &str = "0.0.0.0:30100";

/// Gauge: bytes of the segment this node contributes.
pub const SEGMENT_BYTES: &str = "moongate_store_segment_bytes";
/// Gauge: 1 while the segment is mounted at the master.
pub const MOUNTED: &str = "moongate_store_mounted";
/// Gauge: bytes this node moved as initiator, by `transport` (`tcp`, `shm`, `local`, `rdma`).
pub const TRANSFER_BYTES: &str = "moongate_store_transfer_bytes";

/// Settings of a storage node: a store client's, plus the node's HTTP address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct StoreNodeConfig {
    /// The store client the node runs (master, segment, transfer settings).
    #[command(flatten)]
    pub client: ClientConfig,
    /// Address of the node's `/health` and `/metrics`.
    #[arg(long, env = env::HTTP_LISTEN, default_value = DEFAULT_HTTP_LISTEN)]
    pub http_listen: SocketAddr,
    /// OTLP/HTTP traces endpoint (e.g. `http://collector:4318/v1/traces`): export a span
    /// per disk load (in the reader's trace when its read sent a `traceparent`), per
    /// transfer batch and per master call. Off when unset.
    #[arg(long, env = env::OTLP_TRACES_ENDPOINT)]
    pub otlp_traces_endpoint: Option<String>,
}

impl Default for StoreNodeConfig {
    fn default() -> Self {
        Self {
            client: ClientConfig::default(),
            http_listen: DEFAULT_HTTP_LISTEN.parse().expect("default address parses"),
            otlp_traces_endpoint: None,
        }
    }
}

impl StoreNodeConfig {
    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> StoreResult<()> {
        self.client.validate()?;
        if self.client.segment_size == 0 {
            return Err(StoreError::InvalidArgument(
                "a storage node needs --segment-size > 0".into(),
            ));
        }
        if let Some(problem) = self
            .otlp_traces_endpoint
            .as_deref()
            .and_then(otlp::endpoint_problem)
        {
            return Err(StoreError::InvalidArgument(problem));
        }
        Ok(())
    }
}

struct NodeState {
    client: StoreClient,
    render_metrics: Box<dyn Fn() -> String + Send + Sync>,
}

fn health_of(c: &StoreClient) -> NodeHealth {
    let h = c.health();
    let seg = c.segment();
    NodeHealth {
        status: if h.mounted {
            NodeStatus::Ok
        } else {
            NodeStatus::Unmounted
        },
        client_id: c.id().to_string(),
        master: c.config().master.clone(),
        segment: seg.map(|s| s.name.clone()).unwrap_or_default(),
        segment_bytes: seg.map_or(0, |s| s.size),
        pings: h.pings,
        consecutive_ping_failures: h.consecutive_failures,
        remounts: h.remounts,
        last_ping_ok_ms_ago: h.last_ping_ok.map(|d| d.as_millis() as u64),
        view_version: h.view_version,
    }
}

async fn health(State(s): State<Arc<NodeState>>) -> impl IntoResponse {
    let h = health_of(&s.client);
    let code = if h.status == NodeStatus::Ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(h))
}

async fn metrics(State(s): State<Arc<NodeState>>) -> impl IntoResponse {
    let c = &s.client;
    let h = c.health();
    metrics::gauge!(SEGMENT_BYTES).set(c.segment().map_or(0, |s| s.size) as f64);
    metrics::gauge!(MOUNTED).set(if h.mounted { 1.0 } else { 0.0 });
    let t = c.engine().stats();
    for (transport, bytes) in [
        ("tcp", t.tcp_bytes),
        ("shm", t.shm_bytes),
        ("local", t.local_bytes),
        ("rdma", t.rdma_bytes),
    ] {
        metrics::gauge!(TRANSFER_BYTES, "transport" => transport).set(bytes as f64);
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        (s.render_metrics)(),
    )
}

/// Runs a storage node until `shutdown` completes, then unmounts and drains. A master
/// that is not up yet is waited for (the segment is mounted when it answers).
/// `render_metrics` renders the process's Prometheus registry for `/metrics`.
pub async fn run(
    config: StoreNodeConfig,
    render_metrics: impl Fn() -> String + Send + Sync + 'static,
    shutdown: impl Future<Output = ()>,
) -> StoreResult<()> {
    config.validate()?;
    crate::metrics::describe_client();
    let client = StoreClient::start_node(config.client.clone()).await?;
    let listener = tokio::net::TcpListener::bind(config.http_listen)
        .await
        .map_err(|e| StoreError::setup(&format!("bind {}", config.http_listen), e))?;
    let http_addr = listener
        .local_addr()
        .map_err(|e| StoreError::setup("HTTP listener address", e))?;
    let state = Arc::new(NodeState {
        client: client.clone(),
        render_metrics: Box::new(render_metrics),
    });
    let app = axum::Router::new()
        .route(routes::node::Health::PATH, get(health))
        .route(routes::node::Metrics::PATH, get(metrics))
        .with_state(state);
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = http_stopped.await;
        });
        if let Err(e) = served.await {
            tracing::error!(error = %e, "storage node HTTP server failed");
        }
    });
    // Ready once the segment is mounted (or its mount was tried): a node faults its
    // segment in first, and answers `/health` (unmounted) meanwhile.
    tokio::pin!(shutdown);
    let stopped = tokio::select! {
        _ = client.mount_settled() => false,
        _ = &mut shutdown => true,
    };
    let seg = client.segment().expect("a node has a segment");
    println!(
        "moongate store ready: segment {} bytes {} http {http_addr} client {} mounted {}",
        seg.name,
        seg.size,
        client.id(),
        client.health().mounted
    );
    let _ = std::io::stdout().flush();
    tracing::info!(segment = %seg.name, bytes = seg.size, http = %http_addr, master = %client.config().master, "storage node serving");
    if !stopped {
        shutdown.await;
    }
    tracing::info!("storage node shutting down: unmounting and draining");
    let closed = client.close().await;
    let _ = stop_http.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    if let Err(e) = &closed {
        tracing::warn!(error = %e, "unmounting at the master failed; it expires the segment after its client TTL");
    }
    Ok(())
}

/// Most bytes of a node's `/health` answer [`node_health`] reads.
const MAX_HEALTH_BYTES: usize = 64 << 10;

/// The `/health` of the storage node whose HTTP address is `addr` (`host:port`): its master
/// and segment, for a client that works beside it (the wheel's `setup_dummy`). Plain HTTP:
/// meant for a node on the same host.
pub async fn node_health(addr: &str, timeout: Duration) -> StoreResult<NodeHealth> {
    use http_body_util::{BodyExt, Empty, Limited};
    let fail = |why: String| StoreError::Rpc {
        url: format!("http://{addr}{}", routes::node::Health::PATH),
        reason: why,
    };
    let uri: http::Uri = format!("http://{addr}{}", routes::node::Health::PATH)
        .parse()
        .map_err(|e| fail(format!("not a host:port: {e}")))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let call = async {
        let resp = client
            .request(
                http::Request::get(uri)
                    .body(Empty::<bytes::Bytes>::new())
                    .map_err(|e| fail(e.to_string()))?,
            )
            .await
            .map_err(|e| fail(e.to_string()))?;
        let body = Limited::new(resp.into_body(), MAX_HEALTH_BYTES)
            .collect()
            .await
            .map_err(|e| fail(e.to_string()))?
            .to_bytes();
        serde_json::from_slice::<NodeHealth>(&body)
            .map_err(|e| fail(format!("not a node's health: {e}")))
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| fail(format!("no answer within {} ms", timeout.as_millis())))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        node: StoreNodeConfig,
    }

    #[test]
    fn cli_defaults_equal_the_struct_defaults() {
        let cli = Cli::try_parse_from(["store"]).unwrap();
        assert_eq!(cli.node, StoreNodeConfig::default());
        cli.node.validate().unwrap();
        let cli = Cli::try_parse_from(["store", "--segment-size", "0"]).unwrap();
        assert!(cli.node.validate().is_err());
        let cli =
            Cli::try_parse_from(["store", "--http-listen", "127.0.0.1:0", "--hugepages"]).unwrap();
        assert!(cli.node.client.hugepages);
    }
}
