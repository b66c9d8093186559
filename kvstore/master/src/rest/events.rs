//! The object events (`GET /api/v1/events`): the master's feed to the routers that follow
//! the store, long-polled. A caller with no epoch, another epoch, or a position older than
//! the events kept gets a snapshot, in parts of whole shards, then follows on from its
//! `next`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use openapi::master as wire;
use openapi::routes;

use super::{ApiQuery, ApiResult, MasterErrors, blocking, observed};
use crate::master::{Held, MAX_EVENTS_PER_CALL, Master, MasterError, Since};

fn tier(h: Held) -> wire::HeldTier {
    match h {
        Held::Memory => wire::HeldTier::Memory,
        Held::Disk => wire::HeldTier::Disk,
    }
}

fn off() -> MasterError {
    MasterError::InvalidParams("this master keeps no events (--master-events-buffer 0)".into())
}

/// A snapshot's part from shard `cursor`, following on at `next`.
async fn snapshot(
    m: &Arc<Master>,
    next: u64,
    cursor: u64,
    max: usize,
) -> Result<wire::StoreEvents, MasterError> {
    let (held, resume) = blocking(m, move |m| m.held_part(cursor, max)).await?;
    Ok(wire::StoreEvents {
        epoch: m.events_epoch(),
        snapshot: true,
        resume,
        first: next,
        next,
        events: held
            .into_iter()
            .map(|(key, h)| wire::ObjectEvent {
                key,
                held: Some(tier(h)),
            })
            .collect(),
    })
}

/// What the store holds, as changes: a snapshot first (in parts), then each stored, moved
/// or removed key in order. With `wait_ms`, an answer with no event yet is held back until
/// one comes.
#[utoipa::path(get, operation_id = routes::master::Events::OPERATION_ID,
    path = routes::master::Events::PATH, tag = super::TAG,
    params(wire::EventsQuery),
    responses((status = 200, description = "Events or a snapshot's part", body = wire::StoreEvents), MasterErrors))]
pub async fn events(
    State(m): State<Arc<Master>>,
    ApiQuery(q): ApiQuery<wire::EventsQuery>,
) -> ApiResult<Json<wire::StoreEvents>> {
    let epoch = m.events_epoch();
    let max = q.max.unwrap_or(MAX_EVENTS_PER_CALL);
    let wait_ms = q.wait_ms.unwrap_or(0);
    // The document's integers are int64: a position past i64::MAX names nothing here.
    let int64 = [q.epoch, q.from, q.cursor]
        .iter()
        .flatten()
        .all(|&n| i64::try_from(n).is_ok());
    if !(1..=MAX_EVENTS_PER_CALL).contains(&max) || wait_ms > wire::events::MAX_WAIT_MS || !int64 {
        let e = MasterError::InvalidParams(format!(
            "max must be within 1..={MAX_EVENTS_PER_CALL}, wait_ms at most {}, epoch, from \
             and cursor int64",
            wire::events::MAX_WAIT_MS
        ));
        return observed("events", Err(e)).map(Json);
    }
    let wait = Duration::from_millis(wait_ms);
    let ours = q.epoch == Some(epoch);
    let r = match (q.from.filter(|_| ours), q.cursor) {
        (Some(from), Some(cursor)) => snapshot(&m, from, cursor, max).await,
        (Some(from), None) => {
            if !wait.is_zero() {
                m.events_wait(from, wait).await;
            }
            match m.events_since(from, max) {
                Since::Events {
                    first,
                    events,
                    next,
                } => Ok(wire::StoreEvents {
                    epoch,
                    snapshot: false,
                    resume: None,
                    first,
                    next,
                    events: events
                        .into_iter()
                        .map(|e| wire::ObjectEvent {
                            key: e.key.into_string(),
                            held: e.held.map(tier),
                        })
                        .collect(),
                }),
                Since::Off => Err(off()),
                Since::Gone { .. } => match m.events_next() {
                    Some(next) => snapshot(&m, next, 0, max).await,
                    None => Err(off()),
                },
            }
        }
        (None, _) => match m.events_next() {
            Some(next) => snapshot(&m, next, 0, max).await,
            None => Err(off()),
        },
    };
    observed("events", r).map(Json)
}
