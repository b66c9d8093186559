//! Offset allocator over one region: hands out aligned ranges of a contiguous address
//! space without touching its bytes. The KV master keeps one per mounted segment (the bytes
//! live on the client that mounted it); a store client carves its staging buffer with one.
//!
//! Sizes and offsets are counted in *units* (the segment's alignment). Free ranges sit in
//! 512 size-class bins (a tiny float: 3 mantissa bits, the rest exponent), found through a
//! two-level bitmap, so allocation and free are O(1): no tree walks, no list scans.
//! Allocation is exact (the remainder of a larger free range is split off and binned again)
//! and freeing coalesces with both neighbours, so usage accounting is exact and a fully
//! freed allocator is one free range again.
//!
//! Uniform KV pages get a fast path: a page-sized request first looks at the head of the
//! bin its own size rounds down to, which is where freed pages of that size land, so a
//! churn of equal pages reuses holes instead of splitting larger ranges.

const MANTISSA_BITS: u32 = 3;
const MANTISSA_VALUE: u64 = 1 << MANTISSA_BITS;
const MANTISSA_MASK: u64 = MANTISSA_VALUE - 1;
const TOP_BINS: usize = 64;
const LEAF_BINS: usize = 8;
const NUM_BINS: usize = TOP_BINS * LEAF_BINS;
const NONE: u32 = u32::MAX;
const USED: u64 = 1 << 63;

/// Largest size in units one allocator manages (sizes keep their top bit for a flag).
pub const MAX_UNITS: u64 = (1 << 62) - 1;

/// Bin whose every range is at least `size` units (search start for an allocation).
fn bin_round_up(size: u64) -> usize {
    if size < MANTISSA_VALUE {
        return size as usize;
    }
    let highest = 63 - size.leading_zeros();
    let start = highest - MANTISSA_BITS;
    let mut mantissa = (size >> start) & MANTISSA_MASK;
    if size & ((1u64 << start) - 1) != 0 {
        mantissa += 1;
    }
    ((u64::from(start + 1) << MANTISSA_BITS) + mantissa) as usize
}

/// Bin a free range of `size` units is filed under.
fn bin_round_down(size: u64) -> usize {
    if size < MANTISSA_VALUE {
        return size as usize;
    }
    let highest = 63 - size.leading_zeros();
    let start = highest - MANTISSA_BITS;
    let mantissa = (size >> start) & MANTISSA_MASK;
    ((u64::from(start + 1) << MANTISSA_BITS) + mantissa) as usize
}

/// One range of the address space, free or allocated, linked to its address neighbours and
/// (when free) to the other ranges of its bin.
#[derive(Clone, Copy, Debug)]
struct Node {
    offset: u64,
    /// Size in units; the top bit marks the range as allocated.
    size: u64,
    bin_prev: u32,
    bin_next: u32,
    prev: u32,
    next: u32,
}

impl Node {
    fn units(&self) -> u64 {
        self.size & !USED
    }
    fn is_used(&self) -> bool {
        self.size & USED != 0
    }
}

/// A live allocation: where it starts and the handle that frees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Start, in units from the segment base.
    pub offset: u64,
    /// Handle for [`OffsetAllocator::free`].
    pub node: u32,
}

/// O(1) offset allocator over `0..units`; see the module doc.
#[derive(Debug)]
pub struct OffsetAllocator {
    units: u64,
    free_units: u64,
    used_top: u64,
    used_leaf: [u8; TOP_BINS],
    heads: Box<[u32; NUM_BINS]>,
    nodes: Vec<Node>,
    spare: Vec<u32>,
    live: u64,
}

impl OffsetAllocator {
    /// An allocator managing `units` units, all free. `units` is capped at `MAX_UNITS`.
    pub fn new(units: u64) -> Self {
        let units = units.min(MAX_UNITS);
        let mut alloc = Self {
            units,
            free_units: 0,
            used_top: 0,
            used_leaf: [0; TOP_BINS],
            heads: Box::new([NONE; NUM_BINS]),
            nodes: Vec::new(),
            spare: Vec::new(),
            live: 0,
        };
        if units > 0 {
            let node = alloc.new_node(0, units, NONE, NONE);
            alloc.bin_insert(node);
            alloc.free_units = units;
        }
        alloc
    }

    /// Total units managed.
    pub fn capacity_units(&self) -> u64 {
        self.units
    }

    /// Units currently allocated.
    pub fn used_units(&self) -> u64 {
        self.units - self.free_units
    }

    /// Number of live allocations.
    pub fn live_allocations(&self) -> u64 {
        self.live
    }

    /// Allocates exactly `units` units, or `None` when no free range is large enough.
    pub fn allocate(&mut self, units: u64) -> Option<Allocation> {
        if units == 0 || units > self.free_units {
            return None;
        }
        let node = self.find_fit(units)?;
        self.bin_remove(node);
        let n = self.nodes[node as usize];
        let rest = n.units() - units;
        if rest > 0 {
            let tail = self.new_node(n.offset + units, rest, node, n.next);
            if n.next != NONE {
                self.nodes[n.next as usize].prev = tail;
            }
            self.nodes[node as usize].next = tail;
            self.bin_insert(tail);
        }
        self.nodes[node as usize].size = units | USED;
        self.free_units -= units;
        self.live += 1;
        Some(Allocation {
            offset: n.offset,
            node,
        })
    }

    /// Frees the allocation `alloc`; returns the units released, or `None` when the handle
    /// does not name a live allocation at that offset (nothing changes then).
    pub fn free(&mut self, alloc: Allocation) -> Option<u64> {
        let idx = alloc.node as usize;
        let n = *self.nodes.get(idx)?;
        if !n.is_used() || n.offset != alloc.offset {
            return None;
        }
        let units = n.units();
        self.free_units += units;
        self.live -= 1;
        let (mut offset, mut size, mut prev, mut next) = (n.offset, units, n.prev, n.next);
        if prev != NONE && !self.nodes[prev as usize].is_used() {
            let p = self.nodes[prev as usize];
            self.bin_remove(prev);
            offset = p.offset;
            size += p.units();
            self.spare.push(prev);
            prev = p.prev;
        }
        if next != NONE && !self.nodes[next as usize].is_used() {
            let x = self.nodes[next as usize];
            self.bin_remove(next);
            size += x.units();
            self.spare.push(next);
            next = x.next;
        }
        if prev != NONE {
            self.nodes[prev as usize].next = alloc.node;
        }
        if next != NONE {
            self.nodes[next as usize].prev = alloc.node;
        }
        let node = &mut self.nodes[idx];
        node.offset = offset;
        node.size = size;
        node.prev = prev;
        node.next = next;
        self.bin_insert(alloc.node);
        Some(units)
    }

    /// An allocator over `0..units` with the ranges `used` (`(offset, units)` each, any
    /// order) already allocated: how a master rebuilds a segment's allocator from durable
    /// object records. Answers one entry per range, in input order: its allocation, or
    /// `None` for a range that is empty, out of bounds or overlaps one kept before it
    /// (ranges are kept in address order, so of two overlapping ranges the lower stays).
    pub fn with_used(units: u64, used: &[(u64, u64)]) -> (Self, Vec<Option<Allocation>>) {
        let units = units.min(MAX_UNITS);
        let mut order: Vec<usize> = (0..used.len()).collect();
        order.sort_unstable_by_key(|&i| used[i].0);
        let mut alloc = Self::new(0);
        alloc.units = units;
        let mut out = vec![None; used.len()];
        let (mut cursor, mut last) = (0u64, NONE);
        let mut push = |a: &mut Self, offset: u64, size: u64, is_used: bool| {
            let node = a.new_node(offset, size | if is_used { USED } else { 0 }, last, NONE);
            if last != NONE {
                a.nodes[last as usize].next = node;
            }
            if !is_used {
                a.bin_insert(node);
                a.free_units += size;
            }
            last = node;
            node
        };
        for i in order {
            let (offset, size) = used[i];
            let end = match offset.checked_add(size) {
                Some(end) if size > 0 && offset >= cursor && end <= units => end,
                _ => continue,
            };
            if offset > cursor {
                push(&mut alloc, cursor, offset - cursor, false);
            }
            let node = push(&mut alloc, offset, size, true);
            alloc.live += 1;
            out[i] = Some(Allocation { offset, node });
            cursor = end;
        }
        if cursor < units {
            push(&mut alloc, cursor, units - cursor, false);
        }
        (alloc, out)
    }

    /// Size of the largest free range, in units.
    pub fn largest_free_units(&self) -> u64 {
        if self.used_top == 0 {
            return 0;
        }
        let top = 63 - self.used_top.leading_zeros() as usize;
        let leaf = 7 - self.used_leaf[top].leading_zeros() as usize;
        let mut node = self.heads[top * LEAF_BINS + leaf];
        let mut best = 0;
        while node != NONE {
            best = best.max(self.nodes[node as usize].units());
            node = self.nodes[node as usize].bin_next;
        }
        best
    }

    fn find_fit(&self, units: u64) -> Option<u32> {
        // Fast path for uniform pages: the head of the bin this size files under.
        let own = self.heads[bin_round_down(units)];
        if own != NONE && self.nodes[own as usize].units() >= units {
            return Some(own);
        }
        let bin = bin_round_up(units);
        if bin >= NUM_BINS {
            return None;
        }
        let (top, leaf) = (bin / LEAF_BINS, bin % LEAF_BINS);
        let leaf_mask = self.used_leaf[top] & (0xffu8 << leaf);
        let found = if leaf_mask != 0 {
            top * LEAF_BINS + leaf_mask.trailing_zeros() as usize
        } else {
            let higher = if top + 1 >= TOP_BINS {
                0
            } else {
                self.used_top & (!0u64 << (top + 1))
            };
            if higher == 0 {
                return self.scan_bin(bin_round_down(units), units);
            }
            let t = higher.trailing_zeros() as usize;
            t * LEAF_BINS + self.used_leaf[t].trailing_zeros() as usize
        };
        Some(self.heads[found])
    }

    /// Slow path when the bitmap finds nothing: a range of the bin `units` files under may
    /// still be large enough (bins hold a span of sizes). Only runs when nearly full.
    fn scan_bin(&self, bin: usize, units: u64) -> Option<u32> {
        let mut node = self.heads[bin];
        while node != NONE {
            let n = &self.nodes[node as usize];
            if n.units() >= units {
                return Some(node);
            }
            node = n.bin_next;
        }
        None
    }

    fn new_node(&mut self, offset: u64, size: u64, prev: u32, next: u32) -> u32 {
        let node = Node {
            offset,
            size,
            bin_prev: NONE,
            bin_next: NONE,
            prev,
            next,
        };
        match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn bin_insert(&mut self, node: u32) {
        let bin = bin_round_down(self.nodes[node as usize].units());
        let head = self.heads[bin];
        {
            let n = &mut self.nodes[node as usize];
            n.bin_prev = NONE;
            n.bin_next = head;
        }
        if head != NONE {
            self.nodes[head as usize].bin_prev = node;
        }
        self.heads[bin] = node;
        self.used_leaf[bin / LEAF_BINS] |= 1 << (bin % LEAF_BINS);
        self.used_top |= 1 << (bin / LEAF_BINS);
    }

    fn bin_remove(&mut self, node: u32) {
        let n = self.nodes[node as usize];
        if n.bin_prev != NONE {
            self.nodes[n.bin_prev as usize].bin_next = n.bin_next;
        } else {
            let bin = bin_round_down(n.units());
            self.heads[bin] = n.bin_next;
            if n.bin_next == NONE {
                let top = bin / LEAF_BINS;
                self.used_leaf[top] &= !(1 << (bin % LEAF_BINS));
                if self.used_leaf[top] == 0 {
                    self.used_top &= !(1 << top);
                }
            }
        }
        if n.bin_next != NONE {
            self.nodes[n.bin_next as usize].bin_prev = n.bin_prev;
        }
    }

    /// Every range in address order as `(offset, units, allocated)`.
    #[cfg(test)]
    pub(crate) fn ranges(&self) -> Vec<(u64, u64, bool)> {
        let mut out = Vec::new();
        let Some(first) = (0..self.nodes.len()).find(|&i| {
            let n = &self.nodes[i];
            n.prev == NONE && !self.spare.contains(&(i as u32)) && (n.units() > 0)
        }) else {
            return out;
        };
        let mut node = first as u32;
        while node != NONE {
            let n = &self.nodes[node as usize];
            out.push((n.offset, n.units(), n.is_used()));
            node = n.next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bins_bracket_sizes() {
        for size in 1..5000u64 {
            let down = bin_round_down(size);
            let up = bin_round_up(size);
            assert!(down <= up && up <= down + 1, "size {size}");
        }
        assert!(bin_round_up(MAX_UNITS) < NUM_BINS);
    }

    #[test]
    fn exact_fit_and_coalesce() {
        let mut a = OffsetAllocator::new(100);
        let x = a.allocate(30).unwrap();
        let y = a.allocate(30).unwrap();
        let z = a.allocate(40).unwrap();
        assert_eq!((x.offset, y.offset, z.offset), (0, 30, 60));
        assert!(a.allocate(1).is_none());
        assert_eq!(a.free(y), Some(30));
        assert_eq!(a.free(y), None, "double free is refused");
        assert_eq!(
            a.allocate(30).unwrap().offset,
            30,
            "hole of the same size is reused"
        );
        a.free(Allocation {
            offset: 30,
            node: y.node,
        })
        .unwrap();
        a.free(x).unwrap();
        a.free(z).unwrap();
        assert_eq!(a.used_units(), 0);
        assert_eq!(a.ranges(), vec![(0, 100, false)]);
        assert_eq!(a.allocate(100).unwrap().offset, 0);
    }

    #[test]
    fn rebuilt_allocators_match_their_records_and_keep_working() {
        let (mut a, got) =
            OffsetAllocator::with_used(100, &[(40, 10), (0, 5), (45, 5), (95, 10), (60, 0)]);
        assert_eq!(got[0].map(|x| x.offset), Some(40));
        assert_eq!(got[1].map(|x| x.offset), Some(0));
        assert!(got[2].is_none(), "overlaps 40..50");
        assert!(got[3].is_none(), "past the end");
        assert!(got[4].is_none(), "empty");
        assert_eq!(a.used_units(), 15);
        assert_eq!(a.live_allocations(), 2);
        assert_eq!(
            a.ranges(),
            vec![
                (0, 5, true),
                (5, 35, false),
                (40, 10, true),
                (50, 50, false)
            ]
        );
        // Allocation and free work on the rebuilt ranges; freeing all coalesces to one.
        let b = a.allocate(50).expect("the tail fits");
        assert_eq!(b.offset, 50);
        for x in [got[0].unwrap(), got[1].unwrap(), b] {
            assert!(a.free(x).is_some());
        }
        assert_eq!(a.ranges(), vec![(0, 100, false)]);
    }

    #[test]
    fn uniform_pages_fill_completely() {
        // 7 units is not exactly representable by the bins' round-up; the fast path still
        // reuses every freed page.
        let mut a = OffsetAllocator::new(7 * 1000);
        let pages: Vec<_> = (0..1000).map(|_| a.allocate(7).unwrap()).collect();
        assert!(a.allocate(7).is_none());
        for p in pages.iter().step_by(2) {
            a.free(*p).unwrap();
        }
        for _ in 0..500 {
            a.allocate(7).expect("freed page reused");
        }
        assert_eq!(a.used_units(), 7000);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Alloc(u64),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1u64..64).prop_map(Op::Alloc),
            1 => (1u64..5000).prop_map(Op::Alloc),
            3 => any::<usize>().prop_map(Op::Free),
        ]
    }

    proptest! {
        /// No two live allocations overlap, usage equals the sum of live allocations, and
        /// freeing everything leaves one free range.
        #[test]
        fn allocations_never_overlap(total in 1u64..20_000, ops in proptest::collection::vec(op(), 1..400)) {
            let mut a = OffsetAllocator::new(total);
            let mut live: Vec<(Allocation, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(n) => {
                        if let Some(x) = a.allocate(n) {
                            prop_assert!(x.offset + n <= total);
                            live.push((x, n));
                        } else {
                            // A refusal is only allowed when no free range fits.
                            prop_assert!(a.largest_free_units() < n || n > total);
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (x, n) = live.swap_remove(i % live.len());
                        prop_assert_eq!(a.free(x), Some(n));
                    }
                    Op::Free(_) => {}
                }
                let mut spans: Vec<(u64, u64)> = live.iter().map(|(x, n)| (x.offset, *n)).collect();
                spans.sort_unstable();
                for w in spans.windows(2) {
                    prop_assert!(w[0].0 + w[0].1 <= w[1].0, "overlap {:?}", w);
                }
                let sum: u64 = live.iter().map(|(_, n)| n).sum();
                prop_assert_eq!(a.used_units(), sum);
                prop_assert_eq!(a.live_allocations(), live.len() as u64);
                let ranges = a.ranges();
                prop_assert_eq!(ranges.iter().map(|r| r.1).sum::<u64>(), total);
                for w in ranges.windows(2) {
                    prop_assert!(!( !w[0].2 && !w[1].2), "adjacent free ranges not coalesced");
                }
            }
            for (x, _) in live.drain(..) {
                a.free(x).unwrap();
            }
            prop_assert_eq!(a.ranges(), vec![(0, total, false)]);
        }
    }
}
