//! A hostile host against a transfer port: raw frames sent with no handshake, a blind
//! handshake (any proof one can make without the secret), and what the node answered.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use transfer::SegmentDescriptor;
use transfer::tcp::frame::{Opcode, RequestHeader};

/// Every request kind a peer may send, aimed at the first region of `desc` with its real
/// token (the attacker knows it, say, from a leaked descriptor): descriptor, read, write,
/// notify, RDMA connect.
pub fn frames(desc: &SegmentDescriptor) -> Vec<(&'static str, Vec<u8>)> {
    let (addr, token) = desc
        .regions
        .first()
        .map(|r| (r.addr, r.token))
        .unwrap_or((0x1000, 1));
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
    let mut write = h(Opcode::Write, addr, 16, token);
    write.extend_from_slice(&[0u8; 16]);
    let mut notify = h(Opcode::Notify, 0, 9, 0);
    notify.extend_from_slice(b"from evil");
    let mut rdma = h(Opcode::RdmaConnect, 0, 2, 0);
    rdma.extend_from_slice(b"{}");
    vec![
        ("descriptor", h(Opcode::Descriptor, 0, 0, 0)),
        ("read", h(Opcode::Read, addr, 4096, token)),
        ("write", write),
        ("notify", notify),
        ("rdma connect", rdma),
    ]
}

/// Everything the peer sends until it closes (at most 1 MiB, at most 10 s).
pub async fn read_all(s: &mut TcpStream) -> Vec<u8> {
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

/// Sends each of [`frames`] on a fresh connection with no handshake; panics if the node at
/// `addr` answers any of them with a single byte.
pub async fn unauthenticated_frames_get_nothing(
    addr: std::net::SocketAddr,
    desc: &SegmentDescriptor,
) {
    for (what, bytes) in frames(desc) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        let got = read_all(&mut s).await;
        assert!(
            got.is_empty(),
            "{what}: the node answered {} bytes",
            got.len()
        );
    }
}

/// Sends a hello, reads the challenge, answers it with a made-up proof: what an attacker
/// without the secret can do at best.
pub async fn blind_proof(s: &mut TcpStream) {
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
