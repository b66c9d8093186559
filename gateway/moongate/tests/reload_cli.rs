//! `moongate serve` as a process: a real SIGHUP reloads the configuration file (client keys,
//! static workers) without cutting a stream in flight, an invalid file keeps the last valid
//! configuration and is counted, a change that needs a restart is named; and `--log-json`
//! writes one JSON object per line, with the request's id on the lines logged while serving
//! it.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::moongate;
use serde_json::{Value, json};
use sim::SimConfig;

/// A `moongate serve --log-json` process; its stderr lines, parsed.
struct Serve {
    child: Child,
    base: String,
    lines: mpsc::Receiver<String>,
    log: Vec<Value>,
}

impl Serve {
    fn start(config: &std::path::Path) -> Serve {
        let mut child = moongate()
            .args(["serve", "--log-json", "--config"])
            .arg(config)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn moongate serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut s = Serve {
            child,
            base: String::new(),
            lines,
            log: Vec::new(),
        };
        let listening = s.wait_for("the listening line", |l| {
            l["message"] == "moongate gateway listening"
        });
        s.base = format!("http://{}", listening["addr"].as_str().unwrap());
        s
    }

    /// Reads log lines until one matches (each must be JSON); 20 s at most.
    fn wait_for(&mut self, what: &str, mut want: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no {what} ({e}); log: {:#?}", self.log));
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
            self.log.push(v.clone());
            if want(&v) {
                return v;
            }
        }
    }

    fn signal(&self, sig: &str) {
        let sent = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    /// SIGTERM, a clean exit, and the whole log.
    fn terminate(mut self) -> Vec<Value> {
        self.signal("-TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "{status}");
                for line in self.lines.try_iter() {
                    self.log.push(
                        serde_json::from_str(&line)
                            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}")),
                    );
                }
                return std::mem::take(&mut self.log);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("moongate serve did not exit after SIGTERM");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config_text(workers: &[&str], keys: &std::path::Path, extra: &str) -> String {
    let urls: Vec<String> = workers.iter().map(|w| format!("{w:?}")).collect();
    format!(
        "host = \"127.0.0.1\"\nport = 0\nworker_urls = [{}]\nclient_api_keys_file = {:?}\n\
         store_api_key = \"st0re-key\"\nhealth_check_interval_secs = 1\n\
         health_check_pending_interval_ms = 50\nhealth_success_threshold = 1\n{extra}",
        urls.join(", "),
        keys.to_str().unwrap()
    )
}

async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn chat_status(c: &reqwest::Client, base: &str, key: &str) -> u16 {
    c.post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn worker_urls(c: &reqwest::Client, base: &str) -> Vec<String> {
    let v: Value = c
        .get(format!("{base}/workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["url"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_keys_and_workers_and_keeps_the_last_valid_configuration() {
    let slow = SimConfig {
        model: "sim-model".into(),
        output_tokens: 12,
        tpot: Duration::from_millis(100),
        ..SimConfig::default()
    };
    let s1 = common::start(slow.clone()).await;
    let s2 = common::start(slow).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("client-keys");
    let config = dir.path().join("moongate.toml");
    std::fs::write(&keys, "key-old\n").unwrap();
    std::fs::write(&config, config_text(&[&s1.url()], &keys, "")).unwrap();
    let mut serve = Serve::start(&config);
    let base = serve.base.clone();
    let c = reqwest::Client::new();
    until("the worker is ready", async || {
        c.get(format!("{base}/readiness"))
            .send()
            .await
            .unwrap()
            .status()
            == 200
    })
    .await;

    // A request's log lines carry its id (the worker registered through the API logs one).
    let r = c
        .post(format!("{base}/workers"))
        .header("x-request-id", "rid-json-7")
        .json(&json!({"url": "http://127.0.0.1:9"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let registered = serve.wait_for("the registration line", |l| {
        l["message"] == "worker registered"
    });
    assert_eq!(
        registered["span"]["request_id"], "rid-json-7",
        "{registered}"
    );
    assert!(
        registered["spans"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["request_id"] == "rid-json-7")
    );
    assert_eq!(
        c.delete(format!("{base}/workers/{id}"))
            .send()
            .await
            .unwrap()
            .status(),
        202
    );

    // A stream in flight across the reload.
    let streaming = tokio::spawn({
        let (c, base) = (c.clone(), base.clone());
        async move {
            c.post(format!("{base}/v1/chat/completions"))
                .bearer_auth("key-old")
                .json(&json!({"model": "sim-model", "stream": true,
                              "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    });
    until("the stream started", async || {
        serve_metric(&c, &base, "moongate_gateway_worker_in_flight")
            .await
            .contains(" 1")
    })
    .await;

    // New keys and a new worker list, then SIGHUP.
    std::fs::write(&keys, "# rotated\nkey-new\n").unwrap();
    std::fs::write(&config, config_text(&[&s2.url()], &keys, "")).unwrap();
    serve.signal("-HUP");
    let reloaded = serve.wait_for("the reload line", |l| {
        l["message"] == "configuration reloaded"
    });
    let applied = reloaded["applied"].as_str().unwrap();
    assert!(
        applied.contains("worker_urls") && applied.contains("client_api_keys"),
        "{reloaded}"
    );
    until("key-new works", async || {
        chat_status(&c, &base, "key-new").await == 200
    })
    .await;
    assert_eq!(chat_status(&c, &base, "key-old").await, 401);
    until("only s2 is left", async || {
        worker_urls(&c, &base).await == [s2.url()]
    })
    .await;
    let text = streaming.await.unwrap();
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the stream was cut: {text}"
    );
    assert!(text.matches("data: ").count() > 5, "{text}");

    // An invalid file: refused, counted, the last valid configuration stays.
    std::fs::write(&config, "worker_urls = [\"http://127.0.0.1:1\"\nport = ").unwrap();
    serve.signal("-HUP");
    let refused = serve.wait_for("the refusal", |l| {
        l["message"] == "configuration reload refused; the last valid configuration stays in force"
    });
    assert!(
        refused["error"].as_str().unwrap().contains("moongate.toml"),
        "{refused}"
    );
    assert_eq!(chat_status(&c, &base, "key-new").await, 200);
    assert_eq!(worker_urls(&c, &base).await, [s2.url()]);
    let metrics = serve_metric(&c, &base, "moongate_config_reloads_total").await;
    assert!(
        metrics.contains("moongate_config_reloads_total{result=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("moongate_config_reloads_total{result=\"invalid\"} 1"),
        "{metrics}"
    );

    // A setting that cannot change while running is named, and keeps its value.
    std::fs::write(
        &config,
        config_text(&[&s2.url()], &keys, "request_timeout_secs = 77\n"),
    )
    .unwrap();
    serve.signal("-HUP");
    let restart = serve.wait_for("the restart warning", |l| {
        l["level"] == "WARN"
            && l["settings"]
                .as_str()
                .is_some_and(|s| s.contains("request_timeout_secs"))
    });
    assert!(
        restart["message"].as_str().unwrap().contains("restart"),
        "{restart}"
    );

    let log = serve.terminate();
    for line in &log {
        let text = line.to_string();
        assert!(
            !text.contains("key-new") && !text.contains("key-old") && !text.contains("st0re-key"),
            "a key was logged: {text}"
        );
    }
}

/// The lines of `/metrics` that start with `name`.
async fn serve_metric(c: &reqwest::Client, base: &str, name: &str) -> String {
    let text = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name))
        .collect::<Vec<_>>()
        .join("\n")
}
