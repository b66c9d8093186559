//! Staging buffers under pressure, on the fake device (`common::fake_device`): two engines
//! moving device memory to each other with the smallest budgets, and a connection that
//! goes away while the device still copies out of its buffers.

mod common;
#[path = "common/fake_device.rs"]
mod fake_device;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use fake_device::{FakeDevice, dev_engine, until};
use transfer::{EngineConfig, TransferRequest};

const CHUNK: usize = 64 << 10;

/// One staging buffer per peer and in all: the tightest budget there is.
fn tight() -> EngineConfig {
    EngineConfig {
        device_staging_chunk: CHUNK,
        device_staging_per_peer: CHUNK,
        device_staging_total: CHUNK,
        slice_size: CHUNK,
        io_timeout: Duration::from_secs(5),
        ..config(false)
    }
}

#[tokio::test]
async fn engines_writing_device_memory_to_each_other_share_no_staging_budget() {
    // Each engine's one buffer goes to an outgoing slice while the other's slice needs a
    // buffer to land in: with one budget for both roles, neither could go on.
    let (fa, fb) = (FakeDevice::new(1, "a"), FakeDevice::new(1, "b"));
    let a = dev_engine(&fa, tight()).await;
    let b = dev_engine(&fb, tight()).await;
    const LEN: usize = 32 * CHUNK;
    let (dev_a, dev_b) = (
        a.alloc_device(0, 2 * LEN).unwrap(),
        b.alloc_device(0, 2 * LEN).unwrap(),
    );
    let (from_a, from_b) = (random_bytes(1, LEN), random_bytes(2, LEN));
    dev_a.write_at(0, &from_a).unwrap();
    dev_b.write_at(0, &from_b).unwrap();
    let seg_b = a.open_segment(b.segment_name()).await.unwrap();
    let seg_a = b.open_segment(a.segment_name()).await.unwrap();
    for round in 0..4 {
        let ab = a.submit(vec![TransferRequest::write(
            &dev_a,
            0,
            &seg_b,
            dev_b.addr() + LEN as u64,
            LEN,
        )]);
        let ba = b.submit(vec![TransferRequest::write(
            &dev_b,
            0,
            &seg_a,
            dev_a.addr() + LEN as u64,
            LEN,
        )]);
        let (ab, ba) = tokio::join!(ab, ba);
        let (ab, ba) = (ab.unwrap(), ba.unwrap());
        let both = async { tokio::join!(ab.wait(), ba.wait()) };
        let (r1, r2) = tokio::time::timeout(Duration::from_secs(30), both)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the two directions wait on each other"));
        r1.unwrap();
        r2.unwrap();
    }
    assert_eq!(dev_b.to_vec(LEN, LEN).unwrap(), from_a);
    assert_eq!(dev_a.to_vec(LEN, LEN).unwrap(), from_b);
    for e in [&a, &b] {
        let s = e.staging_stats().unwrap();
        // One buffer per role at most; both roles were busy at once.
        assert!(s.peak_in_use <= 2 * CHUNK, "{s:?}");
    }
}

#[tokio::test]
async fn buffers_a_dropped_connection_leaves_with_the_device_return_only_after_its_copies() {
    use tokio::io::AsyncWriteExt;
    use transfer::tcp::frame::{Opcode, RequestHeader};
    let fake = FakeDevice::new(1, "drop");
    let b = dev_engine(
        &fake,
        EngineConfig {
            device_staging_chunk: CHUNK,
            device_staging_per_peer: 4 * CHUNK,
            ..config(false)
        },
    )
    .await;
    let dev = b.alloc_device(0, 1 << 20).unwrap();
    fake.hold();
    let mut s = authenticated(b.local_addr()).await;
    // A write of 8 chunks whose sender goes away after 3: the target took 4 buffers, and
    // the device copies out of 3 of them.
    let h = RequestHeader {
        op: Opcode::Write,
        request_id: 1,
        remote_addr: dev.addr(),
        len: 8 * CHUNK as u64,
        token: dev.token(),
    };
    s.write_all(&h.encode()).await.unwrap();
    s.write_all(&vec![7u8; 3 * CHUNK]).await.unwrap();
    until("three copies pending", || {
        fake.pending.load(Ordering::SeqCst) == 3
    })
    .await;
    assert_eq!(b.staging_stats().unwrap().in_use, 4 * CHUNK);
    drop(s);
    // The unused buffer comes back; those the device still copies out of do not.
    until("the idle buffer returned", || {
        b.staging_stats().unwrap().in_use == 3 * CHUNK
    })
    .await;
    drop(dev); // the registration lives on with the copies into it
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert_eq!(b.staging_stats().unwrap().in_use, 3 * CHUNK);
    fake.release();
    until("every buffer returned", || {
        b.staging_stats().unwrap().in_use == 0
    })
    .await;
    until("the registration ended", || b.registered_regions() == 0).await;
    assert_eq!(fake.pending.load(Ordering::SeqCst), 0);
    assert_eq!(fake.copies.load(Ordering::SeqCst), 3);
    assert_eq!(
        fake.stray_copies.load(Ordering::SeqCst),
        0,
        "the device memory outlived the copies into it"
    );
}
