//! Every error kind, produced the way it happens for real, and the target unharmed after.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use transfer::tcp::frame::{Opcode, RESPONSE_HEADER_LEN, RequestHeader, ResponseHeader, Status};
use transfer::{
    EngineConfig, InMemoryMetadata, Metadata, RegisteredBuffer, RequestStatus, Segment,
    SegmentDescriptor, TransferEngine, TransferError, TransferRequest,
};

/// A target and an initiator sharing in-memory metadata (so tests can publish doctored
/// descriptors under other names).
async fn pair() -> (
    Arc<InMemoryMetadata>,
    TransferEngine,
    TransferEngine,
    RegisteredBuffer,
) {
    let meta = Arc::new(InMemoryMetadata::new());
    let target = engine_with(meta.clone(), config(false)).await;
    let initiator = engine_with(meta.clone(), config(false)).await;
    let remote = target.alloc(1 << 20).unwrap();
    target.publish().await.unwrap();
    (meta, target, initiator, remote)
}

async fn publish_doctored(
    meta: &InMemoryMetadata,
    target: &TransferEngine,
    name: &str,
    edit: impl FnOnce(&mut SegmentDescriptor),
) {
    let mut d = target.descriptor();
    d.name = name.to_owned();
    edit(&mut d);
    meta.publish(&d).await.unwrap();
}

/// A good write and read-back still work, and the target still has its region.
async fn target_still_serves(
    initiator: &TransferEngine,
    target: &TransferEngine,
    remote: &RegisteredBuffer,
) {
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    let local = initiator.alloc(8192).unwrap();
    fill(&local, 99);
    write_checked(initiator, &local, 0, &seg, remote, 4096, 8192).await;
    assert_eq!(target.registered_regions(), 1);
}

#[tokio::test]
async fn refused_requests_name_peer_and_range_and_leave_the_target_serving() {
    let (meta, target, initiator, remote) = pair().await;
    let local = initiator.alloc(1 << 20).unwrap();
    let real = initiator.open_segment(target.segment_name()).await.unwrap();

    // Bad token: a forged descriptor carries the wrong token.
    publish_doctored(&meta, &target, "forged-token", |d| d.regions[0].token ^= 1).await;
    let seg = initiator.open_segment("forged-token").await.unwrap();
    let err = initiator
        .transfer(TransferRequest::write(&local, 0, &seg, remote.addr(), 4096))
        .await
        .unwrap_err();
    match &err {
        TransferError::BadToken { segment, range } => {
            assert_eq!(segment, "forged-token");
            assert_eq!((range.addr, range.len), (remote.addr(), 4096));
        }
        other => panic!("expected BadToken, got {other}"),
    }
    let err = initiator
        .transfer(TransferRequest::read(&local, 0, &seg, remote.addr(), 4096))
        .await
        .unwrap_err();
    assert!(matches!(err, TransferError::BadToken { .. }), "{err}");
    target_still_serves(&initiator, &target, &remote).await;

    // Out of bounds at the target: the forged descriptor claims a longer region.
    publish_doctored(&meta, &target, "forged-len", |d| {
        d.regions[0].len += 1 << 20
    })
    .await;
    let seg = initiator.open_segment("forged-len").await.unwrap();
    let end = remote.addr() + remote.len() as u64;
    for req in [
        TransferRequest::write(&local, 0, &seg, end - 100, 200),
        TransferRequest::read(&local, 0, &seg, end - 100, 200),
        TransferRequest::write(&local, 0, &seg, end + 4096, 10),
    ] {
        let err = initiator.transfer(req).await.unwrap_err();
        match &err {
            TransferError::OutOfBounds {
                segment, reason, ..
            } => {
                assert_eq!(segment, "forged-len");
                assert!(reason.contains("refused by peer"), "{reason}");
            }
            other => panic!("expected OutOfBounds, got {other}"),
        }
    }
    target_still_serves(&initiator, &target, &remote).await;

    // Out of bounds locally: the real descriptor has no such range (refreshed once first).
    let err = initiator
        .transfer(TransferRequest::write(&local, 0, &real, end, 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, TransferError::OutOfBounds { segment, .. } if segment == target.segment_name()),
        "{err}"
    );
    assert!(err.to_string().contains(&format!("{end:#x}")), "{err}");
    target_still_serves(&initiator, &target, &remote).await;
}

#[tokio::test]
async fn unknown_segments_and_unreachable_peers() {
    let meta = Arc::new(InMemoryMetadata::new());
    let e = engine_with(meta.clone(), config(false)).await;
    let err = e.open_segment("nobody:1").await.unwrap_err();
    assert!(matches!(err, TransferError::UnknownSegment { .. }), "{err}");

    let p2p = engine(false).await;
    let err = p2p
        .open_segment("no-such-host.invalid:1")
        .await
        .unwrap_err();
    assert!(matches!(err, TransferError::UnknownSegment { .. }), "{err}");
    let err = p2p.open_segment("not a name").await.unwrap_err();
    assert!(matches!(err, TransferError::UnknownSegment { .. }), "{err}");
    // Nothing listens on a port we just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = p2p
        .open_segment(&format!("127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, TransferError::PeerUnreachable { .. }) && err.is_retryable(),
        "{err}"
    );
}

#[tokio::test]
async fn a_shut_down_peer_is_unreachable() {
    let target = engine(false).await;
    let initiator = engine(false).await;
    let remote = target.alloc(65536).unwrap();
    let local = initiator.alloc(65536).unwrap();
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    initiator
        .transfer(TransferRequest::write(
            &local,
            0,
            &seg,
            remote.addr(),
            65536,
        ))
        .await
        .unwrap();
    let addr = remote.addr();
    target.shutdown().await;
    drop(remote);
    drop(target);
    let err = initiator
        .transfer(TransferRequest::write(&local, 0, &seg, addr, 65536))
        .await
        .unwrap_err();
    assert!(
        matches!(err, TransferError::PeerUnreachable { .. }),
        "{err}"
    );
    assert!(err.is_retryable());
}

/// A target shutting down finishes the write it is in the middle of receiving: the rest of
/// the payload is read into its memory, the write is acknowledged, then the connection
/// closes and `shutdown` returns.
#[tokio::test]
async fn a_target_shutting_down_finishes_the_write_it_is_receiving() {
    let (_meta, target, _initiator, remote) = pair().await;
    let token = target.descriptor().regions[0].token;
    let mut s = authenticated(target.local_addr()).await;
    // Large enough to be read straight into the region as it arrives; never a zero byte.
    let payload: Vec<u8> = (0..512 << 10).map(|i| (i % 251 + 1) as u8).collect();
    let first = 64 << 10;
    let h = RequestHeader {
        op: Opcode::Write,
        request_id: 7,
        remote_addr: remote.addr(),
        len: payload.len() as u64,
        token,
    };
    send_frame(&mut s, h, &payload[..first]).await;
    // The first part's last byte in the region: the target is inside this frame.
    for _ in 0..500 {
        if remote.to_vec(first - 1, 1).unwrap()[0] != 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_ne!(
        remote.to_vec(first - 1, 1).unwrap()[0],
        0,
        "the target never started"
    );
    let target = Arc::new(target);
    let stopping = tokio::spawn({
        let target = target.clone();
        async move { target.shutdown().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !stopping.is_finished(),
        "shutdown waits for the frame in progress"
    );
    s.write_all(&payload[first..]).await.unwrap();
    let (h, _) = read_response(&mut s).await;
    assert_eq!((h.status, h.request_id), (Status::Ok, 7));
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).await.unwrap(), 0, "then it closes");
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("shutdown returns once the frame is done")
        .unwrap();
    assert!(remote.to_vec(0, payload.len()).unwrap() == payload);
}

/// A peer that accepts connections and authenticates them, then reads but never answers.
async fn stalled_peer(meta: &InMemoryMetadata, name: &str) {
    let listener = fake_listener(meta, name).await;
    authenticating_listener(listener, |mut s| async move {
        let mut sink = vec![0u8; 1 << 16];
        while s.read(&mut sink).await.map(|n| n > 0).unwrap_or(false) {}
    });
}

#[tokio::test(start_paused = true)]
async fn requests_time_out_or_are_cancelled_and_stalled_lanes_die() {
    let meta = Arc::new(InMemoryMetadata::new());
    let cfg = EngineConfig {
        io_timeout: Duration::from_secs(3600),
        ..config(false)
    };
    let e = engine_with(meta.clone(), cfg).await;
    stalled_peer(&meta, "stalled").await;
    let local = e.alloc(65536).unwrap();
    let seg = e.open_segment("stalled").await.unwrap();

    let batch = e
        .submit_with_timeout(
            vec![TransferRequest::write(&local, 0, &seg, 1 << 20, 4096)],
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    let err = batch.wait().await.unwrap_err();
    match &err {
        TransferError::TimedOut {
            segment,
            range,
            timeout,
        } => {
            assert_eq!(
                (segment.as_str(), range.addr, *timeout),
                ("stalled", 1 << 20, Duration::from_secs(2))
            );
        }
        other => panic!("expected TimedOut, got {other}"),
    }
    assert!(matches!(
        batch.status(0),
        RequestStatus::Failed(TransferError::TimedOut { .. })
    ));

    let batch = e
        .submit(vec![TransferRequest::read(&local, 0, &seg, 1 << 20, 4096)])
        .await
        .unwrap();
    assert_eq!(batch.status(0), RequestStatus::Pending);
    batch.cancel();
    assert!(matches!(
        batch.status(0),
        RequestStatus::Failed(TransferError::Cancelled { .. })
    ));
    assert!(matches!(
        batch.wait().await,
        Err(TransferError::Cancelled { .. })
    ));

    // A lane with requests outstanding and no answer for the I/O timeout is closed, and
    // its requests fail as unreachable well before their own (long) timeout.
    let meta2 = Arc::new(InMemoryMetadata::new());
    let cfg = EngineConfig {
        io_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(600),
        ..config(false)
    };
    let e2 = engine_with(meta2.clone(), cfg).await;
    stalled_peer(&meta2, "stalled").await;
    let local2 = e2.alloc(4096).unwrap();
    let seg2: Segment = e2.open_segment("stalled").await.unwrap();
    let started = tokio::time::Instant::now();
    let err = e2
        .transfer(TransferRequest::write(&local2, 0, &seg2, 1 << 20, 4096))
        .await
        .unwrap_err();
    assert!(
        matches!(err, TransferError::PeerUnreachable { .. }),
        "{err}"
    );
    assert!(
        started.elapsed() <= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_peer_speaking_another_protocol_is_a_protocol_error() {
    let meta = Arc::new(InMemoryMetadata::new());
    let e = engine_with(meta.clone(), config(false)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf).await;
        let _ = s
            .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let desc = SegmentDescriptor::from_json(
        format!(
            r#"{{"version":1,"name":"http","host_id":"x","engine_id":5,"generation":1,
                "endpoints":{{"tcp":"{addr}"}},"regions":[{{"id":1,"addr":4096,"len":4096,"token":7}}]}}"#
        )
        .as_bytes(),
    )
    .unwrap();
    meta.publish(&desc).await.unwrap();
    let seg = e.open_segment("http").await.unwrap();
    let local = e.alloc(4096).unwrap();
    let err = e
        .transfer(TransferRequest::read(&local, 0, &seg, 4096, 16))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, TransferError::Protocol { reason, .. } if reason.contains("not a Moongate transfer handshake")),
        "{err}"
    );
}

#[tokio::test]
async fn malformed_requests_are_rejected_before_sending() {
    let (_meta, target, initiator, remote) = pair().await;
    let local = initiator.alloc(4096).unwrap();
    let seg = initiator.open_segment(target.segment_name()).await.unwrap();
    let err = initiator
        .submit(vec![TransferRequest::write(
            &local,
            4000,
            &seg,
            remote.addr(),
            200,
        )])
        .await
        .unwrap_err();
    assert!(matches!(err, TransferError::InvalidRequest { .. }), "{err}");
    let err = initiator
        .submit(vec![TransferRequest::write(
            &local,
            usize::MAX,
            &seg,
            remote.addr(),
            2,
        )])
        .await
        .unwrap_err();
    assert!(matches!(err, TransferError::InvalidRequest { .. }), "{err}");
    // A buffer registered with another engine cannot be a local side here.
    let err = initiator
        .submit(vec![TransferRequest::write(
            &remote,
            0,
            &seg,
            remote.addr(),
            2,
        )])
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("not registered with this engine"),
        "{err}"
    );
    target_still_serves(&initiator, &target, &remote).await;
}

async fn send_frame(s: &mut tokio::net::TcpStream, h: RequestHeader, payload: &[u8]) {
    s.write_all(&h.encode()).await.unwrap();
    s.write_all(payload).await.unwrap();
}

async fn read_response(s: &mut tokio::net::TcpStream) -> (ResponseHeader, Vec<u8>) {
    let mut hb = [0u8; RESPONSE_HEADER_LEN];
    s.read_exact(&mut hb).await.unwrap();
    let h = ResponseHeader::decode(&hb).unwrap();
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).await.unwrap();
    (h, body)
}

/// Speaks the wire protocol by hand: refused frames get error frames and the connection
/// keeps working; an undecodable header gets an error frame and the connection is closed;
/// the process serves on.
#[tokio::test]
async fn the_target_answers_bad_frames_and_keeps_the_connection() {
    let (_meta, target, initiator, remote) = pair().await;
    let token = target.descriptor().regions[0].token;
    let mut s = authenticated(target.local_addr()).await;
    let w = |id, addr, len, token| RequestHeader {
        op: Opcode::Write,
        request_id: id,
        remote_addr: addr,
        len,
        token,
    };

    send_frame(&mut s, w(1, remote.addr(), 100, token ^ 5), &[1u8; 100]).await;
    let (h, msg) = read_response(&mut s).await;
    assert_eq!((h.status, h.request_id), (Status::BadToken, 1));
    assert!(String::from_utf8_lossy(&msg).contains("token"));

    send_frame(
        &mut s,
        w(2, remote.addr() + remote.len() as u64 - 10, 100, token),
        &[2u8; 100],
    )
    .await;
    assert_eq!(read_response(&mut s).await.0.status, Status::OutOfBounds);
    send_frame(&mut s, w(3, 8, 100, token), &[3u8; 100]).await;
    assert_eq!(read_response(&mut s).await.0.status, Status::UnknownRegion);

    // Same connection, valid requests: a write lands, a read returns it.
    send_frame(&mut s, w(4, remote.addr() + 10, 5, token), b"hello").await;
    assert_eq!(
        read_response(&mut s).await.0,
        ResponseHeader {
            status: Status::Ok,
            request_id: 4,
            len: 0
        }
    );
    assert_eq!(remote.to_vec(10, 5).unwrap(), b"hello");
    let r = RequestHeader {
        op: Opcode::Read,
        request_id: 5,
        remote_addr: remote.addr() + 10,
        len: 5,
        token,
    };
    send_frame(&mut s, r, &[]).await;
    let (h, data) = read_response(&mut s).await;
    assert_eq!((h.status, data.as_slice()), (Status::Ok, &b"hello"[..]));
    let d = RequestHeader {
        op: Opcode::Descriptor,
        request_id: 6,
        remote_addr: 0,
        len: 0,
        token: 0,
    };
    send_frame(&mut s, d, &[]).await;
    let (h, json) = read_response(&mut s).await;
    assert_eq!(h.status, Status::Ok);
    assert_eq!(
        SegmentDescriptor::from_json(&json).unwrap().name,
        target.segment_name()
    );

    // Garbage: an error frame, then the connection closes.
    s.write_all(&[0x47u8; 40]).await.unwrap();
    let (h, msg) = read_response(&mut s).await;
    assert_eq!(h.status, Status::BadRequest);
    assert!(String::from_utf8_lossy(&msg).contains("magic"));
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).await.unwrap(), 0);

    target_still_serves(&initiator, &target, &remote).await;
}

/// A host that never answers connection attempts costs one connect timeout per batch, not
/// one per request.
#[tokio::test(start_paused = true)]
async fn a_blackholed_peer_fails_a_whole_batch_within_one_connect_timeout() {
    // A listener whose accept queue is full: further connection attempts hang.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    sock.listen(0).unwrap();
    let addr = sock.local_addr().unwrap().as_socket().unwrap();
    let _fill: Vec<_> = (0..3)
        .filter_map(|_| {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
            s.set_nonblocking(true).ok()?;
            let _ = s.connect(&addr.into());
            Some(s)
        })
        .collect();
    let meta = Arc::new(InMemoryMetadata::new());
    let desc = SegmentDescriptor::from_json(
        format!(
            r#"{{"version":1,"name":"blackhole","host_id":"x","engine_id":5,"generation":1,
                "endpoints":{{"tcp":"{addr}"}},"regions":[{{"id":1,"addr":4096,"len":1048576,"token":7}}]}}"#
        )
        .as_bytes(),
    )
    .unwrap();
    meta.publish(&desc).await.unwrap();
    let cfg = EngineConfig {
        connect_timeout: Duration::from_secs(5),
        ..config(false)
    };
    let e = engine_with(meta, cfg).await;
    let seg = e.open_segment("blackhole").await.unwrap();
    let local = e.alloc(1 << 20).unwrap();
    let started = tokio::time::Instant::now();
    let reqs = (0..64)
        .map(|i| TransferRequest::write(&local, i * 4096, &seg, 4096 + (i * 4096) as u64, 4096))
        .collect();
    let results = e.submit(reqs).await.unwrap().wait_all().await;
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(TransferError::PeerUnreachable { .. }))),
        "{results:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}
