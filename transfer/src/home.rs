//! The runtime an engine was built on, its home: the connections the engine opens, and the
//! tasks that serve them, live there, whichever runtime submits the transfers.
//!
//! Why: a caller may drive its calls on a runtime of its own that runs only while it is in
//! a call (a Python thread's current-thread runtime, see `kvclient::caller_driven`:
//! the thread that waits for an answer then reads it itself, which saves two thread
//! wake-ups a call). A TCP lane or a pooled HTTP connection opened from there would be
//! served only while that thread is in a call, so another thread's transfer over it would
//! wait until that thread came back. Opening them (a lane's socket and its tasks, a
//! descriptor fetch with its HTTP connection) therefore runs on the home runtime, spawned
//! there when called from elsewhere, and so do tasks that outlive a call (device copies
//! waited on in the background). The bytes of a local or same-host copy still move on the
//! calling thread and its runtime's helpers (`hostcopy`), which is the point of driving a
//! call from its own thread.
//!
//! A current-thread home is the exception: it runs only while its own thread drives it, so
//! work sent there from another runtime could wait forever. An engine built on one (a
//! single-threaded tool) does its work in place when called from elsewhere, as every engine
//! did before it had a home.

use std::future::Future;

use tokio::runtime::{Handle, RuntimeFlavor};

use crate::error::{Result, TransferError};

/// Runs a slow driver call (registering or deregistering memory with a NIC, creating a
/// queue pair) on a blocking thread when inside a multi-threaded tokio runtime (so async
/// worker threads never wait on the driver), else right here.
pub(crate) fn run_blocking<T>(f: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A handle to the home runtime (cheap to clone).
#[derive(Debug, Clone)]
pub(crate) struct Home(Handle);

impl Home {
    /// The runtime of the calling task (panics outside a runtime: engines are built in one).
    pub(crate) fn current() -> Self {
        Self(Handle::current())
    }

    /// The runtime's handle.
    pub(crate) fn handle(&self) -> &Handle {
        &self.0
    }

    /// Whether the calling task runs on the home runtime.
    fn is_here(&self) -> bool {
        Handle::try_current().is_ok_and(|h| h.id() == self.0.id())
    }

    /// Whether work sent home from elsewhere is sure to run: a multi-threaded runtime's
    /// workers run it; a current-thread runtime only while its thread drives it.
    fn serves_others(&self) -> bool {
        self.0.runtime_flavor() != RuntimeFlavor::CurrentThread
    }

    /// Runs `fut` on the home runtime and waits for it: in place when already there (or
    /// when home is a current-thread runtime, see the module doc), otherwise as a task of
    /// its own there (which runs to its end even if the caller stops waiting, so what it
    /// opens is never left half set up). `Shutdown` when the home runtime is gone.
    pub(crate) async fn run<T, F>(&self, fut: F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        if self.is_here() || !self.serves_others() {
            return fut.await;
        }
        self.0
            .spawn(fut)
            .await
            .map_err(|_| TransferError::Shutdown)?
    }

    /// Starts `fut` as a task of the home runtime (dropped unrun if the runtime is gone); of
    /// the caller's runtime instead when home is a current-thread runtime and the caller
    /// runs elsewhere.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match Handle::try_current() {
            Ok(h) if !self.serves_others() => drop(h.spawn(fut)),
            _ => drop(self.0.spawn(fut)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_from_another_runtime_runs_at_home_and_home_work_runs_in_place() {
        let home_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let home = home_rt.block_on(async { Home::current() });
        let home_id = home_rt.handle().id();
        let where_it_ran = |h: &Home| {
            let h = h.clone();
            async move { h.run(async { Ok(Handle::current().id()) }).await.unwrap() }
        };
        // From the home runtime: in place, on it.
        assert_eq!(home_rt.block_on(where_it_ran(&home)), home_id);
        // From another runtime (a current-thread one, as a Python thread's): still on the
        // home runtime.
        let other = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert_ne!(other.handle().id(), home_id);
        assert_eq!(other.block_on(where_it_ran(&home)), home_id);
        // A spawned task runs at home too.
        let (tx, rx) = std::sync::mpsc::channel();
        other.block_on(async {
            home.spawn(async move { tx.send(Handle::current().id()).unwrap() });
        });
        assert_eq!(rx.recv().unwrap(), home_id);
        // Once the home runtime is gone, work sent there fails as a shutdown.
        drop(home_rt);
        let r = other.block_on(home.run(async { Ok(()) }));
        assert!(matches!(r, Err(TransferError::Shutdown)), "{r:?}");
        other.block_on(async { home.spawn(async {}) }); // no panic
    }

    #[test]
    fn a_current_thread_home_lets_work_from_elsewhere_run_in_place() {
        let home_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let home = home_rt.block_on(async { Home::current() });
        // Nothing drives `home_rt` from here on: work sent there would never run.
        let other = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let ran_on = other.block_on(home.run(async { Ok(Handle::current().id()) }));
        assert_eq!(ran_on.unwrap(), other.handle().id());
        let (tx, rx) = std::sync::mpsc::channel();
        other.block_on(async {
            home.spawn(async move { tx.send(Handle::current().id()).unwrap() });
        });
        assert_eq!(rx.recv().unwrap(), other.handle().id());
        // At home, in place as ever.
        let at_home = home_rt.block_on(home.run(async { Ok(Handle::current().id()) }));
        assert_eq!(at_home.unwrap(), home_rt.handle().id());
    }
}
