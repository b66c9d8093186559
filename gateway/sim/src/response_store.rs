//! The responses a simulated worker keeps (the Responses API): in memory, bounded, the
//! oldest dropped first.

use std::collections::{HashMap, VecDeque};

use serde_json::Value;

/// Responses kept at most.
pub const MAX_STORED: usize = 10_000;

/// One stored response and its input items.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The response object.
    pub object: Value,
    /// Its input items (those of the responses it continues first).
    pub input: Vec<Value>,
}

/// The responses this worker keeps.
#[derive(Debug, Default)]
pub struct ResponseStore {
    /// The responses by id.
    pub by_id: HashMap<String, Stored>,
    order: VecDeque<String>,
}

impl ResponseStore {
    /// Keeps `s` as `id` (dropping the oldest past [`MAX_STORED`]).
    pub fn put(&mut self, id: String, s: Stored) {
        if self.by_id.insert(id.clone(), s).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > MAX_STORED {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }

    /// Drops `id`; whether it was there.
    pub fn remove(&mut self, id: &str) -> bool {
        let had = self.by_id.remove(id).is_some();
        if had {
            self.order.retain(|o| o != id);
        }
        had
    }
}
