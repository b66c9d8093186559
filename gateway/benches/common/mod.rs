//! What the gateway's benches share: ready workers to select among.

/// `n` ready regular workers serving model `m` (`http://w<i>:1`).
pub use gateway::workers::testing::ready_workers as workers;
