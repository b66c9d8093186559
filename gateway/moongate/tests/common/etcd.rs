//! A real etcd for the HA tests (Debian's `etcd-server`, started on loopback ports with a
//! temporary data dir).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn etcd_binary() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("etcd"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("these tests need the `etcd` binary (Debian: apt-get install etcd-server); .ci/run installs it")
    })
}

/// SIGKILLs the child, if any, and waits for it.
pub fn reap(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// An etcd member on loopback ports, with its own data dir; killed when dropped.
pub struct Etcd {
    child: Option<Child>,
    /// Its data dir (and log).
    pub dir: tempfile::TempDir,
    /// Its client address (`host:port`).
    pub client: String,
    peer: String,
    /// Plain HTTP `/health` (its client port may speak TLS only).
    metrics: String,
    /// Serve clients over TLS and require a client certificate.
    tls: bool,
}

/// A file of the etcd TLS test fixtures (`tests/fixtures/etcd-tls`).
pub fn etcd_tls(name: &str) -> String {
    format!(
        "{}/../../tests/fixtures/etcd-tls/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

impl Etcd {
    pub fn start() -> Etcd {
        Self::start_with(false)
    }

    /// A member whose client port speaks TLS with the fixtures' server certificate and
    /// accepts only clients with a certificate of the fixtures' CA.
    pub fn start_tls() -> Etcd {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Etcd {
        let mut e = Etcd {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            client: super::restartable_loopback_addr(),
            peer: super::restartable_loopback_addr(),
            metrics: super::restartable_loopback_addr(),
            tls,
        };
        e.run();
        e
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.client)
    }

    /// Starts (or restarts) the member on the same ports and data, and waits until healthy.
    pub fn run(&mut self) {
        let peer = format!("http://{}", self.peer);
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).unwrap();
        let mut cmd = Command::new(etcd_binary());
        cmd.args(["--name", "t", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &self.url()])
            .args(["--advertise-client-urls", &self.url()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .args(["--listen-metrics-urls", &format!("http://{}", self.metrics)]);
        if self.tls {
            cmd.args(["--cert-file", &etcd_tls("server.pem")])
                .args(["--key-file", &etcd_tls("server.key")])
                .args(["--trusted-ca-file", &etcd_tls("ca.pem")])
                .arg("--client-cert-auth");
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let health = format!("http://{}/health", self.metrics);
        while Instant::now() < deadline {
            if let Ok(r) = raw::blocking_get(&health)
                && r.contains("true")
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd did not become healthy; log in {:?}", self.dir.path());
    }

    pub fn kill(&mut self) {
        reap(&mut self.child);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A blocking GET over a plain socket (setup code runs outside the runtime).
mod raw {
    use std::io::{Read, Write};

    pub fn blocking_get(url: &str) -> std::io::Result<String> {
        let rest = url.trim_start_matches("http://");
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let mut s = std::net::TcpStream::connect(host)?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
        write!(s, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }
}
