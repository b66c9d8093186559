//! A TLS front for test backends: terminates TLS with the committed test certificate
//! (`tests/fixtures/tls`: `server.pem` for `127.0.0.1` and `localhost`, issued by the test CA
//! `ca.pem`) and relays the plain bytes to a backend, so any HTTP backend becomes an
//! `https://` worker.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_util::sync::CancellationToken;

/// A file of the test TLS fixtures (`ca.pem`, `server.pem`, `server.key`).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/tls")).join(name)
}

/// A TLS listener relaying every connection to a plain backend.
pub struct TlsFront {
    /// Where it listens (TLS).
    pub addr: SocketAddr,
    stop: CancellationToken,
}

impl TlsFront {
    /// Starts a TLS front on `127.0.0.1:0` for the plain backend at `backend`.
    pub async fn start(backend: SocketAddr) -> Self {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(fixture("server.pem"))
                .expect("server.pem")
                .collect::<Result<_, _>>()
                .expect("server.pem parses");
        let key = PrivateKeyDer::from_pem_file(fixture("server.key")).expect("server.key");
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("default protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("the test certificate and key match");
        let acceptor = TlsAcceptor::from(Arc::new(cfg));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind tls");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    _ = s.cancelled() => return,
                    r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that refuses our certificate ends its handshake here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut plain) = TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Self { addr, stop }
    }

    /// `https://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
