//! The disk tier end to end, on real files and real sockets: a node whose segment holds a
//! fifth of what is put keeps every value (evicted ones on its disk, read back when
//! asked for), and a node restarted on the same directory serves them again; a node reads
//! the values on its own disk there, without a load, and a record torn on its disk is a
//! miss the master hears of. (More on corrupt records: `disk_tests` in the crate and the
//! master's `tier_tests`.)

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

/// The keys of `client`'s values that lie only on disk now, by the master's description.
async fn only_on_disk(client: &StoreClient, keys: &[String]) -> Vec<String> {
    let ks: Vec<&str> = keys.iter().map(String::as_str).collect();
    let described = client.describe_replicas(&ks).await;
    keys.iter()
        .zip(described)
        .filter(|(_, d)| {
            d.as_ref().is_ok_and(|(_, rs)| {
                rs.iter()
                    .all(|r| r.kind == openapi::master::ReplicaKind::LocalDisk)
            })
        })
        .map(|(k, _)| k.clone())
        .collect()
}

/// A master (`cfg`), and a node with a 4 MiB segment and a disk tier in `dir` that put 12
/// values of 1 MiB (`{prefix}{i}`) itself: answers them, the node, and the keys of those
/// that lie only on its disk once at least four do.
async fn node_with_cold_values(
    cfg: MasterConfig,
    dir: &std::path::Path,
    prefix: &str,
) -> (MasterServer, StoreClient, Vec<String>, Vec<String>) {
    let m = MasterServer::start(cfg, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let node = StoreClient::connect(config(&m, 4 * MIB, Some(dir)))
        .await
        .unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("{prefix}{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        let v = value(i);
        retrying(|| node.put(k, &v))
            .await
            .unwrap_or_else(|e| panic!("put {k}: {e}"));
    }
    // Values were evicted to make room: once their offloads are reported, they lie on
    // the node's disk only.
    let deadline = Instant::now() + Duration::from_secs(20);
    let cold = loop {
        let cold = only_on_disk(&node, &keys).await;
        if cold.len() >= 4 || Instant::now() > deadline {
            break cold;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(cold.len() >= 4, "only {cold:?} went to disk alone");
    (m, node, keys, cold)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reads_its_own_disk_without_a_load_and_reports_a_corrupt_record() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("tier");
    let (m, node, _, mut cold) = node_with_cold_values(MasterConfig::default(), &disk, "own").await;
    cold.truncate(4);
    let before = m.master().tier_stats();
    let reads = |n: &StoreClient| {
        n.disk()
            .unwrap()
            .counters()
            .reads
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let read_before = reads(&node);
    // One at a time and as a batch: straight from the node's own files, no load.
    for k in &cold[..2] {
        let i: usize = k[3..].parse().unwrap();
        assert!(
            node.get(k).await.unwrap() == value(i),
            "{k} came back different"
        );
    }
    let got = node.batch_get(&cold[2..3]).await;
    for (k, g) in cold[2..3].iter().zip(got) {
        let i: usize = k[3..].parse().unwrap();
        assert!(g.unwrap() == value(i), "{k} came back different");
    }
    assert_eq!(m.master().tier_stats().loads, before.loads, "a load ran");
    assert_eq!(reads(&node), read_before + 3);
    assert_eq!(only_on_disk(&node, &cold).await.len(), 4, "promoted");
    // Read again (and again while the segment has no room: the master evicts for it), a
    // value is promoted: copied back into the node's memory.
    let k = &cold[0];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(node.get(k).await.unwrap() == value(k[3..].parse().unwrap()));
        if only_on_disk(&node, &cold[..1]).await.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{k} was never promoted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(m.master().tier_stats().promotions, 1);

    // A record torn behind the node's back is a miss, never its bytes, and the master
    // hears it is gone.
    let victim = &cold[3];
    let file = disk.join(format!(
        "{}.rec",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(victim.as_bytes()))
    ));
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    match node.get(victim).await {
        Err(StoreError::Master(MasterError::ObjectNotFound(_))) => {}
        r => panic!("a torn record answered {:?}", r.map(|v| v.len())),
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while node.exists(victim).await.unwrap() || m.master().tier_stats().dropped == before.dropped {
        assert!(Instant::now() < deadline, "the master never heard");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(m.master().tier_stats().dropped, before.dropped + 1);
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_unmounts_its_disk_keeps_its_memory_and_loses_what_only_the_disk_held() {
    let dir = tempfile::tempdir().unwrap();
    // Leases short enough that the values read stop holding the segment soon.
    let cfg = MasterConfig {
        lease_ttl_ms: 200,
        ..MasterConfig::default()
    };
    let (m, node, keys, cold) = node_with_cold_values(cfg, &dir.path().join("tier"), "u").await;
    let writes = |n: &StoreClient| {
        n.disk()
            .unwrap()
            .counters()
            .writes
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let dropped = node.unmount_disk(Duration::ZERO).await.unwrap();
    assert!(dropped as usize >= cold.len(), "{dropped} dropped");
    assert_eq!(m.master().tier_stats().on_disk_objects, 0);
    // What lived only on the disk is a miss now; what is in memory still reads.
    for k in &cold {
        assert!(
            matches!(
                node.get(k).await,
                Err(StoreError::Master(MasterError::ObjectNotFound(_)))
            ),
            "{k} still read"
        );
    }
    let warm: Vec<&String> = keys.iter().filter(|k| !cold.contains(k)).collect();
    let mut read_warm = 0;
    for k in warm {
        if let Ok(v) = node.get(k).await {
            assert!(
                v == value(k[1..].parse().unwrap()),
                "{k} came back different"
            );
            read_warm += 1;
        }
    }
    assert!(read_warm > 0, "nothing left in memory");
    // The records stay in the directory; unmounting again does nothing; values evicted
    // from now on are not written to the disk.
    assert!(node.disk().unwrap().usage().1 >= cold.len());
    assert_eq!(node.unmount_disk(Duration::ZERO).await.unwrap(), 0);
    let before = writes(&node);
    for i in 12..24 {
        let (k, v) = (format!("u{i}"), value(i));
        retrying(|| node.put(&k, &v)).await.unwrap();
    }
    assert_eq!(writes(&node), before);
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fails_goes_on_from_memory_alone() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("tier");
    let cfg = MasterConfig {
        lease_ttl_ms: 200,
        ..MasterConfig::default()
    };
    let (m, node, _, cold) = node_with_cold_values(cfg, &disk, "f").await;
    // The disk goes away under the node (a failed or unmounted device): every write fails.
    // The node may still be writing the last offloads: a file it adds while the directory
    // is emptied makes the removal fail, so it is tried again (a bounded number of times).
    let removed = (0..1000).any(|_| match std::fs::remove_dir_all(&disk) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => false,
        Err(e) => panic!("removing the disk directory: {e}"),
    });
    assert!(removed, "the disk directory could not be removed");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = 100;
    // Puts keep succeeding (each retried while offloads that will fail hold the room)
    // until the node gave up its disk: then eviction frees memory at once.
    while m.master().tier_stats().on_disk_objects > 0 {
        assert!(
            Instant::now() < deadline,
            "the node never went on without its disk"
        );
        let (k, v) = (format!("f{i}"), value(i));
        retrying(|| node.put(&k, &v)).await.unwrap();
        i += 1;
    }
    for k in &cold {
        assert!(matches!(
            node.get(k).await,
            Err(StoreError::Master(MasterError::ObjectNotFound(_)))
        ));
    }
    // From memory alone now: puts and gets go on.
    for j in i..i + 8 {
        let (k, v) = (format!("f{j}"), value(j));
        retrying(|| node.put(&k, &v)).await.unwrap();
        assert!(node.get(&k).await.unwrap() == v);
    }
    node.close().await.unwrap();
}
