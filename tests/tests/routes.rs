//! Every route is declared once (`openapi::routes`), and three parties read the
//! declarations: the servers' routers and documents, and the store client's calls. These
//! tests fail when any of them disagrees with the declarations:
//! - the document `moongate serve` serves and the one `moongate master` serves name
//!   exactly the declared routes, each with its operation id, plane, body, query and answer;
//! - a store client driven through every call it makes sends only declared routes, each
//!   with the declared method, to a real master, which answers it (no 404 / 405).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::{self, Next};
use gateway::config::{MasterHostConfig, ServeConfig};
use kvclient::{ClientConfig, StoreClient};
use kvmaster::{Master, MasterConfig, MasterServer};
use openapi::routes::{self, Plane, Route};
use parking_lot::Mutex;
use serde_json::Value;

/// Every operation of `doc`: (METHOD, path) -> the operation.
fn operations(doc: &Value) -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            out.insert((method.to_uppercase(), path.clone()), op.clone());
        }
    }
    out
}

/// The schema a content entry names: its `$ref`'s last part.
fn schema_ref(content: &Value) -> Option<String> {
    content["schema"]["$ref"]
        .as_str()
        .map(|r| r.rsplit('/').next().unwrap_or(r).to_owned())
}

/// What `doc` says of `route`, checked against the declaration; the problems found.
fn check(route: &Route, op: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let name = format!("{} {}", route.method.as_str(), route.path);
    if op["operationId"] != route.operation_id {
        bad.push(format!(
            "{name}: operationId {} != {}",
            op["operationId"], route.operation_id
        ));
    }
    let plane = op["x-moongate-plane"].as_str().unwrap_or("open");
    if plane != route.plane.as_str() {
        bad.push(format!("{name}: plane {plane} != {}", route.plane));
    }
    let body = op["requestBody"]["content"]["application/json"].clone();
    let body = if body.is_null() {
        None
    } else {
        schema_ref(&body)
    };
    if body.as_deref() != route.body {
        bad.push(format!("{name}: request body {body:?} != {:?}", route.body));
    }
    let queries = op["parameters"]
        .as_array()
        .map_or(0, |ps| ps.iter().filter(|p| p["in"] == "query").count());
    if (queries > 0) != route.query.is_some() {
        bad.push(format!(
            "{name}: {queries} query parameters, declared {:?}",
            route.query
        ));
    }
    let params = op["parameters"]
        .as_array()
        .map_or(0, |ps| ps.iter().filter(|p| p["in"] == "path").count());
    if params != route.params() {
        bad.push(format!(
            "{name}: {params} path parameters, the path has {}",
            route.params()
        ));
    }
    let ok = ["200", "201", "202"]
        .iter()
        .find_map(|s| op["responses"].get(*s))
        .cloned()
        .unwrap_or(Value::Null);
    let answer = schema_ref(&ok["content"]["application/json"]);
    if answer.as_deref() != route.response {
        bad.push(format!("{name}: answer {answer:?} != {:?}", route.response));
    }
    bad
}

/// `doc` describes exactly `declared`, each route as declared.
fn assert_describes(doc: &Value, declared: &[&[Route]]) {
    let ops = operations(doc);
    let all: Vec<&Route> = declared.iter().flat_map(|d| d.iter()).collect();
    let mut bad = Vec::new();
    let mut seen = BTreeSet::new();
    for r in &all {
        let key = (r.method.as_str().to_owned(), r.path.to_owned());
        match ops.get(&key) {
            Some(op) => bad.extend(check(r, op)),
            None => bad.push(format!("{} {}: declared, not served", key.0, key.1)),
        }
        seen.insert(key);
    }
    for key in ops.keys() {
        if !seen.contains(key) {
            bad.push(format!("{} {}: served, not declared", key.0, key.1));
        }
    }
    assert!(
        bad.is_empty(),
        "the document and the declarations disagree:\n{}",
        bad.join("\n")
    );
}

#[tokio::test]
async fn the_gateway_document_is_the_declared_routes() {
    let doc = gateway::launch::document(ServeConfig::default()).unwrap();
    let doc = serde_json::to_value(&doc).unwrap();
    assert_describes(
        &doc,
        &[routes::gateway::ALL, routes::master::ALL, routes::docs::ALL],
    );
}

#[tokio::test]
async fn the_gateway_without_a_master_documents_its_own_routes_only() {
    let cfg = ServeConfig {
        disable_master: true,
        ..ServeConfig::default()
    };
    let doc = serde_json::to_value(gateway::launch::document(cfg).unwrap()).unwrap();
    assert_describes(&doc, &[routes::gateway::ALL, routes::docs::ALL]);
}

#[tokio::test]
async fn the_master_document_is_the_declared_routes() {
    let doc = gateway::master::document(MasterHostConfig::default()).unwrap();
    let doc = serde_json::to_value(&doc).unwrap();
    assert_describes(
        &doc,
        &[
            routes::master::ALL,
            routes::master_ops::ALL,
            routes::docs::ALL,
        ],
    );
}

/// Whether `path` (a request's, percent-encoded) is an instance of the template `route`.
fn instance_of(route: &Route, path: &str) -> bool {
    let (t, p): (Vec<&str>, Vec<&str>) =
        (route.path.split('/').collect(), path.split('/').collect());
    t.len() == p.len()
        && t.iter()
            .zip(&p)
            .all(|(t, p)| (t.starts_with('{') && !p.is_empty()) || t == p)
}

/// A real master whose every request is recorded (method, path, status) on its way.
async fn recording_master() -> (MasterServer, Arc<Mutex<Vec<(String, String, u16)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let master = Arc::new(Master::new(MasterConfig::default()).unwrap());
    let log = seen.clone();
    let app: axum::Router = kvmaster::router(master.clone()).into();
    let app = app.layer(middleware::from_fn(move |req: Request, next: Next| {
        let log = log.clone();
        async move {
            let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
            let resp = next.run(req).await;
            log.lock().push((method, path, resp.status().as_u16()));
            resp
        }
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = MasterServer::serve_app(master, listener, app, Duration::from_micros(0)).unwrap();
    (server, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_client_calls_only_declared_routes_and_each_is_served() {
    let (m, seen) = recording_master().await;
    let cfg = ClientConfig {
        local_buffer_size: 4 << 20,
        ..ClientConfig::local(&m.url(), 8 << 20)
    };
    let c = StoreClient::connect(cfg).await.unwrap();
    // Every call the client makes, single and batch, store and admin plane.
    c.put("k/1 a", b"one").await.unwrap();
    assert_eq!(&c.get("k/1 a").await.unwrap()[..], b"one");
    assert!(c.exists("k/1 a").await.unwrap());
    assert_eq!(c.size("k/1 a").await.unwrap(), 3);
    let buf = c.alloc(4096).unwrap();
    c.put_from("k2", kvclient::BufRange::new(&buf, 0, 16))
        .await
        .unwrap();
    c.get_into("k2", kvclient::BufRange::new(&buf, 16, 16))
        .await
        .unwrap();
    for r in c.batch_put(&[("b1", b"x".as_slice()), ("b2", b"y")]).await {
        r.unwrap();
    }
    for r in c.batch_get(&["b1", "b2"]).await {
        r.unwrap();
    }
    for r in c.batch_exists(&["b1", "nope"]).await {
        r.unwrap();
    }
    for r in c.batch_remove(&["b1"], true).await {
        r.unwrap();
    }
    c.remove("k2", true).await.unwrap();
    c.remove_by_regex("^k/").await.unwrap();
    c.remove_all().await.unwrap();
    c.close().await.unwrap();
    let seen = seen.lock().clone();
    let declared = routes::master::ALL;
    let mut used = BTreeSet::new();
    for (method, path, status) in &seen {
        let route = declared
            .iter()
            .find(|r| r.method.as_str() == method && instance_of(r, path))
            .unwrap_or_else(|| panic!("{method} {path}: not a declared master route"));
        assert!(
            ![404, 405].contains(status) || route.path.contains('{'),
            "{method} {path}: answered {status}"
        );
        assert_ne!(route.plane, Plane::Open, "{method} {path}");
        used.insert(route.operation_id);
    }
    // The calls above reach every route a client has a call for.
    for id in [
        "master_mount_segment",
        "master_put_start",
        "master_put_end",
        "master_get_replicas",
        "master_exists",
        "master_batch_put_start",
        "master_batch_put_end",
        "master_batch_get_replicas",
        "master_batch_exists",
        "master_batch_remove",
        "master_remove",
        "master_remove_objects",
        "master_remove_client",
    ] {
        assert!(used.contains(id), "{id} was not called: {used:?}");
    }
    drop(m);
}
