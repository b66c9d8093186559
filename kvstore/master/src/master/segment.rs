//! Segments: contiguous memory regions that clients register with `transfer` and mount at
//! the master, each with its own offset allocator; and the table of mounted segments that
//! replica placement reads.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use uuid::Uuid;

use transfer::memory::{Allocation, OffsetAllocator};

pub use openapi::master::SegmentSpec;

/// Whether two specs would cover some of the same bytes of the same endpoint.
pub(crate) fn specs_collide(a: &SegmentSpec, b: &SegmentSpec) -> bool {
    ranges_collide(&a.endpoint, a.base, a.size, b)
}

fn ranges_collide(endpoint: &str, base: u64, size: u64, spec: &SegmentSpec) -> bool {
    endpoint == spec.endpoint
        && base < spec.base.saturating_add(spec.size)
        && spec.base < base.saturating_add(size)
}

/// A mounted segment. Replicas hold it by `Arc`; once unmounted it stays readable for
/// bookkeeping but hands out nothing and its replicas are no longer served.
#[derive(Debug)]
pub struct Segment {
    name: Arc<str>,
    endpoint: Arc<str>,
    base: u64,
    size: u64,
    client: Uuid,
    mount: u64,
    align_shift: u32,
    alloc: Mutex<OffsetAllocator>,
    allocated: AtomicU64,
    mounted: AtomicBool,
    /// Master clock (ms) before which the segment takes no new values: set on a remount,
    /// while a client may still write into space reserved under the mount before (0: none).
    held_until_ms: u64,
    /// Bytes of disk its owner keeps below it (0: no disk tier, or detached; see `tier`).
    disk_bytes: AtomicU64,
    /// Whether its owner writes values to disk as soon as they are complete.
    write_through: AtomicBool,
}

/// A snapshot of one segment for admin reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentView {
    /// Segment name.
    pub name: String,
    /// Owning client.
    pub client_id: Uuid,
    /// Base address.
    pub base: u64,
    /// Size in bytes as mounted.
    pub size: u64,
    /// Transfer endpoint.
    pub endpoint: String,
    /// Bytes the allocator can hand out (size rounded down to the alignment).
    pub capacity_bytes: u64,
    /// Bytes allocated to replicas (aligned sizes), including unfinished puts.
    pub allocated_bytes: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Bytes of disk its owner keeps below it (0: no disk tier).
    pub disk_bytes: u64,
    /// Whether its owner writes values to disk as soon as they are complete.
    pub disk_write_through: bool,
}

impl From<SegmentView> for openapi::master::Segment {
    fn from(v: SegmentView) -> Self {
        Self {
            name: v.name,
            client_id: v.client_id.to_string(),
            base: v.base,
            size: v.size,
            endpoint: v.endpoint,
            capacity_bytes: v.capacity_bytes,
            allocated_bytes: v.allocated_bytes,
            allocations: v.allocations,
            disk_bytes: v.disk_bytes,
            disk_write_through: v.disk_write_through,
        }
    }
}

impl Segment {
    pub(crate) fn new(spec: &SegmentSpec, client: Uuid, align_shift: u32, mount: u64) -> Self {
        Self::with_allocator(
            spec,
            client,
            align_shift,
            mount,
            OffsetAllocator::new(spec.size >> align_shift),
        )
    }

    /// A segment rebuilt from durable records: `used` (offset, units) ranges are allocated
    /// already; answers each range's allocation (`None`: unusable, see
    /// [`OffsetAllocator::with_used`]).
    pub(crate) fn restored(
        spec: &SegmentSpec,
        client: Uuid,
        align_shift: u32,
        mount: u64,
        used: &[(u64, u64)],
    ) -> (Self, Vec<Option<Allocation>>) {
        let (alloc, got) = OffsetAllocator::with_used(spec.size >> align_shift, used);
        let seg = Self::with_allocator(spec, client, align_shift, mount, alloc);
        (seg, got)
    }

    fn with_allocator(
        spec: &SegmentSpec,
        client: Uuid,
        align_shift: u32,
        mount: u64,
        alloc: OffsetAllocator,
    ) -> Self {
        let allocated = alloc.used_units() << align_shift;
        Self {
            name: spec.name.as_str().into(),
            endpoint: spec.endpoint.as_str().into(),
            base: spec.base,
            size: spec.size,
            client,
            mount,
            align_shift,
            alloc: Mutex::new(alloc),
            allocated: AtomicU64::new(allocated),
            mounted: AtomicBool::new(true),
            held_until_ms: 0,
            disk_bytes: AtomicU64::new(spec.disk_bytes),
            write_through: AtomicBool::new(spec.disk_bytes > 0 && spec.disk_write_through),
        }
    }

    /// The segment, taking no new values before `ms` on the master's clock.
    pub(crate) fn held_until(mut self, ms: u64) -> Self {
        self.held_until_ms = ms;
        self
    }

    /// Whether the segment takes new values at `now_ms` (see [`Segment::held_until`]).
    pub(crate) fn takes_values(&self, now_ms: u64) -> bool {
        now_ms >= self.held_until_ms
    }

    /// Mount id: unique per mount (a remount of the name gets a new one).
    pub fn mount_id(&self) -> u64 {
        self.mount
    }

    /// Segment name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Shared handle to the name (no copy).
    pub fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// Transfer endpoint of the owner.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Shared handle to the endpoint (no copy).
    pub fn endpoint_arc(&self) -> &Arc<str> {
        &self.endpoint
    }

    /// Base address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Mounted size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Owning client.
    pub fn client(&self) -> Uuid {
        self.client
    }

    /// Bytes of disk its owner keeps below it (0: no disk tier).
    pub fn disk_bytes(&self) -> u64 {
        self.disk_bytes.load(Ordering::Acquire)
    }

    /// Whether its owner writes values to disk as soon as they are complete.
    pub fn write_through(&self) -> bool {
        self.write_through.load(Ordering::Acquire)
    }

    /// Its owner stopped its disk tier: no value goes to that disk any more.
    pub(crate) fn detach_disk(&self) {
        self.write_through.store(false, Ordering::Release);
        self.disk_bytes.store(0, Ordering::Release);
    }

    /// Its spec as mounted now (the disk as it is after a detach).
    pub(crate) fn spec(&self) -> SegmentSpec {
        SegmentSpec {
            name: self.name.to_string(),
            endpoint: self.endpoint.to_string(),
            base: self.base,
            size: self.size,
            disk_bytes: self.disk_bytes(),
            disk_write_through: self.write_through(),
        }
    }

    /// Whether the segment is mounted (serves replicas).
    pub fn is_mounted(&self) -> bool {
        self.mounted.load(Ordering::Acquire)
    }

    /// Bytes allocated right now.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Bytes the allocator manages.
    pub fn capacity_bytes(&self) -> u64 {
        (self.size >> self.align_shift) << self.align_shift
    }

    pub(crate) fn same_geometry(&self, spec: &SegmentSpec, client: Uuid) -> bool {
        self.client == client
            && self.base == spec.base
            && self.size == spec.size
            && *self.endpoint == *spec.endpoint
    }

    pub(crate) fn overlaps(&self, spec: &SegmentSpec) -> bool {
        ranges_collide(&self.endpoint, self.base, self.size, spec)
    }

    pub(crate) fn set_unmounted(&self) {
        self.mounted.store(false, Ordering::Release);
    }

    /// Allocates `units` alignment units; returns the byte offset from the base and handle.
    pub(crate) fn try_alloc(&self, units: u64) -> Option<Allocation> {
        if !self.is_mounted() {
            return None;
        }
        let a = self.alloc.lock().allocate(units)?;
        self.allocated
            .fetch_add(units << self.align_shift, Ordering::Relaxed);
        Some(a)
    }

    /// Returns an allocation to the allocator (no-op once unmounted).
    pub(crate) fn release(&self, a: Allocation) {
        if let Some(units) = self.alloc.lock().free(a) {
            self.allocated
                .fetch_sub(units << self.align_shift, Ordering::Relaxed);
        }
    }

    /// Byte address of an allocation.
    pub(crate) fn address_of(&self, a: Allocation) -> u64 {
        self.base + (a.offset << self.align_shift)
    }

    pub(crate) fn view(&self) -> SegmentView {
        let allocations = self.alloc.lock().live_allocations();
        SegmentView {
            name: self.name.to_string(),
            client_id: self.client,
            base: self.base,
            size: self.size,
            endpoint: self.endpoint.to_string(),
            capacity_bytes: self.capacity_bytes(),
            allocated_bytes: self.allocated_bytes(),
            allocations,
            disk_bytes: self.disk_bytes(),
            disk_write_through: self.write_through(),
        }
    }
}

/// The mounted segments, in mount order, with a name index.
#[derive(Debug, Default)]
pub(crate) struct SegmentTable {
    pub(crate) list: Vec<Arc<Segment>>,
    by_name: HashMap<Arc<str>, usize>,
}

impl SegmentTable {
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<Segment>> {
        self.by_name.get(name).map(|&i| &self.list[i])
    }

    pub(crate) fn insert(&mut self, seg: Arc<Segment>) {
        self.by_name.insert(seg.name.clone(), self.list.len());
        self.list.push(seg);
    }

    pub(crate) fn remove(&mut self, name: &str) -> Option<Arc<Segment>> {
        let i = self.by_name.remove(name)?;
        let seg = self.list.swap_remove(i);
        if let Some(moved) = self.list.get(i) {
            self.by_name.insert(moved.name.clone(), i);
        }
        seg.set_unmounted();
        Some(seg)
    }

    /// `(capacity, allocated)` bytes over all mounted segments.
    pub(crate) fn usage(&self) -> (u64, u64) {
        self.list.iter().fold((0, 0), |(c, a), s| {
            (c + s.capacity_bytes(), a + s.allocated_bytes())
        })
    }
}
