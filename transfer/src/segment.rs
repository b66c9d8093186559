//! Segment descriptors: what a node publishes about itself so peers can address its memory.
//!
//! A node's registered regions form its **segment**, named like `host:port` (its TCP
//! endpoint). The descriptor lists its endpoints per transport and its regions (address,
//! length, access token, and, when present, shared-memory location and RDMA keys). It is
//! serialised as JSON with a format `version`; a reader refuses versions it does not know.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

pub use crate::device::Location;
use crate::error::{RemoteRange, Result, TransferError};

/// Descriptor format version written by this crate.
pub const DESCRIPTOR_VERSION: u32 = 1;

/// Everything a peer needs to address a node's registered memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDescriptor {
    /// Format version ([`DESCRIPTOR_VERSION`]).
    pub version: u32,
    /// Segment name (`host:port` unless configured otherwise).
    pub name: String,
    /// Identifies the host (kernel boot id + pid namespace): equal ids mean the shared-memory
    /// transport can map this node's shared regions.
    pub host_id: String,
    /// Random per engine instance: a restarted node at the same name gets a new one.
    pub engine_id: u64,
    /// Bumped on every registration change.
    pub generation: u64,
    /// How to reach the node.
    pub endpoints: Endpoints,
    /// Registered regions, sorted by address, non-overlapping.
    pub regions: Vec<RegionDescriptor>,
}

/// Transport endpoints of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoints {
    /// TCP data and control endpoint (`ip:port`).
    pub tcp: Option<String>,
    /// RDMA devices usable for one-sided access (empty without RDMA).
    #[serde(default)]
    pub rdma: Vec<RdmaDeviceEndpoint>,
}

/// An RDMA device of a node, as peers need it to pick a device and connect queue pairs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaDeviceEndpoint {
    /// Device name (`mlx5_0`).
    pub device: String,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID (RoCE / global routing), hex.
    pub gid: Option<String>,
}

/// One registered region of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionDescriptor {
    /// Per-engine region id.
    pub id: u64,
    /// First byte's address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Access token every request into this region must carry.
    pub token: u64,
    /// Where a same-host peer maps it (shared regions only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm: Option<ShmRegion>,
    /// Remote keys per RDMA device (empty without RDMA, and for device memory the NICs
    /// cannot reach).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma: Vec<RdmaKey>,
    /// Where the bytes live (absent: host memory). Peers need not care: the owner stages
    /// device memory for them; it tells what a transfer will cost.
    #[serde(default, skip_serializing_if = "Location::is_host")]
    pub location: Location,
    /// How a same-host peer opens this device region (device regions with IPC only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_ipc: Option<CudaIpcRegion>,
}

/// How a same-host peer reaches a device region: a CUDA IPC handle of the allocation it is
/// in, and the region's control block (a sealed memfd, mapped and checked as shared memory
/// is: the owner is alive and the registration is still the one named).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaIpcRegion {
    /// The IPC handle, hex (64 bytes).
    pub handle: String,
    /// Offset of the region's first byte from the start of the allocation the handle maps.
    pub offset: u64,
    /// UUID of the device holding it (`GPU-...`): the opener copies on its own ordinal of
    /// that device.
    pub device_uuid: String,
    /// The region's control block.
    pub control: ShmRegion,
}

impl CudaIpcRegion {
    /// A handle's bytes as the descriptor carries them (hex).
    pub(crate) fn encode_handle(handle: &[u8]) -> String {
        handle.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// The bytes of a handle as the descriptor carries it; `None` when it is not hex.
    pub(crate) fn decode_handle(s: &str) -> Option<Vec<u8>> {
        if !s.len().is_multiple_of(2) || !s.is_ascii() {
            return None;
        }
        (0..s.len() / 2)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
            .collect()
    }
}

/// Shared-memory location of a region (see `memory::ShmLocation`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmRegion {
    /// Owner process.
    pub pid: u32,
    /// Owner's memfd descriptor number.
    pub fd: i32,
    /// memfd name (checked against `/proc/<pid>/fd/<fd>`'s link).
    pub name: String,
    /// Offset of the data in the memfd (after the control page).
    pub data_offset: u64,
    /// Device of the memfd (with `ino`, the exact file a mapper accepts).
    #[serde(default)]
    pub dev: u64,
    /// Inode of the memfd (0: unknown, and then the region is never mapped).
    #[serde(default)]
    pub ino: u64,
}

/// An RDMA remote key of a region on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaKey {
    /// Device name, matching an entry of [`Endpoints::rdma`].
    pub device: String,
    /// Remote key for one-sided access.
    pub rkey: u32,
}

impl RegionDescriptor {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.len)
    }

    /// Whether `[addr, addr + len)` lies inside this region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.end())
    }

    /// The remote key for `device`, if the region is registered there.
    pub fn rkey(&self, device: &str) -> Option<u32> {
        self.rdma
            .iter()
            .find(|k| k.device == device)
            .map(|k| k.rkey)
    }
}

impl SegmentDescriptor {
    /// JSON encoding.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("descriptor serialises")
    }

    /// Decodes and validates JSON (version known, regions sorted and non-overlapping).
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        #[derive(Deserialize)]
        struct VersionOnly {
            version: u32,
        }
        let v: VersionOnly = serde_json::from_slice(bytes).map_err(|e| {
            TransferError::protocol("descriptor", format!("undecodable descriptor: {e}"))
        })?;
        if v.version != DESCRIPTOR_VERSION {
            return Err(TransferError::protocol(
                "descriptor",
                format!(
                    "descriptor version {} not supported (this build reads {DESCRIPTOR_VERSION})",
                    v.version
                ),
            ));
        }
        let d: SegmentDescriptor = serde_json::from_slice(bytes).map_err(|e| {
            TransferError::protocol("descriptor", format!("undecodable descriptor: {e}"))
        })?;
        d.validate()?;
        Ok(d)
    }

    fn validate(&self) -> Result<()> {
        let mut prev_end = 0u64;
        for r in &self.regions {
            if r.len == 0 || r.addr.checked_add(r.len).is_none() || r.addr < prev_end {
                return Err(TransferError::protocol(
                    &self.name,
                    format!(
                        "descriptor region {} at {:#x}+{} is empty, overflows or overlaps",
                        r.id, r.addr, r.len
                    ),
                ));
            }
            prev_end = r.end();
        }
        Ok(())
    }

    /// The region containing all of `[addr, addr + len)`.
    pub fn find_region(&self, addr: u64, len: u64) -> Result<&RegionDescriptor> {
        let idx = self.regions.partition_point(|r| r.addr <= addr);
        let range = RemoteRange::new(addr, len);
        let Some(r) = idx.checked_sub(1).map(|i| &self.regions[i]) else {
            return Err(self.out_of_bounds(range, "below every region"));
        };
        if addr >= r.end() {
            return Err(self.out_of_bounds(range, "not inside any region"));
        }
        if !r.contains(addr, len) {
            return Err(self.out_of_bounds(range, "crosses the end of its region"));
        }
        Ok(r)
    }

    fn out_of_bounds(&self, range: RemoteRange, reason: &str) -> TransferError {
        TransferError::OutOfBounds {
            segment: self.name.clone(),
            range,
            reason: reason.into(),
        }
    }

    /// The TCP endpoint as a socket address.
    pub fn tcp_addr(&self) -> Result<SocketAddr> {
        let ep = self.endpoints.tcp.as_deref().ok_or_else(|| {
            TransferError::unreachable(&self.name, "descriptor lists no TCP endpoint")
        })?;
        ep.parse().map_err(|e| {
            TransferError::protocol(&self.name, format!("bad TCP endpoint {ep:?}: {e}"))
        })
    }
}

/// This host's identity for the shared-memory transport: the kernel boot id plus the pid
/// and mount namespaces (two processes can map each other's memfds through `/proc` only if
/// all three match). Falls back to a random id (never equal to a peer's) when `/proc` is
/// not readable.
pub fn host_id() -> String {
    fn read() -> Option<String> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let pidns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let mntns = std::fs::read_link("/proc/self/ns/mnt").ok()?;
        Some(format!(
            "{}/{}/{}",
            boot.trim(),
            pidns.display(),
            mntns.display()
        ))
    }
    read().unwrap_or_else(|| format!("unknown-{:016x}", rand::random::<u64>()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_handles_round_trip_through_hex() {
        let h: Vec<u8> = (0..64).map(|i| (i * 7) as u8).collect();
        let text = CudaIpcRegion::encode_handle(&h);
        assert_eq!(CudaIpcRegion::decode_handle(&text).unwrap(), h);
        assert!(CudaIpcRegion::decode_handle("abc").is_none());
        assert!(CudaIpcRegion::decode_handle("zz").is_none());
        assert!(CudaIpcRegion::decode_handle("éé").is_none());
    }

    fn desc() -> SegmentDescriptor {
        SegmentDescriptor {
            version: DESCRIPTOR_VERSION,
            name: "127.0.0.1:7000".into(),
            host_id: host_id(),
            engine_id: 42,
            generation: 3,
            endpoints: Endpoints {
                tcp: Some("127.0.0.1:7000".into()),
                rdma: vec![RdmaDeviceEndpoint {
                    device: "mlx5_0".into(),
                    lid: 7,
                    gid: Some("fe80::1".into()),
                }],
            },
            regions: vec![
                RegionDescriptor {
                    id: 1,
                    addr: 0x1000,
                    len: 0x1000,
                    token: 11,
                    shm: None,
                    rdma: vec![RdmaKey {
                        device: "mlx5_0".into(),
                        rkey: 0xabc,
                    }],
                    location: Location::Host,
                    cuda_ipc: None,
                },
                RegionDescriptor {
                    id: 2,
                    addr: 0x4000,
                    len: 0x100,
                    token: 22,
                    shm: Some(ShmRegion {
                        pid: 9,
                        fd: 5,
                        name: "moongate-x".into(),
                        data_offset: 4096,
                        dev: 0,
                        ino: 0,
                    }),
                    rdma: vec![],
                    location: Location::Host,
                    cuda_ipc: None,
                },
                RegionDescriptor {
                    id: 3,
                    addr: 0x7f00_0000_0000,
                    len: 0x20_0000,
                    token: 33,
                    shm: None,
                    rdma: vec![],
                    location: Location::Cuda(1),
                    cuda_ipc: Some(CudaIpcRegion {
                        handle: "ab".repeat(64),
                        offset: 0x1000,
                        device_uuid: "GPU-00112233-4455-6677-8899-aabbccddeeff".into(),
                        control: ShmRegion {
                            pid: 9,
                            fd: 6,
                            name: "moongate-y".into(),
                            data_offset: 4096,
                            dev: 1,
                            ino: 2,
                        },
                    }),
                },
            ],
        }
    }

    #[test]
    fn json_round_trip_and_version_check() {
        let d = desc();
        let bytes = d.to_json();
        assert_eq!(SegmentDescriptor::from_json(&bytes).unwrap(), d);
        let mut future = d.clone();
        future.version = 2;
        let err = SegmentDescriptor::from_json(&future.to_json()).unwrap_err();
        assert!(err.to_string().contains("version 2 not supported"), "{err}");
        assert!(SegmentDescriptor::from_json(b"{\"version\":1}").is_err());
        assert!(SegmentDescriptor::from_json(b"\xff\x00").is_err());
    }

    #[test]
    fn host_regions_encode_as_before_and_device_regions_carry_their_location() {
        let d = desc();
        let json: serde_json::Value = serde_json::from_slice(&d.to_json()).unwrap();
        let regions = json["regions"].as_array().unwrap();
        // Host regions: no new keys, so older readers see the same descriptor.
        assert!(regions[0].get("location").is_none() && regions[0].get("cuda_ipc").is_none());
        assert_eq!(regions[2]["location"], "cuda:1");
        assert_eq!(regions[2]["cuda_ipc"]["offset"], 0x1000);
        // A descriptor written before device memory existed still decodes (as host memory).
        let old = br#"{"version":1,"name":"n","host_id":"h","engine_id":1,"generation":1,
            "endpoints":{"tcp":"127.0.0.1:1"},
            "regions":[{"id":1,"addr":4096,"len":4096,"token":5}]}"#;
        let d = SegmentDescriptor::from_json(old).unwrap();
        assert_eq!(d.regions[0].location, Location::Host);
        assert!(d.regions[0].cuda_ipc.is_none());
        // An unknown location is refused, not taken for host memory.
        let bad = String::from_utf8(old.to_vec())
            .unwrap()
            .replace(r#""token":5"#, r#""token":5,"location":"npu:0""#);
        assert!(SegmentDescriptor::from_json(bad.as_bytes()).is_err());
    }

    #[test]
    fn overlapping_regions_are_refused() {
        let mut d = desc();
        d.regions[1].addr = 0x1800;
        assert!(SegmentDescriptor::from_json(&d.to_json()).is_err());
    }

    #[test]
    fn region_lookup_and_keys() {
        let d = desc();
        assert_eq!(d.find_region(0x1000, 0x1000).unwrap().id, 1);
        assert_eq!(d.find_region(0x1fff, 1).unwrap().token, 11);
        assert_eq!(d.find_region(0x4010, 0x10).unwrap().id, 2);
        for (addr, len) in [
            (0x0, 1),
            (0x2000, 1),
            (0x1fff, 2),
            (0x40ff, 2),
            (u64::MAX, 2),
        ] {
            assert!(
                matches!(
                    d.find_region(addr, len),
                    Err(TransferError::OutOfBounds { .. })
                ),
                "{addr:#x}+{len}"
            );
        }
        assert_eq!(d.regions[0].rkey("mlx5_0"), Some(0xabc));
        assert_eq!(d.regions[0].rkey("mlx5_1"), None);
        assert_eq!(d.tcp_addr().unwrap().port(), 7000);
    }

    #[test]
    fn host_id_is_stable_within_a_process() {
        assert_eq!(host_id(), host_id());
        assert!(!host_id().starts_with("unknown-"));
    }
}
