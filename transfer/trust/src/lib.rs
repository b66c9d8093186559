//! What every Moongate process trusts, apart from the transfer engine so that the gateway
//! and the store take it without depending on the engine.
//!
//! # Layout
//! - [`secret`]: the cluster secret every node holds (read, checked or created on first
//!   use; the transfer handshake's HMAC key; the store plane's derived key) and [`Secret`],
//!   a setting that is never printed (API keys).
//! - [`tls`]: the trust roots and the https-or-http connector of every HTTP client in the
//!   workspace (system roots plus an operator's CA file), and the TLS server configuration
//!   of the listeners (certificate chain and key files).

pub mod secret;
pub mod tls;

pub use secret::{ClusterSecret, MIN_SECRET_LEN, SECRET_FILE_ENV, Secret, SecretError};
