//! Helpers for the simulated-worker and process tests: start a worker on 127.0.0.1:0, speak
//! HTTP to it, read a child process's ready line.

#![allow(dead_code)]

// The simulated worker's helpers (start one, speak HTTP to it), shared with its own tests.
#[path = "../../../sim/tests/common/mod.rs"]
mod sim_helpers;
#[allow(unused_imports)]
pub use sim_helpers::*;

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub mod ha;

use serde_json::Value;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The `moongate` binary, with no `MOONGATE_*` or `RUST_LOG` variable of this environment.
pub fn moongate() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_moongate"));
    for (k, _) in std::env::vars() {
        if k.starts_with("MOONGATE_") || k == "RUST_LOG" {
            c.env_remove(k);
        }
    }
    c
}

/// `moongate serve` on 127.0.0.1, any free port, hosting no master: the gateway of the
/// process tests, which add their own flags.
pub fn serve_no_master() -> std::process::Command {
    let mut c = moongate();
    c.args([
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--disable-master",
    ]);
    c
}

/// The first line `child` prints on stdout (its ready line; empty if it exited first).
pub fn ready_line(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout piped"))
        .read_line(&mut line)
        .expect("read the ready line");
    line
}

/// The word after `key` in a ready line (`... segment NAME http ADDR ...`).
pub fn word_after(line: &str, key: &str) -> Option<String> {
    line.split_whitespace()
        .skip_while(|w| *w != key)
        .nth(1)
        .map(str::to_owned)
}

/// A free loopback address for a server a test starts, stops and starts again at the same
/// address. The port lies below the kernel's ephemeral range, so while the server is down no
/// other socket can be handed it: neither a listener of a concurrent test binding port 0 nor an
/// outgoing connection (a client retrying `127.0.0.1:P` can even be given local port P and
/// connect to itself). With a port from `bind(0)`, CI saw the restart fail with `Address
/// already in use`.
///
/// No port is handed out twice in one test binary. The probe's listener is closed before
/// the server binds, and while one of a concurrent test's servers is down (killed, to be
/// restarted) its port is free too, so two tests could otherwise be given one port: one
/// test's server then fails to bind, and its cluster's client talks to the other test's
/// master (they share a store key). That fits a CI run in which two HA tests failed at
/// once, one losing an acknowledged value and the other reading 67 of 95 back with the
/// wrong bytes; it did not recur in the runs of those tests that followed.
pub fn restartable_loopback_addr() -> String {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let span = (low / 2).max(1);
    let start = rand::random_range(0..span);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let port = (0..span)
        .map(|i| low - span + (start + i) % span)
        .filter(|port| !given.contains(port))
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .expect("a free loopback port below the ephemeral range");
    given.push(port);
    format!("127.0.0.1:{port}")
}

/// `len` deterministic pseudo-random bytes for `seed` (xorshift): test values that a torn,
/// stale or misplaced read cannot pass for.
pub fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A `moongate sim-worker` child process (killed when dropped) and its bound addresses:
/// loopback, any free ports, the tiny model shape, pages of 4 tokens, KV over TCP.
pub struct SimProc {
    /// The process.
    pub child: Child,
    /// `http://` + its HTTP address.
    pub http: String,
    /// Its PD bootstrap port (a prefill's).
    pub bootstrap: Option<u16>,
}

impl Drop for SimProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SimProc {
    /// Starts `moongate sim-worker --mode MODE ...` with `extra` flags and reads its ready
    /// line.
    pub fn start(mode: &str, extra: &[&str]) -> SimProc {
        let mut child = moongate()
            .args([
                "sim-worker",
                "--mode",
                mode,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ])
            .args([
                "--bootstrap-port",
                "0",
                "--model-shape",
                "tiny",
                "--page-size",
                "4",
            ])
            .args(["--kv-transport", "tcp"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn moongate sim-worker");
        let line = ready_line(&mut child);
        SimProc {
            http: format!(
                "http://{}",
                word_after(&line, "http").unwrap_or_else(|| panic!("no http in {line:?}"))
            ),
            bootstrap: word_after(&line, "bootstrap")
                .and_then(|b| b.rsplit_once(':')?.1.parse().ok()),
            child,
        }
    }

    /// SIGKILL, and waits for the exit.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, and waits for the exit (a worker exporting traces flushes them).
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let _ = self.child.wait();
    }
}

/// A running `moongate` process whose stderr is collected line by line.
pub struct Proc {
    /// The process.
    pub child: Child,
    /// `http://` + the address it listens on.
    pub base: String,
    lines: mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Proc {
    /// Starts `moongate args...` and waits for its "listening addr=..." log line.
    pub fn start(cmd: &mut Command) -> Proc {
        let mut child = cmd.stderr(Stdio::piped()).spawn().expect("spawn moongate");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut log = Vec::new();
        let addr = loop {
            let line = lines
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("no listening line ({e}); log so far: {log:#?}"));
            let addr = line
                .split("addr=")
                .nth(1)
                .filter(|_| line.contains("listening"))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string);
            log.push(line);
            if let Some(a) = addr {
                break a;
            }
        };
        Proc {
            child,
            base: format!("http://{addr}"),
            lines,
            log,
        }
    }

    /// Sends SIGTERM, expects a clean exit within 5 s, and returns everything it logged.
    pub fn terminate(mut self) -> String {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        for _ in 0..100 {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "exit status {status}");
                self.log.extend(self.lines.iter());
                return self.log.join("\n");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("moongate did not exit within 5 s of SIGTERM");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every `moongate_*` metric the Grafana dashboards in deploy/grafana/dashboards query.
pub fn dashboard_metrics() -> std::collections::BTreeSet<String> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/dashboards");
    let mut names = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(dir).expect("deploy/grafana/dashboards") {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let mut stack = vec![&v];
        while let Some(v) = stack.pop() {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(expr)) = m.get("expr") {
                        names.extend(metric_names(expr));
                    }
                    stack.extend(m.values());
                }
                Value::Array(a) => stack.extend(a),
                _ => {}
            }
        }
    }
    names
}

/// The `moongate_*` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("moongate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// Whether a Prometheus text exposition has a sample of `name`.
pub fn exposes(text: &str, name: &str) -> bool {
    text.lines().any(|l| {
        !l.starts_with('#')
            && l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
    })
}
