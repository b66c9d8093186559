//! A transfer port attacked as a hostile host would: raw sockets with no credentials, a
//! wrong secret, a replayed session, a v1 peer, a handshake flood. Every attack is refused
//! (nothing of the node's memory or descriptor leaves, nothing is written, no notification
//! is queued) and the node goes on serving authenticated peers.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use transfer::auth::handshake;
use transfer::tcp::frame::{Opcode, RESPONSE_HEADER_LEN, RequestHeader, ResponseHeader, Status};
use transfer::{ClusterSecret, RegisteredBuffer, TransferEngine, TransferError, TransferRequest};

const PATTERN: u8 = 0x5a;

async fn target() -> (TransferEngine, RegisteredBuffer) {
    let t = engine(true).await;
    let r = t.alloc(64 << 10).unwrap();
    r.write_at(0, &[PATTERN; 64 << 10]).unwrap();
    (t, r)
}

/// Everything the peer sends until it closes (bounded in time and size).
async fn read_all(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.len() > 1 << 20 {
                        break;
                    }
                }
            }
        }
    })
    .await;
    got
}

fn frames(t: &TransferEngine, r: &RegisteredBuffer) -> Vec<(&'static str, Vec<u8>)> {
    // The attacker even knows the region's address and token (say, from a leaked descriptor).
    let token = t.descriptor().regions[0].token;
    let h = |op, addr, len, token| {
        RequestHeader {
            op,
            request_id: 1,
            remote_addr: addr,
            len,
            token,
        }
        .encode()
        .to_vec()
    };
    let mut write = h(Opcode::Write, r.addr(), 16, token);
    write.extend_from_slice(&[0u8; 16]);
    let mut notify = h(Opcode::Notify, 0, 9, 0);
    notify.extend_from_slice(b"from evil");
    let mut rdma = h(Opcode::RdmaConnect, 0, 2, 0);
    rdma.extend_from_slice(b"{}");
    vec![
        ("descriptor", h(Opcode::Descriptor, 0, 0, 0)),
        ("read", h(Opcode::Read, r.addr(), 4096, token)),
        ("write", write),
        ("notify", notify),
        ("rdma connect", rdma),
    ]
}

async fn still_serves(t: &TransferEngine, r: &RegisteredBuffer) {
    let peer = engine(false).await;
    let local = peer.alloc(4096).unwrap();
    let seg = peer.open_segment(t.segment_name()).await.unwrap();
    peer.transfer(TransferRequest::read(&local, 0, &seg, r.addr(), 4096))
        .await
        .unwrap();
    assert_eq!(local.to_vec(0, 4096).unwrap(), vec![PATTERN; 4096]);
    peer.notify(&seg, b"hello").await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(10), t.notifications().recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (n.from.as_str(), &n.message[..]),
        (peer.segment_name(), &b"hello"[..])
    );
}

#[tokio::test]
async fn a_peer_without_credentials_gets_nothing_and_changes_nothing() {
    let (t, r) = target().await;
    for (what, bytes) in frames(&t, &r) {
        let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        let got = read_all(&mut s).await;
        assert!(
            got.is_empty(),
            "{what}: the node answered {} bytes",
            got.len()
        );
    }
    assert_eq!(
        r.to_vec(0, 64 << 10).unwrap(),
        vec![PATTERN; 64 << 10],
        "memory unchanged"
    );
    assert!(
        t.notifications().try_recv().is_none(),
        "no notification queued"
    );
    still_serves(&t, &r).await;
}

#[tokio::test]
async fn a_peer_with_another_secret_is_refused_both_ways() {
    let (t, r) = target().await;
    let outsider = TransferEngine::builder()
        .config(config(true))
        .secret(ClusterSecret::generate().unwrap())
        .build()
        .await
        .unwrap();
    // The outsider cannot open the node's segment (no descriptor, so no shared-memory
    // location either), nor can the node open the outsider's.
    let e = outsider.open_segment(t.segment_name()).await.unwrap_err();
    assert!(
        matches!(e, TransferError::Unauthenticated { ref reason, .. } if reason.contains("cluster's transfer secret")),
        "{e}"
    );
    let e = t.open_segment(outsider.segment_name()).await.unwrap_err();
    assert!(e.to_string().contains("transfer secret"), "{e}");
    assert_eq!(outsider.stats().shm_bytes + outsider.stats().tcp_bytes, 0);

    // A raw peer that plays the protocol blindly (any proof it can make) and pipelines a
    // request after it gets a refusal, and no answer to the request.
    let wrong = ClusterSecret::generate().unwrap();
    let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
    let e = handshake::initiate(&mut s, &wrong, "intruder", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        handshake::HandshakeError::BadTag,
        "the node's tag does not verify"
    );
    let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
    blind_proof(&mut s).await;
    s.write_all(&frames(&t, &r)[0].1).await.unwrap();
    let got = read_all(&mut s).await;
    let h = ResponseHeader::decode(&got[..RESPONSE_HEADER_LEN]).unwrap();
    assert_eq!(h.status, Status::Unauthenticated);
    assert_eq!(
        got.len(),
        RESPONSE_HEADER_LEN + h.len as usize,
        "nothing but the refusal"
    );
    assert!(String::from_utf8_lossy(&got[RESPONSE_HEADER_LEN..]).contains("does not hold"));
    still_serves(&t, &r).await;
}

/// Sends a hello, reads the challenge, answers it with a made-up proof.
async fn blind_proof(s: &mut TcpStream) {
    let mut hello = Vec::new();
    hello.extend_from_slice(b"MGTA");
    hello.extend_from_slice(&[2, 1, 0, 0]);
    hello.extend_from_slice(&[7u8; 32]);
    s.write_all(&hello).await.unwrap();
    let mut head = [0u8; 8];
    s.read_exact(&mut head).await.unwrap();
    let name_len = u16::from_le_bytes([head[6], head[7]]) as usize;
    let mut rest = vec![0u8; 64 + name_len];
    s.read_exact(&mut rest).await.unwrap();
    let mut proof = Vec::new();
    proof.extend_from_slice(b"MGTA");
    proof.extend_from_slice(&[2, 3, 0, 0]);
    proof.extend_from_slice(&[0x42u8; 32]);
    s.write_all(&proof).await.unwrap();
}

/// Records what a stream writes.
struct Tap<'a> {
    s: &'a mut TcpStream,
    sent: Vec<u8>,
}

impl AsyncRead for Tap<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.s).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tap<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let r = std::pin::Pin::new(&mut *this.s).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            this.sent.extend_from_slice(&buf[..*n]);
        }
        r
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.s).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.s).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn a_recorded_session_replayed_gets_nothing() {
    let (t, r) = target().await;
    let secret = ClusterSecret::resolve(None).unwrap();
    // A legitimate session, recorded on the wire: handshake, then a descriptor request.
    let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
    let mut tap = Tap {
        s: &mut s,
        sent: Vec::new(),
    };
    handshake::initiate(&mut tap, &secret, "member", Duration::from_secs(5))
        .await
        .unwrap();
    let mut recorded = tap.sent;
    let request = &frames(&t, &r)[0].1;
    recorded.extend_from_slice(request);
    s.write_all(request).await.unwrap();
    let mut hb = [0u8; RESPONSE_HEADER_LEN];
    s.read_exact(&mut hb).await.unwrap();
    assert_eq!(
        ResponseHeader::decode(&hb).unwrap().status,
        Status::Ok,
        "the real session works"
    );
    drop(s);
    // Replayed byte for byte: the node's fresh nonce makes the old proof worthless.
    let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
    s.write_all(&recorded).await.unwrap();
    let got = read_all(&mut s).await;
    let challenge = 72 + usize::from(u16::from_le_bytes([got[6], got[7]]));
    let h = ResponseHeader::decode(&got[challenge..challenge + RESPONSE_HEADER_LEN]).unwrap();
    assert_eq!(h.status, Status::Unauthenticated);
    assert_eq!(
        got.len(),
        challenge + RESPONSE_HEADER_LEN + h.len as usize,
        "no descriptor"
    );
    still_serves(&t, &r).await;
}

#[tokio::test]
async fn a_v1_peer_is_told_to_upgrade() {
    let (t, r) = target().await;
    let mut v1 = RequestHeader {
        op: Opcode::Descriptor,
        request_id: 9,
        remote_addr: 0,
        len: 0,
        token: 0,
    }
    .encode();
    v1[4] = 1;
    let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
    s.write_all(&v1).await.unwrap();
    let got = read_all(&mut s).await;
    assert_eq!(&got[0..5], b"MGTR\x01", "answered in v1 framing");
    assert_eq!(u64::from_le_bytes(got[8..16].try_into().unwrap()), 9);
    assert!(String::from_utf8_lossy(&got[24..]).contains("protocol v2"));
    still_serves(&t, &r).await;
}

#[tokio::test]
async fn notifications_come_from_the_authenticated_name_only() {
    let (t, _r) = target().await;
    let secret = ClusterSecret::resolve(None).unwrap();
    let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
    handshake::initiate(&mut s, &secret, "10.9.9.9:1", Duration::from_secs(5))
        .await
        .unwrap();
    // A payload that claims to be from someone else (the v1 encoding put a name first).
    let msg = b"\x0a\x00prefill-0 pages done";
    let mut f = RequestHeader {
        op: Opcode::Notify,
        request_id: 1,
        remote_addr: 0,
        len: msg.len() as u64,
        token: 0,
    }
    .encode()
    .to_vec();
    f.extend_from_slice(msg);
    s.write_all(&f).await.unwrap();
    let mut hb = [0u8; RESPONSE_HEADER_LEN];
    s.read_exact(&mut hb).await.unwrap();
    assert_eq!(ResponseHeader::decode(&hb).unwrap().status, Status::Ok);
    let n = t.notifications().recv().await.unwrap();
    assert_eq!(n.from, "10.9.9.9:1", "the name bound to the proof");
    assert_eq!(
        n.message,
        msg.to_vec(),
        "the payload is the message, untouched"
    );
    assert_eq!(n.peer_addr, Some(s.local_addr().unwrap()));
}

/// One host cannot occupy every handshake slot: beyond the per-address bound its new
/// connections are closed at once; once its stalled connections go, peers get in again.
#[tokio::test]
async fn stalled_handshakes_are_bounded_per_address() {
    let (t, r) = target().await;
    let mut stalled = Vec::new();
    for _ in 0..64 {
        let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
        s.write_all(b"MGTA").await.unwrap(); // a hello that never finishes
        stalled.push(s);
    }
    // The server takes the 64 slots as it accepts them: probe until a connection is
    // closed at once (well before the 5 s handshake timeout).
    let started = std::time::Instant::now();
    let refused = loop {
        let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
        let mut b = [0u8; 1];
        match tokio::time::timeout(Duration::from_secs(1), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            _ if started.elapsed() > Duration::from_secs(20) => break false,
            _ => continue,
        }
    };
    assert!(
        refused,
        "a 65th concurrent handshake from one address was not refused"
    );
    drop(stalled);
    // Freed slots: peers connect again (bounded retries while the server notices).
    let peer = engine(false).await;
    let local = peer.alloc(4096).unwrap();
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(seg) = peer.open_segment(t.segment_name()).await
            && peer
                .transfer(TransferRequest::read(&local, 0, &seg, r.addr(), 4096))
                .await
                .is_ok()
        {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ok,
        "the node serves again once the stalled handshakes are gone"
    );
}
