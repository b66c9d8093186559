//! What a client can hold of the gateway, over real sockets: a request whose counts are over
//! `--max-batch-size` (the reported `n = 1e11`, batches of a million items) is answered 400
//! before anything is sized by it, with the process's memory flat, in regular and PD mode;
//! a body trickled a byte at a time is cut at `--client-body-timeout-secs` with 408 and
//! gives its admission slot back; a connection that sends no head is closed at
//! `--client-header-timeout-secs`; at `--max-connections` a new connection waits until one
//! closes; `moongate master`'s listener does the same.

use std::time::{Duration, Instant};

use gateway::config::{MasterHostConfig, ServeConfig};
use moongate_tests::{Backend, eventually, start_pd_gateway, start_regular_gateway};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The process's resident memory, in bytes (`VmRSS` of `/proc/self/status`).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Bodies whose counts are over the default limit, each with the field its 400 names
/// (built once: a million-item body takes a while to write).
fn huge_bodies() -> &'static [(&'static str, &'static str, bytes::Bytes)] {
    static BODIES: std::sync::OnceLock<Vec<(&str, &str, bytes::Bytes)>> =
        std::sync::OnceLock::new();
    BODIES.get_or_init(|| {
        bodies()
            .into_iter()
            .map(|(p, s, b)| (p, s, bytes::Bytes::from(b)))
            .collect()
    })
}

fn bodies() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    vec![
        (
            "/v1/chat/completions",
            "n is 100000000000",
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"n":100000000000}"#
                .to_vec(),
        ),
        (
            "/v1/completions",
            "prompt is 200000",
            serde_json::to_vec(&json!({"model": "m", "prompt": vec!["x"; 200_000]})).unwrap(),
        ),
        (
            "/generate",
            "text is 1000000",
            serde_json::to_vec(&json!({"text": vec![""; 1_000_000]})).unwrap(),
        ),
        (
            "/generate",
            "input_ids is 1000000",
            serde_json::to_vec(&json!({"input_ids": vec![[7]; 1_000_000]})).unwrap(),
        ),
        (
            "/generate",
            "top_logprobs_num is 1000000000",
            br#"{"text":"x","return_logprob":true,"top_logprobs_num":1e9}"#.to_vec(),
        ),
    ]
}

/// Sends every huge body `rounds` times to `base`; each must be a 400 naming its count.
async fn send_huge(c: &reqwest::Client, base: &str, rounds: usize) {
    for _ in 0..rounds {
        for (path, says, body) in huge_bodies() {
            let r = c
                .post(format!("{base}{path}"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 400, "{path} {says}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "too_many_items", "{v}");
            assert_eq!(v["error"]["type"], "invalid_request_error");
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(
                msg.contains(says) && msg.contains("4096") && msg.contains("--max-batch-size"),
                "{msg}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_counts_are_400_with_memory_flat_in_regular_and_pd_mode() {
    let a = Backend::start("a", "m").await;
    let p = Backend::start("prefill", "m").await;
    let d = Backend::start("decode", "m").await;
    let regular = start_regular_gateway(&[&a], |_| {}).await;
    let pd = start_pd_gateway(&[(&p.url(), Some(8998))], &[&d.url()], |_| {}).await;
    eventually("PD workers ready", || pd.state().registry().counts().0 == 2).await;
    let c = reqwest::Client::new();
    // Warm up: the client's and the gateways' pools, buffers and lazy statics.
    send_huge(&c, &regular.url(), 1).await;
    send_huge(&c, &pd.url(), 1).await;
    let before = rss();
    send_huge(&c, &regular.url(), 3).await;
    send_huge(&c, &pd.url(), 3).await;
    let after = rss();
    println!(
        "RSS before {} KiB, after 30 refused requests {} KiB (growth {} KiB)",
        before / 1024,
        after / 1024,
        after.saturating_sub(before) / 1024
    );
    // Before the limit one such request minted 1e11 rooms (the process aborted), and a
    // million-item batch built a ~60 MB body per side.
    assert!(
        after.saturating_sub(before) < 32 << 20,
        "RSS grew from {before} to {after}"
    );
    assert_eq!(
        (a.hits(), p.hits(), d.hits()),
        (0, 0, 0),
        "nothing was forwarded"
    );
    // The limit itself is fine.
    let at_limit = json!({"text": vec!["x"; 4096], "sampling_params": {"max_new_tokens": 1}});
    let r = c
        .post(format!("{}/generate", pd.url()))
        .json(&at_limit)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sent: Value = serde_json::from_slice(&d.seen()[0].body).unwrap();
    assert_eq!(sent["bootstrap_room"].as_array().unwrap().len(), 4096);
    regular.shutdown().await;
    pd.shutdown().await;
}

/// Reads one HTTP/1.1 response (head and a `Content-Length` body) from `s`.
async fn read_response(s: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await.expect("read");
        assert!(
            n > 0,
            "closed before a response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status = head[9..12].parse().expect("status");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().expect("length"));
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).await.expect("read");
        assert!(n > 0, "closed mid-body");
        buf.extend_from_slice(&chunk[..n]);
    }
    (status, head, buf[head_end..head_end + len].to_vec())
}

/// Opens a connection to `addr` and starts a request whose body is trickled a byte every
/// 100 ms (far slower than any deadline here); returns it and when the head went out.
async fn trickle(addr: std::net::SocketAddr, path: &str) -> (TcpStream, Instant) {
    trickle_with(addr, path, "").await
}

/// [`trickle`] with extra header lines (each ending in `\r\n`).
async fn trickle_with(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &str,
) -> (TcpStream, Instant) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{headers}content-length: 200\r\n\r\n{{"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    (s, Instant::now())
}

/// Sends one byte every 100 ms on `s` until the server answers; then reads the answer.
async fn trickle_until_answered(mut s: TcpStream) -> (u16, String, Vec<u8>) {
    let (mut rd, mut wr) = s.split();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            n = rd.read(&mut chunk) => {
                let n = n.expect("read");
                if n == 0 {
                    break;
                }
                answer.extend_from_slice(&chunk[..n]);
            }
            _ = tick.tick() => {
                // The server may have closed its side already; the answer is what counts.
                let _ = wr.write_all(b" ").await;
            }
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    let status = head[9..12].parse().expect("status");
    (status, head.to_ascii_lowercase(), body.as_bytes().to_vec())
}

#[tokio::test]
async fn a_trickled_body_is_cut_at_the_timeout_with_408_and_frees_its_slot() {
    let a = Backend::start("a", "m").await;
    let gw = start_regular_gateway(&[&a], |c| {
        c.client_body_timeout_secs = 1;
        c.max_concurrent_requests = 1;
        c.queue_size = 0;
    })
    .await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", gw.url());
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let (s, sent) = trickle(gw.addr, "/v1/chat/completions").await;
    let answer = tokio::spawn(trickle_until_answered(s));
    // The trickler holds the only slot: everyone else is refused meanwhile.
    eventually("the trickler admitted", || {
        gw.state().admission().free_slots() == Some(0)
    })
    .await;
    assert_eq!(c.post(&url).json(&chat).send().await.unwrap().status(), 429);
    let (status, head, body) = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered within the bound")
        .unwrap();
    let took = sent.elapsed();
    assert_eq!(status, 408, "{head}");
    assert!(head.contains("connection: close"), "{head}");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "request_timeout", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--client-body-timeout-secs")
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(6),
        "cut at the timeout: {took:?}"
    );
    // Its slot is free again, and nothing reached the worker.
    eventually("the slot released", || {
        gw.state().admission().free_slots() == Some(1)
    })
    .await;
    assert_eq!(c.post(&url).json(&chat).send().await.unwrap().status(), 200);
    assert_eq!(a.hits(), 1);
    gw.shutdown().await;
}

/// Whether the server closes `s` within `within` (reading EOF or a reset).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut sink = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn connections_without_a_head_in_time_are_closed() {
    let a = Backend::start("a", "m").await;
    let gw = start_regular_gateway(&[&a], |c| c.client_header_timeout_secs = 1).await;
    // Silent, half a head, and idle after one request.
    let mut silent = TcpStream::connect(gw.addr).await.unwrap();
    let mut half = TcpStream::connect(gw.addr).await.unwrap();
    half.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(gw.addr).await.unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut idle).await.0, 200);
    let start = Instant::now();
    for (name, s) in [
        ("silent", &mut silent),
        ("half", &mut half),
        ("idle", &mut idle),
    ] {
        assert!(
            closed_within(s, Duration::from_secs(6)).await,
            "{name} connection still open"
        );
    }
    assert!(
        start.elapsed() >= Duration::from_millis(500),
        "not before the timeout"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn at_the_connection_cap_new_connections_wait_for_a_free_slot() {
    let a = Backend::start("a", "m").await;
    let gw = start_regular_gateway(&[&a], |c| c.max_connections = 1).await;
    let get = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n";
    // The gateway's own health traffic is outbound: the one slot is ours.
    let mut first = TcpStream::connect(gw.addr).await.unwrap();
    first.write_all(get).await.unwrap();
    assert_eq!(read_response(&mut first).await.0, 200);
    // The second connection is taken by the kernel's backlog, not served.
    let mut second = TcpStream::connect(gw.addr).await.unwrap();
    second.write_all(get).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(300), read_response(&mut second)).await;
    assert!(waited.is_err(), "served beyond the cap");
    // The first closes: the second is served.
    drop(first);
    let served = tokio::time::timeout(Duration::from_secs(5), read_response(&mut second))
        .await
        .expect("served once a slot freed");
    assert_eq!(served.0, 200);
    gw.shutdown().await;
}

#[tokio::test]
async fn moongate_masters_listener_has_the_same_limits() {
    let cfg = MasterHostConfig {
        client_header_timeout_secs: 1,
        client_body_timeout_secs: 1,
        store_api_key: Some(gateway::config::Secret::new("store-key-for-limits")),
        ..MasterHostConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let m = gateway::master::spawn_master(cfg, listener).await.unwrap();
    // A store-plane caller with the right key (the key is checked before the body is read).
    let (s, sent) = trickle_with(
        m.addr(),
        "/api/v1/objects/k/put-start",
        "authorization: Bearer store-key-for-limits\r\n",
    )
    .await;
    let (status, head, body) =
        tokio::time::timeout(Duration::from_secs(10), trickle_until_answered(s))
            .await
            .expect("answered within the bound");
    assert_eq!(status, 408, "{head}");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "request_timeout", "{v}");
    assert!(sent.elapsed() >= Duration::from_millis(900));
    let mut silent = TcpStream::connect(m.addr()).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(6)).await);
    m.shutdown().await;
}

#[test]
fn the_limits_have_their_documented_defaults() {
    let d = ServeConfig::default();
    assert_eq!(
        (
            d.max_batch_size,
            d.client_header_timeout_secs,
            d.client_body_timeout_secs,
            d.max_connections
        ),
        (4096, 60, 60, 10_000)
    );
    let m = MasterHostConfig::default();
    assert_eq!(
        (
            m.client_header_timeout_secs,
            m.client_body_timeout_secs,
            m.max_connections
        ),
        (60, 60, 10_000)
    );
}
