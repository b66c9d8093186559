//! TCP transport end to end: real engines on loopback sockets, random data, several peers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};
use transfer::{RequestStatus, TransferRequest};

#[tokio::test]
async fn random_round_trips_from_1_byte_with_unaligned_offsets() {
    let target = engine(false).await;
    let initiator = engine(false).await;
    let remote = target.alloc(24 << 20).unwrap();
    let src = initiator.alloc(24 << 20).unwrap();
    let dst = initiator.alloc(24 << 20).unwrap();
    fill(&src, 1);
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut sizes = vec![
        1usize,
        2,
        3,
        7,
        63,
        4095,
        4096,
        4097,
        65_535,
        65_537,
        (1 << 20) + 13,
        3 << 20,
        16 << 20,
    ];
    sizes.extend((0..12).map(|_| rng.random_range(1..(2 << 20))));
    for (i, &len) in sizes.iter().enumerate() {
        let lo = rng.random_range(0..=(src.len() - len).min(4099));
        let ro = rng.random_range(0..=(remote.len() - len).min(8191));
        let raddr = remote.addr() + ro as u64;
        initiator
            .transfer(TransferRequest::write(&src, lo, &seg, raddr, len))
            .await
            .unwrap();
        assert!(
            same_bytes(&src, lo, &remote, ro, len),
            "write #{i} of {len} bytes landed wrong"
        );
        let dofs = rng.random_range(0..=(dst.len() - len).min(777));
        initiator
            .transfer(TransferRequest::read(&dst, dofs, &seg, raddr, len))
            .await
            .unwrap();
        assert!(
            same_bytes(&dst, dofs, &remote, ro, len),
            "read #{i} of {len} bytes came back wrong"
        );
    }
    assert!(initiator.stats().tcp_bytes > 0);
    assert_eq!(initiator.stats().shm_bytes, 0);
}

/// The largest case (256 MiB, odd offsets both sides) in one write and one read.
#[tokio::test]
async fn round_trip_256_mib_unaligned() {
    const LEN: usize = 256 << 20;
    let target = engine(false).await;
    let initiator = engine(false).await;
    let remote = target.alloc(LEN + 4096).unwrap();
    let local = initiator.alloc(LEN + 4096).unwrap();
    fill(&local, 2);
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    initiator
        .transfer(TransferRequest::write(
            &local,
            3,
            &seg,
            remote.addr() + 1001,
            LEN,
        ))
        .await
        .unwrap();
    assert!(same_bytes(&local, 3, &remote, 1001, LEN));
    // Read it back over itself shifted: the local bytes at 4000.. must equal remote 1001..
    initiator
        .transfer(TransferRequest::read(
            &local,
            4000,
            &seg,
            remote.addr() + 1001,
            LEN - 4000,
        ))
        .await
        .unwrap();
    assert!(same_bytes(&local, 4000, &remote, 1001, LEN - 4000));
}

#[tokio::test]
async fn many_concurrent_batches_to_several_peers() {
    const PER_PEER: usize = 8 << 20;
    let targets = futures_join(3).await;
    let initiator = engine(false).await;
    let remotes: Vec<_> = targets.iter().map(|t| t.alloc(PER_PEER).unwrap()).collect();
    let mut segs = Vec::new();
    for t in &targets {
        segs.push(initiator.open_segment(t.segment_name()).await.unwrap());
    }
    let tasks = 6usize;
    let local = initiator.alloc(tasks * PER_PEER / 2).unwrap();
    fill(&local, 3);
    let slot = PER_PEER / 2 / tasks; // each task owns a disjoint slot on every peer
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (initiator, local, segs) = (initiator.clone(), local.clone(), segs.clone());
        let addrs: Vec<u64> = remotes.iter().map(|r| r.addr()).collect();
        handles.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t as u64);
            for round in 0..4 {
                let mut reqs = Vec::new();
                let mut expect = Vec::new();
                for p in 0..segs.len() {
                    for k in 0..4 {
                        let len = rng.random_range(1..slot / 8);
                        let lo = t * (PER_PEER / 2) + rng.random_range(0..(PER_PEER / 2 - len));
                        let ro = t * slot + k * (slot / 4);
                        let len = len.min(slot / 4);
                        reqs.push(TransferRequest::write(
                            &local,
                            lo,
                            &segs[p],
                            addrs[p] + ro as u64,
                            len,
                        ));
                        expect.push((p, lo, ro, len));
                    }
                }
                let batch = initiator.submit(reqs).await.unwrap();
                batch
                    .wait()
                    .await
                    .unwrap_or_else(|e| panic!("task {t} round {round}: {e}"));
                // Read every range back into a scratch area of this task and compare.
                let scratch = initiator.alloc(slot).unwrap();
                for (p, lo, ro, len) in expect {
                    initiator
                        .transfer(TransferRequest::read(
                            &scratch,
                            0,
                            &segs[p],
                            addrs[p] + ro as u64,
                            len,
                        ))
                        .await
                        .unwrap();
                    assert!(same_bytes(&scratch, 0, &local, lo, len));
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    for (t, r) in targets.iter().zip(&remotes) {
        assert_eq!(t.registered_regions(), 1);
        assert_eq!(r.len(), PER_PEER);
    }
}

async fn futures_join(n: usize) -> Vec<transfer::TransferEngine> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(engine(false).await);
    }
    v
}

#[tokio::test]
async fn small_request_batches_complete_and_poll() {
    let target = engine(false).await;
    let initiator = engine(false).await;
    let remote = target.alloc(1 << 20).unwrap();
    let local = initiator.alloc(1 << 20).unwrap();
    fill(&local, 4);
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    let reqs: Vec<_> = (0..256)
        .map(|i| {
            TransferRequest::write(
                &local,
                i * 4096,
                &seg,
                remote.addr() + (i * 4096) as u64,
                4096,
            )
        })
        .collect();
    let batch = initiator.submit(reqs).await.unwrap();
    batch.wait().await.unwrap();
    assert!(batch.is_complete());
    assert!((0..256).all(|i| batch.status(i) == RequestStatus::Completed));
    assert_eq!(batch.bytes(), 1 << 20);
    assert!(same_bytes(&local, 0, &remote, 0, 1 << 20));
    // Zero-length requests complete at once.
    let b = initiator
        .submit(vec![TransferRequest::read(
            &local,
            0,
            &seg,
            remote.addr(),
            0,
        )])
        .await
        .unwrap();
    assert_eq!(b.status(0), RequestStatus::Completed);
}

#[tokio::test]
async fn notifications_follow_the_writes_they_announce() {
    let decode = engine(false).await;
    let prefill = engine(false).await;
    let pool = decode.alloc(1 << 20).unwrap();
    let pages = prefill.alloc(1 << 20).unwrap();
    fill(&pages, 5);
    let seg = prefill.open_segment(decode.segment_name()).await.unwrap();
    let reqs: Vec<_> = (0..16)
        .map(|i| {
            TransferRequest::write(
                &pages,
                i * 65536,
                &seg,
                pool.addr() + (i * 65536) as u64,
                65536,
            )
        })
        .collect();
    prefill.submit(reqs).await.unwrap().wait().await.unwrap();
    prefill.notify(&seg, b"room 42: 16 pages").await.unwrap();
    let n = decode.notifications().recv().await.unwrap();
    assert_eq!(n.from, prefill.segment_name());
    assert_eq!(n.message, b"room 42: 16 pages");
    assert!(
        same_bytes(&pages, 0, &pool, 0, 1 << 20),
        "bytes are in place when the notification arrives"
    );
    // Oversized notifications are refused locally.
    assert!(prefill.notify(&seg, &vec![0u8; 70_000]).await.is_err());
    // Notifying oneself goes straight to the own queue.
    let me = decode.open_segment(decode.segment_name()).await.unwrap();
    decode.notify(&me, b"self").await.unwrap();
    assert_eq!(decode.notifications().try_recv().unwrap().message, b"self");
}

#[tokio::test]
async fn local_segment_requests_are_checked_copies() {
    let e = engine(false).await;
    let a = e.alloc(8192).unwrap();
    let b = e.alloc(8192).unwrap();
    fill(&a, 6);
    let me = e.open_segment(e.segment_name()).await.unwrap();
    assert!(me.is_local());
    e.transfer(TransferRequest::write(&a, 10, &me, b.addr() + 20, 5000))
        .await
        .unwrap();
    assert!(same_bytes(&a, 10, &b, 20, 5000));
    let err = e
        .transfer(TransferRequest::write(&a, 0, &me, b.addr() + 8000, 500))
        .await
        .unwrap_err();
    assert!(
        matches!(err, transfer::TransferError::OutOfBounds { .. }),
        "{err}"
    );
    assert_eq!(e.stats().local_bytes, 5000);
}

#[tokio::test]
async fn graceful_shutdown_drains_in_flight_requests() {
    let target = engine(false).await;
    let initiator = engine(false).await;
    let remote = target.alloc(64 << 20).unwrap();
    let local = initiator.alloc(64 << 20).unwrap();
    fill(&local, 8);
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    let batch = initiator
        .submit(vec![TransferRequest::write(
            &local,
            0,
            &seg,
            remote.addr(),
            64 << 20,
        )])
        .await
        .unwrap();
    initiator.shutdown().await;
    batch.wait().await.unwrap();
    assert!(same_bytes(&local, 0, &remote, 0, 64 << 20));
    assert!(matches!(
        initiator.submit(vec![]).await,
        Err(transfer::TransferError::Shutdown)
    ));
    let target = Arc::new(target);
    target.shutdown().await;
}

/// A multi-threaded runtime of one worker, and on it a target and an initiator engine with
/// a 1 MiB buffer each (the initiator's filled from `seed`).
#[allow(clippy::type_complexity)]
fn pair_on_own_runtime(
    seed: u64,
) -> (
    tokio::runtime::Runtime,
    (
        transfer::TransferEngine,
        transfer::TransferEngine,
        transfer::RegisteredBuffer,
        transfer::RegisteredBuffer,
    ),
) {
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let engines = main.block_on(async {
        let target = engine(false).await;
        let initiator = engine(false).await;
        let remote = target.alloc(1 << 20).unwrap();
        let local = initiator.alloc(1 << 20).unwrap();
        fill(&local, seed);
        (target, initiator, remote, local)
    });
    (main, engines)
}

/// Opens `target`'s segment and writes 4 KiB to it from `rt`: the first connections to the
/// target are asked for there.
fn first_write_from(
    rt: &tokio::runtime::Runtime,
    initiator: &transfer::TransferEngine,
    target: &transfer::TransferEngine,
    local: &transfer::RegisteredBuffer,
    remote: &transfer::RegisteredBuffer,
) -> transfer::Segment {
    rt.block_on(async {
        let seg = initiator.open_segment(target.segment_name()).await.unwrap();
        initiator
            .transfer(TransferRequest::write(local, 0, &seg, remote.addr(), 4096))
            .await
            .unwrap();
        seg
    })
}

/// Connections opened from a runtime that later shuts down are replaced, not reused dead.
#[test]
fn connections_outlive_the_runtime_that_opened_them() {
    let (main, (target, initiator, remote, local)) = pair_on_own_runtime(61);
    let seg = {
        // The first connection to the target is opened (and served) by this runtime.
        let other = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        first_write_from(&other, &initiator, &target, &local, &remote)
    };
    main.block_on(async {
        write_checked(&initiator, &local, 0, &seg, &remote, 0, 1 << 20).await;
        drop(target);
    });
}

/// Connections opened from a runtime that runs only during its caller's calls (a thread's
/// own current-thread runtime, as the Python store drives its calls) are served by the
/// engine's runtime: a transfer from elsewhere over them completes while that runtime
/// sits idle, its thread away.
#[test]
fn connections_opened_from_a_callers_runtime_are_served_by_the_engines_own() {
    let (main, (target, initiator, remote, local)) = pair_on_own_runtime(67);
    let caller = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The first connections (the descriptor's control call, then the data) are asked for
    // from the caller's runtime.
    let seg = first_write_from(&caller, &initiator, &target, &local, &remote);
    assert_eq!(initiator.runtime().id(), main.handle().id());
    // The caller's runtime is alive but nothing drives it now.
    main.block_on(async {
        let write = write_checked(&initiator, &local, 0, &seg, &remote, 0, 1 << 20);
        tokio::time::timeout(Duration::from_secs(20), write)
            .await
            .expect("a transfer over connections the idle runtime asked for completed");
        drop(target);
    });
    drop(caller);
}
