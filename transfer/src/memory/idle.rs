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
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Idle-priority memory threads of this process still faulting memory in.
static RUNNING: Counter = Counter::new();

/// How many background threads of this process are still faulting memory in. While one is,
/// a busy poller should sleep instead: it would take the idle CPU the thread runs on and
/// leave the memory cold for the transfers it was meant to speed up.
pub fn background_prefaults() -> usize {
    RUNNING.count()
}

/// Waits up to `timeout` for every background thread of this process that faults memory in
/// to finish (a client's segment, copy buffer and value buffer after its start); true once
/// none runs. For a caller that wants to measure, or serve, with its memory resident.
pub fn wait_for_background_prefaults(timeout: Duration) -> bool {
    RUNNING.wait_for_none(timeout)
}

/// Running threads, and a way to wait for there being none.
struct Counter {
    running: AtomicUsize,
    /// Taken by the last thread out before it notifies, and by a waiter while it checks.
    lock: Mutex<()>,
    none: Condvar,
}

impl Counter {
    const fn new() -> Self {
        Self {
            running: AtomicUsize::new(0),
            lock: Mutex::new(()),
            none: Condvar::new(),
        }
    }

    fn count(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    fn wait_for_none(&self, timeout: Duration) -> bool {
        // A timeout past what an instant can hold (a caller's "forever") has no deadline.
        let deadline = Instant::now().checked_add(timeout);
        // A poisoned lock guards nothing here (it holds no data): go on with it.
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if self.running.load(Ordering::Acquire) == 0 {
                return true;
            }
            guard = match deadline {
                None => self.none.wait(guard).unwrap_or_else(|p| p.into_inner()),
                Some(deadline) => {
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        return false;
                    };
                    match self.none.wait_timeout(guard, left) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    }
                }
            };
        }
    }
}

/// Counts one running thread in its counter until dropped.
struct Running(&'static Counter);

impl Running {
    fn start(counter: &'static Counter) -> Self {
        counter.running.fetch_add(1, Ordering::Relaxed);
        Running(counter)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Under the lock: a waiter either sees the count at zero or is already waiting.
            let _guard = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.0.none.notify_all();
        }
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
    counter: &'static Counter,
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
        static COUNT: Counter = Counter::new();
        for (upkeep, counted) in [(Upkeep::Prefault, 1), (Upkeep::PeerPageTables, 0)] {
            let (go, wait) = std::sync::mpsc::channel::<()>();
            let t = spawn_counted(&COUNT, "moongate-test-idle", upkeep, move || {
                wait.recv().unwrap()
            })
            .unwrap();
            assert_eq!(COUNT.count(), counted, "{upkeep:?}");
            go.send(()).unwrap();
            t.join().unwrap();
            assert_eq!(COUNT.count(), 0, "{upkeep:?} done");
        }
    }

    #[test]
    fn a_wait_ends_when_the_last_counted_thread_does_or_at_its_timeout() {
        static COUNT: Counter = Counter::new();
        assert!(COUNT.wait_for_none(Duration::ZERO), "none running");
        assert!(
            COUNT.wait_for_none(Duration::MAX),
            "no deadline, none running"
        );
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let spawn = |wait: std::sync::mpsc::Receiver<()>| {
            spawn_counted(&COUNT, "moongate-test-idle", Upkeep::Prefault, move || {
                wait.recv().unwrap()
            })
            .unwrap()
        };
        let (go2, wait2) = std::sync::mpsc::channel::<()>();
        let (a, b) = (spawn(wait), spawn(wait2));
        assert!(
            !COUNT.wait_for_none(Duration::from_millis(1)),
            "two running"
        );
        go.send(()).unwrap();
        a.join().unwrap();
        assert!(
            !COUNT.wait_for_none(Duration::from_millis(1)),
            "one running"
        );
        // Released while the waiter waits (with no deadline): the last one out wakes it.
        let waiter = std::thread::spawn(|| COUNT.wait_for_none(Duration::MAX));
        go2.send(()).unwrap();
        assert!(waiter.join().unwrap());
        b.join().unwrap();
    }
}
