//! `master-scale`: how the KV master's cost grows with the objects it holds.
//!
//! One process, the master core called directly (no HTTP: the REST layer's cost per request
//! does not grow with the object count, and `master_rest` measures it). The master is filled
//! decade by decade, 1 k objects up to `--max` (10 M by default), over `--segments` mounted
//! segments, written by `--clients` clients, keys of 64 hex characters like SGLang HiCache's
//! page hashes. At each decade it measures:
//! - memory: heap bytes the master allocated per object (a counting allocator, the key
//!   included) and the process RSS;
//! - rates on one thread and p99 latencies of `put_start` + `put_end` (fresh keys, removed
//!   again), `get_replicas` and `exists` (random existing keys), and `get_replicas` on every
//!   core at once;
//! - HA takeover: a journaled master holding the same objects, its committed records handed
//!   to [`kvmaster::Master::restore`] as a new leader does after reading them back (the read
//!   from etcd is not in this figure);
//! - one eviction round on that restored master (`eviction_ratio` of the bytes, leases over).
//!
//! Rows are printed as they come and written to `--csv`; `--svg` draws them.
//!
//! Layout: [`journal`] (the takeover's in-memory log), the measurements here; the `curves`
//! crate draws them.

mod journal;

use std::alloc::System;
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kvmaster::master::{ClientId, Journal, ManualClock, ReplicateConfig, SegmentSpec};
use kvmaster::{Master, MasterConfig};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

use curves::{Panel, Series};
use journal::BenchJournal;

/// Every allocation counted, so the master's heap per object is measured, not estimated.
/// (The system allocator: `moongate` hosts the master on mimalloc, which `stats_alloc`
/// cannot wrap on stable Rust; the bytes asked for are the same.)
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes of each object (a 4 KiB page; the metadata does not depend on it).
const PAGE: u64 = 4096;
/// Fresh keys for the put measurements sit above every key a fill uses.
const FRESH: u64 = 1 << 48;
/// Objects per commit of the journaled master (a group commit's worth).
const COMMIT_EVERY: u64 = 4096;

#[derive(Parser, Debug)]
#[command(about = "How the KV master's cost grows with the objects it holds")]
struct Args {
    /// Objects at the last decade (decades from 1,000 up to this).
    #[arg(long, default_value_t = 10_000_000)]
    max: u64,
    /// Segments the objects are spread over (each mounted by its own client).
    #[arg(long, default_value_t = 1_000)]
    segments: u64,
    /// Clients writing the objects.
    #[arg(long, default_value_t = 10_000)]
    clients: u64,
    /// Operations timed per measurement and decade.
    #[arg(long, default_value_t = 200_000)]
    samples: u64,
    /// Threads of the all-cores `get_replicas` rate (default: the cores of this machine).
    #[arg(long)]
    threads: Option<usize>,
    /// Skip the journaled master (takeover and eviction columns left empty; half the memory).
    #[arg(long)]
    no_takeover: bool,
    /// CSV of the rows.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// SVG plot of the rows.
    #[arg(long)]
    svg: Option<PathBuf>,
    #[command(flatten)]
    master: MasterConfig,
}

impl Args {
    /// Threads of the all-core rate: `--threads`, or the cores of this machine.
    fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

/// What one decade measured.
#[derive(Default, Clone)]
struct Row {
    objects: u64,
    heap_bytes_per_object: f64,
    rss_mib: f64,
    fill_per_s: f64,
    put_per_s: f64,
    put_start_p99_ns: f64,
    put_end_p99_ns: f64,
    get_per_s: f64,
    get_p50_ns: f64,
    get_p99_ns: f64,
    get_all_cores_per_s: f64,
    exists_per_s: f64,
    exists_p99_ns: f64,
    restore_ms: Option<f64>,
    evict_ms: Option<f64>,
    evicted: Option<u64>,
}

const HEADER: &str = "objects,heap_bytes_per_object,rss_mib,fill_per_s,put_per_s,put_start_p99_ns,\
put_end_p99_ns,get_replicas_per_s,get_replicas_p50_ns,get_replicas_p99_ns,get_replicas_all_cores_per_s,exists_per_s,\
exists_p99_ns,restore_ms,evict_round_ms,evicted_objects";

impl Row {
    fn csv(&self) -> String {
        let opt = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_default();
        format!(
            "{},{:.1},{:.1},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{},{},{}",
            self.objects,
            self.heap_bytes_per_object,
            self.rss_mib,
            self.fill_per_s,
            self.put_per_s,
            self.put_start_p99_ns,
            self.put_end_p99_ns,
            self.get_per_s,
            self.get_p50_ns,
            self.get_p99_ns,
            self.get_all_cores_per_s,
            self.exists_per_s,
            self.exists_p99_ns,
            opt(self.restore_ms),
            opt(self.evict_ms),
            self.evicted.map(|v| v.to_string()).unwrap_or_default(),
        )
    }
}

/// Key `i`: 64 hex characters (a HiCache page hash's shape), written into `buf`.
fn key_into(i: u64, buf: &mut String) -> &str {
    buf.clear();
    let mix = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let _ = write!(buf, "{i:016x}{mix:016x}{:016x}{:016x}", !i, i ^ 0x5555);
    buf
}

/// A small xorshift: random existing keys without a dependency in the hot loop.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The writer of object `i`.
fn writer(i: u64, clients: u64) -> ClientId {
    ClientId::from_u128(1_000_000 + u128::from(i % clients))
}

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The `q` quantile of `v` (sorted in place), in nanoseconds.
fn quantile_ns(v: &mut [u32], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    f64::from(v[((v.len() - 1) as f64 * q).round() as usize])
}

fn nanos(d: Duration) -> u32 {
    u32::try_from(d.as_nanos()).unwrap_or(u32::MAX)
}

/// Mounts `segments` segments sized so that `max` pages (twice over) never fill them.
fn mount(m: &Master, args: &Args) -> Result<(), String> {
    let per = (args.max * PAGE * 2).div_ceil(args.segments).max(1 << 30);
    for s in 0..args.segments {
        let spec = SegmentSpec {
            name: format!("node-{s}"),
            base: (s + 1) << 44,
            size: per,
            endpoint: format!("10.0.{}.{}:17000", s / 250, s % 250),
            disk_bytes: 0,
            disk_write_through: false,
        };
        m.mount_segment(ClientId::from_u128(u128::from(s) + 1), spec)
            .map_err(|e| format!("mount node-{s}: {e}"))?;
    }
    Ok(())
}

/// Puts objects `from..to` (start and end), committing a journal every `COMMIT_EVERY`.
fn fill(
    m: &Master,
    from: u64,
    to: u64,
    clients: u64,
    journal: Option<&BenchJournal>,
) -> Result<(), String> {
    let cfg = ReplicateConfig::default();
    let mut buf = String::with_capacity(64);
    for i in from..to {
        let k = key_into(i, &mut buf);
        let w = writer(i, clients);
        m.put_start(w, k, PAGE, &cfg)
            .map_err(|e| format!("put_start {i}: {e}"))?;
        m.put_end(w, k).map_err(|e| format!("put_end {i}: {e}"))?;
        if let Some(j) = journal
            && (i + 1) % COMMIT_EVERY == 0
        {
            j.commit(m);
        }
    }
    if let Some(j) = journal {
        j.commit(m);
    }
    Ok(())
}

/// Rate (one thread) and p99s of `put_start` and `put_end` on `n` fresh keys, each
/// removed again so the population stays at its decade.
fn puts(m: &Master, n: u64, clients: u64, round: u64) -> Result<(f64, f64, f64), String> {
    let cfg = ReplicateConfig::default();
    let mut buf = String::with_capacity(64);
    let base = FRESH + round * 2 * n;
    let remove = |from: u64| -> Result<(), String> {
        let mut buf = String::with_capacity(64);
        for i in from..from + n {
            m.remove(key_into(i, &mut buf), true)
                .map_err(|e| format!("remove {i}: {e}"))?;
        }
        Ok(())
    };
    let t = Instant::now();
    for i in base..base + n {
        let k = key_into(i, &mut buf);
        let w = writer(i, clients);
        black_box(m.put_start(w, k, PAGE, &cfg).map_err(|e| e.to_string())?);
        m.put_end(w, k).map_err(|e| e.to_string())?;
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    remove(base)?;
    let (mut starts, mut ends) = (
        Vec::with_capacity(n as usize),
        Vec::with_capacity(n as usize),
    );
    for i in base + n..base + 2 * n {
        let k = key_into(i, &mut buf);
        let w = writer(i, clients);
        let t = Instant::now();
        black_box(m.put_start(w, k, PAGE, &cfg).map_err(|e| e.to_string())?);
        starts.push(nanos(t.elapsed()));
        let t = Instant::now();
        m.put_end(w, k).map_err(|e| e.to_string())?;
        ends.push(nanos(t.elapsed()));
    }
    remove(base + n)?;
    Ok((
        rate,
        quantile_ns(&mut starts, 0.99),
        quantile_ns(&mut ends, 0.99),
    ))
}

/// Rate (one thread), p50 and p99 of `op` on `n` random existing keys.
fn reads(objects: u64, n: u64, seed: u64, op: impl Fn(&str)) -> (f64, f64, f64) {
    let mut buf = String::with_capacity(64);
    let mut rng = Rng(seed | 1);
    let t = Instant::now();
    for _ in 0..n {
        op(key_into(rng.below(objects), &mut buf));
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    let mut lat = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let k = key_into(rng.below(objects), &mut buf);
        let t = Instant::now();
        op(k);
        lat.push(nanos(t.elapsed()));
    }
    let p50 = quantile_ns(&mut lat, 0.5);
    (rate, p50, quantile_ns(&mut lat, 0.99))
}

/// `get_replicas` on `threads` threads at once, `n` lookups each: lookups a second in all.
fn gets_all_cores(m: &Master, objects: u64, n: u64, threads: usize) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads {
            s.spawn(move || {
                let mut buf = String::with_capacity(64);
                let mut rng = Rng(0x5eed + th as u64 * 7_919);
                for _ in 0..n {
                    let k = key_into(rng.below(objects), &mut buf);
                    black_box(m.get_replicas(k).ok());
                }
            });
        }
    });
    (n * threads as u64) as f64 / t.elapsed().as_secs_f64()
}

/// Restores a new leader from the journal's records; then, leases over, one eviction round.
fn takeover(config: &MasterConfig, journal: &BenchJournal) -> Result<(f64, f64, u64), String> {
    journal.with_snapshot(|snapshot, taken| {
        let clock = Arc::new(ManualClock::new(1_000));
        let t = Instant::now();
        let restored = Master::restore(config.clone(), clock.clone(), None, snapshot)
            .map_err(|e| format!("restore: {e}"))?;
        let restore_ms = (taken + t.elapsed()).as_secs_f64() * 1e3;
        if !restored.stale_objects.is_empty() {
            return Err(format!(
                "{} records not restored",
                restored.stale_objects.len()
            ));
        }
        let m = restored.master;
        clock.advance(config.lease_ttl_ms.max(config.soft_pin_ttl_ms) + 1);
        let used = m.stats().allocated_bytes;
        let target = (used as f64 * config.eviction_ratio).ceil() as u64;
        let t = Instant::now();
        let report = m.evict(target, target / 2);
        let evict_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok((restore_ms, evict_ms, report.evicted_objects))
    })
}

fn run(args: &Args) -> Result<Vec<Row>, String> {
    if args.max < 1_000 || args.segments == 0 || args.clients == 0 || args.samples == 0 {
        return Err("--max must be at least 1000; --segments, --clients, --samples above 0".into());
    }
    args.master.validate().map_err(|e| e.to_string())?;
    let threads = args.threads();
    let m = Master::with_clock(args.master.clone(), Arc::new(ManualClock::new(1_000)))
        .map_err(|e| e.to_string())?;
    mount(&m, args)?;
    let journaled = (!args.no_takeover)
        .then(|| -> Result<_, String> {
            let j = BenchJournal::new();
            let jm = Master::with_journal(
                args.master.clone(),
                Arc::new(ManualClock::new(1_000)),
                Some(j.clone() as Arc<dyn Journal>),
            )
            .map_err(|e| e.to_string())?;
            mount(&jm, args)?;
            j.commit(&jm);
            Ok((jm, j))
        })
        .transpose()?;
    let region = Region::new(GLOBAL);
    let live = || {
        let c = region.change();
        c.bytes_allocated as i64 - c.bytes_deallocated as i64
    };
    let mut heap = 0i64;
    let mut rows = Vec::new();
    let (mut have, mut decade) = (0u64, 1_000u64);
    println!("{HEADER}");
    while decade <= args.max {
        let samples = args.samples.min(decade);
        let before = live();
        let t = Instant::now();
        fill(&m, have, decade, args.clients, None)?;
        let fill_s = t.elapsed().as_secs_f64();
        heap += live() - before;
        if let Some((jm, j)) = &journaled {
            fill(jm, have, decade, args.clients, Some(j))?;
        }
        let mut row = Row {
            objects: decade,
            heap_bytes_per_object: heap as f64 / decade as f64,
            fill_per_s: (decade - have) as f64 / fill_s,
            ..Row::default()
        };
        (row.put_per_s, row.put_start_p99_ns, row.put_end_p99_ns) =
            puts(&m, samples, args.clients, rows.len() as u64)?;
        (row.get_per_s, row.get_p50_ns, row.get_p99_ns) = reads(decade, samples, 11, |k| {
            black_box(m.get_replicas(k).ok());
        });
        row.get_all_cores_per_s = gets_all_cores(&m, decade, samples, threads);
        (row.exists_per_s, _, row.exists_p99_ns) = reads(decade, samples, 13, |k| {
            black_box(m.exists(k).ok());
        });
        if let Some((_, j)) = &journaled {
            let (restore, evict, evicted) = takeover(&args.master, j)?;
            (row.restore_ms, row.evict_ms, row.evicted) =
                (Some(restore), Some(evict), Some(evicted));
        }
        row.rss_mib = rss_mib();
        println!("{}", row.csv());
        rows.push(row);
        have = decade;
        decade = decade.saturating_mul(10);
    }
    if m.stats().keys != have {
        return Err(format!(
            "the master holds {} objects, not {have}",
            m.stats().keys
        ));
    }
    Ok(rows)
}

fn panels(rows: &[Row], threads: usize) -> Vec<Panel> {
    let line = |name: &str, f: &dyn Fn(&Row) -> Option<f64>| Series {
        name: name.to_string(),
        points: rows
            .iter()
            .filter_map(|r| f(r).map(|v| (r.objects as f64, v)))
            .collect(),
    };
    vec![
        Panel {
            title: "operations a second".into(),
            y_label: "ops/s".into(),
            log_y: false,
            series: vec![
                line("put_start+put_end", &|r| Some(r.put_per_s)),
                line("get_replicas", &|r| Some(r.get_per_s)),
                line(&format!("get_replicas, {threads} threads"), &|r| {
                    Some(r.get_all_cores_per_s)
                }),
                line("exists", &|r| Some(r.exists_per_s)),
            ],
        },
        Panel {
            title: "latency (one thread)".into(),
            y_label: "ns".into(),
            log_y: false,
            series: vec![
                line("put_start p99", &|r| Some(r.put_start_p99_ns)),
                line("put_end p99", &|r| Some(r.put_end_p99_ns)),
                line("get_replicas p99", &|r| Some(r.get_p99_ns)),
                line("get_replicas p50", &|r| Some(r.get_p50_ns)),
                line("exists p99", &|r| Some(r.exists_p99_ns)),
            ],
        },
        Panel {
            title: "memory per object".into(),
            y_label: "bytes".into(),
            log_y: false,
            series: vec![line("heap bytes per object (64-byte key incl.)", &|r| {
                Some(r.heap_bytes_per_object)
            })],
        },
        Panel {
            title: "whole-master passes".into(),
            y_label: "ms".into(),
            log_y: true,
            series: vec![
                line("takeover: restore from records", &|r| r.restore_ms),
                line("one eviction round", &|r| r.evict_ms),
            ],
        },
    ]
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rows = match run(&args) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("master-scale: {e}");
            return ExitCode::FAILURE;
        }
    };
    let threads = args.threads();
    if let Some(path) = &args.csv {
        let mut out = format!("{HEADER}\n");
        for r in &rows {
            out.push_str(&r.csv());
            out.push('\n');
        }
        if let Err(e) = std::fs::write(path, out) {
            eprintln!("master-scale: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &args.svg
        && let Err(e) = curves::write_svg(path, "objects held", &panels(&rows, threads))
    {
        eprintln!("master-scale: {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
