//! The process's tokio runtime, blocking on it with the GIL released, and logging.
//!
//! One multi-threaded runtime serves every engine and store of the process; it starts on
//! first use (so a process that forks before using Moongate gives each child its own).
//! Python threads call [`block`] concurrently: each waits on its own future while the GIL
//! is free for the others.

use std::future::Future;
use std::sync::OnceLock;

use pyo3::Python;
use tokio::runtime::Runtime;

/// Environment variable with the number of runtime worker threads (default: up to 4).
pub const THREADS_ENV: &str = "MOONGATE_PY_THREADS";
/// Environment variable with the log filter (`tracing_subscriber::EnvFilter` syntax);
/// default `warn`, so Mooncake users see Moongate's warnings and errors only.
pub const LOG_ENV: &str = "MOONGATE_LOG";

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The runtime, started on first use.
pub fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        let threads = std::env::var(THREADS_ENV)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| *n > 0)
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get().min(4))
                    .unwrap_or(2)
            });
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("moongate-py")
            .enable_all()
            .build()
            .expect("starting the tokio runtime")
    })
}

/// Runs `fut` to completion on the runtime with the GIL released.
pub fn block<F>(py: Python<'_>, fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    py.detach(|| runtime().block_on(fut))
}

/// Installs a stderr logger once (a no-op when the host process already installed one).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
