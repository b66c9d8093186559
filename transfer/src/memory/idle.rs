//! Memory upkeep on background threads at idle priority (`SCHED_IDLE`): faulting buffers
//! and peer mappings in ahead of the data path. Such a thread runs only on a CPU nothing
//! else wants, so it never slows a transfer, and it is counted while it runs
//! ([`background_prefaults`]) so that code which would keep a CPU busy by polling (the store
//! client's `busy_poll`) can leave the CPU to it instead of starving it.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Idle-priority memory threads of this process still running.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// How many background threads of this process are still faulting memory in. While one is,
/// a busy poller should sleep instead: it would take the idle CPU the thread runs on and
/// leave the memory cold for the transfers it was meant to speed up.
pub fn background_prefaults() -> usize {
    RUNNING.load(Ordering::Relaxed)
}

/// Counts one running thread until dropped.
struct Running;

impl Running {
    fn start() -> Self {
        RUNNING.fetch_add(1, Ordering::Relaxed);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs `work` on a new thread named `name` at idle priority, counted in
/// [`background_prefaults`] from before the spawn until `work` returns (or panics).
pub(crate) fn spawn_idle<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    let running = Running::start();
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
        let t = spawn_idle("moongate-test-idle", move || wait.recv().unwrap()).unwrap();
        // Counted from the spawn on (other tests' threads may add to the count, never
        // take this one away).
        assert!(background_prefaults() > before);
        go.send(()).unwrap();
        t.join().unwrap();
    }
}
