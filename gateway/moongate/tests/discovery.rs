//! Kubernetes service discovery, driven the way a cluster drives it: `moongate serve
//! --service-discovery` started as a process with a kubeconfig that points at an in-test
//! fake API server speaking Kubernetes' JSON (a pod list, then a watch stream of
//! ADDED/MODIFIED/DELETED events, and a `410 Gone` that forces a re-list). Workers are
//! simulated SGLang workers at "pod IPs" on 127.0.0.0/8, all on the discovery port.
//!
//! Needs the cargo feature `kubernetes` (`.ci/run` turns it on).
#![cfg(feature = "kubernetes")]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use common::{Proc, moongate, serve_no_master};
use serde_json::{Value, json};
use sim::{self, SimConfig, SimHandle};
use tokio::sync::mpsc;

const TOKEN: &str = "fake-service-account-token";
const NAMESPACE: &str = "llm";

/// The fake API server's state: the pods, an event log from which watches resume, and the
/// open watches.
#[derive(Default)]
struct Fake {
    rv: u64,
    pods: BTreeMap<String, Value>,
    log: Vec<(u64, &'static str, Value)>,
    /// Watches from a resource version below this get `410 Gone` (compacted away).
    floor: u64,
    watches: Vec<(String, mpsc::UnboundedSender<Bytes>)>,
    /// Every request: (path, labelSelector, watch?).
    requests: Vec<(String, String, bool)>,
    unauthorized: usize,
}

#[derive(Clone, Default)]
struct Api(Arc<Mutex<Fake>>);

fn selected(selector: &str, pod: &Value) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        pod["metadata"]["labels"][k].as_str() == Some(v)
    })
}

fn line(v: &Value) -> Bytes {
    Bytes::from(format!("{v}\n"))
}

fn gone() -> Bytes {
    line(&json!({"type": "ERROR", "object": {
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": "too old resource version", "reason": "Expired", "code": 410}}))
}

impl Api {
    /// Adds or changes a pod, with an ADDED or MODIFIED event.
    fn apply(&self, pod: Value) {
        let mut f = self.0.lock().unwrap();
        let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
        let kind = if f.pods.contains_key(&uid) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        f.emit(kind, uid, Some(pod));
    }

    /// Deletes a pod at once (a force delete), with a DELETED event.
    fn delete(&self, uid: &str) {
        let mut f = self.0.lock().unwrap();
        f.emit("DELETED", uid.to_owned(), None);
    }

    /// Compacts the history: every open watch gets `410 Gone` and ends, and a watch from
    /// an older version is refused, so clients must list again. `change` runs first, with
    /// no event at all (what they missed).
    fn expire(&self, change: impl FnOnce(&mut BTreeMap<String, Value>)) {
        let mut f = self.0.lock().unwrap();
        change(&mut f.pods);
        f.rv += 1;
        f.floor = f.rv;
        f.log.clear();
        for (_, tx) in f.watches.drain(..) {
            let _ = tx.send(gone());
        }
    }

    fn requests(&self) -> Vec<(String, String, bool)> {
        self.0.lock().unwrap().requests.clone()
    }
}

impl Fake {
    fn emit(&mut self, kind: &'static str, uid: String, pod: Option<Value>) {
        self.rv += 1;
        let rv = self.rv.to_string();
        let mut obj = match pod {
            Some(p) => p,
            None => self.pods.remove(&uid).expect("deleting a known pod"),
        };
        obj["metadata"]["resourceVersion"] = json!(rv);
        if kind != "DELETED" {
            self.pods.insert(uid, obj.clone());
        }
        let event = json!({"type": kind, "object": obj});
        self.log.push((self.rv, kind, obj.clone()));
        self.watches
            .retain(|(sel, tx)| !selected(sel, &obj) || tx.send(line(&event)).is_ok());
    }
}

async fn pods(
    State(api): State<Api>,
    Path(ns): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let mut f = api.0.lock().unwrap();
    let selector = q.get("labelSelector").cloned().unwrap_or_default();
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    f.requests.push((
        format!("/api/v1/namespaces/{ns}/pods"),
        selector.clone(),
        watch,
    ));
    let bearer = headers.get("authorization").and_then(|v| v.to_str().ok());
    if bearer != Some(&format!("Bearer {TOKEN}")) {
        f.unauthorized += 1;
        let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
            "reason": "Unauthorized", "code": 401});
        return (StatusCode::UNAUTHORIZED, axum::Json(status)).into_response();
    }
    if !watch {
        let items: Vec<Value> = f
            .pods
            .values()
            .filter(|p| p["metadata"]["namespace"] == ns && selected(&selector, p))
            .cloned()
            .collect();
        let list = json!({"apiVersion": "v1", "kind": "PodList",
            "metadata": {"resourceVersion": f.rv.to_string()}, "items": items});
        return axum::Json(list).into_response();
    }
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (tx, rx) = mpsc::unbounded_channel();
    if from < f.floor {
        let _ = tx.send(gone());
    } else {
        for (rv, kind, obj) in &f.log {
            if *rv > from && selected(&selector, obj) {
                let _ = tx.send(line(&json!({"type": kind, "object": obj})));
            }
        }
        f.watches.push((selector, tx));
    }
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Response::new(Body::from_stream(body))
}

async fn start_api() -> (Api, SocketAddr) {
    let api = Api::default();
    let app = axum::Router::new()
        .route("/api/v1/namespaces/{ns}/pods", axum::routing::get(pods))
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (api, addr)
}

/// A kubeconfig for the fake API server, in a temporary directory.
fn kubeconfig(addr: SocketAddr) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
         clusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
         users:\n- name: sa\n  user:\n    token: {TOKEN}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: sa\n    namespace: {NAMESPACE}\n"
    );
    std::fs::write(dir.path().join("config"), text).unwrap();
    dir
}

fn pod(uid: &str, ip: &str, ready: bool, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{uid}"), "namespace": NAMESPACE, "uid": uid,
                     "labels": labels, "annotations": {}},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    })
}

/// Simulated workers on 127.0.0.2.., all on one port (the discovery port).
async fn workers(n: u8) -> (u16, Vec<SimHandle>) {
    'again: loop {
        let first = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut listeners = vec![first];
        for i in 3..2 + n {
            match tokio::net::TcpListener::bind((format!("127.0.0.{i}"), port)).await {
                Ok(l) => listeners.push(l),
                Err(_) => continue 'again,
            }
        }
        let mut handles = Vec::new();
        for l in listeners {
            handles.push(sim::spawn(SimConfig::default(), l).await.unwrap());
        }
        return (port, handles);
    }
}

/// The gateway's workers as (url, type, bootstrap port, pod label), sorted.
async fn listed(base: &str) -> Vec<(String, String, Option<u64>, Option<String>)> {
    let v: Value = reqwest::get(format!("{base}/workers"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut out: Vec<_> = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["url"].as_str().unwrap().to_owned(),
                w["worker_type"].as_str().unwrap().to_owned(),
                w["bootstrap_port"].as_u64(),
                w["labels"]["pod"].as_str().map(str::to_owned),
            )
        })
        .collect();
    out.sort();
    out
}

/// Waits (bounded) until the gateway lists exactly `want` URLs.
async fn wait_for(base: &str, want: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now: Vec<String> = listed(base).await.into_iter().map(|w| w.0).collect();
        let mut want = want.to_vec();
        want.sort();
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "workers {now:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `moongate serve --service-discovery ... args`, its workers on `port`, with `kube`'s
/// kubeconfig.
fn gateway(kube: &tempfile::TempDir, port: u16, args: &[&str]) -> Proc {
    let mut cmd = serve_no_master();
    cmd.env("KUBECONFIG", kube.path().join("config"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .args(["--health-check-pending-interval-ms", "50"])
        // Debug logs, so that the token check below means something.
        .args(["--log-level", "debug"])
        .args([
            "--service-discovery",
            "--service-discovery-resync-secs",
            "3600",
        ])
        .args(["--service-discovery-port", &port.to_string()])
        .args(args);
    Proc::start(&mut cmd)
}

#[tokio::test]
async fn pods_come_and_go_as_workers_and_a_stale_watch_lists_again() {
    let (api, addr) = start_api().await;
    let (port, _sims) = workers(3).await;
    let url = |i: u8| format!("http://127.0.0.{i}:{port}");
    let sglang = json!({"app": "sglang", "tier": "gpu"});
    api.apply(pod("a", "127.0.0.2", true, sglang.clone()));
    api.apply(pod("b", "127.0.0.3", false, sglang.clone()));
    // Another app's pod: the server-side selector keeps it out.
    api.apply(pod(
        "c",
        "127.0.0.4",
        true,
        json!({"app": "other", "tier": "gpu"}),
    ));
    let kube = kubeconfig(addr);
    let gw = gateway(&kube, port, &["--selector", "app=sglang", "tier=gpu"]);
    let base = gw.base.clone();
    let client = reqwest::Client::new();
    // A worker added by hand, at an address no pod has: discovery leaves it alone.
    let hand = "http://127.0.0.9:9";
    let added = client
        .post(format!("{base}/workers"))
        .json(&json!({"url": hand}))
        .send()
        .await
        .unwrap();
    assert!(added.status().is_success(), "{}", added.status());

    wait_for(&base, &[url(2), hand.into()]).await;
    let a = listed(&base)
        .await
        .into_iter()
        .find(|w| w.0 == url(2))
        .unwrap();
    assert_eq!(
        (a.1.as_str(), a.3.as_deref()),
        ("regular", Some("llm/pod-a"))
    );
    // The discovered worker serves.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = client
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": "moongate-sim", "prompt": "hi", "max_tokens": 2}))
            .send()
            .await
            .unwrap();
        if r.status().is_success() {
            break;
        }
        assert!(Instant::now() < deadline, "no completion: {}", r.status());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // b turns Ready (MODIFIED), then a starts terminating (MODIFIED with deletionTimestamp).
    api.apply(pod("b", "127.0.0.3", true, sglang.clone()));
    wait_for(&base, &[url(2), url(3), hand.into()]).await;
    let mut dying = pod("a", "127.0.0.2", true, sglang.clone());
    dying["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
    api.apply(dying);
    wait_for(&base, &[url(3), hand.into()]).await;
    // b is force-deleted (DELETED); d comes (ADDED) at a's old IP.
    api.delete("a");
    api.delete("b");
    api.apply(pod("d", "127.0.0.2", true, sglang.clone()));
    wait_for(&base, &[url(2), hand.into()]).await;
    let d_id = {
        let v: Value = reqwest::get(format!("{base}/workers"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["url"] == url(2))
            .unwrap()["id"]
            .clone()
    };

    // The history is compacted while d goes and e comes, with no event: the watch gets
    // 410 Gone, lists again, and the workers follow the list.
    api.expire(|pods| {
        pods.remove("d");
        pods.insert("e".into(), pod("e", "127.0.0.4", true, sglang.clone()));
        pods.get_mut("e").unwrap()["metadata"]["resourceVersion"] = json!("1");
    });
    wait_for(&base, &[url(4), hand.into()]).await;
    // e's pod is UID e, not d: d's worker is gone for good.
    let v: Value = reqwest::get(format!("{base}/workers"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["id"] != d_id)
    );

    let reqs = api.requests();
    let lists = reqs.iter().filter(|r| !r.2).count();
    assert!(lists >= 2, "a 410 makes the watcher list again: {reqs:?}");
    assert!(
        reqs.iter()
            .all(|(path, sel, _)| path == "/api/v1/namespaces/llm/pods"
                && sel == "app=sglang,tier=gpu"),
        "the kubeconfig's namespace and a server-side selector on every call: {reqs:?}"
    );
    assert_eq!(api.0.lock().unwrap().unauthorized, 0);
    let log = gw.terminate();
    assert!(
        !log.contains(TOKEN),
        "the service-account token is never logged"
    );
}

#[tokio::test]
async fn pd_pods_are_found_by_role_with_their_bootstrap_port() {
    let (api, addr) = start_api().await;
    let (port, _sims) = workers(2).await;
    let mut prefill = pod(
        "p",
        "127.0.0.2",
        true,
        json!({"app": "sglang", "role": "prefill"}),
    );
    prefill["metadata"]["annotations"] = json!({"sglang.ai/bootstrap-port": "8998"});
    api.apply(prefill);
    api.apply(pod(
        "d",
        "127.0.0.3",
        true,
        json!({"app": "sglang", "role": "decode"}),
    ));
    let kube = kubeconfig(addr);
    let gw = gateway(
        &kube,
        port,
        &[
            "--pd-disaggregation",
            "--prefill-selector",
            "app=sglang",
            "role=prefill",
            "--decode-selector",
            "app=sglang",
            "role=decode",
        ],
    );
    let (p, d) = (
        format!("http://127.0.0.2:{port}"),
        format!("http://127.0.0.3:{port}"),
    );
    wait_for(&gw.base, &[p.clone(), d.clone()]).await;
    assert_eq!(
        listed(&gw.base).await,
        [
            (p, "prefill".into(), Some(8998), Some("llm/pod-p".into())),
            (d, "decode".into(), None, Some("llm/pod-d".into())),
        ]
    );
    let selectors: std::collections::BTreeSet<_> =
        api.requests().into_iter().map(|r| r.1).collect();
    assert_eq!(
        selectors.into_iter().collect::<Vec<_>>(),
        ["app=sglang,role=decode", "app=sglang,role=prefill"]
    );
    gw.terminate();
}

#[test]
fn without_a_kubernetes_api_the_gateway_says_so_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let out = moongate()
        .env("KUBECONFIG", dir.path().join("missing"))
        .env("HOME", dir.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--disable-master",
        ])
        .args(["--service-discovery", "--selector", "app=sglang"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no Kubernetes API configured"), "{err}");
}
