//! Moongate gateway: the OpenAI-compatible front door in front of SGLang workers.
//!
//! A request goes through the modules in this order: [`server::front`] (request id,
//! metrics) -> [`admission`] (slot, queue, rate) -> [`proxy::inspect`] (body, `model`) ->
//! [`select`] (worker by policy and circuit breaker) -> [`proxy::dispatch`] (pooled client)
//! -> [`proxy::retry`] (backoff, another worker) -> [`proxy::respond`] (streamed relay,
//! load and admission slot released at body end).
//!
//! # Layout
//! In the order a request meets them:
//! - [`listen`]: the accept loop and what a client may hold on a listener (connection cap,
//!   header and body deadlines), TLS handshakes ([`tls`]).
//! - [`server`]: the HTTP application: the front door ([`server::front`]: the one
//!   `ServiceBuilder` stack and the one entry of the inference path), the route table with
//!   its OpenAPI document ([`docs`] serves it with Swagger UI), handlers, shared state.
//! - [`request_id`]: the request id, read from `--request-id-headers` or minted, once.
//! - [`auth`] (the `planes` crate): who may call what: client, store and admin keys (planes), the loopback rule
//!   of a server without an admin key, and how the OpenAPI document states it.
//! - [`admission`]: admission control for inference requests (concurrency limit, bounded
//!   wait queue, rate limit; 429 when refused).
//! - [`proxy`]: the request path (inspect, prompt key, dispatch, retry, respond), the
//!   regular-mode router and the PD router (`proxy::pd`: bootstrap rewrite, both sides at
//!   once, logprob merge).
//! - [`select`]: load-balancing policies over the available workers (`cache_aware` with its
//!   prefix tree, `kv_aware` on the workers' KV events).
//! - [`workers`] (the `workers` crate): worker records, the swappable registry, health
//!   checks, circuit breakers, model and rank discovery, the worker control plane, and
//!   the pooled upstream HTTP client ([`client`]).
//! - [`error`]: the one error type, mapped once to status + OpenAI error envelope.
//! - [`outcome`]: outcome types the request path and the metrics share (a leaf module).
//! - [`metrics`]: Prometheus recorder and the `moongate_gateway_*` series.
//! - [`logging`]: tracing subscriber setup, request spans, OTLP traces.
//!
//! Around the request path:
//! - [`config`] (the `settings` crate): `moongate serve` and `moongate master` settings:
//!   defaults, TOML file, `MOONGATE_*` env, flags; validation.
//! - [`launch`]: `moongate serve` as a process: listener, static workers, the hosted
//!   master, graceful shutdown.
//! - [`master`]: the KV master this process hosts (`kvmaster` behind the store and admin
//!   planes), and `moongate master` (the master alone).
//! - [`reload`]: configuration reload on SIGHUP (policies, limits, keys, static workers).

pub mod admission;
/// Who may call what: the `planes` crate, under the name the gateway's modules use.
pub use planes as auth;
/// `moongate serve` and `moongate master` settings: the `settings` crate, under the name the
/// gateway's modules use.
pub use settings as config;
/// The pooled upstream HTTP client: the `workers` crate's, under the name the gateway's
/// modules use.
pub use workers::client;
pub mod docs;
pub mod error;
pub mod launch;
pub mod listen;
pub mod logging;
pub mod master;
pub mod metrics;
pub mod outcome;
pub mod proxy;
pub mod reload;
pub mod request_id;
pub mod select;
pub mod server;
pub mod tls;
/// Worker records, the registry, health checks, breakers, the control plane: the `workers`
/// crate.
pub use ::workers;
