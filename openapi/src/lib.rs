//! Wire types of every Moongate HTTP API.
//!
//! Every request and response body that crosses a Moongate HTTP boundary is defined here,
//! once, with `serde` for the bytes and `utoipa::ToSchema` for the OpenAPI document. The
//! gateway and the KV master both depend on this crate; it depends on nothing of theirs.
//!
//! # Layout
//! - [`error`]: the OpenAI error envelope `{"error":{"message","type","code"}}` every HTTP
//!   error is answered with.
//! - [`workers`]: the gateway's worker admin API (`/workers`).
//! - [`master`]: the KV-cache master's REST API (`/api/v1/...`) and `/metadata` store.

pub mod error;
pub mod master;
pub mod workers;
