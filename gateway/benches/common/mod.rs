//! What the gateway's benches share: ready workers to select among, a KV master with room.

/// `n` ready regular workers serving model `m` (`http://w<i>:1`).
#[allow(unused_imports)]
pub use gateway::workers::testing::ready_workers as workers;

/// A master configured `config` with one segment of 1 TiB (owner client 1) to put into.
#[allow(dead_code)]
pub fn master(config: kvmaster::MasterConfig) -> std::sync::Arc<kvmaster::Master> {
    let m = kvmaster::Master::new(config).expect("master");
    m.mount_segment(
        kvmaster::master::ClientId::from_u128(1),
        kvmaster::master::SegmentSpec {
            name: "s".into(),
            base: 1 << 40,
            size: 1 << 40,
            endpoint: "node".into(),
            disk_bytes: 0,
            disk_write_through: false,
        },
    )
    .expect("mount");
    std::sync::Arc::new(m)
}
