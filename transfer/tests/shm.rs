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

/// The batch forms of the mapped copies answer each item on its own: mapped ranges (a
/// peer's shared region, the own segment) are copied, all at once and spread over the
/// caller's thread and the copier; private memory and a range past a region are left to
/// transfers (`None`, nothing appended for them); the appended ranges lie back to back.
/// Several threads copying at once share the one copier and each gets its own bytes.
#[tokio::test]
async fn batches_of_mapped_copies_answer_each_item_and_share_the_copier() {
    let target = engine(true).await;
    let initiator = engine(true).await;
    const LEN: usize = 24 << 20;
    let shared = target.alloc(LEN).unwrap();
    let private = target
        .register(MemoryRegion::alloc(1 << 20).unwrap())
        .unwrap();
    let own = initiator.alloc(4 << 20).unwrap();
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    let me = initiator
        .open_segment(initiator.segment_name())
        .await
        .unwrap();
    // Odd sizes and offsets, about 1 MiB each: many pieces, cut inside values.
    let lens: Vec<usize> = (0..9).map(|i| (1 << 20) + 4097 * i + 1).collect();
    let srcs: Vec<Vec<u8>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|b| (b * 7 + i * 13) as u8).collect())
        .collect();
    let at: Vec<u64> = (0..lens.len())
        .map(|i| shared.addr() + 5 + (i as u64) * (2 << 20))
        .collect();
    let mut items: Vec<(&transfer::Segment, u64, &[u8])> = at
        .iter()
        .zip(&srcs)
        .map(|(&a, s)| (&seg, a, s.as_slice()))
        .collect();
    items.insert(2, (&seg, private.addr(), &srcs[0][..10]));
    items.insert(5, (&me, own.addr() + 3, &srcs[1][..70_000]));
    items.push((&seg, shared.addr() + LEN as u64 - 10, &srcs[2][..20]));
    let wrote = initiator.write_mapped_batch(&items);
    assert_eq!(wrote.len(), items.len());
    for (k, r) in wrote.iter().enumerate() {
        match k {
            2 | 11 => assert!(r.is_none(), "item {k}: {r:?}"),
            _ => assert!(matches!(r, Some(Ok(()))), "item {k}: {r:?}"),
        }
    }
    for (i, s) in srcs.iter().enumerate() {
        assert!(
            shared.to_vec(5 + i * (2 << 20), s.len()).unwrap() == *s,
            "value {i}"
        );
    }
    assert_eq!(own.to_vec(3, 70_000).unwrap(), srcs[1][..70_000]);

    // Read back in one batch, after a head the caller already had.
    let ranges: Vec<(&transfer::Segment, u64, usize)> =
        items.iter().map(|(s, a, b)| (*s, *a, b.len())).collect();
    let mut out = b"head".to_vec();
    let got = initiator.append_mapped_batch(&ranges, &mut out);
    let mut next = 4;
    for (k, r) in got.into_iter().enumerate() {
        match (k, r) {
            (2 | 11, r) => assert!(r.is_none(), "item {k}: {r:?}"),
            (k, Some(Ok(r))) => {
                assert_eq!(r.start, next, "item {k} is not right after the one before");
                assert!(out[r.clone()] == *items[k].2, "item {k} read back wrong");
                next = r.end;
            }
            (k, r) => panic!("item {k}: {r:?}"),
        }
    }
    assert_eq!((&out[..4], out.len()), (&b"head"[..], next));
    assert_eq!(initiator.stats().tcp_bytes, 0);

    // Four threads at once, each reading its own values a few times: the copier takes
    // pieces of whichever job it was handed, and each caller takes back what it has not.
    std::thread::scope(|s| {
        for t in 0..4 {
            let (initiator, seg, srcs, at) = (&initiator, &seg, &srcs, &at);
            s.spawn(move || {
                let mine: Vec<usize> = (0..srcs.len()).filter(|i| i % 4 == t).collect();
                let ranges: Vec<(&transfer::Segment, u64, usize)> =
                    mine.iter().map(|&i| (seg, at[i], srcs[i].len())).collect();
                for _ in 0..8 {
                    let mut out = Vec::new();
                    let got = initiator.append_mapped_batch(&ranges, &mut out);
                    for (&i, r) in mine.iter().zip(got) {
                        let r = r.expect("mapped").unwrap();
                        assert!(out[r] == *srcs[i], "thread {t}: value {i} read back wrong");
                    }
                }
            });
        }
    });
}
