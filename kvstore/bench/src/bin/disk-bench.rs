//! `disk-bench`: the disk tier's write and read rates, in one process on real files.
//!
//! A master, a storage client whose segment has a disk tier at `--dir` (written through,
//! so every value is written), and a reader (a pure client). It puts `--values` values of
//! `--value-size` (several times the segment), waits until every record is durable
//! (write rate: bytes over that time), makes sure what it reads is on disk only (the page
//! cache dropped with `--drop-caches`, which needs root), then reads the values that live
//! only on disk in batches of `--batch` into the reader's memory (read rate). Every value
//! read is checked byte for byte.
//!
//! With `--restart`, the storage client then leaves and a new one starts on the same
//! directory (a warm restart): the time to scan the records (opening the tier) and the
//! time until the master serves every one of them again, without a re-put.
//!
//! `kvstore/bench/scripts/disk_bench.sh` runs it beside `fio` on the same file system.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Parser;
use kvclient::{ClientConfig, DiskWritePolicy, Protocol, StoreClient, StoreError, parse_size};
use kvmaster::{MasterConfig, MasterServer};

#[derive(Parser, Debug)]
#[command(about = "The disk tier's write and read rates on real files")]
struct Args {
    /// Directory of the disk tier (on the file system to measure); emptied first.
    #[arg(long)]
    dir: PathBuf,
    /// Values to put.
    #[arg(long, default_value_t = 2048)]
    values: usize,
    /// Bytes per value (K, M suffixes).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    value_size: u64,
    /// The storage client's segment (memory) size.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    segment_size: u64,
    /// Keys per batch get.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Drop the page cache before reading (`/proc/sys/vm/drop_caches`, root only), so
    /// reads come from the device.
    #[arg(long)]
    drop_caches: bool,
    /// Then restart the storage client on the same directory and time the records' return.
    #[arg(long)]
    restart: bool,
}

/// Value `i`: a shared pattern with `i` in its first and last 8 bytes (cheap to make and to
/// check, so the bench spends its two cores on the tier, not on its own bytes).
fn value(i: usize, pattern: &[u8]) -> Vec<u8> {
    let mut v = pattern.to_vec();
    let tag = (i as u64).to_le_bytes();
    let n = v.len();
    v[..8.min(n)].copy_from_slice(&tag[..8.min(n)]);
    if n >= 16 {
        v[n - 8..].copy_from_slice(&tag);
    }
    v
}

/// The bytes every value shares.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|j| (j * 131 + (j >> 12)) as u8).collect()
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

async fn run(args: Args) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(&args.dir);
    let m = MasterServer::start(
        MasterConfig {
            lease_ttl_ms: 200,
            ..MasterConfig::default()
        },
        "127.0.0.1:0".parse().expect("address"),
    )
    .await
    .map_err(|e| format!("master: {e}"))?;
    let base = |segment: u64| ClientConfig {
        protocol: Protocol::Auto,
        local_buffer_size: 64 << 20,
        ..ClientConfig::local(&m.url(), segment)
    };
    let owner = StoreClient::connect(ClientConfig {
        disk_path: Some(args.dir.clone()),
        disk_capacity: 1 << 40,
        disk_write_policy: DiskWritePolicy::WriteThrough,
        ..base(args.segment_size)
    })
    .await
    .map_err(|e| format!("storage client: {e}"))?;
    let reader = StoreClient::connect(base(0))
        .await
        .map_err(|e| format!("reader: {e}"))?;
    let disk = owner.disk().expect("a disk tier").clone();
    let len = args.value_size as usize;
    let pattern = pattern(len);
    let keys: Vec<String> = (0..args.values)
        .map(|i| format!("disk-bench/{i}"))
        .collect();

    // Write: every value put (each retried while the segment has no room), then every
    // record durable.
    let start = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        let v = value(i, &pattern);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match owner.put(k, &v).await {
                Ok(()) => break,
                // No room until copies on disk let eviction free some: put it again.
                Err(StoreError::Master(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(1)).await
                }
                Err(e) => return Err(format!("put {k}: {e}")),
            }
        }
    }
    while disk.counters().writes.load(Ordering::Relaxed) < args.values as u64 {
        if start.elapsed() > Duration::from_secs(600) {
            return Err("records not written within 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let written = start.elapsed();
    let bytes = args.values as u64 * args.value_size;
    println!(
        "write: {} values of {} B in {:.3} s: {:.2} GB/s (put, then written through and synced)",
        args.values,
        args.value_size,
        written.as_secs_f64(),
        gbps(bytes, written)
    );

    // Read: the values that live only on disk (the segment holds the newest).
    let in_memory = (args.segment_size / args.value_size) as usize + 1;
    let cold = &keys[..args.values.saturating_sub(in_memory)];
    if cold.is_empty() {
        return Err("every value still fits the segment: put more (--values)".into());
    }
    if args.drop_caches {
        std::fs::write("/proc/sys/vm/drop_caches", "3")
            .map_err(|e| format!("dropping the page cache (root only): {e}"))?;
    }
    let before = disk.counters().reads.load(Ordering::Relaxed);
    let start = Instant::now();
    for chunk in cold.chunks(args.batch.max(1)) {
        let got = reader.batch_get(chunk).await;
        for (k, r) in chunk.iter().zip(got) {
            let v = r.map_err(|e| format!("get {k}: {e}"))?;
            let i: usize = k["disk-bench/".len()..].parse().expect("index");
            if v[..] != value(i, &pattern)[..] {
                return Err(format!("{k} came back different"));
            }
        }
    }
    let read = start.elapsed();
    let from_disk = disk.counters().reads.load(Ordering::Relaxed) - before;
    println!(
        "read: {} values ({} from disk) of {} B in batches of {} in {:.3} s: {:.2} GB/s{}",
        cold.len(),
        from_disk,
        args.value_size,
        args.batch,
        read.as_secs_f64(),
        gbps(cold.len() as u64 * args.value_size, read),
        if args.drop_caches {
            ""
        } else {
            " (page cache not dropped)"
        }
    );
    owner.close().await.map_err(|e| e.to_string())?;
    if args.restart {
        restart(&args, &keys, &m.url(), &reader).await?;
    }
    reader.close().await.map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&args.dir);
    Ok(())
}

/// A new storage client on the same directory: how long its scan takes, and how long until
/// the master serves every record again.
async fn restart(
    args: &Args,
    keys: &[String],
    master: &str,
    reader: &StoreClient,
) -> Result<(), String> {
    if args.drop_caches {
        std::fs::write("/proc/sys/vm/drop_caches", "3")
            .map_err(|e| format!("dropping the page cache (root only): {e}"))?;
    }
    let start = Instant::now();
    let owner = StoreClient::connect(ClientConfig {
        protocol: Protocol::Auto,
        disk_path: Some(args.dir.clone()),
        disk_capacity: 1 << 40,
        disk_write_policy: DiskWritePolicy::WriteThrough,
        ..ClientConfig::local(master, args.segment_size)
    })
    .await
    .map_err(|e| format!("restarted storage client: {e}"))?;
    let opened = start.elapsed();
    let found = owner.disk().expect("a disk tier").usage().1;
    let mut left: Vec<&str> = keys.iter().map(String::as_str).collect();
    while !left.is_empty() {
        if start.elapsed() > Duration::from_secs(300) {
            return Err(format!(
                "{} records not served within 5 minutes",
                left.len()
            ));
        }
        let mut still = Vec::new();
        for chunk in left.chunks(1024) {
            for (k, e) in chunk.iter().zip(reader.batch_exists(chunk).await) {
                if !matches!(e, Ok(true)) {
                    still.push(*k);
                }
            }
        }
        left = still;
        if !left.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let served = start.elapsed();
    // One value back from the restarted node, checked.
    let k = &keys[0];
    let v = reader
        .get(k)
        .await
        .map_err(|e| format!("get {k} after the restart: {e}"))?;
    if v[..] != value(0, &pattern(args.value_size as usize))[..] {
        return Err(format!("{k} came back different after the restart"));
    }
    println!(
        "restart: {found} records found in {:.3} s (scan{}), all {} served again after {:.3} s",
        opened.as_secs_f64(),
        if args.drop_caches {
            ", page cache dropped"
        } else {
            ""
        },
        keys.len(),
        served.as_secs_f64()
    );
    owner.close().await.map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("disk-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
