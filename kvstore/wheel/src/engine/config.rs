//! Mooncake's `initialize` arguments turned into an engine configuration: the listen
//! address and segment name from `local_hostname`, the metadata connection string, the
//! transports for `protocol`, the timeout from `MC_TRANSFER_TIMEOUT`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use transfer::{MetadataConfig, RdmaMode};

/// Mooncake's sync-transfer timeout variable (seconds, at least 5; default 30).
pub const TIMEOUT_ENV: &str = "MC_TRANSFER_TIMEOUT";
/// Mooncake's switch from RDMA to TCP.
pub const FORCE_TCP_ENV: &str = "MC_FORCE_TCP";

/// Where the engine listens, what it advertises and the segment names to try, from
/// Mooncake's `local_hostname` (`host` or `host:port`; the port is not bound, as in Mooncake
/// without `MC_LEGACY_RPC_PORT_BINDING`). A literal IP is bound and names the segment
/// `ip:port`; a name is resolved and bound, and the segment keeps the name (`name:port`, the
/// session id SGLang builds), on a port picked here; a metadata server names it
/// `local_hostname`.
pub(super) fn listen_for(
    local_hostname: &str,
    metadata: &MetadataConfig,
) -> Result<Vec<(SocketAddr, String, Option<String>)>, String> {
    let (host, ip) = crate::setup::host_and_ip(local_hostname)?;
    let advertise = ip.to_string();
    if !matches!(metadata, MetadataConfig::P2p) {
        let name = Some(local_hostname.to_owned());
        return Ok(vec![(SocketAddr::new(ip, 0), advertise, name)]);
    }
    if host.parse::<IpAddr>().is_ok() {
        return Ok(vec![(SocketAddr::new(ip, 0), advertise, None)]);
    }
    Ok(crate::setup::listen_ports("")
        .into_iter()
        .filter(|&p| p != 0)
        .map(|p| {
            (
                SocketAddr::new(ip, p),
                advertise.clone(),
                Some(format!("{host}:{p}")),
            )
        })
        .collect())
}

/// Mooncake's metadata connection string: `P2PHANDSHAKE`, or `type://server`.
pub(super) fn metadata_for(
    metadata_server: &str,
    metadata_type: &str,
) -> Result<MetadataConfig, String> {
    if metadata_server == "P2PHANDSHAKE" {
        return Ok(MetadataConfig::P2p);
    }
    let conn = if metadata_server.contains("://") {
        metadata_server.to_owned()
    } else {
        format!("{metadata_type}://{metadata_server}")
    };
    if conn.starts_with("http://") || conn.starts_with("https://") {
        Ok(MetadataConfig::http(conn))
    } else {
        Err(format!(
            "metadata server {conn:?}: Moongate speaks P2PHANDSHAKE and Mooncake's HTTP \
             metadata protocol (e.g. http://master:port/metadata, which `moongate master` \
             serves), not etcd or redis"
        ))
    }
}

/// The transports for Mooncake's `protocol`: (shared memory and CUDA IPC with same-host
/// peers, RDMA).
pub(super) fn transports_for(protocol: &str) -> Result<(bool, RdmaMode), String> {
    let force_tcp = std::env::var(FORCE_TCP_ENV).is_ok_and(|v| v == "1" || v == "true");
    match protocol {
        "tcp" => Ok((false, RdmaMode::Off)),
        "rdma" if force_tcp => {
            tracing::warn!("{FORCE_TCP_ENV} is set: protocol rdma runs over TCP");
            Ok((true, RdmaMode::Off))
        }
        // Shared memory with same-host peers, RDMA when a device is usable, else TCP (the
        // engine logs the fallback, as Mooncake does with MC_FORCE_TCP).
        "rdma" => Ok((true, RdmaMode::Auto)),
        other => Err(format!("protocol {other:?} is not supported (tcp, rdma)")),
    }
}

pub(super) fn transfer_timeout() -> Duration {
    let secs = std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(|s| s.max(5))
        .unwrap_or(30);
    Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_strings_parse() {
        assert_eq!(
            metadata_for("P2PHANDSHAKE", "etcd").unwrap(),
            MetadataConfig::P2p
        );
        assert_eq!(
            metadata_for("http://m:1/metadata", "etcd").unwrap(),
            MetadataConfig::http("http://m:1/metadata")
        );
        assert_eq!(
            metadata_for("m:1/metadata", "http").unwrap(),
            MetadataConfig::http("http://m:1/metadata")
        );
        assert!(
            metadata_for("127.0.0.1:2379", "etcd")
                .unwrap_err()
                .contains("etcd")
        );
        let p2p = MetadataConfig::P2p;
        let ip = listen_for("10.0.0.5", &p2p).unwrap();
        assert_eq!(
            ip,
            vec![("10.0.0.5:0".parse().unwrap(), "10.0.0.5".into(), None)]
        );
        let named = listen_for("localhost", &p2p).unwrap();
        let (addr, adv, name) = &named[0];
        assert_eq!((adv.as_str(), addr.ip().is_loopback()), ("127.0.0.1", true));
        assert_eq!(name.clone().unwrap(), format!("localhost:{}", addr.port()));
        let http = listen_for(
            "127.0.0.1:12345",
            &MetadataConfig::http("http://m/metadata"),
        )
        .unwrap();
        assert_eq!(http[0].2.as_deref(), Some("127.0.0.1:12345"));
        assert_eq!(
            listen_for("[::1]:7", &p2p).unwrap()[0].0,
            "[::1]:0".parse().unwrap()
        );
        assert!(listen_for("no-such-host.invalid", &p2p).is_err());
        assert!(transports_for("nvlink").is_err());
        assert_eq!(transports_for("tcp").unwrap(), (false, RdmaMode::Off));
    }
}
