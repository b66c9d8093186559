//! Real separate processes (the `transfer-bench` binary) killed with SIGKILL in the middle
//! of transfers: the survivor sees a typed error within its timeout, never a hang, and keeps
//! serving.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use transfer::{EngineConfig, RequestStatus, TransferError, TransferRequest};

const BENCH: &str = env!("CARGO_BIN_EXE_transfer-bench");

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn sigkill(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// Starts `transfer-bench --mode target` and returns it with its segment name.
fn spawn_target(protocol: &str, buffer: &str) -> (Proc, String) {
    let mut child = Command::new(BENCH)
        .args([
            "--mode",
            "target",
            "--listen",
            "127.0.0.1:0",
            "--buffer-size",
            buffer,
            "--protocol",
            protocol,
        ])
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
        .unwrap_or_else(|| panic!("no ready line: {line:?}"))
        .to_owned();
    (Proc(child), name)
}

fn tcp_config() -> EngineConfig {
    EngineConfig {
        io_timeout: Duration::from_secs(3),
        request_timeout: Duration::from_secs(20),
        ..config(false)
    }
}

#[tokio::test]
async fn a_target_killed_mid_transfer_fails_the_batch_promptly() {
    let (mut target, name) = spawn_target("tcp", "16M");
    let initiator = transfer::TransferEngine::new(tcp_config()).await.unwrap();
    let seg = initiator.open_segment(&name).await.unwrap();
    let region = seg.regions()[0].clone();
    let local = initiator.alloc(16 << 20).unwrap();
    fill(&local, 41);
    // 1 GiB of writes, all into the target's 16 MiB.
    let reqs: Vec<_> = (0..64)
        .map(|_| TransferRequest::write(&local, 0, &seg, region.addr, 16 << 20))
        .collect();
    let batch = initiator.submit(reqs).await.unwrap();
    let t0 = Instant::now();
    while batch.status(0) == RequestStatus::Pending && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    target.sigkill();
    let killed = Instant::now();
    let results = batch.wait_all().await;
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "took {:?} after the kill",
        killed.elapsed()
    );
    let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        !failed.is_empty(),
        "the kill landed after the whole batch: make the batch bigger"
    );
    for e in &failed {
        assert!(
            matches!(e, TransferError::PeerUnreachable { segment, .. } if *segment == name),
            "{e}"
        );
    }
    // The segment is now known stale; using it again fails fast, typed, retryable.
    let err = initiator
        .transfer(TransferRequest::write(&local, 0, &seg, region.addr, 4096))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(killed.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_shared_memory_peer_that_died_is_an_error_not_a_silent_success() {
    let (mut target, name) = spawn_target("shm", "8M");
    let initiator = transfer::TransferEngine::new(config(true)).await.unwrap();
    let seg = initiator.open_segment(&name).await.unwrap();
    assert!(seg.is_same_host());
    let region = seg.regions()[0].clone();
    assert!(region.shm.is_some(), "the target allocated shared memory");
    let local = initiator.alloc(8 << 20).unwrap();
    fill(&local, 42);
    initiator
        .transfer(TransferRequest::write(
            &local,
            0,
            &seg,
            region.addr,
            8 << 20,
        ))
        .await
        .unwrap();
    let back = initiator.alloc(8 << 20).unwrap();
    initiator
        .transfer(TransferRequest::read(&back, 0, &seg, region.addr, 8 << 20))
        .await
        .unwrap();
    assert!(same_bytes(&local, 0, &back, 0, 8 << 20));
    assert_eq!(initiator.stats().tcp_bytes, 0, "went through shared memory");
    target.sigkill();
    let err = initiator
        .transfer(TransferRequest::write(&local, 0, &seg, region.addr, 4096))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, TransferError::PeerUnreachable { reason, .. } if reason.contains("exited")),
        "{err}"
    );
}

#[tokio::test]
async fn an_initiator_killed_mid_transfer_leaves_the_target_serving() {
    let target = transfer::TransferEngine::new(tcp_config()).await.unwrap();
    let remote = target.alloc(64 << 20).unwrap();
    let mut child = Proc(
        Command::new(BENCH)
            .args([
                "--mode",
                "initiator",
                "--listen",
                "127.0.0.1:0",
                "--segment",
                target.segment_name(),
            ])
            .args([
                "--block-size",
                "16M",
                "--buffer-size",
                "64M",
                "--duration",
                "30",
                "--op",
                "write",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    // Wait until its writes stream in, then kill it.
    let t0 = Instant::now();
    while remote.to_vec(0, 64).unwrap() == [0u8; 64] {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the initiator never wrote"
        );
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "the initiator exited early"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.sigkill();
    // A new initiator is served as usual.
    let other = transfer::TransferEngine::new(tcp_config()).await.unwrap();
    let seg = other.open_segment(target.segment_name()).await.unwrap();
    let local = other.alloc(64 << 20).unwrap();
    fill(&local, 43);
    write_checked(&other, &local, 0, &seg, &remote, 0, 64 << 20).await;
    assert_eq!(target.registered_regions(), 1);
}

/// `transfer-bench ... | head -1`: a reader that leaves early is not a crash.
#[test]
fn a_closed_standard_output_is_not_a_crash() {
    let mut child = Command::new(BENCH)
        .args(["--mode", "memcpy", "--buffer-size", "1M", "--duration", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
}
