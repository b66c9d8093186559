//! Shared-memory transport between engines on one host (in one process here; the
//! cross-process cases, including a dead owner, are in `process.rs`).

mod common;

use common::*;
use transfer::{MemoryRegion, TransferError, TransferRequest};

#[tokio::test]
async fn same_host_peers_copy_through_shared_memory() {
    let target = engine(true).await;
    let initiator = engine(true).await;
    let remote = target.alloc(40 << 20).unwrap();
    assert!(remote.region().is_shared());
    let local = initiator.alloc(40 << 20).unwrap();
    fill(&local, 21);
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    assert!(seg.is_same_host());
    for (lo, ro, len) in [
        (0usize, 0usize, 1usize),
        (3, 4093, 4099),
        (1, 7, 100_000),
        (5, 11, 33 << 20),
    ] {
        write_checked(&initiator, &local, lo, &seg, &remote, ro, len).await;
    }
    let back = initiator.alloc(40 << 20).unwrap();
    initiator
        .transfer(TransferRequest::read(
            &back,
            9,
            &seg,
            remote.addr() + 11,
            33 << 20,
        ))
        .await
        .unwrap();
    assert!(same_bytes(&back, 9, &remote, 11, 33 << 20));
    let s = initiator.stats();
    assert_eq!(s.tcp_bytes, 0, "nothing went over TCP");
    assert!(s.shm_bytes >= 66 << 20);
}

#[tokio::test]
async fn shm_checks_bounds_and_falls_back_to_tcp_for_private_regions() {
    let target = engine(true).await;
    let initiator = engine(true).await;
    let shared = target.alloc(1 << 20).unwrap();
    let private = target
        .register(MemoryRegion::alloc(1 << 20).unwrap())
        .unwrap();
    let local = initiator.alloc(1 << 20).unwrap();
    fill(&local, 22);
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    let err = initiator
        .transfer(TransferRequest::write(
            &local,
            0,
            &seg,
            shared.addr() + (1 << 20) - 10,
            20,
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, TransferError::OutOfBounds { .. }), "{err}");
    write_checked(&initiator, &local, 0, &seg, &private, 0, 1 << 20).await;
    assert_eq!(
        initiator.stats().tcp_bytes,
        1 << 20,
        "a private region is reached over TCP"
    );

    // An unregistered shared region is refused even though its mapping is still cached.
    initiator
        .transfer(TransferRequest::write(&local, 0, &seg, shared.addr(), 4096))
        .await
        .unwrap();
    let addr = shared.addr();
    drop(shared);
    let err = initiator
        .transfer(TransferRequest::write(&local, 0, &seg, addr, 4096))
        .await
        .unwrap_err();
    assert!(matches!(err, TransferError::OutOfBounds { .. }), "{err}");
}

#[tokio::test]
async fn shm_disabled_on_the_initiator_means_tcp() {
    let target = engine(true).await;
    let initiator = engine(false).await;
    let remote = target.alloc(1 << 20).unwrap();
    let local = initiator.alloc(1 << 20).unwrap();
    fill(&local, 23);
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    write_checked(&initiator, &local, 0, &seg, &remote, 0, 1 << 20).await;
    assert_eq!(initiator.stats().shm_bytes, 0);
}

/// `append_mapped` and `write_mapped` copy between mapped memory and the caller's bytes
/// directly: a same-host peer's shared region and the engine's own segment; a private
/// region, an engine without shared memory and a range outside every region are left to
/// transfers (`None`); an unregistered region is refused (and nothing appended).
#[tokio::test]
async fn mapped_memory_is_appended_with_one_copy_and_only_while_registered() {
    let target = engine(true).await;
    let initiator = engine(true).await;
    const LEN: usize = 20 << 20;
    let shared = target.alloc(LEN).unwrap();
    fill(&shared, 41);
    let private = target
        .register(MemoryRegion::alloc(1 << 20).unwrap())
        .unwrap();
    let own = initiator.alloc(1 << 20).unwrap();
    fill(&own, 42);
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    let me = initiator
        .open_segment(initiator.segment_name())
        .await
        .unwrap();
    let mut out = b"head".to_vec();
    // The last one big enough to be copied on two threads.
    for (off, len) in [
        (0usize, 1usize),
        (4093, 4099),
        (7, 5 << 20),
        (11, (17 << 20) + 3),
    ] {
        let at = out.len();
        initiator
            .append_mapped(&seg, shared.addr() + off as u64, len, &mut out)
            .expect("mapped")
            .unwrap();
        assert_eq!(out[at..], shared.to_vec(off, len).unwrap()[..]);
    }
    let at = out.len();
    initiator
        .append_mapped(&me, own.addr() + 3, 70_000, &mut out)
        .expect("own segment")
        .unwrap();
    assert_eq!(out[at..], own.to_vec(3, 70_000).unwrap()[..]);
    assert_eq!(&out[..4], b"head");
    let s = initiator.stats();
    assert_eq!(s.tcp_bytes, 0);
    assert_eq!(
        (s.shm_bytes, s.local_bytes),
        (1 + 4099 + (5 << 20) + (17 << 20) + 3, 70_000)
    );

    // Writes the same way: into the peer's shared region and the own segment.
    let src: Vec<u8> = (0..(9 << 20) + 5).map(|i| (i % 253) as u8).collect();
    initiator
        .write_mapped(&seg, shared.addr() + 9, &src)
        .expect("mapped")
        .unwrap();
    assert_eq!(shared.to_vec(9, src.len()).unwrap(), src);
    initiator
        .write_mapped(&me, own.addr() + 1, &src[..4097])
        .expect("own segment")
        .unwrap();
    assert_eq!(own.to_vec(1, 4097).unwrap(), src[..4097]);
    assert!(
        initiator
            .write_mapped(&seg, private.addr(), &src[..10])
            .is_none()
    );
    assert_eq!(initiator.stats().tcp_bytes, 0);

    let before = out.len();
    // Private memory, a range past the region, shared memory off: transfers' business.
    assert!(
        initiator
            .append_mapped(&seg, private.addr(), 4096, &mut out)
            .is_none()
    );
    assert!(
        initiator
            .append_mapped(&seg, shared.addr() + LEN as u64 - 10, 20, &mut out)
            .is_none()
    );
    let tcp_only = engine(false).await;
    let far = tcp_only.open_segment(target.segment_name()).await.unwrap();
    assert!(
        tcp_only
            .append_mapped(&far, shared.addr(), 4096, &mut out)
            .is_none()
    );
    // Unregistered while its mapping is still cached: refused, nothing appended.
    let addr = shared.addr();
    drop(shared);
    let err = initiator
        .append_mapped(&seg, addr, 4096, &mut out)
        .expect("still mapped")
        .unwrap_err();
    assert!(matches!(err, TransferError::OutOfBounds { .. }), "{err}");
    assert_eq!(out.len(), before);
    let err = initiator
        .write_mapped(&seg, addr, &src[..10])
        .expect("still mapped")
        .unwrap_err();
    assert!(matches!(err, TransferError::OutOfBounds { .. }), "{err}");
}

/// A batch's copies are spread over the runtime's two workers (`hostcopy`): every request
/// of a mixed batch (small, odd-sized, several chunks long) lands whole, to a same-host peer
/// and into the engine's own segment, and back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_spread_over_the_workers_lands_every_request_whole() {
    spread_batch_lands_whole().await;
}

/// The same on a current-thread runtime, whose copies get helpers from its blocking pool.
#[tokio::test]
async fn a_batch_spread_over_blocking_helpers_lands_every_request_whole() {
    spread_batch_lands_whole().await;
}

async fn spread_batch_lands_whole() {
    let target = engine(true).await;
    let initiator = engine(true).await;
    const LEN: usize = 48 << 20;
    let local = initiator.alloc(LEN).unwrap();
    fill(&local, 31);
    let own = initiator.alloc(LEN).unwrap();
    let remote = target.alloc(LEN).unwrap();
    let back = initiator.alloc(LEN).unwrap();
    let peer = initiator.open_segment(target.segment_name()).await.unwrap();
    let me = initiator
        .open_segment(initiator.segment_name())
        .await
        .unwrap();
    // 16 x 1 MiB, odd sizes, and one request of two chunks and a bit.
    let mut sizes = vec![1 << 20; 16];
    sizes.extend([1, 4095, 300_001, 9 << 20 | 3]);
    let mut at = Vec::new();
    let mut off = 0usize;
    for s in &sizes {
        at.push(off);
        off += s + 4096; // gaps stay as they were
    }
    assert!(off <= LEN);
    for (seg, dst) in [(&peer, &remote), (&me, &own)] {
        let writes = sizes
            .iter()
            .zip(&at)
            .map(|(&n, &o)| TransferRequest::write(&local, o, seg, dst.addr() + o as u64, n))
            .collect();
        let results = initiator.submit(writes).await.unwrap().wait_all().await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let reads = sizes
            .iter()
            .zip(&at)
            .map(|(&n, &o)| TransferRequest::read(&back, o, seg, dst.addr() + o as u64, n))
            .collect();
        let results = initiator.submit(reads).await.unwrap().wait_all().await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        for (&n, &o) in sizes.iter().zip(&at) {
            assert!(
                same_bytes(&local, o, dst, o, n),
                "{n} bytes at {o} written wrong"
            );
            assert!(
                same_bytes(&local, o, &back, o, n),
                "{n} bytes at {o} read wrong"
            );
        }
    }
    assert_eq!(initiator.stats().tcp_bytes, 0, "nothing went over TCP");
}
