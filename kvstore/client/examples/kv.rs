//! `kv`: put or get one value through the Rust [`kvclient::StoreClient`], e.g. to check
//! that bytes a Python `MooncakeDistributedStore` put are what a Rust client reads (the
//! wheel's interop tests run it), or to poke at a running master.
//!
//! ```text
//! cargo run -p kvstore --example kv -- --master http://127.0.0.1:30000 --segment-size 0 get KEY
//! cargo run -p kvstore --example kv -- --master http://127.0.0.1:30000 --segment-size 0 put KEY 68656c6c6f
//! ```
//! Values are hex on the command line and on standard output. `bench-exists` times
//! `batch_exists` of 64 stored and 64 absent keys (the Rust side of the Python wheel's
//! `batch_is_exist` figure; give the client a segment to store them in).

use clap::{Parser, Subcommand};
use kvclient::{ClientConfig, StoreClient};

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
    /// Median time of `calls` `batch_exists` calls on 64 stored and 64 absent keys.
    BenchExists {
        #[arg(long, default_value_t = 50)]
        calls: usize,
    },
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
        Cmd::BenchExists { calls } => bench_exists(&client, *calls).await,
    };
    client.close().await?;
    println!("{}", r?);
    Ok(())
}

async fn bench_exists(client: &StoreClient, calls: usize) -> kvclient::StoreResult<String> {
    let tag = std::process::id();
    let stored: Vec<String> = (0..64).map(|i| format!("kv-exists-{tag}-{i}")).collect();
    let value = vec![7u8; 4096];
    let items: Vec<(&str, &[u8])> = stored.iter().map(|k| (k.as_str(), &value[..])).collect();
    for r in client.batch_put(&items).await {
        r?;
    }
    let keys: Vec<String> = stored
        .iter()
        .cloned()
        .chain((0..64).map(|i| format!("kv-absent-{tag}-{i}")))
        .collect();
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls.max(1) {
        let t = std::time::Instant::now();
        let got = client.batch_exists(&keys).await;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        let present = got.iter().filter(|r| matches!(r, Ok(true))).count();
        assert_eq!(
            present, 64,
            "batch_exists saw {present} of the 64 stored keys"
        );
    }
    times.sort_by(f64::total_cmp);
    Ok(format!(
        "RESULT {{\"op\":\"batch_exists\",\"keys\":{},\"median_ms\":{:.3}}}",
        keys.len(),
        times[times.len() / 2]
    ))
}
