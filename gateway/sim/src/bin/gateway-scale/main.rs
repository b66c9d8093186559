//! `gateway-scale`: what choosing a worker costs the gateway as its fleet grows.
//!
//! For every policy, and for fleets of 10 workers up to `--max-workers` (10,000 by default)
//! in decades, it times [`Policy::pick`] in process, with no sockets: the work the gateway
//! does per request between reading the body and sending it on. The workers are ready
//! regular workers of one model.
//!
//! - The prefix policies (`cache_aware`, `manual`, `kv_aware`) start warm. Their trees hold
//!   `--warm` earlier requests of 64 prompt families. `kv_aware` has no KV events here, so it
//!   scores as its `cache_aware` fallback does.
//! - Requests carry a ~1 KiB chat prompt and a routing key.
//!
//! Each cell reports the mean and p99 of `--picks` picks.
//!
//! Then the `kv_aware` index from 1,000 to `--max-blocks` cached blocks (10 M by default):
//! heap bytes per block (every allocation counted), block events taken in a second, and
//! the cost of matching a 32-page prompt (see `index`).
//!
//! Then the `cache_aware` tree from 1 MB to `--max-tree-bytes` of prompts sent (1 GB by
//! default): heap bytes per prompt byte and the cost of a match (see `tree`).
//!
//! Rows print as they come. With `--out DIR` they go to `selection.csv`, `kv_index.csv`
//! and `tree.csv` there, each drawn beside it as an SVG.

mod index;
mod tree;

use std::alloc::System;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use gateway::config::PolicyKind;
use gateway::proxy::Endpoint;
use gateway::proxy::prompt::prompt_key;
use gateway::select::affinity::Affinity;
use gateway::select::{Policy, Want};
use gateway::workers::registry::WorkerSet;
use gateway::workers::{DEFAULT_PRIORITY, Worker, WorkerSpec, WorkerUrl};
use openapi::workers::{WorkerStatus, WorkerType};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio_util::sync::CancellationToken;

/// Every allocation counted, for the index's heap bytes per block.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[derive(Parser, Debug)]
#[command(about = "What choosing a worker costs as the fleet grows, per policy")]
struct Args {
    /// Workers at the last step (decades from 10 up to this).
    #[arg(long, default_value_t = 10_000)]
    max_workers: usize,
    /// Picks timed per policy and fleet size.
    #[arg(long, default_value_t = 2_000)]
    picks: usize,
    /// Earlier requests warming the prefix policies' trees.
    #[arg(long, default_value_t = 2_000)]
    warm: usize,
    /// Cached blocks in the `kv_aware` index at the last step (decades from 1,000; below
    /// 1,000 the index is not measured).
    #[arg(long, default_value_t = 10_000_000)]
    max_blocks: u64,
    /// Prompt bytes sent to the `cache_aware` tree at the last step (decades from 1 MB;
    /// below 1 MB the tree is not measured).
    #[arg(long, default_value_t = 1_000_000_000)]
    max_tree_bytes: u64,
    /// Directory of the CSV files and their SVG plots.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `n` ready regular workers serving model `m`.
fn workers(n: usize) -> Vec<Arc<Worker>> {
    (0..n)
        .map(|i| {
            let spec = WorkerSpec {
                url: WorkerUrl::parse(&format!(
                    "http://10.{}.{}.{}:30000",
                    i / 62_500,
                    i / 250 % 250,
                    i % 250
                ))
                .expect("a worker URL"),
                worker_type: WorkerType::Regular,
                bootstrap_port: None,
                model_id: Some("m".into()),
                api_key: None,
                labels: BTreeMap::new(),
                priority: DEFAULT_PRIORITY,
            };
            let w = Worker::new(spec, None, CancellationToken::new());
            w.set_status(WorkerStatus::Ready);
            Arc::new(w)
        })
        .collect()
}

/// Request `n` of prompt family `family`: its prompt key and routing key.
fn request(family: usize, n: usize) -> (Vec<u8>, String) {
    let system = format!("You are assistant number {family}. ")
        + &"Answer carefully, cite sources, keep it short. ".repeat(19);
    let body = serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("Question {n}: what is the capital of country {n}?")},
        ],
    }))
    .expect("json");
    let key = prompt_key(Endpoint::ChatCompletions, &body).expect("a chat prompt has a key");
    (key, format!("session-{family}-{}", n % 97))
}

/// One measured cell.
struct Cell {
    policy: String,
    workers: usize,
    mean_ns: f64,
    p99_ns: f64,
}

impl Cell {
    /// Its CSV line.
    fn csv(&self) -> String {
        format!(
            "{},{},{:.0},{:.0}",
            self.policy, self.workers, self.mean_ns, self.p99_ns
        )
    }
}

fn measure(kind: PolicyKind, set: &WorkerSet, args: &Args) -> Result<Cell, String> {
    let policy = Policy::new(kind);
    let requests: Vec<(Vec<u8>, String)> = (0..args.warm + args.picks)
        .map(|n| request(n % 64, n))
        .collect();
    fn want((key, session): &(Vec<u8>, String)) -> Want<'_> {
        Want {
            worker_type: WorkerType::Regular,
            model: Some("m"),
            exclude: &[],
            key: Some(key),
            affinity: Affinity {
                key: Some(session.as_bytes()),
                target: None,
            },
        }
    }
    for r in &requests[..args.warm] {
        policy
            .pick(set, &want(r))
            .map_err(|e| format!("{kind:?}: {e:?}"))?;
    }
    let mut took = Vec::with_capacity(args.picks);
    for r in &requests[args.warm..] {
        let w = want(r);
        let t = Instant::now();
        let pick = policy.pick(set, &w);
        took.push(t.elapsed().as_nanos() as f64);
        black_box(pick.map_err(|e| format!("{kind:?}: {e:?}"))?);
    }
    let (mean_ns, p99_ns) = mean_and_p99(&mut took);
    Ok(Cell {
        policy: kind
            .to_possible_value()
            .map_or(format!("{kind:?}"), |v| v.get_name().to_string()),
        workers: set.len(),
        mean_ns,
        p99_ns,
    })
}

const HEADER: &str = "policy,workers,pick_mean_ns,pick_p99_ns";

fn run(args: &Args) -> Result<Vec<Cell>, String> {
    if args.max_workers < 10 || args.picks == 0 {
        return Err("--max-workers must be at least 10 and --picks above 0".into());
    }
    println!("{HEADER}");
    let mut cells = Vec::new();
    let mut n = 10;
    while n <= args.max_workers {
        let set = workers(n);
        for &kind in PolicyKind::value_variants() {
            let cell = measure(kind, &set, args)?;
            println!("{}", cell.csv());
            cells.push(cell);
        }
        n = n.saturating_mul(10);
    }
    Ok(cells)
}

fn panels(cells: &[Cell]) -> Vec<curves::Panel> {
    let mut policies: Vec<&str> = Vec::new();
    for c in cells {
        if !policies.contains(&c.policy.as_str()) {
            policies.push(&c.policy);
        }
    }
    let panel = |title: &str, f: fn(&Cell) -> f64| curves::Panel {
        title: title.into(),
        y_label: "ns per request".into(),
        log_y: true,
        series: policies
            .iter()
            .map(|p| curves::Series {
                name: (*p).to_string(),
                points: cells
                    .iter()
                    .filter(|c| c.policy == *p)
                    .map(|c| (c.workers as f64, f(c)))
                    .collect(),
            })
            .collect(),
    };
    vec![
        panel("choosing a worker: mean", |c| c.mean_ns),
        panel("choosing a worker: p99", |c| c.p99_ns),
    ]
}

/// The mean and the 99th percentile of `ns` (sorted in place; 0 for none).
pub(crate) fn mean_and_p99(ns: &mut [f64]) -> (f64, f64) {
    if ns.is_empty() {
        return (0.0, 0.0);
    }
    ns.sort_by(f64::total_cmp);
    let mean = ns.iter().sum::<f64>() / ns.len() as f64;
    (mean, ns[((ns.len() - 1) as f64 * 0.99).round() as usize])
}

/// Writes `header` and `lines` to `dir/<name>.csv`, and `panels` against `x_label` to
/// `dir/<name>.svg`; nothing for no lines.
fn emit(
    dir: &std::path::Path,
    name: &str,
    header: &str,
    lines: impl Iterator<Item = String>,
    x_label: &str,
    panels: Vec<curves::Panel>,
) -> Result<(), String> {
    let mut text = format!("{header}\n");
    let mut any = false;
    for l in lines {
        text.push_str(&l);
        text.push('\n');
        any = true;
    }
    if !any {
        return Ok(());
    }
    let csv = dir.join(format!("{name}.csv"));
    std::fs::write(&csv, text).map_err(|e| format!("{}: {e}", csv.display()))?;
    let svg = dir.join(format!("{name}.svg"));
    curves::write_svg(&svg, x_label, &panels).map_err(|e| format!("{}: {e}", svg.display()))
}

/// The curves of the index rows.
fn index_panels(rows: &[index::IndexRow]) -> Vec<curves::Panel> {
    let line = |name: &str, f: fn(&index::IndexRow) -> f64| curves::Series {
        name: name.into(),
        points: rows.iter().map(|r| (r.blocks as f64, f(r))).collect(),
    };
    vec![
        curves::Panel {
            title: "kv_aware index: memory".into(),
            y_label: "bytes per cached block".into(),
            log_y: false,
            series: vec![line("heap bytes per block", |r| r.heap_bytes_per_block)],
        },
        curves::Panel {
            title: "kv_aware index: time".into(),
            y_label: "ns".into(),
            log_y: true,
            series: vec![
                line("match, 32 pages: mean", |r| r.match_mean_ns),
                line("match, 32 pages: p99", |r| r.match_p99_ns),
                line("ingest, per block", |r| 1e9 / r.ingest_blocks_per_s),
            ],
        },
    ]
}

/// The curves of the tree rows.
fn tree_panels(rows: &[tree::TreeRow]) -> Vec<curves::Panel> {
    let line = |name: &str, f: fn(&tree::TreeRow) -> f64| curves::Series {
        name: name.into(),
        points: rows.iter().map(|r| (r.prompt_bytes as f64, f(r))).collect(),
    };
    vec![
        curves::Panel {
            title: "cache_aware tree: memory".into(),
            y_label: "heap bytes per prompt byte".into(),
            log_y: false,
            series: vec![line("heap bytes per prompt byte", |r| {
                r.heap_bytes_per_prompt_byte
            })],
        },
        curves::Panel {
            title: "cache_aware tree: match".into(),
            y_label: "ns".into(),
            log_y: true,
            series: vec![
                line("match, 2 KiB prompt: mean", |r| r.match_mean_ns),
                line("match, 2 KiB prompt: p99", |r| r.match_p99_ns),
            ],
        },
    ]
}

fn run_all(args: &Args) -> Result<(), String> {
    let cells = run(args)?;
    let region = Region::new(GLOBAL);
    let live = || {
        let c = region.change();
        c.bytes_allocated as i64 - c.bytes_deallocated as i64
    };
    let rows = if args.max_blocks >= 1_000 {
        index::measure(args.max_blocks, args.picks, live)
    } else {
        Vec::new()
    };
    let trees = if args.max_tree_bytes >= 1_000_000 {
        tree::measure(args.max_tree_bytes, args.picks, live)
    } else {
        Vec::new()
    };
    let Some(dir) = &args.out else {
        return Ok(());
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    emit(
        dir,
        "selection",
        HEADER,
        cells.iter().map(Cell::csv),
        "workers",
        panels(&cells),
    )?;
    emit(
        dir,
        "kv_index",
        index::HEADER,
        rows.iter().map(index::IndexRow::csv),
        "cached blocks",
        index_panels(&rows),
    )?;
    emit(
        dir,
        "tree",
        tree::HEADER,
        trees.iter().map(tree::TreeRow::csv),
        "prompt bytes sent",
        tree_panels(&trees),
    )
}

fn main() -> ExitCode {
    match run_all(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway-scale: {e}");
            ExitCode::FAILURE
        }
    }
}
