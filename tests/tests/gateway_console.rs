//! The console's data and page over real sockets (the page in a browser is
//! `moongate`'s `console_browser` test): `/cluster` lists the workers with their load, the
//! routing decisions of the policy in force and the hosted master's totals and segments,
//! behind the admin key; `/console` is one self-contained page whose
//! Content-Security-Policy names exactly its inline script and style.

use base64::Engine;
use gateway::config::{PolicyKind, Secret};
use kvclient::{ClientConfig, StoreClient};
use moongate_tests::{Backend, get_json_as, post, start_regular_gateway};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

#[tokio::test]
async fn cluster_shows_workers_routing_and_the_master_behind_the_admin_key() {
    let ws = [
        Backend::start("a", "m").await,
        Backend::start("b", "m").await,
    ];
    let gw = start_regular_gateway(&ws.iter().collect::<Vec<_>>(), |c| {
        c.policy = PolicyKind::CacheAware;
        c.admin_api_key = Some(Secret::new("console-admin"));
        c.store_api_key = Some(Secret::new("console-store"));
    })
    .await;
    let c = reqwest::Client::new();
    let base = gw.url();
    let cluster = format!("{base}/cluster");
    let refused = c.get(&cluster).send().await.unwrap();
    assert_eq!(refused.status(), 401);
    let envelope: Value = refused.json().await.unwrap();
    assert!(
        envelope["error"]["message"]
            .as_str()
            .unwrap()
            .contains("admin API key")
    );

    // One store client with a segment, a value put and read, and a miss.
    let store = StoreClient::connect(ClientConfig {
        local_buffer_size: 1 << 20,
        store_api_key: Some(Secret::new("console-store")),
        ..ClientConfig::local(&base, 1 << 20)
    })
    .await
    .unwrap();
    store.put("console-key", &[7u8; 4096]).await.unwrap();
    assert_eq!(store.get("console-key").await.unwrap(), vec![7u8; 4096]);
    assert!(store.get("console-absent").await.is_err());

    let system = "You are the console's test. ".repeat(40);
    for i in 0..4 {
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("question {i}")},
        ]});
        assert_eq!(
            post(&c, &format!("{base}/v1/chat/completions"), &body)
                .await
                .status(),
            200
        );
    }
    let view = get_json_as(&c, &cluster, "console-admin").await;
    assert_eq!(view["gateway"]["mode"], "regular");
    assert_eq!(view["gateway"]["policies"], json!(["cache_aware"]));
    let urls: Vec<&str> = view["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["info"]["url"].as_str().unwrap())
        .collect();
    assert_eq!(urls.len(), 2);
    for w in &ws {
        assert!(urls.contains(&w.url().as_str()), "{} in {urls:?}", w.url());
    }
    let cache_aware = view["routing"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["policy"] == "cache_aware")
        .unwrap();
    assert_eq!(cache_aware["in_use"], true);
    // Counts are the process's (other tests here route too): at least this test's.
    let decided: u64 = cache_aware["decisions"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert!(decided >= 4, "{cache_aware}");
    assert!(
        cache_aware["decisions"]["hit"].as_u64().unwrap() >= 3,
        "{cache_aware}"
    );
    let master = &view["master"];
    assert_eq!(master["role"], "alone");
    let stats = &master["stats"];
    assert_eq!(stats["keys"], 1);
    // The client may look a key up more than once per call; the core's exact counts are
    // kvmaster's test.
    assert!(stats["reads_from_memory"].as_u64().unwrap() >= 1, "{stats}");
    assert!(stats["read_misses"].as_u64().unwrap() >= 1, "{stats}");
    assert_eq!(stats["reads_from_disk"], 0);
    assert_eq!(master["segments"].as_array().unwrap().len(), 1);
    // The value, and any space the client reserved for its next puts.
    let allocations = master["segments"][0]["allocations"].as_u64().unwrap();
    assert_eq!(allocations, 1 + stats["reservations"].as_u64().unwrap());
    store.close().await.unwrap();
    gw.shutdown().await;
}

/// The text between `open` and `close` in `html`.
fn between<'a>(html: &'a str, open: &str, close: &str) -> &'a str {
    let start = html.find(open).unwrap() + open.len();
    &html[start..start + html[start..].find(close).unwrap()]
}

#[tokio::test]
async fn the_console_page_is_open_self_contained_and_runs_only_its_own_script() {
    let ws = [Backend::start("a", "m").await];
    let gw = start_regular_gateway(&ws.iter().collect::<Vec<_>>(), |c| {
        c.admin_api_key = Some(Secret::new("console-admin"));
    })
    .await;
    let r = reqwest::get(format!("{}/console", gw.url())).await.unwrap();
    assert_eq!(r.status(), 200, "the page is open: it holds no data");
    let header = |name: &str| r.headers()[name].to_str().unwrap().to_string();
    assert!(header("content-type").starts_with("text/html"));
    assert_eq!(header("x-content-type-options"), "nosniff");
    let csp = header("content-security-policy");
    let html = r.text().await.unwrap();
    let digest = |s: &str| base64::engine::general_purpose::STANDARD.encode(Sha256::digest(s));
    let script = between(&html, "<script>", "</script>");
    let style = between(&html, "<style>", "</style>");
    assert!(script.contains("fetch('/cluster'"), "the script is inline");
    for directive in [
        "default-src 'none'".to_string(),
        format!("script-src 'sha256-{}'", digest(script)),
        format!("style-src 'sha256-{}'", digest(style)),
        "connect-src 'self'".to_string(),
        "frame-ancestors 'none'".to_string(),
    ] {
        assert!(csp.contains(&directive), "{directive} not in {csp}");
    }
    // Nothing from elsewhere, and no other script or style block.
    assert_eq!(html.matches("<script").count(), 1);
    assert_eq!(html.matches("<style").count(), 1);
    for external in ["src=", "href=", "@import", "url("] {
        assert!(!html.contains(external), "{external} in the page");
    }
    // Markup from the server is never parsed as such: the script writes text only.
    assert!(!script.contains("innerHTML") && !script.contains("insertAdjacentHTML"));
    gw.shutdown().await;
}
