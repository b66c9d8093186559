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
//! The hosted KV master's settings are [`kvstore::MasterConfig`] (defaults written there):
//! a `[master]` table in the TOML file, `MOONGATE_MASTER_*` variables, `--master-*` flags.
//! [`MasterHostConfig`] is `moongate master` (the master alone), through the same pipeline.

mod master;

use std::fmt;
use std::path::{Path, PathBuf};

use clap::{ArgMatches, parser::ValueSource};
use kvstore::MasterConfig;
pub use kvstore::Secret;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

pub use master::MasterHostConfig;

/// Environment variable names, one per setting (`MOONGATE_` + the field name in capitals).
pub mod env {
    /// `--config`.
    pub const CONFIG: &str = "MOONGATE_CONFIG";
    /// `--host`.
    pub const HOST: &str = "MOONGATE_HOST";
    /// `--port`.
    pub const PORT: &str = "MOONGATE_PORT";
    /// `--worker-urls` (comma-separated in the environment).
    pub const WORKER_URLS: &str = "MOONGATE_WORKER_URLS";
    /// `--policy`.
    pub const POLICY: &str = "MOONGATE_POLICY";
    /// `--api-key`.
    pub const API_KEY: &str = "MOONGATE_API_KEY";
    /// `--max-payload-size`.
    pub const MAX_PAYLOAD_SIZE: &str = "MOONGATE_MAX_PAYLOAD_SIZE";
    /// `--request-timeout-secs`.
    pub const REQUEST_TIMEOUT_SECS: &str = "MOONGATE_REQUEST_TIMEOUT_SECS";
    /// `--log-level`.
    pub const LOG_LEVEL: &str = "MOONGATE_LOG_LEVEL";
    /// `--health-check-interval-secs`.
    pub const HEALTH_CHECK_INTERVAL_SECS: &str = "MOONGATE_HEALTH_CHECK_INTERVAL_SECS";
    /// `--health-check-timeout-secs`.
    pub const HEALTH_CHECK_TIMEOUT_SECS: &str = "MOONGATE_HEALTH_CHECK_TIMEOUT_SECS";
    /// `--health-failure-threshold`.
    pub const HEALTH_FAILURE_THRESHOLD: &str = "MOONGATE_HEALTH_FAILURE_THRESHOLD";
    /// `--health-success-threshold`.
    pub const HEALTH_SUCCESS_THRESHOLD: &str = "MOONGATE_HEALTH_SUCCESS_THRESHOLD";
    /// `--health-check-endpoint`.
    pub const HEALTH_CHECK_ENDPOINT: &str = "MOONGATE_HEALTH_CHECK_ENDPOINT";
    /// `--disable-health-check`.
    pub const DISABLE_HEALTH_CHECK: &str = "MOONGATE_DISABLE_HEALTH_CHECK";
    /// `--health-check-pending-interval-ms`.
    pub const HEALTH_CHECK_PENDING_INTERVAL_MS: &str = "MOONGATE_HEALTH_CHECK_PENDING_INTERVAL_MS";
    /// `--retry-max-retries`.
    pub const RETRY_MAX_RETRIES: &str = "MOONGATE_RETRY_MAX_RETRIES";
    /// `--disable-retries`.
    pub const DISABLE_RETRIES: &str = "MOONGATE_DISABLE_RETRIES";
    /// `--shutdown-grace-period-secs`.
    pub const SHUTDOWN_GRACE_PERIOD_SECS: &str = "MOONGATE_SHUTDOWN_GRACE_PERIOD_SECS";
    /// `--prometheus-host`.
    pub const PROMETHEUS_HOST: &str = "MOONGATE_PROMETHEUS_HOST";
    /// `--prometheus-port`.
    pub const PROMETHEUS_PORT: &str = "MOONGATE_PROMETHEUS_PORT";
    /// `--worker-threads`.
    pub const WORKER_THREADS: &str = "MOONGATE_WORKER_THREADS";
    /// `--pd-disaggregation`.
    pub const PD_DISAGGREGATION: &str = "MOONGATE_PD_DISAGGREGATION";
    /// `--decode` (comma-separated in the environment).
    pub const DECODE: &str = "MOONGATE_DECODE";
    /// `--prefill-policy`.
    pub const PREFILL_POLICY: &str = "MOONGATE_PREFILL_POLICY";
    /// `--decode-policy`.
    pub const DECODE_POLICY: &str = "MOONGATE_DECODE_POLICY";
    /// `--disable-master`.
    pub const DISABLE_MASTER: &str = "MOONGATE_DISABLE_MASTER";
    /// `--admin-api-key`.
    pub const ADMIN_API_KEY: &str = "MOONGATE_ADMIN_API_KEY";
}

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
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Random => "random",
            Self::RoundRobin => "round_robin",
            Self::PowerOfTwo => "power_of_two",
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
/// field names in kebab case; environment variables are in [`env`]. The hosted master's
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
    /// API key sent to workers as `Authorization: Bearer` (a worker's own key wins).
    #[arg(long, env = env::API_KEY, hide_env_values = true)]
    pub api_key: Option<String>,
    /// Largest request body accepted, in bytes (bodies are read whole, up to this size, to
    /// route by model; larger ones get 413).
    #[arg(long, env = env::MAX_PAYLOAD_SIZE, default_value_t = ServeConfig::default().max_payload_size)]
    pub max_payload_size: usize,
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
    /// How many other workers a request may be retried on when its worker cannot be reached
    /// (only before any response byte; each retry selects again, excluding workers that failed).
    #[arg(long, env = env::RETRY_MAX_RETRIES, default_value_t = ServeConfig::default().retry_max_retries)]
    pub retry_max_retries: u32,
    /// Never retry.
    #[arg(long, env = env::DISABLE_RETRIES)]
    pub disable_retries: bool,
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
    /// Admin API key. When set, the worker API (`/workers`) and the KV master's routes
    /// (`/api/v1/...`, `/metadata`) require `Authorization: Bearer <key>` (401 otherwise);
    /// inference, health, metrics and the API docs stay open.
    #[arg(long, env = env::ADMIN_API_KEY, hide_env_values = true)]
    pub admin_api_key: Option<Secret>,
    /// The hosted KV master (`[master]` in the TOML file).
    #[command(flatten)]
    pub master: MasterConfig,
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
            api_key: None,
            max_payload_size: 512 * 1024 * 1024,
            request_timeout_secs: 1800,
            log_level: LogLevel::Info,
            health_check_interval_secs: 60,
            health_check_timeout_secs: 5,
            health_failure_threshold: 3,
            health_success_threshold: 2,
            health_check_endpoint: "/health".into(),
            disable_health_check: false,
            health_check_pending_interval_ms: 500,
            retry_max_retries: 5,
            disable_retries: false,
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
            admin_api_key: None,
            master: MasterConfig::default(),
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
    /// Checks every value; lists all problems, not just the first.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errs = Vec::new();
        if self.host.trim().is_empty() {
            errs.push("host must not be empty".to_string());
        }
        let mut seen = std::collections::HashSet::new();
        let prefill = self.prefill_specs();
        let pd_urls = prefill
            .iter()
            .filter_map(|p| p.as_ref().ok().map(|p| &p.url))
            .chain(&self.decode);
        for e in prefill.iter().filter_map(|p| p.as_ref().err()) {
            errs.push(e.clone());
        }
        for url in self.worker_urls.iter().chain(pd_urls) {
            match crate::workers::WorkerUrl::parse(url) {
                Ok(u) if !seen.insert(u.as_str().to_string()) => {
                    errs.push(format!("worker url {url} is listed twice"))
                }
                Ok(_) => {}
                Err(e) => errs.push(format!("worker url {url:?}: {e}")),
            }
        }
        let positive = [
            ("max_payload_size", self.max_payload_size as u64),
            ("request_timeout_secs", self.request_timeout_secs),
            (
                "health_check_interval_secs",
                self.health_check_interval_secs,
            ),
            ("health_check_timeout_secs", self.health_check_timeout_secs),
            (
                "health_failure_threshold",
                u64::from(self.health_failure_threshold),
            ),
            (
                "health_success_threshold",
                u64::from(self.health_success_threshold),
            ),
            (
                "health_check_pending_interval_ms",
                self.health_check_pending_interval_ms,
            ),
            (
                "shutdown_grace_period_secs",
                self.shutdown_grace_period_secs,
            ),
        ];
        for (name, v) in positive {
            if v == 0 {
                errs.push(format!("{name} must be at least 1"));
            }
        }
        if !self.health_check_endpoint.starts_with('/') {
            errs.push(format!(
                "health_check_endpoint must start with '/', got {:?}",
                self.health_check_endpoint
            ));
        }
        if self.prometheus_port.is_some()
            && self.prometheus_port == Some(self.port)
            && self.port != 0
        {
            errs.push("prometheus_port must differ from port".to_string());
        }
        if self.pd_disaggregation && !self.worker_urls.is_empty() {
            errs.push(
                "worker_urls are regular workers; in PD mode give --prefill and --decode".into(),
            );
        }
        let pd_given = !self.prefill.is_empty()
            || !self.decode.is_empty()
            || self.prefill_policy.is_some()
            || self.decode_policy.is_some();
        if !self.pd_disaggregation && pd_given {
            errs.push("prefill, decode and their policies need --pd-disaggregation".into());
        }
        errs.extend(admin_key_problem(&self.admin_api_key));
        errs.extend(master_problem(&self.master));
        ConfigError::check(errs)
    }

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
        render_toml(&shown)
    }
}

/// Parses `[URL]` or `[URL, PORT|none]`.
fn parse_prefill(v: &[String]) -> Result<PrefillSpec, String> {
    let (url, port) = match v {
        [url] => (url, None),
        [url, port] => (url, Some(port.as_str())),
        _ => {
            return Err(format!(
                "prefill takes URL [BOOTSTRAP_PORT|none], got {v:?}"
            ));
        }
    };
    let bootstrap_port = match port {
        None => None,
        Some(p) if p.eq_ignore_ascii_case("none") => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                return Err(format!(
                    "prefill {url}: bootstrap port must be 1..=65535 or `none`, got {p:?}"
                ));
            }
        },
    };
    Ok(PrefillSpec {
        url: url.clone(),
        bootstrap_port,
    })
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
fn hidden() -> Secret {
    Secret::new("<hidden>")
}

/// The problem with an admin key setting, if any: it must be non-empty visible ASCII
/// without spaces, or no client could send it as `Authorization: Bearer <key>`.
fn admin_key_problem(key: &Option<Secret>) -> Option<String> {
    let k = key.as_ref()?.expose();
    let ok = !k.is_empty() && k.bytes().all(|b| b.is_ascii_graphic());
    (!ok).then(|| "admin_api_key must be non-empty visible ASCII without spaces".to_string())
}

/// The problem with the master's settings, if any.
fn master_problem(master: &MasterConfig) -> Option<String> {
    master.validate().err().map(|e| match e {
        kvstore::MasterError::InvalidParams(m) => format!("master: {m}"),
        other => format!("master: {other}"),
    })
}

/// Defaults (or the TOML file at `file`, whose missing keys keep their defaults), then the
/// environment variables and flags that `matches` says were given. Not validated yet.
pub fn merge_sources<T>(
    cli: &T,
    file: Option<&Path>,
    matches: &ArgMatches,
) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned + Default,
{
    let base = match file {
        Some(path) => read_toml(path)?,
        None => T::default(),
    };
    overlay_given(base, cli, matches)
}

/// Reads a TOML file into `T`; keys it lacks keep `T`'s defaults (`#[serde(default)]`).
pub fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Copies into `base` every field that was given on the command line or in the
/// environment (per `matches`), taking the value from `given`. Field names and clap ids
/// are the same (clap derives ids from field names), which is what makes this generic; an
/// id with dots (`master.lease_ttl_ms`) names a field of a nested struct.
pub fn overlay_given<T>(base: T, given: &T, matches: &ArgMatches) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned,
{
    let to_value = |v: &T| serde_json::to_value(v).map_err(|e| ConfigError::Merge(e.to_string()));
    let mut merged = to_value(&base)?;
    let given = to_value(given)?;
    for id in matches.ids() {
        let explicit = matches!(
            matches.value_source(id.as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if !explicit {
            continue;
        }
        let pointer = format!("/{}", id.as_str().replace('.', "/"));
        let Some(value) = given.pointer(&pointer) else {
            continue;
        };
        match merged.pointer_mut(&pointer) {
            Some(slot) => *slot = value.clone(),
            None => {
                // A field the base left out (e.g. skipped when empty): add it to its parent.
                let (parent, field) = pointer.rsplit_once('/').unwrap_or(("", ""));
                if let Some(obj) = merged.pointer_mut(parent).and_then(|p| p.as_object_mut()) {
                    obj.insert(field.to_string(), value.clone());
                }
            }
        }
    }
    serde_json::from_value(merged).map_err(|e| ConfigError::Merge(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser, Debug)]
    struct Cmd {
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        serve: ServeConfig,
    }

    fn resolve(args: &[&str]) -> Result<ServeConfig, ConfigError> {
        let matches = Cmd::command()
            .try_get_matches_from(args)
            .expect("args parse");
        let cmd = Cmd::from_arg_matches(&matches).expect("from matches");
        ServeConfig::resolve(&cmd.serve, cmd.config.as_deref(), &matches)
    }

    #[test]
    fn defaults_come_from_the_struct() {
        assert_eq!(resolve(&["x"]).unwrap(), ServeConfig::default());
        let help = Cmd::command().render_long_help().to_string();
        assert!(help.contains("[default: 30000]"), "{help}");
        assert!(help.contains("[default: power_of_two]"));
    }

    #[test]
    fn sglang_router_command_line_is_accepted() {
        let cfg = resolve(&[
            "x",
            "--host",
            "127.0.0.1",
            "--port",
            "34001",
            "--policy",
            "round_robin",
            "--worker-urls",
            "http://127.0.0.1:31001",
            "http://127.0.0.1:31002",
            "--api-key",
            "k",
            "--max-payload-size",
            "1024",
            "--request-timeout-secs",
            "9",
            "--log-level",
            "warn",
            "--health-check-interval-secs",
            "10",
            "--health-failure-threshold",
            "2",
            "--health-success-threshold",
            "1",
            "--health-check-timeout-secs",
            "3",
            "--health-check-endpoint",
            "/healthz",
        ])
        .unwrap();
        assert_eq!(cfg.port, 34001);
        assert_eq!(cfg.policy, PolicyKind::RoundRobin);
        assert_eq!(cfg.worker_urls.len(), 2);
        assert_eq!(cfg.api_key.as_deref(), Some("k"));
        assert_eq!((cfg.max_payload_size, cfg.request_timeout_secs), (1024, 9));
        assert_eq!(cfg.log_level, LogLevel::Warn);
        assert_eq!(cfg.health_check_interval_secs, 10);
        assert_eq!(
            (cfg.health_failure_threshold, cfg.health_success_threshold),
            (2, 1)
        );
        assert_eq!(cfg.health_check_endpoint, "/healthz");
    }

    #[test]
    fn sglang_router_pd_command_line_is_accepted() {
        // Exactly how the shared router bench starts a PD router.
        let cfg = resolve(&[
            "x",
            "--host",
            "127.0.0.1",
            "--port",
            "34002",
            "--policy",
            "round_robin",
            "--pd-disaggregation",
            "--prefill",
            "http://127.0.0.1:31011",
            "38998",
            "--decode",
            "http://127.0.0.1:31021",
        ])
        .unwrap();
        assert!(cfg.pd_disaggregation);
        let p: Vec<_> = cfg
            .prefill_specs()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            p,
            vec![PrefillSpec {
                url: "http://127.0.0.1:31011".into(),
                bootstrap_port: Some(38998)
            }]
        );
        assert_eq!(cfg.decode, vec!["http://127.0.0.1:31021".to_string()]);
        assert_eq!(
            (cfg.prefill_policy(), cfg.decode_policy()),
            (PolicyKind::RoundRobin, PolicyKind::RoundRobin)
        );

        let cfg = resolve(&[
            "x",
            "--pd-disaggregation",
            "--prefill",
            "http://p1:1",
            "none",
            "--prefill",
            "http://p2:1",
            "--decode",
            "http://d1:1",
            "--decode",
            "http://d2:1",
            "--prefill-policy",
            "random",
            "--decode-policy",
            "power_of_two",
        ])
        .unwrap();
        let ports: Vec<_> = cfg
            .prefill_specs()
            .into_iter()
            .map(|p| p.unwrap().bootstrap_port)
            .collect();
        assert_eq!(ports, vec![None, None]);
        assert_eq!(cfg.decode.len(), 2);
        assert_eq!(
            (cfg.prefill_policy(), cfg.decode_policy()),
            (PolicyKind::Random, PolicyKind::PowerOfTwo)
        );
        // The TOML form round-trips.
        let back: ServeConfig = toml::from_str(&cfg.to_toml()).unwrap();
        assert_eq!(back, cfg);

        for (args, needle) in [
            (
                &[
                    "x",
                    "--pd-disaggregation",
                    "--prefill",
                    "http://p:1",
                    "port",
                ][..],
                "bootstrap port",
            ),
            (
                &["x", "--prefill", "http://p:1"][..],
                "need --pd-disaggregation",
            ),
            (
                &[
                    "x",
                    "--pd-disaggregation",
                    "--worker-urls",
                    "http://w:1",
                    "--decode",
                    "http://d:1",
                ][..],
                "PD mode",
            ),
            (
                &[
                    "x",
                    "--pd-disaggregation",
                    "--prefill",
                    "http://a:1",
                    "--decode",
                    "http://a:1",
                ][..],
                "listed twice",
            ),
            (
                &["x", "--pd-disaggregation", "--decode", "d:1"][..],
                "missing scheme",
            ),
        ] {
            let err = resolve(args).unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.toml");
        std::fs::write(
            &path,
            "port = 4000\npolicy = \"random\"\nworker_urls = [\"http://a:1\"]\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let cfg = resolve(&["x", "--config", p]).unwrap();
        assert_eq!(
            (cfg.port, cfg.policy, cfg.host.as_str()),
            (4000, PolicyKind::Random, "0.0.0.0")
        );
        // A flag beats the file; a flag left at its default does not.
        let cfg = resolve(&["x", "--config", p, "--port", "5000"]).unwrap();
        assert_eq!((cfg.port, cfg.policy), (5000, PolicyKind::Random));
        assert_eq!(cfg.worker_urls, vec!["http://a:1".to_string()]);
    }

    #[test]
    fn bad_file_and_bad_values_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.toml");
        std::fs::write(&path, "prot = 4000\n").unwrap();
        let err = resolve(&["x", "--config", path.to_str().unwrap()]).unwrap_err();
        assert!(err.to_string().contains("prot"), "{err}");
        let err = resolve(&["x", "--config", "/nonexistent/m.toml"]).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));

        let err = resolve(&[
            "x",
            "--worker-urls",
            "localhost:8000",
            "http://a:1",
            "http://a:1/",
            "--health-failure-threshold",
            "0",
            "--health-check-endpoint",
            "health",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("localhost:8000"), "{err}");
        assert!(err.contains("listed twice"), "{err}");
        assert!(err.contains("health_failure_threshold"), "{err}");
        assert!(err.contains("health_check_endpoint"), "{err}");
    }

    #[test]
    fn toml_round_trip_hides_the_key() {
        let cfg = ServeConfig {
            api_key: Some("secret".into()),
            ..ServeConfig::default()
        };
        let text = cfg.to_toml();
        assert!(!text.contains("secret") && text.contains("<hidden>"));
        let back: ServeConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.port, cfg.port);
    }
}
