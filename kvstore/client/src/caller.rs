//! Master calls driven by the calling thread's own runtime.
//!
//! Why: a thread outside a multi-threaded runtime that blocks on a master call (a Python
//! thread in `moongate.store`) only waits. The pooled connection's task runs on a runtime
//! worker, which has to be woken to send the request and again to read the answer, and the
//! answer then has to wake the caller: on the 2-vCPU virtual machines this project is
//! measured on, `batch_exists` of 128 keys took 400-450 µs that way against 100-150 µs on a
//! current-thread runtime whose one thread does the I/O itself (see `busy_poll` for what a
//! wake-up costs there).
//!
//! How: a caller that owns a current-thread runtime for as long as it lives (one per Python
//! thread) runs its master calls inside [`caller_driven`]. Those calls then use an HTTP
//! client of the calling thread's own (one per thread and master client, see
//! [`LocalClients`]), whose connections and their tasks live on that runtime, so the thread
//! that waits is the thread that reads the socket. Anything else (a multi-threaded runtime,
//! no [`caller_driven`] scope) uses the master client's shared pool.
//!
//! The contract: inside [`caller_driven`], the current runtime is a current-thread runtime
//! that only this thread drives and that outlives the [`crate::StoreClient`] (or is never
//! used again after it is gone). A connection made there is idle between calls, since its
//! task runs only while the thread is in the runtime; another thread never takes it.
//!
//! Data calls may run caller-driven too (the Python store's do): the client's transfer
//! engine opens its connections, and runs what outlives a call, on the runtime it was
//! built on (`transfer::TransferEngine::runtime`), and so does the copy buffer's
//! quarantine. What the calling thread then does itself is read the master's answers and
//! copy same-host values (a current-thread runtime spreads a batch's copies over its
//! thread and its blocking pool).

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use tokio::runtime::{Handle, RuntimeFlavor};

tokio::task_local! {
    static CALLER_DRIVEN: ();
}

/// Most per-thread clients a master client keeps; past it they are all dropped (their
/// threads reconnect on their next call), so threads that came and went leave nothing.
const MAX_THREADS: usize = 64;

/// Runs `fut` so that the master calls in it use connections of this thread's own (see the
/// module doc for why, and for the contract: the current runtime must be a current-thread
/// runtime this thread alone drives). On any other runtime the scope changes nothing.
pub async fn caller_driven<F: Future>(fut: F) -> F::Output {
    CALLER_DRIVEN.scope((), fut).await
}

/// Whether the running task is in a [`caller_driven`] scope on a current-thread runtime.
pub(crate) fn active() -> bool {
    CALLER_DRIVEN.try_with(|_| ()).is_ok()
        && Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::CurrentThread)
}

/// One master client's per-thread copies of a value (its HTTP client), made on first use
/// by a thread in a [`caller_driven`] scope.
#[derive(Debug)]
pub(crate) struct LocalClients<C> {
    by_thread: Arc<Mutex<HashMap<ThreadId, C>>>,
}

impl<C> Clone for LocalClients<C> {
    fn clone(&self) -> Self {
        Self {
            by_thread: Arc::clone(&self.by_thread),
        }
    }
}

impl<C> Default for LocalClients<C> {
    fn default() -> Self {
        Self {
            by_thread: Arc::default(),
        }
    }
}

impl<C: Clone> LocalClients<C> {
    /// This thread's copy when the running task is caller-driven (made by `make` the first
    /// time), else `shared` itself (borrowed: the usual call pays no clone).
    pub(crate) fn pick<'a>(&self, shared: &'a C, make: impl FnOnce() -> C) -> Cow<'a, C> {
        if !active() {
            return Cow::Borrowed(shared);
        }
        let id = std::thread::current().id();
        let mut map = self
            .by_thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !map.contains_key(&id) && map.len() >= MAX_THREADS {
            map.clear();
        }
        Cow::Owned(map.entry(id).or_insert_with(make).clone())
    }

    /// How many threads hold a copy (for tests).
    #[cfg(test)]
    pub(crate) fn threads(&self) -> usize {
        self.by_thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_caller_driven_task_on_a_current_thread_runtime_gets_its_own_copy() {
        let local = LocalClients::<u32>::default();
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(current.block_on(async { *local.pick(&0, || 1) }), 0);
        let got = current.block_on(caller_driven(async { *local.pick(&0, || 1) }));
        assert_eq!(got, 1);
        assert_eq!(local.threads(), 1);
        // Made once per thread: the second call finds the first copy.
        let again = current.block_on(caller_driven(async { *local.pick(&0, || 2) }));
        assert_eq!(again, 1);
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        assert_eq!(
            multi.block_on(caller_driven(async { *local.pick(&0, || 3) })),
            0
        );
        assert_eq!(*local.pick(&0, || 4), 0, "outside any runtime");
    }

    /// A master that answers every ping and records the port each request came from.
    async fn recording_master() -> (String, Arc<Mutex<Vec<u16>>>) {
        use axum::extract::ConnectInfo;
        let ports = Arc::new(Mutex::new(Vec::new()));
        let p = ports.clone();
        let app = axum::Router::new().fallback(
            move |ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>| {
                let p = p.clone();
                async move {
                    p.lock().unwrap().push(peer.port());
                    axum::Json(serde_json::json!({"view_version": 7, "status": "ok"}))
                }
            },
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        (url, ports)
    }

    #[test]
    fn caller_driven_calls_keep_their_own_connection_to_the_master() {
        use uuid::Uuid as ClientId;
        let shared_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (url, ports) = shared_rt.block_on(recording_master());
        let rpc = super::super::rpc::MasterRpc::new(
            &url,
            std::time::Duration::from_secs(5),
            &trust::Secret::new("k".to_owned()),
            None,
            None,
        )
        .unwrap();
        let ping = |rt: &tokio::runtime::Runtime, driven: bool| {
            let call = rpc.ping(ClientId::nil());
            let answer = if driven {
                rt.block_on(caller_driven(call))
            } else {
                rt.block_on(call)
            };
            assert_eq!(answer.unwrap().view_version, 7);
        };
        ping(&shared_rt, false);
        let own = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        ping(&own, true);
        ping(&own, true);
        ping(&shared_rt, false);
        let seen = ports.lock().unwrap().clone();
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[0], seen[3], "the shared pool kept its connection");
        assert_eq!(seen[1], seen[2], "the thread kept its own connection");
        assert_ne!(
            seen[0], seen[1],
            "the caller-driven calls did not use the shared pool"
        );
        assert_eq!(rpc.local_threads(), 1);
    }

    #[test]
    fn threads_past_the_bound_start_over() {
        let local = LocalClients::<usize>::default();
        for n in 0..=MAX_THREADS {
            let l = local.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(caller_driven(async { *l.pick(&0, || n) }))
            })
            .join()
            .unwrap();
        }
        assert_eq!(
            local.threads(),
            1,
            "the 65th thread found a full map and cleared it"
        );
    }
}
