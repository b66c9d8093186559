//! The cluster's keys in etcd, and a follower's copy of them.
//!
//! Under the prefix `/moongate/<cluster>/`:
//! - `leader`: the leader's advertise URL, attached to its lease. Its create revision is
//!   the leader's **term** and the fence of every write.
//! - `seg/<name>/<mount id, 16 hex>`: a mounted segment ([`SegmentRecord`], JSON).
//! - `obj/<key>`: a readable object ([`ObjectRecord`], JSON).
//! - `masters/<advertise URL>`: every running master (its URL, on its own lease), which
//!   `etcd://` clients read to find them all.
//!
//! The keyspace *is* the state (a snapshot that every commit keeps current), not a log to
//! replay: a put_end is one `put`, a remove one `delete`, an unmount one `delete`. etcd's
//! own raft log and snapshots make it durable; its MVCC history is what followers watch.

use std::collections::BTreeMap;

use etcd_client::{Client, EventType, GetOptions, KeyValue};
use indexmap::IndexMap;

use crate::master::{ObjectRecord, Record, SegmentRecord, Snapshot};

/// Keys fetched per range request while loading (bounded answers).
const PAGE: i64 = 2000;

/// The keys of one cluster.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    prefix: String,
}

/// An etcd write a record turns into.
pub(crate) enum Write {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

impl Write {
    pub(crate) fn key(&self) -> &[u8] {
        match self {
            Self::Put(k, _) | Self::Delete(k) => k,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            Self::Put(k, v) => k.len() + v.len(),
            Self::Delete(k) => k.len(),
        }
    }
}

impl Layout {
    pub(crate) fn new(prefix: String) -> Self {
        Self { prefix }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn leader(&self) -> Vec<u8> {
        format!("{}leader", self.prefix).into_bytes()
    }

    pub(crate) fn masters(&self) -> Vec<u8> {
        format!("{}{}", self.prefix, openapi::master::etcd::MASTERS_DIR).into_bytes()
    }

    fn segment(&self, name: &str, mount: u64) -> Vec<u8> {
        format!("{}seg/{name}/{mount:016x}", self.prefix).into_bytes()
    }

    fn object(&self, key: &str) -> Vec<u8> {
        let mut k = format!("{}obj/", self.prefix).into_bytes();
        k.extend_from_slice(key.as_bytes());
        k
    }

    /// The write that makes `record` durable.
    pub(crate) fn write(&self, record: &Record) -> Write {
        // Records are plain structs of strings and integers: encoding cannot fail.
        match record {
            Record::Mount(s) => Write::Put(
                self.segment(&s.spec.name, s.mount),
                serde_json::to_vec(s).unwrap_or_default(),
            ),
            Record::Unmount { name, mount } => Write::Delete(self.segment(name, *mount)),
            Record::Put(o) => Write::Put(
                self.object(&o.key),
                serde_json::to_vec(o).unwrap_or_default(),
            ),
            Record::Remove { key } => Write::Delete(self.object(key)),
        }
    }
}

/// What one key of the prefix holds.
enum Entry {
    Leader,
    Segment(SegmentRecord),
    Object(ObjectRecord),
    Unknown,
}

/// A follower's copy of the cluster's state, kept current by a watch.
#[derive(Debug, Default)]
pub(crate) struct Replica {
    /// Segment records by etcd key, with their mod revision.
    segments: BTreeMap<Vec<u8>, (i64, SegmentRecord)>,
    /// Object records by etcd key, in the order they came (a removal moves the last one
    /// into its place): a takeover reads them in that order, which is the order their
    /// memory was allocated in. In hash order, each record's key and replicas are a cache
    /// and TLB miss apart: at 10 M objects, a restore three times as long.
    objects: IndexMap<Vec<u8>, ObjectRecord>,
    /// Every change up to this revision is applied.
    pub(crate) revision: i64,
    /// Records that did not decode (skipped, counted).
    pub(crate) undecodable: u64,
}

impl Replica {
    fn entry(layout: &Layout, kv: &KeyValue) -> Entry {
        let Some(rest) = kv.key().strip_prefix(layout.prefix.as_bytes()) else {
            return Entry::Unknown;
        };
        if rest == b"leader" {
            Entry::Leader
        } else if rest.starts_with(b"seg/") {
            serde_json::from_slice(kv.value()).map_or(Entry::Unknown, Entry::Segment)
        } else if rest.starts_with(b"obj/") {
            serde_json::from_slice(kv.value()).map_or(Entry::Unknown, Entry::Object)
        } else {
            Entry::Unknown
        }
    }

    fn put(&mut self, layout: &Layout, kv: &KeyValue) {
        match Self::entry(layout, kv) {
            Entry::Segment(s) => {
                self.segments
                    .insert(kv.key().to_vec(), (kv.mod_revision(), s));
            }
            Entry::Object(o) => {
                self.objects.insert(kv.key().to_vec(), o);
            }
            Entry::Leader => {}
            Entry::Unknown => self.undecodable += 1,
        }
    }

    fn delete(&mut self, key: &[u8]) {
        self.segments.remove(key);
        self.objects.swap_remove(key);
    }

    /// Applies one watch response's events. Only the events move [`Replica::revision`],
    /// never the response header: etcd answers a watch's creation with the store's current
    /// revision before it sends the history from the start revision (and a catch-up batch
    /// with it before the rest of a long history), so a copy that took the header would
    /// claim changes it has not applied, and a new leader would restore without them. The
    /// leader key is under the prefix, so a new leader's own campaign event is what brings
    /// its copy to its term.
    pub(crate) fn apply(&mut self, layout: &Layout, events: &[etcd_client::Event]) {
        for ev in events {
            let Some(kv) = ev.kv() else { continue };
            match ev.event_type() {
                EventType::Put => self.put(layout, kv),
                EventType::Delete => self.delete(kv.key()),
            }
            self.revision = self.revision.max(kv.mod_revision());
        }
    }

    /// Loads every key of the prefix at one revision, page by page.
    pub(crate) async fn load(
        client: &mut Client,
        layout: &Layout,
    ) -> Result<Self, etcd_client::Error> {
        let mut replica = Self::default();
        let end = prefix_end(layout.prefix.as_bytes());
        let mut from = layout.prefix.as_bytes().to_vec();
        let mut at = 0;
        loop {
            let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if at > 0 {
                opts = opts.with_revision(at);
            }
            let resp = client.get(from.clone(), Some(opts)).await?;
            if at == 0 {
                at = resp.header().map_or(0, |h| h.revision());
            }
            for kv in resp.kvs() {
                replica.put(layout, kv);
            }
            match resp.kvs().last() {
                Some(last) if resp.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
        replica.revision = at;
        Ok(replica)
    }

    /// The state as the master restores it (segments in commit order), moved out of the
    /// copy: at 10 M objects a clone of every record would add seconds to a takeover.
    pub(crate) fn into_snapshot(self) -> Snapshot {
        let mut segments: Vec<_> = self.segments.into_values().collect();
        segments.sort_by_key(|(rev, _)| *rev);
        Snapshot {
            segments: segments.into_iter().map(|(_, s)| s).collect(),
            objects: self.objects.into_values().collect(),
        }
    }
}

/// The first key after every key that starts with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::{ReplicaRecord, SegmentSpec};

    #[test]
    fn records_map_to_their_keys() {
        let l = Layout::new("/moongate/c1/".into());
        let seg = SegmentRecord {
            client: uuid::Uuid::nil(),
            mount: 0xab,
            spec: SegmentSpec {
                name: "node-a".into(),
                base: 4096,
                size: 1 << 20,
                endpoint: "127.0.0.1:1".into(),
                disk_bytes: 0,
                disk_write_through: false,
            },
        };
        let Write::Put(k, v) = l.write(&Record::Mount(seg.clone())) else {
            panic!("a mount is a put")
        };
        assert_eq!(k, b"/moongate/c1/seg/node-a/00000000000000ab");
        assert_eq!(serde_json::from_slice::<SegmentRecord>(&v).unwrap(), seg);
        let obj = ObjectRecord {
            key: "k/1 x".into(),
            length: 10,
            client: uuid::Uuid::nil(),
            soft_pin: false,
            hard_pin: true,
            replicas: vec![ReplicaRecord {
                segment: "node-a".into(),
                mount: 0xab,
                offset: 3,
            }],
        };
        let w = l.write(&Record::Put(obj));
        assert_eq!(w.key(), b"/moongate/c1/obj/k/1 x");
        let d = l.write(&Record::Remove {
            key: "k/1 x".into(),
        });
        assert!(matches!(d, Write::Delete(ref k) if k == b"/moongate/c1/obj/k/1 x"));
        let u = l.write(&Record::Unmount {
            name: "node-a".into(),
            mount: 0xab,
        });
        assert_eq!(u.key(), b"/moongate/c1/seg/node-a/00000000000000ab");
        assert_eq!(l.leader(), b"/moongate/c1/leader");
    }

    #[test]
    fn prefix_ends_are_the_next_key() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
