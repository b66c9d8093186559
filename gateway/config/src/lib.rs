//! `moongate serve` configuration: one struct, [`ServeConfig`], whose [`Default`] is the only
//! place a default is written down. CLI help (`[default: ...]`), the TOML file format and
//! the docs all read it from there.
//!
//! Sources, lowest to highest precedence: the defaults, a TOML file (`--config`, keys are the
//! field names below), `MOONGATE_*` environment variables, command-line flags. The merged
//! value is [`ServeConfig::validate`]d before anything starts.
//!
//! Flags and their meaning follow sglang-router's `launch_router` where the two share a
//! feature (`--host --port --worker-urls --policy --api-key --max-payload-size
//! --request-timeout-secs --log-level --health-*`), so an sglang-router command line keeps
//! working.
//!
//! The hosted KV master's settings are [`kvmaster::MasterConfig`] (defaults written there):
//! a `[master]` table in the TOML file, `MOONGATE_MASTER_*` variables, `--master-*` flags.
//! [`MasterHostConfig`] is `moongate master` (the master alone), through the same pipeline.
//!
//! # Layout
//! In the order a setting takes:
//! - `sources`: the TOML file, `MOONGATE_*` variables ([`mod@env`] names them) and flags,
//!   merged over the defaults.
//! - this module: [`ServeConfig`] (every default of `moongate serve`), its enums and parsed
//!   values ([`WorkerUrl`] in `worker_url`, prefill specs).
//! - `master`: [`MasterHostConfig`], `moongate master`'s.
//! - `discovery`: [`DiscoveryConfig`], Kubernetes service discovery's.
//! - `validate` and `security`: what is checked before anything starts (URLs, bounds, TLS
//!   files, keys and key files), and the keys put in force.

mod discovery;
mod master;
mod security;
mod sources;
mod validate;
mod worker_url;

use validate::{master_problem, parse_prefill};

use std::fmt;
use std::path::{Path, PathBuf};

use clap::ArgMatches;
use kvmaster::MasterConfig;
use serde::{Deserialize, Serialize};
pub use trust::Secret;
pub use validate::otlp_problem;

pub use discovery::{ALL_NAMESPACES, DiscoveryConfig, parse_label};
pub use master::MasterHostConfig;
pub use sources::{merge_sources, overlay_given, read_toml};
pub use worker_url::{UrlError, WorkerUrl};

pub mod env;

/// The clap id of `--prefill` (grouped into [`ServeConfig::prefill`] by `resolve`).
const PREFILL_CLI: &str = "prefill_cli";

/// Load-balancing policy over the ready workers that serve the requested model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[clap(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Uniformly random.
    Random,
    /// Each worker in turn.
    RoundRobin,
    /// Two random workers, the one with fewer requests in flight.
    PowerOfTwo,
    /// The worker whose approximate prefix cache (a radix tree of the prompts it was sent)
    /// matches the prompt best, when the match passes `--cache-threshold`; else the least
    /// loaded worker. Shortest queue while the load is imbalanced (`--balance-*-threshold`).
    CacheAware,
    /// The worker whose real KV cache (learnt from its SGLang KV events) holds the longest
    /// prefix of the prompt, weighed against its load (`--kv-overlap-weight`,
    /// `--router-temperature`); `cache_aware` for workers without events.
    KvAware,
    /// The worker a request's routing key (`--routing-key-header`) hashes to on a
    /// consistent-hash ring, so a session stays on one worker and a worker joining or
    /// leaving moves only about 1/N of the keys; `power_of_two` for requests without one.
    ConsistentHashing,
    /// Sticky sessions (smg's `manual`): a routing key's first request goes by
    /// `cache_aware`, its next ones to the same worker while it can take them (else
    /// `cache_aware` reassigns the key); a worker joining moves no session. `cache_aware`
    /// for requests without a key.
    Manual,
    /// The worker whose queue clears first (smg's `least_load`): the tokens it holds and
    /// waits for over its generation throughput, from its own `/v1/loads` (polled every
    /// `--load-poll-interval-secs`) and the gateway's requests in flight, plus a KV
    /// pressure term (`--least-load-kv-weight`).
    LeastLoad,
    /// Prompts of similar length to the same worker (smg's `bucket`): each worker owns a
    /// range of prompt lengths, cut so each gets an equal share of the recent prompt
    /// bytes; the least loaded worker while the load is imbalanced
    /// (`--balance-*-threshold`).
    Bucket,
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Random => "random",
            Self::RoundRobin => "round_robin",
            Self::PowerOfTwo => "power_of_two",
            Self::CacheAware => "cache_aware",
            Self::KvAware => "kv_aware",
            Self::ConsistentHashing => "consistent_hashing",
            Self::Manual => "manual",
            Self::LeastLoad => "least_load",
            Self::Bucket => "bucket",
        })
    }
}

/// Log verbosity (`RUST_LOG`, when set, wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    /// Everything, including per-request traces.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Problems only.
    Warn,
    /// Failures only.
    Error,
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Trace => "trace",
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        })
    }
}

/// Everything `moongate serve` can be told. Field names are the TOML keys; flags are the
/// field names in kebab case; environment variables are in [`env`](mod@env). The hosted master's
/// settings are the `[master]` table ([`MasterConfig`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Address to bind (IPv4, IPv6 or a host name).
    #[arg(long, env = env::HOST, default_value_t = ServeConfig::default().host)]
    pub host: String,
    /// Port to bind (0: any free port).
    #[arg(long, env = env::PORT, default_value_t = ServeConfig::default().port)]
    pub port: u16,
    /// Static workers (regular), e.g. `--worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002`.
    #[arg(long, env = env::WORKER_URLS, num_args = 0.., value_delimiter = ',')]
    pub worker_urls: Vec<String>,
    /// Load-balancing policy.
    #[arg(long, env = env::POLICY, value_enum, default_value_t = ServeConfig::default().policy)]
    pub policy: PolicyKind,
    /// The request header whose value is a routing key (a session or user id): with
    /// `consistent_hashing`, requests with the same key go to the same worker. Keys over
    /// 256 bytes are ignored.
    #[arg(long, env = env::ROUTING_KEY_HEADER, default_value_t = ServeConfig::default().routing_key_header)]
    pub routing_key_header: String,
    /// The request header naming the one worker (its id, as `/workers` lists it, or its
    /// URL) a request must go to, with any policy; 503 when that worker cannot take it.
    #[arg(long, env = env::TARGET_WORKER_HEADER, default_value_t = ServeConfig::default().target_worker_header)]
    pub target_worker_header: String,
    /// `manual`: routing keys remembered at most (the least recently used is forgotten
    /// first; each key is at most 256 bytes).
    #[arg(long, env = env::STICKY_MAX_KEYS, default_value_t = ServeConfig::default().sticky_max_keys)]
    pub sticky_max_keys: usize,
    /// `manual`: a routing key unused this long is forgotten (its next request is
    /// assigned afresh).
    #[arg(long, env = env::STICKY_MAX_IDLE_SECS, default_value_t = ServeConfig::default().sticky_max_idle_secs)]
    pub sticky_max_idle_secs: u64,
    /// Route to each data-parallel rank of a worker as its own target (SGLang's
    /// `--dp-size`): a worker's ranks are learnt from its `/get_server_info` when it is
    /// registered, each is listed, probed, counted and chosen by the policy on its own,
    /// and the chosen rank goes in the request as `data_parallel_rank`.
    #[arg(long, env = env::DP_AWARE)]
    pub dp_aware: bool,
    /// Responses API: response ids whose worker is remembered at most (the least recently
    /// used is forgotten first; a forgotten id's worker is found by asking the workers).
    #[arg(long, env = env::RESPONSES_MAX_IDS, default_value_t = ServeConfig::default().responses_max_ids)]
    pub responses_max_ids: usize,
    /// API key sent to workers as `Authorization: Bearer` (a worker's own key wins).
    #[arg(long, env = env::API_KEY, hide_env_values = true)]
    pub api_key: Option<String>,
    /// PEM file of extra CA certificates trusted for `https://` workers (on top of the
    /// system's roots).
    #[arg(long, env = env::WORKER_CA_CERT)]
    pub worker_ca_cert: Option<std::path::PathBuf>,
    /// PEM certificate chain: serve HTTPS (HTTP/1.1 and HTTP/2 by ALPN) instead of plain
    /// HTTP. Needs `--tls-key-file`.
    #[arg(long, env = env::TLS_CERT_FILE)]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of `--tls-cert-file`.
    #[arg(long, env = env::TLS_KEY_FILE)]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// OTLP/HTTP traces endpoint (e.g. `http://collector:4318/v1/traces`): export a span per
    /// inference request and send its `traceparent` to the worker. Off when unset.
    #[arg(long, env = env::OTLP_TRACES_ENDPOINT)]
    pub otlp_traces_endpoint: Option<String>,
    /// Largest request body accepted, in bytes (bodies are read whole, up to this size, to
    /// route by model; larger ones get 413).
    #[arg(long, env = env::MAX_PAYLOAD_SIZE, default_value_t = ServeConfig::default().max_payload_size)]
    pub max_payload_size: usize,
    /// Largest count one request may carry, checked before anything is sized by it: `n`,
    /// the items of a batch (`prompt`, `text`, `input_ids`, `sampling_params` lists), items ×
    /// `n`, and logprob alternatives (`top_logprobs`, `logprobs`, `top_logprobs_num`); beyond
    /// it 400. The default is SGLang's own ceiling: a worker's request pool holds at most
    /// 4096 requests (`max_num_reqs = min(max(tokens / context * 512, 2048), 4096)` in its
    /// model runner), so a larger batch can never run at once on one worker.
    #[arg(long, env = env::MAX_BATCH_SIZE, default_value_t = ServeConfig::default().max_batch_size)]
    pub max_batch_size: usize,
    /// Seconds a client has to send a request's headers once it started one (also how long
    /// an idle keep-alive connection, or a new one that sends nothing, stays open).
    #[arg(long, env = env::CLIENT_HEADER_TIMEOUT_SECS, default_value_t = ServeConfig::default().client_header_timeout_secs)]
    pub client_header_timeout_secs: u64,
    /// Seconds a client has to send a whole request body once the gateway starts reading it;
    /// a body still arriving then is answered 408 and its connection closed.
    #[arg(long, env = env::CLIENT_BODY_TIMEOUT_SECS, default_value_t = ServeConfig::default().client_body_timeout_secs)]
    pub client_body_timeout_secs: u64,
    /// Client connections open at once; beyond it new connections wait in the listen backlog
    /// until one closes (they are not refused by the gateway).
    #[arg(long, env = env::MAX_CONNECTIONS, default_value_t = ServeConfig::default().max_connections)]
    pub max_connections: usize,
    /// Microseconds a connection keeps polling for its client's next request after an
    /// answer before its thread sleeps (0: never). Store clients chain small master calls;
    /// polling saves each one a wake-up (tens of µs on virtual machines). It adapts: a
    /// client slower than this costs one window every 64 answers at most.
    #[arg(long, env = env::BUSY_POLL_US, default_value_t = ServeConfig::default().busy_poll_us)]
    pub busy_poll_us: u64,
    /// Upper bound on one proxied request, in seconds: no response head in that time is a
    /// 504; a body still streaming then is cut.
    #[arg(long, env = env::REQUEST_TIMEOUT_SECS, default_value_t = ServeConfig::default().request_timeout_secs)]
    pub request_timeout_secs: u64,
    /// Log level.
    #[arg(long, env = env::LOG_LEVEL, value_enum, default_value_t = ServeConfig::default().log_level)]
    pub log_level: LogLevel,
    /// Seconds between health probes of a ready or not-ready worker.
    #[arg(long, env = env::HEALTH_CHECK_INTERVAL_SECS, default_value_t = ServeConfig::default().health_check_interval_secs)]
    pub health_check_interval_secs: u64,
    /// Seconds before a health probe counts as failed.
    #[arg(long, env = env::HEALTH_CHECK_TIMEOUT_SECS, default_value_t = ServeConfig::default().health_check_timeout_secs)]
    pub health_check_timeout_secs: u64,
    /// Failed probes in a row that take a worker out of rotation (`not_ready`).
    #[arg(long, env = env::HEALTH_FAILURE_THRESHOLD, default_value_t = ServeConfig::default().health_failure_threshold)]
    pub health_failure_threshold: u32,
    /// Successful probes in a row that bring a `not_ready` worker back.
    #[arg(long, env = env::HEALTH_SUCCESS_THRESHOLD, default_value_t = ServeConfig::default().health_success_threshold)]
    pub health_success_threshold: u32,
    /// Path probed on each worker.
    #[arg(long, env = env::HEALTH_CHECK_ENDPOINT, default_value_t = ServeConfig::default().health_check_endpoint)]
    pub health_check_endpoint: String,
    /// No health probes: workers are ready as soon as they are registered.
    #[arg(long, env = env::DISABLE_HEALTH_CHECK)]
    pub disable_health_check: bool,
    /// Milliseconds between probes of a worker that is `pending` or has just failed a probe,
    /// so new workers join and dead ones leave quickly.
    #[arg(long, env = env::HEALTH_CHECK_PENDING_INTERVAL_MS, default_value_t = ServeConfig::default().health_check_pending_interval_ms)]
    pub health_check_pending_interval_ms: u64,
    /// Attempts per request, the first included (sglang-router's meaning; 0 or 1: no retry).
    /// A request is retried only before any byte of the answer reached the client: when its
    /// worker cannot be reached, breaks the connection, or answers 408/429/500/502/503/504.
    /// Each retry selects again, preferring workers not tried yet (PD: a new pair, new rooms).
    #[arg(long, env = env::RETRY_MAX_RETRIES, default_value_t = ServeConfig::default().retry_max_retries)]
    pub retry_max_retries: u32,
    /// Milliseconds to wait before the first retry.
    #[arg(long, env = env::RETRY_INITIAL_BACKOFF_MS, default_value_t = ServeConfig::default().retry_initial_backoff_ms)]
    pub retry_initial_backoff_ms: u64,
    /// Longest wait between two attempts, in milliseconds.
    #[arg(long, env = env::RETRY_MAX_BACKOFF_MS, default_value_t = ServeConfig::default().retry_max_backoff_ms)]
    pub retry_max_backoff_ms: u64,
    /// Each wait is the previous one times this.
    #[arg(long, env = env::RETRY_BACKOFF_MULTIPLIER, default_value_t = ServeConfig::default().retry_backoff_multiplier)]
    pub retry_backoff_multiplier: f64,
    /// Each wait is moved by a random fraction up to this, either way (0.0-1.0).
    #[arg(long, env = env::RETRY_JITTER_FACTOR, default_value_t = ServeConfig::default().retry_jitter_factor)]
    pub retry_jitter_factor: f64,
    /// Never retry.
    #[arg(long, env = env::DISABLE_RETRIES)]
    pub disable_retries: bool,
    /// Failed requests in a row (connection failures, timeouts, 5xx; within
    /// `--cb-window-duration-secs`) that open a worker's circuit breaker: no traffic to it
    /// until `--cb-timeout-duration-secs` have passed.
    #[arg(long, env = env::CB_FAILURE_THRESHOLD, default_value_t = ServeConfig::default().cb_failure_threshold)]
    pub cb_failure_threshold: u32,
    /// Successful trial requests in a row that close a half-open breaker (also how many
    /// trial requests it lets through at a time).
    #[arg(long, env = env::CB_SUCCESS_THRESHOLD, default_value_t = ServeConfig::default().cb_success_threshold)]
    pub cb_success_threshold: u32,
    /// Seconds an open breaker keeps its worker out before trial requests go through.
    #[arg(long, env = env::CB_TIMEOUT_DURATION_SECS, default_value_t = ServeConfig::default().cb_timeout_duration_secs)]
    pub cb_timeout_duration_secs: u64,
    /// A failure streak whose first failure is older than this (seconds) starts over.
    #[arg(long, env = env::CB_WINDOW_DURATION_SECS, default_value_t = ServeConfig::default().cb_window_duration_secs)]
    pub cb_window_duration_secs: u64,
    /// No circuit breakers: workers leave rotation only by failing health checks.
    #[arg(long, env = env::DISABLE_CIRCUIT_BREAKER)]
    pub disable_circuit_breaker: bool,
    /// Inference requests handled at once (-1: no limit). More wait in a queue; a full
    /// queue or a wait past `--queue-timeout-secs` is answered 429.
    #[arg(long, env = env::MAX_CONCURRENT_REQUESTS, allow_negative_numbers = true,
          default_value_t = ServeConfig::default().max_concurrent_requests)]
    pub max_concurrent_requests: i64,
    /// Requests that may wait for a slot (0: answer 429 at once when all are taken).
    #[arg(long, env = env::QUEUE_SIZE, default_value_t = ServeConfig::default().queue_size)]
    pub queue_size: usize,
    /// Longest wait in the queue, in seconds, before a 408 (`queue_timeout`).
    #[arg(long, env = env::QUEUE_TIMEOUT_SECS, default_value_t = ServeConfig::default().queue_timeout_secs)]
    pub queue_timeout_secs: u64,
    /// Inference requests admitted per second, bursts up to one second's worth (token
    /// bucket; absent: no rate limit). Requests over the rate wait in the queue.
    #[arg(long, env = env::RATE_LIMIT_TOKENS_PER_SECOND)]
    pub rate_limit_tokens_per_second: Option<u64>,
    /// The request header naming a request's priority class: `bulk`, `default`,
    /// `interactive` or `system` (or 0 to 3; anything else: `default`; smg's header). A
    /// freed slot goes to the highest class waiting; a tenant's `max_priority` caps it.
    #[arg(long, env = env::PRIORITY_HEADER, default_value_t = ServeConfig::default().priority_header)]
    pub priority_header: String,
    /// A waiting request's class rises by one for every this many seconds waited, so the
    /// lowest class still moves under a steady load of higher ones (0: never).
    #[arg(long, env = env::PRIORITY_AGING_SECS, default_value_t = ServeConfig::default().priority_aging_secs)]
    pub priority_aging_secs: u64,
    /// `least_load`: how often each worker's `/v1/loads` is read, in seconds (a report
    /// older than three intervals is not used).
    #[arg(long, env = env::LOAD_POLL_INTERVAL_SECS, default_value_t = ServeConfig::default().load_poll_interval_secs)]
    pub load_poll_interval_secs: u64,
    /// `least_load`: the weight of a worker's KV pressure, `k / (1 - k)` for its KV usage
    /// `k`, against its queue's seconds to clear (smg's default).
    #[arg(long, env = env::LEAST_LOAD_KV_WEIGHT, default_value_t = ServeConfig::default().least_load_kv_weight)]
    pub least_load_kv_weight: f64,
    /// `cache_aware`: the share of the prompt (0.0-1.0) a worker's tree must match for the
    /// request to go to that worker rather than the least loaded one.
    #[arg(long, env = env::CACHE_THRESHOLD, default_value_t = ServeConfig::default().cache_threshold)]
    pub cache_threshold: f64,
    /// `cache_aware`: the load is imbalanced (shortest queue wins) when the busiest and the
    /// idlest worker differ by more than this many requests ...
    #[arg(long, env = env::BALANCE_ABS_THRESHOLD, default_value_t = ServeConfig::default().balance_abs_threshold)]
    pub balance_abs_threshold: usize,
    /// ... and the busiest has more than this times the idlest's load.
    #[arg(long, env = env::BALANCE_REL_THRESHOLD, default_value_t = ServeConfig::default().balance_rel_threshold)]
    pub balance_rel_threshold: f64,
    /// `cache_aware`: seconds between evictions of the prompt trees.
    #[arg(long, env = env::EVICTION_INTERVAL_SECS, default_value_t = ServeConfig::default().eviction_interval_secs)]
    pub eviction_interval_secs: u64,
    /// `cache_aware`: bytes of prompt text each worker's tree may hold; the least recently
    /// used prompts beyond it are evicted.
    #[arg(long, env = env::MAX_TREE_SIZE, default_value_t = ServeConfig::default().max_tree_size)]
    pub max_tree_size: usize,
    /// `kv_aware`: weight of a token to prefill (cost = this x (uncached tokens + backlog
    /// weight x the worker's prefill backlog) + load weight x in-flight requests x mean
    /// prompt tokens).
    #[arg(long, env = env::KV_OVERLAP_WEIGHT, default_value_t = ServeConfig::default().kv_overlap_weight)]
    pub kv_overlap_weight: f64,
    /// `kv_aware`: weight of a token a worker still has to prefill for earlier requests
    /// against a token of the request's own uncached prefix. Below 1, a prompt stays with
    /// the worker caching its prefix through a short queue rather than fill another
    /// worker's cache with the same pages (1: both count alike, as Dynamo's cost).
    #[arg(long, env = env::KV_BACKLOG_WEIGHT, default_value_t = ServeConfig::default().kv_backlog_weight)]
    pub kv_backlog_weight: f64,
    /// `kv_aware`: weight of a request in flight on a worker, in mean prompts (0: they only
    /// break ties; what a request still costs a worker's next prefill is in its prefill
    /// backlog).
    #[arg(long, env = env::KV_LOAD_WEIGHT, default_value_t = ServeConfig::default().kv_load_weight)]
    pub kv_load_weight: f64,
    /// `kv_aware`: do not predict a routed request's pages on its worker until the
    /// worker's events report them (the requests sharing a new prefix that arrive before
    /// then are placed as if nobody held it).
    #[arg(long, env = env::KV_NO_PREDICTIONS)]
    pub kv_no_predictions: bool,
    /// `kv_aware`: what a prompt page in the hosted KV master's store (L3, written there by
    /// SGLang HiCache's Mooncake backend) is worth against one in a worker's GPU cache, for
    /// the pages that continue a worker's cached prefix (a value v says loading a page
    /// costs 1 - v of computing it; 0: the store is not looked at).
    #[arg(long, env = env::KV_L3_PAGE_VALUE, default_value_t = ServeConfig::default().kv_l3_page_value)]
    pub kv_l3_page_value: f64,
    /// `kv_aware`: what a store page that lies only on a storage node's disk tier is worth
    /// against one in a worker's GPU cache (it is read back from disk into memory before
    /// it can be loaded, so below `--kv-l3-page-value`).
    #[arg(long, env = env::KV_L3_DISK_PAGE_VALUE, default_value_t = ServeConfig::default().kv_l3_disk_page_value)]
    pub kv_l3_disk_page_value: f64,
    /// `kv_aware`: what a page in a worker's host memory (SGLang HiCache's L2, events with
    /// a medium other than the GPU's) is worth against one in its GPU cache (it is loaded,
    /// not computed).
    #[arg(long, env = env::KV_HOST_PAGE_VALUE, default_value_t = ServeConfig::default().kv_host_page_value)]
    pub kv_host_page_value: f64,
    /// `kv_aware`: the store object that says a page is in L3, `{hash}` standing for the
    /// page's HiCache hash (64 hex digits). HiCache's Mooncake backend writes
    /// `{hash}_{tp_rank}_k` and `_v` for MHA models and `{hash}__k` for MLA ones, after a
    /// deployment prefix when one is set.
    #[arg(long, env = env::KV_L3_KEY_FORMAT, default_value_t = ServeConfig::default().kv_l3_key_format)]
    pub kv_l3_key_format: String,
    /// `kv_aware`: the KV master (comma-separated: an HA cluster's masters) whose store
    /// this gateway follows through its object events when it hosts no master that
    /// answers (`--disable-master`, or a second gateway of one deployment). A gateway that
    /// hosts an HA member follows its leader without it.
    #[arg(long, env = env::KV_L3_MASTER_URL)]
    pub kv_l3_master_url: Option<String>,
    /// `kv_aware`: softmax temperature over the workers' costs (0: the cheapest always).
    #[arg(long, env = env::ROUTER_TEMPERATURE, default_value_t = ServeConfig::default().router_temperature)]
    pub router_temperature: f64,
    /// `kv_aware`: every worker's KV events endpoint, `{host}` standing for the worker's
    /// host (e.g. `tcp://{host}:5557`); absent: read from each worker's
    /// `/get_server_info` (`kv_events_config`).
    #[arg(long, env = env::KV_EVENTS_ENDPOINT)]
    pub kv_events_endpoint: Option<String>,
    /// `kv_aware`: a local Hugging Face tokenizer (a directory with `tokenizer.json` and
    /// `tokenizer_config.json`, or the `tokenizer.json` file) to turn text and chat prompts
    /// into the token ids the workers cache (absent: only token-id prompts are matched
    /// against the workers' KV events; others are routed by `cache_aware`).
    #[arg(long, env = env::TOKENIZER_PATH)]
    pub tokenizer_path: Option<std::path::PathBuf>,
    /// A chat template file (Jinja) that replaces the tokenizer's own.
    #[arg(long, env = env::CHAT_TEMPLATE)]
    pub chat_template: Option<std::path::PathBuf>,
    /// Bytes of the tokenizer's caches (0: none, every prompt rendered and encoded whole):
    /// 7/8 for encoded pieces (the text between special tokens: a conversation's earlier
    /// turns, a shared system prompt), so a prompt is encoded only where it is new; 1/8
    /// for the ids of whole chat prompts, so one sent again is not rendered again either.
    #[arg(long, env = env::TOKENIZER_CACHE_SIZE, default_value_t = ServeConfig::default().tokenizer_cache_size)]
    pub tokenizer_cache_size: usize,
    /// PD: send a request to the decode worker alone when fewer than this many of its
    /// prompt tokens are not cached there (0: always disaggregate).
    #[arg(long, env = env::PD_MIN_UNCACHED_TOKENS, default_value_t = ServeConfig::default().pd_min_uncached_tokens)]
    pub pd_min_uncached_tokens: u64,
    /// PD: ... or when the uncached share of the prompt is below this (0.0-1.0; 0: off).
    #[arg(long, env = env::PD_MIN_UNCACHED_RATIO, default_value_t = ServeConfig::default().pd_min_uncached_ratio)]
    pub pd_min_uncached_ratio: f64,
    /// PD: ... or when every prefill worker has at least this many requests in flight and
    /// the decode worker fewer (0: off).
    #[arg(long, env = env::PD_PREFILL_BUSY_LOAD, default_value_t = ServeConfig::default().pd_prefill_busy_load)]
    pub pd_prefill_busy_load: usize,
    /// Request headers holding the client's request id, first found wins (else one is
    /// minted); it is sent to workers and echoed back as `x-request-id`.
    #[arg(long, env = env::REQUEST_ID_HEADERS, num_args = 1.., value_delimiter = ',',
          default_values_t = ServeConfig::default().request_id_headers)]
    pub request_id_headers: Vec<String>,
    /// Seconds to let in-flight requests finish on shutdown.
    #[arg(long, env = env::SHUTDOWN_GRACE_PERIOD_SECS, default_value_t = ServeConfig::default().shutdown_grace_period_secs)]
    pub shutdown_grace_period_secs: u64,
    /// Host of the extra Prometheus listener (metrics are always at `/metrics` on the main port).
    #[arg(long, env = env::PROMETHEUS_HOST, default_value_t = ServeConfig::default().prometheus_host)]
    pub prometheus_host: String,
    /// Port of an extra listener serving only `/metrics` (off when absent).
    #[arg(long, env = env::PROMETHEUS_PORT)]
    pub prometheus_port: Option<u16>,
    /// Runtime threads: 0 = one per CPU the process may run on; 1 = a single-threaded
    /// runtime (what a process pinned to one core gets with 0, too).
    #[arg(long, env = env::WORKER_THREADS, default_value_t = ServeConfig::default().worker_threads)]
    pub worker_threads: usize,
    /// Prefill/decode disaggregation: every request goes to a prefill worker and a decode
    /// worker at once (with SGLang's bootstrap fields), and decode's answer is returned.
    #[arg(long, env = env::PD_DISAGGREGATION)]
    pub pd_disaggregation: bool,
    /// Prefill workers, each `[URL]` or `[URL, BOOTSTRAP_PORT|none]` (from `--prefill`; in a
    /// config file `prefill = [["http://p1:30000", "8998"], ["http://p2:30000"]]`).
    #[arg(skip)]
    pub prefill: Vec<Vec<String>>,
    /// A prefill worker and its bootstrap port (`none`: the worker's default), repeatable:
    /// `--prefill http://p1:30000 8998 --prefill http://p2:30000 none`.
    #[doc(hidden)]
    #[arg(long = "prefill", id = PREFILL_CLI, num_args = 1..=2,
          action = clap::ArgAction::Append, value_names = ["URL", "BOOTSTRAP_PORT"])]
    #[serde(skip)]
    pub prefill_cli: Vec<String>,
    /// Decode workers, e.g. `--decode http://d1:30000 --decode http://d2:30000`.
    #[arg(long, env = env::DECODE, num_args = 1.., action = clap::ArgAction::Append,
          value_delimiter = ',')]
    pub decode: Vec<String>,
    /// Policy choosing the prefill worker (default: `--policy`).
    #[arg(long, env = env::PREFILL_POLICY, value_enum)]
    pub prefill_policy: Option<PolicyKind>,
    /// Policy choosing the decode worker (default: `--policy`).
    #[arg(long, env = env::DECODE_POLICY, value_enum)]
    pub decode_policy: Option<PolicyKind>,
    /// Do not host the KV master (no `/api/v1/...` or `/metadata` routes, no background task).
    #[arg(long, env = env::DISABLE_MASTER)]
    pub disable_master: bool,
    /// Port of Mooncake's master HTTP service for the hosted master (what `mooncake_master`
    /// serves on its `--metrics_port`): `/get_all_segments` (SGLang's
    /// `MOONCAKE_CHECK_SERVER`), `/query_key`, `/batch_query_keys`, `/get_segments_detail`,
    /// `/get_all_keys`, `/query_segment`, `/health`, `/metrics`. Admin plane: the admin key,
    /// or loopback callers without one. Off when absent.
    #[arg(long, env = env::MOONCAKE_HTTP_PORT)]
    pub mooncake_http_port: Option<u16>,
    /// Address `--mooncake-http-port` binds.
    #[arg(long, env = env::MOONCAKE_HTTP_HOST, default_value_t = ServeConfig::default().mooncake_http_host)]
    pub mooncake_http_host: String,
    /// Admin API key: the worker API (`/workers`) and the KV master's admin routes require
    /// `Authorization: Bearer <key>` (401 otherwise), and every other plane accepts it.
    /// Without one, those routes answer loopback callers only (403 for others). Reloaded on
    /// SIGHUP.
    #[arg(long, env = env::ADMIN_API_KEY, hide_env_values = true)]
    pub admin_api_key: Option<Secret>,
    /// Without an admin key, answer the admin routes from every peer, not only loopback
    /// (a warning is logged every minute while this is so).
    #[arg(long, env = env::INSECURE_OPEN_ADMIN)]
    pub insecure_open_admin: bool,
    /// File of client API keys, one per line (blank lines and `#` comment lines allowed).
    /// When set, the inference routes require `Authorization: Bearer <key>` with one of them
    /// (401 otherwise); the key is not forwarded to workers. Read again on SIGHUP.
    #[arg(long, env = env::CLIENT_API_KEYS_FILE)]
    pub client_api_keys_file: Option<PathBuf>,
    /// The KV master's store key (what storage nodes and store clients send). Default: the
    /// key derived from the transfer secret (`--transfer-secret-file`), so the nodes that
    /// hold that file need no other setting.
    #[arg(long, env = env::STORE_API_KEY, hide_env_values = true)]
    pub store_api_key: Option<Secret>,
    /// The cluster's transfer secret file, from which the store key is derived. Default: the
    /// per-user file `~/.config/moongate/transfer-secret` (made on first use, mode 0600).
    #[arg(long, env = env::TRANSFER_SECRET_FILE)]
    pub transfer_secret_file: Option<PathBuf>,
    /// Origins allowed to call this server from a browser (CORS): exact origins such as
    /// `https://app.example.com`, or `*` for any. Off when empty.
    #[arg(long, env = env::CORS_ALLOWED_ORIGINS, num_args = 1.., value_delimiter = ',')]
    pub cors_allowed_origins: Vec<String>,
    /// Log JSON lines (one object per line, with the request's id on every line logged
    /// while serving it) instead of text.
    #[arg(long, env = env::LOG_JSON)]
    pub log_json: bool,
    /// The hosted KV master (`[master]` in the TOML file).
    #[command(flatten)]
    pub master: MasterConfig,
    /// The hosted master as one of an HA cluster on etcd (`[ha]` in the TOML file).
    #[command(flatten)]
    pub ha: kvmaster::HaConfig,
    /// Workers found from Kubernetes pods (`[discovery]` in the TOML file).
    #[command(flatten)]
    pub discovery: DiscoveryConfig,
}

/// One `--prefill URL [BOOTSTRAP_PORT|none]`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillSpec {
    /// The worker URL as given.
    pub url: String,
    /// Its bootstrap port (`None`: `none` or not given, the worker's default).
    pub bootstrap_port: Option<u16>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            host: "0.0.0.0".into(),
            port: 30000,
            worker_urls: Vec::new(),
            policy: PolicyKind::PowerOfTwo,
            // smg's header names, so its clients keep their affinity on the switch.
            routing_key_header: "x-smg-routing-key".into(),
            target_worker_header: "x-smg-target-worker".into(),
            sticky_max_keys: 100_000,
            sticky_max_idle_secs: 4 * 3600,
            responses_max_ids: 100_000,
            priority_header: "x-smg-priority".into(),
            priority_aging_secs: 5,
            load_poll_interval_secs: 1,
            least_load_kv_weight: 0.15,
            api_key: None,
            worker_ca_cert: None,
            tls_cert_file: None,
            tls_key_file: None,
            otlp_traces_endpoint: None,
            max_payload_size: 512 * 1024 * 1024,
            max_batch_size: 4096,
            client_header_timeout_secs: 60,
            client_body_timeout_secs: 60,
            max_connections: 10_000,
            busy_poll_us: kvmaster::busy_poll::DEFAULT_BUSY_POLL_US,
            request_timeout_secs: 1800,
            log_level: LogLevel::Info,
            health_check_interval_secs: 60,
            health_check_timeout_secs: 5,
            health_failure_threshold: 3,
            health_success_threshold: 2,
            health_check_endpoint: "/health".into(),
            disable_health_check: false,
            dp_aware: false,
            health_check_pending_interval_ms: 500,
            retry_max_retries: 5,
            retry_initial_backoff_ms: 50,
            retry_max_backoff_ms: 30_000,
            retry_backoff_multiplier: 1.5,
            retry_jitter_factor: 0.2,
            disable_retries: false,
            cb_failure_threshold: 10,
            cb_success_threshold: 3,
            cb_timeout_duration_secs: 60,
            cb_window_duration_secs: 120,
            disable_circuit_breaker: false,
            max_concurrent_requests: -1,
            queue_size: 100,
            queue_timeout_secs: 60,
            rate_limit_tokens_per_second: None,
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            eviction_interval_secs: 60,
            max_tree_size: 64 * 1024 * 1024,
            kv_overlap_weight: 1.0,
            kv_backlog_weight: 0.25,
            kv_load_weight: 0.0,
            kv_no_predictions: false,
            kv_l3_page_value: 0.5,
            kv_l3_disk_page_value: 0.25,
            kv_host_page_value: 0.5,
            kv_l3_key_format: "{hash}_0_k".into(),
            kv_l3_master_url: None,
            router_temperature: 0.0,
            kv_events_endpoint: None,
            tokenizer_path: None,
            chat_template: None,
            tokenizer_cache_size: 64 * 1024 * 1024,
            pd_min_uncached_tokens: 0,
            pd_min_uncached_ratio: 0.0,
            pd_prefill_busy_load: 0,
            request_id_headers: [
                "x-request-id",
                "x-correlation-id",
                "x-trace-id",
                "request-id",
            ]
            .map(String::from)
            .into(),
            shutdown_grace_period_secs: 180,
            prometheus_host: "0.0.0.0".into(),
            prometheus_port: None,
            worker_threads: 0,
            pd_disaggregation: false,
            prefill: Vec::new(),
            prefill_cli: Vec::new(),
            decode: Vec::new(),
            prefill_policy: None,
            decode_policy: None,
            disable_master: false,
            mooncake_http_port: None,
            mooncake_http_host: "0.0.0.0".into(),
            admin_api_key: None,
            insecure_open_admin: false,
            client_api_keys_file: None,
            store_api_key: None,
            transfer_secret_file: None,
            cors_allowed_origins: Vec::new(),
            log_json: false,
            master: MasterConfig::default(),
            ha: kvmaster::HaConfig::default(),
            discovery: DiscoveryConfig::default(),
        }
    }
}

/// A configuration that cannot be used, with every problem found.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The `--config` file is not valid TOML for this struct.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (names the key and line).
        message: String,
    },
    /// Merging flags/env over the file failed.
    #[error("invalid setting: {0}")]
    Merge(String),
    /// Values that parse but make no sense together.
    #[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
}

impl ServeConfig {
    /// The `--prefill` entries, parsed (each an error message when it does not parse).
    pub fn prefill_specs(&self) -> Vec<Result<PrefillSpec, String>> {
        self.prefill.iter().map(|v| parse_prefill(v)).collect()
    }

    /// The policy choosing prefill workers.
    pub fn prefill_policy(&self) -> PolicyKind {
        self.prefill_policy.unwrap_or(self.policy)
    }

    /// The policy choosing decode workers.
    pub fn decode_policy(&self) -> PolicyKind {
        self.decode_policy.unwrap_or(self.policy)
    }

    /// Merges defaults, the TOML file at `file` (if any), then the environment variables and
    /// flags that `matches` says were given, then validates. `cli` is `matches` parsed.
    pub fn resolve(
        cli: &Self,
        file: Option<&Path>,
        matches: &ArgMatches,
    ) -> Result<Self, ConfigError> {
        let mut cfg = merge_sources(cli, file, matches)?;
        // clap flattens repeated multi-value flags; the occurrences keep each `--prefill`'s
        // URL and port together.
        if let Some(occ) = matches.get_occurrences::<String>(PREFILL_CLI) {
            cfg.prefill = occ.map(|o| o.cloned().collect()).collect();
        }
        cfg.prefill_cli.clear();
        cfg.validate()?;
        Ok(cfg)
    }

    /// The number of runtime threads to start (`worker_threads`, or the CPUs available).
    pub fn runtime_threads(&self) -> usize {
        runtime_threads(self.worker_threads)
    }

    /// The configuration as TOML (what `--print-config` shows; a valid `--config` file).
    pub fn to_toml(&self) -> String {
        let mut shown = self.clone();
        if shown.api_key.is_some() {
            shown.api_key = Some("<hidden>".into());
        }
        if shown.admin_api_key.is_some() {
            shown.admin_api_key = Some(hidden());
        }
        if shown.store_api_key.is_some() {
            shown.store_api_key = Some(hidden());
        }
        render_toml(&shown)
    }
}

/// The runtime threads `worker_threads` asks for: itself, or the CPUs available for 0.
fn runtime_threads(worker_threads: usize) -> usize {
    match worker_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

impl ConfigError {
    /// `Ok` when `problems` is empty, else every problem.
    fn check(problems: Vec<String>) -> Result<(), Self> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Self::Invalid(problems))
        }
    }
}

/// `value` as TOML, or a comment saying why it cannot be rendered.
fn render_toml<T: Serialize>(value: &T) -> String {
    toml::to_string(value).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
}

/// What `--print-config` shows instead of a secret.
pub fn hidden() -> Secret {
    Secret::new("<hidden>")
}

#[cfg(test)]
mod tests;
