//! The disk tier end to end, on real files and real sockets: a node whose segment holds a
//! fifth of what is put keeps every value (evicted ones on its disk, read back when
//! asked for), and a node restarted on the same directory serves them again. (A record
//! corrupted on disk is a miss: `disk_tests` in the crate and the master's `tier_tests`.)

use std::time::{Duration, Instant};

use kvclient::{ClientConfig, Protocol, StoreClient, StoreError};
use kvmaster::{MasterConfig, MasterServer};
use openapi::master::MasterError;

const MIB: u64 = 1 << 20;
const VALUES: usize = 40;

fn value(i: usize) -> Vec<u8> {
    (0..MIB as usize)
        .map(|j| (i as u8).wrapping_mul(151) ^ (j as u8) ^ (j >> 12) as u8)
        .collect()
}

fn config(m: &MasterServer, segment: u64, disk: Option<&std::path::Path>) -> ClientConfig {
    ClientConfig {
        protocol: Protocol::Tcp,
        local_buffer_size: 4 * MIB,
        heartbeat_interval_ms: 100,
        disk_path: disk.map(Into::into),
        disk_capacity: 1 << 30,
        ..ClientConfig::local(&m.url(), segment)
    }
}

/// Retries `f` while the store answers "no room" or "not ready" (offloads and loads in
/// flight), for at most 20 s.
async fn retrying<T, F: std::future::Future<Output = Result<T, StoreError>>>(
    mut f: impl FnMut() -> F,
) -> Result<T, StoreError> {
    let start = Instant::now();
    loop {
        match f().await {
            Err(StoreError::Master(
                MasterError::NoAvailableHandle(_) | MasterError::ReplicaIsNotReady(_),
            )) if start.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            r => return r,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_values_live_on_disk_and_survive_a_node_restart() {
    // Read leases short enough that the small segment's values become evictable (and the
    // segment room for reads from disk) soon after they are read.
    let cfg = MasterConfig {
        lease_ttl_ms: 200,
        ..MasterConfig::default()
    };
    let m = MasterServer::start(cfg, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("tier");
    let node = StoreClient::connect(config(&m, 8 * MIB, Some(&disk)))
        .await
        .unwrap();
    let writer = StoreClient::connect(config(&m, 0, None)).await.unwrap();
    for i in 0..VALUES {
        let (k, v) = (format!("v{i}"), value(i));
        retrying(|| writer.put(&k, &v))
            .await
            .unwrap_or_else(|e| panic!("put v{i}: {e}"));
    }
    let (bytes, records) = node.disk().unwrap().usage();
    assert!(
        records >= VALUES - 8,
        "{records} records ({bytes} bytes) on disk"
    );
    // Every value reads back whole, most of them from disk through the node's memory.
    for i in 0..VALUES {
        let k = format!("v{i}");
        let got = retrying(|| writer.get(&k))
            .await
            .unwrap_or_else(|e| panic!("get v{i}: {e}"));
        assert!(got == value(i), "v{i} came back different");
    }
    let on_disk: Vec<String> = node
        .disk()
        .unwrap()
        .records()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert!(on_disk.len() >= VALUES - 8);

    // The node goes; a new one on the same directory serves the records again.
    node.close().await.unwrap();
    let node = StoreClient::connect(config(&m, 8 * MIB, Some(&disk)))
        .await
        .unwrap();
    assert_eq!(node.disk().unwrap().usage().1, on_disk.len());
    for k in &on_disk {
        let i: usize = k[1..].parse().unwrap();
        let got = retrying(|| async {
            match writer.get(k).await {
                // Not reported yet: the new node's first exchange is under way.
                Err(StoreError::Master(MasterError::ObjectNotFound(_))) => Err(StoreError::Master(
                    MasterError::ReplicaIsNotReady(k.clone()),
                )),
                r => r,
            }
        })
        .await
        .unwrap_or_else(|e| panic!("get {k} after the restart: {e}"));
        assert!(got == value(i), "{k} came back different after the restart");
    }

    node.close().await.unwrap();
    writer.close().await.unwrap();
}
