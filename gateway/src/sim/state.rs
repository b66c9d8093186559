//! Shared state of one simulated worker: its config, the requests in flight, request ids.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::config::SimConfig;
use super::model;

/// State shared by every handler of one simulated worker.
#[derive(Debug)]
pub struct SimState {
    /// The worker's configuration.
    pub cfg: SimConfig,
    in_flight: Arc<AtomicU64>,
    next_id: AtomicU64,
    id_base: u64,
}

impl SimState {
    /// State for a worker configured by `cfg`.
    pub fn new(cfg: SimConfig) -> Arc<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let id_base = model::mix(nanos as u64 ^ u64::from(std::process::id()) << 32);
        Arc::new(SimState {
            cfg,
            in_flight: Arc::default(),
            next_id: AtomicU64::new(0),
            id_base,
        })
    }

    /// Counts a request as in flight until the guard drops.
    pub fn enter(&self) -> InflightGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InflightGuard(self.in_flight.clone())
    }

    /// Requests in flight (streams count until their body ends).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// A fresh id in UUID form (`8-4-4-4-12` hex digits), unique within this process.
    pub fn new_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let hi = model::mix(self.id_base ^ n);
        let lo = model::mix(hi ^ n.rotate_left(32));
        let v = u128::from(hi) << 64 | u128::from(lo);
        let mut id = String::with_capacity(36);
        for (i, shift) in (0..32).rev().map(|d| d * 4).enumerate() {
            if matches!(i, 8 | 12 | 16 | 20) {
                id.push('-');
            }
            let digit = ((v >> shift) & 0xf) as u32;
            id.push(char::from_digit(digit, 16).unwrap_or('0'));
        }
        id
    }

    /// A fresh 32-hex-digit id (SGLang's `/generate` request id form).
    pub fn new_rid(&self) -> String {
        self.new_id().replace('-', "")
    }
}

/// Holds one request in the in-flight count.
#[derive(Debug)]
pub struct InflightGuard(Arc<AtomicU64>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_shaped() {
        let s = SimState::new(SimConfig::default());
        let a = s.new_id();
        let b = s.new_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
        assert_eq!(s.new_rid().len(), 32);
        let g = s.enter();
        assert_eq!(s.in_flight(), 1);
        drop(g);
        assert_eq!(s.in_flight(), 0);
    }
}
