//! What an unauthenticated peer can make a transfer target allocate: whatever bytes follow a
//! valid handshake magic and version (huge announced lengths included), the accepting side
//! allocates no more than a small bound before it refuses, and never panics. A counting
//! global allocator measures it (this file is its own test binary, one test, one thread).

use std::alloc::System;
use std::time::Duration;

use proptest::prelude::*;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::io::AsyncWriteExt;
use transfer::ClusterSecret;
use transfer::auth::handshake;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Most bytes the accepting side may allocate for one refused handshake.
const BOUND: usize = 16 << 10;

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_after_magic_and_version_allocate_little(
        kind in prop_oneof![Just(1u8), Just(3u8), any::<u8>()],
        name_len in prop_oneof![Just(u16::MAX), 0u16..=255, any::<u16>()],
        rest in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let secret = ClusterSecret::from_bytes(b"cluster-secret-0123456789").unwrap();
        let mut bytes = b"MGTA\x02".to_vec();
        bytes.push(kind);
        bytes.extend_from_slice(&name_len.to_le_bytes());
        bytes.extend_from_slice(&rest);
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let (result, allocated) = rt.block_on(async {
            client.write_all(&bytes).await.unwrap();
            client.shutdown().await.unwrap();
            let region = Region::new(GLOBAL);
            let r = handshake::accept(&mut server, &secret, "node", Duration::from_secs(5)).await;
            (r, region.change().bytes_allocated)
        });
        prop_assert!(result.is_err());
        prop_assert!(allocated <= BOUND, "{allocated} bytes allocated");
    }
}
