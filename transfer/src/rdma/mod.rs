//! RDMA transport (cargo feature `rdma`): one-sided RDMA WRITE and READ on reliable-connection
//! queue pairs into registered memory regions.
//!
//! This module holds what runs everywhere and is tested everywhere: device detection and the
//! off/on/auto decision (no usable device is a clear error naming TCP as the fallback, or a
//! logged fallback in `auto`), the queue-pair handshake payload exchanged over the TCP
//! control connection, the choice of device pairs for a region, and slicing. The verbs data
//! path itself is in `verbs` and only exists with the `rdma` feature. Without the feature
//! `Transport` is an uninhabited type, so the engine carries no `cfg` of its own.

#[cfg(feature = "rdma")]
pub(crate) mod device;
#[cfg(feature = "rdma")]
pub(crate) mod verbs;

use serde::{Deserialize, Serialize};

use crate::config::{EngineConfig, RdmaMode};
use crate::error::{Result, TransferError};
use crate::segment::{RdmaDeviceEndpoint, RegionDescriptor};

#[cfg(feature = "rdma")]
pub(crate) use verbs::Transport;

/// Handshake payload format version.
pub const HANDSHAKE_VERSION: u32 = 1;

/// Names of the RDMA devices this host offers, or why there are none.
///
/// On hosts without InfiniBand support in the kernel `ibv_get_device_list` fails with
/// `ENOSYS`; an empty list is treated the same way.
pub fn probe_devices() -> std::result::Result<Vec<String>, String> {
    #[cfg(feature = "rdma")]
    {
        verbs::device_names()
    }
    #[cfg(not(feature = "rdma"))]
    {
        Err("this build has no RDMA support (cargo feature `rdma` is off)".into())
    }
}

/// Kernel modules through which RDMA NICs reach GPU memory (GPUDirect RDMA): NVIDIA's
/// `nvidia_peermem`, and the older out-of-tree `nv_peer_mem`.
const PEER_MEMORY_MODULES: [&str; 2] = ["nvidia_peermem", "nv_peer_mem"];

/// Whether the NICs can register GPU memory directly (a peer-memory module is loaded):
/// device regions are then registered with them like host memory; otherwise they get no
/// RDMA keys and peers stage them over TCP.
pub fn gpudirect_available() -> bool {
    peer_memory_loaded(std::path::Path::new("/sys/module"))
}

/// [`gpudirect_available`] against a `/sys/module`-like directory.
fn peer_memory_loaded(sys_module: &std::path::Path) -> bool {
    PEER_MEMORY_MODULES
        .iter()
        .any(|m| sys_module.join(m).exists())
}

/// Decides which RDMA devices to use from the mode, the configured device filter and the
/// probe result: `Ok(empty)` means "no RDMA, use TCP".
pub fn select_devices(
    mode: RdmaMode,
    wanted: &[String],
    probe: std::result::Result<Vec<String>, String>,
) -> Result<Vec<String>> {
    if mode == RdmaMode::Off {
        return Ok(Vec::new());
    }
    let found = probe.and_then(|devices| {
        let chosen: Vec<String> = devices
            .iter()
            .filter(|d| wanted.is_empty() || wanted.contains(d))
            .cloned()
            .collect();
        if chosen.is_empty() {
            Err(if devices.is_empty() {
                "no RDMA devices found".to_owned()
            } else {
                format!("none of the requested devices {wanted:?} exists (found {devices:?})")
            })
        } else {
            Ok(chosen)
        }
    });
    match (mode, found) {
        (_, Ok(devices)) => Ok(devices),
        (RdmaMode::Auto, Err(reason)) => {
            tracing::warn!(%reason, "RDMA unavailable; falling back to TCP");
            Ok(Vec::new())
        }
        (_, Err(reason)) => Err(TransferError::TransportUnavailable {
            transport: "rdma",
            reason: format!(
                "{reason}; use the TCP transport (rdma = \"off\", the default) or rdma = \"auto\" to fall back to TCP"
            ),
        }),
    }
}

/// Probes and opens the RDMA transport as the configuration asks.
pub(crate) fn start(config: &EngineConfig) -> Result<Option<std::sync::Arc<Transport>>> {
    let devices = select_devices(config.rdma, &config.rdma_devices, probe_devices())?;
    if devices.is_empty() {
        return Ok(None);
    }
    #[cfg(feature = "rdma")]
    {
        match Transport::open(&devices, config) {
            Ok(t) => Ok(Some(t)),
            Err(e) if config.rdma == RdmaMode::Auto => {
                tracing::warn!(error = %e, "opening RDMA devices failed; falling back to TCP");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
    #[cfg(not(feature = "rdma"))]
    {
        unreachable!("select_devices returns no device without the rdma feature")
    }
}

/// Without the `rdma` feature there is no RDMA transport: this type has no values.
#[cfg(not(feature = "rdma"))]
pub(crate) enum Transport {}

/// The engine-facing surface of the RDMA transport; with no feature it cannot be called
/// (there is no value to call it on).
#[cfg(not(feature = "rdma"))]
impl Transport {
    pub(crate) fn device_names(&self) -> Vec<String> {
        match *self {}
    }

    pub(crate) fn endpoints(&self) -> Vec<RdmaDeviceEndpoint> {
        match *self {}
    }

    pub(crate) fn register(
        &self,
        _region: &crate::memory::MemoryRegion,
    ) -> Result<(
        Vec<crate::segment::RdmaKey>,
        Vec<crate::registry::NicRegistration>,
    )> {
        match *self {}
    }

    pub(crate) fn acceptor(&self) -> std::sync::Arc<dyn crate::tcp::server::RdmaAcceptor> {
        match *self {}
    }

    pub(crate) async fn submit(
        &self,
        _batch: &std::sync::Arc<crate::op::BatchState>,
        _idx: usize,
        _paths: Vec<RdmaPath>,
        _peer: &crate::segment::SegmentDescriptor,
        _control: std::sync::Arc<crate::tcp::client::Peer>,
    ) {
        match *self {}
    }
}

/// One side of a queue-pair connection, exchanged over the TCP control connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpEndpoint {
    /// Device name.
    pub device: String,
    /// Port LID (InfiniBand).
    pub lid: u16,
    /// GID as 32 hex digits (RoCE / global routing), if used.
    pub gid: Option<String>,
    /// Queue-pair number (24 bits).
    pub qp_num: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
}

/// The RDMA handshake: the initiator names the target device it wants to reach and its own
/// endpoint; the target answers with its endpoint on that device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaHandshake {
    /// Format version ([`HANDSHAKE_VERSION`]).
    pub version: u32,
    /// The device of the receiver this connection is for.
    pub target_device: String,
    /// The sender's endpoint.
    pub endpoint: QpEndpoint,
}

impl RdmaHandshake {
    /// JSON encoding (sent as the RdmaConnect payload and its reply).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("handshake serialises")
    }

    /// Decodes and validates a handshake payload.
    pub fn decode(bytes: &[u8]) -> std::result::Result<Self, String> {
        let h: RdmaHandshake = serde_json::from_slice(bytes)
            .map_err(|e| format!("undecodable RDMA handshake: {e}"))?;
        if h.version != HANDSHAKE_VERSION {
            return Err(format!(
                "RDMA handshake version {} not supported",
                h.version
            ));
        }
        let e = &h.endpoint;
        if e.qp_num == 0 || e.qp_num >= 1 << 24 || e.psn >= 1 << 24 {
            return Err(format!(
                "RDMA handshake with invalid qp_num {} / psn {}",
                e.qp_num, e.psn
            ));
        }
        if let Some(g) = &e.gid {
            gid_from_hex(g)?;
        }
        if e.device.is_empty() || h.target_device.is_empty() {
            return Err("RDMA handshake without device names".into());
        }
        Ok(h)
    }
}

/// 16 GID bytes as 32 lowercase hex digits.
pub fn gid_to_hex(gid: &[u8; 16]) -> String {
    gid.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses 32 hex digits into GID bytes.
pub fn gid_from_hex(s: &str) -> std::result::Result<[u8; 16], String> {
    if s.len() != 32 || !s.is_ascii() {
        return Err(format!("GID {s:?} is not 32 hex digits"));
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("GID {s:?} is not hex"))?;
    }
    Ok(out)
}

/// A usable (local device, remote device) pair for a region, with the region's key there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaPath {
    /// Index into the local device list.
    pub local: usize,
    /// Remote device name.
    pub remote: String,
    /// The region's remote key on that device.
    pub rkey: u32,
}

/// Device pairs that can reach `region`: every remote device that has a key for it, each
/// paired with a local device (round robin), local device order preserved so the retry
/// order moves to another device.
pub fn paths_for(
    local_devices: &[String],
    peer: &[RdmaDeviceEndpoint],
    region: &RegionDescriptor,
) -> Vec<RdmaPath> {
    if local_devices.is_empty() {
        return Vec::new();
    }
    peer.iter()
        .filter_map(|ep| {
            region
                .rkey(&ep.device)
                .map(|rkey| (ep.device.clone(), rkey))
        })
        .enumerate()
        .map(|(i, (remote, rkey))| RdmaPath {
            local: i % local_devices.len(),
            remote,
            rkey,
        })
        .collect()
}

/// One slice of a request on one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlicePlan {
    /// Offset inside the request.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Index into the request's paths.
    pub path: usize,
}

/// Cuts `len` bytes into slices of at most `slice` bytes spread round robin over `paths`
/// (`first_path` first, so consecutive requests start on different devices).
pub fn plan_slices(len: u64, slice: u64, paths: usize, first_path: usize) -> Vec<SlicePlan> {
    if len == 0 || paths == 0 {
        return Vec::new();
    }
    let slice = slice.max(1);
    (0..len.div_ceil(slice))
        .map(|k| {
            let offset = k * slice;
            SlicePlan {
                offset,
                len: slice.min(len - offset),
                path: (first_path + k as usize) % paths,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::RdmaKey;

    #[test]
    fn gpudirect_needs_a_peer_memory_module() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!peer_memory_loaded(dir.path()));
        std::fs::create_dir(dir.path().join("ib_core")).unwrap();
        assert!(!peer_memory_loaded(dir.path()));
        std::fs::create_dir(dir.path().join("nvidia_peermem")).unwrap();
        assert!(peer_memory_loaded(dir.path()));
        let old = tempfile::tempdir().unwrap();
        std::fs::create_dir(old.path().join("nv_peer_mem")).unwrap();
        assert!(peer_memory_loaded(old.path()));
    }

    #[test]
    fn no_device_is_an_error_naming_tcp_and_auto_falls_back() {
        let enosys = Err("ibv_get_device_list: Function not implemented (os error 38)".to_string());
        let err = select_devices(RdmaMode::On, &[], enosys.clone()).unwrap_err();
        assert!(matches!(
            err,
            TransferError::TransportUnavailable {
                transport: "rdma",
                ..
            }
        ));
        let text = err.to_string();
        assert!(
            text.contains("os error 38") && text.contains("TCP"),
            "{text}"
        );
        assert_eq!(
            select_devices(RdmaMode::Auto, &[], enosys.clone()).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            select_devices(RdmaMode::Off, &[], enosys).unwrap(),
            Vec::<String>::new()
        );
        assert!(
            select_devices(RdmaMode::On, &[], Ok(vec![]))
                .unwrap_err()
                .to_string()
                .contains("no RDMA devices")
        );
        let two = Ok(vec!["mlx5_0".to_string(), "mlx5_1".to_string()]);
        assert_eq!(
            select_devices(RdmaMode::On, &["mlx5_1".into()], two.clone()).unwrap(),
            vec!["mlx5_1".to_string()]
        );
        assert!(select_devices(RdmaMode::On, &["mlx5_9".into()], two.clone()).is_err());
        assert_eq!(
            select_devices(RdmaMode::Auto, &["mlx5_9".into()], two).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn this_host_has_no_usable_rdma() {
        // These machines have no RDMA in the kernel; with the feature on, the probe fails
        // (ENOSYS) instead of listing devices; without it, the probe says the feature is off.
        let probe = probe_devices();
        let reason = probe.expect_err("no RDMA device is expected on the CI machines");
        assert!(!reason.is_empty());
        let cfg = EngineConfig {
            rdma: RdmaMode::On,
            ..EngineConfig::default()
        };
        assert!(matches!(
            start(&cfg),
            Err(TransferError::TransportUnavailable { .. })
        ));
        let cfg = EngineConfig {
            rdma: RdmaMode::Auto,
            ..EngineConfig::default()
        };
        assert!(start(&cfg).unwrap().is_none());
    }

    #[test]
    fn handshake_round_trip_and_validation() {
        let gid = [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55,
        ];
        let h = RdmaHandshake {
            version: HANDSHAKE_VERSION,
            target_device: "mlx5_1".into(),
            endpoint: QpEndpoint {
                device: "mlx5_0".into(),
                lid: 3,
                gid: Some(gid_to_hex(&gid)),
                qp_num: 0x1234,
                psn: 77,
            },
        };
        let back = RdmaHandshake::decode(&h.encode()).unwrap();
        assert_eq!(back, h);
        assert_eq!(
            gid_from_hex(back.endpoint.gid.as_deref().unwrap()).unwrap(),
            gid
        );
        for bad in [
            RdmaHandshake {
                version: 2,
                ..h.clone()
            },
            RdmaHandshake {
                endpoint: QpEndpoint {
                    qp_num: 0,
                    ..h.endpoint.clone()
                },
                ..h.clone()
            },
            RdmaHandshake {
                endpoint: QpEndpoint {
                    psn: 1 << 24,
                    ..h.endpoint.clone()
                },
                ..h.clone()
            },
            RdmaHandshake {
                endpoint: QpEndpoint {
                    gid: Some("zz".into()),
                    ..h.endpoint.clone()
                },
                ..h.clone()
            },
            RdmaHandshake {
                target_device: String::new(),
                ..h.clone()
            },
        ] {
            assert!(RdmaHandshake::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        assert!(RdmaHandshake::decode(b"not json").is_err());
    }

    #[test]
    fn paths_follow_region_keys() {
        let peer = vec![
            RdmaDeviceEndpoint {
                device: "a".into(),
                lid: 1,
                gid: None,
            },
            RdmaDeviceEndpoint {
                device: "b".into(),
                lid: 2,
                gid: None,
            },
            RdmaDeviceEndpoint {
                device: "c".into(),
                lid: 3,
                gid: None,
            },
        ];
        let region = RegionDescriptor {
            id: 1,
            addr: 0x1000,
            len: 4096,
            token: 1,
            shm: None,
            rdma: vec![
                RdmaKey {
                    device: "a".into(),
                    rkey: 10,
                },
                RdmaKey {
                    device: "c".into(),
                    rkey: 30,
                },
            ],
            location: crate::device::Location::Host,
            cuda_ipc: None,
        };
        let paths = paths_for(&["x".into(), "y".into()], &peer, &region);
        assert_eq!(
            paths,
            vec![
                RdmaPath {
                    local: 0,
                    remote: "a".into(),
                    rkey: 10
                },
                RdmaPath {
                    local: 1,
                    remote: "c".into(),
                    rkey: 30
                }
            ]
        );
        assert!(paths_for(&[], &peer, &region).is_empty());
        let no_keys = RegionDescriptor {
            rdma: vec![],
            ..region
        };
        assert!(paths_for(&["x".into()], &peer, &no_keys).is_empty());
    }

    #[test]
    fn slices_cover_the_request_round_robin() {
        let plan = plan_slices(10, 4, 2, 1);
        assert_eq!(
            plan,
            vec![
                SlicePlan {
                    offset: 0,
                    len: 4,
                    path: 1
                },
                SlicePlan {
                    offset: 4,
                    len: 4,
                    path: 0
                },
                SlicePlan {
                    offset: 8,
                    len: 2,
                    path: 1
                }
            ]
        );
        assert!(plan_slices(0, 4, 2, 0).is_empty());
        assert!(plan_slices(5, 4, 0, 0).is_empty());
        let big = plan_slices(1 << 30, 64 << 10, 3, 0);
        assert_eq!(big.iter().map(|s| s.len).sum::<u64>(), 1 << 30);
        assert!(
            big.windows(2)
                .all(|w| w[0].offset + w[0].len == w[1].offset)
        );
    }
}
