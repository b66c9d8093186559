//! `moongate`: the Moongate command-line entry point.

use clap::Parser;

/// Moongate: an OpenAI-compatible gateway for SGLang workers with a KV-cache master.
#[derive(Parser, Debug)]
#[command(name = "moongate", version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}
