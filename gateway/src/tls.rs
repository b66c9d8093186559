//! TLS on the listeners of `moongate serve` and `moongate master` (`--tls-cert-file`,
//! `--tls-key-file`, both or neither): rustls with the aws-lc-rs provider, TLS 1.2 and 1.3,
//! the certificate chain and private key read from PEM files at start. ALPN offers `h2` then
//! `http/1.1`, and the connection is served as whichever the client picked (hyper's
//! automatic HTTP/1.1 / HTTP/2 server reads the preface). A client gets
//! [`HANDSHAKE_TIMEOUT`] to finish its handshake; one that stalls is dropped, so an open TCP
//! connection that never speaks TLS holds nothing for long.
//!
//! The client side (trust roots, `https://` URLs) lives in [`trust::tls`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a client may take to complete its TLS handshake after connecting.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The application protocols offered in ALPN, preferred first.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A server configuration from the PEM files `cert` (the certificate chain, leaf first) and
/// `key` (its private key: PKCS#8, PKCS#1 or SEC1). Errors name the file and the reason,
/// including a key that does not belong to the certificate.
pub fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("tls_cert_file {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "tls_cert_file {}: no PEM certificate in it",
            cert.display()
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("tls_key_file {}: {e}", key.display()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("aws-lc-rs supports the default protocol versions")
    .with_no_client_auth()
    .with_single_cert(chain, private)
    .map_err(|e| {
        format!(
            "tls_cert_file {} with tls_key_file {}: {e}",
            cert.display(),
            key.display()
        )
    })?;
    cfg.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(cfg)
}

/// The acceptor the settings ask for: `None` without TLS, an error when only one of the two
/// files is given or they do not load.
pub fn acceptor(cert: Option<&Path>, key: Option<&Path>) -> Result<Option<TlsAcceptor>, String> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => {
            let cfg = server_config(cert, key)?;
            Ok(Some(TlsAcceptor::from(Arc::new(cfg))))
        }
        (Some(_), None) => Err("tls_cert_file needs tls_key_file too".into()),
        (None, Some(_)) => Err("tls_key_file needs tls_cert_file too".into()),
    }
}

/// What is wrong with the TLS settings, if anything (for `validate`).
pub fn problem(cert: &Option<PathBuf>, key: &Option<PathBuf>) -> Option<String> {
    acceptor(cert.as_deref(), key.as_deref()).err()
}

/// `https` with TLS, else `http`: the scheme of the URL clients use.
pub fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// Completes the server side of a TLS handshake on `tcp` within [`HANDSHAKE_TIMEOUT`];
/// `None` (logged at debug) when the client fails it, leaves or stalls.
pub(crate) async fn handshake(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
) -> Option<TlsStream<TcpStream>> {
    let peer = tcp.peer_addr().ok();
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::debug!(?peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(?peer, "TLS handshake timed out");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tls"
        ))
        .join(name)
    }

    #[test]
    fn both_files_or_neither_and_a_matching_pair() {
        let (cert, key) = (fixture("server.pem"), fixture("server.key"));
        assert!(problem(&None, &None).is_none());
        assert!(problem(&Some(cert.clone()), &Some(key.clone())).is_none());
        let alpn = server_config(&cert, &key).unwrap().alpn_protocols;
        assert_eq!(alpn, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        let e = problem(&Some(cert.clone()), &None).unwrap();
        assert!(e.contains("needs tls_key_file"), "{e}");
        let e = problem(&None, &Some(key.clone())).unwrap();
        assert!(e.contains("needs tls_cert_file"), "{e}");
        let e = problem(&Some("/nonexistent/c.pem".into()), &Some(key.clone())).unwrap();
        assert!(e.contains("/nonexistent/c.pem"), "{e}");
        // The CA's certificate with the server's key: not a pair.
        let e = problem(&Some(fixture("ca.pem")), &Some(key)).unwrap();
        assert!(e.contains("ca.pem"), "{e}");
        // A key file without a key.
        let e = problem(&Some(cert.clone()), &Some(cert)).unwrap();
        assert!(e.contains("tls_key_file"), "{e}");
    }
}
