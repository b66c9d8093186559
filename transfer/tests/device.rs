//! Device memory on every machine: the engine with a fake device (`common::fake_device`)
//! whose memory faults on any CPU access, so each path below proves it moves device bytes
//! only through copy engines. Real sockets on loopback; the GPU versions of these tests are
//! in `cuda.rs`.

mod common;
#[path = "common/fake_device.rs"]
mod fake_device;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use fake_device::{FakeDevice, dev_engine, until};
use transfer::{
    EngineConfig, Location, RegisteredBuffer, RequestStatus, TransferEngine, TransferError,
    TransferRequest,
};

const CHUNK: usize = 64 << 10;

fn dev_config(shm: bool, ipc: bool) -> EngineConfig {
    EngineConfig {
        shm,
        device_ipc: ipc,
        device_staging_chunk: CHUNK,
        device_staging_per_peer: 4 * CHUNK,
        slice_size: 512 << 10,
        io_timeout: Duration::from_secs(10),
        ..config(shm)
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    random_bytes(seed, len)
}

fn put(buf: &RegisteredBuffer, off: usize, bytes: &[u8]) {
    buf.write_at(off, bytes).unwrap();
}

fn get(buf: &RegisteredBuffer, off: usize, len: usize) -> Vec<u8> {
    buf.to_vec(off, len).unwrap()
}

#[tokio::test]
async fn device_memory_is_registered_from_its_pointer_and_touched_only_through_the_device() {
    let fake = FakeDevice::new(2, "reg");
    let e = dev_engine(&fake, dev_config(false, true)).await;
    let alloc = {
        use transfer::DeviceBackend;
        fake.alloc_device(1, 1 << 20).unwrap()
    };
    let ptr = alloc.addr() as *mut u8;
    // SAFETY: the fake allocation outlives every registration below.
    let wrong = unsafe { e.register_raw_at(ptr, 4096, Some(Location::Cuda(0)), ()) };
    let err = wrong.unwrap_err().to_string();
    assert!(err.contains("cuda:1") && err.contains("cuda:0"), "{err}");
    let host = vec![0u8; 4096];
    // SAFETY: `host` outlives the attempt.
    let not_dev =
        unsafe { e.register_raw_at(host.as_ptr().cast_mut(), 4096, Some(Location::Cuda(0)), ()) };
    assert!(matches!(not_dev, Err(TransferError::Device { .. })));
    // Past the end of its allocation.
    // SAFETY: refused before anything is registered.
    let past = unsafe { e.register_raw_at(ptr.wrapping_add(4096), 1 << 20, None, ()) };
    assert!(past.is_err());
    // `*` finds out; the region is the device's from then on.
    // SAFETY: the allocation is moved into the registration (freed with it).
    let buf = unsafe { e.register_raw_at(ptr.wrapping_add(8192), 65536, None, alloc) }.unwrap();
    assert_eq!(buf.region().location(), Location::Cuda(1));
    assert!(buf.region().is_device());
    assert_eq!(e.locate(buf.addr()).unwrap(), Location::Cuda(1));
    assert_eq!(e.locate(host.as_ptr() as u64).unwrap(), Location::Host);
    // The CPU copies go through the device (a memcpy from the pointer would fault).
    let data = pattern(1, 65536);
    put(&buf, 0, &data);
    assert_eq!(get(&buf, 0, 65536), data);
    assert_eq!(fake.peek(buf.addr() + 100, 10), data[100..110]);
    let mut out = vec![0u8; 7];
    buf.read_at(5, &mut out).unwrap();
    assert_eq!(out, data[5..12]);
    assert!(buf.write_at(65530, &[0; 7]).is_err());
    // The descriptor says where it lives and how a same-host peer opens it.
    let d = e.descriptor();
    let r = d.regions.iter().find(|r| r.addr == buf.addr()).unwrap();
    assert_eq!(r.location, Location::Cuda(1));
    let ipc = r.cuda_ipc.as_ref().expect("exported");
    assert_eq!(ipc.device_uuid, "GPU-reg-1");
    assert_eq!(ipc.offset, 8192);
    assert!(r.shm.is_none());
    // A host registration with `*` stays host memory.
    // SAFETY: `host` outlives the registration (dropped below, before `host`).
    let h = unsafe { e.register_raw_at(host.as_ptr().cast_mut(), 4096, None, ()) }.unwrap();
    assert_eq!(h.region().location(), Location::Host);
    drop(h);
    drop(buf);
    assert_eq!(e.registered_regions(), 0);
}

#[tokio::test]
async fn without_a_driver_device_memory_is_refused_and_host_memory_still_registers() {
    let e = TransferEngine::new(EngineConfig {
        cuda_library: Some("/nonexistent/libcuda.so.1".into()),
        ..config(false)
    })
    .await
    .unwrap();
    let err = e.alloc_device(0, 4096).unwrap_err().to_string();
    assert!(
        err.contains("CUDA driver") && err.contains("/nonexistent"),
        "{err}"
    );
    let host = vec![0u8; 4096];
    // SAFETY: refused, nothing registered.
    let r =
        unsafe { e.register_raw_at(host.as_ptr().cast_mut(), 4096, Some(Location::Cuda(0)), ()) };
    assert!(r.unwrap_err().to_string().contains("CUDA driver"));
    // SAFETY: `host` outlives the registration.
    let h = unsafe { e.register_raw_at(host.as_ptr().cast_mut(), 4096, None, ()) }.unwrap();
    assert_eq!(h.region().location(), Location::Host);
    assert!(e.staging_stats().is_none());
}

/// Writes then reads back `sizes` between `local` and `remote` (of `seg`), checking bytes.
async fn round_trips(
    e: &TransferEngine,
    local: &RegisteredBuffer,
    seg: &transfer::Segment,
    remote: &RegisteredBuffer,
    sizes: &[usize],
) {
    for (i, &len) in sizes.iter().enumerate() {
        let (lo, ro) = (i * 13, i * 7 + 1);
        let data = pattern(i as u64 + 10, len);
        put(local, lo, &data);
        e.transfer(TransferRequest::write(
            local,
            lo,
            seg,
            remote.addr() + ro as u64,
            len,
        ))
        .await
        .unwrap();
        assert_eq!(get(remote, ro, len), data, "write of {len}");
        put(local, lo, &vec![0u8; len]);
        e.transfer(TransferRequest::read(
            local,
            lo,
            seg,
            remote.addr() + ro as u64,
            len,
        ))
        .await
        .unwrap();
        assert_eq!(get(local, lo, len), data, "read of {len}");
    }
}

const SIZES: [usize; 7] = [
    1,
    4095,
    CHUNK,
    CHUNK + 1,
    3 * CHUNK + 17,
    1 << 20,
    (5 << 20) + 3,
];

#[tokio::test]
async fn tcp_moves_bytes_exactly_between_host_and_device_memory_either_way() {
    let (fa, fb) = (FakeDevice::new(1, "a"), FakeDevice::new(1, "b"));
    let a = dev_engine(&fa, dev_config(false, false)).await;
    let b = dev_engine(&fb, dev_config(false, false)).await;
    let seg = a.open_segment(b.segment_name()).await.unwrap();
    let host_a = a.alloc(6 << 20).unwrap();
    let dev_a = a.alloc_device(0, 6 << 20).unwrap();
    let host_b = b.alloc(6 << 20).unwrap();
    let dev_b = b.alloc_device(0, 6 << 20).unwrap();
    seg.descriptor(); // fetched after the registrations below are visible p2p
    // host -> device (the target stages), device -> host (the initiator stages), device ->
    // device (both do).
    round_trips(&a, &host_a, &seg, &dev_b, &SIZES).await;
    round_trips(&a, &dev_a, &seg, &host_b, &SIZES).await;
    round_trips(&a, &dev_a, &seg, &dev_b, &SIZES).await;
    let s = a.stats();
    assert!(s.tcp_bytes > 0 && s.shm_bytes == 0 && s.ipc_bytes == 0);
    assert!(fa.copies.load(Ordering::SeqCst) > 0 && fb.copies.load(Ordering::SeqCst) > 0);
    // Staging buffers went back to their pools.
    until("staging returned", || {
        a.staging_stats().unwrap().in_use == 0 && b.staging_stats().unwrap().in_use == 0
    })
    .await;
}

#[tokio::test]
async fn a_write_into_device_memory_is_acknowledged_only_once_its_copies_completed() {
    let (fa, fb) = (FakeDevice::new(1, "a"), FakeDevice::new(1, "b"));
    let a = dev_engine(&fa, dev_config(false, false)).await;
    let b = dev_engine(&fb, dev_config(false, false)).await;
    let dev_b = b.alloc_device(0, 1 << 20).unwrap();
    let seg = a.open_segment(b.segment_name()).await.unwrap();
    let host_a = a.alloc(1 << 20).unwrap();
    let data = pattern(3, 8 * CHUNK);
    put(&host_a, 0, &data);
    fb.hold();
    // One frame of 8 chunks: the target copies up to 4 ahead of what it receives.
    let batch = a
        .submit(vec![TransferRequest::write(
            &host_a,
            0,
            &seg,
            dev_b.addr(),
            8 * CHUNK,
        )])
        .await
        .unwrap();
    until("four copies pending", || {
        fb.pending.load(Ordering::SeqCst) == 4
    })
    .await;
    assert_eq!(batch.status(0), RequestStatus::Pending);
    fb.release();
    batch.wait().await.unwrap();
    assert_eq!(
        fb.max_pending.load(Ordering::SeqCst),
        4,
        "the ring bounds the copies"
    );
    assert_eq!(fb.copies.load(Ordering::SeqCst), 8);
    assert_eq!(get(&dev_b, 0, 8 * CHUNK), data);
    // A read into device memory is reported only once its bytes reached the device.
    let dev_a = a.alloc_device(0, 1 << 20).unwrap();
    fa.hold();
    let batch = a
        .submit(vec![TransferRequest::read(
            &dev_a,
            0,
            &seg,
            dev_b.addr(),
            2 * CHUNK,
        )])
        .await
        .unwrap();
    until("landing copies pending", || {
        fa.pending.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(batch.status(0), RequestStatus::Pending);
    fa.release();
    batch.wait().await.unwrap();
    assert_eq!(get(&dev_a, 0, 2 * CHUNK), data[..2 * CHUNK]);
}

#[tokio::test]
async fn staging_memory_is_bounded_per_peer() {
    let (fa, fb) = (FakeDevice::new(1, "a"), FakeDevice::new(1, "b"));
    let a = dev_engine(&fa, dev_config(false, false)).await;
    let b = dev_engine(&fb, dev_config(false, false)).await;
    let dev_a = a.alloc_device(0, 4 << 20).unwrap();
    let dev_b = b.alloc_device(0, 4 << 20).unwrap();
    let seg = a.open_segment(b.segment_name()).await.unwrap();
    put(&dev_a, 0, &pattern(4, 4 << 20));
    // 64 writes of a chunk each, and 4 of a MiB each, all at once, device to device.
    let mut reqs: Vec<_> = (0..64)
        .map(|i| {
            TransferRequest::write(
                &dev_a,
                i * CHUNK,
                &seg,
                dev_b.addr() + (i * CHUNK) as u64,
                CHUNK,
            )
        })
        .collect();
    reqs.extend((0..4).map(|i| {
        TransferRequest::write(
            &dev_a,
            i << 20,
            &seg,
            dev_b.addr() + (i << 20) as u64,
            1 << 20,
        )
    }));
    a.submit(reqs).await.unwrap().wait().await.unwrap();
    assert_eq!(get(&dev_b, 0, 4 << 20), get(&dev_a, 0, 4 << 20));
    for (who, e) in [("initiator", &a), ("target", &b)] {
        let s = e.staging_stats().unwrap();
        assert_eq!(s.per_peer_limit, 4 * CHUNK);
        assert!(s.peak_in_use <= 4 * CHUNK, "{who}: {s:?}");
        assert!(s.peak_in_use >= CHUNK, "{who}: {s:?}");
        assert!(s.allocated <= 4 * CHUNK, "{who} reuses its buffers: {s:?}");
    }
    assert!(fa.pinned.load(Ordering::SeqCst) <= 4);
}

#[tokio::test]
async fn a_failed_device_copy_fails_its_request_and_the_connection_serves_on() {
    let (fa, fb) = (FakeDevice::new(1, "a"), FakeDevice::new(1, "b"));
    let a = dev_engine(&fa, dev_config(false, false)).await;
    let b = dev_engine(&fb, dev_config(false, false)).await;
    let dev_b = b.alloc_device(0, 1 << 20).unwrap();
    let host_a = a.alloc(1 << 20).unwrap();
    let seg = a.open_segment(b.segment_name()).await.unwrap();
    put(&host_a, 0, &pattern(5, 3 * CHUNK));
    // On the target, into device memory: refused, the payload drained.
    fb.fail_copies(1);
    let e = a
        .transfer(TransferRequest::write(
            &host_a,
            0,
            &seg,
            dev_b.addr(),
            3 * CHUNK,
        ))
        .await
        .unwrap_err();
    assert!(matches!(e, TransferError::Device { .. }), "{e}");
    assert!(e.to_string().contains("injected"), "{e}");
    // Out of device memory, before any data: refused.
    fb.fail_copies(1);
    let e = a
        .transfer(TransferRequest::read(
            &host_a,
            0,
            &seg,
            dev_b.addr(),
            3 * CHUNK,
        ))
        .await
        .unwrap_err();
    assert!(matches!(e, TransferError::Device { .. }), "{e}");
    // On the initiator, out of and into its device memory.
    let dev_a = a.alloc_device(0, 1 << 20).unwrap();
    fa.fail_copies(1);
    let e = a
        .transfer(TransferRequest::write(&dev_a, 0, &seg, dev_b.addr(), CHUNK))
        .await
        .unwrap_err();
    assert!(matches!(e, TransferError::Device { .. }), "{e}");
    fa.fail_copies(1);
    let e = a
        .transfer(TransferRequest::read(&dev_a, 0, &seg, dev_b.addr(), CHUNK))
        .await
        .unwrap_err();
    assert!(matches!(e, TransferError::Device { .. }), "{e}");
    // Everything works again.
    round_trips(&a, &host_a, &seg, &dev_b, &[3 * CHUNK]).await;
    round_trips(&a, &dev_a, &seg, &dev_b, &[3 * CHUNK]).await;
}

#[tokio::test]
async fn a_cancelled_read_into_device_memory_is_reported_once_its_copy_is_over() {
    let (fa, fb) = (FakeDevice::new(1, "a"), FakeDevice::new(1, "b"));
    let a = dev_engine(&fa, dev_config(false, false)).await;
    let b = dev_engine(&fb, dev_config(false, false)).await;
    let host_b = b.alloc(1 << 20).unwrap();
    let dev_a = a.alloc_device(0, 1 << 20).unwrap();
    let seg = a.open_segment(b.segment_name()).await.unwrap();
    fa.hold();
    let batch = a
        .submit(vec![TransferRequest::read(
            &dev_a,
            0,
            &seg,
            host_b.addr(),
            CHUNK,
        )])
        .await
        .unwrap();
    until("the landing copy is pending", || {
        fa.pending.load(Ordering::SeqCst) == 1
    })
    .await;
    batch.cancel();
    // Decided, but the device still copies into the buffer: not reported yet.
    assert_eq!(batch.status(0), RequestStatus::Pending);
    assert!(!batch.is_complete());
    fa.release();
    let r = batch.wait().await;
    assert!(matches!(r, Err(TransferError::Cancelled { .. })), "{r:?}");
    assert_eq!(fa.pending.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn copies_within_one_engine_use_the_device() {
    let fake = FakeDevice::new(2, "local");
    let e = dev_engine(&fake, dev_config(true, true)).await;
    let own = e.open_segment(e.segment_name()).await.unwrap();
    let host = e.alloc(2 << 20).unwrap();
    let d0 = e.alloc_device(0, 2 << 20).unwrap();
    let d1 = e.alloc_device(1, 2 << 20).unwrap();
    round_trips(&e, &host, &own, &d0, &[1, CHUNK + 5, 1 << 20]).await;
    round_trips(&e, &d0, &own, &d1, &[1, CHUNK + 5, 1 << 20]).await;
    round_trips(&e, &d1, &own, &host, &[1, CHUNK + 5, 1 << 20]).await;
    assert!(e.stats().local_bytes > 0);
    assert_eq!(e.stats().tcp_bytes, 0);
    // A buffer copied into itself on a device is refused, not left undefined.
    let r = e
        .transfer(TransferRequest::write(&d0, 0, &own, d0.addr() + 10, 100))
        .await;
    assert!(
        matches!(r, Err(TransferError::InvalidRequest { .. })),
        "{r:?}"
    );
}

#[tokio::test]
async fn same_host_device_memory_goes_through_ipc_and_falls_back_to_tcp() {
    // One runtime for both engines: the initiator sees the target's device.
    let fake = FakeDevice::new(1, "shared");
    let a = dev_engine(&fake, dev_config(true, true)).await;
    let b = dev_engine(&fake, dev_config(true, true)).await;
    let dev_b = b.alloc_device(0, 4 << 20).unwrap();
    let host_b = b.alloc(4 << 20).unwrap();
    let seg = a.open_segment(b.segment_name()).await.unwrap();
    let host_a = a.alloc(4 << 20).unwrap();
    let dev_a = a.alloc_device(0, 4 << 20).unwrap();
    round_trips(&a, &host_a, &seg, &dev_b, &[1, CHUNK + 3, 3 << 20]).await;
    round_trips(&a, &dev_a, &seg, &dev_b, &[1, CHUNK + 3, 3 << 20]).await;
    // A device buffer and a same-host peer's shared memory: a device copy, no socket.
    round_trips(&a, &dev_a, &seg, &host_b, &[1, CHUNK + 3, 3 << 20]).await;
    let s = a.stats();
    assert!(s.ipc_bytes > 0 && s.shm_bytes > 0, "{s:?}");
    assert_eq!(s.tcp_bytes, 0, "{s:?}");
    // An unregistered region is refused through its control block, as shared memory is.
    let addr = dev_b.addr();
    drop(dev_b);
    let e = a
        .transfer(TransferRequest::write(&host_a, 0, &seg, addr, 10))
        .await
        .unwrap_err();
    assert!(matches!(e, TransferError::OutOfBounds { .. }), "{e}");

    // A peer whose device this process does not see (another runtime: other UUIDs) is
    // staged over TCP.
    let other = FakeDevice::new(1, "elsewhere");
    let c = dev_engine(&other, dev_config(true, true)).await;
    let dev_c = c.alloc_device(0, 1 << 20).unwrap();
    let seg_c = a.open_segment(c.segment_name()).await.unwrap();
    let before = a.stats();
    round_trips(&a, &host_a, &seg_c, &dev_c, &[CHUNK + 3]).await;
    let after = a.stats();
    assert!(after.tcp_bytes > before.tcp_bytes);
    assert_eq!(after.ipc_bytes, before.ipc_bytes);
}

#[tokio::test]
async fn raw_frames_into_device_memory_are_checked_like_any_other() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use transfer::tcp::frame::{
        Opcode, RESPONSE_HEADER_LEN, RequestHeader, ResponseHeader, Status,
    };
    let fake = FakeDevice::new(1, "raw");
    let b = dev_engine(&fake, dev_config(false, false)).await;
    let dev = b.alloc_device(0, 1 << 20).unwrap();
    put(&dev, 0, b"device bytes");
    let mut s = authenticated(b.local_addr()).await;
    let ask = |op, addr, len, token, payload: Vec<u8>| {
        let h = RequestHeader {
            op,
            request_id: 9,
            remote_addr: addr,
            len,
            token,
        };
        let mut frame = h.encode().to_vec();
        frame.extend(payload);
        frame
    };
    // A zero-length read of device memory is answered (with nothing).
    let f = ask(Opcode::Read, dev.addr(), 0, dev.token(), vec![]);
    s.write_all(&f).await.unwrap();
    let mut hb = [0u8; RESPONSE_HEADER_LEN];
    s.read_exact(&mut hb).await.unwrap();
    let h = ResponseHeader::decode(&hb).unwrap();
    assert_eq!((h.status, h.len), (Status::Ok, 0));
    // A bad token and a range past the region are refused before any device copy.
    for (addr, len, token) in [
        (dev.addr(), 12, dev.token() ^ 1),
        (dev.addr() + (1 << 20) - 4, 12, dev.token()),
    ] {
        let f = ask(Opcode::Write, addr, len, token, vec![7; len as usize]);
        s.write_all(&f).await.unwrap();
        s.read_exact(&mut hb).await.unwrap();
        let h = ResponseHeader::decode(&hb).unwrap();
        assert_ne!(h.status, Status::Ok);
        let mut msg = vec![0u8; h.len as usize];
        s.read_exact(&mut msg).await.unwrap();
    }
    assert_eq!(fake.copies.load(Ordering::SeqCst), 0);
    // And a good read returns the device's bytes.
    let f = ask(Opcode::Read, dev.addr(), 12, dev.token(), vec![]);
    s.write_all(&f).await.unwrap();
    s.read_exact(&mut hb).await.unwrap();
    let h = ResponseHeader::decode(&hb).unwrap();
    assert_eq!((h.status, h.len), (Status::Ok, 12));
    let mut data = [0u8; 12];
    s.read_exact(&mut data).await.unwrap();
    assert_eq!(&data, b"device bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_left_without_a_fence_ends_its_request_only_once_the_device_drained() {
    let fake = FakeDevice::new(1, "nofence");
    let e = Arc::new(dev_engine(&fake, dev_config(false, false)).await);
    let d = e.alloc_device(0, 2 * CHUNK).unwrap();
    let data = pattern(9, CHUNK);
    put(&d, 0, &data);
    fake.hold();
    fake.fail_fences.store(1, Ordering::SeqCst);
    let copy = {
        let (e, d) = (e.clone(), d.clone());
        tokio::spawn(async move {
            let own = e.open_segment(e.segment_name()).await.unwrap();
            e.transfer(TransferRequest::write(
                &d,
                0,
                &own,
                d.addr() + CHUNK as u64,
                CHUNK,
            ))
            .await
        })
    };
    until("the copy is enqueued", || {
        fake.pending.load(Ordering::SeqCst) == 1
    })
    .await;
    // The fence was refused, but the copy runs: the request has not ended.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(!copy.is_finished());
    fake.release();
    let r = copy.await.unwrap();
    assert!(
        matches!(&r, Err(TransferError::Device { reason }) if reason.contains("fence")),
        "{r:?}"
    );
    assert_eq!(fake.pending.load(Ordering::SeqCst), 0);
    assert_eq!(get(&d, CHUNK, CHUNK), data);
}
