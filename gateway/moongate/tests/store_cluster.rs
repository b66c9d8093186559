//! The store on a loopback cluster as users run it: a master (in-process, real HTTP), three
//! storage nodes as separate `moongate store` processes, and clients. Byte-exact round
//! trips, a replica surviving the loss of its twin, SIGKILL (objects become unreadable
//! within the client TTL and a get never returns wrong bytes), graceful unmount on SIGTERM,
//! and a node that starts before its master and remounts across a master restart.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kvclient::Protocol;
use kvclient::{ClientConfig, StoreClient};
use kvmaster::{MasterConfig, MasterServer};
use openapi::master::ReplicateConfig;

/// A `moongate store` process, killed when dropped.
struct Node {
    child: Child,
    segment: String,
    http: SocketAddr,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    /// Starts `moongate store` against `master` and waits for its ready line.
    fn start(master: &str, segment: &str, protocol: &str) -> Node {
        Self::start_with(master, segment, protocol, &["--listen", "127.0.0.1:0"])
    }

    /// Like [`Node::start`], with more flags.
    fn start_with(master: &str, segment: &str, protocol: &str, extra: &[&str]) -> Node {
        let mut child = Command::new(env!("CARGO_BIN_EXE_moongate"))
            .args([
                "store",
                "--master",
                master,
                "--segment-size",
                segment,
                "--local-buffer-size",
                "4M",
                "--http-listen",
                "127.0.0.1:0",
                "--protocol",
                protocol,
                "--heartbeat-interval-ms",
                "200",
            ])
            .args(extra)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn moongate store");
        let line = common::ready_line(&mut child);
        let word = |key: &str| {
            common::word_after(&line, key)
                .unwrap_or_else(|| panic!("no {key} in ready line {line:?}"))
        };
        Node {
            segment: word("segment"),
            http: word("http").parse().unwrap(),
            child,
        }
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends SIGTERM and waits (up to 10 s) for the process to exit.
    async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let mut exit = None;
        until(
            "moongate store to exit on SIGTERM",
            Duration::from_secs(10),
            async || {
                exit = self.child.try_wait().unwrap();
                exit.is_some()
            },
        )
        .await;
        exit.expect("exited")
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("http://{}{path}", self.http))
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }
}

async fn master(client_ttl_ms: u64, addr: &str) -> MasterServer {
    let cfg = MasterConfig {
        client_ttl_ms,
        ..MasterConfig::default()
    };
    MasterServer::start(cfg, addr.parse().unwrap())
        .await
        .unwrap()
}

async fn client(m: &str, protocol: Protocol) -> StoreClient {
    let cfg = ClientConfig {
        protocol,
        local_buffer_size: 16 << 20,
        ..ClientConfig::local(m, 0)
    };
    StoreClient::connect(cfg).await.unwrap()
}

use common::value;

/// Waits until `cond` holds, checking every 50 ms; fails the test after `limit`.
async fn until(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn on(segment: &str, replicas: u32) -> ReplicateConfig {
    ReplicateConfig {
        replica_num: replicas,
        preferred_segments: vec![segment.to_owned()],
        ..ReplicateConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_serve_byte_exact_round_trips() {
    let m = master(10_000, "127.0.0.1:0").await;
    let nodes = [
        Node::start(&m.url(), "64M", "auto"),
        Node::start(&m.url(), "64M", "tcp"),
        Node::start(&m.url(), "64M", "auto"),
    ];
    assert_eq!(m.master().segments().len(), 3);
    let shm = client(&m.url(), Protocol::Auto).await;
    let tcp = client(&m.url(), Protocol::Tcp).await;
    let sizes = [1usize, 100, 4096, 65_536, 1 << 20, (3 << 20) + 7];
    for (n, node) in nodes.iter().enumerate() {
        let writer = shm.with_replication(on(&node.segment, 1));
        for (i, &len) in sizes.iter().enumerate() {
            let key = format!("n{n}/v{i}");
            let v = value((n * 10 + i) as u64, len);
            writer.put(&key, &v).await.unwrap();
            let info = m.master().object(&key).unwrap();
            assert_eq!(info.replicas[0].segment.name(), node.segment);
            assert_eq!(tcp.get(&key).await.unwrap(), v, "{key} over TCP");
            assert_eq!(shm.get(&key).await.unwrap(), v, "{key} over shared memory");
        }
    }
    // Batches spread over the three nodes, zero-copy both ways.
    let src = tcp.alloc(64 * 4096).unwrap();
    let dst = tcp.alloc(64 * 4096).unwrap();
    let all = value(99, 64 * 4096);
    src.write_at(0, &all).unwrap();
    let items: Vec<(String, kvclient::BufRange<'_>)> = (0..64)
        .map(|i| {
            (
                format!("batch/{i}"),
                kvclient::BufRange::new(&src, i * 4096, 4096),
            )
        })
        .collect();
    assert!(tcp.batch_put_from(&items).await.iter().all(Result::is_ok));
    let segs: std::collections::HashSet<String> = (0..64)
        .map(|i| {
            m.master().object(&format!("batch/{i}")).unwrap().replicas[0]
                .segment
                .name()
                .to_owned()
        })
        .collect();
    assert_eq!(segs.len(), 3, "puts spread over every node");
    let back: Vec<(String, kvclient::BufRange<'_>)> = (0..64)
        .map(|i| {
            (
                format!("batch/{i}"),
                kvclient::BufRange::new(&dst, i * 4096, 4096),
            )
        })
        .collect();
    assert!(
        tcp.batch_get_into(&back)
            .await
            .iter()
            .all(|r| *r.as_ref().unwrap() == 4096)
    );
    assert_eq!(dst.to_vec(0, all.len()).unwrap(), all);
    // Each node reports itself healthy and exports its metrics.
    for node in &nodes {
        let (status, body) = node.get("/health").await;
        assert_eq!(status, 200, "{body}");
        let h: openapi::store::NodeHealth = serde_json::from_str(&body).unwrap();
        assert_eq!(h.segment, node.segment);
        assert_eq!(h.segment_bytes, 64 << 20);
        let (status, text) = node.get("/metrics").await;
        assert_eq!(status, 200);
        assert!(
            text.contains("moongate_store_segment_bytes 67108864"),
            "{text}"
        );
        assert!(text.contains("moongate_store_mounted 1"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_makes_objects_unreadable_within_the_ttl_and_never_wrong() {
    let m = master(1500, "127.0.0.1:0").await;
    let mut victim = Node::start(&m.url(), "32M", "auto");
    let _twin = Node::start(&m.url(), "32M", "auto");
    let c = client(&m.url(), Protocol::Auto).await;
    let single = c.with_replication(on(&victim.segment, 1));
    let double = c.with_replication(on(&victim.segment, 2));
    for i in 0..16u64 {
        single
            .put(&format!("one/{i}"), &value(i, 100_000))
            .await
            .unwrap();
        double
            .put(&format!("two/{i}"), &value(100 + i, 100_000))
            .await
            .unwrap();
    }
    // A reader hammers the objects while the node dies: every answer is exact or an error.
    let reader = c.clone();
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    let counts = Arc::new((AtomicU32::new(0), AtomicU32::new(0)));
    let seen = counts.clone();
    let hammer = tokio::spawn(async move {
        while !stopped.is_cancelled() {
            for i in 0..16u64 {
                match reader.get(&format!("one/{i}")).await {
                    Ok(v) => {
                        assert_eq!(v, value(i, 100_000), "one/{i} returned wrong bytes");
                        seen.0.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        seen.1.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    });
    let (ok, failed) = (
        || counts.0.load(Ordering::Relaxed),
        || counts.1.load(Ordering::Relaxed),
    );
    until(
        "the reader to read the live node",
        Duration::from_secs(5),
        async || ok() > 0,
    )
    .await;
    let killed = Instant::now();
    victim.kill();
    // At once: the single-replica objects fail (the peer is gone), never yield bytes...
    let e = c.get("one/0").await.unwrap_err();
    assert!(
        matches!(e.name(), "TRANSFER_FAIL" | "OBJECT_NOT_FOUND"),
        "{e}"
    );
    // ...while the doubly-replicated ones are served by the twin.
    for i in 0..16u64 {
        assert_eq!(
            c.get(&format!("two/{i}")).await.unwrap(),
            value(100 + i, 100_000)
        );
    }
    // Within the client TTL (1.5 s, swept every 100 ms) the master forgets the segment.
    until(
        "the dead node's objects to vanish",
        Duration::from_secs(5),
        async || m.master().segments().len() == 1,
    )
    .await;
    assert!(
        killed.elapsed() < Duration::from_secs(4),
        "took {:?}",
        killed.elapsed()
    );
    for i in 0..16u64 {
        assert_eq!(
            c.get(&format!("one/{i}")).await.unwrap_err().name(),
            "OBJECT_NOT_FOUND"
        );
        assert_eq!(
            c.get(&format!("two/{i}")).await.unwrap(),
            value(100 + i, 100_000)
        );
    }
    // The reader, still running, saw the loss too (and never wrong bytes: it asserts).
    until(
        "the reader to see the node gone",
        Duration::from_secs(5),
        async || failed() > 0,
    )
    .await;
    stop.cancel();
    hammer.await.unwrap();
}

/// Resident bytes of process `pid` (its `VmRSS`, shared memory included).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib << 10
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_mounts_its_segment_once_resident_and_takes_values_at_once() {
    let m = master(60_000, "127.0.0.1:0").await;
    let node = Node::start(&m.url(), "256M", "auto");
    // Ready means mounted, and the segment was faulted in before the master heard of it:
    // the node's first writers meet resident memory, not a page fault per 4 KiB.
    assert_eq!(m.master().segments().len(), 1);
    let rss = resident_bytes(node.child.id());
    assert!(rss >= 256 << 20, "mounted with {} MiB resident", rss >> 20);
    assert_eq!(node.get("/health").await.0, 200);
    // A first mount, not a remount: the master holds no space of it back.
    let c = client(&m.url(), Protocol::Auto).await;
    let v = value(1, 1 << 20);
    c.with_replication(on(&node.segment, 1))
        .put("first", &v)
        .await
        .unwrap();
    assert_eq!(c.get("first").await.unwrap(), v);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_unmounts_at_once() {
    let m = master(60_000, "127.0.0.1:0").await;
    let mut node = Node::start(&m.url(), "16M", "auto");
    let c = client(&m.url(), Protocol::Auto).await;
    c.put("k", b"v").await.unwrap();
    assert_eq!(m.master().segments().len(), 1);
    let status = node.terminate().await;
    assert!(status.success(), "exit status {status}");
    // Not after a 60 s TTL: the node unmounted on its way out.
    assert!(m.master().segments().is_empty());
    assert_eq!(c.get("k").await.unwrap_err().name(), "OBJECT_NOT_FOUND");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_waits_for_its_master_and_remounts_after_a_restart() {
    // Pick the master's address, then start the node before the master listens on it.
    let addr = common::restartable_loopback_addr();
    let url = format!("http://{addr}");
    let node = Node::start(&url, "16M", "auto");
    let (status, body) = node.get("/health").await;
    assert_eq!(status, 503, "no master yet: {body}");
    let m = master(10_000, &addr).await;
    until("the node to mount", Duration::from_secs(5), async || {
        m.master().segments().len() == 1
    })
    .await;
    until(
        "the node to report healthy",
        Duration::from_secs(5),
        async || node.get("/health").await.0 == 200,
    )
    .await;
    m.stop(Duration::from_secs(2)).await;
    // Reservations of 5 s: a remounted segment takes no values for their use window,
    // 500 ms, since a client may still write into space reserved before the restart.
    let m = MasterServer::start(
        MasterConfig {
            client_ttl_ms: 10_000,
            reservation_ttl_ms: 5_000,
            ..MasterConfig::default()
        },
        addr.parse().unwrap(),
    )
    .await
    .unwrap();
    until("the node to remount", Duration::from_secs(5), async || {
        m.master().segments().len() == 1
    })
    .await;
    let c = client(&url, Protocol::Tcp).await;
    until(
        "the remounted segment to take values",
        Duration::from_secs(10),
        async || match c.put("after-restart", &value(5, 70_000)).await {
            Ok(()) => true,
            Err(e) if e.name() == "NO_AVAILABLE_HANDLE" && e.to_string().contains("remounted") => {
                false
            }
            Err(e) => panic!("put after the remount: {e}"),
        },
    )
    .await;
    assert_eq!(c.get("after-restart").await.unwrap(), value(5, 70_000));
    let (_, body) = node.get("/health").await;
    let h: openapi::store::NodeHealth = serde_json::from_str(&body).unwrap();
    assert!(h.remounts >= 2, "{body}");
}

#[test]
fn a_node_on_huge_pages_serves_or_says_why_not() {
    let out = Command::new(env!("CARGO_BIN_EXE_moongate"))
        .args([
            "store",
            "--master",
            "http://127.0.0.1:9",
            "--segment-size",
            "4M",
        ])
        .args([
            "--hugepages",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn moongate store");
    let mut child = out;
    let line = common::ready_line(&mut child);
    if line.starts_with("moongate store ready") {
        // This machine has huge pages reserved: the node serves on them.
        let _ = child.kill();
        let _ = child.wait();
        return;
    }
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("huge pages"),
        "the error names the cause: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_at_the_same_address_never_serves_its_predecessors_objects() {
    let m = master(60_000, "127.0.0.1:0").await;
    let c = client(&m.url(), Protocol::Auto).await;
    for protocol in ["auto", "tcp"] {
        let listen = common::restartable_loopback_addr();
        let mut old = Node::start_with(&m.url(), "16M", protocol, &["--listen", &listen]);
        let w = c.with_replication(on(&old.segment, 1));
        let keys: Vec<String> = (0..8).map(|i| format!("{protocol}/old/{i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            w.put(k, &value(i as u64, 50_000)).await.unwrap();
            assert_eq!(c.get(k).await.unwrap(), value(i as u64, 50_000));
        }
        let before = m.master().segments().len();
        old.kill();
        // Same address and transfer endpoint, new process and memory. The old segment stays
        // mounted (60 s client TTL); the new one mounts beside it under its own name.
        let new = Node::start_with(&m.url(), "16M", protocol, &["--listen", &listen]);
        assert_ne!(new.segment, old.segment);
        until(
            "the new node to mount",
            Duration::from_secs(5),
            async || m.master().segments().len() == before + 1,
        )
        .await;
        for k in &keys {
            let e = c.get(k).await.expect_err("the old node's objects are gone");
            assert_eq!(e.name(), "TRANSFER_FAIL", "{k}: {e}");
        }
        let fresh = c.with_replication(on(&new.segment, 1));
        fresh
            .put(&format!("{protocol}/new"), b"fresh")
            .await
            .unwrap();
        assert_eq!(
            c.get(&format!("{protocol}/new")).await.unwrap(),
            &b"fresh"[..]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_sigkilled_and_restarted_on_its_disk_serves_the_evicted_values_again() {
    // Short read leases: the small segment frees up soon after each read from disk.
    let cfg = MasterConfig {
        client_ttl_ms: 1000,
        lease_ttl_ms: 200,
        ..MasterConfig::default()
    };
    let m = MasterServer::start(cfg, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("tier");
    let disk_flags = [
        "--listen",
        "127.0.0.1:0",
        "--disk-path",
        disk.to_str().unwrap(),
    ];
    let mut node = Node::start_with(&m.url(), "8M", "tcp", &disk_flags);
    let c = client(&m.url(), Protocol::Tcp).await;
    let value = |i: usize| vec![i as u8 ^ 0x5a; 1 << 20];
    // Five times what the segment holds: most go to the node's disk as they are evicted.
    for i in 0..40 {
        let key = format!("d{i}");
        until("a put to find room", Duration::from_secs(20), async || {
            c.put(&key, &value(i)).await.is_ok()
        })
        .await;
    }
    // The keys the node's records hold (a record: 32-byte header with the key's length at
    // bytes 8..12, then the key).
    let keys_on_disk: Vec<String> = std::fs::read_dir(&disk)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rec"))
        .map(|p| {
            let b = std::fs::read(p).unwrap();
            let n = u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize;
            String::from_utf8(b[32..32 + n].to_vec()).unwrap()
        })
        .collect();
    assert!(
        keys_on_disk.len() >= 30,
        "{} records on disk",
        keys_on_disk.len()
    );
    node.kill();
    // Its successor (a new segment) reads the directory and reports the records; every one
    // is served again, byte-exact.
    let _node = Node::start_with(&m.url(), "8M", "tcp", &disk_flags);
    for key in &keys_on_disk {
        let i: usize = key[1..].parse().unwrap();
        let mut got = None;
        until(
            "a value on disk to be served again",
            Duration::from_secs(20),
            async || {
                got = c.get(key).await.ok();
                got.is_some()
            },
        )
        .await;
        assert!(got.unwrap() == value(i), "{key} came back different");
    }
}
