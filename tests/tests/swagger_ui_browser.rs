//! Swagger UI at `/docs/` in a real browser: headless Debian Chromium loads the page, its
//! scripts fetch `/api-docs/openapi.json` and render it, and the DOM after the scripts ran
//! lists every operation of the document, for `moongate serve` (with the master) and for
//! `moongate master`. The page runs under its Content-Security-Policy: a fetch of anything
//! but this server would be refused and logged, and the test fails on any such log line.
//!
//! Needs the `browser` feature and `chromium` (or `MOONGATE_CHROMIUM=/path/to/chromium`):
//! `cargo test -p moongate-tests --features browser --test swagger_ui_browser`.
#![cfg(feature = "browser")]

use gateway::config::{MasterHostConfig, Secret};
use moongate_tests::browser::{console_lines, dump_dom};
use moongate_tests::{fast_config, get_json, operations, start_gateway};
use serde_json::Value;

/// Opens `{base}/docs/` and checks that the UI lists each operation of the document `base`
/// serves (Swagger UI's element id `operations-{tag}-{operationId}`), nothing more, with the
/// Authorize button of the admin key, and that the page loaded nothing from elsewhere.
async fn check_docs_page(base: &str) {
    let doc: Value = get_json(
        &reqwest::Client::new(),
        &format!("{base}/api-docs/openapi.json"),
    )
    .await;
    let ops = operations(&doc);
    assert!(ops.len() > 10, "{} operations", ops.len());
    let (dom, log) = dump_dom(&format!("{base}/docs/"), 30_000).await;
    let console = console_lines(&log);
    assert!(
        !console
            .iter()
            .any(|l| l.contains("Content Security Policy") || l.contains("Failed to load")),
        "the page tried to load something it may not:\n{}",
        console.join("\n")
    );
    for op in &ops {
        let id = format!("id=\"operations-{}-{}\"", op.tag, op.id);
        assert!(
            dom.contains(&id),
            "{} {} ({id}) is not listed by Swagger UI; console:\n{}",
            op.method,
            op.path,
            console.join("\n")
        );
    }
    let listed = dom.matches("class=\"opblock opblock-").count();
    assert_eq!(listed, ops.len(), "operations rendered vs documented");
    assert!(
        dom.contains("class=\"btn authorize"),
        "no Authorize button for the admin key"
    );
    let title = doc["info"]["title"].as_str().unwrap();
    assert!(dom.contains(title), "the title {title:?} is not shown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swagger_ui_lists_every_operation_of_serve() {
    let mut cfg = fast_config();
    cfg.admin_api_key = Some(Secret::new("browser-key"));
    let gw = start_gateway(cfg).await;
    check_docs_page(&gw.url()).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swagger_ui_lists_every_operation_of_master_alone() {
    let cfg = MasterHostConfig {
        host: "127.0.0.1".into(),
        port: 0,
        ..MasterHostConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let m = gateway::master::spawn_master(cfg, listener).await.unwrap();
    check_docs_page(&m.url()).await;
    m.shutdown().await;
}
