//! `store-bench` as a user runs it (a spawned master process, the bench client holding the
//! segment), tiny: every operation runs, every value reads back exactly, the table lists
//! each (operation, size).

use std::process::Command;

/// Runs `store-bench` with `args` (and `--json`); its standard output, once it succeeded.
fn store_bench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_store-bench"))
        .args(args)
        .arg("--json")
        .output()
        .expect("run store-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn store_bench_runs_every_operation_and_verifies_the_bytes() {
    let stdout = store_bench(&[
        "--sizes",
        "4K,100K",
        "--ops",
        "130",
        "--batch",
        "16",
        "--rounds",
        "1",
        "--segment-size",
        "64M",
    ]);
    for op in [
        "put",
        "get",
        "put_from",
        "get_into",
        "batch_put",
        "batch_get",
        "batch_put_from",
        "batch_get_into",
    ] {
        for size in [4096, 102_400] {
            let line = stdout
                .lines()
                .find(|l| {
                    l.contains(&format!("\"op\":\"{op}\""))
                        && l.contains(&format!("\"value_bytes\":{size},"))
                })
                .unwrap_or_else(|| panic!("no result for {op} {size}:\n{stdout}"));
            assert!(line.contains("\"errors\":0,\"bad\":0"), "{line}");
        }
    }
}

#[test]
fn store_bench_runs_many_clients_at_once_each_on_its_own_keys() {
    let stdout = store_bench(&[
        "--sizes",
        "4K",
        "--ops",
        "40",
        "--batch",
        "8",
        "--rounds",
        "1",
        "--clients",
        "3",
        "--only",
        "put,get,batch_put_from,batch_get_into",
        "--segment-size",
        "16M",
    ]);
    for op in ["put", "get", "batch_put_from", "batch_get_into"] {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("\"op\":\"{op}\"")))
            .unwrap_or_else(|| panic!("no result for {op}:\n{stdout}"));
        assert!(line.contains("\"clients\":3,"), "{line}");
        assert!(line.contains("\"errors\":0,\"bad\":0"), "{line}");
        // The aggregate is the three clients together: at least the fastest one alone.
        let num = |k: &str| -> f64 {
            let at = line.find(&format!("\"{k}\":")).expect(k) + k.len() + 3;
            line[at..]
                .split([',', '}'])
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        assert!(num("GBps") >= num("client_max_GBps"), "{line}");
        assert!(num("client_max_GBps") >= num("client_min_GBps"), "{line}");
    }
}

/// A master on 127.0.0.1:0 that admits only `Authorization: Bearer <key>` (what a master
/// holding the cluster's secret checks), on a thread of its own.
fn keyed_master(key: String) -> String {
    use axum::extract::Request;
    use axum::middleware::{self, Next};
    use axum::response::{IntoResponse, Response};
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let master = std::sync::Arc::new(
                kvmaster::Master::new(kvmaster::MasterConfig::default()).unwrap(),
            );
            let want = format!("Bearer {key}");
            let app = axum::Router::from(kvmaster::router(master)).layer(middleware::from_fn(
                move |req: Request, next: Next| {
                    let ok = req
                        .headers()
                        .get("authorization")
                        .is_some_and(|v| v.as_bytes() == want.as_bytes());
                    async move {
                        if ok {
                            next.run(req).await
                        } else {
                            let e = kvmaster::MasterError::Unauthorized("store key".into());
                            let r: Response = kvmaster::rest::ApiError(e).into_response();
                            r
                        }
                    }
                },
            ));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(format!("http://{}", listener.local_addr().unwrap()))
                .unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

#[test]
fn store_bench_presents_the_store_key_of_its_secret_file_or_the_given_one() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    let other = dir.path().join("other");
    let key = trust::ClusterSecret::load_or_create(&secret)
        .unwrap()
        .store_api_key();
    trust::ClusterSecret::load_or_create(&other).unwrap();
    let url = keyed_master(key.clone());
    let bench = |extra: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_store-bench"))
            .args(["--master", &url, "--segment-size", "16M", "--sizes", "4K"])
            .args([
                "--ops", "8", "--batch", "4", "--rounds", "1", "--only", "put,get",
            ])
            .env_remove(kvclient::env::STORE_API_KEY)
            .env_remove(kvclient::env::TRANSFER_SECRET_FILE)
            .args(extra)
            .output()
            .expect("run store-bench")
    };
    let flag = std::ffi::OsStr::new;
    let ok = bench(&[flag("--transfer-secret-file"), secret.as_os_str()]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let refused = bench(&[flag("--transfer-secret-file"), other.as_os_str()]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.to_lowercase().contains("unauthorized"), "{err}");
    let given = bench(&[
        flag("--transfer-secret-file"),
        other.as_os_str(),
        flag("--store-api-key"),
        flag(&key),
    ]);
    assert!(
        given.status.success(),
        "{}",
        String::from_utf8_lossy(&given.stderr)
    );
}
