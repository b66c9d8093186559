//! `kv`: put or get one value through the Rust [`kvstore::StoreClient`], e.g. to check
//! that bytes a Python `MooncakeDistributedStore` put are what a Rust client reads (the
//! wheel's interop tests run it), or to poke at a running master.
//!
//! ```text
//! cargo run -p kvstore --example kv -- --master http://127.0.0.1:30000 --segment-size 0 get KEY
//! cargo run -p kvstore --example kv -- --master http://127.0.0.1:30000 --segment-size 0 put KEY 68656c6c6f
//! ```
//! Values are hex on the command line and on standard output.

use clap::{Parser, Subcommand};
use kvstore::{ClientConfig, StoreClient};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    client: ClientConfig,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Store `value` (hex) under `key`.
    Put { key: String, value: String },
    /// Print the value of `key` (hex).
    Get { key: String },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let client = StoreClient::connect(cli.client).await?;
    let r = match &cli.cmd {
        Cmd::Put { key, value } => client
            .put(key, &hex::decode(value)?)
            .await
            .map(|()| String::new()),
        Cmd::Get { key } => client.get(key).await.map(hex::encode),
    };
    client.close().await?;
    println!("{}", r?);
    Ok(())
}
