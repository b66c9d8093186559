//! How the OpenAPI document states the security the process enforces.
//!
//! [`mark`] (called by [`super::Auth::guard`]) records on every operation of a guarded
//! router which plane it belongs to: `x-moongate-plane: client|store|admin`, which stays in
//! the served document so a reader sees which key an operation takes. [`apply`] then turns
//! the settings in force into the standard fields, operation by operation:
//! - `security`: the schemes that open it (alternatives: the plane's own key, and the admin
//!   key where one is set), or none where no key is checked (client plane without client
//!   keys, admin plane without an admin key);
//! - a `401` answer wherever a key is checked, and the admin plane's `403` (non-loopback
//!   peer) wherever the process has no admin key and is not `--insecure-open-admin`;
//! - `components/securitySchemes`: exactly the schemes some operation names.
//!
//! So `moongate serve` with client keys documents them on inference and without them does
//! not, and a reload that changes the keys changes the document (see `crate::docs`).

use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder};

use super::{AuthSettings, NOT_LOOPBACK, Plane};

/// The extension naming an operation's plane.
pub const PLANE_EXTENSION: &str = "x-moongate-plane";
/// Where [`mark`] keeps the refusals' schema until [`apply`] (never served).
const SCHEMA_EXTENSION: &str = "x-moongate-refusal-schema";

/// Scheme name of the client keys.
pub const CLIENT_SCHEME: &str = "client_api_key";
/// Scheme name of the store key.
pub const STORE_SCHEME: &str = "store_api_key";
/// Scheme name of the admin key.
pub const ADMIN_SCHEME: &str = "admin_api_key";

/// Every operation of a path item.
pub fn operations_mut(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
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

/// Records `plane` and the refusals' body schema `error_schema` on every operation of `doc`.
pub fn mark(doc: &mut OpenApi, plane: Plane, error_schema: &str) {
    for item in doc.paths.paths.values_mut() {
        for op in operations_mut(item) {
            let ext = op.extensions.get_or_insert_with(Extensions::default);
            ext.insert(PLANE_EXTENSION.into(), plane.as_str().into());
            ext.insert(SCHEMA_EXTENSION.into(), error_schema.into());
        }
    }
}

/// The plane [`mark`] recorded on `op`, if any.
pub fn plane_of(op: &Operation) -> Option<Plane> {
    let value = op.extensions.as_ref()?.get(PLANE_EXTENSION)?.as_str()?;
    [Plane::Client, Plane::Store, Plane::Admin]
        .into_iter()
        .find(|p| p.as_str() == value)
}

/// Gives every marked operation of `doc` the security, 401 and 403 that `s` enforces, and
/// the document the schemes they name (see the module doc).
pub fn apply(doc: &mut OpenApi, s: &AuthSettings) {
    let mut used = [false; 3];
    for item in doc.paths.paths.values_mut() {
        for op in operations_mut(item) {
            let Some(plane) = plane_of(op) else { continue };
            let schema = op
                .extensions
                .as_mut()
                .and_then(|e| e.remove(SCHEMA_EXTENSION))
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let schemes = schemes_for(plane, s);
            for (i, name) in [CLIENT_SCHEME, STORE_SCHEME, ADMIN_SCHEME]
                .iter()
                .enumerate()
            {
                used[i] |= schemes.contains(name);
            }
            if !schemes.is_empty() {
                op.security = Some(
                    schemes
                        .iter()
                        .map(|n| SecurityRequirement::new(*n, Vec::<String>::new()))
                        .collect(),
                );
                let what = format!(
                    "Missing or wrong {} (`Authorization: Bearer <key>`)",
                    super::key_name(plane)
                );
                add_response(op, "401", &what, &schema);
            }
            if plane == Plane::Admin && s.admin.is_none() && !s.open_admin {
                let what = format!("The caller is not on loopback: {NOT_LOOPBACK}");
                add_response(op, "403", &what, &schema);
            }
        }
    }
    let components = doc.components.get_or_insert_with(Default::default);
    for (i, name) in [CLIENT_SCHEME, STORE_SCHEME, ADMIN_SCHEME]
        .iter()
        .enumerate()
    {
        if used[i] {
            components.add_security_scheme(*name, scheme(name));
        }
    }
}

/// The schemes that open `plane` under `s` (empty: no key is checked).
fn schemes_for(plane: Plane, s: &AuthSettings) -> Vec<&'static str> {
    let own = match plane {
        Plane::Client if s.client.is_some() => Some(CLIENT_SCHEME),
        Plane::Client | Plane::Open => return Vec::new(),
        Plane::Store => s.store.is_some().then_some(STORE_SCHEME),
        Plane::Admin => None,
    };
    own.into_iter()
        .chain(s.admin.is_some().then_some(ADMIN_SCHEME))
        .collect()
}

/// Adds `status` with `description` and a body of `schema` to `op`; an answer already
/// documented for that status keeps its body and gets the description appended.
fn add_response(op: &mut Operation, status: &str, description: &str, schema: &str) {
    if let Some(RefOr::T(existing)) = op.responses.responses.get_mut(status) {
        existing.description = format!("{} Or: {description}", existing.description);
        return;
    }
    let resp = ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(schema)))
                .build(),
        )
        .build();
    op.responses
        .responses
        .insert(status.to_string(), resp.into());
}

/// The security scheme called `name` (HTTP bearer), described.
fn scheme(name: &str) -> SecurityScheme {
    let mut http = Http::new(HttpAuthScheme::Bearer);
    http.description = Some(
        match name {
            CLIENT_SCHEME => {
                "A client key, one of the lines of `--client-api-keys-file`: the inference \
                 routes (`x-moongate-plane: client`) take it when the server runs with that file."
            }
            STORE_SCHEME => {
                "The store key: `--store-api-key`, or by default the key derived from the \
                 cluster's transfer secret (`--transfer-secret-file`), which storage nodes and \
                 store clients send. The KV master's store plane (`x-moongate-plane: store`) \
                 takes it."
            }
            _ => {
                "The admin key (`--admin-api-key`): the worker API and the KV master's admin \
                 plane (`x-moongate-plane: admin`) take it, and every other plane accepts it too."
            }
        }
        .into(),
    );
    SecurityScheme::Http(http)
}
