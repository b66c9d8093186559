//! Following the store's object events: how a gateway that does not host the master
//! answering now (an HA member that follows, or a gateway given `--kv-l3-master-url`)
//! still counts store hits. One task long-polls that master's `GET /api/v1/events` (with
//! the store key, over the gateway's upstream client) into the [`StoreView`] every
//! `kv_aware` policy of the process looks at: a snapshot first, in parts, then the changes.
//!
//! The master to follow is asked anew before each poll ([`FollowedStore::target`]): an HA
//! leader change moves the task to the new leader, whose first answer is a snapshot (a new
//! master instance, a new epoch); while this process leads, the view is emptied and the
//! hosted master answers. A master that cannot be reached keeps the view as it was for
//! [`STALE_AFTER`] failed polls in a row, then empties it and starts over from a snapshot.

use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use kvmaster::Master;
use openapi::master::StoreEvents;
use openapi::routes::Endpoint;
use tokio_util::sync::CancellationToken;
use trust::Secret;

use super::store::{KeyFormat, StoreSource, StoreView};
use crate::client::{Call, HttpClient};

/// Failed polls in a row after which the view is emptied.
pub const STALE_AFTER: u32 = 3;
/// How often a process that follows no master looks again whether it should.
pub const IDLE_CHECK: Duration = Duration::from_secs(1);
/// How long one poll waits for an event before the master answers none.
pub const POLL_WAIT: Duration = Duration::from_secs(5);
/// How much longer than its wait a poll may take before it counts as failed.
pub const POLL_SLACK: Duration = Duration::from_secs(5);
/// Largest answer read: 65 536 events of 4 KiB keys, or a snapshot's part (whole shards of
/// the master's keys). A larger one fails the poll.
pub const BODY_LIMIT: usize = 256 << 20;

/// One followed master (or HA cluster): its place in the events and how to ask.
#[derive(Debug)]
struct Poller {
    http: HttpClient,
    bases: Vec<String>,
    at_base: usize,
    bearer: HeaderValue,
    /// Epoch and sequence number to ask from.
    at: Option<(u64, u64)>,
    /// The next part of a snapshot to ask for.
    cursor: Option<u64>,
}

impl Poller {
    fn new(http: HttpClient, masters: &str, key: &Secret) -> Result<Self, String> {
        let bases: Vec<String> = masters
            .split(',')
            .map(|u| u.trim().trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if bases.is_empty() {
            return Err("no master URL".into());
        }
        for base in bases
            .iter()
            .filter(|b| trust::tls::in_the_clear_off_host(b))
        {
            tracing::warn!(master = %base,
                "the store key goes to a master on another host over plain HTTP; give it an https:// URL");
        }
        let mut bearer = HeaderValue::try_from(format!("Bearer {}", key.expose()))
            .map_err(|_| "the store key is not a valid header value".to_owned())?;
        bearer.set_sensitive(true);
        Ok(Poller {
            http,
            bases,
            at_base: 0,
            bearer,
            at: None,
            cursor: None,
        })
    }

    /// One answer, and whether it starts a snapshot (the view is replaced by it).
    async fn poll(&mut self) -> Result<(bool, StoreEvents), String> {
        let base = &self.bases[self.at_base % self.bases.len()];
        let mut uri = format!(
            "{base}{}?wait_ms={}",
            openapi::routes::master::Events::ROUTE.path,
            POLL_WAIT.as_millis()
        );
        if let Some((epoch, next)) = self.at {
            uri.push_str(&format!("&epoch={epoch}&from={next}"));
            if let Some(c) = self.cursor {
                uri.push_str(&format!("&cursor={c}"));
            }
        }
        let call = Call {
            method: Method::GET,
            uri: uri
                .parse()
                .map_err(|e| format!("master URL {base:?}: {e}"))?,
            bearer: Some(&self.bearer),
            body: Bytes::new(),
            timeout: POLL_WAIT + POLL_SLACK,
            limit: BODY_LIMIT,
        };
        let answer = match self.http.call(call).await {
            Ok((StatusCode::OK, body)) => {
                serde_json::from_slice::<StoreEvents>(&body).map_err(|e| e.to_string())
            }
            Ok((status, body)) => Err(format!(
                "{status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(256)])
            )),
            Err(e) => Err(e),
        };
        let ev = match answer {
            Ok(ev) => ev,
            Err(e) => {
                // Another master of the list may answer (an HA cluster's leader).
                self.at_base += 1;
                return Err(format!("{base}: {e}"));
            }
        };
        let continued = self.cursor.is_some() && self.at.is_some_and(|(e, _)| e == ev.epoch);
        let starts = ev.snapshot && !continued;
        self.at = Some((ev.epoch, ev.next));
        self.cursor = ev.resume;
        Ok((starts, ev))
    }

    /// Forgets the place: the next answer is a snapshot.
    fn restart(&mut self) {
        self.at = None;
        self.cursor = None;
    }
}

/// The store a gateway looks at: the master it hosts while that one answers, else the view
/// of the master that does.
pub struct FollowedStore {
    hosted: Option<Arc<dyn StoreSource>>,
    /// `--kv-l3-master-url`: followed whenever no hosted master answers.
    configured: Option<String>,
    view: Arc<StoreView>,
}

impl std::fmt::Debug for FollowedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowedStore")
            .field("hosted", &self.hosted)
            .field("configured", &self.configured)
            .finish_non_exhaustive()
    }
}

impl FollowedStore {
    /// The store of `hosted` (this process's master, alone or an HA member) when it answers,
    /// else of the master at `configured`, else of the HA leader `hosted` knows.
    pub fn new(hosted: Option<Arc<dyn StoreSource>>, configured: Option<String>) -> Self {
        FollowedStore {
            hosted,
            configured,
            view: Arc::default(),
        }
    }

    /// The view the follower fills.
    pub fn view(&self) -> &Arc<StoreView> {
        &self.view
    }

    /// The master (URL list) to follow now: none while the hosted master answers.
    pub fn target(&self) -> Option<String> {
        if let Some(h) = &self.hosted {
            if h.master().is_some() {
                return None;
            }
            if self.configured.is_none() {
                return h.role().1;
            }
        }
        self.configured.clone()
    }

    /// Follows [`Self::target`] into the view, asking through `http` with `store_key`,
    /// until `stop` is cancelled.
    pub async fn run(
        self: Arc<Self>,
        http: HttpClient,
        keys: KeyFormat,
        store_key: Secret,
        stop: CancellationToken,
    ) {
        let mut current: Option<(String, Poller)> = None;
        let mut failed = 0u32;
        let mut delays = backoff();
        loop {
            let Some(url) = self.target() else {
                if current.take().is_some() {
                    self.view.clear();
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(IDLE_CHECK) => continue,
                }
            };
            if current.as_ref().is_none_or(|(u, _)| *u != url) {
                match Poller::new(http.clone(), &url, &store_key) {
                    Ok(f) => {
                        tracing::info!(master = %url, "following the store's object events");
                        current = Some((url, f));
                    }
                    Err(e) => {
                        tracing::warn!(master = %url, error = %e, "cannot follow the store's events");
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(IDLE_CHECK) => continue,
                        }
                    }
                }
            }
            let Some((url, follower)) = current.as_mut() else {
                continue;
            };
            let polled = tokio::select! {
                _ = stop.cancelled() => return,
                r = follower.poll() => r,
            };
            match polled {
                Ok((starts, ev)) => {
                    failed = 0;
                    delays = backoff();
                    if starts {
                        self.view.replace(&keys, &ev.events);
                        metrics::counter!("moongate_gateway_store_snapshots_total").increment(1);
                    } else {
                        self.view.apply(&keys, &ev.events);
                    }
                    metrics::counter!("moongate_gateway_store_events_total")
                        .increment(ev.events.len() as u64);
                    metrics::gauge!("moongate_gateway_store_view_pages")
                        .set(self.view.len() as f64);
                }
                Err(e) => {
                    failed += 1;
                    tracing::debug!(master = %url, error = %e, failed, "store events poll failed");
                    if failed == STALE_AFTER {
                        tracing::warn!(master = %url, error = %e,
                            "the store's events cannot be followed: not counting store hits until they can");
                        self.view.clear();
                        follower.restart();
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(delays.next().unwrap_or(IDLE_CHECK)) => {}
                    }
                }
            }
        }
    }
}

fn backoff() -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(IDLE_CHECK)
        .without_max_times()
        .build()
}

impl StoreSource for FollowedStore {
    fn master(&self) -> Option<Arc<Master>> {
        self.hosted.as_ref().and_then(|h| h.master())
    }

    fn role(&self) -> (&'static str, Option<String>) {
        match &self.hosted {
            Some(h) => h.role(),
            None => ("follows", self.configured.clone()),
        }
    }

    fn view(&self) -> Option<Arc<StoreView>> {
        Some(self.view.clone())
    }
}
