//! A master served on its own TCP listener: the REST router and the background task, until
//! stopped. Tests, benches and tools that need a real master over real HTTP start one here;
//! the gateway mounts [`crate::router`] into its own server instead.

use axum::serve::ListenerExt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use transfer::busy_poll::BusyPoll;

use crate::master::{Master, MasterConfig, MasterResult};

/// [`crate::busy_poll::DEFAULT_BUSY_POLL_US`].
const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(crate::busy_poll::DEFAULT_BUSY_POLL_US);

/// A running master (REST on `addr`, background tick) that stops when dropped.
#[derive(Debug)]
pub struct MasterServer {
    addr: SocketAddr,
    master: Arc<Master>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl MasterServer {
    /// Builds a master from `config` and serves it on `listen` (port 0: any free port).
    pub async fn start(config: MasterConfig, listen: SocketAddr) -> MasterResult<Self> {
        Self::start_with(config, listen, DEFAULT_BUSY_POLL).await
    }

    /// [`MasterServer::start`] with connections that poll for their next request for up to
    /// `busy_poll` after each answer ([`crate::busy_poll`]; zero: never).
    pub async fn start_with(
        config: MasterConfig,
        listen: SocketAddr,
        busy_poll: Duration,
    ) -> MasterResult<Self> {
        let master = Arc::new(Master::new(config)?);
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| crate::MasterError::InternalError(format!("bind {listen}: {e}")))?;
        let app: axum::Router = crate::router(master.clone()).into();
        Self::serve_app(master, listener, app, busy_poll)
    }

    /// Serves `app` on `listener` with `master`'s background task: for hosts that wrap the
    /// master's [`crate::router`] (auth, health, metrics, documentation) before serving it.
    /// Connections poll for their next request for up to `busy_poll` after each answer.
    pub fn serve_app(
        master: Arc<Master>,
        listener: tokio::net::TcpListener,
        app: axum::Router,
        busy_poll: Duration,
    ) -> MasterResult<Self> {
        let addr = listener
            .local_addr()
            .map_err(|e| crate::MasterError::InternalError(format!("listener address: {e}")))?;
        let stop = CancellationToken::new();
        let (bg_stop, http_stop) = (stop.clone(), stop.clone());
        tokio::spawn(crate::run_background(master.clone(), async move {
            bg_stop.cancelled().await
        }));
        // Small request/answer pairs: never let Nagle hold an answer back, and keep polling
        // a connection for its next request a while after answering (`busy_poll`).
        // `tap_io` only to get axum's `ConnectInfo<SocketAddr>` for this listener type.
        let listener = BusyListener::new(listener, busy_poll).tap_io(|_| {});
        // The peer's address reaches handlers and layers as `ConnectInfo<SocketAddr>` (a host
        // answers some routes to loopback callers only).
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { http_stop.cancelled().await });
            if let Err(e) = served.await {
                tracing::error!(error = %e, "master server failed");
            }
        });
        tracing::info!(%addr, "KV master serving");
        Ok(Self {
            addr,
            master,
            stop,
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL clients use (`http://addr`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The master itself (to inspect or drive it in-process).
    pub fn master(&self) -> &Arc<Master> {
        &self.master
    }

    /// Stops accepting, lets requests in flight finish and closes every connection (idle
    /// keep-alive ones at once); waits up to `grace` for that.
    pub async fn stop(mut self, grace: Duration) {
        self.stop.cancel();
        if let Some(t) = self.task.take()
            && tokio::time::timeout(grace, t).await.is_err()
        {
            tracing::warn!(addr = %self.addr, "master connections still open after the grace period");
        }
    }
}

impl Drop for MasterServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A TCP listener for axum's `serve` whose connections have `TCP_NODELAY` (small answers
/// must not wait for Nagle) and are [`BusyPoll`] with `window`.
#[derive(Debug)]
pub struct BusyListener {
    listener: tokio::net::TcpListener,
    window: Duration,
}

impl BusyListener {
    /// Serves `listener`'s connections with `window`.
    pub fn new(listener: tokio::net::TcpListener, window: Duration) -> Self {
        Self { listener, window }
    }
}

impl axum::serve::Listener for BusyListener {
    type Io = BusyPoll<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.listener.accept().await {
                Ok((tcp, peer)) => {
                    let _ = tcp.set_nodelay(true);
                    return (BusyPoll::new(tcp, self.window), peer);
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}
