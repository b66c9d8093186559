//! Where each response lives: a Responses API response (and the conversation state a
//! `previous_response_id` follow-up continues) is kept by the worker that made it, so the
//! gateway remembers response id -> worker and sends that response's retrieve, delete,
//! cancel, input items and follow-ups there.
//!
//! Memory is bounded: at most `max_ids` ids (the least recently used is forgotten first),
//! each at most [`MAX_RESPONSE_ID_LEN`] bytes (a longer id is never remembered; the
//! gateway finds its worker by asking them, as for any id it does not know).
//!
//! An id no worker had is remembered as missing for [`MISS_TTL`] (at most
//! [`MAX_MISSES`] of them), so a client repeating unknown ids cannot make the gateway ask
//! every worker on each call.

use std::time::Duration;

use hashlink::LruCache;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::ServeConfig;

/// Longest response id remembered, in bytes (SGLang's are `resp_` and 32 hex digits).
pub const MAX_RESPONSE_ID_LEN: usize = 256;

/// How long an id no worker had is answered 404 without asking them again.
pub const MISS_TTL: Duration = Duration::from_secs(5);
/// Missing ids remembered at most.
pub const MAX_MISSES: usize = 10_000;

/// Response id -> the URL of the worker holding it.
#[derive(Debug)]
pub struct ResponseHomes {
    homes: Mutex<LruCache<Box<str>, Box<str>>>,
    misses: Mutex<LruCache<Box<str>, Instant>>,
}

impl Default for ResponseHomes {
    fn default() -> Self {
        Self::from(&ServeConfig::default())
    }
}

impl From<&ServeConfig> for ResponseHomes {
    fn from(c: &ServeConfig) -> Self {
        Self::new(c.responses_max_ids)
    }
}

impl ResponseHomes {
    /// An empty table of at most `max_ids` ids.
    pub fn new(max_ids: usize) -> Self {
        Self {
            homes: Mutex::new(LruCache::new(max_ids.max(1))),
            misses: Mutex::new(LruCache::new(MAX_MISSES)),
        }
    }

    /// Remembers that `worker` holds response `id` (ignored when `id` is empty or too long).
    pub fn bind(&self, id: &str, worker: &str) {
        if id.is_empty() || id.len() > MAX_RESPONSE_ID_LEN {
            return;
        }
        self.misses.lock().remove(id);
        self.homes.lock().insert(id.into(), worker.into());
    }

    /// Remembers that no worker had `id` (for [`MISS_TTL`]).
    pub fn missed(&self, id: &str) {
        if !id.is_empty() && id.len() <= MAX_RESPONSE_ID_LEN {
            self.misses.lock().insert(id.into(), Instant::now());
        }
    }

    /// Whether no worker had `id` within the last [`MISS_TTL`].
    pub fn recently_missed(&self, id: &str) -> bool {
        let mut misses = self.misses.lock();
        match misses.get(id) {
            Some(at) if at.elapsed() < MISS_TTL => true,
            Some(_) => {
                misses.remove(id);
                false
            }
            None => false,
        }
    }

    /// The worker URL holding response `id`, if known.
    pub fn home(&self, id: &str) -> Option<String> {
        self.homes.lock().get(id).map(|w| w.to_string())
    }

    /// Forgets response `id` (deleted).
    pub fn forget(&self, id: &str) {
        self.homes.lock().remove(id);
    }

    /// Ids remembered.
    pub fn len(&self) -> usize {
        self.homes.lock().len()
    }

    /// Whether no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_by_count_and_length() {
        let homes = ResponseHomes::new(2);
        homes.bind("resp_a", "http://w1");
        homes.bind("resp_b", "http://w2");
        assert_eq!(homes.home("resp_a").as_deref(), Some("http://w1"));
        homes.bind("resp_c", "http://w1"); // evicts b, the least recently used
        assert_eq!(homes.home("resp_b"), None);
        assert_eq!(homes.len(), 2);
        homes.bind(&"x".repeat(MAX_RESPONSE_ID_LEN + 1), "http://w1");
        homes.bind("", "http://w1");
        assert_eq!(homes.len(), 2);
        homes.forget("resp_a");
        assert_eq!(homes.home("resp_a"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn misses_are_remembered_briefly() {
        let homes = ResponseHomes::new(8);
        assert!(!homes.recently_missed("resp_x"));
        homes.missed("resp_x");
        assert!(homes.recently_missed("resp_x"));
        tokio::time::advance(MISS_TTL).await;
        assert!(
            !homes.recently_missed("resp_x"),
            "asked again after the TTL"
        );
        homes.missed("resp_y");
        homes.bind("resp_y", "http://w");
        assert!(!homes.recently_missed("resp_y"), "found since");
    }
}
