//! Transfer ports attacked as a hostile host would: raw sockets with no credentials, a wrong
//! secret, a replayed session, a v1 peer, a handshake flood; against a bare engine, a
//! storage node and a simulated prefill worker. Every attack is refused (nothing of the
//! node's memory or descriptor leaves, nothing is written, no notification is queued) and
//! the node goes on serving authenticated peers.

use std::time::Duration;

use moongate_tests::attack::{blind_proof, frames, read_all, unauthenticated_frames_get_nothing};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use transfer::auth::handshake;
use transfer::tcp::frame::{Opcode, RESPONSE_HEADER_LEN, RequestHeader, ResponseHeader, Status};
use transfer::{
    ClusterSecret, EngineConfig, RegisteredBuffer, TransferEngine, TransferError, TransferRequest,
};

fn config(shm: bool) -> EngineConfig {
    EngineConfig {
        shm,
        ..EngineConfig::listening_on("127.0.0.1:0".parse().unwrap())
    }
}

/// A loopback engine with the secret every test process shares (the per-user default).
async fn engine(shm: bool) -> TransferEngine {
    TransferEngine::new(config(shm)).await.unwrap()
}

const PATTERN: u8 = 0x5a;

async fn target() -> (TransferEngine, RegisteredBuffer) {
    let t = engine(true).await;
    let r = t.alloc(64 << 10).unwrap();
    r.write_at(0, &[PATTERN; 64 << 10]).unwrap();
    (t, r)
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
    unauthenticated_frames_get_nothing(t.local_addr(), &t.descriptor()).await;
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
    let refusal = blind_request_is_refused(&t).await;
    assert!(refusal.contains("does not hold"), "{refusal}");
    still_serves(&t, &r).await;
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
    let request = &frames(&t.descriptor())[0].1;
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

/// An outsider engine (another cluster's secret) and raw frames against `target`'s
/// transfer port: nothing answered, nothing opened.
async fn refuses_outsiders(target: &TransferEngine) {
    unauthenticated_frames_get_nothing(target.local_addr(), &target.descriptor()).await;
    let outsider = TransferEngine::builder()
        .config(config(true))
        .secret(ClusterSecret::generate().unwrap())
        .build()
        .await
        .unwrap();
    let e = outsider
        .open_segment(target.segment_name())
        .await
        .unwrap_err();
    assert!(matches!(e, TransferError::Unauthenticated { .. }), "{e}");
    blind_request_is_refused(target).await;
}

/// A blind handshake followed by a descriptor request gets a refusal and nothing else;
/// returns the refusal's message.
async fn blind_request_is_refused(target: &TransferEngine) -> String {
    let mut s = TcpStream::connect(target.local_addr()).await.unwrap();
    blind_proof(&mut s).await;
    s.write_all(&frames(&target.descriptor())[0].1)
        .await
        .unwrap();
    let got = read_all(&mut s).await;
    let h = ResponseHeader::decode(&got[..RESPONSE_HEADER_LEN]).unwrap();
    assert_eq!(h.status, Status::Unauthenticated);
    assert_eq!(
        got.len(),
        RESPONSE_HEADER_LEN + h.len as usize,
        "nothing but the refusal"
    );
    String::from_utf8_lossy(&got[RESPONSE_HEADER_LEN..]).into_owned()
}

/// A storage node (a store client mounting a segment at a real master): its segment, which
/// holds the stored values, is out of reach of outsiders, and the store works on.
#[tokio::test]
async fn a_storage_nodes_transfer_port_refuses_outsiders() {
    let master = kvmaster::MasterServer::start(
        kvmaster::MasterConfig::default(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let node = kvclient::StoreClient::start(kvclient::ClientConfig::local(&master.url(), 16 << 20))
        .await
        .unwrap();
    let value = vec![0x6du8; 100_000];
    node.put("k", &value).await.unwrap();
    refuses_outsiders(node.engine()).await;
    let reader = kvclient::StoreClient::start(kvclient::ClientConfig::local(&master.url(), 0))
        .await
        .unwrap();
    assert_eq!(
        reader.get("k").await.unwrap(),
        value,
        "members still read the value"
    );
}

/// A simulated prefill worker's KV transfer engine.
#[tokio::test]
async fn a_sim_prefills_transfer_port_refuses_outsiders() {
    use sim::{self, SimConfig, SimMode};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let prefill = sim::spawn(
        SimConfig {
            mode: SimMode::Prefill,
            host: "127.0.0.1".into(),
            bootstrap_port: 0,
            ..SimConfig::default()
        },
        listener,
    )
    .await
    .unwrap();
    let kv = prefill.pd().unwrap().engine().clone();
    refuses_outsiders(&kv).await;
    // A member still opens its segment (what a decode does before registering pages).
    let member = engine(false).await;
    member.open_segment(kv.segment_name()).await.unwrap();
    prefill.shutdown().await;
}
