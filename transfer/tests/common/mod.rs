//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use rand::{RngCore, SeedableRng};

use transfer::{
    EngineConfig, Metadata, RegisteredBuffer, Segment, TransferEngine, TransferRequest,
};

/// A loopback engine; `shm` turns the shared-memory transport on or off.
pub async fn engine(shm: bool) -> TransferEngine {
    TransferEngine::new(config(shm))
        .await
        .expect("engine starts")
}

pub fn config(shm: bool) -> EngineConfig {
    EngineConfig {
        shm,
        ..EngineConfig::listening_on("127.0.0.1:0".parse().unwrap())
    }
}

/// A loopback engine using `metadata`.
pub async fn engine_with(metadata: Arc<dyn Metadata>, cfg: EngineConfig) -> TransferEngine {
    TransferEngine::builder()
        .config(cfg)
        .metadata(metadata)
        .build()
        .await
        .expect("engine starts")
}

/// A raw TCP connection to `addr` that has completed the handshake with the secret the
/// test engines use (the per-user default), so a test can speak frames by hand.
pub async fn authenticated(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let secret = transfer::ClusterSecret::resolve(None).unwrap();
    transfer::auth::handshake::initiate(&mut s, &secret, "raw-test", Duration::from_secs(5))
        .await
        .expect("handshake with the test engine");
    s
}

/// A listener on loopback published in `meta` as segment `name` (a peer on another host
/// with one 1 MiB region at 1 MiB, token 7): for fake peers that speak the wire by hand.
pub async fn fake_listener(
    meta: &transfer::InMemoryMetadata,
    name: &str,
) -> tokio::net::TcpListener {
    use transfer::Metadata;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let desc = transfer::SegmentDescriptor::from_json(
        format!(
            r#"{{"version":1,"name":"{name}","host_id":"elsewhere","engine_id":5,"generation":1,
                "endpoints":{{"tcp":"{addr}"}},
                "regions":[{{"id":1,"addr":1048576,"len":1048576,"token":7}}]}}"#
        )
        .as_bytes(),
    )
    .unwrap();
    meta.publish(&desc).await.unwrap();
    listener
}

/// Accepts on `listener` like a transfer target would, up to the end of the handshake, and
/// hands each authenticated connection to `then`.
pub fn authenticating_listener<F, Fut>(listener: tokio::net::TcpListener, then: F)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let secret = transfer::ClusterSecret::resolve(None).unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let secret = secret.clone();
            let fut = async move {
                transfer::auth::handshake::accept(
                    &mut s,
                    &secret,
                    "fake-peer",
                    Duration::from_secs(5),
                )
                .await
                .map(|_| s)
            };
            match fut.await {
                Ok(s) => {
                    tokio::spawn(then(s));
                }
                Err(_) => continue,
            }
        }
    });
}

/// Deterministic pseudo-random bytes.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Fills a whole registered buffer with pseudo-random bytes (xorshift words: cheap even in
/// debug builds).
pub fn fill(buf: &RegisteredBuffer, seed: u64) {
    const WORDS: usize = 1 << 17;
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut chunk = vec![0u64; WORDS];
    let mut off = 0;
    while off < buf.len() {
        for w in chunk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *w = x;
        }
        // SAFETY: reinterpreting initialised u64s as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(chunk.as_ptr().cast::<u8>(), WORDS * 8) };
        let n = bytes.len().min(buf.len() - off);
        buf.write_at(off, &bytes[..n]).unwrap();
        off += n;
    }
}

/// Whether `a[ao..ao+len] == b[bo..bo+len]`.
pub fn same_bytes(
    a: &RegisteredBuffer,
    ao: usize,
    b: &RegisteredBuffer,
    bo: usize,
    len: usize,
) -> bool {
    // SAFETY: called only when no transfer is in flight on either buffer.
    let x = unsafe { a.region().as_slice() };
    // SAFETY: as above.
    let y = unsafe { b.region().as_slice() };
    x[ao..ao + len] == y[bo..bo + len]
}

/// Writes `len` bytes from `local[lo..]` into `remote[ro..]` (a buffer of the peer `seg`
/// names) through `initiator`, and checks they landed.
pub async fn write_checked(
    initiator: &TransferEngine,
    local: &RegisteredBuffer,
    lo: usize,
    seg: &Segment,
    remote: &RegisteredBuffer,
    ro: usize,
    len: usize,
) {
    let req = TransferRequest::write(local, lo, seg, remote.addr() + ro as u64, len);
    initiator.transfer(req).await.unwrap();
    assert!(
        same_bytes(local, lo, remote, ro, len),
        "{len} bytes at offset {ro} landed wrong"
    );
}

pub const SHORT: Duration = Duration::from_millis(300);
