//! Moongate gateway: the OpenAI-compatible front door in front of SGLang workers.
//!
//! A request goes through the modules in this order: [`server::front`] (request id,
//! metrics) -> [`admission`] (slot, queue, rate) -> [`proxy::inspect`] (body, `model`) ->
//! [`select`] (worker by policy and circuit breaker) -> [`proxy::dispatch`] (pooled client)
//! -> [`proxy::retry`] (backoff, another worker) -> [`proxy::respond`] (streamed relay,
//! load and admission slot released at body end).
//!
//! # Layout
//! - [`config`]: `moongate serve` and `moongate master` settings: defaults, TOML file,
//!   `MOONGATE_*` env, flags; validation.
//! - [`auth`]: who may call what: client, store and admin keys (planes), the loopback rule
//!   of a server without an admin key, and how the OpenAPI document states it.
//! - [`docs`]: the OpenAPI document (`/api-docs/openapi.json`) and Swagger UI (`/docs`).
//! - [`hosting`]: the KV master hosted by `serve`, and `moongate master` (the master alone).
//! - [`admission`]: admission control for inference requests (concurrency limit, bounded
//!   wait queue, rate limit; 429 when refused).
//! - [`server`]: the HTTP application: state, the front door (the one middleware stack and
//!   the inference fast path), route table + OpenAPI, handlers.
//! - [`proxy`]: the request path (inspect, prompt key, dispatch, retry, respond), the
//!   regular-mode router and the PD router (`proxy::pd`: bootstrap rewrite, both sides at
//!   once, logprob merge).
//! - [`select`]: load-balancing policies over the available workers (`cache_aware` with its
//!   prefix tree).
//! - [`workers`]: worker records, the swappable registry, health checks, circuit breakers,
//!   model discovery, the worker control plane.
//! - [`client`]: the pooled upstream HTTP client.
//! - [`error`]: the one error type, mapped once to status + OpenAI error envelope.
//! - [`metrics`]: Prometheus recorder and the `moongate_gateway_*` series.
//! - [`outcome`]: outcome types the request path and the metrics share (a leaf module).
//! - [`request_id`]: the request id, read from `--request-id-headers` or minted.
//! - [`logging`]: tracing subscriber setup.
//! - [`serve`]: `moongate serve`: listener, static workers, the hosted master, graceful shutdown.
//! - [`listen`]: what a client may hold on a listener: the connection cap, the header and
//!   body deadlines (408).
//! - [`tls`]: TLS on the listeners of `serve` and `master` (`--tls-cert-file`, `--tls-key-file`).
//! - [`reload`]: configuration reload on SIGHUP (policies, limits, keys, static workers).

pub mod admission;
pub mod auth;
pub mod client;
pub mod config;
pub mod docs;
pub mod error;
pub mod hosting;
pub mod listen;
pub mod logging;
pub mod metrics;
pub mod outcome;
pub mod proxy;
pub mod reload;
pub mod request_id;
pub mod select;
pub mod serve;
pub mod server;
pub mod tls;
pub mod workers;
