//! `transfer-bench`: throughput and request-rate benchmark of the transfer engine, in the
//! spirit of Mooncake's `transfer_engine_bench`.
//!
//! ```text
//! transfer-bench --mode target    --listen 127.0.0.1:41000 --buffer-size 1G --protocol tcp
//! transfer-bench --mode initiator --segment 127.0.0.1:41000 --protocol tcp --op write \
//!                --block-size 64M --batch-size 1 --threads 1 --duration 5
//! transfer-bench --mode memcpy --block-size 64M --duration 5      # single-thread reference
//! transfer-bench --mode target --location cuda:0 ...    # the buffer in GPU memory (either side)
//! transfer-bench --mode memcpy --location cuda:0 ...    # the device's own copy bandwidth
//! ```
//!
//! The target fills its buffer with a position-derived pattern and serves until SIGINT or
//! SIGTERM (then shuts down gracefully). The initiator runs `--threads` submitters on a
//! runtime of `--threads` threads (one thread: a single-threaded runtime), each looping on batches of
//! `--batch-size` requests of `--block-size` bytes over its own part of the buffer, prints a
//! table (total, and min / median / max over time windows) and finally verifies the bytes:
//! after writes it reads back every written range and compares; before reads it writes its
//! pattern to the target and clears its own buffer, after them it checks the buffer holds
//! the pattern again. GB/s are 10^9 bytes per second.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use transfer::{
    AllocOptions, DeviceBackend, EngineConfig, Location, MetadataConfig, RdmaMode,
    RegisteredBuffer, Segment, TransferEngine, TransferRequest,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Target,
    Initiator,
    Memcpy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Protocol {
    Tcp,
    Shm,
    Rdma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Operation {
    Read,
    Write,
}

/// Transfer engine benchmark (target / initiator / memcpy reference).
#[derive(Debug, Clone, Parser)]
#[command(version, about)]
struct Args {
    /// Role of this process.
    #[arg(long, value_enum)]
    mode: Mode,
    /// Listen address (target; the initiator listens on an ephemeral port of the same host).
    #[arg(long, default_value_t = EngineConfig::default().listen)]
    listen: std::net::SocketAddr,
    /// Segment name of the target (initiator).
    #[arg(long)]
    segment: Option<String>,
    /// Metadata: `p2p` or Mooncake's HTTP metadata URL (`http://host:port/metadata`).
    #[arg(long, default_value = "p2p")]
    metadata: MetadataConfig,
    /// Transport: tcp, shm (same host; the target allocates shared memory, device memory
    /// goes through CUDA IPC) or rdma.
    #[arg(long, value_enum, default_value_t = Protocol::Tcp)]
    protocol: Protocol,
    /// Where this side's buffer lives: `cpu`, or `cuda:N` (GPU memory of device N, staged
    /// over TCP, or through CUDA IPC with `--protocol shm`). In memcpy mode `cuda:N` measures
    /// the device's own copy bandwidth.
    #[arg(long, default_value_t = Location::Host)]
    location: Location,
    /// Operation issued by the initiator.
    #[arg(long, value_enum, default_value_t = Operation::Write)]
    op: Operation,
    /// Bytes per request (suffixes K, M, G = KiB, MiB, GiB).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    block_size: usize,
    /// Requests per batch.
    #[arg(long, default_value_t = 1)]
    batch_size: usize,
    /// Submitting threads (initiator) or runtime worker threads (target).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Measured run time in seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Registered buffer size (target: served region; initiator: local buffer).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    buffer_size: usize,
    /// TCP connections per peer.
    #[arg(long, default_value_t = EngineConfig::default().lanes_per_peer)]
    lanes: usize,
    /// TCP slice size (suffixes as for --block-size).
    #[arg(long, default_value_t = EngineConfig::default().slice_size, value_parser = parse_size)]
    slice_size: usize,
    /// Skip the final byte verification.
    #[arg(long)]
    no_verify: bool,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
    /// The cluster secret file both sides authenticate with (default: the per-user
    /// `~/.config/moongate/transfer-secret`, created on first use).
    #[arg(long, env = transfer::auth::SECRET_FILE_ENV)]
    transfer_secret_file: Option<std::path::PathBuf>,
}

/// A size flag: [`transfer::parse_size`], and not zero.
fn parse_size(s: &str) -> Result<usize, String> {
    match transfer::parse_size(s)? {
        0 => Err(format!("bad size {s:?}: zero")),
        n => usize::try_from(n).map_err(|_| format!("bad size {s:?}: too large")),
    }
}

const TARGET_SEED: u64 = 0x7a67_e7b0_0000_0001;
const INITIATOR_SEED: u64 = 0x1417_1a70_0000_0002;

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The bytes at `offset..offset + out.len()` of a buffer filled with `seed`: word `w` (8
/// bytes, little endian) is `splitmix(seed ^ w)`, so any range can be recomputed.
fn pattern_chunk(seed: u64, offset: usize, out: &mut [u8]) {
    let mut o = offset;
    let mut i = 0;
    while i < out.len() {
        let word = splitmix(seed ^ (o / 8) as u64).to_le_bytes();
        let skip = o % 8;
        let n = (8 - skip).min(out.len() - i);
        out[i..i + n].copy_from_slice(&word[skip..skip + n]);
        i += n;
        o += n;
    }
}

fn fill_pattern(buf: &RegisteredBuffer, seed: u64) -> transfer::Result<()> {
    let mut chunk = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < buf.len() {
        let n = chunk.len().min(buf.len() - off);
        pattern_chunk(seed, off, &mut chunk[..n]);
        buf.write_at(off, &chunk[..n])?;
        off += n;
    }
    Ok(())
}

fn engine_config(args: &Args, listen: std::net::SocketAddr) -> EngineConfig {
    EngineConfig {
        listen,
        metadata: args.metadata.clone(),
        lanes_per_peer: args.lanes,
        slice_size: args.slice_size,
        shm: args.protocol == Protocol::Shm,
        device_ipc: args.protocol == Protocol::Shm,
        rdma: if args.protocol == Protocol::Rdma {
            RdmaMode::On
        } else {
            RdmaMode::Off
        },
        transfer_secret_file: args.transfer_secret_file.clone(),
        ..EngineConfig::default()
    }
}

/// This side's buffer of `len` bytes, where `--location` says (`opts` for host memory).
fn alloc_buffer(
    engine: &TransferEngine,
    args: &Args,
    len: usize,
    opts: AllocOptions,
) -> transfer::Result<RegisteredBuffer> {
    match args.location {
        Location::Host => engine.alloc_with(len, opts),
        Location::Cuda(device) => engine.alloc_device(device, len),
    }
}

fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
}

/// `println!` that ignores a closed standard output (`transfer-bench ... | head` must not
/// panic on a broken pipe: the reader has what it wanted).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let result = match args.mode {
        Mode::Target => runtime(args.threads)
            .map_err(|e| e.to_string())
            .and_then(|rt| rt.block_on(target(&args))),
        Mode::Initiator => initiator(&args),
        Mode::Memcpy => match args.location {
            Location::Host => {
                memcpy(&args);
                Ok(())
            }
            Location::Cuda(device) => memcpy_device(&args, device),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transfer-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn target(args: &Args) -> Result<(), String> {
    let engine = TransferEngine::new(engine_config(args, args.listen))
        .await
        .map_err(|e| e.to_string())?;
    let opts = AllocOptions {
        shared: args.protocol == Protocol::Shm,
        ..AllocOptions::default()
    };
    let buf = alloc_buffer(&engine, args, args.buffer_size, opts).map_err(|e| e.to_string())?;
    fill_pattern(&buf, TARGET_SEED).map_err(|e| e.to_string())?;
    engine.publish().await.map_err(|e| e.to_string())?;
    out!(
        "transfer-bench target ready: segment {} buffer {:#x} len {} protocol {:?} location {}",
        engine.segment_name(),
        buf.addr(),
        buf.len(),
        args.protocol,
        args.location
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    engine.shutdown().await;
    drop(buf);
    Ok(())
}

/// One submitter's measurements: (completion time since start, bytes, requests, latency).
type Samples = Vec<(Duration, u64, u64, Duration)>;

struct Plan {
    engine: TransferEngine,
    local: RegisteredBuffer,
    seg: Segment,
    remote_base: u64,
    part: usize,
    blocks: usize,
}

fn initiator(args: &Args) -> Result<(), String> {
    let name = args
        .segment
        .clone()
        .ok_or("--segment is required in initiator mode")?;
    if args.threads == 0 || args.batch_size == 0 {
        return Err("--threads and --batch-size must be at least 1".into());
    }
    let rt = runtime(args.threads).map_err(|e| e.to_string())?;
    rt.block_on(async {
        let args = Arc::new(args.clone());
        let listen = std::net::SocketAddr::new(args.listen.ip(), 0);
        let engine = TransferEngine::new(engine_config(&args, listen))
            .await
            .map_err(|e| e.to_string())?;
        // The first open: connect, authenticate (handshake) and fetch the descriptor.
        let opening = Instant::now();
        let seg = engine
            .open_segment(&name)
            .await
            .map_err(|e| e.to_string())?;
        out!(
            "open_segment_ms: {:.3}",
            opening.elapsed().as_secs_f64() * 1e3
        );
        let region = seg
            .regions()
            .into_iter()
            .max_by_key(|r| r.len)
            .ok_or("the target has no registered region")?;
        let usable = (region.len as usize).min(args.buffer_size);
        let part = usable / args.threads;
        if part < args.block_size {
            return Err(format!(
                "buffer part {part} per thread is smaller than the block size {}",
                args.block_size
            ));
        }
        let local = alloc_buffer(
            &engine,
            &args,
            usable,
            AllocOptions {
                populate: true,
                ..AllocOptions::default()
            },
        )
        .map_err(|e| e.to_string())?;
        fill_pattern(&local, INITIATOR_SEED).map_err(|e| e.to_string())?;
        let plan = Arc::new(Plan {
            engine,
            local,
            seg,
            remote_base: region.addr,
            part,
            blocks: part / args.block_size,
        });
        if args.op == Operation::Read {
            // Reads are verified against bytes this run put there: write the pattern to the
            // target, then clear the local copy so only the reads can restore it.
            prepare_reads(&args, &plan).await?;
        }
        // Warm-up: connections, first touch of the target's pages.
        for t in 0..args.threads {
            run_batches(&args, &plan, t, Duration::ZERO, 2).await?;
        }
        let run = Duration::from_secs_f64(args.duration);
        let cpu0 = cpu_seconds();
        let start = Instant::now();
        let tasks: Vec<_> = (0..args.threads)
            .map(|t| {
                let (args, plan) = (args.clone(), plan.clone());
                tokio::spawn(async move { run_batches(&args, &plan, t, run, usize::MAX).await })
            })
            .collect();
        let mut samples: Samples = Vec::new();
        for task in tasks {
            samples.extend(task.await.map_err(|e| e.to_string())??);
        }
        report(
            &args,
            &name,
            &samples,
            start.elapsed(),
            cpu_seconds() - cpu0,
        );
        let st = plan.engine.stats();
        out!(
            "routes: tcp {} B, shm {} B, ipc {} B, rdma {} B, local {} B",
            st.tcp_bytes,
            st.shm_bytes,
            st.ipc_bytes,
            st.rdma_bytes,
            st.local_bytes
        );
        if !args.no_verify {
            let checked = verify(&args, &plan).await?;
            out!("verified: {checked} bytes match");
        }
        plan.engine.shutdown().await;
        Ok(())
    })
}

/// Submits batches for thread `t` until `run` elapsed (or `max_batches`), returns samples.
async fn run_batches(
    args: &Args,
    plan: &Plan,
    t: usize,
    run: Duration,
    max_batches: usize,
) -> Result<Samples, String> {
    let bs = args.block_size;
    let base = t * plan.part;
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut next = 0usize;
    for _ in 0..max_batches {
        if !run.is_zero() && start.elapsed() >= run {
            break;
        }
        let reqs: Vec<TransferRequest> = (0..args.batch_size)
            .map(|_| {
                let off = base + (next % plan.blocks) * bs;
                next += 1;
                let remote = plan.remote_base + off as u64;
                match args.op {
                    Operation::Write => {
                        TransferRequest::write(&plan.local, off, &plan.seg, remote, bs)
                    }
                    Operation::Read => {
                        TransferRequest::read(&plan.local, off, &plan.seg, remote, bs)
                    }
                }
            })
            .collect();
        let t0 = Instant::now();
        let batch = plan.engine.submit(reqs).await.map_err(|e| e.to_string())?;
        batch.wait().await.map_err(|e| e.to_string())?;
        samples.push((
            start.elapsed(),
            (bs * args.batch_size) as u64,
            args.batch_size as u64,
            t0.elapsed(),
        ));
    }
    Ok(samples)
}

async fn prepare_reads(args: &Args, plan: &Plan) -> Result<(), String> {
    let touched = plan.blocks * args.block_size;
    for t in 0..args.threads {
        let off = t * plan.part;
        let req = TransferRequest::write(
            &plan.local,
            off,
            &plan.seg,
            plan.remote_base + off as u64,
            touched,
        );
        plan.engine.transfer(req).await.map_err(|e| e.to_string())?;
    }
    let zeros = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < plan.local.len() {
        let n = zeros.len().min(plan.local.len() - off);
        plan.local
            .write_at(off, &zeros[..n])
            .map_err(|e| e.to_string())?;
        off += n;
    }
    Ok(())
}

/// Checks every byte the run touched.
async fn verify(args: &Args, plan: &Plan) -> Result<u64, String> {
    let bs = args.block_size;
    let touched = plan.blocks * bs;
    let mut checked = 0u64;
    let scratch = plan
        .engine
        .alloc(bs.min(64 << 20))
        .map_err(|e| e.to_string())?;
    let mut expect = vec![0u8; scratch.len()];
    let mut got = vec![0u8; scratch.len()];
    for t in 0..args.threads {
        let mut off = t * plan.part;
        let end = off + touched;
        while off < end {
            let n = scratch.len().min(end - off);
            match args.op {
                Operation::Write => {
                    let req = TransferRequest::read(
                        &scratch,
                        0,
                        &plan.seg,
                        plan.remote_base + off as u64,
                        n,
                    );
                    plan.engine.transfer(req).await.map_err(|e| e.to_string())?;
                    scratch
                        .read_at(0, &mut got[..n])
                        .map_err(|e| e.to_string())?;
                    plan.local
                        .read_at(off, &mut expect[..n])
                        .map_err(|e| e.to_string())?;
                }
                Operation::Read => {
                    plan.local
                        .read_at(off, &mut got[..n])
                        .map_err(|e| e.to_string())?;
                    pattern_chunk(INITIATOR_SEED, off, &mut expect[..n]);
                }
            }
            if got[..n] != expect[..n] {
                let at = got[..n]
                    .iter()
                    .zip(&expect[..n])
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                return Err(format!("verification failed at offset {}", off + at));
            }
            checked += n as u64;
            off += n;
        }
    }
    Ok(checked)
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

/// CPU time (user + system) this process used so far, in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn report(args: &Args, name: &str, samples: &Samples, elapsed: Duration, cpu_s: f64) {
    let secs = elapsed.as_secs_f64();
    let bytes: u64 = samples.iter().map(|s| s.1).sum();
    let reqs: u64 = samples.iter().map(|s| s.2).sum();
    let window = (elapsed / 20).max(Duration::from_millis(100));
    let nwin = ((elapsed.as_secs_f64() / window.as_secs_f64()).floor() as usize).max(1);
    let mut win_bytes = vec![0u64; nwin];
    let mut win_reqs = vec![0u64; nwin];
    for s in samples {
        let w = ((s.0.as_secs_f64() / window.as_secs_f64()) as usize).min(nwin - 1);
        win_bytes[w] += s.1;
        win_reqs[w] += s.2;
    }
    let ws = window.as_secs_f64();
    let gbps = stats(win_bytes.iter().map(|&b| b as f64 / ws / 1e9).collect());
    let rps = stats(win_reqs.iter().map(|&r| r as f64 / ws).collect());
    let lat = stats(samples.iter().map(|s| s.3.as_secs_f64() * 1e3).collect());
    let mean_lat =
        samples.iter().map(|s| s.3.as_secs_f64() * 1e3).sum::<f64>() / samples.len().max(1) as f64;
    let (total_gbps, total_rps) = (bytes as f64 / secs / 1e9, reqs as f64 / secs);
    out!(
        "transfer-bench: {:?} {:?} from {}, block {} B, batch {}, threads {}, {:.1} s, segment {name}",
        args.protocol,
        args.op,
        args.location,
        args.block_size,
        args.batch_size,
        args.threads,
        secs
    );
    out!(
        "{:<18}{:>12}{:>12}{:>12}{:>12}",
        "",
        "total",
        "min",
        "median",
        "max"
    );
    out!(
        "{:<18}{:>12.3}{:>12.3}{:>12.3}{:>12.3}",
        "GB/s",
        total_gbps,
        gbps.0,
        gbps.1,
        gbps.2
    );
    out!(
        "{:<18}{:>12.0}{:>12.0}{:>12.0}{:>12.0}",
        "requests/s",
        total_rps,
        rps.0,
        rps.1,
        rps.2
    );
    out!(
        "{:<18}{:>12.3}{:>12.3}{:>12.3}{:>12.3}",
        "batch ms (mean)",
        mean_lat,
        lat.0,
        lat.1,
        lat.2
    );
    let cpu_ms_per_gb = if bytes > 0 {
        cpu_s * 1e3 / (bytes as f64 / 1e9)
    } else {
        0.0
    };
    out!("cpu: {cpu_s:.2} s in this process ({cpu_ms_per_gb:.0} ms per GB)");
    if args.json {
        out!(
            "{{\"bench\":\"transfer-bench\",\"protocol\":\"{:?}\",\"op\":\"{:?}\",\"location\":\"{}\",\"block_bytes\":{},\"batch\":{},\"threads\":{},\"seconds\":{secs:.3},\"GBps\":{total_gbps:.4},\"GBps_min\":{:.4},\"GBps_median\":{:.4},\"GBps_max\":{:.4},\"req_per_s\":{total_rps:.1},\"batch_ms_median\":{:.4},\"cpu_s\":{cpu_s:.3}}}",
            args.protocol,
            args.op,
            args.location,
            args.block_size,
            args.batch_size,
            args.threads,
            gbps.0,
            gbps.1,
            gbps.2,
            lat.1
        );
    }
}

/// Single-thread memcpy of `--block-size` between two buffers: the reference for the
/// shared-memory transport.
fn memcpy(args: &Args) {
    let n = args.block_size;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src);
    let run = Duration::from_secs_f64(args.duration);
    let start = Instant::now();
    let mut samples: Samples = Vec::new();
    while start.elapsed() < run {
        let t0 = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        samples.push((start.elapsed(), n as u64, 1, t0.elapsed()));
    }
    report(args, "memcpy", &samples, start.elapsed(), 0.0);
}

/// Device-to-device copies of `--block-size` on `device`, one at a time on one stream: the
/// device's own copy bandwidth, the reference for CUDA IPC.
fn memcpy_device(args: &Args, device: u32) -> Result<(), String> {
    let cuda =
        transfer::device::cuda::Cuda::load(None).map_err(|e| format!("device memory: {e}"))?;
    let n = args.block_size;
    let src = cuda.alloc_device(device, n).map_err(|e| e.to_string())?;
    let dst = cuda.alloc_device(device, n).map_err(|e| e.to_string())?;
    let stream = cuda.stream(device).map_err(|e| e.to_string())?;
    let rt = runtime(1).map_err(|e| e.to_string())?;
    rt.block_on(async {
        let copy = || async {
            // SAFETY: two live allocations of `n` bytes on the device, held until after the
            // fence below resolved.
            unsafe { stream.copy(dst.addr(), src.addr(), n) }?;
            stream.fence()?.await
        };
        copy().await.map_err(|e| e.to_string())?;
        let run = Duration::from_secs_f64(args.duration);
        let start = Instant::now();
        let mut samples: Samples = Vec::new();
        while start.elapsed() < run {
            let t0 = Instant::now();
            copy().await.map_err(|e| e.to_string())?;
            samples.push((start.elapsed(), n as u64, 1, t0.elapsed()));
        }
        report(args, "device memcpy", &samples, start.elapsed(), 0.0);
        Ok(())
    })
}
