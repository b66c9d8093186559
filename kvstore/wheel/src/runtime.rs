//! The process's tokio runtime, blocking on it with the GIL released (a call's master
//! requests continue the caller's OpenTelemetry trace when it has one), and logging.
//!
//! One multi-threaded runtime serves every engine and store of the process; it starts on
//! first use (so a process that forks before using Moongate gives each child its own).
//! Python threads call [`block`] concurrently: each waits on its own future while the GIL
//! is free for the others. The store's calls use [`block_here`] instead: each thread's own
//! current-thread runtime, whose thread does the waiting, reads the master's answers and
//! copies the bytes of same-host values itself (with its runtime's helper threads). The
//! connections those calls open still live on the shared runtime, where every engine
//! opens its connections whatever runtime asks (`TransferEngine::runtime`). The transfer
//! engine's own calls use [`block`]: their batches may outlive the call that started
//! them (`batch_transfer_async_*`).

use std::future::Future;
use std::sync::OnceLock;

use pyo3::Python;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
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
    let caller = caller_trace(py);
    py.detach(|| runtime().block_on(kvclient::traced_by(caller, fut)))
}

thread_local! {
    /// This thread's own current-thread runtime, for [`block_here`]; it lives as long as the
    /// thread, as `kvclient::caller_driven` requires.
    static HERE: Option<Runtime> = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok();
}

/// Runs `fut`, a store call, to completion on this thread's own runtime with the GIL
/// released: the thread that waits for the master's answer reads it itself, rather than
/// waiting for a runtime worker to read it and wake it (see
/// `kvclient::caller_driven`), and copies same-host bytes itself. Nothing it starts
/// may need this runtime once it returns: the store's engine opens its connections on the
/// shared runtime and waits there for what outlives a call, and a store call waits for
/// its transfers. Calls that start work meant to outlive them use [`block`]. Falls back
/// to [`block`] where the thread's runtime cannot start.
pub fn block_here<F>(py: Python<'_>, fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    let caller = caller_trace(py);
    py.detach(|| {
        HERE.with(|here| match here {
            Some(rt) => rt.block_on(kvclient::caller_driven(kvclient::traced_by(caller, fut))),
            None => runtime().block_on(kvclient::traced_by(caller, fut)),
        })
    })
}

/// The caller's current OpenTelemetry span, when the process uses OpenTelemetry's Python
/// API (`opentelemetry.trace` is imported) and a valid span is current: the parent of the
/// call's master requests, whose spans then join the caller's trace. Nothing is imported
/// here; a process without OpenTelemetry pays one dictionary lookup per call.
fn caller_trace(py: Python<'_>) -> Option<otlp::SpanContext> {
    static MODULES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    let modules = MODULES
        .get_or_try_init(py, || -> PyResult<Py<PyDict>> {
            Ok(py
                .import("sys")?
                .getattr("modules")?
                .cast_into::<PyDict>()?
                .unbind())
        })
        .ok()?
        .bind(py);
    let trace = modules.get_item("opentelemetry.trace").ok()??;
    let cx = trace
        .call_method0("get_current_span")
        .ok()?
        .call_method0("get_span_context")
        .ok()?;
    if !cx.getattr("is_valid").ok()?.is_truthy().ok()? {
        return None;
    }
    let trace_id: u128 = cx.getattr("trace_id").ok()?.extract().ok()?;
    let span_id: u64 = cx.getattr("span_id").ok()?.extract().ok()?;
    let flags: u8 = cx.getattr("trace_flags").ok()?.extract().ok()?;
    Some(otlp::SpanContext {
        trace_id: trace_id.to_be_bytes(),
        span_id: span_id.to_be_bytes(),
        sampled: flags & 1 == 1,
    })
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
