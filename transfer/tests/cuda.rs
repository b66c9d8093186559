//! Device memory on a real GPU: byte-exact transfers host to device and device to device
//! between two processes (the `transfer-bench` binary on both sides: it verifies every byte
//! it moved), over staged TCP and over CUDA IPC, and a soak of 1,000 transfers that must
//! leak neither device nor pinned memory.
//!
//! They need an NVIDIA GPU and driver, so they are `#[ignore]`d: run them on a GPU machine
//! with `cargo test -p transfer --test cuda -- --ignored`. Without a GPU they fail (loudly),
//! they never pass.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use transfer::device::cuda::Cuda;
use transfer::{EngineConfig, Location, TransferEngine, TransferRequest};

const BENCH: &str = env!("CARGO_BIN_EXE_transfer-bench");

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `transfer-bench` target with a 64 MiB buffer at `location`; its segment name.
fn target(protocol: &str, location: &str) -> (Proc, String) {
    let mut child = Command::new(BENCH)
        .args([
            "--mode",
            "target",
            "--listen",
            "127.0.0.1:0",
            "--buffer-size",
            "64M",
        ])
        .args(["--protocol", protocol, "--location", location])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn transfer-bench");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let name = line
        .split_whitespace()
        .skip_while(|w| *w != "segment")
        .nth(1)
        .unwrap_or_else(|| panic!("target did not start: {line:?}"))
        .to_owned();
    (Proc(child), name)
}

/// Runs a verifying initiator against `segment`; its output.
fn initiator(segment: &str, protocol: &str, location: &str, op: &str) -> String {
    let out = Command::new(BENCH)
        .args([
            "--mode",
            "initiator",
            "--segment",
            segment,
            "--buffer-size",
            "64M",
        ])
        .args(["--protocol", protocol, "--location", location, "--op", op])
        .args([
            "--block-size",
            "4M",
            "--batch-size",
            "4",
            "--duration",
            "0.5",
        ])
        .output()
        .expect("run transfer-bench");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{protocol} {op} from {location} to {segment}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("bytes match"), "not verified: {text}");
    text
}

fn route_bytes(out: &str, route: &str) -> u64 {
    let line = out
        .lines()
        .find(|l| l.starts_with("routes:"))
        .expect("routes line");
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == route).expect("route named");
    words[at + 1].parse().unwrap()
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p transfer --test cuda -- --ignored"]
fn two_processes_move_device_memory_byte_exact_over_staged_tcp() {
    for (t, i) in [("cuda:0", "cuda:0"), ("cpu", "cuda:0"), ("cuda:0", "cpu")] {
        let (_target, seg) = target("tcp", t);
        for op in ["write", "read"] {
            let out = initiator(&seg, "tcp", i, op);
            assert!(route_bytes(&out, "tcp") > 0, "{out}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p transfer --test cuda -- --ignored"]
fn two_processes_move_device_memory_byte_exact_through_cuda_ipc() {
    let (_target, seg) = target("shm", "cuda:0");
    for (i, route) in [("cuda:0", "ipc"), ("cpu", "ipc")] {
        for op in ["write", "read"] {
            let out = initiator(&seg, "shm", i, op);
            assert!(route_bytes(&out, route) > 0, "{i} {op}: {out}");
            assert_eq!(route_bytes(&out, "tcp"), 0, "{i} {op}: {out}");
        }
    }
    // A host target and a device initiator on one host: shared memory, copied by the device.
    let (_host, seg) = target("shm", "cpu");
    let out = initiator(&seg, "shm", "cuda:0", "write");
    assert!(route_bytes(&out, "shm") > 0, "{out}");
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU: cargo test -p transfer --test cuda -- --ignored"]
async fn a_thousand_transfers_leak_neither_device_nor_pinned_memory() {
    let cuda = Cuda::load(None).expect("a CUDA driver");
    let cfg = EngineConfig {
        shm: false,
        device_ipc: false,
        io_timeout: Duration::from_secs(20),
        ..common::config(false)
    };
    let a = TransferEngine::new(cfg.clone()).await.unwrap();
    let b = TransferEngine::new(cfg).await.unwrap();
    let remote = b.alloc_device(0, 64 << 20).unwrap();
    let host = a.alloc(16 << 20).unwrap();
    common::fill(&host, 11);
    let seg = a.open_segment(b.segment_name()).await.unwrap();
    let round = |i: usize, local: transfer::RegisteredBuffer| {
        let (a, seg, remote, host) = (a.clone(), seg.clone(), remote.clone(), host.clone());
        async move {
            let len = [4096usize, 65_537, 1 << 20, (3 << 20) + 5][i % 4];
            let at = remote.addr() + ((i * 1_048_583) % (48 << 20)) as u64;
            a.transfer(TransferRequest::write(&host, 0, &seg, at, len))
                .await
                .unwrap();
            a.transfer(TransferRequest::read(&local, 0, &seg, at, len))
                .await
                .unwrap();
            if i.is_multiple_of(50) {
                assert_eq!(local.to_vec(0, len).unwrap(), host.to_vec(0, len).unwrap());
            }
        }
    };
    // Warm up: streams, contexts, the staging pools.
    let local = a.alloc_device(0, 4 << 20).unwrap();
    for i in 0..8 {
        round(i, local.clone()).await;
    }
    drop(local);
    let (free0, _) = cuda.mem_info(0).unwrap();
    let mut local = a.alloc_device(0, 4 << 20).unwrap();
    for i in 0..1000usize {
        if i.is_multiple_of(100) {
            // Registrations come and go too (device memory freed with the last handle).
            local = a.alloc_device(0, 4 << 20).unwrap();
        }
        round(i, local.clone()).await;
    }
    drop(local);
    let (free1, _) = cuda.mem_info(0).unwrap();
    assert_eq!(
        free1,
        free0,
        "device memory leaked: {} bytes",
        free0 as i64 - free1 as i64
    );
    for e in [&a, &b] {
        let s = e.staging_stats().unwrap();
        assert_eq!(s.in_use, 0, "{s:?}");
        assert!(
            s.allocated <= 4 * s.per_peer_limit,
            "pinned memory grew: {s:?}"
        );
    }
    assert_eq!(b.locate(remote.addr()).unwrap(), Location::Cuda(0));
}
