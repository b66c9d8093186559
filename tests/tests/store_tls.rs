//! The store over TLS, over real sockets on 127.0.0.1: `moongate master` serving HTTPS
//! (`--tls-cert-file`, `--tls-key-file`, the committed test certificate), a storage node and
//! a store client speaking to it over `https://` (master calls and the transfer HTTP
//! metadata client alike), verified by `master_ca_cert`; the store key each sends derived
//! from their cluster secret file. A client without the CA, or with another secret, is
//! refused with an error that says why. HTTP/2 and HTTP/1.1 by ALPN, on `master` and
//! `serve`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gateway::config::{MasterHostConfig, Secret, ServeConfig};
use gateway::master::MasterProcess;
use kvclient::node::StoreNodeConfig;
use kvclient::{ClientConfig, StoreClient};
use moongate_tests::tls::fixture;
use moongate_tests::{eventually, fast_config, start_gateway};
use openapi::master::ReplicateConfig;
use transfer::metadata::segment_key;
use transfer::{ClusterSecret, HttpMetadata, TransferError};

/// A fresh cluster secret file (0600) in `dir`, and the store key derived from it.
fn secret_in(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let key = ClusterSecret::load_or_create(&path)
        .unwrap()
        .store_api_key();
    (path, key)
}

/// `moongate master` over TLS on 127.0.0.1:0. Until the master checks store keys by itself,
/// its admin key (accepted on every plane) is the store key the cluster's secret derives.
async fn tls_master(key: &str) -> MasterProcess {
    let cfg = MasterHostConfig {
        host: "127.0.0.1".into(),
        port: 0,
        admin_api_key: Some(Secret::new(key)),
        tls_cert_file: Some(fixture("server.pem")),
        tls_key_file: Some(fixture("server.key")),
        shutdown_grace_period_secs: 2,
        ..MasterHostConfig::default()
    };
    cfg.validate().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    gateway::master::spawn_master(cfg, listener).await.unwrap()
}

/// A client of the master at `url` holding the secret `secret`, trusting the test CA,
/// finding transfer descriptors through the master's `/metadata` over the same HTTPS.
fn client_cfg(url: &str, secret: &Path, segment: u64) -> ClientConfig {
    ClientConfig {
        transfer_secret_file: Some(secret.to_owned()),
        master_ca_cert: Some(fixture("ca.pem")),
        metadata: format!("{url}/metadata"),
        local_buffer_size: 4 << 20,
        heartbeat_interval_ms: 200,
        ..ClientConfig::local(url, segment)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_and_a_client_use_a_tls_master_with_the_store_key_of_their_secret() {
    let dir = tempfile::tempdir().unwrap();
    let (secret, key) = secret_in(dir.path(), "cluster-secret");
    let m = tls_master(&key).await;
    let url = m.url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    // A storage node, in-process, as `moongate store` runs it.
    let node_cfg = StoreNodeConfig {
        client: client_cfg(&url, &secret, 8 << 20),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        otlp_traces_endpoint: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(kvclient::node::run(node_cfg, String::new, async move {
        let _ = stopped.await;
    }));
    eventually("the node mounts over https", || {
        m.master().segments().len() == 1
    })
    .await;
    let node_segment = m.master().segments()[0].name.clone();

    // A pure client writes onto the node and reads back, every master call over TLS; the
    // node's descriptor came to it from the master's /metadata, over TLS too.
    let c = StoreClient::connect(client_cfg(&url, &secret, 0))
        .await
        .unwrap();
    let on_node = c.with_replication(ReplicateConfig {
        preferred_segments: vec![node_segment.clone()],
        ..ReplicateConfig::default()
    });
    let value: Vec<u8> = (0..200_000u32).map(|i| (i * 13 % 251) as u8).collect();
    on_node.put("tls/1", &value).await.unwrap();
    let info = m.master().object("tls/1").unwrap();
    assert_eq!(info.replicas[0].segment.name(), node_segment);
    assert_eq!(c.get("tls/1").await.unwrap(), value);
    let endpoint = info.replicas[0].segment.endpoint().to_owned();
    let md = HttpMetadata::with_auth(
        &format!("{url}/metadata"),
        Duration::from_secs(5),
        Some(&Secret::new(&key)),
        Some(&fixture("ca.pem")),
    )
    .unwrap();
    assert!(
        md.get(&segment_key(&endpoint)).await.unwrap().is_some(),
        "the node published its descriptor at the master"
    );

    // SIGTERM's path: the node unmounts over TLS on its way out.
    c.close().await.unwrap();
    stop.send(()).unwrap();
    node.await.unwrap().unwrap();
    assert!(m.master().segments().is_empty());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_the_ca_or_the_secret_are_refused_and_told_why() {
    let dir = tempfile::tempdir().unwrap();
    let (secret, key) = secret_in(dir.path(), "cluster-secret");
    let (other, _) = secret_in(dir.path(), "another-secret");
    let m = tls_master(&key).await;
    let url = m.url();

    // No CA: the master's certificate does not verify; nothing is sent.
    let no_ca = ClientConfig {
        master_ca_cert: None,
        metadata: "p2p".into(),
        ..client_cfg(&url, &secret, 1 << 20)
    };
    let e = StoreClient::connect(no_ca).await.map(|_| ()).unwrap_err();
    assert_eq!(e.name(), "RPC_FAIL", "{e}");
    let text = e.to_string();
    assert!(
        text.contains("UnknownIssuer") && text.contains("--master-ca-cert"),
        "{text}"
    );
    let md = HttpMetadata::with_auth(
        &format!("{url}/metadata"),
        Duration::from_secs(5),
        Some(&Secret::new(&key)),
        None,
    )
    .unwrap();
    match md.get("k").await {
        Err(TransferError::Metadata { reason, .. }) => {
            assert!(reason.contains("UnknownIssuer"), "{reason}")
        }
        other => panic!("the metadata client trusted an unknown CA: {other:?}"),
    }

    // Another cluster's secret: a key the master does not accept.
    let stranger = ClientConfig {
        metadata: "p2p".into(),
        ..client_cfg(&url, &other, 1 << 20)
    };
    let e = StoreClient::connect(stranger)
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.name(), "UNAUTHORIZED", "{e}");
    let md = HttpMetadata::with_auth(
        &format!("{url}/metadata"),
        Duration::from_secs(5),
        Some(&Secret::new("not-the-key")),
        Some(&fixture("ca.pem")),
    )
    .unwrap();
    match md.get("k").await {
        Err(TransferError::Metadata { reason, .. }) => assert!(reason.contains("401"), "{reason}"),
        other => panic!("a wrong key was let in: {other:?}"),
    }
    // The explicit key wins over the secret's.
    let explicit = ClientConfig {
        store_api_key: Some(Secret::new(&key)),
        metadata: "p2p".into(),
        ..client_cfg(&url, &other, 0)
    };
    let c = StoreClient::connect(explicit).await.unwrap();
    assert_eq!(
        c.get("absent").await.unwrap_err().name(),
        "OBJECT_NOT_FOUND"
    );
    c.close().await.unwrap();
    m.shutdown().await;
}

/// A client trusting the test CA; `http1` forces HTTP/1.1, else ALPN offers h2 first.
fn https_client(http1: bool) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(fixture("ca.pem")).unwrap()).unwrap();
    let b = reqwest::Client::builder().add_root_certificate(ca);
    let b = if http1 { b.http1_only() } else { b };
    b.build().unwrap()
}

async fn versions_served(url: &str, path: &str) {
    for (http1, want) in [
        (false, http::Version::HTTP_2),
        (true, http::Version::HTTP_11),
    ] {
        let r = https_client(http1)
            .get(format!("{url}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.version(), want, "{url}{path} with http1 only = {http1}");
    }
    // Plain HTTP to the TLS port gets no answer.
    let plain = url.replacen("https://", "http://", 1);
    let r = reqwest::Client::new()
        .get(format!("{plain}{path}"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(r.is_err(), "plain HTTP was answered on the TLS port: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_and_serve_speak_http2_and_http11_over_tls() {
    let m = tls_master("some-admin-key").await;
    versions_served(&m.url(), "/health").await;
    m.shutdown().await;

    let gw = start_gateway(ServeConfig {
        tls_cert_file: Some(fixture("server.pem")),
        tls_key_file: Some(fixture("server.key")),
        ..fast_config()
    })
    .await;
    assert!(gw.url().starts_with("https://"), "{}", gw.url());
    versions_served(&gw.url(), "/liveness").await;
    gw.shutdown().await;
}

#[test]
fn tls_needs_both_files_and_a_matching_pair() {
    let with = |cert: Option<PathBuf>, key: Option<PathBuf>| MasterHostConfig {
        tls_cert_file: cert,
        tls_key_file: key,
        ..MasterHostConfig::default()
    };
    let e = with(Some(fixture("server.pem")), None)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("tls_cert_file needs tls_key_file"), "{e}");
    let e = ServeConfig {
        tls_key_file: Some(fixture("server.key")),
        ..ServeConfig::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("tls_key_file needs tls_cert_file"), "{e}");
    let e = with(Some(fixture("ca.pem")), Some(fixture("server.key")))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("ca.pem"), "{e}");
    with(Some(fixture("server.pem")), Some(fixture("server.key")))
        .validate()
        .unwrap();
}
