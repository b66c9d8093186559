use super::*;
use proptest::prelude::*;
use tokio::io::{DuplexStream, duplex};

fn secret(s: &str) -> ClusterSecret {
    ClusterSecret::from_bytes(s.as_bytes()).unwrap()
}

const LIMIT: Duration = Duration::from_secs(5);

async fn pair(
    a: &ClusterSecret,
    b: &ClusterSecret,
) -> (
    Result<String, HandshakeError>,
    Result<PeerIdentity, HandshakeError>,
) {
    let (mut c, mut s) = duplex(4096);
    let (a, b) = (a.clone(), b.clone());
    let server = tokio::spawn(async move {
        let r = accept(&mut s, &b, "10.0.0.2:7000", LIMIT).await;
        drop(s);
        r
    });
    let client = initiate(&mut c, &a, "10.0.0.1:7000", LIMIT).await;
    drop(c);
    (client, server.await.unwrap())
}

#[tokio::test]
async fn same_secret_authenticates_both_sides_and_names() {
    let k = secret("cluster-secret-0123456789");
    let (c, s) = pair(&k, &k).await;
    assert_eq!(c.unwrap(), "10.0.0.2:7000");
    assert_eq!(s.unwrap().name, "10.0.0.1:7000");
}

#[tokio::test]
async fn wrong_secret_fails_on_both_sides() {
    let (c, s) = pair(
        &secret("cluster-secret-0123456789"),
        &secret("another-secret-0123456789"),
    )
    .await;
    assert_eq!(c.unwrap_err(), HandshakeError::BadTag);
    assert!(s.is_err(), "the server must not accept a peer that left");
}

/// An attacker without the secret answers the challenge with whatever it can: its own
/// guess, the server's tag reflected back, or a proof recorded from an earlier session.
#[tokio::test]
async fn forged_reflected_and_replayed_proofs_are_refused() {
    let k = secret("cluster-secret-0123456789");
    // A legitimate session, recorded.
    let (mut c, mut s) = duplex(4096);
    let kk = k.clone();
    let server = tokio::spawn(async move {
        let mut rec = Vec::new();
        let r = accept(&mut Recorder(&mut s, &mut rec), &kk, "srv", LIMIT).await;
        (r, rec)
    });
    initiate(&mut c, &k, "cli", LIMIT).await.unwrap();
    let (r, recorded) = server.await.unwrap();
    r.unwrap();
    let hello = &recorded[..HELLO_LEN + 3];
    let proof = &recorded[HELLO_LEN + 3..];
    assert_eq!(proof.len(), PROOF_LEN);

    for attack in ["replay", "reflect", "guess"] {
        let (mut c, mut s) = duplex(4096);
        let kk = k.clone();
        let server = tokio::spawn(async move { accept(&mut s, &kk, "srv", LIMIT).await });
        c.write_all(hello).await.unwrap();
        let mut ch = vec![0u8; CHALLENGE_LEN + 3];
        c.read_exact(&mut ch).await.unwrap();
        let mut forged = proof.to_vec();
        match attack {
            "replay" => {}
            "reflect" => {
                forged[PREFIX_LEN..].copy_from_slice(&ch[PREFIX_LEN + NONCE_LEN..CHALLENGE_LEN])
            }
            _ => forged[PREFIX_LEN..].fill(0x5a),
        }
        c.write_all(&forged).await.unwrap();
        assert_eq!(
            server.await.unwrap().unwrap_err(),
            HandshakeError::BadTag,
            "{attack}"
        );
        // The refusal says why, in a response header the peer can decode.
        let mut h = [0u8; RESPONSE_HEADER_LEN];
        c.read_exact(&mut h).await.unwrap();
        let h = ResponseHeader::decode(&h).unwrap();
        assert_eq!(h.status, Status::Unauthenticated);
        let mut msg = vec![0u8; h.len as usize];
        c.read_exact(&mut msg).await.unwrap();
        assert!(String::from_utf8_lossy(&msg).contains("transfer secret"));
    }
}

/// Records what the accepting side reads.
struct Recorder<'a>(&'a mut DuplexStream, &'a mut Vec<u8>);

impl AsyncRead for Recorder<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let r = std::pin::Pin::new(&mut *this.0).poll_read(cx, buf);
        this.1.extend_from_slice(&buf.filled()[before..]);
        r
    }
}

impl AsyncWrite for Recorder<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *self.0).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn a_v1_initiator_gets_a_v1_answer_saying_why() {
    let k = secret("cluster-secret-0123456789");
    let (mut c, mut s) = duplex(4096);
    let server = tokio::spawn(async move { accept(&mut s, &k, "srv", LIMIT).await });
    // A v1 Descriptor request, as a v1 build sends it first.
    let mut v1 = [0u8; REQUEST_HEADER_LEN];
    v1[0..4].copy_from_slice(b"MGTQ");
    v1[4] = 1;
    v1[5] = 3;
    v1[8..16].copy_from_slice(&77u64.to_le_bytes());
    c.write_all(&v1).await.unwrap();
    assert_eq!(server.await.unwrap().unwrap_err(), HandshakeError::V1Peer);
    let mut h = [0u8; RESPONSE_HEADER_LEN];
    c.read_exact(&mut h).await.unwrap();
    assert_eq!(&h[0..4], b"MGTR");
    assert_eq!(h[4], 1, "answered in the peer's version");
    assert_eq!(h[5], V1_UNSUPPORTED);
    assert_eq!(u64::from_le_bytes(h[8..16].try_into().unwrap()), 77);
    let len = u64::from_le_bytes(h[16..24].try_into().unwrap()) as usize;
    let mut msg = vec![0u8; len];
    c.read_exact(&mut msg).await.unwrap();
    assert!(String::from_utf8_lossy(&msg).contains("protocol v2"));
}

#[tokio::test]
async fn a_v1_target_is_named_as_such() {
    let k = secret("cluster-secret-0123456789");
    let (mut c, mut s) = duplex(4096);
    // What a v1 target answers a header it cannot decode.
    let v1_target = tokio::spawn(async move {
        let mut h = [0u8; REQUEST_HEADER_LEN];
        s.read_exact(&mut h).await.unwrap();
        let msg = b"bad magic 0x4154474d";
        let mut r = ResponseHeader {
            status: Status::BadRequest,
            request_id: 0,
            len: msg.len() as u64,
        }
        .encode();
        r[4] = 1;
        s.write_all(&r).await.unwrap();
        s.write_all(msg).await.unwrap();
    });
    let e = initiate(&mut c, &k, "cli", LIMIT).await.unwrap_err();
    v1_target.await.unwrap();
    assert!(e.to_string().contains("protocol v1"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_trickling_peer_is_cut_at_the_limit() {
    let k = secret("cluster-secret-0123456789");
    let (mut c, mut s) = duplex(4096);
    let server = tokio::spawn(async move { accept(&mut s, &k, "srv", LIMIT).await });
    c.write_all(&prefix(KIND_HELLO, 0)[..5]).await.unwrap();
    assert_eq!(
        server.await.unwrap().unwrap_err(),
        HandshakeError::TimedOut(LIMIT)
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever follows a valid magic and version, the accepting side ends with an error
    /// (nobody can prove the secret by chance), reads at most a bounded amount, and never
    /// panics.
    #[test]
    fn arbitrary_bytes_after_a_valid_prefix_are_refused(
        kind in prop_oneof![Just(KIND_HELLO), any::<u8>()],
        name_len in prop_oneof![0u16..=255, any::<u16>()],
        rest in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        rt.block_on(async {
            let k = secret("cluster-secret-0123456789");
            let (mut c, mut s) = duplex(1 << 16);
            let mut bytes = prefix(kind, 0).to_vec();
            bytes[6..8].copy_from_slice(&name_len.to_le_bytes());
            bytes.extend_from_slice(&rest);
            c.write_all(&bytes).await.unwrap();
            drop(c.shutdown().await);
            let r = accept(&mut s, &k, "srv", LIMIT).await;
            prop_assert!(r.is_err());
            Ok(())
        })?;
    }

    /// The initiating side, answered with arbitrary bytes, fails cleanly.
    #[test]
    fn arbitrary_answers_fail_the_initiator(
        rest in proptest::collection::vec(any::<u8>(), 0..400),
        valid_prefix in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        rt.block_on(async {
            let k = secret("cluster-secret-0123456789");
            let (mut c, mut s) = duplex(1 << 16);
            let mut bytes = if valid_prefix { prefix(KIND_CHALLENGE, 0).to_vec() } else { Vec::new() };
            bytes.extend_from_slice(&rest);
            s.write_all(&bytes).await.unwrap();
            drop(s.shutdown().await);
            let r = initiate(&mut c, &k, "cli", LIMIT).await;
            prop_assert!(r.is_err());
            Ok(())
        })?;
    }
}
