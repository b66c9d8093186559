//! RDMA detection and fallback as a user meets it: asking for RDMA on a machine without a
//! usable device is a clear error naming TCP; `auto` falls back by itself.

mod common;

use common::*;
use transfer::{EngineConfig, RdmaMode, TransferEngine, TransferError};

#[tokio::test]
async fn rdma_on_without_a_device_fails_naming_tcp_and_auto_falls_back() {
    let probe = transfer::rdma::probe_devices();
    eprintln!("RDMA probe on this machine: {probe:?}");
    assert!(
        probe.is_err(),
        "these tests expect a machine without RDMA devices"
    );

    let err = TransferEngine::new(EngineConfig {
        rdma: RdmaMode::On,
        ..config(false)
    })
    .await
    .unwrap_err();
    match &err {
        TransferError::TransportUnavailable { transport, reason } => {
            assert_eq!(*transport, "rdma");
            assert!(reason.contains("TCP"), "{reason}");
        }
        other => panic!("expected TransportUnavailable, got {other}"),
    }

    let auto = TransferEngine::new(EngineConfig {
        rdma: RdmaMode::Auto,
        ..config(false)
    })
    .await
    .unwrap();
    assert!(!auto.transports().rdma);
    assert!(auto.descriptor().endpoints.rdma.is_empty());
    // And it works, over TCP.
    let target = engine(false).await;
    let remote = target.alloc(4096).unwrap();
    let local = auto.alloc(4096).unwrap();
    fill(&local, 31);
    let seg = auto.open_segment(target.segment_name()).await.unwrap();
    write_checked(&auto, &local, 0, &seg, &remote, 0, 4096).await;
    assert_eq!(auto.stats().tcp_bytes, 4096);
}

/// An authenticated peer asking this node for an RDMA queue pair while RDMA is off gets a
/// clear refusal.
#[tokio::test]
async fn rdma_handshake_to_a_tcp_only_node_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use transfer::rdma::{HANDSHAKE_VERSION, QpEndpoint, RdmaHandshake};
    use transfer::tcp::frame::{Opcode, RequestHeader, ResponseHeader, Status};
    let target = engine(false).await;
    let hello = RdmaHandshake {
        version: HANDSHAKE_VERSION,
        target_device: "mlx5_0".into(),
        endpoint: QpEndpoint {
            device: "mlx5_0".into(),
            lid: 1,
            gid: None,
            qp_num: 17,
            psn: 1,
        },
    }
    .encode();
    let mut s = authenticated(target.local_addr()).await;
    let h = RequestHeader {
        op: Opcode::RdmaConnect,
        request_id: 1,
        remote_addr: 0,
        len: hello.len() as u64,
        token: 0,
    };
    s.write_all(&h.encode()).await.unwrap();
    s.write_all(&hello).await.unwrap();
    let mut hb = [0u8; 24];
    s.read_exact(&mut hb).await.unwrap();
    let r = ResponseHeader::decode(&hb).unwrap();
    assert_eq!(r.status, Status::Unsupported);
    let mut msg = vec![0u8; r.len as usize];
    s.read_exact(&mut msg).await.unwrap();
    assert!(String::from_utf8_lossy(&msg).contains("TCP"));
}
