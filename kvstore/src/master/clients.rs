//! Clients and their segments: mount / remount / unmount, ping, and the client TTL.
//!
//! A client is alive while it pings (or mounts) within `client_ttl_ms`. When it falls
//! silent its segments are unmounted, the replicas on them dropped (objects left without
//! replicas vanish), and its next ping answers `need_remount`. Only a remount (the full
//! list of its segments) makes it `ok` again; a brand-new client that mounts is `ok` at
//! once (it has nothing to remount).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use super::object::Replicas;
use super::segment::{Segment, SegmentSpec, SegmentTable, SegmentView, specs_collide};
use super::{ClientId, Master, MasterError, MasterResult};

/// What the master thinks of a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientStatus {
    /// Alive; nothing to do.
    Ok,
    /// Unknown or expired: the client must remount its segments.
    NeedRemount,
}

/// Answer to a ping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PingReply {
    /// The master's view version; a change means the master restarted.
    pub view_version: u64,
    /// Whether the client must remount.
    pub status: ClientStatus,
}

/// A snapshot of one client for admin reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientView {
    /// Client id.
    pub client_id: ClientId,
    /// Its status.
    pub status: ClientStatus,
    /// Milliseconds since its last ping or mount.
    pub last_seen_ms_ago: u64,
    /// Names of its mounted segments.
    pub segments: Vec<String>,
}

#[derive(Debug)]
struct ClientEntry {
    last_seen: u64,
    status: ClientStatus,
    segments: Vec<Arc<str>>,
}

/// Known clients.
#[derive(Debug, Default)]
pub(crate) struct ClientTable {
    map: HashMap<ClientId, ClientEntry>,
}

impl ClientTable {
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn alive(&self) -> usize {
        self.map
            .values()
            .filter(|e| e.status == ClientStatus::Ok)
            .count()
    }
}

impl ClientEntry {
    fn view(&self, id: ClientId, now: u64) -> ClientView {
        ClientView {
            client_id: id,
            status: self.status,
            last_seen_ms_ago: now.saturating_sub(self.last_seen),
            segments: self.segments.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn add_segment(&mut self, name: &Arc<str>) {
        if !self.segments.iter().any(|s| s == name) {
            self.segments.push(name.clone());
        }
    }
}

impl Master {
    fn check_spec(&self, spec: &SegmentSpec) -> MasterResult<()> {
        let bad = |m: String| Err(MasterError::InvalidParams(m));
        let max = self.config.max_name_bytes;
        if spec.name.is_empty() || spec.name.len() > max {
            return bad(format!("segment name must be 1..={max} bytes"));
        }
        if spec.name.contains('/') || spec.name.chars().any(char::is_control) {
            return bad(format!(
                "segment name {:?} contains '/' or a control character",
                spec.name
            ));
        }
        if spec.endpoint.is_empty() || spec.endpoint.len() > max {
            return bad(format!("segment endpoint must be 1..={max} bytes"));
        }
        if spec.size < self.config.alignment || spec.size > self.config.max_segment_bytes {
            return bad(format!(
                "segment size {} is outside {}..={}",
                spec.size, self.config.alignment, self.config.max_segment_bytes
            ));
        }
        if spec.base.checked_add(spec.size).is_none() {
            return bad("segment base + size overflows the address space".into());
        }
        Ok(())
    }

    /// Checks `spec` can be mounted for `client` next to what is mounted; `Some` when the
    /// very same segment is already there (idempotent mount).
    fn check_mount(
        table: &SegmentTable,
        client: ClientId,
        spec: &SegmentSpec,
    ) -> MasterResult<Option<Arc<Segment>>> {
        if let Some(seg) = table.get(&spec.name) {
            if seg.same_geometry(spec, client) {
                return Ok(Some(seg.clone()));
            }
            return Err(MasterError::SegmentAlreadyExists(format!(
                "{} is mounted by client {} at {:#x}+{}",
                spec.name,
                seg.client(),
                seg.base(),
                seg.size()
            )));
        }
        if let Some(other) = table.list.iter().find(|s| s.overlaps(spec)) {
            return Err(MasterError::InvalidParams(format!(
                "{} overlaps segment {} on endpoint {}",
                spec.name,
                other.name(),
                other.endpoint()
            )));
        }
        Ok(None)
    }

    /// Mounts one segment for `client` (idempotent for the same client and geometry).
    pub fn mount_segment(&self, client: ClientId, spec: SegmentSpec) -> MasterResult<SegmentView> {
        self.check_spec(&spec)?;
        let now = self.clock.now_ms();
        let mut clients = self.clients.lock();
        let seg = {
            let mut table = self.segments.write();
            match Self::check_mount(&table, client, &spec)? {
                Some(seg) => seg,
                None => {
                    let seg = Arc::new(Segment::new(&spec, client, self.align_shift));
                    table.insert(seg.clone());
                    seg
                }
            }
        };
        let entry = clients.map.entry(client).or_insert_with(|| ClientEntry {
            last_seen: now,
            status: ClientStatus::Ok,
            segments: Vec::new(),
        });
        entry.last_seen = now;
        entry.add_segment(seg.name_arc());
        Ok(seg.view())
    }

    /// Remounts a client's segments (all it has) after it was told `need_remount`; the
    /// client is `ok` afterwards. All-or-nothing: a conflict mounts none of them.
    pub fn remount_segments(
        &self,
        client: ClientId,
        specs: Vec<SegmentSpec>,
    ) -> MasterResult<ClientView> {
        self.check_batch(specs.len())?;
        for (i, spec) in specs.iter().enumerate() {
            self.check_spec(spec)?;
            for other in &specs[..i] {
                if other.name == spec.name || specs_collide(other, spec) {
                    return Err(MasterError::InvalidParams(format!(
                        "segments {} and {} collide",
                        other.name, spec.name
                    )));
                }
            }
        }
        let now = self.clock.now_ms();
        let mut clients = self.clients.lock();
        let mut table = self.segments.write();
        for spec in &specs {
            Self::check_mount(&table, client, spec)?;
        }
        let entry = clients.map.entry(client).or_insert_with(|| ClientEntry {
            last_seen: now,
            status: ClientStatus::Ok,
            segments: Vec::new(),
        });
        for spec in &specs {
            let seg = match Self::check_mount(&table, client, spec)? {
                Some(seg) => seg,
                None => {
                    let seg = Arc::new(Segment::new(spec, client, self.align_shift));
                    table.insert(seg.clone());
                    seg
                }
            };
            entry.add_segment(seg.name_arc());
        }
        entry.status = ClientStatus::Ok;
        entry.last_seen = now;
        Ok(entry.view(client, now))
    }

    /// Unmounts one of `client`'s segments; replicas on it are dropped.
    pub fn unmount_segment(&self, client: ClientId, name: &str) -> MasterResult<()> {
        {
            let mut clients = self.clients.lock();
            let mut table = self.segments.write();
            let seg = table
                .get(name)
                .ok_or_else(|| MasterError::SegmentNotFound(name.to_string()))?;
            if seg.client() != client {
                return Err(MasterError::IllegalClient(format!(
                    "segment {name} belongs to client {}",
                    seg.client()
                )));
            }
            table.remove(name);
            if let Some(e) = clients.map.get_mut(&client) {
                e.segments.retain(|s| &**s != name);
            }
        }
        self.sweep_unmounted();
        Ok(())
    }

    /// Forgets a client: unmounts all its segments (a graceful shutdown of a store node).
    pub fn remove_client(&self, client: ClientId) -> MasterResult<()> {
        {
            let mut clients = self.clients.lock();
            let entry = clients
                .map
                .remove(&client)
                .ok_or_else(|| MasterError::ClientNotFound(client.to_string()))?;
            let mut table = self.segments.write();
            for name in &entry.segments {
                if table.get(name).is_some_and(|s| s.client() == client) {
                    table.remove(name);
                }
            }
        }
        self.sweep_unmounted();
        Ok(())
    }

    /// Heartbeat: keeps the client alive and tells it whether to remount.
    pub fn ping(&self, client: ClientId) -> PingReply {
        let now = self.clock.now_ms();
        let mut clients = self.clients.lock();
        let status = match clients.map.entry(client) {
            Entry::Occupied(mut e) => {
                e.get_mut().last_seen = now;
                e.get().status
            }
            Entry::Vacant(v) => {
                v.insert(ClientEntry {
                    last_seen: now,
                    status: ClientStatus::NeedRemount,
                    segments: Vec::new(),
                });
                ClientStatus::NeedRemount
            }
        };
        PingReply {
            view_version: self.view_version,
            status,
        }
    }

    /// Expires clients silent for longer than the TTL: their segments are unmounted and
    /// they must remount. Clients with nothing mounted are forgotten. Returns how many
    /// clients lost segments.
    pub(crate) fn expire_clients(&self, now: u64) -> usize {
        let ttl = self.config.client_ttl_ms;
        let mut expired = 0;
        {
            let mut clients = self.clients.lock();
            if !clients
                .map
                .values()
                .any(|e| now > e.last_seen.saturating_add(ttl))
            {
                return 0;
            }
            let mut table = self.segments.write();
            clients.map.retain(|&id, e| {
                if now <= e.last_seen.saturating_add(ttl) {
                    return true;
                }
                if e.status == ClientStatus::NeedRemount && e.segments.is_empty() {
                    return false;
                }
                e.status = ClientStatus::NeedRemount;
                for name in e.segments.drain(..) {
                    if table.get(&name).is_some_and(|s| s.client() == id) {
                        table.remove(&name);
                    }
                }
                expired += 1;
                true
            });
        }
        if expired > 0 {
            self.sweep_unmounted();
        }
        expired
    }

    /// Drops replicas on unmounted segments; objects left without replicas vanish.
    fn sweep_unmounted(&self) {
        for s in 0..self.shards.len() {
            let mut shard = self.lock_shard(s);
            let stale: Vec<u32> = shard
                .indices()
                .filter(|&i| {
                    shard
                        .get(i)
                        .replicas
                        .as_slice()
                        .iter()
                        .any(|r| !r.segment.is_mounted())
                })
                .collect();
            for i in stale {
                let o = shard.get_mut(i);
                let replicas = std::mem::replace(&mut o.replicas, Replicas::Many(Box::new([])));
                let kept: Vec<_> = replicas
                    .into_vec()
                    .into_iter()
                    .filter(|r| r.segment.is_mounted())
                    .collect();
                if kept.is_empty() {
                    let hash = self.hash_bytes(shard.get(i).key.as_bytes());
                    shard.remove(hash, i);
                } else {
                    shard.get_mut(i).replicas = Replicas::from_vec(kept);
                }
            }
        }
    }

    /// Every known client.
    pub fn clients(&self) -> Vec<ClientView> {
        let now = self.clock.now_ms();
        let clients = self.clients.lock();
        let mut out: Vec<_> = clients.map.iter().map(|(id, e)| e.view(*id, now)).collect();
        out.sort_by_key(|c| c.client_id);
        out
    }

    /// One client.
    pub fn client(&self, id: ClientId) -> MasterResult<ClientView> {
        let now = self.clock.now_ms();
        let clients = self.clients.lock();
        clients
            .map
            .get(&id)
            .map(|e| e.view(id, now))
            .ok_or_else(|| MasterError::ClientNotFound(id.to_string()))
    }
}
