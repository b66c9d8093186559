//! Configuration reload for `moongate serve`: on SIGHUP the configuration is read again the
//! way it was at start (the `--config` file, the environment, the same flags; flags and
//! environment still win over the file) and validated. A configuration that does not
//! validate, or whose client keys file cannot be read, changes nothing: the last valid one
//! stays in force, the reason is logged, and `moongate_config_reloads_total{result="invalid"}`
//! counts it (`result="ok"` counts the others).
//!
//! What a valid configuration changes, without dropping a request in flight:
//! - **policies** (`policy`, `prefill_policy`, `decode_policy`, and `cache_aware`'s
//!   `cache_threshold`, `balance_abs_threshold`, `balance_rel_threshold`, `max_tree_size`;
//!   the affinity headers and `manual`'s table bounds): new routers over the same workers;
//!   requests already routed finish on the old ones; a `cache_aware` policy that is
//!   replaced starts with empty trees, a `manual` one with no sessions;
//! - **limits** (`max_concurrent_requests`, `queue_size`, `queue_timeout_secs`,
//!   `rate_limit_tokens_per_second`): a new admission gate for the requests that arrive from
//!   then on; requests admitted or queued under the old limits finish under them;
//! - **keys** (`client_api_keys_file`, read again on every reload even when its path did
//!   not change; `admin_api_key`; `insecure_open_admin`; the workers' `api_key`): in force
//!   for the next request; the served OpenAPI document follows;
//! - **static workers** (`worker_urls`, and `prefill` / `decode` in PD mode): the ones no
//!   longer listed are drained and removed, new ones registered (probed before they get
//!   traffic). Workers registered through the worker API are left alone.
//!
//! Every other setting that changed (the listen address, timeouts, retries, health checks,
//! the master's settings, ...) keeps its old value; the reload names each one as needing a
//! restart, in the log and in [`Reloaded::need_restart`].

use serde_json::Value;

use crate::auth::KeysFileError;
use crate::config::{ConfigError, ServeConfig};
use crate::server::AppState;

/// Settings a reload applies, by group (the field names of [`ServeConfig`]).
const POLICIES: &[&str] = &[
    "policy",
    "prefill_policy",
    "decode_policy",
    "cache_threshold",
    "balance_abs_threshold",
    "balance_rel_threshold",
    "max_tree_size",
    "routing_key_header",
    "target_worker_header",
    "sticky_max_keys",
    "sticky_max_idle_secs",
    "least_load_kv_weight",
];
const LIMITS: &[&str] = &[
    "max_concurrent_requests",
    "queue_size",
    "queue_timeout_secs",
    "rate_limit_tokens_per_second",
    "priority_header",
    "priority_aging_secs",
];
const KEYS: &[&str] = &[
    "client_api_keys_file",
    "admin_api_key",
    "insecure_open_admin",
    "api_key",
];
const WORKERS: &[&str] = &["worker_urls", "prefill", "decode"];

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Settings whose new values are in force (`client_api_keys` when the keys file's keys
    /// changed under the same path).
    pub applied: Vec<String>,
    /// Settings that changed but keep their old values until a restart.
    pub need_restart: Vec<String>,
    /// Static workers registered.
    pub workers_added: Vec<String>,
    /// Static workers removed (drained first).
    pub workers_removed: Vec<String>,
    /// What could not be applied although the configuration is valid (a listed worker URL
    /// held by a worker of the worker API, ...).
    pub problems: Vec<String>,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The configuration does not read or validate.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The client keys file cannot be used.
    #[error(transparent)]
    Keys(#[from] KeysFileError),
}

/// Applies `new` (validated here) to a running gateway: see the module doc. Returns what
/// changed; on an error nothing did.
pub fn apply(state: &AppState, new: ServeConfig) -> Result<Reloaded, ReloadError> {
    new.validate()?;
    let old = state.applied_config();
    let store = state.auth().settings().store.clone();
    let keys = new.auth_settings(store)?;
    let (old_v, new_v) = (fields(&old), fields(&new));
    let mut out = Reloaded::default();
    let mut merged = old_v.clone();
    for (name, value) in &new_v {
        if old_v.get(name) == Some(value) {
            continue;
        }
        if [POLICIES, LIMITS, KEYS, WORKERS]
            .iter()
            .any(|g| g.contains(&name.as_str()))
        {
            out.applied.push(name.clone());
            merged.insert(name.clone(), value.clone());
        } else {
            out.need_restart.push(name.clone());
        }
    }
    let merged: ServeConfig = serde_json::from_value(Value::Object(merged))
        .map_err(|e| ConfigError::Merge(e.to_string()))?;
    let changed = |group: &[&str]| out.applied.iter().any(|n| group.contains(&n.as_str()));
    let (policies, limits, workers) = (changed(POLICIES), changed(LIMITS), changed(WORKERS));
    let api_key = changed(&["api_key"]);
    if policies {
        state.replace_policies(&merged);
    }
    if limits {
        state.replace_admission(&merged);
    }
    let current = state.auth().settings();
    if **current != keys {
        if current.client != keys.client && !changed(&["client_api_keys_file"]) {
            out.applied.push("client_api_keys".into());
        }
        drop(current);
        state.auth().replace(keys);
    }
    if api_key {
        state.workers().set_default_key(merged.api_key.clone());
    }
    if workers {
        let prefill: Vec<_> = merged
            .prefill_specs()
            .into_iter()
            .filter_map(Result::ok)
            .collect();
        let sync = state
            .workers()
            .sync_static(&merged.worker_urls, &prefill, &merged.decode);
        out.workers_added = sync.added;
        out.workers_removed = sync.removed;
        out.problems = sync.problems;
    }
    state.set_applied(merged);
    Ok(out)
}

/// Reads the configuration with `read` and applies it; logs what happened and counts it in
/// `moongate_config_reloads_total{result}`.
pub fn reload(
    state: &AppState,
    read: impl FnOnce() -> Result<ServeConfig, ConfigError>,
) -> Result<Reloaded, ReloadError> {
    let result = read()
        .map_err(ReloadError::from)
        .and_then(|cfg| apply(state, cfg));
    let label = if result.is_ok() { "ok" } else { "invalid" };
    metrics::counter!("moongate_config_reloads_total", "result" => label).increment(1);
    match &result {
        Ok(r) => {
            tracing::info!(applied = ?r.applied, workers_added = ?r.workers_added,
                workers_removed = ?r.workers_removed, "configuration reloaded");
            if !r.need_restart.is_empty() {
                tracing::warn!(settings = ?r.need_restart,
                    "changed settings that apply only after a restart; their old values stay in force");
            }
            for p in &r.problems {
                tracing::warn!(problem = %p, "reload: not applied");
            }
        }
        Err(e) => tracing::error!(error = %e,
            "configuration reload refused; the last valid configuration stays in force"),
    }
    result
}

/// Reloads on every SIGHUP until the gateway shuts down (`reread` runs on a blocking
/// thread: it reads files). Needs a tokio runtime.
pub fn spawn_on_sighup(
    state: AppState,
    reread: Box<dyn Fn() -> Result<ServeConfig, ConfigError> + Send + Sync>,
) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup())?;
        let reread = std::sync::Arc::new(reread);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = state.cancel_token().cancelled() => return,
                    got = hup.recv() => if got.is_none() { return },
                }
                tracing::info!("SIGHUP: reloading the configuration");
                let read = reread.clone();
                let cfg = tokio::task::spawn_blocking(move || read())
                    .await
                    .unwrap_or_else(|e| Err(ConfigError::Merge(format!("reading failed: {e}"))));
                let _ = reload(&state, || cfg);
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (state, reread);
    Ok(())
}

/// The top-level fields of `cfg` as JSON values, by name.
fn fields(cfg: &ServeConfig) -> serde_json::Map<String, Value> {
    match serde_json::to_value(cfg) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}
