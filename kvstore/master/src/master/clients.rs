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

use uuid::Uuid;

use super::journal::{Change, Record, SegmentRecord};
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
pub(crate) struct ClientEntry {
    pub(crate) last_seen: u64,
    pub(crate) status: ClientStatus,
    pub(crate) segments: Vec<Arc<str>>,
}

/// Known clients.
#[derive(Debug, Default)]
pub(crate) struct ClientTable {
    pub(crate) map: HashMap<ClientId, ClientEntry>,
    /// Journaled masters: mounts appended and not yet committed, by segment name.
    pending: HashMap<String, PendingMount>,
}

/// A mount waiting for its commit: its name and range are taken.
#[derive(Debug)]
struct PendingMount {
    client: ClientId,
    spec: SegmentSpec,
    mount: u64,
}

/// What a mount finds for its segment name.
enum Found {
    /// Nothing: it may mount.
    Free,
    /// The same segment of the same client is mounted already.
    Mounted(Arc<Segment>),
    /// The same segment of the same client is being made durable.
    Pending,
}

/// A fresh mount id (never 0).
fn new_mount_id() -> u64 {
    Uuid::new_v4().as_u64_pair().0 | 1
}

/// The view of a segment mounted (or being mounted) with nothing allocated yet.
fn fresh_view(spec: &SegmentSpec, client: ClientId, align_shift: u32) -> SegmentView {
    SegmentView {
        name: spec.name.clone(),
        client_id: client,
        base: spec.base,
        size: spec.size,
        endpoint: spec.endpoint.clone(),
        capacity_bytes: (spec.size >> align_shift) << align_shift,
        allocated_bytes: 0,
        allocations: 0,
        disk_bytes: spec.disk_bytes,
        disk_write_through: spec.disk_bytes > 0 && spec.disk_write_through,
    }
}

impl ClientTable {
    /// The entry of `client`, seen at `now` (a new one is alive, with nothing mounted).
    pub(crate) fn seen(&mut self, client: ClientId, now: u64) -> &mut ClientEntry {
        let entry = self.map.entry(client).or_insert_with(|| ClientEntry {
            last_seen: now,
            status: ClientStatus::Ok,
            segments: Vec::new(),
        });
        entry.last_seen = now;
        entry
    }

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

    pub(crate) fn add_segment(&mut self, name: &Arc<str>) {
        if !self.segments.iter().any(|s| s == name) {
            self.segments.push(name.clone());
        }
    }
}

/// How a journaled mount came about.
#[derive(Clone, Copy, Debug)]
enum MountKind {
    /// A first mount: new memory, no one writes into it yet.
    First,
    /// One segment of a remount; the last of the request ends the client's remount.
    Remount { last: bool },
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

    /// Checks `spec` can be mounted for `client` next to what is mounted and what is being
    /// mounted (journaled masters).
    fn check_mount(
        table: &SegmentTable,
        clients: &ClientTable,
        client: ClientId,
        spec: &SegmentSpec,
    ) -> MasterResult<Found> {
        if let Some(seg) = table.get(&spec.name) {
            if seg.same_geometry(spec, client) {
                return Ok(Found::Mounted(seg.clone()));
            }
            return Err(MasterError::SegmentAlreadyExists(format!(
                "{} is mounted by client {} at {:#x}+{}",
                spec.name,
                seg.client(),
                seg.base(),
                seg.size()
            )));
        }
        if let Some(p) = clients.pending.get(&spec.name) {
            if p.client == client && p.spec == *spec {
                return Ok(Found::Pending);
            }
            return Err(MasterError::SegmentAlreadyExists(format!(
                "{} is being mounted by client {}",
                spec.name, p.client
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
        if let Some(other) = clients
            .pending
            .values()
            .find(|p| specs_collide(&p.spec, spec))
        {
            return Err(MasterError::InvalidParams(format!(
                "{} overlaps segment {} on endpoint {}",
                spec.name, other.spec.name, other.spec.endpoint
            )));
        }
        Ok(Found::Free)
    }

    /// Reserves `spec` for `client` and appends its mount; the apply step mounts it (and,
    /// for the last segment of a remount, marks the client `ok`).
    fn journal_mount(
        &self,
        clients: &mut ClientTable,
        client: ClientId,
        spec: &SegmentSpec,
        kind: MountKind,
    ) -> Change {
        let mount = new_mount_id();
        clients.pending.insert(
            spec.name.clone(),
            PendingMount {
                client,
                spec: spec.clone(),
                mount,
            },
        );
        let record = Record::Mount(SegmentRecord {
            client,
            mount,
            spec: spec.clone(),
        });
        let name = spec.name.clone();
        Change::then(record, move |m: &Master| {
            m.finish_mount(client, &name, mount, kind)
        })
    }

    /// A journaled mount's apply step: the committed segment is mounted (a remounted one
    /// held for the write window, as on a plain master).
    fn finish_mount(&self, client: ClientId, name: &str, mount: u64, kind: MountKind) {
        let now = self.clock.now_ms();
        let mut clients = self.clients.lock();
        let Some(p) = clients.pending.remove(name) else {
            return;
        };
        if p.mount != mount {
            clients.pending.insert(name.to_owned(), p);
            return;
        }
        let mut seg = Segment::new(&p.spec, client, self.align_shift, mount);
        if let MountKind::Remount { .. } = kind {
            seg = seg.held_until(now.saturating_add(self.use_within_ms()));
        }
        let seg = Arc::new(seg);
        self.segments.write().insert(seg.clone());
        let entry = clients.seen(client, now);
        entry.add_segment(seg.name_arc());
        if let MountKind::Remount { last: true } = kind {
            entry.status = ClientStatus::Ok;
        }
    }

    /// Mounts one segment for `client` (idempotent for the same client and geometry). A
    /// journaled master mounts it once the mount is committed ([`Master::durable`]).
    pub fn mount_segment(&self, client: ClientId, spec: SegmentSpec) -> MasterResult<SegmentView> {
        self.check_spec(&spec)?;
        let now = self.clock.now_ms();
        let mut clients = self.clients.lock();
        let found = Self::check_mount(&self.segments.read(), &clients, client, &spec)?;
        let seg = match (found, &self.journal) {
            (Found::Mounted(seg), _) => seg,
            (Found::Pending, _) => return Ok(fresh_view(&spec, client, self.align_shift)),
            (Found::Free, Some(journal)) => {
                let change = self.journal_mount(&mut clients, client, &spec, MountKind::First);
                journal.append(vec![change]);
                return Ok(fresh_view(&spec, client, self.align_shift));
            }
            (Found::Free, None) => {
                let seg = Arc::new(Segment::new(
                    &spec,
                    client,
                    self.align_shift,
                    new_mount_id(),
                ));
                self.segments.write().insert(seg.clone());
                seg
            }
        };
        let entry = clients.seen(client, now);
        entry.add_segment(seg.name_arc());
        Ok(seg.view())
    }

    /// Remounts a client's segments (all it has) after it was told `need_remount`; the
    /// client is `ok` afterwards (on a journaled master: once the new mounts are
    /// committed). All-or-nothing: a conflict mounts none of them.
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
        let mut found = Vec::with_capacity(specs.len());
        for spec in &specs {
            found.push(Self::check_mount(&table, &clients, client, spec)?);
        }
        let entry = clients.seen(client, now);
        let mut fresh = Vec::new();
        for (spec, found) in specs.iter().zip(found) {
            match found {
                Found::Mounted(seg) => entry.add_segment(seg.name_arc()),
                Found::Pending => {}
                // Held from its commit on (see `finish_mount`).
                Found::Free if self.journal.is_some() => fresh.push(spec),
                Found::Free => {
                    // Mounted before (at this master, or at one before a restart): other
                    // clients may hold reservations or started puts in it, made before, and
                    // write into them for up to the write window. It takes no new values
                    // until that is over.
                    let seg = Segment::new(spec, client, self.align_shift, new_mount_id())
                        .held_until(now.saturating_add(self.use_within_ms()));
                    let seg = Arc::new(seg);
                    table.insert(seg.clone());
                    entry.add_segment(seg.name_arc());
                }
            }
        }
        match &self.journal {
            Some(journal) if !fresh.is_empty() => {
                let view = entry.view(client, now);
                let last = fresh.len() - 1;
                let changes = fresh
                    .into_iter()
                    .enumerate()
                    .map(|(i, spec)| {
                        let kind = MountKind::Remount { last: i == last };
                        self.journal_mount(&mut clients, client, spec, kind)
                    })
                    .collect();
                journal.append(changes);
                Ok(view)
            }
            _ => {
                entry.status = ClientStatus::Ok;
                Ok(entry.view(client, now))
            }
        }
    }

    /// Appends the end of `seg`'s mount (journaled masters).
    fn journal_unmount(&self, seg: &Segment) {
        self.journal_append(vec![Change::record(Record::Unmount {
            name: seg.name().to_owned(),
            mount: seg.mount_id(),
        })]);
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
            if let Some(seg) = table.remove(name) {
                self.journal_unmount(&seg);
            }
            if let Some(e) = clients.map.get_mut(&client) {
                e.segments.retain(|s| &**s != name);
            }
        }
        self.sweep_unmounted();
        Ok(())
    }

    /// Forgets a client: unmounts all its segments (a graceful shutdown of a store node).
    pub fn remove_client(&self, client: ClientId) -> MasterResult<()> {
        // It has left: nothing of it writes into its reservations any more (a pure client
        // that never pinged holds some too).
        self.release_reservations_of(client);
        {
            let mut clients = self.clients.lock();
            let entry = clients
                .map
                .remove(&client)
                .ok_or_else(|| MasterError::ClientNotFound(client.to_string()))?;
            let mut table = self.segments.write();
            for name in &entry.segments {
                if table.get(name).is_some_and(|s| s.client() == client)
                    && let Some(seg) = table.remove(name)
                {
                    self.journal_unmount(&seg);
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
                    if table.get(&name).is_some_and(|s| s.client() == id)
                        && let Some(seg) = table.remove(&name)
                    {
                        self.journal_unmount(&seg);
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
                    let gone = shard.remove(hash, i);
                    if gone.is_durable() {
                        let key = gone.key.as_str().to_owned();
                        self.journal_append(vec![Change::record(Record::Remove { key })]);
                    }
                } else {
                    shard.get_mut(i).replicas = Replicas::from_vec(kept);
                }
            }
        }
        // A disk may hold what went with the segment.
        self.records_lost();
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
