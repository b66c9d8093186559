//! The master's list-taking request bodies cannot hurt it: property tests over the batch
//! routes, remount, mount and put-start with arbitrary bytes, arbitrary JSON and lists of
//! every length. No panic, never a 5xx, every refusal in the master's error envelope, and a
//! counting allocator shows no request allocating beyond a bound linear in its body (a list
//! longer than `max_batch_items` is refused while it is parsed, not after). The router is
//! driven in-process (`oneshot`): thousands of cases, and every allocation measured is the
//! request's own.
//!
//! One `#[test]`: the allocator's counters are the process's, so nothing else may run while
//! a case is measured.

use std::alloc::System;
use std::sync::Arc;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use kvmaster::{Master, MasterConfig};
use openapi::master as wire;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::ServiceExt;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CLIENT: &str = "00000000-0000-0000-0000-000000000001";

/// Every route whose body holds a list (and the one-object put-start, whose placement
/// config does).
const ROUTES: [&str; 13] = [
    "/api/v1/batch/put-start",
    "/api/v1/batch/put-end",
    "/api/v1/batch/put-revoke",
    "/api/v1/batch/replicas",
    "/api/v1/batch/exists",
    "/api/v1/batch/remove",
    "/api/v1/batch/replica-clear",
    "/api/v1/clients/00000000-0000-0000-0000-000000000001/remount",
    "/api/v1/clients/00000000-0000-0000-0000-000000000002/segments",
    "/api/v1/objects/k/put-start",
    "/api/v1/segments/seg/tier",
    "/api/v1/batch/replica-descs",
    "/api/v1/batch/release-reads",
];

/// What one request did: its status, its body, the bytes it allocated.
struct Outcome {
    status: StatusCode,
    body: Vec<u8>,
    allocated: u64,
}

struct Harness {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
}

impl Harness {
    /// A master with `max_batch_items` and one mounted 64 MiB segment, so puts allocate.
    fn new(max_batch_items: usize) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cfg = MasterConfig {
            max_batch_items,
            ..MasterConfig::default()
        };
        let app: axum::Router = kvmaster::router(Arc::new(Master::new(cfg).unwrap())).into();
        let h = Self { rt, app };
        let spec =
            json!({"name": "seg", "base": 4096, "size": 64 << 20, "endpoint": "127.0.0.1:1"});
        let o = h.post(
            &format!("/api/v1/clients/{CLIENT}/segments"),
            spec.to_string().into_bytes(),
        );
        assert_eq!(o.status, 200, "{}", String::from_utf8_lossy(&o.body));
        h
    }

    /// POSTs `body` as JSON to `path`, counting what the master allocates for it (from the
    /// request's arrival to its answer's last byte).
    fn post(&self, path: &str, body: Vec<u8>) -> Outcome {
        let req = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        let app = self.app.clone();
        let region = Region::new(GLOBAL);
        let (status, body) = self.rt.block_on(async move {
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, body.to_vec())
        });
        let s = region.change();
        let allocated = s.bytes_allocated as u64 + s.bytes_reallocated.max(0) as u64;
        Outcome {
            status,
            body,
            allocated,
        }
    }
}

/// The allocation a request of `body_len` bytes may cost: a constant for the route's
/// fixed work and answers of up to 4096 items, plus a small multiple of the body (its
/// strings, parsed once, are moved, not copied, into the answer).
fn bound(body_len: usize) -> u64 {
    (4 << 20) + 8 * body_len as u64
}

/// The checks every answer passes: a documented status (204: release-reads), never a 5xx
/// but 507 (no room),
/// an error in the master's envelope, an allocation within [`bound`].
fn check(route: &str, body_len: usize, o: &Outcome) -> Result<(), TestCaseError> {
    let code = o.status.as_u16();
    prop_assert!(
        matches!(code, 200 | 204 | 400 | 403 | 404 | 409 | 507),
        "{route}: status {code}: {}",
        String::from_utf8_lossy(&o.body)
    );
    if code != 200 && code != 204 {
        let e: wire::MasterErrorResponse = serde_json::from_slice(&o.body)
            .map_err(|e| TestCaseError::fail(format!("{route}: not the envelope: {e}")))?;
        prop_assert!(e.error.code < 0, "{route}: {:?}", e.error);
    }
    prop_assert!(
        o.allocated <= bound(body_len),
        "{route}: {} bytes allocated for a {body_len}-byte body",
        o.allocated
    );
    Ok(())
}

/// Arbitrary JSON, biased to the master's own field names and to huge and odd numbers.
fn json_value() -> impl Strategy<Value = Value> {
    let name = prop_oneof![
        Just("client_id".to_string()),
        Just("keys".to_string()),
        Just("items".to_string()),
        Just("key".to_string()),
        Just("length".to_string()),
        Just("config".to_string()),
        Just("replica_num".to_string()),
        Just("preferred_segments".to_string()),
        Just("segments".to_string()),
        Just("force".to_string()),
        Just("name".to_string()),
        Just("base".to_string()),
        Just("size".to_string()),
        Just("endpoint".to_string()),
        "[a-z_]{0,12}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!(1e308)),
        Just(json!(u64::MAX)),
        Just(json!(CLIENT)),
        ".{0,24}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            prop::collection::btree_map(name.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn run(runner: &mut TestRunner, strategy: impl Strategy<Value = (usize, Vec<u8>)>, h: &Harness) {
    runner
        .run(&strategy, |(route, body)| {
            let route = ROUTES[route % ROUTES.len()];
            let len = body.len();
            check(route, len, &h.post(route, body))
        })
        .unwrap();
}

#[test]
fn list_bodies_cannot_hurt_the_master() {
    let cfg = Config {
        cases: 384,
        failure_persistence: None,
        ..Config::default()
    };
    let h = Harness::new(MasterConfig::default().max_batch_items);

    // Arbitrary bytes, and arbitrary bytes after a valid-looking start.
    let mut runner = TestRunner::new(cfg.clone());
    let bytes = prop::collection::vec(any::<u8>(), 0..2048);
    run(&mut runner, (any::<usize>(), bytes), &h);
    let prefixed = prop::collection::vec(any::<u8>(), 0..512).prop_map(|tail| {
        let mut b = br#"{"client_id":"00000000-0000-0000-0000-000000000001","keys":["#.to_vec();
        b.extend(tail);
        b
    });
    run(&mut runner, (any::<usize>(), prefixed), &h);

    // Arbitrary JSON documents.
    let docs = json_value().prop_map(|v| serde_json::to_vec(&v).unwrap());
    run(&mut runner, (any::<usize>(), docs), &h);

    // Well-formed bodies with lists of every length around a small limit: accepted up to
    // it, refused beyond it with INVALID_PARAMS naming the limit, on every route.
    let small = Harness::new(16);
    let mut runner = TestRunner::new(cfg);
    runner
        .run(&(any::<usize>(), 0usize..48), |(route, n)| {
            let route = ROUTES[route % ROUTES.len()];
            let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            let segs: Vec<Value> = (0..n)
                .map(|i| json!({"name": format!("s{i}"), "base": 4096, "size": 4096, "endpoint": "e:1"}))
                .collect();
            let body = match route {
                r if r.ends_with("/batch/put-start") => json!({
                    "client_id": CLIENT,
                    "items": keys.iter().map(|k| json!({"key": k, "length": 64})).collect::<Vec<_>>(),
                }),
                r if r.ends_with("/put-end")
                    || r.ends_with("/put-revoke")
                    || r.ends_with("/replica-clear") =>
                {
                    json!({"client_id": CLIENT, "keys": keys})
                }
                r if r.ends_with("/tier") => json!({"client_id": CLIENT, "dropped": keys}),
                r if r.ends_with("/remount") => json!({"segments": segs}),
                r if r.ends_with("/segments") => {
                    json!({"name": "x", "base": 4096, "size": 4096, "endpoint": "e:1"})
                }
                r if r.ends_with("/objects/k/put-start") => json!({
                    "client_id": CLIENT,
                    "length": 64,
                    "config": {"preferred_segments": keys},
                }),
                _ => json!({"keys": keys}),
            };
            let body = body.to_string().into_bytes();
            let len = body.len();
            let o = small.post(route, body);
            check(route, len, &o)?;
            let listed = !route.ends_with("/segments");
            if listed && n > 16 {
                prop_assert_eq!(o.status, StatusCode::BAD_REQUEST, "{} with {} items", route, n);
                let text = String::from_utf8_lossy(&o.body);
                prop_assert!(text.contains("INVALID_PARAMS") && text.contains("more than 16 items"), "{}", text);
            } else if route.ends_with("/release-reads") {
                prop_assert_eq!(o.status, StatusCode::NO_CONTENT, "{} with {} items", route, n);
            } else if route.contains("/batch/") {
                prop_assert_eq!(o.status, StatusCode::OK, "{} with {} items", route, n);
            }
            Ok(())
        })
        .unwrap();

    // A body as large as the master takes, all of it one list of empty keys: 2.8 million
    // items if parsed whole (67 MB of `String`s before the batch limit is even looked at);
    // refused at item 4097 instead, allocating a fraction of the body.
    let limit = kvmaster::rest::BODY_LIMIT;
    for route in ["/api/v1/batch/replicas", "/api/v1/batch/remove"] {
        let mut body = b"{\"keys\":[".to_vec();
        while body.len() + 8 < limit {
            body.extend_from_slice(b"\"\",");
        }
        body.extend_from_slice(b"\"\"]}");
        let len = body.len();
        let o = h.post(route, body);
        assert_eq!(o.status, 400, "{}", String::from_utf8_lossy(&o.body));
        let text = String::from_utf8_lossy(&o.body);
        assert!(text.contains("more than 4096 items"), "{text}");
        assert!(
            o.allocated < 2 << 20,
            "{route}: {} bytes allocated for a {len}-byte list",
            o.allocated
        );
    }
}
