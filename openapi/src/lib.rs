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
//! - [`shapes`]: shapes shared by OpenAI and SGLang bodies: a value or a list
//!   ([`shapes::OneOrMany`]), stop sequences, the four prompt forms, `input_ids`.
//! - [`openai`]: the OpenAI-compatible API as SGLang serves it: chat completions
//!   ([`openai::chat`]), completions ([`openai::completions`]), models, usage.
//! - [`sglang`]: SGLang's native `/generate` (batches, sampling parameters, logprobs,
//!   finish reasons) and, in [`sglang::server`], its info, load and error bodies.
//!
//! Request types keep unknown fields in `extra` and write them back unchanged, so the
//! gateway forwards SGLang's many extension fields without knowing them.

pub mod error;
pub mod master;
pub mod openai;
pub mod sglang;
pub mod shapes;
pub mod workers;
