//! `moongate`: the Moongate command line. It only parses and wires: each subcommand is a
//! crate's entry point ([`gateway`], `kvmaster` through the gateway's hosting, [`kvclient`]'s
//! storage node, [`sim`]'s worker, demo and routing bench).
//!
//! # Layout
//! - [`Cli`]: the subcommands and their arguments (clap); [`reference()`] renders them as
//!   the book's command-line reference (`docs/src/reference/cli.md`).
//! - [`run()`]: parses the process's arguments and runs the subcommand.
//! - `src/main.rs`: the binary (`run`, and the process's allocator).

use std::path::PathBuf;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use gateway::config::{self, MasterHostConfig, ServeConfig};

/// Moongate: an OpenAI-compatible gateway for SGLang workers with a KV-cache master.
#[derive(Parser, Debug)]
#[command(name = "moongate", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gateway (sglang-router's flags are accepted), hosting the KV master.
    Serve(ServeArgs),
    /// Run the KV master alone (REST API, /health, /metrics, OpenAPI and Swagger UI).
    Master(MasterArgs),
    /// Print the OpenAPI document a server serves at /api-docs/openapi.json.
    Openapi(OpenapiArgs),
    /// Run a gateway with two simulated workers on 127.0.0.1:30000 and print what to try
    /// (`--pd`: a simulated prefill and decode moving real KV pages).
    Demo(sim::demo::DemoConfig),
    /// Run a simulated SGLang worker (same endpoints and shapes, deterministic output).
    SimWorker(SimWorkerArgs),
    /// Run a storage node: contribute memory to the KV store and serve transfers.
    Store(StoreArgs),
    /// Replay a Mooncake-format trace through gateways and simulated workers, once per
    /// policy, and compare prefix hit rate, TTFT and throughput.
    BenchRouting(sim::bench::BenchConfig),
    /// Write a trace of a traffic shape (agents, chats, bursts, long and short mixed) in
    /// Mooncake's format, for `bench-routing`.
    GenTrace(sim::bench::shapes::GenConfig),
    /// Draw the runs `bench-routing --csv` wrote as an SVG chart.
    BenchChart(sim::bench::chart::ChartConfig),
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

#[derive(clap::Args, Debug)]
struct MasterArgs {
    /// TOML file with settings (the keys `serve` uses for them; the master's in `[master]`).
    #[arg(long, env = config::env::CONFIG)]
    config: Option<PathBuf>,
    /// Print the merged, validated configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    host: MasterHostConfig,
}

#[derive(clap::Args, Debug)]
struct SimWorkerArgs {
    /// Print the validated configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    sim: sim::SimConfig,
}

#[derive(clap::Args, Debug)]
struct StoreArgs {
    /// Print the merged (`MOONGATE_STORE_*` environment < flags), validated configuration as
    /// TOML and exit (keys hidden).
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    node: kvclient::node::StoreNodeConfig,
}

/// Which server's document to print.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum DocumentOf {
    /// `moongate serve` with the master (the committed `openapi/openapi.json`).
    Serve,
    /// `moongate serve --disable-master`.
    Gateway,
    /// `moongate master`.
    Master,
}

#[derive(clap::Args, Debug)]
struct OpenapiArgs {
    /// The server whose document to print (default settings).
    #[arg(long, value_enum, default_value = "serve")]
    of: DocumentOf,
    /// Write the document to this file instead of standard output.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

/// The pretty-printed document of `of` with default settings.
fn openapi_document(of: DocumentOf) -> anyhow::Result<String> {
    let doc = runtime(1)?.block_on(async {
        match of {
            DocumentOf::Serve => gateway::launch::document(ServeConfig::default()),
            DocumentOf::Gateway => gateway::launch::document(ServeConfig {
                disable_master: true,
                ..ServeConfig::default()
            }),
            DocumentOf::Master => gateway::master::document(MasterHostConfig::default()),
        }
    })?;
    Ok(doc.to_pretty_json()? + "\n")
}

/// The command-line reference: every subcommand with its arguments, their environment
/// variables and defaults, as Markdown (what `docs/src/reference/cli.md` holds).
pub fn reference() -> String {
    let header = "<!-- Generated from the clap definitions by `cargo test -p moongate --test \
        cli_reference` (UPDATE_DOCS=1 writes it). Do not edit by hand. -->\n\n";
    let options = clap_markdown::MarkdownOptions::new()
        .title("Command-line reference".to_owned())
        .show_footer(false);
    format!(
        "{header}{}",
        clap_markdown::help_markdown_custom::<Cli>(&options)
    )
}

/// Parses the process's arguments and runs the subcommand.
pub fn run() -> anyhow::Result<()> {
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
            let traces = gateway::logging::init_logging(
                cfg.log_level,
                cfg.log_json,
                cfg.otlp_traces_endpoint.as_deref(),
            )?;
            // SIGHUP reads the same sources again: the file, the environment, these flags.
            let sub = sub.clone();
            let reread =
                Box::new(move || ServeConfig::resolve(&args.serve, args.config.as_deref(), &sub));
            let served =
                runtime(cfg.runtime_threads())?.block_on(gateway::launch::run(cfg, Some(reread)));
            if let Some(t) = traces {
                t.shutdown();
            }
            served
        }
        Command::Master(args) => {
            let sub = matches
                .subcommand_matches("master")
                .expect("master matched");
            let cfg = MasterHostConfig::resolve(&args.host, args.config.as_deref(), sub)?;
            if args.print_config {
                print!("{}", cfg.to_toml());
                return Ok(());
            }
            let traces = gateway::logging::init_logging(
                cfg.log_level,
                cfg.log_json,
                cfg.otlp_traces_endpoint.as_deref(),
            )?;
            let served = runtime(cfg.runtime_threads())?.block_on(gateway::master::run_master(cfg));
            if let Some(t) = traces {
                t.shutdown();
            }
            served
        }
        Command::Openapi(args) => {
            let text = openapi_document(args.of)?;
            match args.output {
                Some(path) => std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display())),
                None => {
                    use std::io::Write;
                    std::io::stdout()
                        .write_all(text.as_bytes())
                        .context("writing to standard output")
                }
            }
        }
        Command::Demo(cfg) => {
            gateway::logging::init(config::LogLevel::Warn);
            runtime(0)?.block_on(sim::demo::run(cfg))
        }
        Command::GenTrace(cfg) => sim::bench::shapes::run(&cfg),
        Command::BenchChart(cfg) => sim::bench::chart::run(&cfg),
        Command::BenchRouting(cfg) => {
            gateway::logging::init(config::LogLevel::Error);
            runtime(0)?.block_on(sim::bench::run(cfg)).map(|_| ())
        }
        Command::SimWorker(SimWorkerArgs { print_config, sim }) => {
            if print_config {
                sim.validate().map_err(anyhow::Error::msg)?;
                return print_toml(&sim);
            }
            let traces = gateway::logging::init_with_traces(
                config::LogLevel::Info,
                sim.otlp_traces_endpoint.as_deref(),
            )?;
            let served = runtime(0)?.block_on(sim::run(sim));
            if let Some(t) = traces {
                t.shutdown();
            }
            served
        }
        Command::Store(StoreArgs { print_config, node }) => {
            if print_config {
                node.validate()?;
                let shown = kvclient::node::StoreNodeConfig {
                    client: node.client.redacted(),
                    ..node
                };
                return print_toml(&shown);
            }
            let traces = gateway::logging::init_with_traces(
                config::LogLevel::Info,
                node.otlp_traces_endpoint.as_deref(),
            )?;
            let metrics = gateway::metrics::install();
            let served = runtime(0)?.block_on(async move {
                let shutdown = gateway::listen::shutdown_signal();
                kvclient::node::run(node, move || metrics.render(), shutdown).await
            });
            if let Some(t) = traces {
                t.shutdown();
            }
            Ok(served?)
        }
    }
}

/// Prints `value` as TOML (the `--print-config` of the subcommands without a `to_toml`).
fn print_toml(value: &impl serde::Serialize) -> anyhow::Result<()> {
    print!(
        "{}",
        toml::to_string(value).context("rendering the configuration as TOML")?
    );
    Ok(())
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
