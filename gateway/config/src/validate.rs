//! [`ServeConfig::validate`]: every check of a merged configuration, each problem listed.

use kvmaster::MasterConfig;

use super::{ConfigError, PrefillSpec, ServeConfig, WorkerUrl, security};

/// What is wrong with `--otlp-traces-endpoint`'s `url` (an `http://` or `https://` URL
/// with a host), if anything.
pub fn otlp_problem(url: Option<&str>) -> Option<String> {
    otlp::endpoint_problem(url?)
}

/// What is wrong with `--kv-l3-key-format`'s `format`, if anything.
pub(super) fn key_format_problem(format: &str) -> Option<String> {
    (format.matches("{hash}").count() != 1)
        .then(|| format!("kv_l3_key_format must hold {{hash}} once, got {format:?}"))
}

impl ServeConfig {
    /// Checks every value; lists all problems, not just the first.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errs = Vec::new();
        if self.host.trim().is_empty() {
            errs.push("host must not be empty".to_string());
        }
        errs.extend(key_format_problem(&self.kv_l3_key_format));
        for url in self.kv_l3_master_url.iter().flat_map(|l| l.split(',')) {
            let ok = url.trim().parse::<http::Uri>().is_ok_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
            });
            if !ok {
                errs.push(format!(
                    "kv_l3_master_url: {url:?} is not http(s)://host:port"
                ));
            }
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
            match WorkerUrl::parse(url) {
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
            ("sticky_max_keys", self.sticky_max_keys as u64),
            ("sticky_max_idle_secs", self.sticky_max_idle_secs),
            ("responses_max_ids", self.responses_max_ids as u64),
            ("load_poll_interval_secs", self.load_poll_interval_secs),
            ("max_batch_size", self.max_batch_size as u64),
            (
                "client_header_timeout_secs",
                self.client_header_timeout_secs,
            ),
            ("client_body_timeout_secs", self.client_body_timeout_secs),
            ("max_connections", self.max_connections as u64),
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
            ("cb_failure_threshold", u64::from(self.cb_failure_threshold)),
            ("cb_success_threshold", u64::from(self.cb_success_threshold)),
            ("cb_timeout_duration_secs", self.cb_timeout_duration_secs),
            ("cb_window_duration_secs", self.cb_window_duration_secs),
            ("queue_timeout_secs", self.queue_timeout_secs),
            ("eviction_interval_secs", self.eviction_interval_secs),
            ("max_tree_size", self.max_tree_size as u64),
            (
                "rate_limit_tokens_per_second",
                self.rate_limit_tokens_per_second.unwrap_or(1),
            ),
        ];
        errs.extend(listener_problems(&positive, self.busy_poll_us));
        errs.extend(self.flow_control_problems());
        for (name, v) in [
            ("routing_key_header", &self.routing_key_header),
            ("target_worker_header", &self.target_worker_header),
            ("priority_header", &self.priority_header),
        ] {
            if http::HeaderName::try_from(v.as_str()).is_err() {
                errs.push(format!("{name} is not a header name: {v:?}"));
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
        if self
            .mooncake_http_port
            .is_some_and(|p| p != 0 && p == self.port)
        {
            errs.push("mooncake_http_port must differ from port".to_string());
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
        errs.extend(security::problems(self));
        if let Some(Err(e)) = self
            .worker_ca_cert
            .as_deref()
            .map(trust::tls::ca_certificates)
        {
            errs.push(format!("worker_ca_cert: {e}"));
        }
        errs.extend(
            trust::tls::server_files(self.tls_cert_file.as_deref(), self.tls_key_file.as_deref())
                .err(),
        );
        errs.extend(otlp_problem(self.otlp_traces_endpoint.as_deref()));
        errs.extend(master_problem(&self.master));
        if !self.disable_master {
            errs.extend(self.ha.problems());
        } else if self.mooncake_http_port.is_some() {
            errs.push("mooncake_http_port serves the hosted master: drop --disable-master".into());
        }
        errs.extend(self.discovery.problems(self.pd_disaggregation));
        errs.extend(sglang::tokenizer::flags_problem(
            self.tokenizer_path.as_deref(),
            self.chat_template.as_deref(),
        ));
        ConfigError::check(errs)
    }

    /// What is wrong with the retry, admission, cache-aware and request-id settings.
    fn flow_control_problems(&self) -> Vec<String> {
        let mut errs = Vec::new();
        if self.max_concurrent_requests == 0 || self.max_concurrent_requests < -1 {
            errs.push(format!(
                "max_concurrent_requests must be -1 (no limit) or at least 1, got {}",
                self.max_concurrent_requests
            ));
        }
        if self.retry_initial_backoff_ms > self.retry_max_backoff_ms {
            errs.push("retry_initial_backoff_ms must not exceed retry_max_backoff_ms".into());
        }
        let ranges = [
            (
                "retry_backoff_multiplier",
                self.retry_backoff_multiplier,
                1.0,
                1e6,
            ),
            ("retry_jitter_factor", self.retry_jitter_factor, 0.0, 1.0),
            ("cache_threshold", self.cache_threshold, 0.0, 1.0),
            ("kv_overlap_weight", self.kv_overlap_weight, 0.0, 1e6),
            ("kv_backlog_weight", self.kv_backlog_weight, 0.0, 1e6),
            ("kv_load_weight", self.kv_load_weight, 0.0, 1e6),
            ("least_load_kv_weight", self.least_load_kv_weight, 0.0, 1e6),
            ("kv_l3_page_value", self.kv_l3_page_value, 0.0, 1.0),
            (
                "kv_l3_disk_page_value",
                self.kv_l3_disk_page_value,
                0.0,
                1.0,
            ),
            ("kv_host_page_value", self.kv_host_page_value, 0.0, 1.0),
            ("router_temperature", self.router_temperature, 0.0, 1e6),
            (
                "pd_min_uncached_ratio",
                self.pd_min_uncached_ratio,
                0.0,
                1.0,
            ),
            (
                "balance_rel_threshold",
                self.balance_rel_threshold,
                0.0,
                1e9,
            ),
        ];
        for (name, v, lo, hi) in ranges {
            if !(lo..=hi).contains(&v) {
                errs.push(format!("{name} must be within {lo}..={hi}, got {v}"));
            }
        }
        for h in &self.request_id_headers {
            if http::HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes()).is_err() {
                errs.push(format!("request_id_headers: {h:?} is not a header name"));
            }
        }
        errs
    }
}

/// Parses `[URL]` or `[URL, PORT|none]`.
pub(super) fn parse_prefill(v: &[String]) -> Result<PrefillSpec, String> {
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

/// The problem with the master's settings, if any.
pub(super) fn master_problem(master: &MasterConfig) -> Option<String> {
    master.validate().err().map(|e| match e {
        kvmaster::MasterError::InvalidParams(m) => format!("master: {m}"),
        other => format!("master: {other}"),
    })
}

/// The checks `serve` and `master` share: settings that must be at least 1 (named as their
/// keys), and the accept loop's busy-poll window.
pub(super) fn listener_problems(positive: &[(&str, u64)], busy_poll_us: u64) -> Vec<String> {
    let mut errs: Vec<String> = positive
        .iter()
        .filter(|(_, v)| *v == 0)
        .map(|(name, _)| format!("{name} must be at least 1"))
        .collect();
    errs.extend(kvmaster::busy_poll::window_problem(
        "busy_poll_us",
        busy_poll_us,
    ));
    errs
}
