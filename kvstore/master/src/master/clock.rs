//! Time source of the master, injectable so leases, TTLs and timeouts are testable.
//!
//! The master reads time as milliseconds since it started. [`TokioClock`] (the default)
//! follows tokio's clock, so `#[tokio::test(start_paused = true)]` + `tokio::time::advance`
//! drive leases, client TTLs and zombie puts deterministically; outside a paused runtime it
//! is the monotonic wall clock. [`ManualClock`] is set by hand (core tests, benches).

use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonic millisecond clock.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since an arbitrary fixed origin; never decreases.
    fn now_ms(&self) -> u64;
}

/// Monotonic time from tokio (paused-time aware); the default clock.
#[derive(Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    ms: AtomicU64,
}

impl ManualClock {
    /// A clock reading `ms`.
    pub fn new(ms: u64) -> Self {
        Self {
            ms: AtomicU64::new(ms),
        }
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.ms.fetch_add(ms, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.ms.load(Ordering::Relaxed)
    }
}
