//! The zero-copy paths allocate nothing proportional to the value, and a loop of copying
//! `get`s reuses its buffer: a counting global allocator measures the bytes allocated per
//! operation (the whole process: client, master and storage node), one test at a time.

use std::alloc::System;

use kvclient::{BufRange, ClientConfig, StoreClient};
use kvclient::{Prefault, Protocol};
use kvmaster::{MasterConfig, MasterServer};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const OPS: usize = 40;

/// The allocation counter is the whole process's: the tests take turns.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Bytes allocated per operation while running `OPS` puts, then `OPS` gets, of `len` bytes.
async fn per_op(
    c: &StoreClient,
    tag: &str,
    buf: &transfer::RegisteredBuffer,
    len: usize,
) -> (u64, u64) {
    let keys: Vec<String> = (0..OPS).map(|i| format!("{tag}/{len}/{i}")).collect();
    let region = Region::new(GLOBAL);
    for k in &keys {
        c.put_from(k, BufRange::new(buf, 0, len)).await.unwrap();
    }
    let put = region.change().bytes_allocated as u64 / OPS as u64;
    let region = Region::new(GLOBAL);
    for k in &keys {
        assert_eq!(
            c.get_into(k, BufRange::new(buf, 0, len)).await.unwrap(),
            len as u64
        );
    }
    let get = region.change().bytes_allocated as u64 / OPS as u64;
    c.batch_remove(&keys, true).await;
    (put, get)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_copy_paths_allocate_nothing_proportional_to_the_value() {
    let _turn = TURN.lock().await;
    let m = MasterServer::start(MasterConfig::default(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    // Puts with reservations off (put-start, put-end) and on for both sizes (commit).
    for (protocol, reserve) in [
        (Protocol::Auto, 0),
        (Protocol::Auto, 256 << 20),
        (Protocol::Tcp, 256 << 20),
    ] {
        let cfg = |segment| ClientConfig {
            protocol,
            put_reserve_bytes: reserve,
            ..ClientConfig::local(&m.url(), segment)
        };
        // The node's segment faults in on first touch: only the client's buffers are
        // waited for below.
        let node = StoreClient::connect(ClientConfig {
            prefault: Prefault::Off,
            ..cfg(1 << 30)
        })
        .await
        .unwrap();
        let c = StoreClient::connect(cfg(0)).await.unwrap();
        let buf = c.alloc(16 << 20).unwrap();
        buf.write_at(0, &[7u8; 4096]).unwrap();
        // The client's background fault-in makes its value buffer (an allocation of the
        // copy buffer's size): let it finish, as in a client that started long before.
        let resident = tokio::task::spawn_blocking(|| {
            transfer::memory::wait_for_background_prefaults(std::time::Duration::from_secs(120))
        })
        .await
        .unwrap();
        assert!(resident, "background fault-in never ended");
        // Warm up connections, descriptor caches and pools.
        per_op(&c, "warm", &buf, 64 << 10).await;
        let small = per_op(&c, "zc", &buf, 64 << 10).await;
        let large = per_op(&c, "zc", &buf, 16 << 20).await;
        println!(
            "{protocol:?} (reserve {reserve}): bytes allocated per op: 64 KiB values put {} get {}, 16 MiB values put {} get {}",
            small.0, small.1, large.0, large.1
        );
        for (what, s, l) in [
            ("put_from", small.0, large.0),
            ("get_into", small.1, large.1),
        ] {
            // 256x the value, not even 1% more allocation: nothing scales with the value.
            assert!(
                l < s + (16 << 10),
                "{protocol:?} {reserve} {what}: {s} B/op at 64 KiB, {l} B/op at 16 MiB"
            );
            assert!(l < 256 << 10, "{protocol:?} {what}: {l} B/op");
        }
        c.close().await.unwrap();
        node.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_of_gets_allocates_nothing_proportional_to_the_value() {
    let _turn = TURN.lock().await;
    let m = MasterServer::start(MasterConfig::default(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let cfg = |segment| ClientConfig {
        protocol: Protocol::Tcp,
        prefault: Prefault::Off,
        ..ClientConfig::local(&m.url(), segment)
    };
    let node = StoreClient::connect(cfg(64 << 20)).await.unwrap();
    let c = StoreClient::connect(cfg(0)).await.unwrap();
    for len in [256 << 10, 1 << 20, 5 << 20] {
        let key = format!("get/{len}");
        let v: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        node.put(&key, &v).await.unwrap();
        // The first get makes the buffer (and warms connections and caches).
        assert_eq!(c.get(&key).await.unwrap(), v);
        let region = Region::new(GLOBAL);
        for _ in 0..OPS {
            let got = c.get(&key).await.unwrap();
            assert_eq!(got.len(), len);
        }
        let per_get = region.change().bytes_allocated as u64 / OPS as u64;
        println!("{len}-byte values: {per_get} bytes allocated per get");
        // About 26 KiB a get here (requests and answers); a vector per value would add it.
        assert!(per_get < 64 << 10, "{len}-byte get: {per_get} B allocated");
    }
    c.close().await.unwrap();
    node.close().await.unwrap();
}
