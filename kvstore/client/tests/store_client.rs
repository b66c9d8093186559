//! The store client against a real master over real HTTP on loopback, with real transfer
//! engines (shared memory and TCP): round trips, the zero-copy and batch forms, errors.

use std::time::{Duration, Instant};

use kvclient::{BufRange, ClientConfig, StoreClient, StoreError};
use kvclient::{Prefault, Protocol};
use kvmaster::{MasterConfig, MasterServer};
use openapi::master::ReplicateConfig;

const MIB: u64 = 1 << 20;

async fn master(config: MasterConfig) -> MasterServer {
    MasterServer::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn client(m: &MasterServer, segment: u64, protocol: Protocol) -> StoreClient {
    let cfg = ClientConfig {
        protocol,
        local_buffer_size: 8 * MIB,
        ..ClientConfig::local(&m.url(), segment)
    };
    StoreClient::connect(cfg).await.unwrap()
}

/// Deterministic bytes of a value: every byte depends on the seed and its position.
fn value(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
                ^ (i as u8).wrapping_mul(31)
                ^ (i >> 8) as u8
        })
        .collect()
}

fn name(e: &StoreError) -> &'static str {
    e.name()
}

/// `got` answers `asked`: keys starting with "missing" are not found, the others are
/// `value(i, lens[i])` in order, each in its place.
fn in_place(asked: &[&str], got: Vec<Result<bytes::Bytes, StoreError>>, lens: &[usize]) {
    assert_eq!(got.len(), asked.len());
    let mut i = 0;
    for (k, r) in asked.iter().zip(got) {
        if k.starts_with("missing") {
            assert_eq!(name(&r.unwrap_err()), "OBJECT_NOT_FOUND", "{k}");
            continue;
        }
        assert_eq!(
            r.unwrap().as_ref(),
            value(i as u64, lens[i]).as_slice(),
            "{k}"
        );
        i += 1;
    }
    assert_eq!(i, lens.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_of_many_sizes_round_trip_byte_exact() {
    let m = master(MasterConfig::default()).await;
    for protocol in [Protocol::Auto, Protocol::Tcp] {
        let node = client(&m, 64 * MIB, protocol).await;
        let reader = client(&m, 0, protocol).await;
        let sizes = [
            1usize,
            63,
            64,
            65,
            4095,
            4096,
            4097,
            65_537,
            (MIB + 3) as usize,
            9 * MIB as usize,
        ];
        for (i, &len) in sizes.iter().enumerate() {
            let key = format!("{protocol:?}/size-{len}");
            let v = value(i as u64, len);
            reader.put(&key, &v).await.unwrap();
            assert_eq!(
                reader.get(&key).await.unwrap(),
                v,
                "{key} read back by its writer"
            );
            assert_eq!(
                node.get(&key).await.unwrap(),
                v,
                "{key} read by the segment owner"
            );
            assert_eq!(reader.size(&key).await.unwrap(), len as u64);
        }
        assert_eq!(reader.copy_buffer_in_use(), 0);
        assert_eq!(node.copy_buffer_in_use(), 0);
        let stats = reader.engine().stats();
        match protocol {
            Protocol::Tcp => assert!(stats.tcp_bytes > 0 && stats.shm_bytes == 0, "{stats:?}"),
            _ => assert!(stats.shm_bytes > 0 && stats.tcp_bytes == 0, "{stats:?}"),
        }
        // The owner copies out of its own segment straight away: no transfer at all.
        let own = node.engine().stats();
        assert_eq!((own.requests, own.shm_bytes, own.tcp_bytes), (0, 0, 0));
        assert!(own.local_bytes > 0, "{own:?}");
        reader.close().await.unwrap();
        node.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_copy_and_batch_forms() {
    let m = master(MasterConfig::default()).await;
    let node = client(&m, 64 * MIB, Protocol::Tcp).await;
    let c = client(&m, 0, Protocol::Tcp).await;
    let src = c.alloc(1 << 20).unwrap();
    let dst = c.alloc(1 << 20).unwrap();
    let v = value(7, 1 << 20);
    src.write_at(0, &v).unwrap();
    c.put_from("zc/whole", BufRange::whole(&src)).await.unwrap();
    c.put_from("zc/part", BufRange::new(&src, 1000, 3000))
        .await
        .unwrap();
    assert_eq!(
        c.get_into("zc/whole", BufRange::whole(&dst)).await.unwrap(),
        1 << 20
    );
    assert_eq!(dst.to_vec(0, 1 << 20).unwrap(), v);
    assert_eq!(
        c.get_into("zc/part", BufRange::new(&dst, 5, 3000))
            .await
            .unwrap(),
        3000
    );
    assert_eq!(dst.to_vec(5, 3000).unwrap(), &v[1000..4000]);
    // Too small a destination: BUFFER_OVERFLOW, nothing read.
    let e = c
        .get_into("zc/whole", BufRange::new(&dst, 0, 100))
        .await
        .unwrap_err();
    assert_eq!(name(&e), "BUFFER_OVERFLOW");
    // A range outside its buffer is refused before anything is sent.
    let e = c
        .put_from("zc/bad", BufRange::new(&src, 1 << 20, 1))
        .await
        .unwrap_err();
    assert_eq!(name(&e), "INVALID_PARAMS");
    assert!(!c.exists("zc/bad").await.unwrap());

    // Batches: 64 values, one of them a duplicate of an existing key.
    let items: Vec<(String, Vec<u8>)> = (0..64)
        .map(|i| (format!("b/{i}"), value(100 + i, 4096 + i as usize)))
        .collect();
    let mut with_dup = items.clone();
    with_dup.push(("zc/whole".into(), vec![1; 10]));
    let put = c.batch_put(&with_dup).await;
    assert!(put[..64].iter().all(Result::is_ok), "{put:?}");
    assert_eq!(name(put[64].as_ref().unwrap_err()), "OBJECT_ALREADY_EXISTS");
    let mut keys: Vec<&str> = items.iter().map(|(k, _)| k.as_str()).collect();
    keys.push("b/missing");
    let got = node.batch_get(&keys).await;
    for ((k, v), g) in items.iter().zip(&got) {
        assert_eq!(g.as_ref().unwrap(), v, "{k}");
    }
    assert_eq!(name(got[64].as_ref().unwrap_err()), "OBJECT_NOT_FOUND");
    let ex = c.batch_exists(&keys).await;
    assert!(ex[..64].iter().all(|r| *r.as_ref().unwrap()));
    assert!(!ex[64].as_ref().unwrap());

    // A batch big enough to share one allocation: exact values around a miss.
    let big: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| {
            (
                format!("big/{i}"),
                value(200 + i, (1 << 20) - 3 * i as usize),
            )
        })
        .collect();
    assert!(c.batch_put(&big).await.iter().all(Result::is_ok));
    let mut keys: Vec<&str> = big.iter().map(|(k, _)| k.as_str()).collect();
    keys.insert(3, "big/missing");
    let mut got = node.batch_get(&keys).await;
    let missing = got.remove(3);
    assert_eq!(name(missing.as_ref().unwrap_err()), "OBJECT_NOT_FOUND");
    for ((k, v), g) in big.iter().zip(&got) {
        assert_eq!(g.as_ref().unwrap(), v, "{k}");
    }

    // Zero-copy batches: 16 pages of one registered buffer each way.
    let page = 64 << 10;
    let zitems: Vec<(String, BufRange<'_>)> = (0..16)
        .map(|i| (format!("zb/{i}"), BufRange::new(&src, i * page, page)))
        .collect();
    assert!(c.batch_put_from(&zitems).await.iter().all(Result::is_ok));
    let back: Vec<(String, BufRange<'_>)> = (0..16)
        .map(|i| {
            (
                format!("zb/{}", 15 - i),
                BufRange::new(&dst, i * page, page),
            )
        })
        .collect();
    let lens = c.batch_get_into(&back).await;
    assert!(lens.iter().all(|l| *l.as_ref().unwrap() == page as u64));
    for i in 0..16 {
        assert_eq!(
            dst.to_vec(i * page, page).unwrap(),
            &v[(15 - i) * page..(16 - i) * page]
        );
    }
    assert_eq!(c.copy_buffer_in_use(), 0);
    node.close().await.unwrap();
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_respects_leases_and_exists_reports_truth() {
    let m = master(MasterConfig::default()).await;
    let c = client(&m, 16 * MIB, Protocol::Auto).await;
    c.put("r/1", b"one").await.unwrap();
    c.put("r/2", b"two").await.unwrap();
    // get granted a lease: a plain remove is refused, a forced one works.
    assert_eq!(c.get("r/1").await.unwrap(), &b"one"[..]);
    let e = c.remove("r/1", false).await.unwrap_err();
    assert_eq!(name(&e), "OBJECT_HAS_LEASE");
    assert!(e.is_retryable());
    c.remove("r/1", true).await.unwrap();
    assert!(!c.exists("r/1").await.unwrap());
    assert_eq!(name(&c.get("r/1").await.unwrap_err()), "OBJECT_NOT_FOUND");
    // remove_all skips leased objects (r/2 was leased by exists).
    assert!(c.exists("r/2").await.unwrap());
    assert_eq!(c.remove_all().await.unwrap(), 0);
    assert_eq!(c.get("r/2").await.unwrap(), &b"two"[..]);
    // Empty and oversized requests are refused by the master with its own error.
    assert_eq!(
        name(&c.put("r/empty", b"").await.unwrap_err()),
        "INVALID_PARAMS"
    );
    assert_eq!(name(&c.put("", b"x").await.unwrap_err()), "INVALID_KEY");
    let big = vec![0u8; 17 << 20];
    let e = c.put("r/too-big", &big).await.unwrap_err();
    assert_eq!(name(&e), "NO_AVAILABLE_HANDLE");
    assert_eq!(c.copy_buffer_in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_on_one_key_exactly_one_wins() {
    let m = master(MasterConfig::default()).await;
    let node = client(&m, 64 * MIB, Protocol::Auto).await;
    let a = client(&m, 0, Protocol::Auto).await;
    let b = client(&m, 0, Protocol::Tcp).await;
    for round in 0..20 {
        let key = format!("race/{round}");
        let (va, vb) = (value(1, 256 << 10), value(2, 256 << 10));
        let (ra, rb) = tokio::join!(a.put(&key, &va), b.put(&key, &vb));
        let winner = match (&ra, &rb) {
            (Ok(()), Err(e)) => {
                assert_eq!(name(e), "OBJECT_ALREADY_EXISTS", "{e}");
                &va
            }
            (Err(e), Ok(())) => {
                assert_eq!(name(e), "OBJECT_ALREADY_EXISTS", "{e}");
                &vb
            }
            other => panic!("round {round}: exactly one put must win: {other:?}"),
        };
        assert_eq!(&node.get(&key).await.unwrap(), winner);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_outlasting_its_lease_is_an_error_not_bytes() {
    let m = master(MasterConfig {
        lease_ttl_ms: 1,
        ..MasterConfig::default()
    })
    .await;
    let node = client(&m, 128 * MIB, Protocol::Tcp).await;
    let c = client(&m, 0, Protocol::Tcp).await;
    let big = c.alloc(64 << 20).unwrap();
    c.put_from("lease/big", BufRange::whole(&big))
        .await
        .unwrap();
    // Moving 64 MiB takes far longer than the 1 ms lease.
    let e = c
        .get_into("lease/big", BufRange::whole(&big))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::LeaseExpired { .. }), "{e}");
    assert_eq!((e.code(), e.name()), (-707, "LEASE_EXPIRED"));
    let e = c.get("lease/big").await.unwrap_err();
    assert_eq!(name(&e), "LEASE_EXPIRED");
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_survive_losing_one_node() {
    let m = master(MasterConfig::default()).await;
    let n1 = client(&m, 32 * MIB, Protocol::Tcp).await;
    let n2 = client(&m, 32 * MIB, Protocol::Tcp).await;
    let c = client(&m, 0, Protocol::Tcp).await;
    let c2 = c.with_replication(ReplicateConfig {
        replica_num: 2,
        ..ReplicateConfig::default()
    });
    let v = value(9, 300_000);
    c2.put("dup/a", &v).await.unwrap();
    c2.put("dup/b", &v).await.unwrap();
    let info = m.master().object("dup/a").unwrap();
    assert_eq!(info.replicas.len(), 2);
    // n1's engine stops answering (its process would be gone) without unmounting:
    // reads fall through to the replica on n2.
    n1.engine().shutdown().await;
    assert_eq!(c.get("dup/a").await.unwrap(), v);
    // n2 leaves gracefully: its segment is unmounted, the replicas on it dropped; the
    // objects stay readable only through n1, which is dead: reads fail, never wrong bytes.
    n2.close().await.unwrap();
    assert_eq!(m.master().object("dup/b").unwrap().replicas.len(), 1);
    let e = c.get("dup/b").await.unwrap_err();
    assert_eq!(name(&e), "TRANSFER_FAIL", "{e}");
    drop(n1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_replica_write_revokes_the_put() {
    let m = master(MasterConfig::default()).await;
    let dead = client(&m, 32 * MIB, Protocol::Tcp).await;
    let c = client(&m, 0, Protocol::Tcp).await;
    let seg = dead.segment().unwrap().name.clone();
    dead.engine().shutdown().await;
    let to_dead = c.with_replication(ReplicateConfig {
        preferred_segments: vec![seg],
        ..ReplicateConfig::default()
    });
    let e = to_dead.put("revoked", &value(3, 5000)).await.unwrap_err();
    assert_eq!(name(&e), "TRANSFER_FAIL", "{e}");
    assert!(e.to_string().contains("revoked"), "{e}");
    // The put was revoked: nothing under the key, no space held but the one reservation
    // its put-start asked for (for the client's next value of this length).
    assert!(m.master().object("revoked").is_err());
    assert_eq!(m.master().reserved(), (1, 5056));
    assert_eq!(m.master().stats().allocated_bytes, 5056);
    assert_eq!(c.copy_buffer_in_use(), 0);
}

/// Waits (bounded) until `done`.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("never: {what}");
}

/// A client closing while a heartbeat is under way leaves the master for good: a ping the
/// master answers after the removal says "remount", and a segment remounted then would be
/// handed out for puts with no one serving it (connection refused) until the client TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_closed_during_a_heartbeat_stays_gone() {
    let m = master(MasterConfig::default()).await;
    let cfg = |segment| ClientConfig {
        heartbeat_interval_ms: 1,
        prefault: Prefault::Off,
        ..ClientConfig::local(&m.url(), segment)
    };
    // Pings as often as the closed ones did: once it has pinged a few more times, a
    // heartbeat that outlived its client's close would have run too.
    let witness = StoreClient::connect(cfg(0)).await.unwrap();
    for round in 0..30 {
        let node = StoreClient::connect(cfg(MIB)).await.unwrap();
        until("the node pings", || node.health().pings >= 2).await;
        node.close().await.unwrap();
        let seen = witness.health().pings;
        until("the witness pings", || witness.health().pings >= seen + 5).await;
        assert!(
            m.master().segments().is_empty(),
            "round {round}: a closed client's segment is mounted again"
        );
        assert_eq!(
            m.master().clients().len(),
            1,
            "round {round}: only the witness"
        );
    }
    witness.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_remount_after_a_master_restart_and_go_on() {
    let m = master(MasterConfig::default()).await;
    let addr = m.addr();
    let cfg = |segment| ClientConfig {
        heartbeat_interval_ms: 100,
        rpc_timeout_ms: 2000,
        ..ClientConfig::local(&m.url(), segment)
    };
    let node = StoreClient::connect(cfg(32 * MIB)).await.unwrap();
    let c = StoreClient::connect(cfg(0)).await.unwrap();
    c.put("before", b"old master").await.unwrap();
    m.stop(Duration::from_secs(2)).await;
    // While the master is down, operations fail with RPC_FAIL (retryable).
    let e = c.put("during", b"x").await.unwrap_err();
    assert_eq!(name(&e), "RPC_FAIL");
    assert!(e.is_retryable());
    // Reservations of 5 s, so a reservation's use window, and with it the time a
    // remounted segment takes no values, is 500 ms.
    let m2 = MasterServer::start(
        MasterConfig {
            reservation_ttl_ms: 5_000,
            ..MasterConfig::default()
        },
        addr,
    )
    .await
    .unwrap();
    // The node is told to remount at its next heartbeat. (Waiting for the master's side
    // alone raced with the node counting its remount once the answer arrived.)
    for _ in 0..100 {
        let h = node.health();
        if !m2.master().segments().is_empty() && h.remounts >= 1 && h.mounted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(m2.master().segments().len(), 1);
    assert!(node.health().remounts >= 1);
    assert!(node.health().mounted);
    // The new master knows nothing of old objects; new ones work.
    assert_eq!(
        name(&c.get("before").await.unwrap_err()),
        "OBJECT_NOT_FOUND"
    );
    // The remounted segment takes values once a reservation made before the restart can
    // no longer be written (the master tests check that it takes none before).
    put_once_held_segments_take_values(&c, "after", b"new master").await;
    assert_eq!(node.get("after").await.unwrap(), &b"new master"[..]);
}

/// Puts `value` under `key`, while the only segments are freshly remounted ones (which
/// answer `NO_AVAILABLE_HANDLE` for a reservation's use window): for at most 10 s.
async fn put_once_held_segments_take_values(c: &StoreClient, key: &str, value: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.put(key, value).await {
            Ok(()) => return,
            Err(e) if name(&e) == "NO_AVAILABLE_HANDLE" && e.to_string().contains("remounted") => {
                assert!(Instant::now() < deadline, "still held after 10 s: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("put after the remount: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_under_pressure_keeps_leased_objects() {
    let m = master(MasterConfig {
        lease_ttl_ms: 60_000,
        ..MasterConfig::default()
    })
    .await;
    let node = client(&m, 4 * MIB, Protocol::Auto).await;
    let c = client(&m, 0, Protocol::Auto).await;
    let page = 64 << 10;
    // Fill 3/4 of the 4 MiB segment with 64 KiB pages (below the eviction watermark) and
    // lease the first eight by reading them.
    for i in 0..48 {
        c.put(&format!("ev/{i}"), &value(i, page)).await.unwrap();
    }
    for i in 0..8 {
        assert_eq!(c.get(&format!("ev/{i}")).await.unwrap(), value(i, page));
    }
    // 48 more pages need room: the master evicts unleased pages to make it.
    for i in 48..96 {
        c.put(&format!("ev/{i}"), &value(i, page)).await.unwrap();
    }
    for i in 0..8 {
        assert_eq!(
            c.get(&format!("ev/{i}")).await.unwrap(),
            value(i, page),
            "leased page {i} survives"
        );
    }
    // 96 pages of 64 KiB in 4 MiB: at least 32 went, all unleased ones.
    let gone = (8..96)
        .filter(|i| m.master().object(&format!("ev/{i}")).is_err())
        .count();
    assert!(gone >= 32, "only {gone} unleased pages were evicted");
    // Whatever survived reads back exactly; what was evicted is not found, never garbage.
    for i in 8..96 {
        match node.get(&format!("ev/{i}")).await {
            Ok(v) => assert_eq!(v, value(i, page), "page {i}"),
            Err(e) => assert_eq!(name(&e), "OBJECT_NOT_FOUND", "page {i}: {e}"),
        }
    }
    assert!(m.master().stats().evicted_objects >= 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_through_the_masters_metadata_store() {
    let m = master(MasterConfig::default()).await;
    let cfg = |segment| ClientConfig {
        metadata: format!("{}/metadata", m.url()),
        protocol: Protocol::Tcp,
        ..ClientConfig::local(&m.url(), segment)
    };
    let node = StoreClient::connect(cfg(16 * MIB)).await.unwrap();
    let c = StoreClient::connect(cfg(0)).await.unwrap();
    // The node's descriptor is at the master, under its segment name.
    let seg = transfer::metadata::segment_key(&node.segment().unwrap().endpoint);
    assert!(
        m.master().metadata().get(&seg).is_ok(),
        "no descriptor at {seg}"
    );
    let v = value(11, 200_000);
    c.put("meta/k", &v).await.unwrap();
    assert_eq!(c.get("meta/k").await.unwrap(), v);
    assert_eq!(node.get("meta/k").await.unwrap(), v);
    node.close().await.unwrap();
    // Closing unpublished the descriptor.
    assert!(m.master().metadata().get(&seg).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reborn_at_the_same_address_and_memory_never_serves_old_objects() {
    let m = master(MasterConfig::default()).await;
    let reader = client(&m, 0, Protocol::Tcp).await;
    let cfg = |listen: std::net::SocketAddr| ClientConfig {
        listen,
        protocol: Protocol::Tcp,
        local_buffer_size: MIB,
        ..ClientConfig::local(&m.url(), 16 * MIB)
    };
    let old = StoreClient::connect(cfg("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = old.engine().local_addr();
    let old_base = old.segment().unwrap().base;
    let v = value(21, 100_000);
    reader.put("reborn/k", &v).await.unwrap();
    assert_eq!(reader.get("reborn/k").await.unwrap(), v);
    // The node dies without unmounting; a new one starts at the same address. Its segment
    // memory usually lands where the old one was (the kernel reuses the freed range), so
    // the old replica's address is inside a live region of the new node with new tokens.
    old.engine().shutdown().await;
    drop(old);
    let mut tries = 0;
    let new = loop {
        // The dead engine's listener closes as its task winds down.
        match StoreClient::start(cfg(addr)).await {
            Ok(c) => break c,
            Err(e) if tries < 100 => {
                tries += 1;
                assert!(e.to_string().contains("in use"), "{e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    let overlaps = new.segment().unwrap().base == old_base;
    // The first read meets the new tokens with the old descriptor (refused); later reads
    // see the new descriptor, whose region covers the address: the replica's segment name
    // says it belongs to the dead instance, so it is refused too, never read.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let e = reader.get("reborn/k").await.unwrap_err();
        assert_eq!(
            e.name(),
            "TRANSFER_FAIL",
            "{e} (segment memory reused: {overlaps})"
        );
        seen.push(e.to_string());
    }
    if overlaps {
        assert!(
            seen.iter().any(|e| e.contains("earlier instance")),
            "{seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_into_reserved_space_needs_no_free_space_and_survives_losing_it() {
    // No eviction: the fillers' failed puts would ask for it, and a round a tick later
    // (once they are removed) could evict the batch objects this test reads back.
    let m = master(MasterConfig {
        eviction_ratio: 0.0,
        ..MasterConfig::default()
    })
    .await;
    let node = client(&m, MIB, Protocol::Auto).await;
    let c = client(&m, 0, Protocol::Auto).await;
    let len = 64 * 1024;
    // The first put of a length starts the put and reserves space for the next one.
    c.put("a", &value(1, len)).await.unwrap();
    assert_eq!(m.master().reserved(), (1, len as u64));
    // Fill the rest with objects eviction may not touch.
    let filler = node.with_replication(ReplicateConfig {
        hard_pin: true,
        ..ReplicateConfig::default()
    });
    let mut n = 0;
    while filler
        .put(&format!("fill-{n}"), &value(9, 4096))
        .await
        .is_ok()
    {
        n += 1;
    }
    assert!(n > 100, "{n} fillers");
    // No free space is left, yet the next put goes into the reserved space: one commit.
    c.put("b", &value(2, len)).await.unwrap();
    assert_eq!(c.get("b").await.unwrap(), value(2, len));
    // That commit found no room to reserve again, so the put after it has none.
    let e = c.put("c", &value(3, len)).await.unwrap_err();
    assert_eq!(name(&e), "NO_AVAILABLE_HANDLE", "{e}");
    for i in 0..n {
        m.master().remove(&format!("fill-{i}"), true).unwrap();
    }
    // Reservations the master forgets (a restart, a failover, an unmount) cost a retry,
    // never the value: the commit is refused and the put goes the two-request way.
    c.put("d", &value(4, len)).await.unwrap();
    assert_eq!(m.master().reserved(), (1, len as u64));
    assert_eq!(m.master().release_reservations_of(c.id()), 1);
    c.put("e", &value(5, len)).await.unwrap();
    assert_eq!(c.get("e").await.unwrap(), value(5, len));
    // Batches reserve for the whole next batch.
    let keys: Vec<String> = (0..8).map(|i| format!("batch-{i}")).collect();
    let vals: Vec<Vec<u8>> = (0..8).map(|i| value(10 + i, 4096)).collect();
    for round in 0..2 {
        let ks: Vec<String> = keys.iter().map(|k| format!("{k}-{round}")).collect();
        let items: Vec<(&str, &[u8])> = ks
            .iter()
            .map(String::as_str)
            .zip(vals.iter().map(Vec::as_slice))
            .collect();
        for r in c.batch_put(&items).await {
            r.unwrap();
        }
        for (k, v) in ks.iter().zip(&vals) {
            assert_eq!(&node.get(k).await.unwrap(), v, "{k}");
        }
    }
    assert_eq!(
        m.master().reserved().0,
        1 + 8,
        "one 64 KiB and eight 4 KiB reservations"
    );
    c.close().await.unwrap();
    assert_eq!(
        m.master().reserved(),
        (0, 0),
        "a client that leaves gives them back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_batch_get_reads_in_parts_and_keeps_every_value_in_its_place() {
    let m = master(MasterConfig::default()).await;
    let node = client(&m, 64 * MIB, Protocol::Auto).await;
    let c = client(&m, 0, Protocol::Auto).await;
    let lens = [
        3 * MIB as usize,
        1024,
        3 * MIB as usize,
        5 * MIB as usize,
        100,
        2 * MIB as usize,
        2 * MIB as usize,
    ];
    let keys: Vec<String> = (0..lens.len()).map(|i| format!("part-{i}")).collect();
    for (i, (k, &len)) in keys.iter().zip(&lens).enumerate() {
        node.put(k, &value(i as u64, len)).await.unwrap();
    }
    // A missing key in the middle, and one at the end.
    let mut asked: Vec<&str> = keys.iter().map(String::as_str).collect();
    asked.insert(3, "missing-a");
    asked.push("missing-b");
    let got = c.batch_get(&asked).await;
    in_place(&asked, got, &lens);
    assert_eq!(c.copy_buffer_in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_kept_keeps_its_bytes_while_later_reads_reuse_buffers() {
    let m = master(MasterConfig::default()).await;
    let node = client(&m, 32 * MIB, Protocol::Tcp).await;
    let c = client(&m, 0, Protocol::Tcp).await;
    let lens = [MIB as usize, 300_000];
    for (i, &len) in lens.iter().enumerate() {
        node.put(&format!("reuse-{i}"), &value(i as u64, len))
            .await
            .unwrap();
    }
    // A value still held is never overwritten by the next reads.
    let kept = c.get("reuse-0").await.unwrap();
    for _ in 0..3 {
        let other = c.batch_get(&["reuse-1", "reuse-0"]).await;
        assert_eq!(other[0].as_ref().unwrap(), &value(1, lens[1]));
        assert_ne!(other[1].as_ref().unwrap().as_ptr(), kept.as_ptr());
    }
    assert_eq!(kept, value(0, lens[0]));
    assert_eq!(c.copy_buffer_in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_in_mapped_memory_are_copied_straight_out_of_it() {
    let m = master(MasterConfig::default()).await;
    let a = client(&m, 32 * MIB, Protocol::Auto).await;
    let b = client(&m, 32 * MIB, Protocol::Auto).await;
    let placed_on = |c: &StoreClient| {
        c.with_replication(ReplicateConfig {
            preferred_segments: vec![c.segment().unwrap().name.clone()],
            ..Default::default()
        })
    };
    let (on_a, on_b) = (placed_on(&a), placed_on(&b));
    let lens = [
        MIB as usize,
        100,
        3 * MIB as usize,
        4096,
        2 * MIB as usize,
        7,
    ];
    let keys: Vec<String> = (0..lens.len()).map(|i| format!("own-{i}")).collect();
    let requests = |c: &StoreClient| c.engine().stats().requests;
    let sent = (requests(&a), requests(&b));
    for (i, (k, &len)) in keys.iter().zip(&lens).enumerate() {
        // Even values in a's segment, odd ones in b's; written by the other client for
        // the last two.
        let writer = match (i % 2 == 0, i >= 4) {
            (true, false) => &on_a,
            (false, false) => &on_b,
            (true, true) => &b.with_replication(on_a.replication().clone()),
            (false, true) => &a.with_replication(on_b.replication().clone()),
        };
        writer.put(k, &value(i as u64, len)).await.unwrap();
    }
    // Every put went straight into mapped memory (own segment or the other's shared
    // memory): no transfer, no copy buffer.
    assert_eq!((requests(&a), requests(&b)), sent);
    assert_eq!(a.copy_buffer_in_use() + b.copy_buffer_in_use(), 0);
    let moved = |c: &StoreClient| {
        let s = c.engine().stats();
        (s.local_bytes, s.shm_bytes)
    };
    let before = moved(&a);
    let requests = a.engine().stats().requests;
    // a's own values need no transfer at all (they count as local bytes, copied out of the
    // own segment); b's come through shared memory.
    let own: Vec<&str> = keys.iter().step_by(2).map(String::as_str).collect();
    let own_bytes: u64 = (0..lens.len()).step_by(2).map(|i| lens[i] as u64).sum();
    for (r, i) in a
        .batch_get(&own)
        .await
        .into_iter()
        .zip((0..lens.len()).step_by(2))
    {
        assert_eq!(r.unwrap().as_ref(), value(i as u64, lens[i]).as_slice());
    }
    assert_eq!(a.get("own-2").await.unwrap(), value(2, lens[2]));
    let own_bytes = own_bytes + lens[2] as u64;
    assert_eq!(moved(&a), (before.0 + own_bytes, before.1));
    assert_eq!(
        a.engine().stats().requests,
        requests,
        "a transfer was submitted"
    );
    // Mixed with far values and a missing key, in one batch: every value in its place.
    let mut asked: Vec<&str> = keys.iter().map(String::as_str).collect();
    asked.insert(3, "missing");
    let got = a.batch_get(&asked).await;
    in_place(&asked, got, &lens);
    assert_eq!(moved(&a).0, before.0 + 2 * own_bytes - lens[2] as u64);
    assert!(
        moved(&a).1 > before.1,
        "far values come through shared memory"
    );
    // b's values too were copied straight out of its mapped segment: no transfer at all.
    assert_eq!(a.engine().stats().requests, requests);
    assert_eq!(a.get("own-3").await.unwrap(), value(3, lens[3]));
    assert_eq!(a.engine().stats().requests, requests);
    assert_eq!(a.copy_buffer_in_use(), 0);
}
