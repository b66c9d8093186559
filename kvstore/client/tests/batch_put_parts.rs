//! A copying `batch_put` goes in parts: 4 MiB ones while values are staged for transfers,
//! up to 64 MiB ones once the first part was written by mapped copies alone. Whatever the
//! parts, every value lands whole and in its place, wherever its replica turned out to be.

use kvclient::Protocol;
use kvclient::{ClientConfig, StoreClient};
use kvmaster::{MasterConfig, MasterServer};
use openapi::master::ReplicateConfig;

const MIB: usize = 1 << 20;

async fn client(m: &MasterServer, segment: usize) -> StoreClient {
    let cfg = ClientConfig {
        protocol: Protocol::Tcp,
        local_buffer_size: 4 * MIB as u64,
        ..ClientConfig::local(&m.url(), segment as u64)
    };
    StoreClient::connect(cfg).await.unwrap()
}

/// Bytes of value `i`: each byte depends on the value and its position.
fn bytes(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i as u8).wrapping_mul(97) ^ (j as u8) ^ (j >> 10) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_past_a_mapped_first_part_land_whole_wherever_they_go() {
    let m = MasterServer::start(MasterConfig::default(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    // A node reached over TCP only (its replicas are staged and transferred), and a client
    // whose own segment (written by mapped copies) comes first for its puts until full.
    let node = client(&m, 64 * MIB).await;
    let c = client(&m, 10 * MIB).await;
    let own = c.segment().unwrap().name.clone();
    let c = c.with_replication(ReplicateConfig {
        preferred_segments: vec![own.clone()],
        ..ReplicateConfig::default()
    });
    assert!(c.batch_put::<&str, &[u8]>(&[]).await.is_empty());
    // The first 4 MiB part goes to the own segment: mapped copies only, so the other 20
    // values go as one part. The own segment takes some of them, the node the others,
    // staged through a copy buffer smaller than their bytes.
    let lens: Vec<usize> = (0..24)
        .map(|i| if i % 5 == 4 { MIB - 4096 } else { MIB })
        .collect();
    let keys: Vec<String> = (0..lens.len()).map(|i| format!("v{i}")).collect();
    let vals: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| bytes(i, l)).collect();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .map(String::as_str)
        .zip(vals.iter().map(Vec::as_slice))
        .collect();
    for (k, r) in keys.iter().zip(c.batch_put(&items).await) {
        r.unwrap_or_else(|e| panic!("{k}: {e}"));
    }
    let mut on_own = 0;
    for (k, v) in keys.iter().zip(&vals) {
        let at = m.master().get_replicas(k).unwrap();
        on_own += usize::from(at.replicas[0].segment.name() == own);
        // Read by the other client: from the node's memory, or over TCP from `c`'s.
        assert_eq!(node.get(k).await.unwrap().as_ref(), v.as_slice(), "{k}");
    }
    assert!(
        (4..24).contains(&on_own),
        "{on_own} values in the own segment: both kinds of replica were written"
    );
    assert_eq!(c.copy_buffer_in_use(), 0);
}
