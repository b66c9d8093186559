//! `moongate master --ha` processes on a real etcd ([`super::etcd`]), and a store client
//! of all of them: what the HA tests share.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvclient::{ClientConfig, StoreClient};
use trust::Secret;

use super::etcd::reap;

pub const STORE_KEY: &str = "ha-test-store-key";
/// The masters' lease TTL: 2 s here (shorter failovers, shorter tests);
/// `MOONGATE_HA_TEST_LEASE_TTL_SECS=3` runs the default.
pub fn lease_ttl_secs() -> String {
    std::env::var("MOONGATE_HA_TEST_LEASE_TTL_SECS").unwrap_or_else(|_| "2".into())
}

/// A `moongate master --ha` process at a fixed loopback address.
pub struct MasterProc {
    /// The process (none once killed).
    pub child: Option<Child>,
    addr: String,
    /// Its log file.
    pub log: PathBuf,
    etcd: String,
    cluster: String,
    /// More flags (TLS to etcd).
    extra: Vec<String>,
}

impl MasterProc {
    pub fn start(etcd: &str, cluster: &str, logs: &Path, n: usize) -> MasterProc {
        Self::start_with(etcd, cluster, logs, n, &[])
    }

    pub fn start_with(
        etcd: &str,
        cluster: &str,
        logs: &Path,
        n: usize,
        extra: &[String],
    ) -> MasterProc {
        let mut m = MasterProc {
            child: None,
            addr: super::restartable_loopback_addr(),
            log: logs.join(format!("master-{n}.log")),
            etcd: etcd.to_owned(),
            cluster: cluster.to_owned(),
            extra: extra.to_vec(),
        };
        m.run();
        m
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn run(&mut self) {
        let (host, port) = self.addr.rsplit_once(':').unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = super::moongate()
            .args(["master", "--host", host, "--port", port, "--ha"])
            .args(["--etcd-endpoints", &self.etcd])
            .args(["--advertise-url", &self.url()])
            .args(["--cluster-id", &self.cluster])
            .args(["--ha-lease-ttl-secs", &lease_ttl_secs()])
            .args(["--ha-commit-timeout-ms", "1000"])
            .args(["--store-api-key", STORE_KEY])
            .args(["--master-client-ttl-ms", "10000"])
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn moongate master");
        self.child = Some(child);
    }

    pub fn pid(&self) -> String {
        self.child.as_ref().expect("running").id().to_string()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    pub fn kill9(&mut self) {
        reap(&mut self.child);
    }
}

impl Drop for MasterProc {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal("-CONT");
        }
        self.kill9();
        // A failed test shows what each master did (its log goes with the temporary dir).
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!("--- last lines of {} ({}):", self.log.display(), self.addr);
            for l in tail {
                eprintln!("{l}");
            }
        }
    }
}

pub async fn ha_status(url: &str) -> Option<serde_json::Value> {
    let c = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let r = c
        .get(format!("{url}/api/v1/ha"))
        .bearer_auth(STORE_KEY)
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

/// The index of the master that serves as leader, waiting up to 30 s for one.
pub async fn leader(masters: &[MasterProc]) -> (usize, i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        for (i, m) in masters.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            if let Some(s) = ha_status(&m.url()).await
                && s["role"] == "leader"
            {
                return (i, s["term"].as_i64().unwrap());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no leader within 30 s");
}

pub async fn client(masters: &[MasterProc]) -> StoreClient {
    let urls: Vec<String> = masters.iter().map(MasterProc::url).collect();
    let cfg = ClientConfig {
        store_api_key: Some(Secret::new(STORE_KEY.to_owned())),
        rpc_timeout_ms: 1500,
        heartbeat_interval_ms: 200,
        local_buffer_size: 8 << 20,
        ..ClientConfig::local(&urls.join(","), 64 << 20)
    };
    // The cluster may still be electing: connecting retries within its timeout too.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match StoreClient::connect(cfg.clone()).await {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                eprintln!("connect: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no store client: {e}"),
        }
    }
}
