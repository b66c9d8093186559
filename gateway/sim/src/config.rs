//! [`SimConfig`]: everything a simulated worker can be told, with every default defined
//! here once (the CLI, `Default` and serde all read these constants).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default bind host.
pub const DEFAULT_HOST: &str = "127.0.0.1";
/// Default bind port (SGLang's own default, 30000, is left to the gateway).
pub const DEFAULT_PORT: u16 = 30001;
/// Default served model name.
pub const DEFAULT_MODEL: &str = "moongate-sim";
/// Default tokens the simulated model writes before its end-of-sequence token.
pub const DEFAULT_OUTPUT_TOKENS: u32 = 16;
/// Default context length (prompt + output tokens).
pub const DEFAULT_CONTEXT_LENGTH: u32 = 32768;
/// Default time to first token.
pub const DEFAULT_TTFT: &str = "0s";
/// Default time per output token after the first.
pub const DEFAULT_TPOT: &str = "0s";
/// Default largest accepted request body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Default bootstrap port: where a prefill worker's bootstrap server listens, and what a
/// decode worker uses when a request's `bootstrap_port` is `null` (SGLang's default).
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;
/// Default model shape sizing the simulated KV cache.
pub const DEFAULT_MODEL_SHAPE: ModelShape = ModelShape::Llama3_8b;
/// Default tokens per KV page.
pub const DEFAULT_PAGE_SIZE: u32 = 16;
/// Default KV pool size (bytes; rounded down to whole pages).
pub const DEFAULT_KV_POOL_SIZE: u64 = 1 << 30;
/// Default simulated prefill compute time per prompt token.
pub const DEFAULT_PREFILL_COMPUTE_PER_TOKEN: &str = "0s";
/// Default bound on a room: a prefill waiting for the decode's registration (and for its
/// writes to finish), a decode waiting for pages or for the KV.
pub const DEFAULT_KV_TIMEOUT: &str = "30s";
/// Default memory a worker with `--kv-store` contributes to the store (bytes).
pub const DEFAULT_KV_STORE_SEGMENT_SIZE: u64 = 256 << 20;
/// Default registered buffer a worker with `--kv-store` loads pages into (bytes).
pub const DEFAULT_KV_STORE_BUFFER_SIZE: u64 = 16 << 20;
/// Default interval between a decode's heartbeats to a prefill's bootstrap server.
pub const DEFAULT_HEARTBEAT_INTERVAL: &str = "1s";
/// Default failed heartbeats in a row after which a prefill counts as dead.
pub const DEFAULT_HEARTBEAT_MAX_FAILURES: u32 = 2;
/// The most data-parallel ranks a simulated worker runs.
pub const MAX_DP_SIZE: u32 = 64;

/// Role of a simulated worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SimMode {
    /// A regular worker: prefill and decode in one.
    #[default]
    Regular,
    /// A PD prefill worker: computes a prompt's KV and writes it into the decode's memory;
    /// runs the bootstrap server.
    Prefill,
    /// A PD decode worker: receives and checks the KV, then generates.
    Decode,
}

impl SimMode {
    /// `regular`, `prefill` or `decode`.
    pub fn as_str(self) -> &'static str {
        match self {
            SimMode::Regular => "regular",
            SimMode::Prefill => "prefill",
            SimMode::Decode => "decode",
        }
    }

    /// The `disaggregation_mode` value SGLang reports for this role.
    pub fn disaggregation_mode(self) -> &'static str {
        match self {
            SimMode::Regular => "null",
            SimMode::Prefill => "prefill",
            SimMode::Decode => "decode",
        }
    }
}

/// How a PD worker's KV travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvTransport {
    /// Shared memory with a peer on the same host, TCP otherwise.
    #[default]
    Auto,
    /// TCP always (loopback too).
    Tcp,
}

/// Which pages a worker with `--kv-store` writes to the store (SGLang's
/// `--hicache-write-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum WritePolicy {
    /// Every page it computes, as soon as it is cached (SGLang's default).
    WriteThrough,
    /// Only pages evicted from its cache.
    #[default]
    WriteBack,
}

/// Configuration of a simulated SGLang worker (`moongate sim-worker`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Address to bind.
    #[arg(long, default_value = DEFAULT_HOST)]
    pub host: String,
    /// Port to bind.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Worker role.
    #[arg(long, value_enum, default_value_t = SimMode::Regular)]
    pub mode: SimMode,
    /// Model name served on the OpenAI routes (`/v1/models`).
    #[arg(long, alias = "served-model-name", default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Model path reported by `/get_model_info` (default: the model name). Routers load a
    /// tokenizer from here, so point it at a local tokenizer directory when they need one.
    #[arg(long)]
    pub model_path: Option<String>,
    /// A local Hugging Face tokenizer (a directory with `tokenizer.json` and
    /// `tokenizer_config.json`, or the `tokenizer.json` file): prompts are tokenized with it
    /// and its chat template, as SGLang does, for the prefix cache, its KV events and the
    /// token counts (the generated text stays the simulated model's). Absent: the built-in
    /// word tokenizer. Reported as the tokenizer path.
    #[arg(long)]
    pub tokenizer_path: Option<std::path::PathBuf>,
    /// A chat template file (Jinja) that replaces the tokenizer's own.
    #[arg(long)]
    pub chat_template: Option<std::path::PathBuf>,
    /// Tokens the simulated model writes before it emits end-of-sequence (finish reason
    /// `stop`); a smaller `max_tokens` ends it earlier with `length`.
    #[arg(long, default_value_t = DEFAULT_OUTPUT_TOKENS)]
    pub output_tokens: u32,
    /// Context length: prompt plus output tokens may not exceed it.
    #[arg(long, default_value_t = DEFAULT_CONTEXT_LENGTH)]
    pub context_length: u32,
    /// Time to first token (e.g. `200ms`).
    #[arg(long, value_parser = humantime::parse_duration, default_value = DEFAULT_TTFT)]
    #[serde(with = "human_duration")]
    pub ttft: Duration,
    /// Time per output token after the first (e.g. `20ms`).
    #[arg(long, value_parser = humantime::parse_duration, default_value = DEFAULT_TPOT)]
    #[serde(with = "human_duration")]
    pub tpot: Duration,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Prefill: the bootstrap server's port (0: any free port); reported in
    /// `/get_server_info` (`disaggregation_bootstrap_port`).
    #[arg(long, default_value_t = DEFAULT_BOOTSTRAP_PORT)]
    pub bootstrap_port: u16,
    /// Data-parallel ranks (SGLang's `--dp-size`; regular mode): each has its own prefix
    /// cache (its own `--kv-pool-size`), KV events (rank `r` on the endpoints' ports + `r`,
    /// as SGLang offsets them), prefill lane and load; a request runs on the rank its
    /// `data_parallel_rank` names, or the next in turn.
    #[arg(long, alias = "data-parallel-size", default_value_t = 1)]
    pub dp_size: u32,
    /// Model shape sizing the KV cache (bytes per token): the prefix cache and PD pages.
    #[arg(long, value_enum, default_value_t = DEFAULT_MODEL_SHAPE)]
    pub model_shape: ModelShape,
    /// Tokens per KV page (the prefix cache caches whole pages).
    #[arg(long, default_value_t = DEFAULT_PAGE_SIZE)]
    pub page_size: u32,
    /// KV pool size in bytes (suffixes K, M, G), rounded down to whole pages: bounds the
    /// prefix cache (and PD's registered pages).
    #[arg(long, default_value_t = DEFAULT_KV_POOL_SIZE, value_parser = parse_size)]
    pub kv_pool_size: u64,
    /// No prefix cache (SGLang's `--disable-radix-cache`): every prompt is computed whole.
    #[arg(long)]
    pub disable_radix_cache: bool,
    /// Report `usage.prompt_tokens_details.cached_tokens` on the OpenAI routes (SGLang's
    /// `--enable-cache-report`; `/generate` always reports `meta_info.cached_tokens`).
    #[arg(long)]
    pub enable_cache_report: bool,
    /// Publish KV-cache events as SGLang does: a JSON object such as
    /// `{"publisher":"zmq","endpoint":"tcp://127.0.0.1:5557","topic":"kv-events","replay_endpoint":"tcp://127.0.0.1:5558"}`
    /// (`tcp://*:PORT` binds every interface; the default endpoint is loopback).
    #[arg(long, value_parser = sglang::kv_events::KvEventsConfig::parse)]
    pub kv_events_config: Option<sglang::kv_events::KvEventsConfig>,
    /// L3 (SGLang HiCache with `--hicache-storage-backend mooncake`): the KV master's URL
    /// (`moongate serve` hosts one). Pages evicted from the prefix cache (or, with
    /// `--kv-store-write-policy write-through`, computed) are written to the store under
    /// HiCache's keys (`{page hash}_0_k` and `_v`); a prompt whose next pages
    /// are there loads them through the transfer engine instead of computing them. The
    /// store key is derived from `--transfer-secret-file`.
    #[arg(long)]
    pub kv_store: Option<String>,
    /// L3: which pages are written to the store: `write-back` (each page evicted) or
    /// `write-through` (each page computed, as it is cached; SGLang's default, and many
    /// more writes).
    #[arg(long, value_enum, default_value_t = WritePolicy::WriteBack)]
    pub kv_store_write_policy: WritePolicy,
    /// L3: memory this worker contributes to the store (suffixes K, M, G).
    #[arg(long, default_value_t = DEFAULT_KV_STORE_SEGMENT_SIZE, value_parser = parse_size)]
    pub kv_store_segment_size: u64,
    /// L3: the registered buffer pages are loaded into (suffixes K, M, G); a longer prefix
    /// is loaded in several batches.
    #[arg(long, default_value_t = DEFAULT_KV_STORE_BUFFER_SIZE, value_parser = parse_size)]
    pub kv_store_buffer_size: u64,
    /// L3: a disk tier below this worker's store memory (the store's `--disk-path`): pages
    /// the master evicts from it are written there instead of being lost.
    #[arg(long)]
    pub kv_store_disk_path: Option<std::path::PathBuf>,
    /// L3: most bytes the disk tier holds (suffixes K, M, G, T).
    #[arg(long, default_value = kvclient::DEFAULT_DISK_CAPACITY, value_parser = parse_size)]
    pub kv_store_disk_capacity: u64,
    /// OTLP/HTTP traces endpoint (e.g. `http://collector:4318/v1/traces`; SGLang's flag,
    /// whose gRPC form is not served): export a span per inference request, continuing
    /// the router's `traceparent`, with the store client's calls and loads under it.
    /// Off when unset.
    #[arg(long)]
    pub otlp_traces_endpoint: Option<String>,
    /// Prefill compute time per uncached prompt token (regular workers: one prefill at a
    /// time, in arrival order, before the time to first token; PD prefill: per token of
    /// the room before the KV is ready).
    #[arg(long, value_parser = humantime::parse_duration, default_value = DEFAULT_PREFILL_COMPUTE_PER_TOKEN)]
    #[serde(with = "human_duration")]
    pub prefill_compute_per_token: Duration,
    /// PD: how the KV travels (`tcp` forces TCP on one host too).
    #[arg(long, value_enum, default_value_t = KvTransport::Auto)]
    pub kv_transport: KvTransport,
    /// PD: the transfer engine's listen address (default: `--host`, any port).
    #[arg(long)]
    pub kv_listen: Option<std::net::SocketAddr>,
    /// PD: bound on a room (prefill waiting for the decode's registration or its writes,
    /// decode waiting for pages or KV).
    #[arg(long, value_parser = humantime::parse_duration, default_value = DEFAULT_KV_TIMEOUT)]
    #[serde(with = "human_duration")]
    pub kv_timeout: Duration,
    /// PD decode: interval between heartbeats to a prefill's bootstrap server.
    #[arg(long, value_parser = humantime::parse_duration, default_value = DEFAULT_HEARTBEAT_INTERVAL)]
    #[serde(with = "human_duration")]
    pub heartbeat_interval: Duration,
    /// PD decode: failed heartbeats in a row after which a prefill is dead (its rooms fail).
    #[arg(long, default_value_t = DEFAULT_HEARTBEAT_MAX_FAILURES)]
    pub heartbeat_max_failures: u32,
    /// PD: the cluster secret file the transfer engine authenticates peers with (default:
    /// the per-user `~/.config/moongate/transfer-secret`, created on first use).
    #[arg(long, env = trust::SECRET_FILE_ENV)]
    pub transfer_secret_file: Option<std::path::PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            host: DEFAULT_HOST.to_owned(),
            port: DEFAULT_PORT,
            mode: SimMode::Regular,
            model: DEFAULT_MODEL.to_owned(),
            model_path: None,
            tokenizer_path: None,
            chat_template: None,
            output_tokens: DEFAULT_OUTPUT_TOKENS,
            context_length: DEFAULT_CONTEXT_LENGTH,
            ttft: parse_default(DEFAULT_TTFT),
            tpot: parse_default(DEFAULT_TPOT),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            bootstrap_port: DEFAULT_BOOTSTRAP_PORT,
            dp_size: 1,
            model_shape: DEFAULT_MODEL_SHAPE,
            page_size: DEFAULT_PAGE_SIZE,
            kv_pool_size: DEFAULT_KV_POOL_SIZE,
            disable_radix_cache: false,
            enable_cache_report: false,
            kv_events_config: None,
            kv_store: None,
            kv_store_write_policy: WritePolicy::WriteBack,
            kv_store_segment_size: DEFAULT_KV_STORE_SEGMENT_SIZE,
            kv_store_buffer_size: DEFAULT_KV_STORE_BUFFER_SIZE,
            kv_store_disk_path: None,
            kv_store_disk_capacity: parse_size(kvclient::DEFAULT_DISK_CAPACITY)
                .expect("the default disk capacity parses"),
            otlp_traces_endpoint: None,
            prefill_compute_per_token: parse_default(DEFAULT_PREFILL_COMPUTE_PER_TOKEN),
            kv_transport: KvTransport::Auto,
            kv_listen: None,
            kv_timeout: parse_default(DEFAULT_KV_TIMEOUT),
            heartbeat_interval: parse_default(DEFAULT_HEARTBEAT_INTERVAL),
            heartbeat_max_failures: DEFAULT_HEARTBEAT_MAX_FAILURES,
            transfer_secret_file: None,
        }
    }
}

impl SimConfig {
    /// The model path reported to routers: `model_path`, else the model name.
    pub fn model_path(&self) -> &str {
        self.model_path.as_deref().unwrap_or(&self.model)
    }

    /// The tokenizer path reported to routers: `tokenizer_path`, else the model path.
    pub fn reported_tokenizer_path(&self) -> String {
        match &self.tokenizer_path {
            Some(p) => p.display().to_string(),
            None => self.model_path().to_owned(),
        }
    }

    /// Pages the KV pool holds (what bounds the prefix cache).
    pub fn pool_pages(&self) -> usize {
        let page = self.model_shape.bytes_per_token() as u64 * u64::from(self.page_size.max(1));
        (self.kv_pool_size / page.max(1)) as usize
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), String> {
        if self.model.is_empty() {
            return Err("model name must not be empty".to_owned());
        }
        if self.context_length < 2 {
            return Err("context_length must be at least 2".to_owned());
        }
        if self.page_size == 0 {
            return Err("page_size must be at least 1".to_owned());
        }
        if let Some(p) = sglang::tokenizer::flags_problem(
            self.tokenizer_path.as_deref(),
            self.chat_template.as_deref(),
        ) {
            return Err(p);
        }
        let page = self.model_shape.bytes_per_token() as u64 * u64::from(self.page_size);
        if self.kv_pool_size < page {
            return Err(format!(
                "kv_pool_size ({}) is smaller than one page ({page} bytes)",
                self.kv_pool_size
            ));
        }
        if !(1..=MAX_DP_SIZE).contains(&self.dp_size) {
            return Err(format!("dp_size must be 1 to {MAX_DP_SIZE}"));
        }
        if self.dp_size > 1 {
            if self.mode != SimMode::Regular {
                return Err("dp_size over 1 is simulated for regular workers only".to_owned());
            }
            if let Some(c) = self.kv_events_config.as_ref().filter(|c| c.enabled()) {
                let fixed = |e: &str| {
                    sglang::kv_events::offset_port(e, 0).is_some_and(|e| !e.ends_with(":0"))
                };
                if !fixed(&c.endpoint) || c.replay_endpoint.as_deref().is_some_and(|r| !fixed(r)) {
                    return Err("dp_size over 1 with kv_events_config needs fixed ports (rank r publishes on port + r)".to_owned());
                }
            }
        }
        if let Some(p) = gateway::config::otlp_problem(self.otlp_traces_endpoint.as_deref()) {
            return Err(p);
        }
        if self.kv_store.is_none() && self.kv_store_disk_path.is_some() {
            return Err("kv_store_disk_path needs kv_store".to_owned());
        }
        if self.kv_store.is_some() {
            if self.disable_radix_cache {
                return Err("kv_store needs the prefix cache (drop disable_radix_cache)".to_owned());
            }
            if self.kv_store_buffer_size < page {
                return Err(format!(
                    "kv_store_buffer_size ({}) is smaller than one page ({page} bytes)",
                    self.kv_store_buffer_size
                ));
            }
        }
        if self.mode != SimMode::Regular {
            if page > u64::from(u32::MAX) {
                return Err(format!("a page of {page} bytes is too large"));
            }
            if self.heartbeat_max_failures == 0
                || self.heartbeat_interval.is_zero()
                || self.kv_timeout.is_zero()
            {
                return Err(
                    "heartbeat_interval, heartbeat_max_failures and kv_timeout must be positive"
                        .to_owned(),
                );
            }
        }
        Ok(())
    }
}

/// A byte size with an optional suffix (the one parser of every size setting, the transfer
/// crate's).
pub use transfer::parse_size;

/// The default duration constants are literals that always parse; a typo would be caught
/// by the `defaults_agree` test before it could ship.
fn parse_default(s: &str) -> Duration {
    humantime::parse_duration(s).unwrap_or_default()
}

/// Durations as human-readable strings (`"200ms"`, `"1s 500ms"`) in config files.
mod human_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

/// Model shapes the simulator sizes its KV by: bytes per token = layers × KV heads ×
/// head dim × 2 (K and V) × bytes per element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum ModelShape {
    /// 2 layers × 1 KV head × 16 dims × 2 × 2 bytes = 128 bytes per token (tests).
    #[value(name = "tiny")]
    #[serde(rename = "tiny")]
    Tiny,
    /// Llama 3 8B: 32 layers × 8 KV heads × 128 dims × 2 × 2 bytes = 128 KiB per token.
    #[value(name = "llama-3-8b")]
    #[serde(rename = "llama-3-8b")]
    Llama3_8b,
    /// Llama 3 70B: 80 layers × 8 KV heads × 128 dims × 2 × 2 bytes = 320 KiB per token.
    #[value(name = "llama-3-70b")]
    #[serde(rename = "llama-3-70b")]
    Llama3_70b,
    /// Qwen2.5 7B: 28 layers × 4 KV heads × 128 dims × 2 × 2 bytes = 56 KiB per token.
    #[value(name = "qwen2.5-7b")]
    #[serde(rename = "qwen2.5-7b")]
    Qwen25_7b,
}

impl ModelShape {
    /// `(layers, kv_heads, head_dim, bytes_per_element)`.
    pub fn dims(self) -> (usize, usize, usize, usize) {
        match self {
            ModelShape::Tiny => (2, 1, 16, 2),
            ModelShape::Llama3_8b => (32, 8, 128, 2),
            ModelShape::Llama3_70b => (80, 8, 128, 2),
            ModelShape::Qwen25_7b => (28, 4, 128, 2),
        }
    }

    /// KV bytes of one token (K and V of every layer).
    pub fn bytes_per_token(self) -> usize {
        let (layers, heads, dim, elem) = self.dims();
        layers * heads * dim * 2 * elem
    }

    /// The preset's name.
    pub fn name(self) -> &'static str {
        match self {
            ModelShape::Tiny => "tiny",
            ModelShape::Llama3_8b => "llama-3-8b",
            ModelShape::Llama3_70b => "llama-3-70b",
            ModelShape::Qwen25_7b => "qwen2.5-7b",
        }
    }
}

impl std::fmt::Display for ModelShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimConfig,
    }

    #[test]
    fn defaults_agree() {
        let from_cli = Cli::try_parse_from(["sim"]).unwrap().sim;
        assert_eq!(from_cli, SimConfig::default());
        let from_serde: SimConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(from_serde, SimConfig::default());
        assert_eq!(
            humantime::parse_duration(DEFAULT_TTFT).unwrap(),
            Duration::ZERO
        );
        SimConfig::default().validate().unwrap();
    }

    #[test]
    fn flags_and_config_files() {
        let c = Cli::try_parse_from([
            "sim",
            "--port",
            "4",
            "--ttft",
            "250ms",
            "--tpot",
            "5ms",
            "--served-model-name",
            "m",
            "--model-path",
            "/tok",
        ])
        .unwrap()
        .sim;
        assert_eq!(c.ttft, Duration::from_millis(250));
        assert_eq!(c.model, "m");
        assert_eq!(c.model_path(), "/tok");
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["ttft"], "250ms");
        assert_eq!(serde_json::from_value::<SimConfig>(json).unwrap(), c);
        assert!(serde_json::from_str::<SimConfig>(r#"{"ttft":"soon"}"#).is_err());
        assert!(serde_json::from_str::<SimConfig>(r#"{"bogus":1}"#).is_err());
        let p = Cli::try_parse_from([
            "sim",
            "--mode",
            "prefill",
            "--model-shape",
            "qwen2.5-7b",
            "--kv-pool-size",
            "64M",
            "--page-size",
            "32",
            "--kv-transport",
            "tcp",
            "--prefill-compute-per-token",
            "50us",
        ])
        .unwrap()
        .sim;
        assert_eq!(p.mode, SimMode::Prefill);
        assert_eq!((p.kv_pool_size, p.page_size), (64 << 20, 32));
        assert_eq!(p.prefill_compute_per_token, Duration::from_micros(50));
        p.validate().unwrap();
        let tiny_pool = SimConfig {
            kv_pool_size: 1024,
            ..p.clone()
        };
        assert!(
            tiny_pool
                .validate()
                .unwrap_err()
                .contains("smaller than one page")
        );
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["model_shape"], "qwen2.5-7b");
        assert_eq!(serde_json::from_value::<SimConfig>(json).unwrap(), p);
        assert!(Cli::try_parse_from(["sim", "--mode", "router"]).is_err());
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("x").is_err());
    }
}
