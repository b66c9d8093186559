//! Sessions against a real master over real HTTP, with real transfer engines over TCP:
//! objects written layer by layer in ranges and read back the same way, a replica lost
//! under a held object, the write window and the read lease.

use std::time::Duration;

use kvclient::{BufRange, ClientConfig, Protocol, Range, StoreClient, StoreError};
use kvmaster::{MasterConfig, MasterServer};

const MIB: u64 = 1 << 20;
const LAYERS: usize = 6;
const CHUNK: usize = 4096;

async fn master(config: MasterConfig) -> MasterServer {
    MasterServer::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn client(m: &MasterServer, segment: u64) -> StoreClient {
    let cfg = ClientConfig {
        protocol: Protocol::Tcp,
        local_buffer_size: 8 * MIB,
        ..ClientConfig::local(&m.url(), segment)
    };
    StoreClient::connect(cfg).await.unwrap()
}

/// The ranges of `layer` of `pages` objects in a layer-major pool (`pool[layer][page]`).
fn layer<'a>(pool: &'a transfer::RegisteredBuffer, pages: usize, layer: usize) -> Vec<Range<'a>> {
    (0..pages)
        .map(|p| Range {
            buf: BufRange::new(pool, (layer * pages + p) * CHUNK, CHUNK),
            offset: (layer * CHUNK) as u64,
        })
        .collect()
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..5000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("never: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_written_and_read_layer_by_layer_even_when_a_replica_is_lost() {
    let m = master(MasterConfig::default()).await;
    let (a, b) = (client(&m, 64 * MIB).await, client(&m, 64 * MIB).await);
    let c = client(&m, 0)
        .await
        .with_replication(openapi::master::ReplicateConfig {
            replica_num: 2,
            ..Default::default()
        });
    let pages = 4;
    let src = c.alloc(LAYERS * pages * CHUNK).unwrap();
    let bytes: Vec<u8> = (0..src.len()).map(|i| (i * 7 + i / 4093) as u8).collect();
    src.write_at(0, &bytes).unwrap();
    let keys: Vec<String> = (0..pages).map(|p| format!("lw/{p}")).collect();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let obj = (LAYERS * CHUNK) as u64;
    let items: Vec<(&str, u64)> = names.iter().map(|k| (*k, obj)).collect();
    let puts: Vec<_> = c
        .start_writes(&items)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(!c.exists("lw/0").await.unwrap(), "invisible before the end");
    for l in 0..LAYERS {
        let ranges = layer(&src, pages, l);
        let batch: Vec<_> = puts
            .iter()
            .zip(&ranges)
            .map(|(w, r)| (w, std::slice::from_ref(r)))
            .collect();
        for r in c.write_ranges(&batch).await {
            assert_eq!(r.unwrap(), CHUNK as u64);
        }
    }
    // A range past the object's end, and one past its buffer, are refused.
    let past = [Range {
        buf: BufRange::new(&src, 0, CHUNK),
        offset: obj - 1,
    }];
    let outside = [Range {
        buf: BufRange::new(&src, src.len() - 1, CHUNK),
        offset: 0,
    }];
    let got = c
        .write_ranges(&[(&puts[0], &past[..]), (&puts[0], &outside[..])])
        .await;
    assert!(
        got.iter()
            .all(|r| matches!(r, Err(StoreError::InvalidArgument(_)))),
        "{got:?}"
    );
    for r in c.end_writes(&names).await {
        r.unwrap();
    }

    let held: Vec<_> = c
        .hold(&names)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(held[0].length(), obj);
    let dst = c.alloc(src.len()).unwrap();
    // One replica's node goes: a held object is read from the other.
    drop(a);
    for l in (0..LAYERS).rev() {
        let ranges = layer(&dst, pages, l);
        let batch: Vec<_> = held
            .iter()
            .zip(&ranges)
            .map(|(h, r)| (h, std::slice::from_ref(r)))
            .collect();
        for r in c.read_held(&batch).await {
            assert_eq!(r.unwrap(), CHUNK as u64);
        }
    }
    let mut back = vec![0u8; dst.len()];
    dst.read_at(0, &mut back).unwrap();
    assert!(back == bytes, "the layers landed where they were read from");
    let missing = c.hold(&["lw/none"]).await;
    assert_eq!(missing[0].as_ref().unwrap_err().name(), "OBJECT_NOT_FOUND");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_outlives_its_write_window_by_renewal_until_the_master_lets_it_go() {
    // A tenth of the reservation TTL is the write window: 200 ms here; an unfinished put
    // may be taken over 300 ms after its start; the read lease is 200 ms.
    let m = master(MasterConfig {
        reservation_ttl_ms: 2000,
        put_start_discard_timeout_ms: 300,
        lease_ttl_ms: 200,
        ..MasterConfig::default()
    })
    .await;
    let c = client(&m, 16 * MIB).await;
    let other = client(&m, 0).await;
    let buf = c.alloc(CHUNK).unwrap();
    buf.write_at(0, &[7u8; CHUNK]).unwrap();
    let one = [Range {
        buf: BufRange::whole(&buf),
        offset: 0,
    }];
    // A put-start answered past its window is revoked at once; on a loaded machine that
    // may happen, so start until one is answered in time.
    let mut w = None;
    until("a put started within its window", async || {
        w = c
            .start_writes(&[("ww/k", CHUNK as u64)])
            .await
            .remove(0)
            .ok();
        w.is_some()
    })
    .await;
    let w = w.unwrap();
    // Written all along, it goes on past two windows: each write half through one renews it.
    let t = std::time::Instant::now();
    until("two write windows to pass", async || {
        let r = c.write_ranges(&[(&w, &one[..])]).await.remove(0);
        assert_eq!(r.unwrap(), CHUNK as u64);
        t.elapsed() > Duration::from_millis(400)
    })
    .await;
    // Left alone past its discard timeout (renewals count it again from each), another
    // writer takes the key over; by then the put is past its write window, so the next
    // write's renewal finds the put gone and nothing is written into its old space.
    until("another writer to take the key over", async || {
        other.put("ww/k", b"theirs").await.is_ok()
            && other.get("ww/k").await.is_ok_and(|v| &v[..] == b"theirs")
    })
    .await;
    let e = c
        .write_ranges(&[(&w, &one[..])])
        .await
        .remove(0)
        .unwrap_err();
    assert_eq!((e.name(), e.code()), ("INVALID_WRITE", -700), "{e}");
    assert_eq!(&other.get("ww/k").await.unwrap()[..], b"theirs");

    // Held past its lease, a read is refused; holding again renews the lease.
    let one = [Range {
        buf: BufRange::new(&buf, 0, 6),
        offset: 0,
    }];
    let h = c.hold(&["ww/k"]).await.remove(0).unwrap();
    until("the lease to run out", async || h.expired()).await;
    let e = c.read_held(&[(&h, &one[..])]).await.remove(0).unwrap_err();
    assert_eq!(e.name(), "LEASE_EXPIRED");
    until("a read within a renewed lease", async || {
        let h = c.hold(&["ww/k"]).await.remove(0).unwrap();
        match c.read_held(&[(&h, &one[..])]).await.remove(0) {
            Ok(n) => n == 6,
            Err(e) if e.name() == "LEASE_EXPIRED" => false,
            Err(e) => panic!("{e}"),
        }
    })
    .await;
}
