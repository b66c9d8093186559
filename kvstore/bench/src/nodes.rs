//! The processes store-bench starts: the master (`--role master` of this binary) and the
//! storage nodes (`moongate store`), each killed when dropped; and the wait for a node to
//! report its segment mounted (`--cold-node` measures a node from that moment).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::ValueEnum;

use crate::Args;

/// A child process killed (SIGTERM, then SIGKILL) when dropped.
pub struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd`, returns it with the words of its first stdout line.
pub fn spawn_ready(cmd: &mut Command) -> Result<(Proc, Vec<String>), String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawn {cmd:?}: {e}"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.is_empty() {
        return Err(format!("{cmd:?} exited before it was ready"));
    }
    Ok((
        Proc(child),
        line.split_whitespace().map(str::to_owned).collect(),
    ))
}

/// The word after `key` in a ready line.
pub fn after(words: &[String], key: &str) -> Option<String> {
    words.iter().skip_while(|w| *w != key).nth(1).cloned()
}

/// Starts `--nodes` storage nodes on `master_url` and waits until each reports its segment
/// mounted; says how long that took after the process was started.
pub fn spawn(args: &Args, master_url: &str) -> Result<Vec<Proc>, String> {
    let mut nodes = Vec::new();
    for _ in 0..args.nodes.max(1) {
        let mut node = Command::new(&args.moongate);
        node.args([
            "store",
            "--master",
            master_url,
            "--segment-size",
            &args.segment_size.to_string(),
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--protocol",
            args.protocol.to_possible_value().expect("named").get_name(),
            "--prefault",
            args.prefault.to_possible_value().expect("named").get_name(),
        ]);
        if let Some(f) = &args.transfer_secret_file {
            node.arg("--transfer-secret-file").arg(f);
        }
        if let Some(f) = &args.master_ca_cert {
            node.arg("--master-ca-cert").arg(f);
        }
        if let Some(k) = &args.store_api_key {
            // In the environment, not on a command line other users can read.
            node.env(kvclient::env::STORE_API_KEY, k.expose());
        }
        let started = Instant::now();
        let (p, words) = spawn_ready(&mut node)?;
        let http = after(&words, "http").ok_or("no http address in the node's ready line")?;
        wait_mounted(&http, Duration::from_secs(300))?;
        eprintln!(
            "storage node: segment {} mounted {:.2} s after its start",
            after(&words, "segment").unwrap_or_default(),
            started.elapsed().as_secs_f64()
        );
        nodes.push(p);
    }
    Ok(nodes)
}

/// Polls the node's `GET /health` at `http` (200 once its segment is mounted).
fn wait_mounted(http: &str, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if health_ok(http) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the node at {http} did not mount within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `GET /health` on `addr` answers 200.
fn health_ok(addr: &str) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(
        s,
        "GET /health HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}
