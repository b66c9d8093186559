//! CUDA IPC between two real processes, with the fake device of `common::fake_device` (its
//! IPC handle names the owner's memfd, which the opener maps through `/proc`): the path a
//! prefill and a decode on one GPU host take, with the owner's control block checked across
//! processes and the owner killed mid-way.
//!
//! `harness = false`: `main` is the test. It runs this same binary again as the child
//! (`device_ipc_process child`), which owns the device memory.

mod common;
#[path = "common/fake_device.rs"]
mod fake_device;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use fake_device::FakeDevice;
use transfer::{EngineConfig, TransferEngine, TransferError, TransferRequest};

const LEN: usize = 4 << 20;
/// Both processes' fake runtimes name their device alike: they see the same device.
const UUIDS: &str = "one-host";

fn config() -> EngineConfig {
    EngineConfig {
        shm: true,
        device_ipc: true,
        device_staging_chunk: 64 << 10,
        io_timeout: Duration::from_secs(10),
        ..common::config(true)
    }
}

async fn engine(fake: &std::sync::Arc<FakeDevice>) -> TransferEngine {
    TransferEngine::builder()
        .config(config())
        .device_backend(fake.clone())
        .build()
        .await
        .expect("engine starts")
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("child") {
        return runtime.block_on(child());
    }
    if args.iter().any(|a| a == "--list") {
        println!("ipc_between_two_processes: test");
        return;
    }
    runtime.block_on(parent());
    println!("test ipc_between_two_processes ... ok");
}

/// Owns 4 MiB of device memory filled with pattern 1, registered as two regions of one
/// allocation (as SGLang's per-layer buffers may be), prints its segment and address, then
/// answers `check SEED OFF LEN` lines (are those bytes pattern SEED?) until stdin closes.
async fn child() {
    use transfer::DeviceBackend;
    let fake = FakeDevice::new(1, UUIDS);
    let e = engine(&fake).await;
    let mem = std::sync::Arc::new(fake.alloc_device(0, LEN).unwrap());
    let ptr = mem.addr() as *mut u8;
    // SAFETY: both halves lie in `mem`, which each registration keeps alive.
    let dev = unsafe { e.register_raw_at(ptr, LEN / 2, None, mem.clone()) }.unwrap();
    // SAFETY: as above.
    let upper = unsafe { e.register_raw_at(ptr.wrapping_add(LEN / 2), LEN / 2, None, mem) };
    let upper = upper.unwrap();
    let pattern = common::random_bytes(1, LEN);
    dev.write_at(0, &pattern[..LEN / 2]).unwrap();
    upper.write_at(0, &pattern[LEN / 2..]).unwrap();
    println!("{} {} {}", e.segment_name(), dev.addr(), std::process::id());
    let stdin = BufReader::new(std::io::stdin());
    for line in stdin.lines() {
        let line = line.unwrap();
        let w: Vec<usize> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect();
        let (seed, off, len) = (w[0] as u64, w[1], w[2]);
        let ok = dev.to_vec(off, len).unwrap() == common::random_bytes(seed, len);
        println!("{}", if ok { "ok" } else { "bad" });
        std::io::stdout().flush().unwrap();
    }
}

async fn parent() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("child")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w.len(), 3, "child did not start: {line:?}");
    let (segment, addr) = (w[0].to_owned(), w[1].parse::<u64>().unwrap());
    let mut ask = |q: String| {
        writeln!(stdin, "{q}").unwrap();
        stdin.flush().unwrap();
        let mut a = String::new();
        out.read_line(&mut a).unwrap();
        a.trim().to_owned()
    };

    let fake = FakeDevice::new(1, UUIDS);
    let e = engine(&fake).await;
    let seg = e.open_segment(&segment).await.unwrap();
    let d = seg.descriptor();
    let region = d.regions.iter().find(|r| r.addr == addr).unwrap();
    let ipc = region
        .cuda_ipc
        .as_ref()
        .expect("the child's device memory is exported");
    assert_ne!(ipc.control.pid, std::process::id());
    // Host and device buffers here, both ways, through the child's exported memory.
    let host = e.alloc(LEN).unwrap();
    let dev = e.alloc_device(0, LEN).unwrap();
    for half in [0, LEN / 2] {
        e.transfer(TransferRequest::read(
            &host,
            half,
            &seg,
            addr + half as u64,
            LEN / 2,
        ))
        .await
        .unwrap();
    }
    let same = |got: Vec<u8>, want: Vec<u8>, what: &str| {
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b);
            panic!("{what}: differs first at {at:?} (stats {:?})", e.stats());
        }
    };
    same(
        host.to_vec(0, LEN).unwrap(),
        common::random_bytes(1, LEN),
        "the child's bytes",
    );
    let (off, len) = (12_345, (1 << 20) + 77);
    host.write_at(0, &common::random_bytes(2, len)).unwrap();
    e.transfer(TransferRequest::write(&host, 0, &seg, addr + off, len))
        .await
        .unwrap();
    assert_eq!(ask(format!("check 2 {off} {len}")), "ok");
    dev.write_at(0, &common::random_bytes(3, len)).unwrap();
    e.transfer(TransferRequest::write(&dev, 0, &seg, addr + off, len))
        .await
        .unwrap();
    assert_eq!(ask(format!("check 3 {off} {len}")), "ok");
    e.transfer(TransferRequest::read(&dev, len, &seg, addr + off, len))
        .await
        .unwrap();
    same(
        dev.to_vec(len, len).unwrap(),
        common::random_bytes(3, len),
        "read back",
    );
    let s = e.stats();
    assert!(s.ipc_bytes >= 4 * len as u64, "{s:?}");
    assert_eq!(s.tcp_bytes, 0, "{s:?}");
    assert_eq!(
        fake.ipc_opens.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the handle is opened once and kept, for both regions of the allocation"
    );
    // Requests past the region are refused before any copy.
    let r = e
        .transfer(TransferRequest::write(
            &host,
            0,
            &seg,
            addr + LEN as u64 - 10,
            20,
        ))
        .await;
    assert!(matches!(r, Err(TransferError::OutOfBounds { .. })), "{r:?}");

    // The owner dies: the next request fails at once (its control block's lock is gone),
    // it does not write into memory nobody owns.
    child.kill().unwrap();
    child.wait().unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        e.transfer(TransferRequest::write(&host, 0, &seg, addr, 4096)),
    )
    .await
    .expect("no hang");
    match r {
        Err(TransferError::PeerUnreachable { reason, .. }) => {
            assert!(
                reason.contains("exited") || reason.contains("connect"),
                "{reason}"
            )
        }
        other => panic!("expected the owner's death, got {other:?}"),
    }
}
