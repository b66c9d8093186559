//! SGLang's protocol pieces, written once for both sides that speak them: the gateway
//! (`kv_aware` routing by what workers cache) and Moongate's simulated SGLang worker.
//!
//! # Layout
//! - [`tokenizer`]: prompt token ids as the worker computes them (`--tokenizer-path`: a
//!   Hugging Face tokenizer and the model's chat template).
//! - [`hicache`]: SGLang HiCache page keys (chained SHA-256 over token ids) and the object
//!   names its Mooncake backend stores pages under.
//! - [`kv_events`]: SGLang's KV-cache events: block hashes over [`hicache`]'s chain, the
//!   msgpack wire format, the ZMQ publisher (workers) and subscriber (routers).
//! - [`memo`]: bounded memos found by a secret 128-bit hash (the tokenizer's chat-prompt
//!   memo and the events' page-digest memo use it).

pub mod hicache;
pub mod kv_events;
pub mod memo;
pub mod tokenizer;
