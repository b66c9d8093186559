//! The HA master as users run it: a real etcd (Debian's `etcd-server`, started here on
//! loopback ports with a temporary data dir), `moongate master --ha` processes, and a store
//! client that lists them all. Leaders are SIGKILLed and SIGSTOPped while a client puts and
//! gets; a manifest of every acknowledged put is read back after each failover; a resumed
//! old leader must refuse writes; etcd is killed and restarted under load.
//!
//! Needs the cargo feature `etcd` (and `protoc` to build it) and the `etcd` binary; `.ci/run`
//! installs both. `MOONGATE_HA_FAILOVERS=20` runs the long loop of the closing note.
#![cfg(feature = "etcd")]

mod common;

use common::etcd::{Etcd, etcd_tls};
use common::ha::{MasterProc, STORE_KEY, client, ha_status, leader, lease_ttl_secs};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvclient::{ClientConfig, StoreClient, StoreError};
use openapi::master::MasterError;
use parking_lot::Mutex;
use trust::Secret;

fn value(i: u64) -> Vec<u8> {
    common::value(i, 4096)
}

/// Acknowledged puts: key index and when the put started.
#[derive(Default)]
struct Manifest {
    acked: Mutex<Vec<u64>>,
}

/// Puts fresh keys until `stop`, recording each acknowledged one (and when it started).
fn spawn_writer(
    c: StoreClient,
    manifest: Arc<Manifest>,
    first: u64,
    stop: Arc<AtomicBool>,
    started_acked: Arc<Mutex<Vec<(Instant, Instant)>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i = first;
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            if c.put(&format!("k{i}"), &value(i)).await.is_ok() {
                manifest.acked.lock().push(i);
                started_acked.lock().push((t, Instant::now()));
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            i += 1;
        }
    })
}

/// Gets acknowledged keys until `stop`; a get that answers must answer the right bytes.
fn spawn_reader(
    c: StoreClient,
    manifest: Arc<Manifest>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut reads = 0;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let pick = {
                let acked = manifest.acked.lock();
                (!acked.is_empty()).then(|| acked[(n as usize * 7919) % acked.len()])
            };
            n += 1;
            match pick {
                Some(i) => {
                    if let Ok(v) = c.get(&format!("k{i}")).await {
                        assert!(v == value(i), "k{i} read back wrong bytes");
                        reads += 1;
                    }
                }
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        reads
    })
}

/// Every acknowledged key reads back exactly (retrying briefly: a failover may be under way).
async fn check_manifest(c: &StoreClient, manifest: &Manifest) -> usize {
    let keys: Vec<u64> = manifest.acked.lock().clone();
    for chunk in keys.chunks(256) {
        let names: Vec<String> = chunk.iter().map(|i| format!("k{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let got = c.batch_get(&refs).await;
            let bad: Vec<_> = got
                .iter()
                .zip(chunk)
                .filter(|(r, i)| !r.as_ref().is_ok_and(|v| v[..] == value(**i)[..]))
                .map(|(r, i)| (format!("k{i}"), r.as_ref().err().map(|e| e.to_string())))
                .collect();
            if bad.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "acknowledged objects lost or wrong: {} of {}, e.g. {:?}",
                bad.len(),
                chunk.len(),
                &bad[..bad.len().min(3)]
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    keys.len()
}

/// Puts (and reads back) a probe until it succeeds; returns how long that took. A put
/// whose answer was lost (a timeout across the failover) may have been made durable all the
/// same: its retry answers "already exists", and the probe is read back like any other.
async fn served_again(c: &StoreClient, key: &str, since: Instant) -> Duration {
    let v = value(u64::MAX);
    let deadline = since + Duration::from_secs(30);
    loop {
        let put = match c.put(key, &v).await {
            Err(StoreError::Master(MasterError::ObjectAlreadyExists(_))) => Ok(()),
            other => other,
        };
        let last = match put {
            Ok(()) => match c.get(key).await {
                Ok(g) if g == v => return since.elapsed(),
                other => format!("get: {:?}", other.map(|g| g.len())),
            },
            Err(e) => format!("put: {e}"),
        };
        assert!(
            Instant::now() < deadline,
            "not served again within 30 s; last error: {last}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Gets `key` (acknowledged before) until it is served; returns how long that took.
async fn read_again(c: &StoreClient, key: &str, since: Instant) -> Duration {
    let deadline = since + Duration::from_secs(30);
    loop {
        let got = c.get(key).await;
        if got.is_ok() {
            return since.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{key} not read again within 30 s; last error: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A raw put-start at `url` with the store key: its HTTP status.
async fn raw_put_start(url: &str) -> u16 {
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let body = serde_json::json!({
        "client_id": "00000000-0000-0000-0000-00000000f00d",
        "length": 10,
    });
    c.post(format!("{url}/api/v1/objects/fenced-write/put-start"))
        .bearer_auth(STORE_KEY)
        .json(&body)
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_puts_survive_leaders_killed_and_frozen() {
    let failovers: usize = std::env::var("MOONGATE_HA_FAILOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let etcd = Etcd::start();
    let logs = tempfile::tempdir().unwrap();
    let mut masters: Vec<MasterProc> = (0..3)
        .map(|n| MasterProc::start(&etcd.url(), "t1", logs.path(), n))
        .collect();
    let (_, first_term) = leader(&masters).await;
    // Leader and followers are ready (a follower redirects to the leader it knows).
    let deadline = Instant::now() + Duration::from_secs(30);
    for m in &masters {
        loop {
            let r = reqwest::get(format!("{}/readiness", m.url())).await;
            if r.is_ok_and(|r| r.status() == 200) {
                break;
            }
            assert!(Instant::now() < deadline, "{} never ready", m.url());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let c = client(&masters).await;
    let manifest = Arc::new(Manifest::default());
    let stop = Arc::new(AtomicBool::new(false));
    let times = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            spawn_writer(
                c.clone(),
                manifest.clone(),
                w * 1_000_000,
                stop.clone(),
                times.clone(),
            )
        })
        .collect();
    let reader = spawn_reader(c.clone(), manifest.clone(), stop.clone());
    let mut recoveries = Vec::new();
    let mut term = first_term;
    for n in 0..failovers {
        // Let some puts land under this leader first.
        let before = manifest.acked.lock().len();
        let t = Instant::now();
        while manifest.acked.lock().len() < before + 20 && t.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (old, old_term) = leader(&masters).await;
        assert!(old_term >= term, "terms only grow");
        let freeze = n % 2 == 1;
        let since = Instant::now();
        if freeze {
            masters[old].signal("-STOP");
        } else {
            masters[old].kill9();
        }
        let took = served_again(&c, &format!("probe-{n}"), since).await;
        recoveries.push(took);
        let (new, new_term) = leader(&masters).await;
        assert_ne!(new, old);
        assert!(new_term > old_term);
        term = new_term;
        if freeze {
            // The old leader wakes past its lease: whatever it believes, it must not write.
            masters[old].signal("-CONT");
            let status = raw_put_start(&masters[old].url()).await;
            assert!(
                status == 307 || status == 503,
                "a deposed leader answered a write with {status}"
            );
            // And it rejoins as a follower of the new term.
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let s = ha_status(&masters[old].url()).await;
                if s.as_ref()
                    .is_some_and(|s| s["role"] == "follower" && s["term"] == new_term)
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "old leader did not follow: {s:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } else {
            masters[old].run();
        }
        let checked = check_manifest(&c, &manifest).await;
        eprintln!(
            "failover {n} ({}): served again after {took:?}; {checked} acknowledged objects all read back",
            if freeze { "SIGSTOP" } else { "SIGKILL" }
        );
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let reads = reader.await.unwrap();
    let total = check_manifest(&c, &manifest).await;
    let worst = recoveries.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{failovers} failovers: {total} acknowledged puts, none lost; {reads} reads checked; \
         worst time to serve again {worst:?} (lease TTL {} s)",
        lease_ttl_secs()
    );
    assert!(total > 0 && reads > 0);
    // A bound, not a benchmark: generous for a loaded 2-core CI machine.
    assert!(worst < Duration::from_secs(15), "failover took {worst:?}");
    let _ = c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_lost_and_back_under_load_acknowledges_nothing_meanwhile() {
    let mut etcd = Etcd::start();
    let logs = tempfile::tempdir().unwrap();
    let masters: Vec<MasterProc> = (0..2)
        .map(|n| MasterProc::start(&etcd.url(), "t2", logs.path(), n))
        .collect();
    leader(&masters).await;
    let c = client(&masters).await;
    let manifest = Arc::new(Manifest::default());
    let stop = Arc::new(AtomicBool::new(false));
    let times = Arc::new(Mutex::new(Vec::new()));
    let writer = spawn_writer(c.clone(), manifest.clone(), 0, stop.clone(), times.clone());
    let t = Instant::now();
    while manifest.acked.lock().len() < 30 && t.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    etcd.kill();
    let down = Instant::now();
    // Longer than the lease: the leader must step down, not hang or lie.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let status: Vec<_> = {
        let mut v = Vec::new();
        for m in &masters {
            v.push(ha_status(&m.url()).await.map(|s| s["role"].clone()));
        }
        v
    };
    assert!(
        status
            .iter()
            .all(|r| r.as_ref().is_none_or(|r| r != "leader")),
        "a master still claims to lead without etcd: {status:?}"
    );
    let up = Instant::now();
    etcd.run();
    let first = manifest.acked.lock().first().map(|i| format!("k{i}"));
    let first = first.expect("no put was acknowledged before etcd went");
    let read = read_again(&c, &first, up).await;
    let took = served_again(&c, "after-etcd", up).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    // No put that started while etcd was down was acknowledged before it came back.
    let lied = times
        .lock()
        .iter()
        .filter(|(started, acked)| *started > down && *acked < up)
        .count();
    assert_eq!(lied, 0, "puts acknowledged while etcd was down");
    let total = check_manifest(&c, &manifest).await;
    eprintln!(
        "etcd down {:?}: {total} acknowledged puts all read back; after etcd returned, \
         read again in {read:?}, put and read again in {took:?}",
        up - down
    );
    let _ = c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_etcd_url_finds_every_master_and_the_client_follows_them() {
    let etcd = Etcd::start();
    let logs = tempfile::tempdir().unwrap();
    // Each with Mooncake's HTTP service, which a follower answers as a Mooncake standby.
    let services: Vec<String> = (0..2)
        .map(|_| common::restartable_loopback_addr())
        .collect();
    let mut masters: Vec<MasterProc> = (0..2)
        .map(|n| {
            let port = services[n].rsplit_once(':').unwrap().1.to_string();
            let extra = ["--mooncake-http-port".to_string(), port];
            MasterProc::start_with(&etcd.url(), "t3", logs.path(), n, &extra)
        })
        .collect();
    let (first, term) = leader(&masters).await;
    let health = |i: usize| {
        let url = format!("http://{}/health", services[i]);
        async move {
            reqwest::get(url)
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    let (lead, follow) = (health(first).await, health(1 - first).await);
    assert_eq!(
        (lead["role"].as_str(), lead["ha_state"].as_str()),
        (Some("leader"), Some("serving")),
        "{lead}"
    );
    assert_eq!(lead["service_ready"], true);
    assert_eq!(
        (follow["role"].as_str(), follow["service_ready"].as_bool()),
        (Some("standby"), Some(false)),
        "{follow}"
    );
    assert_eq!(
        follow["leader_address"].as_str(),
        Some(masters[first].url().as_str()),
        "{follow}"
    );
    assert_eq!(follow["view_version"].as_i64(), Some(term), "{follow}");
    let r = reqwest::get(format!("http://{}/get_all_segments", services[1 - first]))
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["error_code"],
        -1011
    );
    let url = format!("etcd://{}/t3", etcd.client);
    let want: std::collections::BTreeSet<String> = masters.iter().map(MasterProc::url).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = kvclient::discover::discover_masters(&url).await;
        let got: std::collections::BTreeSet<String> = found
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        if got == want {
            break;
        }
        assert!(Instant::now() < deadline, "found {found:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let c = StoreClient::connect(ClientConfig {
        store_api_key: Some(Secret::new(STORE_KEY.to_owned())),
        rpc_timeout_ms: 1500,
        local_buffer_size: 8 << 20,
        ..ClientConfig::local(&url, 16 << 20)
    })
    .await
    .unwrap();
    c.put("via-etcd", &value(1)).await.unwrap();
    let (old, _) = leader(&masters).await;
    // The dashboard's HA panels query what the leader exposes after a commit.
    let metrics = reqwest::get(format!("{}/metrics", masters[old].url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ha: Vec<String> = common::dashboard_metrics()
        .into_iter()
        .filter(|m| m.starts_with("moongate_master_ha_"))
        .collect();
    assert!(ha.len() >= 4, "{ha:?}");
    for m in &ha {
        assert!(
            common::exposes(&metrics, m),
            "the leader exposes no {m}:\n{metrics}"
        );
    }
    masters[old].kill9();
    served_again(&c, "after-kill", Instant::now()).await;
    assert_eq!(c.get("via-etcd").await.unwrap(), value(1));
    let none =
        kvclient::discover::discover_masters(&format!("etcd://{}/nobody", etcd.client)).await;
    assert!(none.unwrap_err().contains("no master is registered"));
    let _ = c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn masters_reach_etcd_over_tls_with_a_client_certificate() {
    let etcd = Etcd::start_tls();
    let logs = tempfile::tempdir().unwrap();
    let ca = ["--etcd-ca-cert".to_owned(), etcd_tls("ca.pem")];
    let mut keyed = ca.to_vec();
    keyed.extend([
        "--etcd-cert-file".to_owned(),
        etcd_tls("client.pem"),
        "--etcd-key-file".to_owned(),
        etcd_tls("client.key"),
    ]);
    let masters: Vec<MasterProc> = (0..2)
        .map(|n| MasterProc::start_with(&etcd.url(), "tls", logs.path(), n, &keyed))
        .collect();
    leader(&masters).await;
    let c = client(&masters).await;
    c.put("over-tls", &value(3)).await.unwrap();
    assert_eq!(c.get("over-tls").await.unwrap(), value(3));

    // Without a client certificate etcd refuses the connection: the master never leaves
    // candidate, and says it is not ready.
    let stranger = MasterProc::start_with(&etcd.url(), "tls", logs.path(), 9, &ca);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&stranger.log).unwrap_or_default();
        if log.contains("cannot reach etcd") || log.contains("HA cycle failed") {
            break;
        }
        assert!(Instant::now() < deadline, "no etcd failure logged:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = ha_status(&stranger.url())
        .await
        .expect("it answers /api/v1/ha");
    assert_eq!(s["role"], "candidate", "{s}");
    let ready = reqwest::get(format!("{}/readiness", stranger.url()))
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let _ = c.close().await;
}
