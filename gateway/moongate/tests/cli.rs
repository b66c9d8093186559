//! The `moongate` binary as a user starts it: configuration precedence (defaults < TOML
//! file < `MOONGATE_*` environment < flags) and validation errors.

use std::process::Command;

fn moongate() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moongate"));
    for (k, _) in std::env::vars() {
        if k.starts_with("MOONGATE_") {
            c.env_remove(k);
        }
    }
    c
}

fn print_config(c: &mut Command) -> String {
    let out = c.output().expect("run moongate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// `GET path` over a fresh connection to `addr`; the raw response.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp
}

/// Sends `signal` (`-TERM`, `-INT`) and expects a clean exit within 5 s.
fn signal_and_expect_clean_exit(child: &mut std::process::Child, signal: &str) {
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    for _ in 0..100 {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("moongate did not exit within 5 s of {signal}");
}

#[test]
fn file_env_and_flags_merge_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("moongate.toml");
    std::fs::write(
        &file,
        "port = 1111\npolicy = \"random\"\nrequest_timeout_secs = 7\nlog_level = \"debug\"\n",
    )
    .unwrap();
    let out = print_config(
        moongate()
            .args(["serve", "--print-config", "--config"])
            .arg(&file)
            .args(["--port", "3333"])
            .env("MOONGATE_PORT", "2222")
            .env("MOONGATE_POLICY", "round_robin")
            .env("MOONGATE_WORKER_URLS", "http://a:1,http://b:2"),
    );
    assert!(out.contains("port = 3333"), "flag wins: {out}");
    assert!(
        out.contains("policy = \"round_robin\""),
        "env beats file: {out}"
    );
    assert!(
        out.contains("request_timeout_secs = 7"),
        "file beats default: {out}"
    );
    assert!(out.contains("log_level = \"debug\""), "{out}");
    assert!(
        out.contains("worker_urls = [\"http://a:1\", \"http://b:2\"]"),
        "{out}"
    );
    assert!(
        out.contains("health_check_interval_secs = 60"),
        "default: {out}"
    );
}

#[test]
fn invalid_settings_fail_before_start_with_every_problem() {
    let out = moongate()
        .args([
            "serve",
            "--worker-urls",
            "nohost:1",
            "--health-success-threshold",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nohost:1") && err.contains("health_success_threshold"),
        "{err}"
    );
    let out = moongate()
        .args(["serve", "--policy", "least_busy"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("power_of_two") && err.contains("cache_aware"),
        "{err}"
    );
    let out = moongate()
        .args([
            "serve",
            "--max-concurrent-requests",
            "0",
            "--cache-threshold",
            "1.5",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("max_concurrent_requests") && err.contains("cache_threshold"),
        "{err}"
    );
}

#[test]
fn help_shows_defaults_from_the_config_struct() {
    let out = moongate().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "[default: 30000]",
        "[default: 1800]",
        "[default: 536870912]",
        "MOONGATE_PORT",
        "--worker-urls",
        "[default: -1]",
        "--cb-failure-threshold",
        "[default: 67108864]",
        "[default: x-request-id x-correlation-id x-trace-id request-id]",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
}

#[test]
fn serve_runs_as_a_process_and_stops_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let mut child = moongate()
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-level",
            "info",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn moongate serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = loop {
        let line = lines.next().expect("a log line").expect("utf-8 log");
        if let Some(rest) = line
            .split("addr=")
            .nth(1)
            .filter(|_| line.contains("listening"))
        {
            break rest.split_whitespace().next().expect("address").to_string();
        }
    };
    let resp = http_get(&addr, "/liveness");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("\"status\":\"alive\""), "{resp}");
    signal_and_expect_clean_exit(&mut child, "-TERM");
}

#[test]
fn demo_prints_examples_serves_them_and_exits_on_ctrl_c() {
    use std::io::{BufRead, BufReader};
    let mut child = moongate()
        .args(["demo", "--port", "0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn moongate demo");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("utf-8");
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("gateway url")
        .to_string();
    let printed: Vec<String> = lines.by_ref().take(12).map(|l| l.unwrap()).collect();
    assert!(printed.iter().any(|l| l.starts_with("curl")), "{printed:?}");
    let resp = http_get(url.trim_start_matches("http://"), "/readiness");
    assert!(resp.contains("\"ready_workers\":2"), "{resp}");
    signal_and_expect_clean_exit(&mut child, "-INT");
}

#[test]
fn demo_outlives_a_reader_that_went_away() {
    use std::io::{BufRead, BufReader};
    let mut child = moongate()
        .args(["demo", "--port", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn moongate demo");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("a line");
    // `moongate demo | head -1`: the pipe is closed now.
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("gateway url")
        .to_string();
    let resp = http_get(url.trim_start_matches("http://"), "/liveness");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    // It says "stopping" on its way out, to nobody: a clean exit all the same.
    signal_and_expect_clean_exit(&mut child, "-TERM");
}

#[test]
fn store_and_sim_worker_print_their_validated_settings() {
    let out = print_config(
        moongate()
            .args([
                "store",
                "--print-config",
                "--store-api-key",
                "n0de-key-value",
            ])
            .env("MOONGATE_STORE_SEGMENT_SIZE", "1G"),
    );
    assert!(
        out.contains("segment_size = 1073741824"),
        "env applied: {out}"
    );
    assert!(out.contains("http_listen = "), "{out}");
    assert!(
        out.contains("store_api_key = \"<hidden>\"") && !out.contains("n0de"),
        "{out}"
    );
    let out = print_config(moongate().args(["sim-worker", "--print-config", "--mode", "decode"]));
    assert!(
        out.contains("mode = \"decode\"") && out.contains("kv_timeout = "),
        "{out}"
    );
    // Values that parse but cannot work are refused, as when the process starts.
    for args in [
        &["store", "--print-config", "--segment-size", "0"][..],
        &["sim-worker", "--print-config", "--context-length", "1"],
    ] {
        let out = moongate().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
    }
}
