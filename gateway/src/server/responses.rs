//! The Responses API's routes by id: retrieve, delete, cancel and input items of a
//! response, each sent to the worker holding it (SGLang keeps responses in the memory of
//! the worker that made them). The gateway remembers the worker of each response it
//! relayed ([`crate::select::responses::ResponseHomes`]); for an id it does not know (made
//! through another gateway replica, or before a restart) it asks the ready workers and
//! remembers the one that has it; an id none had is answered 404 without asking them again
//! for a few seconds ([`crate::select::responses::MISS_TTL`]), so repeating unknown ids
//! cannot make the gateway ask every worker on each call. A response whose worker has
//! left is a 404 (`response_not_found`), as is an id no worker knows.
//!
//! `POST /v1/responses` itself is proxied like the other inference routes
//! ([`super::inference`]); a `previous_response_id` there is routed the same way.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http::{Method, StatusCode};
use openapi::error::ErrorResponse;
use openapi::openai::responses::{ResponseInputItems, ResponseObject};
use openapi::routes::gateway as routes;
use openapi::workers::WorkerType;

use super::AppState;
use super::fanout::{ask, asking};
use crate::error::GatewayError;
use crate::proxy::envelope::small_answer;
use crate::select::affinity::is_target;
use crate::select::responses::MAX_RESPONSE_ID_LEN;
use crate::workers::Worker;

/// The most of a worker's answer read for a response route.
pub const RESPONSE_LIMIT: usize = 64 * 1024 * 1024;

/// Whether `id` can be a response id: bounded, and only characters that need no escaping
/// in a path (SGLang's are `resp_` and hex digits).
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RESPONSE_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn not_found(id: &str, previous: bool) -> GatewayError {
    GatewayError::ResponseNotFound {
        id: id.chars().take(MAX_RESPONSE_ID_LEN).collect(),
        previous,
    }
}

/// The worker holding response `id`: the one remembered, or the first ready regular
/// worker that has it. `Err` when the remembered worker left (forgotten then) or none has
/// it.
pub(super) async fn home_of(
    st: &AppState,
    id: &str,
    previous: bool,
) -> Result<Arc<Worker>, GatewayError> {
    if !valid_id(id) {
        return Err(not_found(id, previous));
    }
    let snapshot = st.registry().snapshot();
    if let Some(url) = st.homes().home(id) {
        // With `--dp-aware` the URL has an entry per rank; they share the worker's store.
        let ranks = snapshot.iter().filter(|w| is_target(w, &url));
        return match ranks.min_by_key(|w| (!w.is_available(), w.load())) {
            Some(w) => Ok(w.clone()),
            None => {
                st.homes().forget(id);
                Err(not_found(id, previous))
            }
        };
    }
    if st.homes().recently_missed(id) {
        return Err(not_found(id, previous));
    }
    let ready = st
        .registry()
        .one_per_url_where(|w| w.worker_type() == WorkerType::Regular && w.is_available());
    let path = format!("{}/{id}", routes::Responses::PATH);
    let mut answers = asking(
        st,
        &ready,
        Method::GET,
        &path,
        Default::default(),
        64 * 1024,
    )
    .enumerate();
    while let Some((i, answer)) = answers.next().await {
        if matches!(answer, Ok((s, _)) if s.is_success()) {
            let w = ready[i].clone();
            st.homes().bind(id, w.url().as_str());
            return Ok(w);
        }
    }
    st.homes().missed(id);
    Err(not_found(id, previous))
}

/// `method /v1/responses/{id}{suffix}` (with the client's query) on the worker holding it.
async fn on_home(
    st: &AppState,
    method: Method,
    id: &str,
    suffix: &str,
    query: Option<String>,
) -> Response {
    if st.pd_router().is_some() {
        return GatewayError::NotInPdMode(routes::Responses::PATH).into_response();
    }
    let worker = match home_of(st, id, false).await {
        Ok(w) => w,
        Err(e) => return e.into_response(),
    };
    let mut path = format!("{}/{id}{suffix}", routes::Responses::PATH);
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        path.push('?');
        path.push_str(&q);
    }
    let timeout = Duration::from_secs(st.config().request_timeout_secs);
    let deleted = method == Method::DELETE;
    match ask(
        st,
        &worker,
        method,
        &path,
        Default::default(),
        timeout,
        RESPONSE_LIMIT,
    )
    .await
    {
        Ok((status, body)) => {
            if deleted && (status.is_success() || status == StatusCode::NOT_FOUND) {
                st.homes().forget(id);
            }
            small_answer(status, body)
        }
        Err(cause) => {
            worker.record_failure();
            GatewayError::WorkerUnreachable {
                worker: worker.url().as_str().to_string(),
                cause,
            }
            .into_response()
        }
    }
}

/// The errors of the routes by id.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // a description for the OpenAPI document, never built
enum ByIdErrors {
    /// Unknown id.
    #[response(
        status = 404,
        description = "No worker holds the response (`response_not_found`): unknown, deleted, or its worker has left"
    )]
    NotFound(ErrorResponse),
    /// PD mode.
    #[response(
        status = 501,
        description = "PD mode serves no Responses API (`not_served_in_pd_mode`)"
    )]
    NotInPd(ErrorResponse),
    /// Worker unreachable.
    #[response(status = 502, description = "The worker holding it is unreachable")]
    BadGateway(ErrorResponse),
    /// The worker's own error.
    #[response(
        status = "default",
        description = "The worker's own error status (a worker that does not serve this route answers 404 or 405), its message in the OpenAI envelope"
    )]
    Worker(ErrorResponse),
}

/// A response, from the worker holding it.
#[utoipa::path(get, operation_id = routes::GetResponse::OPERATION_ID,
    path = routes::GetResponse::PATH, tag = "inference",
    params(("response_id" = String, Path, description = "The response's id (`resp_...`)")),
    responses(
        (status = 200, description = "The response, as its worker keeps it", body = ResponseObject),
        ByIdErrors,
    ))]
pub async fn get_response(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    on_home(&st, Method::GET, &id, "", None).await
}

/// Deletes a response on the worker holding it (and forgets where it was).
#[utoipa::path(delete, operation_id = routes::DeleteResponse::OPERATION_ID,
    path = routes::DeleteResponse::PATH, tag = "inference",
    params(("response_id" = String, Path, description = "The response's id")),
    responses((status = 200, description = "Deleted, as the worker answered"), ByIdErrors))]
pub async fn delete_response(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    on_home(&st, Method::DELETE, &id, "", None).await
}

/// Cancels a background response on the worker holding it.
#[utoipa::path(post, operation_id = routes::CancelResponse::OPERATION_ID,
    path = routes::CancelResponse::PATH, tag = "inference",
    params(("response_id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "The cancelled response", body = ResponseObject),
        ByIdErrors,
    ))]
pub async fn cancel_response(State(st): State<AppState>, Path(id): Path<String>) -> Response {
    on_home(&st, Method::POST, &id, "/cancel", None).await
}

/// The input items of a response, from the worker holding it (the query, `limit`,
/// `after`, `order`, is passed on).
#[utoipa::path(get, operation_id = routes::ResponseInputItemsRoute::OPERATION_ID,
    path = routes::ResponseInputItemsRoute::PATH, tag = "inference",
    params(("response_id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "The input items", body = ResponseInputItems),
        ByIdErrors,
    ))]
pub async fn input_items(
    State(st): State<AppState>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    on_home(&st, Method::GET, &id, "/input_items", query).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_need_no_escaping() {
        assert!(valid_id("resp_0123abcdef"));
        assert!(valid_id("a.b-c_d"));
        for bad in ["", "a/b", "a?b", "a%2fb", "a b", "é"] {
            assert!(!valid_id(bad), "{bad}");
        }
        assert!(!valid_id(&"a".repeat(MAX_RESPONSE_ID_LEN + 1)));
    }
}
