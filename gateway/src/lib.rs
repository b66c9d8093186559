//! Moongate gateway: the OpenAI-compatible front door in front of SGLang workers.
//!
//! # Layout
//! Modules arrive with the gateway front-door issue (config, worker registry, health,
//! policies, proxy, simulated workers, demo).
