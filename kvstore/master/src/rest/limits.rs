//! The limits a master enforces on a whole request, written into the document it serves:
//! the schemas derive their shapes, this puts in the bounds that come from the master's
//! settings (`MasterConfig`) and from its checks, so that a request the document calls
//! valid is one the master takes, and one it calls invalid is refused (a schema-driven
//! fuzzer, schemathesis, holds the two to each other in CI).
//!
//! What a batch refuses item by item (a bad key or length inside a batch is that item's
//! error in a 200 answer) is not written here: those fields stay unconstrained in the
//! document, which says the items' results carry their errors.

use utoipa::openapi::schema::{Array, Object, Schema, SchemaType, Type};
use utoipa::openapi::{OpenApi, RefOr};

use crate::master::{MAX_PREFERRED, MasterConfig};

/// Writes `cfg`'s limits into `doc` (the schemas and the path and query parameters of the
/// master's routes that it holds).
pub fn constrain(doc: &mut OpenApi, cfg: &MasterConfig) {
    let bytes = |n: usize| n as u64;
    integer(
        doc,
        "ReplicateConfig",
        "replica_num",
        1,
        u64::from(cfg.max_replicas),
    );
    items(
        doc,
        "ReplicateConfig",
        "preferred_segments",
        MAX_PREFERRED.min(cfg.max_batch_items),
    );
    string(
        doc,
        "SegmentSpec",
        "name",
        cfg.max_name_bytes,
        Some(SEGMENT_NAME),
    );
    string(doc, "SegmentSpec", "endpoint", cfg.max_name_bytes, None);
    integer(
        doc,
        "SegmentSpec",
        "size",
        cfg.alignment,
        cfg.max_segment_bytes,
    );
    integer(doc, "SegmentSpec", "base", 0, u64::MAX);
    integer(doc, "SegmentSpec", "disk_bytes", 0, u64::MAX);
    integer(doc, "PutStartRequest", "length", 1, cfg.max_object_bytes);
    for schema in ["PutStartRequest", "BatchPutStartRequest"] {
        integer(doc, schema, "put_id", 0, u64::from(u32::MAX));
    }
    integer(doc, "ReserveRequest", "length", 1, cfg.max_object_bytes);
    integer(doc, "ReserveRequest", "count", 0, u64::from(u32::MAX));
    // Checked item by item (an item's error in the answer), so bounded by type only.
    integer(doc, "BatchPutStartItem", "length", 0, u64::MAX);
    integer(doc, "PutCommitItem", "length", 0, u64::MAX);
    integer(doc, "PutCommitItem", "reservation", 0, u64::MAX);
    for (schema, list) in [
        ("BatchPutStartRequest", "items"),
        ("BatchPutCommitRequest", "items"),
        ("BatchClientKeysRequest", "keys"),
        ("BatchKeysRequest", "keys"),
        ("BatchRemoveRequest", "keys"),
        ("RemountRequest", "segments"),
    ] {
        items(doc, schema, list, cfg.max_batch_items);
    }
    for (param, max) in [
        ("key", bytes(cfg.max_key_bytes)),
        ("name", bytes(cfg.max_name_bytes)),
    ] {
        parameters(doc, param, |s| {
            s.min_length = Some(1);
            s.max_length = Some(max as usize);
        });
    }
    parameters(doc, "limit", |s| {
        s.minimum = Some(1.into());
        s.maximum = Some((cfg.list_max_limit as u64).into());
    });
}

/// A segment name: no `/`, no control character (`Master`'s mount check).
const SEGMENT_NAME: &str = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$";

/// The schema of property `prop` of component `schema`: `None` when `doc` has no such
/// component (a router of the other plane); a component without that property is a bug.
fn property<'a>(doc: &'a mut OpenApi, schema: &str, prop: &str) -> Option<&'a mut Schema> {
    let components = doc.components.as_mut()?;
    let RefOr::T(Schema::Object(o)) = components.schemas.get_mut(schema)? else {
        panic!("{schema} is not an object schema");
    };
    match o.properties.get_mut(prop) {
        Some(RefOr::T(s)) => Some(s),
        _ => panic!("{schema} has no inline property {prop}"),
    }
}

/// The object (scalar) schema inside `s`: itself, or the non-null branch of a `oneOf`.
fn scalar(s: &mut Schema) -> Option<&mut Object> {
    match s {
        Schema::Object(o) => Some(o),
        Schema::OneOf(one) => one.items.iter_mut().find_map(|i| match i {
            RefOr::T(Schema::Object(o)) if o.schema_type != SchemaType::Type(Type::Null) => Some(o),
            _ => None,
        }),
        _ => None,
    }
}

fn integer(doc: &mut OpenApi, schema: &str, prop: &str, min: u64, max: u64) {
    let Some(s) = property(doc, schema, prop) else {
        return;
    };
    let o = scalar(s).unwrap_or_else(|| panic!("{schema}.{prop} is not a scalar"));
    // Without a format bound: the value is a u64, wider than `int64` says.
    o.format = None;
    o.minimum = Some(min.into());
    o.maximum = Some(max.into());
}

fn string(doc: &mut OpenApi, schema: &str, prop: &str, max: usize, pattern: Option<&str>) {
    let Some(s) = property(doc, schema, prop) else {
        return;
    };
    let o = scalar(s).unwrap_or_else(|| panic!("{schema}.{prop} is not a scalar"));
    o.min_length = Some(1);
    o.max_length = Some(max);
    if let Some(p) = pattern {
        o.pattern = Some(p.to_owned());
    }
}

fn items(doc: &mut OpenApi, schema: &str, prop: &str, max: usize) {
    match property(doc, schema, prop) {
        None => {}
        Some(Schema::Array(Array { max_items, .. })) => *max_items = Some(max),
        Some(_) => panic!("{schema}.{prop} is not a list"),
    }
}

/// Applies `f` to the schema of every parameter named `name` of the REST API's routes.
fn parameters(doc: &mut OpenApi, name: &str, f: impl Fn(&mut Object)) {
    for (path, item) in doc.paths.paths.iter_mut() {
        if !path.starts_with("/api/v1/") {
            continue;
        }
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in ops.into_iter().flatten() {
            for p in op.parameters.iter_mut().flatten() {
                if let RefOr::T(p) = p
                    && p.name == name
                    && let Some(RefOr::T(s)) = &mut p.schema
                    && let Some(o) = scalar(s)
                {
                    f(o);
                }
            }
        }
    }
}
