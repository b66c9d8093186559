//! The OpenAPI document and Swagger UI, for every process that serves an HTTP API
//! (`moongate serve`, with or without the KV master, and `moongate master`).
//!
//! [`documented`] takes the process's documented routes (an `OpenApiRouter` whose every
//! route came from `#[utoipa::path]`), adds the documentation routes, which are themselves
//! documented, splits the router from its document, finishes the document (only the tags
//! in use; the security the process enforces, from [`crate::auth::openapi`]) and serves
//! exactly that document:
//! - `GET /api-docs/openapi.json` (and `GET /openapi.json`, the same bytes);
//! - `GET /docs` -> `/docs/`: Swagger UI, from the assets compiled into the binary
//!   (`utoipa-swagger-ui`'s `vendored` feature: nothing is downloaded at build or run time;
//!   the UI's online validator is off, so the page fetches nothing but this document).
//!
//! The keys in force can change at run time (a reload): the document is rendered again,
//! on the first request after a change, from the same routes and the new settings.
//!
//! The committed `openapi/openapi.json` is `moongate serve`'s document with the default
//! settings; `moongate openapi` prints it ([`crate::launch::document`]).

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use parking_lot::Mutex;
use utoipa::openapi::OpenApi;
use utoipa::openapi::tag::{Tag, TagBuilder};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_swagger_ui::Config;

use crate::auth::Auth;
use crate::error::GatewayError;

/// Where the document is served.
pub const OPENAPI_PATH: &str = "/api-docs/openapi.json";
/// Where Swagger UI is served.
pub const DOCS_PATH: &str = "/docs";
/// OpenAPI tag of the documentation routes.
pub const TAG: &str = "docs";

/// What Swagger UI's pages may load: their own files and this server's document, nothing
/// from elsewhere (the browser enforces it; inline styles are Swagger UI's own).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; \
    connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'";

/// The document before the security in force is applied, its last rendering, and the UI's
/// settings, shared by the documentation handlers.
struct Docs {
    /// Set once the routes (these handlers among them) are split from their document.
    base: OnceLock<OpenApi>,
    auth: Auth,
    /// The JSON served, and the [`Auth::generation`] it was rendered for.
    rendered: Mutex<Option<(u64, Bytes)>>,
    ui: Arc<Config<'static>>,
}

impl Docs {
    /// The document with the security in force now.
    fn document(&self) -> OpenApi {
        let mut doc = self.base.get().cloned().unwrap_or_default();
        crate::auth::openapi::apply(&mut doc, &self.auth.settings());
        doc
    }

    /// The JSON to serve (rendered again when the settings moved since).
    fn json(&self) -> Bytes {
        let generation = self.auth.generation();
        let mut cached = self.rendered.lock();
        match &*cached {
            Some((g, json)) if *g == generation => json.clone(),
            _ => {
                let json = self.document().to_json().unwrap_or_else(|e| {
                    tracing::error!(error = %e, "cannot render the OpenAPI document");
                    "{}".into()
                });
                let json = Bytes::from(json);
                *cached = Some((generation, json.clone()));
                json
            }
        }
    }
}

/// Adds the documentation routes to `api`, then returns the router and the finished
/// document it serves now (it follows `auth`'s settings from then on).
pub fn documented(api: OpenApiRouter, auth: &Auth) -> (Router, OpenApi) {
    let docs = Arc::new(Docs {
        base: OnceLock::new(),
        auth: auth.clone(),
        rendered: Mutex::new(None),
        ui: Arc::new(
            Config::new([OPENAPI_PATH])
                .validator_url("none")
                .display_operation_id(true)
                .persist_authorization(true),
        ),
    });
    let routes = OpenApiRouter::new()
        .routes(routes!(openapi_json))
        .routes(routes!(openapi_json_alias))
        .routes(routes!(swagger_ui_root))
        .routes(routes!(swagger_ui_index))
        .routes(routes!(swagger_ui_file))
        .with_state(docs.clone());
    let (router, mut base) = api.merge(routes).split_for_parts();
    finish(&mut base);
    let _ = docs.base.set(base);
    (router, docs.document())
}

/// Every tag an operation may carry, in the order the document lists them.
const TAGS: &[(&str, &str)] = &[
    (
        "inference",
        "OpenAI and SGLang inference routes, proxied to workers",
    ),
    ("workers", "Worker registration and status (admin plane)"),
    (
        kvmaster::rest::TAG,
        "The KV-cache master: segments, objects, replicas, leases, eviction, and the \
         transfer-metadata store (store plane; cluster-wide reads and bulk removal: admin \
         plane; see each operation's x-moongate-plane)",
    ),
    ("ops", "Health, readiness, metrics"),
    (TAG, "This document and Swagger UI"),
];

/// Lists the tags the operations use (a process that does not mount a component does not
/// list its tag).
fn finish(doc: &mut OpenApi) {
    let mut used: Vec<String> = Vec::new();
    for item in doc.paths.paths.values() {
        let ops = [
            &item.get,
            &item.put,
            &item.post,
            &item.delete,
            &item.patch,
            &item.head,
            &item.options,
            &item.trace,
            &item.query,
        ];
        for tag in ops
            .into_iter()
            .flatten()
            .flat_map(|op| op.tags.iter().flatten())
        {
            if !used.contains(tag) {
                used.push(tag.clone());
            }
        }
    }
    let known = TAGS
        .iter()
        .filter(|(name, _)| used.iter().any(|u| u == name));
    let mut tags: Vec<Tag> = known
        .map(|(name, description)| {
            TagBuilder::new()
                .name(*name)
                .description(Some(*description))
                .build()
        })
        .collect();
    // A tag missing from the list still shows up, without a description.
    for name in used.iter().filter(|u| !TAGS.iter().any(|(n, _)| n == u)) {
        tags.push(TagBuilder::new().name(name.clone()).build());
    }
    doc.tags = Some(tags);
}

fn json_response(docs: &Docs) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        docs.json(),
    )
        .into_response()
}

/// This OpenAPI document.
#[utoipa::path(get, operation_id = openapi::routes::docs::OpenapiJson::OPERATION_ID,
    path = openapi::routes::docs::OpenapiJson::PATH, tag = TAG,
    responses((status = 200, description = "The OpenAPI document of every route this process serves",
               body = Object, content_type = "application/json")))]
async fn openapi_json(State(docs): State<Arc<Docs>>) -> Response {
    json_response(&docs)
}

/// The same document at its earlier address.
#[utoipa::path(get, operation_id = openapi::routes::docs::OpenapiJsonAlias::OPERATION_ID,
    path = openapi::routes::docs::OpenapiJsonAlias::PATH, tag = TAG,
    responses((status = 200, description = "The same bytes as /api-docs/openapi.json",
               body = Object, content_type = "application/json")))]
async fn openapi_json_alias(State(docs): State<Arc<Docs>>) -> Response {
    json_response(&docs)
}

/// Swagger UI's address; redirects to `/docs/`.
#[utoipa::path(get, operation_id = openapi::routes::docs::SwaggerUiRoot::OPERATION_ID,
    path = openapi::routes::docs::SwaggerUiRoot::PATH, tag = TAG,
    responses((status = 303, description = "Redirect to /docs/",
               headers(("location" = String, description = "/docs/")))))]
async fn swagger_ui_root() -> Redirect {
    Redirect::to("/docs/")
}

/// Swagger UI over this document.
#[utoipa::path(get, operation_id = openapi::routes::docs::SwaggerUiIndex::OPERATION_ID,
    path = openapi::routes::docs::SwaggerUiIndex::PATH, tag = TAG,
    responses((status = 200, description = "Swagger UI (HTML)", content_type = "text/html")))]
async fn swagger_ui_index(State(docs): State<Arc<Docs>>) -> Response {
    swagger_file(&docs, "")
}

/// A file of Swagger UI (scripts, styles, icons), compiled into the binary.
#[utoipa::path(get, operation_id = openapi::routes::docs::SwaggerUiFile::OPERATION_ID,
    path = openapi::routes::docs::SwaggerUiFile::PATH, tag = TAG,
    params(("file" = String, Path, description = "File name, e.g. swagger-ui-bundle.js")),
    responses(
        (status = 200, description = "The file"),
        (status = 404, description = "No such file"),
    ))]
async fn swagger_ui_file(State(docs): State<Arc<Docs>>, Path(file): Path<String>) -> Response {
    swagger_file(&docs, &file)
}

fn swagger_file(docs: &Docs, file: &str) -> Response {
    match utoipa_swagger_ui::serve(file, docs.ui.clone()) {
        Ok(Some(f)) => {
            let mut resp = (StatusCode::OK, f.bytes.into_owned()).into_response();
            resp.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            );
            if let Ok(ct) = HeaderValue::try_from(f.content_type) {
                resp.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            if f.gzpipped {
                resp.headers_mut()
                    .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            resp
        }
        Ok(None) => GatewayError::RouteNotFound(format!("GET {DOCS_PATH}/{file}")).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "Swagger UI file");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
