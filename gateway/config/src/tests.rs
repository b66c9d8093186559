//! Configuration tests: defaults, sglang-router's command lines, file/env/flag precedence.

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
fn sglang_router_resilience_flags_are_accepted() {
    let cfg = resolve(&[
        "x",
        "--policy",
        "cache_aware",
        "--cache-threshold",
        "0.5",
        "--balance-abs-threshold",
        "32",
        "--balance-rel-threshold",
        "1.2",
        "--eviction-interval-secs",
        "30",
        "--max-tree-size",
        "1000000",
        "--max-concurrent-requests",
        "-1",
        "--queue-size",
        "10",
        "--queue-timeout-secs",
        "5",
        "--rate-limit-tokens-per-second",
        "100",
        "--retry-max-retries",
        "3",
        "--retry-initial-backoff-ms",
        "10",
        "--retry-max-backoff-ms",
        "1000",
        "--retry-backoff-multiplier",
        "2.0",
        "--retry-jitter-factor",
        "0.1",
        "--cb-failure-threshold",
        "4",
        "--cb-success-threshold",
        "2",
        "--cb-timeout-duration-secs",
        "7",
        "--cb-window-duration-secs",
        "9",
        "--disable-circuit-breaker",
        "--request-id-headers",
        "x-trace-id",
        "X-Amzn-Trace-Id",
    ])
    .unwrap();
    assert_eq!(cfg.policy, PolicyKind::CacheAware);
    assert_eq!(
        (
            cfg.cache_threshold,
            cfg.balance_abs_threshold,
            cfg.balance_rel_threshold
        ),
        (0.5, 32, 1.2)
    );
    assert_eq!(
        (cfg.eviction_interval_secs, cfg.max_tree_size),
        (30, 1_000_000)
    );
    assert_eq!(cfg.max_concurrent_requests, -1);
    assert_eq!(
        (
            cfg.queue_size,
            cfg.queue_timeout_secs,
            cfg.rate_limit_tokens_per_second
        ),
        (10, 5, Some(100))
    );
    assert_eq!(
        (
            cfg.retry_max_retries,
            cfg.retry_initial_backoff_ms,
            cfg.retry_max_backoff_ms
        ),
        (3, 10, 1000)
    );
    assert_eq!(
        (cfg.retry_backoff_multiplier, cfg.retry_jitter_factor),
        (2.0, 0.1)
    );
    assert_eq!(
        (
            cfg.cb_failure_threshold,
            cfg.cb_success_threshold,
            cfg.cb_timeout_duration_secs,
            cfg.cb_window_duration_secs
        ),
        (4, 2, 7, 9)
    );
    assert!(cfg.disable_circuit_breaker);
    assert_eq!(
        cfg.request_id_headers,
        vec!["x-trace-id", "X-Amzn-Trace-Id"]
    );
    let back: ServeConfig = toml::from_str(&cfg.to_toml()).unwrap();
    assert_eq!(back, cfg);

    let limited = resolve(&["x", "--max-concurrent-requests", "8"]).unwrap();
    assert_eq!(limited.max_concurrent_requests, 8);
    for (args, needle) in [
        (
            &["x", "--max-concurrent-requests", "0"][..],
            "max_concurrent_requests",
        ),
        (
            &["x", "--max-concurrent-requests", "-2"][..],
            "max_concurrent_requests",
        ),
        (
            &["x", "--retry-jitter-factor", "1.5"][..],
            "retry_jitter_factor",
        ),
        (
            &["x", "--retry-backoff-multiplier", "0.5"][..],
            "retry_backoff_multiplier",
        ),
        (
            &[
                "x",
                "--retry-initial-backoff-ms",
                "5000",
                "--retry-max-backoff-ms",
                "10",
            ][..],
            "retry_initial_backoff_ms",
        ),
        (
            &["x", "--cb-failure-threshold", "0"][..],
            "cb_failure_threshold",
        ),
        (
            &["x", "--rate-limit-tokens-per-second", "0"][..],
            "rate_limit_tokens_per_second",
        ),
        (
            &["x", "--request-id-headers", "bad header"][..],
            "request_id_headers",
        ),
    ] {
        let err = resolve(args).unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
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
fn tokenizer_flags_and_their_check() {
    let c = resolve(&[
        "x",
        "--policy",
        "kv_aware",
        "--tokenizer-path",
        "/models/llama",
        "--chat-template",
        "/models/chat.jinja",
    ])
    .unwrap();
    assert_eq!(
        c.tokenizer_path.as_deref(),
        Some(Path::new("/models/llama"))
    );
    assert_eq!(
        c.chat_template.as_deref(),
        Some(Path::new("/models/chat.jinja"))
    );
    let err = resolve(&["x", "--chat-template", "/models/chat.jinja"]).unwrap_err();
    assert!(
        err.to_string()
            .contains("chat_template needs tokenizer_path"),
        "{err}"
    );
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

#[test]
fn security_settings_come_from_file_and_flags_and_hide_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "k1\n").unwrap();
    let file = dir.path().join("m.toml");
    std::fs::write(
        &file,
        format!(
            "client_api_keys_file = {:?}\nstore_api_key = \"st0re-from-file\"\n\
             cors_allowed_origins = [\"https://a.example\"]\nlog_json = true\n",
            keys.to_str().unwrap()
        ),
    )
    .unwrap();
    let cfg = resolve(&[
        "x",
        "--config",
        file.to_str().unwrap(),
        "--insecure-open-admin",
        "--cors-allowed-origins",
        "https://b.example",
        "http://c.example:8080",
    ])
    .unwrap();
    assert_eq!(cfg.client_api_keys_file.as_deref(), Some(keys.as_path()));
    assert_eq!(
        cfg.store_api_key.as_ref().map(Secret::expose),
        Some("st0re-from-file")
    );
    assert!(cfg.insecure_open_admin && cfg.log_json);
    assert_eq!(
        cfg.cors_allowed_origins,
        ["https://b.example", "http://c.example:8080"]
    );
    let text = cfg.to_toml();
    assert!(!text.contains("st0re-from-file") && !format!("{cfg:?}").contains("st0re"));
    let err = resolve(&[
        "x",
        "--cors-allowed-origins",
        "https://a.example/",
        "--store-api-key",
        "two words",
        "--client-api-keys-file",
        dir.path().join("missing").to_str().unwrap(),
    ])
    .unwrap_err()
    .to_string();
    for needle in [
        "cors_allowed_origins",
        "store_api_key",
        "client_api_keys_file",
    ] {
        assert!(err.contains(needle), "{needle} missing from {err}");
    }
    let help = Cmd::command().render_long_help().to_string();
    for flag in [
        "--client-api-keys-file",
        "--store-api-key",
        "--transfer-secret-file",
        "--insecure-open-admin",
        "--cors-allowed-origins",
        "--log-json",
        "MOONGATE_TRANSFER_SECRET_FILE",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
}

#[test]
fn a_zero_where_one_is_the_least_is_named_by_serve_and_master() {
    let serve = ServeConfig {
        request_timeout_secs: 0,
        ..ServeConfig::default()
    };
    let err = serve.validate().unwrap_err().to_string();
    assert!(
        err.contains("request_timeout_secs must be at least 1"),
        "{err}"
    );
    let master = MasterHostConfig {
        client_body_timeout_secs: 0,
        ..MasterHostConfig::default()
    };
    let err = master.validate().unwrap_err().to_string();
    assert!(
        err.contains("client_body_timeout_secs must be at least 1"),
        "{err}"
    );
    assert!(ServeConfig::default().validate().is_ok());
    assert!(MasterHostConfig::default().validate().is_ok());
}
