//! Memory upkeep on background threads at idle priority (`SCHED_IDLE`): faulting buffers
//! and peer mappings in ahead of the data path. Such a thread runs only on a CPU nothing
//! else wants, so it never slows a transfer. A thread faulting this process's own memory in
//! (zeroing every page: seconds for gigabytes) is counted while it runs
//! ([`background_prefaults`]) so that code which would keep a CPU busy by polling (the store
//! client's `busy_poll`) can leave the CPU to it instead of starving it. A thread that only
//! fills in page tables of a peer's shared memory is not: what it leaves undone, a copy does
//! on demand at the price of a minor fault, and holding pollers off for all of a large
//! mapping would slow every small call for as long (found on a 3 GiB peer segment: master
//! round trips went from ~35 to ~70 µs for the seconds it took).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Idle-priority memory threads of this process still running.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// How many background threads of this process are still faulting memory in. While one is,
/// a busy poller should sleep instead: it would take the idle CPU the thread runs on and
/// leave the memory cold for the transfers it was meant to speed up.
pub fn background_prefaults() -> usize {
    RUNNING.load(Ordering::Relaxed)
}

/// Counts one running thread in its counter until dropped.
struct Running(&'static AtomicUsize);

impl Running {
    fn start(counter: &'static AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Running(counter)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a background memory thread does, which says whether pollers make way for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upkeep {
    /// Faults this process's own memory in: counted in [`background_prefaults`].
    Prefault,
    /// Fills in page tables of a peer's shared memory: not counted.
    PeerPageTables,
}

/// Runs `work` on a new thread named `name` at idle priority; a [`Upkeep::Prefault`] one is
/// counted in [`background_prefaults`] from before the spawn until `work` returns (or
/// panics).
pub(crate) fn spawn_idle<T: Send + 'static>(
    name: &str,
    upkeep: Upkeep,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    spawn_counted(&RUNNING, name, upkeep, work)
}

/// [`spawn_idle`] counting in `counter`.
fn spawn_counted<T: Send + 'static>(
    counter: &'static AtomicUsize,
    name: &str,
    upkeep: Upkeep,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    let running = (upkeep == Upkeep::Prefault).then(|| Running::start(counter));
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _running = running;
            make_this_thread_idle();
            work()
        })
}

/// Moves the calling thread to `SCHED_IDLE`. Best effort.
fn make_this_thread_idle() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot lower the priority of a background thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_background_thread_is_counted_while_it_runs() {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let before = background_prefaults();
        let t = spawn_idle("moongate-test-idle", Upkeep::Prefault, move || {
            wait.recv().unwrap()
        })
        .unwrap();
        // Counted from the spawn on (other tests' threads may add to the count, never
        // take this one away).
        assert!(background_prefaults() > before);
        go.send(()).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn only_a_prefault_thread_is_counted() {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        for (upkeep, counted) in [(Upkeep::Prefault, 1), (Upkeep::PeerPageTables, 0)] {
            let (go, wait) = std::sync::mpsc::channel::<()>();
            let t = spawn_counted(&COUNT, "moongate-test-idle", upkeep, move || {
                wait.recv().unwrap()
            })
            .unwrap();
            assert_eq!(COUNT.load(Ordering::Relaxed), counted, "{upkeep:?}");
            go.send(()).unwrap();
            t.join().unwrap();
            assert_eq!(COUNT.load(Ordering::Relaxed), 0, "{upkeep:?} done");
        }
    }
}
