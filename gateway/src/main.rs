//! `moongate`: the Moongate command-line entry point.

use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use gateway::config::{self, ServeConfig};

/// Moongate: an OpenAI-compatible gateway for SGLang workers with a KV-cache master.
#[derive(Parser, Debug)]
#[command(name = "moongate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gateway (sglang-router's flags are accepted).
    Serve(ServeArgs),
    /// Run a gateway with two simulated workers on 127.0.0.1:30000 and print what to try
    /// (`--pd`: a simulated prefill and decode moving real KV pages).
    Demo(gateway::demo::DemoConfig),
    /// Run a simulated SGLang worker (same endpoints and shapes, deterministic output).
    SimWorker(gateway::sim::SimConfig),
    /// Run a storage node: contribute memory to the KV store and serve transfers.
    Store(kvstore::node::StoreNodeConfig),
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// TOML file with settings (keys are the long flag names with `_`); env and flags win over it.
    #[arg(long, env = config::env::CONFIG)]
    config: Option<PathBuf>,
    /// Print the merged, validated configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    serve: ServeConfig,
}

fn main() -> anyhow::Result<()> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches)?;
    match cli.command {
        Command::Serve(args) => {
            let sub = matches.subcommand_matches("serve").expect("serve matched");
            let cfg = ServeConfig::resolve(&args.serve, args.config.as_deref(), sub)?;
            if args.print_config {
                print!("{}", cfg.to_toml());
                return Ok(());
            }
            gateway::logging::init(cfg.log_level);
            runtime(cfg.runtime_threads())?.block_on(gateway::serve::run(cfg))
        }
        Command::Demo(cfg) => {
            gateway::logging::init(config::LogLevel::Warn);
            runtime(0)?.block_on(gateway::demo::run(cfg))
        }
        Command::SimWorker(cfg) => {
            gateway::logging::init(config::LogLevel::Info);
            runtime(0)?.block_on(gateway::sim::run(cfg))
        }
        Command::Store(cfg) => {
            gateway::logging::init(config::LogLevel::Info);
            let metrics = gateway::metrics::install();
            runtime(0)?.block_on(async move {
                let shutdown = gateway::serve::shutdown_signal();
                kvstore::node::run(cfg, move || metrics.render(), shutdown).await
            })?;
            Ok(())
        }
    }
}

/// A tokio runtime: the single-threaded scheduler for `threads == 1` (no work stealing or
/// cross-thread wake-ups to pay for), else the multi-threaded one (`0`: tokio's default size).
fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads == 1 {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
    }
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if threads > 1 {
        b.worker_threads(threads);
    }
    b.enable_all().build()
}
