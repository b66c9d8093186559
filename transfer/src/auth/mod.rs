//! Who may talk to a transfer port.
//!
//! # The cluster secret
//! Every process with a transfer engine holds the **cluster secret** ([`ClusterSecret`]): the
//! file `--transfer-secret-file` / [`SECRET_FILE_ENV`] names, or else the per-user file
//! `$XDG_CONFIG_HOME/moongate/transfer-secret` (`~/.config/...`), created with mode 0600 from
//! the OS RNG on first use, as Erlang's cookie is. So the processes of one user on one host
//! work together with no setup, and a node on another host joins once the file is copied.
//! A file that other users can read, or that belongs to someone else, is refused.
//!
//! # The handshake
//! Every TCP connection to a transfer port (control and data lanes alike, and so the RDMA
//! queue-pair exchange and the peer-to-peer descriptor request, which run on them) opens
//! with a mutual challenge-response (`handshake`): each side sends a fresh 32-byte nonce
//! from the OS RNG and proves it holds the secret with an HMAC-SHA256 tag over both nonces
//! and both declared names, under a role label (`server` / `client`). Until the initiator's
//! proof verified, the target reads nothing but the handshake and sends nothing but its
//! challenge: no descriptor, token, RDMA key or byte of memory.
//!
//! Why this design, and not TLS:
//! - **Nothing secret crosses the wire**: only nonces and tags; the secret never leaves the
//!   process. HMAC-SHA256 is a PRF, so tags reveal nothing about the key.
//! - **Replays fail**: a tag covers the other side's fresh nonce, so a recorded proof is
//!   worthless on a new connection; **reflection fails**: the two roles' tags have
//!   different labels, so a server's tag is never a valid client proof.
//! - **Mutual**: the initiator checks the target's tag before it sends anything else, so
//!   it never hands a write's bytes (or asks for a descriptor) from a node that is not part
//!   of the cluster.
//! - **The data path stays as fast as before**: after the handshake, frames flow unchanged
//!   (no per-byte MAC or cipher), which is what the TCP lanes' speed depends on. The
//!   threat this stops is the one the issue names: any host that can reach the port. It
//!   does not stop an attacker who can inject into an established TCP connection on the
//!   path; as with RDMA (whose traffic is neither encrypted nor authenticated either), run
//!   the data network as a private network or under IPsec/WireGuard when that matters.
//!   TLS with a pre-shared key would cover that too, but rustls has no external PSK, a
//!   cluster CA is an operational burden every user would pay, and encrypting every KV page
//!   would cost the CPU the lanes need.
//! - **Cheap**: one extra round trip per connection (the initiator pipelines its first
//!   request after the proof), under a millisecond on a LAN; connections are pooled.
//!
//! The name a peer declares in its hello is bound to its proof: it is who notifications come
//! from ([`crate::Notification::from`]), never a name inside a payload. All holders of the
//! secret are equal: the secret authenticates membership of the cluster, not one node.
//!
//! # Shared memory
//! A same-host peer maps a region from the location in the descriptor, which only
//! authenticated peers (or store-key holders, through the master's metadata) get; the
//! kernel lets only processes of the owner's user open `/proc/<pid>/fd/<fd>`, and a process
//! of that user could ptrace the owner anyway. What a mapper can be made to do by a
//! malicious or dying owner is bounded by the memfd's seals (see `shm`).
//!
//! The secret itself (its file, checks, derived keys) is the `trust` crate's
//! ([`trust::ClusterSecret`]), shared with the gateway and the store.
//!
//! # Layout
//! - [`handshake`]: the handshake's codec and the two sides' exchanges.

pub mod handshake;

pub use handshake::{HandshakeError, PeerIdentity};
pub use trust::{ClusterSecret, MIN_SECRET_LEN, SECRET_FILE_ENV};
