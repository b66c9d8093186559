//! `store-bench`: throughput and latency of the store client, in the spirit of Mooncake's
//! store benchmark (`MooncakeDistributedStore` put/get), with its own master and, when asked,
//! a separate storage node process.
//!
//! ```text
//! store-bench                                   # master in a child process, the bench client holds the segment
//! store-bench --storage node --moongate target/release/moongate   # + a `moongate store` process holding it
//! store-bench --master http://10.0.0.1:30000 --storage external   # an existing master and nodes
//! ```
//!
//! Against a master of its own cluster it needs nothing more; elsewhere give the cluster's
//! secret (`--transfer-secret-file`), or the master's `--store-api-key`, and for an
//! `https://` master its CA (`--master-ca-cert`).
//!
//! For each value size (`--sizes`, default 4K,1M,16M) it runs `put`, `get`, `put_from`,
//! `get_into` and their batch forms (`--batch` values per call), `--rounds` times, and
//! prints ops/s (values/s for batches), GB/s (10^9 bytes/s), latency percentiles per call,
//! the bytes the process allocated per value (a counting allocator; the master and the node
//! are other processes, so this is the client alone) and whether every byte read back was
//! right. Every value carries its index in its first 8 bytes over a shared random body, so
//! a wrong, stale or torn object fails verification. Keys are removed between operations.

use std::alloc::System;
use std::io::Write;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use kvclient::{BufRange, ClientConfig, StoreClient, StoreError};
use kvclient::{Prefault, Protocol, parse_size};
use kvmaster::{MasterConfig, MasterServer};
use nodes::{after, spawn_ready};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

mod nodes;
mod values;
use values::{body, is_value, spot_check, stamp, stamp_spans};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Run the benchmark.
    Bench,
    /// Serve a master on `--listen` until SIGINT/SIGTERM (the bench spawns this).
    Master,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Storage {
    /// The bench client contributes the segment: every byte stays in this process.
    #[value(name = "self")]
    Own,
    /// A `moongate store` process (from `--moongate`) holds the segment; the client is pure.
    Node,
    /// Storage nodes already mounted at `--master`; the client is pure.
    External,
}

/// Store client benchmark (put / get / put_from / get_into and batch forms).
#[derive(Debug, Clone, Parser)]
#[command(version, about)]
struct Args {
    /// What this process does.
    #[arg(long, value_enum, default_value_t = Role::Bench)]
    role: Role,
    /// Master URL, or `spawn` to run one in a child process.
    #[arg(long, default_value = "spawn")]
    master: String,
    /// Listen address of a spawned master (and of `--role master`).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// Who holds the segment.
    #[arg(long, value_enum, default_value_t = Storage::Own)]
    storage: Storage,
    /// The `moongate` binary for `--storage node`.
    #[arg(long, default_value = "target/release/moongate")]
    moongate: String,
    /// Segment size of the holder (the bench client or the node).
    #[arg(long, default_value = "3G", value_parser = parse_size)]
    segment_size: u64,
    /// When the holder's segment and the copy buffers are faulted in (a bare `--prefault`:
    /// at start; default: in the background right after start, as a client does).
    #[arg(long, value_enum, default_value_t = Prefault::Background, num_args = 0..=1,
        default_missing_value = "start")]
    prefault: Prefault,
    /// Transport of the client and the node.
    #[arg(long, value_enum, default_value_t = Protocol::Auto)]
    protocol: Protocol,
    /// Value sizes.
    #[arg(long, value_delimiter = ',', default_value = "4K,1M,16M", value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Values per operation and size in one round; default: 4000 for values up to 64 KiB,
    /// 400 up to 4 MiB, 32 above.
    #[arg(long)]
    ops: Option<usize>,
    /// Values per batch call (capped so a batch moves at most 256 MiB).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Rounds; figures are the median over rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Operations to run (default all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Store clients in this process, each with its own transfer engine, connections and
    /// copy buffer (one per SGLang TP rank is the real shape), running every operation at
    /// the same time on their own keys; figures are their aggregate, plus the slowest and
    /// fastest client. With more than one, values read are spot-checked (both stamped ends
    /// and one 4 KiB page each, `spot-ok`) rather than compared byte for byte (`ok`), so
    /// that the checks do not take the CPU the other clients' timed calls need.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Copy buffer of each client, which also bounds its idle value buffers (default: 1 GiB
    /// shared out among the clients, at least 64 MiB each, so that eight clients do not
    /// hold 16 GiB resident). Supports K/M/G.
    #[arg(long, value_parser = parse_size)]
    local_buffer_size: Option<u64>,
    /// Storage nodes for `--storage node`, each holding `--segment-size`.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// Runtime worker threads of the client(s), or of the master with `--role master`
    /// (1: a single-threaded runtime; default: 1, or one per client up to the cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Runtime worker threads of a spawned master.
    #[arg(long, default_value_t = 1)]
    master_threads: usize,
    /// Microseconds a client's master call polls for its answer before sleeping (0: never;
    /// `transfer::busy_poll`).
    #[arg(long, default_value_t = kvclient::DEFAULT_RPC_BUSY_POLL_US)]
    rpc_busy_poll_us: u64,
    /// Microseconds a (spawned) master's connection polls for its next request after an
    /// answer (0: never).
    #[arg(long, default_value_t = kvmaster::busy_poll::DEFAULT_BUSY_POLL_US)]
    master_busy_poll_us: u64,
    /// Bytes of segment space each client holds reserved for its next puts (0: every put is
    /// put-start and put-end; `ClientConfig::put_reserve_bytes`). Supports K/M/G.
    #[arg(long, value_parser = kvclient::parse_size, default_value_t = kvclient::DEFAULT_PUT_RESERVE_BYTES)]
    put_reserve_bytes: u64,
    /// Also print each result as one JSON line (`RESULT {...}`).
    #[arg(long)]
    json: bool,
    /// With `--storage node`: start the nodes only once the client's memory is resident
    /// and measure them from the moment they report their segment mounted; prints each
    /// operation's first round (a node started just before) beside the median of the
    /// later rounds (the same node, warm).
    #[arg(long)]
    cold_node: bool,
    /// The cluster secret file of the client and the node it spawns (default: the
    /// variable's file, else the per-user one).
    #[arg(long, env = kvclient::env::TRANSFER_SECRET_FILE)]
    transfer_secret_file: Option<std::path::PathBuf>,
    /// The master's store key (default: derived from the cluster secret).
    #[arg(long, env = kvclient::env::STORE_API_KEY, hide_env_values = true)]
    store_api_key: Option<trust::Secret>,
    /// PEM CA file trusted for an `https://` `--master`.
    #[arg(long, env = kvclient::env::MASTER_CA_CERT)]
    master_ca_cert: Option<std::path::PathBuf>,
}

const OPS: [&str; 8] = [
    "put",
    "get",
    "put_from",
    "get_into",
    "batch_put",
    "batch_get",
    "batch_put_from",
    "batch_get_into",
];

/// One measured (operation, size) over all rounds.
#[derive(Default)]
struct Case {
    /// Values per second of each round (all clients together).
    rates: Vec<f64>,
    /// Values per second of each client in each round.
    client_rates: Vec<f64>,
    /// Latency of each call, ns.
    lat: Vec<u64>,
    values: usize,
    alloc_bytes: u64,
    errors: usize,
    bad: usize,
}

struct Bench {
    c: StoreClient,
    size: usize,
    body: Vec<u8>,
    /// Values read are spot-checked ([`spot_check`]) rather than compared byte for byte:
    /// with several clients on a few cores, one client's checks (a copy and a compare of
    /// every byte read) run in the middle of the others' timed calls, and took 11% of a
    /// 2-core host's CPU in an 8-client `get_into` run, which the reference
    /// (`transfer-bench`) does not spend.
    spot: bool,
    /// Registered source and destination: one value slot per batch item.
    src: transfer::RegisteredBuffer,
    dst: transfer::RegisteredBuffer,
    /// The copying puts' values: one per batch item, made (and faulted in) once.
    scratch: tokio::sync::Mutex<Vec<Vec<u8>>>,
    batch: usize,
}

impl Bench {
    /// Runs `op` over `n` values; returns (wall-clock seconds of the calls, per-call
    /// latencies, errors, bad values, bytes allocated during the calls).
    async fn run(&self, op: &str, prefix: &str, n: usize) -> Run {
        let size = self.size;
        let batched = op.starts_with("batch_");
        let per_call = if batched { self.batch } else { 1 };
        let keys: Vec<String> = (0..n).map(|i| format!("{prefix}/{i:08}")).collect();
        let mut lat = Vec::with_capacity(n.div_ceil(per_call));
        let (mut errors, mut bad) = (0, 0);
        let mut busy = Duration::ZERO;
        let mut alloc = 0u64;
        let mut scratch = self.scratch.lock().await;
        // Where a zero-copy read is checked: allocated once, since with several clients
        // one client's checks fall inside the others' timed calls (and allocation counts).
        let mut check = vec![0u8; size];
        for start in (0..n).step_by(per_call) {
            let end = (start + per_call).min(n);
            let idx = start..end;
            // The slots this call uses (values, source, destination): a batch uses the first
            // ones at once, single calls go through all of them one after the other. A loop
            // of single calls over one slot kept a 16 MiB value in this CPU's cache (260 MiB
            // of L3 on this project's machines) where a batch's values came from memory.
            let base = if batched { 0 } else { start % self.batch };
            let ks: Vec<&str> = keys[idx.clone()].iter().map(String::as_str).collect();
            // Prepare the values (untimed).
            match op {
                "put" | "batch_put" => {
                    for (s, i) in scratch[base..].iter_mut().zip(idx.clone()) {
                        stamp(s, i as u64);
                    }
                }
                "put_from" | "batch_put_from" => {
                    let mut v = [0u8; 16];
                    let (h, t) = stamp_spans(size);
                    for (slot, i) in idx.clone().enumerate() {
                        v[..8].copy_from_slice(&(i as u64).to_le_bytes());
                        v[8..].copy_from_slice(&(!(i as u64)).to_le_bytes());
                        let at = (base + slot) * size;
                        self.src.write_at(at, &v[..h]).expect("in range");
                        self.src
                            .write_at(at + size - t, &v[8..8 + t])
                            .expect("in range");
                    }
                }
                _ => {}
            }
            let region = Region::new(GLOBAL);
            let t = Instant::now();
            let results: Vec<Result<Option<bytes::Bytes>, StoreError>> = match op {
                "put" => vec![self.c.put(ks[0], &scratch[base]).await.map(|()| None)],
                "get" => vec![self.c.get(ks[0]).await.map(Some)],
                "put_from" => vec![
                    self.c
                        .put_from(ks[0], BufRange::new(&self.src, base * size, size))
                        .await
                        .map(|()| None),
                ],
                "get_into" => vec![
                    self.c
                        .get_into(ks[0], BufRange::new(&self.dst, base * size, size))
                        .await
                        .map(|_| None),
                ],
                "batch_put" => {
                    let items: Vec<(&str, &[u8])> = ks
                        .iter()
                        .zip(scratch.iter())
                        .map(|(k, v)| (*k, v.as_slice()))
                        .collect();
                    self.c
                        .batch_put(&items)
                        .await
                        .into_iter()
                        .map(|r| r.map(|()| None))
                        .collect()
                }
                "batch_get" => self
                    .c
                    .batch_get(&ks)
                    .await
                    .into_iter()
                    .map(|r| r.map(Some))
                    .collect(),
                "batch_put_from" => {
                    let items: Vec<(&str, BufRange<'_>)> = ks
                        .iter()
                        .enumerate()
                        .map(|(j, k)| (*k, BufRange::new(&self.src, j * size, size)))
                        .collect();
                    self.c
                        .batch_put_from(&items)
                        .await
                        .into_iter()
                        .map(|r| r.map(|()| None))
                        .collect()
                }
                "batch_get_into" => {
                    let items: Vec<(&str, BufRange<'_>)> = ks
                        .iter()
                        .enumerate()
                        .map(|(j, k)| (*k, BufRange::new(&self.dst, j * size, size)))
                        .collect();
                    self.c
                        .batch_get_into(&items)
                        .await
                        .into_iter()
                        .map(|r| r.map(|_| None))
                        .collect()
                }
                other => unreachable!("unknown op {other}"),
            };
            let d = t.elapsed();
            alloc += region.change().bytes_allocated as u64;
            busy += d;
            lat.push(d.as_nanos() as u64);
            // Verify (untimed): every value read must be exactly the one written.
            for (j, (r, i)) in results.into_iter().zip(idx).enumerate() {
                match r {
                    Err(e) => {
                        if errors == 0 {
                            eprintln!("{op} {}: {e}", keys[i]);
                        }
                        errors += 1;
                    }
                    Ok(Some(v)) if self.spot => {
                        let read = |at: usize, out: &mut [u8]| {
                            v.get(at..at + out.len())
                                .map(|b| out.copy_from_slice(b))
                                .is_some()
                        };
                        let ok = v.len() == size && spot_check(&self.body, i as u64, read);
                        bad += usize::from(!ok);
                    }
                    Ok(Some(v)) => bad += usize::from(!is_value(&v, &self.body, i as u64)),
                    Ok(None) if op.ends_with("get_into") && self.spot => {
                        let at = (base + j) * size;
                        let read =
                            |off: usize, out: &mut [u8]| self.dst.read_at(at + off, out).is_ok();
                        bad += usize::from(!spot_check(&self.body, i as u64, read));
                    }
                    Ok(None) if op.ends_with("get_into") => {
                        self.dst
                            .read_at((base + j) * size, &mut check)
                            .expect("in range");
                        bad += usize::from(!is_value(&check, &self.body, i as u64));
                    }
                    Ok(None) => {}
                }
            }
        }
        (busy.as_secs_f64(), lat, errors, bad, alloc)
    }
}

fn default_ops(size: u64) -> usize {
    match size {
        0..=65_536 => 4000,
        65_537..=4_194_304 => 400,
        _ => 32,
    }
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn human(size: u64) -> String {
    match size {
        s if s >= 1 << 30 && s % (1 << 30) == 0 => format!("{}G", s >> 30),
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{}M", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{}K", s >> 10),
        s => s.to_string(),
    }
}

async fn bench(args: Args) -> Result<bool, String> {
    if args.storage == Storage::External && args.master == "spawn" {
        return Err("--storage external needs --master URL (a master with storage nodes)".into());
    }
    // The master: spawned (another process, like Mooncake's mooncake_master) or given.
    let mut _master = None;
    let master_url = if args.master == "spawn" {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let (p, words) = spawn_ready(Command::new(exe).args([
            "--role",
            "master",
            "--listen",
            &args.listen.to_string(),
            "--threads",
            &args.master_threads.to_string(),
            "--master-busy-poll-us",
            &args.master_busy_poll_us.to_string(),
        ]))?;
        _master = Some(p);
        after(&words, "url").ok_or("no url in the master's ready line")?
    } else {
        args.master.clone()
    };
    let mut _nodes = Vec::new();
    let client_segment = match args.storage {
        Storage::Own => args.segment_size,
        Storage::External => 0,
        Storage::Node => {
            if !args.cold_node {
                _nodes = nodes::spawn(&args, &master_url)?;
            }
            0
        }
    };
    let cfg = ClientConfig {
        protocol: args.protocol,
        prefault: args.prefault,
        local_buffer_size: args
            .local_buffer_size
            .unwrap_or(((1u64 << 30) / args.clients.max(1) as u64).max(64 << 20)),
        transfer_secret_file: args.transfer_secret_file.clone(),
        store_api_key: args.store_api_key.clone(),
        master_ca_cert: args.master_ca_cert.clone(),
        rpc_busy_poll_us: args.rpc_busy_poll_us,
        put_reserve_bytes: args.put_reserve_bytes,
        ..ClientConfig::local(&master_url, client_segment)
    };
    let mut clients = Vec::with_capacity(args.clients.max(1));
    for _ in 0..args.clients.max(1) {
        clients.push(
            StoreClient::connect(cfg.clone())
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    // A client's memory (its segment with `--storage self`, its copy and value buffers) is
    // faulted in in the background after start, on idle-priority threads, seconds a GiB on
    // this project's VMs; an SGLang process has long finished by its first request (model
    // loading takes far longer). Measure that client, not the first seconds of one: wait
    // for the fault-in (polling stays off while it runs) and say how long it took. The
    // nodes' segments (`--storage node`) stay cold: their first writes are measured (with
    // `--cold-node` the nodes start only now).
    let t = std::time::Instant::now();
    let warm = tokio::task::spawn_blocking(|| {
        transfer::memory::wait_for_background_prefaults(std::time::Duration::from_secs(60))
    })
    .await
    .map_err(|e| e.to_string())?;
    eprintln!(
        "client memory faulted in {} {:.1} s",
        if warm { "after" } else { "still not after" },
        t.elapsed().as_secs_f64()
    );
    if args.cold_node && args.storage == Storage::Node {
        _nodes = nodes::spawn(&args, &master_url)?;
    }
    let c = clients[0].clone();
    let ops: Vec<&str> = OPS
        .iter()
        .copied()
        .filter(|o| args.only.is_empty() || args.only.iter().any(|x| x == o))
        .collect();
    let mut table: Vec<(String, u64, usize, Case)> = Vec::new();
    for &size in &args.sizes {
        let size_us = usize::try_from(size).map_err(|e| e.to_string())?;
        let batch = args.batch.clamp(1, ((256 << 20) / size_us).max(1));
        let n = args.ops.unwrap_or_else(|| default_ops(size));
        let mut benches = Vec::with_capacity(clients.len());
        let spot = clients.len() > 1;
        for c in &clients {
            let c = c.clone();
            // The caller's buffers are touched before timing: their first-touch page faults
            // are the application's, not the store's. Off the runtime's threads: hundreds
            // of MiB of fresh memory take seconds (on a VM whose host backs memory lazily,
            // 8-13 s a GiB), and a current-thread runtime blocked that long misses the
            // client's heartbeats until the master expires it and drops its objects.
            let b = tokio::task::spawn_blocking(move || -> Result<Bench, String> {
                let body = body(size_us);
                let b = Bench {
                    src: c.alloc(size_us * batch).map_err(|e| e.to_string())?,
                    dst: c.alloc(size_us * batch).map_err(|e| e.to_string())?,
                    scratch: tokio::sync::Mutex::new(vec![body.clone(); batch]),
                    c,
                    spot,
                    size: size_us,
                    body,
                    batch,
                };
                for j in 0..batch {
                    b.src
                        .write_at(j * size_us, &b.body)
                        .map_err(|e| e.to_string())?;
                    b.dst
                        .write_at(j * size_us, &b.body)
                        .map_err(|e| e.to_string())?;
                }
                Ok(b)
            })
            .await
            .map_err(|e| e.to_string())??;
            benches.push(std::sync::Arc::new(b));
        }
        let mut cases: Vec<Case> = ops.iter().map(|_| Case::default()).collect();
        for round in 0..args.rounds {
            // Each put form writes its own keys (objects are immutable); each get reads the
            // keys of the put form before it.
            let mut written: Vec<String> = Vec::new();
            for (o, op) in ops.iter().enumerate() {
                let prefix = format!("bench/{round}/{size}/{op}");
                if op.contains("get") && written.is_empty() {
                    run_all(&benches, "batch_put_from", &prefix, n).await?;
                    written.push(prefix.clone());
                }
                let prefix = if op.contains("put") {
                    written.push(prefix.clone());
                    prefix
                } else {
                    written.last().cloned().unwrap_or(prefix)
                };
                let runs = run_all(&benches, op, &prefix, n).await?;
                let case = &mut cases[o];
                // Clients run at once, each timing only its calls (not preparing or checking
                // values): together they move the sum of their rates.
                case.rates.push(runs.iter().map(|r| n as f64 / r.0).sum());
                for (secs, lat, errors, bad, alloc) in runs {
                    case.client_rates.push(n as f64 / secs);
                    case.lat.extend(lat);
                    case.values += n;
                    case.alloc_bytes += alloc;
                    case.errors += errors;
                    case.bad += bad;
                }
            }
            // Free the round's objects (forced: the gets hold read leases).
            for prefix in &written {
                for ci in 0..benches.len() {
                    let keys: Vec<String> =
                        (0..n).map(|i| format!("{prefix}/c{ci}/{i:08}")).collect();
                    for chunk in keys.chunks(4096) {
                        c.batch_remove(chunk, true).await;
                    }
                }
            }
        }
        for (op, case) in ops.iter().zip(cases) {
            table.push(((*op).to_owned(), size, batch, case));
        }
    }
    let mode = match args.storage {
        Storage::Own => "single-client",
        _ => "remote-node",
    };
    let nclients = clients.len();
    println!(
        "store-bench: {mode}, protocol {:?}, {} round(s), {nclients} client(s), {} node(s), medians over rounds; latency per call; values/s and GB/s of all clients together, then the slowest and fastest client's GB/s",
        args.protocol,
        args.rounds,
        if args.storage == Storage::Node {
            args.nodes.max(1)
        } else {
            0
        }
    );
    println!(
        "{:<15} {:>6} {:>5} {:>11} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>7}",
        "op",
        "size",
        "batch",
        "values/s",
        "GB/s",
        "min GB/s",
        "max GB/s",
        "p50 us",
        "p99 us",
        "max us",
        "alloc B/v",
        "verify"
    );
    let mut all_ok = true;
    for (op, size, batch, mut case) in table {
        let cold = args.cold_node.then(|| cold_and_warm(&case.rates)).flatten();
        case.rates.sort_by(f64::total_cmp);
        case.client_rates.sort_by(f64::total_cmp);
        case.lat.sort_unstable();
        let rate = case.rates[case.rates.len() / 2];
        let gb = |r: f64| r * size as f64 / 1e9;
        let (cmin, cmax) = (
            gb(case.client_rates[0]),
            gb(case.client_rates[case.client_rates.len() - 1]),
        );
        let ok = case.errors == 0 && case.bad == 0;
        all_ok &= ok;
        let batch = if op.starts_with("batch") { batch } else { 1 };
        let verify = if ok {
            // Spot-checked (several clients) or compared byte for byte.
            if nclients > 1 { "spot-ok" } else { "ok" }.to_owned()
        } else {
            format!("{}E/{}B", case.errors, case.bad)
        };
        let alloc_per_value = case.alloc_bytes / case.values.max(1) as u64;
        println!(
            "{:<15} {:>6} {:>5} {:>11.0} {:>8.3} {:>9.3} {:>9.3} {:>9.1} {:>9.1} {:>9.1} {:>10} {:>7}",
            op,
            human(size),
            batch,
            rate,
            gb(rate),
            cmin,
            cmax,
            pct(&case.lat, 0.5),
            pct(&case.lat, 0.99),
            pct(&case.lat, 1.0),
            alloc_per_value,
            verify
        );
        if let Some((first, later)) = cold {
            println!(
                "  {op} {}: node just started {:.3} GB/s, warm {:.3} GB/s (median of later rounds), ratio {:.2}",
                human(size),
                first * size as f64 / 1e9,
                later * size as f64 / 1e9,
                first / later
            );
        }
        if args.json {
            println!(
                "RESULT {{\"bench\":\"store-bench\",\"mode\":\"{mode}\",\"protocol\":\"{:?}\",\"op\":\"{op}\",\"value_bytes\":{size},\"batch\":{batch},\"clients\":{nclients},\"values_per_s\":{rate:.1},\"GBps\":{:.3},\"client_min_GBps\":{cmin:.3},\"client_max_GBps\":{cmax:.3},\"p50_us\":{:.1},\"p99_us\":{:.1},\"alloc_bytes_per_value\":{alloc_per_value},\"errors\":{},\"bad\":{}}}",
                args.protocol,
                rate * size as f64 / 1e9,
                pct(&case.lat, 0.5),
                pct(&case.lat, 0.99),
                case.errors,
                case.bad
            );
        }
    }
    let _ = std::io::stdout().flush();
    for c in &clients {
        c.close().await.map_err(|e| e.to_string())?;
    }
    Ok(all_ok)
}

/// A round's rate when the node had just started (the first round) and the median of the
/// later rounds' (none with fewer than two rounds).
fn cold_and_warm(rates: &[f64]) -> Option<(f64, f64)> {
    let (first, later) = rates.split_first()?;
    let mut later = later.to_vec();
    later.sort_by(f64::total_cmp);
    Some((*first, *later.get(later.len() / 2)?))
}

/// What one client's run of an operation measured: seconds in calls, per-call latencies,
/// errors, bad values, bytes allocated.
type Run = (f64, Vec<u64>, usize, usize, u64);

/// Runs `op` over `n` values on every client at once (client `i` on keys
/// `{prefix}/c{i}/...`); answers each client's run.
async fn run_all(
    benches: &[std::sync::Arc<Bench>],
    op: &'static str,
    prefix: &str,
    n: usize,
) -> Result<Vec<Run>, String> {
    let tasks: Vec<_> = benches
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let (b, prefix) = (b.clone(), format!("{prefix}/c{i}"));
            tokio::spawn(async move { b.run(op, &prefix, n).await })
        })
        .collect();
    let mut runs = Vec::with_capacity(tasks.len());
    for task in tasks {
        runs.push(
            task.await
                .map_err(|e| format!("a client task failed: {e}"))?,
        );
    }
    Ok(runs)
}

async fn serve_master(listen: std::net::SocketAddr, busy_poll: Duration) -> Result<bool, String> {
    let m = MasterServer::start_with(MasterConfig::default(), listen, busy_poll)
        .await
        .map_err(|e| e.to_string())?;
    println!("store-bench master ready: url {}", m.url());
    let _ = std::io::stdout().flush();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    m.stop(Duration::from_secs(2)).await;
    Ok(true)
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = *args.threads.get_or_insert(if args.clients > 1 {
        args.clients.min(cores)
    } else {
        1
    });
    // `RUST_LOG=kvclient=debug` prints each pipeline's per-step timings.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let rt = match (args.role, threads) {
        (Role::Master, 0 | 1) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        (Role::Master, n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
        (Role::Bench, 0 | 1) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        (Role::Bench, n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
    .expect("tokio runtime");
    let r = match args.role {
        Role::Master => rt.block_on(serve_master(
            args.listen,
            Duration::from_micros(args.master_busy_poll_us),
        )),
        Role::Bench => rt.block_on(bench(args)),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("store-bench: some values failed or read back wrong");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("store-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
