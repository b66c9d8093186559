//! The admin API key (`--admin-api-key`): which routes need it, how it is checked, and how
//! the OpenAPI document says so.
//!
//! [`AdminKey::guard`] is the one place both happen for a group of routes: it layers the
//! check onto every route of an `OpenApiRouter` and marks every operation of that router's
//! document with the [`SECURITY_SCHEME`] requirement and a 401 answer. The worker API and the
//! KV master's routes are guarded; inference, health, metrics and the docs are not.
//!
//! The document always carries the requirement, whether or not this process was started
//! with a key: it describes the API (admin operations take the admin key), and a client that
//! sends the header works against both. Without a key no check runs at all.
//!
//! The key is compared in constant time (the time depends on the configured key's length
//! only) and is never logged: [`AdminKey`]'s `Debug` says only whether one is set.

use std::fmt;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use http::{HeaderMap, HeaderValue, header};
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, ResponseBuilder};
use utoipa_axum::router::OpenApiRouter;

use crate::config::Secret;

/// Name of the admin key's security scheme in the OpenAPI document.
pub const SECURITY_SCHEME: &str = "admin_api_key";

/// The configured admin key, or none (every request admitted). Cheap to clone.
#[derive(Clone, Default)]
pub struct AdminKey(Option<Arc<[u8]>>);

impl fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.0.is_some() { "set" } else { "unset" };
        write!(f, "AdminKey({state})")
    }
}

/// What a guarded route answers a request without the key: the error envelope of the
/// component that owns the route, and the schema the document names for it.
#[derive(Clone, Copy, Debug)]
pub struct Rejection {
    /// Builds the 401 response (status and body; `WWW-Authenticate` is added).
    pub respond: fn() -> Response,
    /// Name of the body's schema under `components/schemas`.
    pub schema: &'static str,
}

#[derive(Clone)]
struct Gate {
    key: AdminKey,
    reject: Rejection,
}

impl AdminKey {
    /// The key from the configuration (`None`: no key, nothing is checked).
    pub fn new(key: Option<&Secret>) -> Self {
        Self(key.map(|k| Arc::from(k.expose().as_bytes())))
    }

    /// Whether a key is configured.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Whether `headers` carry `Authorization: Bearer <key>` (always true without a key).
    /// The scheme name is case-insensitive (RFC 9110); the key is compared in constant time.
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(key) = &self.0 else {
            return true;
        };
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| bearer_token(v.as_bytes()))
            .is_some_and(|token| constant_time_eq(token, key))
    }

    /// Requires the key on every route of `routes` (answering `reject` otherwise) and marks
    /// every operation of its document as needing it, with a 401 answer.
    pub fn guard<S>(&self, mut routes: OpenApiRouter<S>, reject: Rejection) -> OpenApiRouter<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        mark_secured(routes.get_openapi_mut(), reject.schema);
        if !self.is_set() {
            return routes;
        }
        let gate = Gate {
            key: self.clone(),
            reject,
        };
        routes.route_layer(middleware::from_fn_with_state(gate, check))
    }
}

async fn check(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    if gate.key.admits(req.headers()) {
        return next.run(req).await;
    }
    // Never the header's value: it may be a real key meant for something else.
    tracing::debug!(method = %req.method(), path = req.uri().path(), "admin key missing or wrong");
    let mut resp = (gate.reject.respond)();
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// The token of an `Authorization: Bearer <token>` value.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    if value.len() <= SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &value[SCHEME.len()..];
    let token = rest.trim_ascii_start();
    (token.len() < rest.len() && !token.is_empty()).then_some(token.trim_ascii_end())
}

/// `given == expected`, in time that depends on `expected.len()` only, never on where the
/// two differ.
fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!e);
        diff |= usize::from(g ^ e);
    }
    std::hint::black_box(diff) == 0
}

/// Every operation of a path item.
fn operations_mut(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
        &mut item.query,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

/// Gives every operation of `doc` the admin security requirement and a 401 answer whose
/// body is the schema `error_schema`.
fn mark_secured(doc: &mut OpenApi, error_schema: &str) {
    for item in doc.paths.paths.values_mut() {
        for op in operations_mut(item) {
            op.security = Some(vec![SecurityRequirement::new(
                SECURITY_SCHEME,
                Vec::<String>::new(),
            )]);
            let unauthorized = ResponseBuilder::new()
                .description("Missing or wrong admin API key (`Authorization: Bearer <key>`)")
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name(error_schema)))
                        .build(),
                )
                .build();
            op.responses
                .responses
                .insert("401".to_string(), unauthorized.into());
        }
    }
}

/// The admin key's security scheme (HTTP bearer), for the document's components.
pub fn security_scheme() -> SecurityScheme {
    let mut http = Http::new(HttpAuthScheme::Bearer);
    http.description = Some(
        "The admin API key (`--admin-api-key`). Required by the worker API and the KV \
         master's routes when the server runs with a key; otherwise not checked."
            .into(),
    );
    SecurityScheme::Http(http)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    #[test]
    fn only_the_exact_bearer_key_is_admitted() {
        let key = AdminKey::new(Some(&Secret::new("k3y-Value")));
        assert!(key.admits(&headers(Some("Bearer k3y-Value"))));
        assert!(key.admits(&headers(Some("bearer   k3y-Value "))));
        for bad in [
            None,
            Some(""),
            Some("Bearer"),
            Some("Bearer "),
            Some("Bearerk3y-Value"),
            Some("Basic k3y-Value"),
            Some("Bearer k3y-valuE"),
            Some("Bearer k3y-Value2"),
            Some("Bearer k3y-Valu"),
            Some("k3y-Value"),
        ] {
            assert!(!key.admits(&headers(bad)), "{bad:?} admitted");
        }
        let open = AdminKey::new(None);
        assert!(open.admits(&headers(None)) && open.admits(&headers(Some("Basic x"))));
    }

    #[test]
    fn constant_time_eq_is_equality() {
        for (a, b) in [
            (&b""[..], &b""[..]),
            (b"a", b"a"),
            (b"abc", b"abd"),
            (b"ab", b"abc"),
            (b"abc", b"ab"),
            (b"\xff", b"\x00"),
        ] {
            assert_eq!(constant_time_eq(a, b), a == b, "{a:?} {b:?}");
        }
    }

    #[test]
    fn debug_never_shows_the_key() {
        let key = AdminKey::new(Some(&Secret::new("topsecret")));
        assert_eq!(format!("{key:?}"), "AdminKey(set)");
    }
}
