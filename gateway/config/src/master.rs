//! `moongate master`: the KV master alone, configured through the same pipeline as
//! `moongate serve` (defaults < `--config` TOML < `MOONGATE_*` environment < flags, then
//! [`MasterHostConfig::validate`]). The keys it shares with `serve` (host, port, admin key,
//! log level, grace period, threads, the `[master]` table) have the same names, variables
//! and defaults, so one file or environment configures either command.

use std::path::Path;

use clap::ArgMatches;
use kvmaster::MasterConfig;
use serde::{Deserialize, Serialize};

use super::{
    ConfigError, LogLevel, Secret, ServeConfig, env, hidden, master_problem, merge_sources,
    render_toml, runtime_threads, security, validate,
};

/// Everything `moongate master` can be told. Field names are the TOML keys; flags are the
/// field names in kebab case; environment variables are [`env`](mod@env)'s
/// (`MOONGATE_HOST`, ...) and `kvmaster::master::env`'s for the `[master]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct MasterHostConfig {
    /// Address to bind (IPv4, IPv6 or a host name).
    #[arg(long, env = env::HOST, default_value_t = MasterHostConfig::default().host)]
    pub host: String,
    /// Port to bind (0: any free port). Store clients default to this port too.
    #[arg(long, env = env::PORT, default_value_t = MasterHostConfig::default().port)]
    pub port: u16,
    /// Admin API key: the master's admin routes (cluster-wide reads, bulk removal) require
    /// `Authorization: Bearer <key>` (401 otherwise), and the store routes accept it too.
    /// Without one, the admin routes answer loopback callers only (403 for others).
    #[arg(long, env = env::ADMIN_API_KEY, hide_env_values = true)]
    pub admin_api_key: Option<Secret>,
    /// PEM certificate chain: serve HTTPS (HTTP/1.1 and HTTP/2 by ALPN) instead of plain
    /// HTTP. Needs `--tls-key-file`.
    #[arg(long, env = env::TLS_CERT_FILE)]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of `--tls-cert-file`.
    #[arg(long, env = env::TLS_KEY_FILE)]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// Without an admin key, answer the admin routes from every peer, not only loopback
    /// (a warning is logged every minute while this is so).
    #[arg(long, env = env::INSECURE_OPEN_ADMIN)]
    pub insecure_open_admin: bool,
    /// The store key (what storage nodes and store clients send). Default: the key derived
    /// from the transfer secret (`--transfer-secret-file`).
    #[arg(long, env = env::STORE_API_KEY, hide_env_values = true)]
    pub store_api_key: Option<Secret>,
    /// The cluster's transfer secret file, from which the store key is derived. Default: the
    /// per-user file `~/.config/moongate/transfer-secret` (made on first use, mode 0600).
    #[arg(long, env = env::TRANSFER_SECRET_FILE)]
    pub transfer_secret_file: Option<std::path::PathBuf>,
    /// Log level.
    #[arg(long, env = env::LOG_LEVEL, value_enum, default_value_t = MasterHostConfig::default().log_level)]
    pub log_level: LogLevel,
    /// Log JSON lines instead of text.
    #[arg(long, env = env::LOG_JSON)]
    pub log_json: bool,
    /// OTLP/HTTP traces endpoint (e.g. `http://collector:4318/v1/traces`): export a span
    /// per master call, continuing the caller's `traceparent` (as `serve`'s). Off when unset.
    #[arg(long, env = env::OTLP_TRACES_ENDPOINT)]
    pub otlp_traces_endpoint: Option<String>,
    /// Seconds to let in-flight requests finish on shutdown.
    #[arg(long, env = env::SHUTDOWN_GRACE_PERIOD_SECS, default_value_t = MasterHostConfig::default().shutdown_grace_period_secs)]
    pub shutdown_grace_period_secs: u64,
    /// Runtime threads: 0 = one per CPU the process may run on; 1 = a single-threaded runtime.
    #[arg(long, env = env::WORKER_THREADS, default_value_t = MasterHostConfig::default().worker_threads)]
    pub worker_threads: usize,
    /// Seconds a client has to send a request's headers (also how long an idle keep-alive
    /// connection stays open), as `serve`'s.
    #[arg(long, env = env::CLIENT_HEADER_TIMEOUT_SECS, default_value_t = MasterHostConfig::default().client_header_timeout_secs)]
    pub client_header_timeout_secs: u64,
    /// Seconds a client has to send a whole request body (408 beyond), as `serve`'s.
    #[arg(long, env = env::CLIENT_BODY_TIMEOUT_SECS, default_value_t = MasterHostConfig::default().client_body_timeout_secs)]
    pub client_body_timeout_secs: u64,
    /// Client connections open at once (more wait in the listen backlog), as `serve`'s.
    #[arg(long, env = env::MAX_CONNECTIONS, default_value_t = MasterHostConfig::default().max_connections)]
    pub max_connections: usize,
    /// Microseconds a connection keeps polling for the next request after an answer
    /// (0: never), as `serve`'s.
    #[arg(long, env = env::BUSY_POLL_US, default_value_t = MasterHostConfig::default().busy_poll_us)]
    pub busy_poll_us: u64,
    /// Port of Mooncake's master HTTP service (what `mooncake_master` serves on its
    /// `--metrics_port`): `/get_all_segments` (SGLang's `MOONCAKE_CHECK_SERVER`),
    /// `/query_key`, `/batch_query_keys`, `/get_segments_detail`, `/get_all_keys`,
    /// `/query_segment`, `/health`, `/metrics`. Admin plane: the admin key, or loopback
    /// callers without one. Off when absent.
    #[arg(long, env = env::MOONCAKE_HTTP_PORT)]
    pub mooncake_http_port: Option<u16>,
    /// Address `--mooncake-http-port` binds.
    #[arg(long, env = env::MOONCAKE_HTTP_HOST, default_value_t = MasterHostConfig::default().mooncake_http_host)]
    pub mooncake_http_host: String,
    /// The store object that says a page is in the store, `{hash}` standing for the page's
    /// HiCache hash (as `serve`'s): which keys `--master-kv-events-endpoint` publishes as
    /// pages.
    #[arg(long, env = env::KV_L3_KEY_FORMAT, default_value_t = MasterHostConfig::default().kv_l3_key_format)]
    pub kv_l3_key_format: String,
    /// The master (`[master]` in the TOML file).
    #[command(flatten)]
    pub master: MasterConfig,
    /// The master as one of an HA cluster on etcd (`[ha]` in the TOML file).
    #[command(flatten)]
    pub ha: kvmaster::HaConfig,
}

impl Default for MasterHostConfig {
    /// `moongate serve`'s defaults for the settings the two share.
    fn default() -> Self {
        let serve = ServeConfig::default();
        Self {
            host: serve.host,
            port: serve.port,
            admin_api_key: serve.admin_api_key,
            tls_cert_file: serve.tls_cert_file,
            tls_key_file: serve.tls_key_file,
            insecure_open_admin: serve.insecure_open_admin,
            store_api_key: serve.store_api_key,
            transfer_secret_file: serve.transfer_secret_file,
            log_level: serve.log_level,
            log_json: serve.log_json,
            otlp_traces_endpoint: serve.otlp_traces_endpoint,
            shutdown_grace_period_secs: serve.shutdown_grace_period_secs,
            worker_threads: serve.worker_threads,
            client_header_timeout_secs: serve.client_header_timeout_secs,
            client_body_timeout_secs: serve.client_body_timeout_secs,
            max_connections: serve.max_connections,
            busy_poll_us: serve.busy_poll_us,
            mooncake_http_port: serve.mooncake_http_port,
            mooncake_http_host: serve.mooncake_http_host,
            kv_l3_key_format: serve.kv_l3_key_format,
            master: serve.master,
            ha: serve.ha,
        }
    }
}

impl MasterHostConfig {
    /// Checks every value; lists all problems, not just the first.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errs = Vec::new();
        if self.host.trim().is_empty() {
            errs.push("host must not be empty".to_string());
        }
        let positive = [
            (
                "shutdown_grace_period_secs",
                self.shutdown_grace_period_secs,
            ),
            (
                "client_header_timeout_secs",
                self.client_header_timeout_secs,
            ),
            ("client_body_timeout_secs", self.client_body_timeout_secs),
            ("max_connections", self.max_connections as u64),
        ];
        errs.extend(validate::listener_problems(&positive, self.busy_poll_us));
        if self
            .mooncake_http_port
            .is_some_and(|p| p != 0 && p == self.port)
        {
            errs.push("mooncake_http_port must differ from port".to_string());
        }
        errs.extend(validate::key_format_problem(&self.kv_l3_key_format));
        errs.extend(validate::otlp_problem(self.otlp_traces_endpoint.as_deref()));
        errs.extend(security::master_problems(self));
        errs.extend(
            trust::tls::server_files(self.tls_cert_file.as_deref(), self.tls_key_file.as_deref())
                .err(),
        );
        errs.extend(master_problem(&self.master));
        errs.extend(self.ha.problems());
        ConfigError::check(errs)
    }

    /// Merges defaults, the TOML file at `file` (if any), then the environment variables and
    /// flags that `matches` says were given, then validates. `cli` is `matches` parsed.
    pub fn resolve(
        cli: &Self,
        file: Option<&Path>,
        matches: &ArgMatches,
    ) -> Result<Self, ConfigError> {
        let cfg = merge_sources(cli, file, matches)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The number of runtime threads to start (`worker_threads`, or the CPUs available).
    pub fn runtime_threads(&self) -> usize {
        runtime_threads(self.worker_threads)
    }

    /// The configuration as TOML, the key hidden (what `--print-config` shows).
    pub fn to_toml(&self) -> String {
        let mut shown = self.clone();
        if shown.admin_api_key.is_some() {
            shown.admin_api_key = Some(hidden());
        }
        if shown.store_api_key.is_some() {
            shown.store_api_key = Some(hidden());
        }
        render_toml(&shown)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::{CommandFactory, FromArgMatches, Parser};

    use super::*;

    #[derive(Parser, Debug)]
    struct ServeCmd {
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        serve: ServeConfig,
    }

    #[derive(Parser, Debug)]
    struct MasterCmd {
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        host: MasterHostConfig,
    }

    fn serve(args: &[&str]) -> Result<ServeConfig, ConfigError> {
        let m = ServeCmd::command()
            .try_get_matches_from(args)
            .expect("args parse");
        let cmd = ServeCmd::from_arg_matches(&m).expect("from matches");
        ServeConfig::resolve(&cmd.serve, cmd.config.as_deref(), &m)
    }

    fn master(args: &[&str]) -> Result<MasterHostConfig, ConfigError> {
        let m = MasterCmd::command()
            .try_get_matches_from(args)
            .expect("args parse");
        let cmd = MasterCmd::from_arg_matches(&m).expect("from matches");
        MasterHostConfig::resolve(&cmd.host, cmd.config.as_deref(), &m)
    }

    #[test]
    fn master_defaults_come_from_master_config() {
        assert_eq!(serve(&["x"]).unwrap().master, MasterConfig::default());
        assert_eq!(master(&["x"]).unwrap(), MasterHostConfig::default());
        let d = MasterConfig::default();
        for help in [
            ServeCmd::command().render_long_help().to_string(),
            MasterCmd::command().render_long_help().to_string(),
        ] {
            for needle in [
                "--master-lease-ttl-ms <MS>".to_string(),
                format!("[default: {}]", d.lease_ttl_ms),
                format!("[default: {}]", d.eviction_high_watermark),
                "MOONGATE_MASTER_CLIENT_TTL_MS".to_string(),
                "KV master".to_string(),
                "--admin-api-key".to_string(),
            ] {
                assert!(help.contains(&needle), "{needle} missing from\n{help}");
            }
        }
    }

    #[test]
    fn master_settings_from_file_and_flags_keep_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.toml");
        std::fs::write(
            &path,
            "port = 4100\n[master]\nlease_ttl_ms = 5000\nclient_ttl_ms = 7000\neviction_ratio = 0.1\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        for (lease, client, ratio, port) in [
            {
                let c = serve(&["x", "--config", p, "--master-client-ttl-ms", "9000"]).unwrap();
                (
                    c.master.lease_ttl_ms,
                    c.master.client_ttl_ms,
                    c.master.eviction_ratio,
                    c.port,
                )
            },
            {
                let c = master(&["x", "--config", p, "--master-client-ttl-ms", "9000"]).unwrap();
                (
                    c.master.lease_ttl_ms,
                    c.master.client_ttl_ms,
                    c.master.eviction_ratio,
                    c.port,
                )
            },
        ] {
            assert_eq!((lease, client, ratio, port), (5000, 9000, 0.1, 4100));
        }
        // A flag left at its default does not override the file.
        let c = serve(&["x", "--config", p, "--port", "4200"]).unwrap();
        assert_eq!((c.master.lease_ttl_ms, c.port), (5000, 4200));
        let c = master(&["x", "--master-allow-evict-soft-pinned", "false"]).unwrap();
        assert!(!c.master.allow_evict_soft_pinned);
    }

    #[test]
    fn bad_master_settings_and_keys_are_reported_with_the_rest() {
        let err = serve(&[
            "x",
            "--master-eviction-ratio",
            "1.5",
            "--admin-api-key",
            "two words",
            "--health-failure-threshold",
            "0",
            "--busy-poll-us",
            "20000",
        ])
        .unwrap_err()
        .to_string();
        for needle in [
            "master: eviction_ratio",
            "admin_api_key",
            "health_failure_threshold",
            "busy_poll_us must be at most 10000",
        ] {
            assert!(err.contains(needle), "{needle} missing from {err}");
        }
        let err = master(&["x", "--busy-poll-us", "10001"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("busy_poll_us"), "{err}");
        assert_eq!(
            master(&["x", "--busy-poll-us", "0"]).unwrap().busy_poll_us,
            0
        );
        let err = master(&["x", "--master-shards", "3", "--admin-api-key", ""])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("master: shards") && err.contains("admin_api_key"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.toml");
        std::fs::write(&path, "[master]\nlease_tll_ms = 1\n").unwrap();
        let err = master(&["x", "--config", path.to_str().unwrap()]).unwrap_err();
        assert!(err.to_string().contains("lease_tll_ms"), "{err}");
    }

    #[test]
    fn the_admin_key_is_never_shown() {
        let c = serve(&["x", "--admin-api-key", "s3cr3t-key"]).unwrap();
        assert_eq!(
            c.admin_api_key.as_ref().map(Secret::expose),
            Some("s3cr3t-key")
        );
        assert!(!format!("{c:?}").contains("s3cr3t"));
        assert!(!c.to_toml().contains("s3cr3t"));
        let m = master(&["x", "--admin-api-key", "s3cr3t-key"]).unwrap();
        assert!(!format!("{m:?}").contains("s3cr3t"));
        let text = m.to_toml();
        assert!(
            !text.contains("s3cr3t") && text.contains("[master]"),
            "{text}"
        );
        let back: MasterHostConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.master, m.master);
    }
}
