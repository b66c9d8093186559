//! Wire types of every Moongate HTTP API.
//!
//! Every request and response body that crosses a Moongate HTTP boundary is defined here,
//! once, with `serde` for the bytes and `utoipa::ToSchema` for the OpenAPI document. The
//! gateway and the KV master both depend on this crate; it depends on nothing of theirs.
//!
//! # Layout
//! Modules are added by the issues that introduce each API (OpenAI, SGLang, worker admin,
//! KV master).
