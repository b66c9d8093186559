//! The console (`/console`) in a real browser, on the cluster a newcomer starts first:
//! `moongate demo` (a gateway hosting the KV master, two simulated workers writing their
//! pages to its store), driven with the demo's own examples. Headless Chromium loads the
//! page under its Content-Security-Policy; the DOM after its scripts ran must show the
//! workers, the routing and the master, the page must have asked for `/cluster` and
//! nothing else, within the size and time the issue sets, and its console must be clean.
//! Screenshots at phone and desktop size are written and their paths printed. A gateway
//! with an admin key shows the sign-in form and no data to a browser without the key.
//!
//! Needs the `browser` feature and `chromium` (or `MOONGATE_CHROMIUM`):
//! `cargo test -p moongate --features browser --test console_browser -- --nocapture`.
#![cfg(feature = "browser")]

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};

use common::{Proc, moongate};
use moongate_tests::browser::{console_lines, dump_dom, screenshot};
use moongate_tests::get_json;
use serde_json::json;

/// Virtual time the page gets for its first answer and a refresh or two.
const PAGE_MS: u32 = 5_000;

/// `moongate demo --port 0`, killed when dropped.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the demo; answers it, the gateway's URL and the workers' URLs (from its first
/// line: `... gateway http://A -> 2 simulated SGLang workers (http://B, http://C) ...`).
fn demo() -> (Demo, String, Vec<String>) {
    let mut child = moongate()
        .args(["demo", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn moongate demo");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("the demo's first line");
    // The rest is read and dropped, as a terminal would take it.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let urls: Vec<String> = first
        .split(|c: char| c.is_whitespace() || "(),".contains(c))
        .filter(|w| w.starts_with("http://"))
        .map(str::to_owned)
        .collect();
    assert_eq!(urls.len(), 3, "gateway and two workers in {first:?}");
    (Demo(child), urls[0].clone(), urls[1..].to_vec())
}

/// The value of attribute `name` of the element whose opening tag contains `tag`.
fn attribute(dom: &str, tag: &str, name: &str) -> String {
    let start = dom
        .find(tag)
        .unwrap_or_else(|| panic!("{tag} not in the DOM"));
    let open = &dom[start..start + dom[start..].find('>').unwrap()];
    let key = format!("{name}=\"");
    let at = open
        .find(&key)
        .unwrap_or_else(|| panic!("{name} not set on {open}"))
        + key.len();
    open[at..at + open[at..].find('"').unwrap()].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_draws_the_demo_cluster() {
    let (_demo, base, workers) = demo();
    let c = reqwest::Client::new();
    for _ in 0..200 {
        if get_json(&c, &format!("{base}/readiness")).await["ready_workers"] == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The demo's examples: a chat completion, and the same prompt twice for its prefix.
    let chat = json!({"model": "moongate-sim", "max_tokens": 8,
        "messages": [{"role": "user", "content": "Tell me about the moon."}]});
    let ids: Vec<u32> = (1000..1040).collect();
    let generate = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 4}});
    for (path, body) in [
        ("/v1/chat/completions", &chat),
        ("/generate", &generate),
        ("/generate", &generate),
    ] {
        let r = c
            .post(format!("{base}{path}"))
            .json(body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
    }
    let cluster = get_json(&c, &format!("{base}/cluster")).await;
    let segments = cluster["master"]["segments"].as_array().unwrap();
    assert_eq!(segments.len(), 2, "each worker mounts a segment: {cluster}");

    let url = format!("{base}/console");
    let (dom, log) = dump_dom(&url, PAGE_MS).await;
    let console = console_lines(&log);
    assert!(
        console.is_empty(),
        "the page logged:\n{}",
        console.join("\n")
    );
    for w in &workers {
        assert!(dom.contains(w.as_str()), "worker {w} not shown");
    }
    for shown in [
        ">kv_aware<",
        ">live<",
        ">alone<",
        ">ready<",
        "regular · kv_aware",
        segments[0]["name"].as_str().unwrap(),
    ] {
        assert!(dom.contains(shown), "{shown:?} not shown");
    }
    assert!(
        attribute(&dom, "id=\"signin\"", "hidden").is_empty(),
        "the sign-in form is shown on a loopback gateway without an admin key"
    );
    // The page's own requests, as the browser's Resource Timing lists them.
    assert_eq!(
        attribute(&dom, "id=\"footer\"", "data-requests"),
        "/cluster"
    );
    let transferred: u64 = attribute(&dom, "id=\"footer\"", "data-transferred")
        .parse()
        .unwrap();
    let first_ms: f64 = attribute(&dom, "id=\"footer\"", "data-first-render-ms")
        .parse()
        .unwrap();
    println!(
        "console: {transferred} bytes transferred in {PAGE_MS} ms of refreshes, first render at {first_ms} ms"
    );
    assert!(
        transferred > 0 && transferred < 200 * 1024,
        "{transferred} bytes"
    );
    assert!(first_ms < 1000.0, "first drawn at {first_ms} ms");

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    for (name, size) in [("phone", (390, 844)), ("desktop", (1280, 900))] {
        let path = dir.join(format!("console-{name}.png"));
        let log = screenshot(&url, PAGE_MS, size, &path).await;
        let console = console_lines(&log);
        assert!(
            console.is_empty(),
            "{name}: the page logged:\n{}",
            console.join("\n")
        );
        println!(
            "console screenshot ({name}, {}x{}): {}",
            size.0,
            size.1,
            path.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_admin_key_the_console_shows_the_sign_in_form_and_no_data() {
    let p = Proc::start(moongate().args([
        "serve",
        "--port",
        "0",
        "--admin-api-key",
        "console-browser-key",
        "--worker-urls",
        "http://127.0.0.1:9",
    ]));
    let c = reqwest::Client::new();
    let cluster = format!("{}/cluster", p.base);
    assert_eq!(c.get(&cluster).send().await.unwrap().status(), 401);
    let ok = c
        .get(&cluster)
        .bearer_auth("console-browser-key")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let (dom, log) = dump_dom(&format!("{}/console", p.base), PAGE_MS).await;
    assert!(
        !attribute(&dom, "id=\"signin\"", "id").is_empty()
            && !dom[dom.find("id=\"signin\"").unwrap()..]
                .split('>')
                .next()
                .unwrap()
                .contains("hidden"),
        "the sign-in form is hidden"
    );
    assert!(
        dom.contains("missing or wrong admin API key"),
        "the 401 is not explained"
    );
    assert!(
        !dom.contains("127.0.0.1:9"),
        "a worker is shown to a browser without the key"
    );
    assert!(dom.contains("signed out"));
    // The refused read is the page's only request; a 401 is not a script error.
    let console = console_lines(&log);
    assert!(
        console.iter().all(|l| l.contains("401")),
        "the page logged:\n{}",
        console.join("\n")
    );
    drop(p.terminate());
}
