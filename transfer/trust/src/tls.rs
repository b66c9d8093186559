//! TLS for the workspace's HTTP clients: the transfer HTTP metadata client, the store
//! client's calls to its master and the gateway's calls to `https://` workers all trust the
//! same roots, built here once: the system's trust store plus the certificates of a PEM file
//! the operator names (a private CA: `--master-ca-cert`, `--worker-ca-cert`).
//!
//! rustls with the aws-lc-rs provider (the one reqwest builds too; never `ring` beside it),
//! TLS 1.2 and 1.3, server certificates verified against those roots and the URL's host. No
//! client certificates. The connectors speak plain HTTP to `http://` URLs and TLS to
//! `https://` ones, HTTP/1.1 only, and never follow redirects (hyper's client does not), so
//! a bearer key given for one URL is never sent to another.
//!
//! The server side of `moongate serve` and `moongate master` (`--tls-cert-file`,
//! `--tls-key-file`) is built here too ([`server_config`]), so the settings can check the
//! files before anything starts ([`server_files`]).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The certificates of the PEM file `path`: at least one, or an error naming the file.
pub fn ca_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// The system's trust roots, read once per process (reading and parsing the store costs
/// milliseconds; every client built afterwards shares the result).
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| rustls_native_certs::load_native_certs().certs)
}

/// The system's trust roots plus every certificate of the PEM file `extra`. An unreadable
/// `extra`, or one without a certificate, is an error naming it; system roots that do not
/// parse are skipped (a host without any can still trust `extra`).
pub fn trust_roots(extra: Option<&Path>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(system_roots().iter().cloned());
    if let Some(path) = extra {
        for c in ca_certificates(path)? {
            roots
                .add(c)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(roots)
}

/// A client configuration trusting `roots`: aws-lc-rs, the safe default protocol versions,
/// no client certificate.
pub fn client_config(roots: RootCertStore) -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("aws-lc-rs supports the default protocol versions")
    .with_root_certificates(roots)
    .with_no_client_auth()
}

/// `conn` wrapped to speak TLS (`tls`) to `https://` URLs and plain HTTP to `http://` ones,
/// HTTP/1.1. `conn` must not enforce the `http` scheme
/// (`HttpConnector::enforce_http(false)`); this sets it.
pub fn https_or_http(
    mut conn: HttpConnector,
    tls: rustls::ClientConfig,
) -> HttpsConnector<HttpConnector> {
    conn.enforce_http(false);
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(conn)
}

/// A one-line description of an error with its cause chain (`client error (Connect): invalid
/// peer certificate: UnknownIssuer`): the top-level message of a connection failure rarely
/// says why.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

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

/// The server configuration the settings ask for: `None` without TLS, an error when only
/// one of the two files is given or they do not load as a certificate chain and its key.
pub fn server_files(
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<rustls::ServerConfig>, String> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => server_config(cert, key).map(Some),
        (Some(_), None) => Err("tls_cert_file needs tls_key_file too".into()),
        (None, Some(_)) => Err("tls_key_file needs tls_cert_file too".into()),
    }
}

/// Whether `url` is plain HTTP to a host other than this one: a key sent there would
/// cross a network unencrypted (an unparsable URL: false, its use fails elsewhere).
pub fn in_the_clear_off_host(url: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    uri.scheme_str() == Some("http") && !loopback
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_off_this_host_is_noticed() {
        for off in ["http://10.0.0.1:30000", "http://master:30000/p"] {
            assert!(in_the_clear_off_host(off), "{off}");
        }
        for fine in [
            "https://10.0.0.1:30000",
            "http://127.0.0.1:30000",
            "http://[::1]:30000",
            "http://localhost:30000",
        ] {
            assert!(!in_the_clear_off_host(fine), "{fine}");
        }
    }

    #[test]
    fn a_ca_file_must_hold_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = ca_certificates(&empty).unwrap_err();
        assert!(
            e.contains("empty.pem") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = trust_roots(Some(&dir.path().join("missing.pem"))).unwrap_err();
        assert!(e.contains("missing.pem"), "{e}");
        // Without an extra file the system's roots alone are trusted (possibly none).
        trust_roots(None).unwrap();
    }

    #[test]
    fn causes_are_chained_once() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error (Connect)")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::other(
            "invalid peer certificate: UnknownIssuer",
        ));
        assert_eq!(
            describe(&e),
            "client error (Connect): invalid peer certificate: UnknownIssuer"
        );
    }

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/tls"
        ))
        .join(name)
    }

    #[test]
    fn server_files_both_or_neither_and_a_matching_pair() {
        let problem = |c: Option<&Path>, k: Option<&Path>| server_files(c, k).err();
        let (cert, key) = (fixture("server.pem"), fixture("server.key"));
        let (cert, key) = (cert.as_path(), key.as_path());
        assert!(problem(None, None).is_none());
        assert!(problem(Some(cert), Some(key)).is_none());
        let alpn = server_config(cert, key).unwrap().alpn_protocols;
        assert_eq!(alpn, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        let e = problem(Some(cert), None).unwrap();
        assert!(e.contains("needs tls_key_file"), "{e}");
        let e = problem(None, Some(key)).unwrap();
        assert!(e.contains("needs tls_cert_file"), "{e}");
        let e = problem(Some(Path::new("/nonexistent/c.pem")), Some(key)).unwrap();
        assert!(e.contains("/nonexistent/c.pem"), "{e}");
        // The CA's certificate with the server's key: not a pair.
        let e = problem(Some(&fixture("ca.pem")), Some(key)).unwrap();
        assert!(e.contains("ca.pem"), "{e}");
        // A key file without a key.
        let e = problem(Some(cert), Some(cert)).unwrap();
        assert!(e.contains("tls_key_file"), "{e}");
    }
}
