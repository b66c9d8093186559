//! One trace across the processes a request crosses, as users run them: `moongate serve
//! --pd-disaggregation` in front of a prefill and a decode `moongate sim-worker`, the
//! prefill with its store (L3) on a `moongate master`; every process exports to one OTLP
//! collector (this test's). A chat request sent with a `traceparent` comes back as one tree
//! under it: the gateway's server span; under it each worker's; under the prefill's its
//! store load, the store client's master calls, and the master's answers to them. Four
//! processes, each named by its `process.pid`.

mod common;

use std::collections::{BTreeSet, HashMap};

use common::{Proc, SimProc};
use moongate_tests::otlp::{Exported, attr, spans};

/// The caller's trace and span ids (the `traceparent` the test sends).
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pd_request_is_one_trace_across_gateway_workers_and_master() {
    let (otlp, bodies) = moongate_tests::otlp_collector().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "traces-across-processes-secret-0123456789").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let secret = secret.to_str().unwrap();
    let master = Proc::start(common::moongate().args([
        "master",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--transfer-secret-file",
        secret,
        "--otlp-traces-endpoint",
        &otlp,
    ]));
    let traced = |mode, store: &[&str]| {
        let mut args = vec!["--kv-pool-size", "64K", "--transfer-secret-file", secret];
        args.extend_from_slice(&["--otlp-traces-endpoint", &otlp]);
        args.extend_from_slice(store);
        SimProc::start(mode, &args)
    };
    let prefill = traced("prefill", &["--kv-store", &master.base]);
    let decode = traced("decode", &[]);
    let gateway = Proc::start(common::serve_no_master().args([
        "--pd-disaggregation",
        "--prefill",
        &prefill.http,
        &prefill.bootstrap.expect("a bootstrap port").to_string(),
        "--decode",
        &decode.http,
        "--otlp-traces-endpoint",
        &otlp,
    ]));

    let body = serde_json::json!({
        "model": "moongate-sim",
        "messages": [{"role": "user", "content": "a prompt long enough to fill several pages of the prefill's cache"}],
        "max_tokens": 4,
    });
    let c = reqwest::Client::new();
    // Sent once the gateway has found both workers healthy (its readiness).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !c
        .get(format!("{}/readiness", gateway.base))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway never got ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let answer = c
        .post(format!("{}/v1/chat/completions", gateway.base))
        .header("traceparent", format!("00-{TRACE}-{CALLER}-01"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let v: serde_json::Value = answer.json().await.unwrap();
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");

    // Every process flushes its spans as it exits.
    gateway.terminate();
    prefill.stop();
    decode.stop();
    master.terminate();

    let all = spans(&bodies.lock());
    let trace = hex(TRACE);
    let tree: Vec<&Exported> = all.iter().filter(|e| e.span.trace_id == trace).collect();
    let by_id: HashMap<&[u8], &Exported> = tree
        .iter()
        .map(|e| (e.span.span_id.as_slice(), *e))
        .collect();
    let caller = hex(CALLER);
    // One tree: every span leads up to the caller's.
    for e in &tree {
        let mut at = &e.span;
        while at.parent_span_id != caller {
            at = &by_id
                .get(at.parent_span_id.as_slice())
                .unwrap_or_else(|| panic!("{} has a parent outside the trace", at.name))
                .span;
        }
    }
    let named = |name: &str| -> Vec<&Exported> {
        tree.iter()
            .copied()
            .filter(|e| e.span.name == name)
            .collect()
    };
    let parent = |e: &Exported| by_id.get(e.span.parent_span_id.as_slice()).copied();

    // The gateway's server span is the root, and each worker answers under it.
    let front = named("POST /v1/chat/completions");
    let root = front
        .iter()
        .find(|e| e.span.parent_span_id == caller)
        .expect("the gateway's span under the caller's");
    let workers: Vec<&Exported> = front
        .iter()
        .copied()
        .chain(named("POST /generate"))
        .filter(|e| parent(e).is_some_and(|p| p.span.span_id == root.span.span_id))
        .collect();
    let worker_pids: BTreeSet<i64> = workers.iter().map(|e| e.pid).collect();
    assert_eq!(
        worker_pids.len(),
        2,
        "the prefill and the decode: {workers:#?}"
    );
    assert!(!worker_pids.contains(&root.pid));

    // The prefill looked the prompt's pages up in the store: its load, the client's call
    // and the master's answer, each under the one before, the answer in a fourth process.
    let load = named("kv_load");
    let load = load.first().expect("the prefill's store load");
    assert!(worker_pids.contains(&load.pid));
    assert_eq!(parent(load).map(|p| p.pid), Some(load.pid));
    let calls = named("master_batch_exists");
    let client = calls
        .iter()
        .find(|e| e.span.kind == 3)
        .expect("the store client's call");
    assert_eq!(
        parent(client).map(|p| p.span.span_id.clone()),
        Some(load.span.span_id.clone())
    );
    let server = calls
        .iter()
        .find(|e| e.span.kind == 2)
        .expect("the master's answer");
    assert_eq!(
        parent(server).map(|p| p.span.span_id.clone()),
        Some(client.span.span_id.clone())
    );
    assert_eq!(
        attr(&server.span, "url.path"),
        None,
        "no key in a master span"
    );

    let pids: BTreeSet<i64> = tree.iter().map(|e| e.pid).collect();
    for e in &tree {
        eprintln!("pid {:>7}  {}", e.pid, e.span.name);
    }
    assert!(!pids.contains(&0), "a span without its process");
    assert!(pids.len() >= 4, "{} processes: {pids:?}", pids.len());
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
