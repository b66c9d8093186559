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
//! Each cell reports the mean and p99 of `--picks` picks. Rows print as they come, and go
//! to `--csv`; `--svg` draws them.

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
use tokio_util::sync::CancellationToken;

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
    /// CSV of the rows.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// SVG plot of the rows.
    #[arg(long)]
    svg: Option<PathBuf>,
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
    let mean_ns = took.iter().sum::<f64>() / took.len() as f64;
    took.sort_by(f64::total_cmp);
    let p99_ns = took[((took.len() - 1) as f64 * 0.99).round() as usize];
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
            println!(
                "{},{},{:.0},{:.0}",
                cell.policy, cell.workers, cell.mean_ns, cell.p99_ns
            );
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

fn main() -> ExitCode {
    let args = Args::parse();
    let cells = match run(&args) {
        Ok(cells) => cells,
        Err(e) => {
            eprintln!("gateway-scale: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &args.csv {
        let mut out = format!("{HEADER}\n");
        for c in &cells {
            out.push_str(&format!(
                "{},{},{:.0},{:.0}\n",
                c.policy, c.workers, c.mean_ns, c.p99_ns
            ));
        }
        if let Err(e) = std::fs::write(path, out) {
            eprintln!("gateway-scale: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &args.svg
        && let Err(e) = curves::write_svg(path, "workers", &panels(&cells))
    {
        eprintln!("gateway-scale: {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
