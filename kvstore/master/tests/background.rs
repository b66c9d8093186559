//! Paused-time tests of the background task (leases, client TTL, zombie puts, eviction)
//! and of the metrics, with a local Prometheus recorder.

mod common;

use std::sync::Arc;
use std::time::Duration;

use kvmaster::master::{ClientId, ClientStatus, ReplicateConfig, SegmentSpec};
use kvmaster::{Master, MasterConfig};
use openapi::master::MasterError;
use tokio::sync::oneshot;
use tokio::time::advance;

fn spec(name: &str, size: u64) -> SegmentSpec {
    SegmentSpec {
        name: name.into(),
        base: 0x1000_0000,
        size,
        endpoint: format!("te-{name}"),
        disk_bytes: 0,
        disk_write_through: false,
    }
}

const OWNER: ClientId = ClientId::from_u128(1);
const WRITER: ClientId = ClientId::from_u128(7);

/// A master on tokio's (paused) clock with its background task running.
fn start(config: MasterConfig) -> (Arc<Master>, oneshot::Sender<()>) {
    let master = Arc::new(Master::new(config).unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(kvmaster::run_background(master.clone(), async move {
        let _ = stopped.await;
    }));
    (master, stop)
}

/// Lets the background task run its ticks up to now.
async fn settle(by: Duration) {
    advance(by).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn put(m: &Master, key: &str, len: u64, cfg: &ReplicateConfig) {
    m.put_start(WRITER, key, len, cfg).unwrap();
    m.put_end(WRITER, key).unwrap();
}

#[tokio::test(start_paused = true)]
async fn lease_expires_after_its_ttl() {
    let (m, _stop) = start(MasterConfig::default());
    m.mount_segment(OWNER, spec("s", 1 << 20)).unwrap();
    put(&m, "k", 64, &ReplicateConfig::default());
    assert_eq!(m.get_replicas("k").unwrap().lease_ttl_ms, 10_000);
    settle(Duration::from_millis(9_990)).await;
    m.ping(OWNER);
    assert!(matches!(
        m.remove("k", false),
        Err(MasterError::ObjectHasLease(_))
    ));
    settle(Duration::from_millis(20)).await;
    m.remove("k", false).unwrap();
}

#[tokio::test(start_paused = true)]
async fn silent_client_is_expired_by_the_background_task() {
    let (m, _stop) = start(MasterConfig::default());
    m.mount_segment(OWNER, spec("s", 1 << 20)).unwrap();
    put(&m, "k", 64, &ReplicateConfig::default());
    for _ in 0..5 {
        settle(Duration::from_secs(3)).await;
        assert_eq!(
            m.ping(OWNER).status,
            ClientStatus::Ok,
            "pinging keeps it alive"
        );
    }
    settle(Duration::from_millis(10_200)).await;
    assert_eq!(m.ping(OWNER).status, ClientStatus::NeedRemount);
    assert!(m.segments().is_empty());
    assert!(matches!(
        m.get_replicas("k"),
        Err(MasterError::ObjectNotFound(_))
    ));
    m.remount_segments(OWNER, vec![spec("s", 1 << 20)]).unwrap();
    assert_eq!(m.ping(OWNER).status, ClientStatus::Ok);
}

#[tokio::test(start_paused = true)]
async fn zombie_put_is_taken_over_and_released() {
    let (m, _stop) = start(MasterConfig::default());
    m.mount_segment(OWNER, spec("s", 1 << 20)).unwrap();
    m.put_start(WRITER, "k", 4096, &ReplicateConfig::default())
        .unwrap();
    let other = ClientId::from_u128(8);
    let keepalive = |m: &Master| {
        m.ping(OWNER);
    };
    settle(Duration::from_secs(5)).await;
    keepalive(&m);
    assert!(matches!(
        m.put_start(other, "k", 4096, &ReplicateConfig::default()),
        Err(MasterError::ObjectAlreadyExists(_))
    ));
    for _ in 0..6 {
        settle(Duration::from_secs(5)).await;
        keepalive(&m);
    }
    m.put_start(other, "k", 4096, &ReplicateConfig::default())
        .unwrap();
    assert_eq!(m.stats().allocated_bytes, 8192);
    for _ in 0..114 {
        settle(Duration::from_secs(5)).await;
        keepalive(&m);
    }
    // 600 s after the first put_start: its space has been released by a tick.
    assert_eq!(m.stats().allocated_bytes, 4096);
    m.put_end(other, "k").unwrap();
    assert!(m.get_replicas("k").is_ok());
}

#[tokio::test(start_paused = true)]
async fn background_eviction_brings_usage_under_the_watermark() {
    let (m, _stop) = start(MasterConfig::default());
    m.mount_segment(OWNER, spec("s", 100 * 1024)).unwrap();
    let pinned = ReplicateConfig {
        hard_pin: true,
        ..ReplicateConfig::default()
    };
    for i in 0..95 {
        let cfg = if i < 5 {
            &pinned
        } else {
            &ReplicateConfig::default()
        };
        put(&m, &format!("k{i:02}"), 1024, cfg);
    }
    m.get_replicas("k05").unwrap();
    settle(Duration::from_millis(150)).await;
    let s = m.stats();
    assert!(s.evicted_objects >= 5, "{s:?}");
    assert!(s.allocated_bytes <= 90 * 1024, "{s:?}");
    for k in ["k00", "k04", "k05"] {
        assert!(m.object(k).is_ok(), "{k} is pinned or leased");
    }
}

#[tokio::test]
async fn metrics_are_recorded_under_moongate_master_names() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let s = common::Server::start().await;
    s.mount("seg", 0).await;
    s.put("a", 64).await;
    s.call("GET", "/api/v1/objects/a/replicas", None).await;
    s.call("GET", "/api/v1/objects/missing/replicas", None)
        .await;
    s.call(
        "POST",
        "/api/v1/batch/exists",
        Some(serde_json::json!({"keys": ["a", "b"]})),
    )
    .await;
    s.raw("POST", "/api/v1/objects/x/put-start", "{bad").await;
    s.master.evict(1, 1);
    s.master.remove("a", true).unwrap();
    put(&s.master, "b", 64, &ReplicateConfig::default());
    assert_eq!(s.master.evict(1, 1).evicted_objects, 1);
    kvmaster::publish_gauges(&s.master);
    let text = handle.render();
    for line in [
        "moongate_master_requests_total{op=\"put_start\"} 1",
        "moongate_master_requests_total{op=\"get_replicas\"} 2",
        "moongate_master_requests_total{op=\"exists\"} 2",
        "moongate_master_requests_total{op=\"batch_exists\"} 1",
        "moongate_master_failures_total{op=\"get_replicas\",error=\"OBJECT_NOT_FOUND\"} 1",
        "moongate_master_failures_total{op=\"bad_request\",error=\"INVALID_PARAMS\"} 1",
        "moongate_master_evictions_total 1",
        "moongate_master_evicted_bytes_total 64",
        "moongate_master_capacity_bytes 1048576",
        "moongate_master_allocated_bytes 0",
        "moongate_master_keys 0",
        "moongate_master_segments 1",
        "moongate_master_clients{status=\"ok\"} 1",
        "moongate_master_metadata_entries 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}
