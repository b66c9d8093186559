//! Opened peer segments: a handle on a peer's descriptor that the engine refreshes when it
//! goes stale (a request was refused as out of bounds or with a bad token, or the peer
//! became unreachable), and what transports keep for that peer (mapped regions, opened
//! handles: [`PeerCache`]), which this module knows only through that trait.

use std::any::Any;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use parking_lot::RwLock;

use crate::segment::{RegionDescriptor, SegmentDescriptor};

/// Builds the live descriptor of the engine's own segment.
pub(crate) type DescribeFn = Arc<dyn Fn() -> SegmentDescriptor + Send + Sync>;

/// What a transport keeps for one peer segment (regions it mapped, handles it opened), made
/// on first use by [`Segment::cache`]. It follows the peer's descriptor: a restarted or
/// re-registered peer drops everything, and regions the peer retired are dropped when its
/// descriptor is refetched.
pub(crate) trait PeerCache: Any + Send + Sync {
    /// Drops everything (the peer re-registered or restarted).
    fn clear(&self);
    /// Drops what belongs to regions whose id is not in `live` (the peer retired them).
    fn retain(&self, live: &HashSet<u64>);
}

pub(crate) struct SegmentState {
    name: String,
    desc: ArcSwap<SegmentDescriptor>,
    stale: AtomicBool,
    /// The engine's own segment: requests are served by local copies.
    local: Option<DescribeFn>,
    /// Same host as this engine: shared regions can be mapped.
    same_host: bool,
    /// What transports keep for this peer, at most one of each type ([`Segment::cache`]).
    caches: RwLock<Vec<Arc<dyn PeerCache>>>,
    pub(crate) refresh: tokio::sync::Mutex<()>,
}

/// A peer's segment, as returned by `TransferEngine::open_segment`; requests name it as
/// their remote side. Cheap to clone.
#[derive(Clone)]
pub struct Segment {
    inner: Arc<SegmentState>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("name", &self.name())
            .field("local", &self.is_local())
            .finish()
    }
}

impl Segment {
    pub(crate) fn remote(name: &str, desc: SegmentDescriptor, local_host: &str) -> Self {
        let same_host = desc.host_id == local_host;
        Self {
            inner: Arc::new(SegmentState {
                name: name.to_owned(),
                desc: ArcSwap::from_pointee(desc),
                stale: AtomicBool::new(false),
                local: None,
                same_host,
                caches: RwLock::new(Vec::new()),
                refresh: tokio::sync::Mutex::new(()),
            }),
        }
    }

    pub(crate) fn local(describe: DescribeFn) -> Self {
        let desc = describe();
        Self {
            inner: Arc::new(SegmentState {
                name: desc.name.clone(),
                desc: ArcSwap::from_pointee(desc),
                stale: AtomicBool::new(false),
                local: Some(describe),
                same_host: true,
                caches: RwLock::new(Vec::new()),
                refresh: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The segment name it was opened with.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The peer's descriptor as last fetched (live for the engine's own segment).
    pub fn descriptor(&self) -> Arc<SegmentDescriptor> {
        match &self.inner.local {
            Some(describe) => Arc::new(describe()),
            None => self.inner.desc.load_full(),
        }
    }

    /// The peer's registered regions (address, length, token...).
    pub fn regions(&self) -> Vec<RegionDescriptor> {
        self.descriptor().regions.clone()
    }

    /// Whether this is the engine's own segment.
    pub fn is_local(&self) -> bool {
        self.inner.local.is_some()
    }

    /// Whether the peer runs on this host (shared memory may be used with it).
    pub fn is_same_host(&self) -> bool {
        self.inner.same_host
    }

    pub(crate) fn state(&self) -> &SegmentState {
        &self.inner
    }

    /// Flags the descriptor as possibly outdated: the next use refetches it.
    pub(crate) fn mark_stale(&self) {
        if self.inner.local.is_none() {
            self.inner.stale.store(true, Ordering::Release);
        }
    }

    pub(crate) fn is_stale(&self) -> bool {
        self.inner.stale.load(Ordering::Acquire)
    }

    /// What a transport keeps for this peer, of type `T` (made on first use).
    pub(crate) fn cache<T: PeerCache + Default>(&self) -> Arc<T> {
        if let Some(c) = find(&self.inner.caches.read()) {
            return c;
        }
        let mut caches = self.inner.caches.write();
        if let Some(c) = find(&caches) {
            return c;
        }
        let c = Arc::new(T::default());
        caches.push(c.clone());
        c
    }

    /// Installs a freshly fetched descriptor; a restarted or re-registered peer drops what
    /// transports keep for it (shared-memory mappings, IPC handles), and regions it retired
    /// are dropped from it.
    pub(crate) fn update(&self, desc: SegmentDescriptor) {
        let old = self.inner.desc.load();
        if old.engine_id != desc.engine_id {
            for c in self.inner.caches.read().iter() {
                c.clear();
            }
        } else {
            let live: HashSet<u64> = desc.regions.iter().map(|r| r.id).collect();
            for c in self.inner.caches.read().iter() {
                c.retain(&live);
            }
        }
        self.inner.desc.store(Arc::new(desc));
        self.inner.stale.store(false, Ordering::Release);
    }

    pub(crate) fn same(&self, other: &Segment) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// The cache of type `T` among `caches`.
fn find<T: PeerCache>(caches: &[Arc<dyn PeerCache>]) -> Option<Arc<T>> {
    let c = caches.iter().find(|c| (&***c as &dyn Any).is::<T>())?;
    let c: Arc<dyn Any + Send + Sync> = c.clone();
    c.downcast::<T>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Counted(std::sync::atomic::AtomicUsize);

    impl PeerCache for Counted {
        fn clear(&self) {
            self.0.fetch_add(100, Ordering::Relaxed);
        }
        fn retain(&self, _: &HashSet<u64>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[derive(Default)]
    struct Other;

    impl PeerCache for Other {
        fn clear(&self) {}
        fn retain(&self, _: &HashSet<u64>) {}
    }

    fn desc(engine_id: u64) -> SegmentDescriptor {
        SegmentDescriptor {
            version: crate::segment::DESCRIPTOR_VERSION,
            name: "p:1".into(),
            host_id: "h".into(),
            engine_id,
            generation: 1,
            endpoints: Default::default(),
            regions: vec![],
        }
    }

    #[test]
    fn a_segment_keeps_one_cache_of_each_type_and_updates_them_with_the_descriptor() {
        let seg = Segment::remote("p:1", desc(1), "h");
        let a = seg.cache::<Counted>();
        assert!(Arc::ptr_eq(&a, &seg.cache::<Counted>()), "made once");
        let _other = seg.cache::<Other>();
        assert!(Arc::ptr_eq(&a, &seg.cache::<Counted>()));
        assert_eq!(seg.inner.caches.read().len(), 2);
        seg.update(desc(1));
        assert_eq!(a.0.load(Ordering::Relaxed), 1, "same engine: trimmed");
        seg.update(desc(2));
        assert_eq!(a.0.load(Ordering::Relaxed), 101, "restarted: cleared");
    }
}
