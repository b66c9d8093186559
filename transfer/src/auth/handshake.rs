//! The mutual handshake that opens every transfer connection: a pure codec for its three
//! messages and the two sides' exchanges over any byte stream (a TCP socket, or an
//! in-memory pipe in tests).
//!
//! ```text
//! hello     (40 + n): magic "MGTA" u32 | version u8 | kind 1 u8 | n u16 | client nonce [32] | client name [n]
//! challenge (72 + n): magic | version | kind 2 | n | server nonce [32] | server tag [32] | server name [n]
//! proof     (40):     magic | version | kind 3 | 0 | client tag [32]
//! ```
//!
//! `tag(role) = HMAC-SHA256(secret, "moongate transfer v2 " role 0x00 | len cn | cn | len sn
//! | sn | client nonce | server nonce)`, role `server` or `client`. A refusal is a response
//! header (`tcp::frame`) with status `Unauthenticated` or `Unsupported` and a message, after
//! which the server closes. A version 1 peer (whose first bytes are a v1 request header)
//! gets a v1 response header it can decode, saying this node needs protocol 2.

use std::fmt;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::ClusterSecret;
use crate::wire::{
    MAX_CONTROL_LEN, REQUEST_HEADER_LEN, REQUEST_MAGIC, RESPONSE_HEADER_LEN, RESPONSE_MAGIC,
    ResponseHeader, Status, VERSION,
};
use trust::secret::random_bytes;

/// Handshake message magic, "MGTA".
pub const HANDSHAKE_MAGIC: u32 = u32::from_le_bytes(*b"MGTA");
/// Nonce length (bytes, from the OS RNG, one per side per connection).
pub const NONCE_LEN: usize = 32;
/// Tag length (HMAC-SHA256).
pub const TAG_LEN: usize = 32;
/// Longest name a side may declare.
pub const MAX_NAME_LEN: usize = 255;
const PREFIX_LEN: usize = 8;
const HELLO_LEN: usize = PREFIX_LEN + NONCE_LEN;
const CHALLENGE_LEN: usize = PREFIX_LEN + NONCE_LEN + TAG_LEN;
const PROOF_LEN: usize = PREFIX_LEN + TAG_LEN;
/// Status byte of "unsupported" in protocol version 1 (what a v1 peer can decode).
const V1_UNSUPPORTED: u8 = 6;

const KIND_HELLO: u8 = 1;
const KIND_CHALLENGE: u8 = 2;
const KIND_PROOF: u8 = 3;

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The peer speaks protocol version 1 (no authentication).
    #[error(
        "the peer speaks transfer protocol v1, which has no authentication; upgrade it to v{VERSION}"
    )]
    V1Peer,
    /// The peer's first bytes are not this protocol.
    #[error("not a Moongate transfer handshake (magic {0:#010x})")]
    BadMagic(u32),
    /// A handshake version this build does not speak.
    #[error("handshake version {0} is not supported (this build speaks {VERSION})")]
    UnsupportedVersion(u8),
    /// A message arrived out of order, or a reserved field is set.
    #[error("malformed handshake: {0}")]
    Malformed(&'static str),
    /// The other side did not prove it holds the cluster secret.
    #[error(
        "the peer did not prove it holds this cluster's transfer secret (wrong or missing secret file)"
    )]
    BadTag,
    /// The other side refused us, with its message.
    #[error("refused by the peer: {0}")]
    Refused(String),
    /// The handshake did not finish in time.
    #[error("the handshake did not finish within {0:?}")]
    TimedOut(Duration),
    /// The connection failed.
    #[error("{0}")]
    Io(String),
}

fn io_err(e: std::io::Error) -> HandshakeError {
    HandshakeError::Io(e.to_string())
}

fn prefix(kind: u8, n: usize) -> [u8; PREFIX_LEN] {
    let mut b = [0u8; PREFIX_LEN];
    b[0..4].copy_from_slice(&HANDSHAKE_MAGIC.to_le_bytes());
    b[4] = VERSION;
    b[5] = kind;
    b[6..8].copy_from_slice(&(n as u16).to_le_bytes());
    b
}

/// Checks a message prefix: magic, version, kind; returns the announced name length.
fn check_prefix(b: &[u8], kind: u8) -> Result<usize, HandshakeError> {
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    if magic != HANDSHAKE_MAGIC {
        return Err(HandshakeError::BadMagic(magic));
    }
    if b[4] != VERSION {
        return Err(HandshakeError::UnsupportedVersion(b[4]));
    }
    if b[5] != kind {
        return Err(HandshakeError::Malformed("unexpected message kind"));
    }
    let n = u16::from_le_bytes([b[6], b[7]]) as usize;
    if n > MAX_NAME_LEN {
        return Err(HandshakeError::Malformed("name longer than 255 bytes"));
    }
    Ok(n)
}

fn name_of(b: &[u8]) -> Result<String, HandshakeError> {
    String::from_utf8(b.to_vec()).map_err(|_| HandshakeError::Malformed("name is not UTF-8"))
}

fn clip(name: &str) -> &[u8] {
    let b = name.as_bytes();
    let mut n = b.len().min(MAX_NAME_LEN);
    while !name.is_char_boundary(n) {
        n -= 1;
    }
    &b[..n]
}

/// The tag `role` computes over the transcript.
fn tag(
    secret: &ClusterSecret,
    role: &[u8],
    client: &[u8],
    server: &[u8],
    cn: &[u8; NONCE_LEN],
    sn: &[u8; NONCE_LEN],
) -> hmac::Hmac<sha2::Sha256> {
    use hmac::Mac;
    let mut m = secret.hmac();
    m.update(b"moongate transfer v2 ");
    m.update(role);
    m.update(&[0]);
    m.update(&[client.len() as u8]);
    m.update(client);
    m.update(&[server.len() as u8]);
    m.update(server);
    m.update(cn);
    m.update(sn);
    m
}

fn tag_bytes(m: hmac::Hmac<sha2::Sha256>) -> [u8; TAG_LEN] {
    use hmac::Mac;
    m.finalize().into_bytes().into()
}

fn verify(m: hmac::Hmac<sha2::Sha256>, given: &[u8]) -> Result<(), HandshakeError> {
    use hmac::Mac;
    m.verify_slice(given).map_err(|_| HandshakeError::BadTag)
}

/// What the accepting side learned: the peer's declared name, proven with the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The name the peer declared (its segment name), bound to its proof.
    pub name: String,
}

impl fmt::Debug for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerIdentity({:?})", self.name)
    }
}

/// A refusal frame: a response header of `version` with `status` and `message`.
fn refusal(version: u8, status: u8, request_id: u64, message: &str) -> Vec<u8> {
    let msg = &message.as_bytes()[..message.len().min(MAX_CONTROL_LEN as usize)];
    let mut h = ResponseHeader {
        status: Status::Unsupported,
        request_id,
        len: msg.len() as u64,
    }
    .encode();
    h[4] = version;
    h[5] = status;
    let mut v = h.to_vec();
    v.extend_from_slice(msg);
    v
}

/// Accepting side: reads the hello, answers the challenge, checks the proof. On failure a
/// refusal the peer can decode is sent where one helps, and the caller closes.
pub async fn accept<S>(
    io: &mut S,
    secret: &ClusterSecret,
    my_name: &str,
    limit: Duration,
) -> Result<PeerIdentity, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(limit, accept_inner(io, secret, my_name)).await {
        Ok(r) => r,
        Err(_) => Err(HandshakeError::TimedOut(limit)),
    }
}

async fn accept_inner<S>(
    io: &mut S,
    secret: &ClusterSecret,
    my_name: &str,
) -> Result<PeerIdentity, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut p = [0u8; HELLO_LEN];
    io.read_exact(&mut p[..PREFIX_LEN]).await.map_err(io_err)?;
    let magic = u32::from_le_bytes(p[0..4].try_into().expect("4 bytes"));
    if magic == REQUEST_MAGIC && p[4] == 1 {
        // A v1 initiator sent its first request header: answer in v1 so it can say why.
        let mut h = [0u8; REQUEST_HEADER_LEN];
        h[..PREFIX_LEN].copy_from_slice(&p[..PREFIX_LEN]);
        io.read_exact(&mut h[PREFIX_LEN..]).await.map_err(io_err)?;
        let id = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
        let msg = format!(
            "this node speaks transfer protocol v{VERSION} (authenticated with the cluster \
             secret); upgrade this peer"
        );
        let _ = io.write_all(&refusal(1, V1_UNSUPPORTED, id, &msg)).await;
        return Err(HandshakeError::V1Peer);
    }
    if magic == HANDSHAKE_MAGIC && p[4] != VERSION {
        let err = HandshakeError::UnsupportedVersion(p[4]);
        let _ = io
            .write_all(&refusal(
                VERSION,
                Status::Unsupported as u8,
                0,
                &err.to_string(),
            ))
            .await;
        return Err(err);
    }
    let n = check_prefix(&p[..PREFIX_LEN], KIND_HELLO)?;
    io.read_exact(&mut p[PREFIX_LEN..]).await.map_err(io_err)?;
    let mut name = [0u8; MAX_NAME_LEN];
    io.read_exact(&mut name[..n]).await.map_err(io_err)?;
    let client = &name[..n];
    let cn: [u8; NONCE_LEN] = p[PREFIX_LEN..].try_into().expect("nonce");
    let sn: [u8; NONCE_LEN] = random_bytes().map_err(|e| HandshakeError::Io(e.to_string()))?;
    let server = clip(my_name);
    let mut msg = Vec::with_capacity(CHALLENGE_LEN + server.len());
    msg.extend_from_slice(&prefix(KIND_CHALLENGE, server.len()));
    msg.extend_from_slice(&sn);
    msg.extend_from_slice(&tag_bytes(tag(secret, b"server", client, server, &cn, &sn)));
    msg.extend_from_slice(server);
    io.write_all(&msg).await.map_err(io_err)?;
    let mut proof = [0u8; PROOF_LEN];
    io.read_exact(&mut proof).await.map_err(io_err)?;
    if check_prefix(&proof[..PREFIX_LEN], KIND_PROOF)? != 0 {
        return Err(HandshakeError::Malformed("proof carries a name"));
    }
    if let Err(e) = verify(
        tag(secret, b"client", client, server, &cn, &sn),
        &proof[PREFIX_LEN..],
    ) {
        let _ = io
            .write_all(&refusal(
                VERSION,
                Status::Unauthenticated as u8,
                0,
                "authentication failed: this peer does not hold the node's transfer secret",
            ))
            .await;
        return Err(e);
    }
    Ok(PeerIdentity {
        name: name_of(client)?,
    })
}

/// Initiating side: sends the hello, checks the server's tag, sends the proof. Returns the
/// server's declared name. Requests may follow the proof at once.
pub async fn initiate<S>(
    io: &mut S,
    secret: &ClusterSecret,
    my_name: &str,
    limit: Duration,
) -> Result<String, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(limit, initiate_inner(io, secret, my_name)).await {
        Ok(r) => r,
        Err(_) => Err(HandshakeError::TimedOut(limit)),
    }
}

async fn initiate_inner<S>(
    io: &mut S,
    secret: &ClusterSecret,
    my_name: &str,
) -> Result<String, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let client = clip(my_name);
    let cn: [u8; NONCE_LEN] = random_bytes().map_err(|e| HandshakeError::Io(e.to_string()))?;
    let mut hello = Vec::with_capacity(HELLO_LEN + client.len());
    hello.extend_from_slice(&prefix(KIND_HELLO, client.len()));
    hello.extend_from_slice(&cn);
    hello.extend_from_slice(client);
    io.write_all(&hello).await.map_err(io_err)?;
    let mut c = [0u8; CHALLENGE_LEN];
    io.read_exact(&mut c[..PREFIX_LEN]).await.map_err(io_err)?;
    let magic = u32::from_le_bytes(c[0..4].try_into().expect("4 bytes"));
    if magic == RESPONSE_MAGIC {
        return Err(read_refusal(io, &c[..PREFIX_LEN]).await);
    }
    let n = check_prefix(&c[..PREFIX_LEN], KIND_CHALLENGE)?;
    io.read_exact(&mut c[PREFIX_LEN..]).await.map_err(io_err)?;
    let mut name = [0u8; MAX_NAME_LEN];
    io.read_exact(&mut name[..n]).await.map_err(io_err)?;
    let server = &name[..n];
    let sn: [u8; NONCE_LEN] = c[PREFIX_LEN..PREFIX_LEN + NONCE_LEN]
        .try_into()
        .expect("nonce");
    verify(
        tag(secret, b"server", client, server, &cn, &sn),
        &c[PREFIX_LEN + NONCE_LEN..],
    )?;
    let mut proof = Vec::with_capacity(PROOF_LEN);
    proof.extend_from_slice(&prefix(KIND_PROOF, 0));
    proof.extend_from_slice(&tag_bytes(tag(secret, b"client", client, server, &cn, &sn)));
    io.write_all(&proof).await.map_err(io_err)?;
    name_of(server)
}

/// Reads the rest of a refusal (a response header, any version) and its message.
async fn read_refusal<S>(io: &mut S, first: &[u8]) -> HandshakeError
where
    S: AsyncRead + Unpin,
{
    let version = first[4];
    let mut h = [0u8; RESPONSE_HEADER_LEN];
    h[..PREFIX_LEN].copy_from_slice(first);
    if let Err(e) = io.read_exact(&mut h[PREFIX_LEN..]).await {
        return io_err(e);
    }
    let len = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")).min(MAX_CONTROL_LEN);
    let mut msg = vec![0u8; len as usize];
    let text = match io.read_exact(&mut msg).await {
        Ok(_) => String::from_utf8_lossy(&msg).into_owned(),
        Err(_) => String::new(),
    };
    if version == 1 {
        return HandshakeError::Refused(format!(
            "the peer speaks transfer protocol v1, which has no authentication; upgrade it \
             to v{VERSION} ({text})"
        ));
    }
    HandshakeError::Refused(text)
}

#[cfg(test)]
mod tests;
