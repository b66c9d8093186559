//! `MooncakeDistributedStore.setup`'s arguments (positional and dict forms) turned into a
//! [`kvclient::ClientConfig`].
//!
//! - `master_server_addr` `"host:port"` is Moongate's REST master at `http://host:port`
//!   (an `http://` or `https://` URL is taken as it is);
//! - `metadata_server` is `P2PHANDSHAKE` or Mooncake's HTTP metadata URL;
//! - `local_hostname` is the host peers reach this client's segment on;
//! - `protocol` `tcp` is TCP only, `rdma` is RDMA when a device is usable (shared memory
//!   with same-host peers, TCP otherwise, logged);
//! - sizes are ints or Mooncake's human-readable strings (`"16MB"`, `"16 MB"`: `kvclient::parse_size`);
//! - the secrets (store key, cluster secret, master CA) come from the environment the Rust
//!   side reads (`MOONGATE_STORE_API_KEY`, `MOONGATE_TRANSFER_SECRET_FILE`,
//!   `MOONGATE_STORE_MASTER_CA_CERT`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use kvclient::ClientConfig;
use kvclient::{Protocol, env};
use trust::Secret;

/// Mooncake's defaults for the dict form's sizes (16 MB each).
pub const DEFAULT_SIZE: u64 = 16 * 1024 * 1024;

/// The settings of one `setup` call, before they become a [`ClientConfig`].
#[derive(Debug, Clone, PartialEq)]
pub struct SetupArgs {
    /// Host peers reach this client's segment on.
    pub local_hostname: String,
    /// `P2PHANDSHAKE` or an HTTP metadata URL.
    pub metadata_server: String,
    /// Bytes this client contributes to the store.
    pub global_segment_size: u64,
    /// Copy buffer for `put` / `get` (0: only the zero-copy forms work, as in Mooncake).
    pub local_buffer_size: u64,
    /// `tcp` or `rdma`.
    pub protocol: String,
    /// RDMA devices (comma-separated).
    pub rdma_devices: String,
    /// The master: `host:port` or a URL.
    pub master_server_addr: String,
    /// Mooncake's `enable_ssd_offload` with its `ssd_offload_path` (`None`: no disk tier;
    /// an empty path: `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`, else Mooncake's default).
    pub ssd_offload: Option<String>,
}

/// Mooncake's default SSD offload directory (`FileStorageConfig::storage_filepath`).
pub const DEFAULT_OFFLOAD_PATH: &str = "/data/file_storage";
/// Mooncake's default bound on offloaded bytes (`total_size_limit`, 2 TiB).
pub const DEFAULT_OFFLOAD_BYTES: u64 = 2 << 40;

/// The disk tier Mooncake's SSD offload settings ask for: the directory (the given path,
/// else `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`, else Mooncake's default) and its capacity
/// (`MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`, else Mooncake's default).
pub fn offload_disk(path: &str) -> Result<(PathBuf, u64), String> {
    let path = match path {
        "" => std::env::var("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH")
            .unwrap_or_else(|_| DEFAULT_OFFLOAD_PATH.to_owned()),
        p => p.to_owned(),
    };
    if !path.starts_with('/') {
        return Err(format!(
            "ssd_offload_path {path:?} must be an absolute path"
        ));
    }
    let bytes = match std::env::var("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES") {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|e| format!("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES={v:?}: {e}"))?,
        Err(_) => DEFAULT_OFFLOAD_BYTES,
    };
    Ok((PathBuf::from(path), bytes))
}

/// The master URL for Mooncake's `master_server_addr`.
pub fn master_url(addr: &str) -> Result<String, String> {
    let a = addr.trim();
    if a.starts_with("http://") || a.starts_with("https://") {
        return Ok(a.trim_end_matches('/').to_owned());
    }
    if a.contains("://") {
        return Err(format!(
            "master_server_addr {a:?}: give host:port (Moongate's REST master) or an http(s):// URL"
        ));
    }
    match a.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => Ok(format!("http://{a}")),
        _ => Err(format!("master_server_addr {a:?} must be host:port")),
    }
}

impl SetupArgs {
    /// The client configuration: defaults, then these settings, then the secrets and TLS
    /// settings from the environment.
    pub fn client_config(&self) -> Result<ClientConfig, String> {
        let protocol = match self.protocol.as_str() {
            "tcp" => Protocol::Tcp,
            "rdma" if std::env::var("MC_FORCE_TCP").is_ok_and(|v| v == "1") => Protocol::Tcp,
            "rdma" => Protocol::Auto,
            other => return Err(format!("protocol {other:?} is not supported (tcp, rdma)")),
        };
        let metadata = if self.metadata_server == "P2PHANDSHAKE" {
            "p2p".to_owned()
        } else if self.metadata_server.starts_with("http://")
            || self.metadata_server.starts_with("https://")
        {
            self.metadata_server.clone()
        } else {
            return Err(format!(
                "metadata_server {:?}: Moongate speaks P2PHANDSHAKE and Mooncake's HTTP metadata \
                 protocol (http://master:port/metadata), not etcd or redis",
                self.metadata_server
            ));
        };
        let (_, ip) = host_and_ip(&self.local_hostname)?;
        let env_path = |k: &str| std::env::var_os(k).map(PathBuf::from);
        let rpc_busy_poll_us = match std::env::var(env::RPC_BUSY_POLL_US) {
            Ok(v) => v
                .trim()
                .parse()
                .map_err(|e| format!("{}={v:?}: {e}", env::RPC_BUSY_POLL_US))?,
            Err(_) => kvclient::DEFAULT_RPC_BUSY_POLL_US,
        };
        let put_reserve_bytes = match std::env::var(env::PUT_RESERVE_BYTES) {
            Ok(v) => kvclient::parse_size(&v)
                .map_err(|e| format!("{}={v:?}: {e}", env::PUT_RESERVE_BYTES))?,
            Err(_) => kvclient::DEFAULT_PUT_RESERVE_BYTES,
        };
        let (disk_path, disk_capacity) = match &self.ssd_offload {
            Some(path) => {
                let (p, bytes) = offload_disk(path)?;
                (Some(p), bytes)
            }
            None => (None, ClientConfig::default().disk_capacity),
        };
        Ok(ClientConfig {
            disk_path,
            disk_capacity,
            // Mooncake writes each value to its SSD once complete unless its master says
            // offload_on_evict (Moongate's master: --master-disk-offload-on-evict).
            disk_write_policy: kvclient::DiskWritePolicy::WriteThrough,
            master: master_url(&self.master_server_addr)?,
            segment_size: self.global_segment_size,
            // The copy buffer must exist; a zero-sized one is refused at put/get instead.
            local_buffer_size: self.local_buffer_size.max(4096),
            listen: SocketAddr::new(ip, 0),
            advertise_host: Some(ip.to_string()),
            protocol,
            metadata,
            transfer_secret_file: env_path(env::TRANSFER_SECRET_FILE),
            store_api_key: std::env::var(env::STORE_API_KEY).ok().map(Secret::new),
            master_ca_cert: env_path(env::MASTER_CA_CERT),
            rpc_busy_poll_us,
            put_reserve_bytes,
            admin_api_key: std::env::var("MOONGATE_ADMIN_API_KEY")
                .ok()
                .map(Secret::new),
            ..ClientConfig::default()
        })
    }
}

/// Ports to try for the store's transfer listener: the one `local_hostname` names, else
/// (as Mooncake picks its RPC port) random ones in 12300..=14300, then any free port.
pub fn listen_ports(local_hostname: &str) -> Vec<u16> {
    if let Some((_, p)) = local_hostname.rsplit_once(':')
        && let Ok(port) = p.parse::<u16>()
        && port != 0
    {
        return vec![port];
    }
    let mut v: Vec<u16> = (0..16).map(|_| 12300 + rand_below(2001) as u16).collect();
    v.push(0);
    v
}

/// A number in `0..n` from the clock and the process id (ports need no real randomness).
fn rand_below(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() % n
}

/// The host part of `local_hostname` and the IP peers reach it on: a literal IP as it is, a
/// name resolved here (IPv4 first), since transfer endpoints are addresses.
pub fn host_and_ip(local_hostname: &str) -> Result<(String, IpAddr), String> {
    use std::net::ToSocketAddrs;
    let host = host_of(local_hostname);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok((host, ip));
    }
    let addrs: Vec<SocketAddr> = (host.as_str(), 0)
        .to_socket_addrs()
        .map_err(|e| format!("local_hostname {host:?} does not resolve: {e}"))?
        .collect();
    let ip = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .map(SocketAddr::ip)
        .ok_or_else(|| format!("local_hostname {host:?} resolves to no address"))?;
    Ok((host, ip))
}

/// The host part of Mooncake's `local_hostname` (`host` or `host:port`, IPv6 bracketed).
pub fn host_of(local_hostname: &str) -> String {
    let h = match local_hostname.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() && !h.is_empty() && !h.ends_with(':') => h,
        _ => local_hostname,
    };
    let h = h.trim_start_matches('[').trim_end_matches(']');
    if h.is_empty() {
        "127.0.0.1".into()
    } else {
        h.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_mooncake_writes_them() {
        use kvclient::parse_size;
        assert_eq!(parse_size("16MB"), Ok(16 << 20));
        assert_eq!(parse_size("16 MB"), Ok(16 << 20));
        assert_eq!(parse_size("3200"), Ok(3200));
        assert!(parse_size("50%").is_err());
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn master_addresses() {
        assert_eq!(
            master_url("127.0.0.1:50051").unwrap(),
            "http://127.0.0.1:50051"
        );
        assert_eq!(master_url("https://m:1/").unwrap(), "https://m:1");
        assert!(master_url("m").is_err());
        assert!(master_url("etcd://m:1").is_err());
    }

    #[test]
    fn settings_become_a_client_config() {
        let a = SetupArgs {
            local_hostname: "localhost".into(),
            metadata_server: "P2PHANDSHAKE".into(),
            global_segment_size: 1 << 20,
            local_buffer_size: 0,
            protocol: "tcp".into(),
            rdma_devices: String::new(),
            master_server_addr: "127.0.0.1:9".into(),
            ssd_offload: None,
        };
        let c = a.client_config().unwrap();
        assert_eq!(
            (c.master.as_str(), c.metadata.as_str()),
            ("http://127.0.0.1:9", "p2p")
        );
        assert_eq!(c.local_buffer_size, 4096);
        assert_eq!(c.protocol, Protocol::Tcp);
        assert_eq!(host_of("10.0.0.2:17"), "10.0.0.2");
        assert_eq!(host_of("[::1]:17"), "::1");
        let etcd = SetupArgs {
            metadata_server: "127.0.0.1:2379".into(),
            ..a.clone()
        };
        assert!(etcd.client_config().unwrap_err().contains("etcd"));
        let nvlink = SetupArgs {
            protocol: "nvlink".into(),
            ..a
        };
        assert!(nvlink.client_config().is_err());
    }
}
