//! Moongate integration tests and the in-process cluster harness.
//!
//! # Layout
//! The harness (start gateways, workers, masters and storage nodes on 127.0.0.1:0) grows
//! with the issues; the tests themselves live in `tests/tests/*.rs`.
