//! Environment variable names, one per setting (`MOONGATE_` + the field name in capitals).

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
/// `--routing-key-header`.
pub const ROUTING_KEY_HEADER: &str = "MOONGATE_ROUTING_KEY_HEADER";
/// `--sticky-max-keys`.
pub const STICKY_MAX_KEYS: &str = "MOONGATE_STICKY_MAX_KEYS";
/// `--sticky-max-idle-secs`.
pub const STICKY_MAX_IDLE_SECS: &str = "MOONGATE_STICKY_MAX_IDLE_SECS";
/// `--priority-header`.
pub const PRIORITY_HEADER: &str = "MOONGATE_PRIORITY_HEADER";
/// `--priority-aging-secs`.
pub const PRIORITY_AGING_SECS: &str = "MOONGATE_PRIORITY_AGING_SECS";
/// `--load-poll-interval-secs`.
pub const LOAD_POLL_INTERVAL_SECS: &str = "MOONGATE_LOAD_POLL_INTERVAL_SECS";
/// `--least-load-kv-weight`.
pub const LEAST_LOAD_KV_WEIGHT: &str = "MOONGATE_LEAST_LOAD_KV_WEIGHT";
/// `--responses-max-ids`.
pub const RESPONSES_MAX_IDS: &str = "MOONGATE_RESPONSES_MAX_IDS";
/// `--target-worker-header`.
pub const TARGET_WORKER_HEADER: &str = "MOONGATE_TARGET_WORKER_HEADER";
/// `--api-key`.
pub const API_KEY: &str = "MOONGATE_API_KEY";
/// `--tls-cert-file`.
pub const TLS_CERT_FILE: &str = "MOONGATE_TLS_CERT_FILE";
/// `--tls-key-file`.
pub const TLS_KEY_FILE: &str = "MOONGATE_TLS_KEY_FILE";
/// `--worker-ca-cert`.
pub const WORKER_CA_CERT: &str = "MOONGATE_WORKER_CA_CERT";
/// `--otlp-traces-endpoint`.
pub const OTLP_TRACES_ENDPOINT: &str = "MOONGATE_OTLP_TRACES_ENDPOINT";
/// `--max-payload-size`.
pub const MAX_PAYLOAD_SIZE: &str = "MOONGATE_MAX_PAYLOAD_SIZE";
/// `--max-batch-size`.
pub const MAX_BATCH_SIZE: &str = "MOONGATE_MAX_BATCH_SIZE";
/// `--client-header-timeout-secs`.
pub const CLIENT_HEADER_TIMEOUT_SECS: &str = "MOONGATE_CLIENT_HEADER_TIMEOUT_SECS";
/// `--client-body-timeout-secs`.
pub const CLIENT_BODY_TIMEOUT_SECS: &str = "MOONGATE_CLIENT_BODY_TIMEOUT_SECS";
/// `--max-connections`.
pub const MAX_CONNECTIONS: &str = "MOONGATE_MAX_CONNECTIONS";
/// `--busy-poll-us`.
pub const BUSY_POLL_US: &str = "MOONGATE_BUSY_POLL_US";
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
/// `--dp-aware`.
pub const DP_AWARE: &str = "MOONGATE_DP_AWARE";
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
/// `--mooncake-http-port`.
pub const MOONCAKE_HTTP_PORT: &str = "MOONGATE_MOONCAKE_HTTP_PORT";
/// `--mooncake-http-host`.
pub const MOONCAKE_HTTP_HOST: &str = "MOONGATE_MOONCAKE_HTTP_HOST";
/// `--admin-api-key`.
pub const ADMIN_API_KEY: &str = "MOONGATE_ADMIN_API_KEY";
/// `--insecure-open-admin`.
pub const INSECURE_OPEN_ADMIN: &str = "MOONGATE_INSECURE_OPEN_ADMIN";
/// `--client-api-keys-file`.
pub const CLIENT_API_KEYS_FILE: &str = "MOONGATE_CLIENT_API_KEYS_FILE";
/// `--store-api-key`.
pub const STORE_API_KEY: &str = "MOONGATE_STORE_API_KEY";
/// `--transfer-secret-file` (the transfer engine's own variable: one setting for the engine
/// and the store key).
pub const TRANSFER_SECRET_FILE: &str = trust::SECRET_FILE_ENV;
/// `--cors-allowed-origins` (comma-separated in the environment).
pub const CORS_ALLOWED_ORIGINS: &str = "MOONGATE_CORS_ALLOWED_ORIGINS";
/// `--log-json`.
pub const LOG_JSON: &str = "MOONGATE_LOG_JSON";
/// `--retry-initial-backoff-ms`.
pub const RETRY_INITIAL_BACKOFF_MS: &str = "MOONGATE_RETRY_INITIAL_BACKOFF_MS";
/// `--retry-max-backoff-ms`.
pub const RETRY_MAX_BACKOFF_MS: &str = "MOONGATE_RETRY_MAX_BACKOFF_MS";
/// `--retry-backoff-multiplier`.
pub const RETRY_BACKOFF_MULTIPLIER: &str = "MOONGATE_RETRY_BACKOFF_MULTIPLIER";
/// `--retry-jitter-factor`.
pub const RETRY_JITTER_FACTOR: &str = "MOONGATE_RETRY_JITTER_FACTOR";
/// `--cb-failure-threshold`.
pub const CB_FAILURE_THRESHOLD: &str = "MOONGATE_CB_FAILURE_THRESHOLD";
/// `--cb-success-threshold`.
pub const CB_SUCCESS_THRESHOLD: &str = "MOONGATE_CB_SUCCESS_THRESHOLD";
/// `--cb-timeout-duration-secs`.
pub const CB_TIMEOUT_DURATION_SECS: &str = "MOONGATE_CB_TIMEOUT_DURATION_SECS";
/// `--cb-window-duration-secs`.
pub const CB_WINDOW_DURATION_SECS: &str = "MOONGATE_CB_WINDOW_DURATION_SECS";
/// `--disable-circuit-breaker`.
pub const DISABLE_CIRCUIT_BREAKER: &str = "MOONGATE_DISABLE_CIRCUIT_BREAKER";
/// `--max-concurrent-requests`.
pub const MAX_CONCURRENT_REQUESTS: &str = "MOONGATE_MAX_CONCURRENT_REQUESTS";
/// `--queue-size`.
pub const QUEUE_SIZE: &str = "MOONGATE_QUEUE_SIZE";
/// `--queue-timeout-secs`.
pub const QUEUE_TIMEOUT_SECS: &str = "MOONGATE_QUEUE_TIMEOUT_SECS";
/// `--rate-limit-tokens-per-second`.
pub const RATE_LIMIT_TOKENS_PER_SECOND: &str = "MOONGATE_RATE_LIMIT_TOKENS_PER_SECOND";
/// `--cache-threshold`.
pub const CACHE_THRESHOLD: &str = "MOONGATE_CACHE_THRESHOLD";
/// `--balance-abs-threshold`.
pub const BALANCE_ABS_THRESHOLD: &str = "MOONGATE_BALANCE_ABS_THRESHOLD";
/// `--balance-rel-threshold`.
pub const BALANCE_REL_THRESHOLD: &str = "MOONGATE_BALANCE_REL_THRESHOLD";
/// `--eviction-interval-secs`.
pub const EVICTION_INTERVAL_SECS: &str = "MOONGATE_EVICTION_INTERVAL_SECS";
/// `--max-tree-size`.
pub const MAX_TREE_SIZE: &str = "MOONGATE_MAX_TREE_SIZE";
/// `--kv-overlap-weight`.
pub const KV_OVERLAP_WEIGHT: &str = "MOONGATE_KV_OVERLAP_WEIGHT";
/// `--kv-backlog-weight`.
pub const KV_BACKLOG_WEIGHT: &str = "MOONGATE_KV_BACKLOG_WEIGHT";
/// `--kv-load-weight`.
pub const KV_LOAD_WEIGHT: &str = "MOONGATE_KV_LOAD_WEIGHT";
/// `--kv-no-predictions`.
pub const KV_NO_PREDICTIONS: &str = "MOONGATE_KV_NO_PREDICTIONS";
/// `--kv-l3-page-value`.
pub const KV_L3_PAGE_VALUE: &str = "MOONGATE_KV_L3_PAGE_VALUE";
/// `--kv-l3-disk-page-value`.
pub const KV_L3_DISK_PAGE_VALUE: &str = "MOONGATE_KV_L3_DISK_PAGE_VALUE";
/// `--kv-host-page-value`.
pub const KV_HOST_PAGE_VALUE: &str = "MOONGATE_KV_HOST_PAGE_VALUE";
/// `--kv-l3-key-format`.
pub const KV_L3_KEY_FORMAT: &str = "MOONGATE_KV_L3_KEY_FORMAT";
/// `--kv-l3-master-url`.
pub const KV_L3_MASTER_URL: &str = "MOONGATE_KV_L3_MASTER_URL";
/// `--router-temperature`.
pub const ROUTER_TEMPERATURE: &str = "MOONGATE_ROUTER_TEMPERATURE";
/// `--kv-events-endpoint`.
pub const KV_EVENTS_ENDPOINT: &str = "MOONGATE_KV_EVENTS_ENDPOINT";
/// `--tokenizer-path`.
pub const TOKENIZER_PATH: &str = "MOONGATE_TOKENIZER_PATH";
/// `--chat-template`.
pub const CHAT_TEMPLATE: &str = "MOONGATE_CHAT_TEMPLATE";
/// `--tokenizer-cache-size`.
pub const TOKENIZER_CACHE_SIZE: &str = "MOONGATE_TOKENIZER_CACHE_SIZE";
/// `--pd-min-uncached-tokens`.
pub const PD_MIN_UNCACHED_TOKENS: &str = "MOONGATE_PD_MIN_UNCACHED_TOKENS";
/// `--pd-min-uncached-ratio`.
pub const PD_MIN_UNCACHED_RATIO: &str = "MOONGATE_PD_MIN_UNCACHED_RATIO";
/// `--pd-prefill-busy-load`.
pub const PD_PREFILL_BUSY_LOAD: &str = "MOONGATE_PD_PREFILL_BUSY_LOAD";
/// `--request-id-headers` (comma-separated in the environment).
pub const REQUEST_ID_HEADERS: &str = "MOONGATE_REQUEST_ID_HEADERS";
