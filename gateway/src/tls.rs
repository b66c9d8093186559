//! TLS on the listeners of `moongate serve` and `moongate master` (`--tls-cert-file`,
//! `--tls-key-file`, both or neither): rustls with the aws-lc-rs provider, TLS 1.2 and 1.3,
//! the certificate chain and private key read from PEM files at start. ALPN offers `h2` then
//! `http/1.1`, and the connection is served as whichever the client picked (hyper's
//! automatic HTTP/1.1 / HTTP/2 server reads the preface). A client gets
//! [`HANDSHAKE_TIMEOUT`] to finish its handshake; one that stalls is dropped, so an open TCP
//! connection that never speaks TLS holds nothing for long.
//!
//! The server configuration itself (and the client side: trust roots, `https://` URLs)
//! lives in [`trust::tls`].

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a client may take to complete its TLS handshake after connecting.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The acceptor the settings ask for: `None` without TLS, an error when only one of the two
/// files is given or they do not load ([`trust::tls::server_files`]).
pub fn acceptor(cert: Option<&Path>, key: Option<&Path>) -> Result<Option<TlsAcceptor>, String> {
    Ok(trust::tls::server_files(cert, key)?.map(|cfg| TlsAcceptor::from(Arc::new(cfg))))
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
