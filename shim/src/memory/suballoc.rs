//! Carves application allocations out of the arena's virtual range (the arena allocator),
//! with stream-ordered reuse of freed memory.
//!
//! - Sizes are rounded to [`GRANULE`] (256 bytes, the alignment `cudaMalloc` gives).
//! - Requests of at most half a page are *packed*: they start anywhere, so two 1 MiB tensors
//!   share a 2 MiB page. Larger requests start on a page boundary, so a large tensor's pages
//!   are its own (the swap unit is the page), except the tail of its last page, which goes
//!   back to the free set for packed requests rather than being wasted. Every hole of at
//!   least a granule can then take some request: no hole is dead by construction.
//! - Free space is one coalesced [`FreeExtents`] set over arena offsets with exact best fit
//!   for both placements in O(log n) (no candidate cap). The arena's used part (the
//!   *frontier*) grows, by at least `grow_bytes`, only when no free extent can hold a
//!   request; the caller backs the new pages with physical memory in one go.
//! - Stream-ordered frees: memory freed on stream S is kept on S's pending set with the
//!   fence promised at the free. An allocation on S may reuse it at once (stream order makes
//!   that safe, as in the caching allocators); other streams get it only once the fence has
//!   completed and it has moved to the shared free set ([`Suballocator::mature`]).
//!
//! Guarantee (tested in `tests::no_false_out_of_memory`): an allocation fails only if no
//! free extent, the requesting stream's pending frees included, can hold it and the arena's
//! unused part is too small too. Hence the fragmentation bound of `docs/memory.md`: when the
//! frontier grows for a request of span `s`, every hole is shorter than `s + page`, and
//! coalescing leaves at most `k + 1` holes around `k` occupied extents, so the frontier never
//! exceeds `occupied + (k + 1) * (s + page) + max(grow_bytes, s + page)`.
//!
//! It does not know about pages' physical state; the manager handles that.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::budget::format_size;
use super::extent::{FreeExtents, Placement, SizeIndex};

pub use super::extent::GRANULE;

/// Allocation granularity and alignment of packed requests (the name the manager knew).
pub const MIN_ALIGN: u64 = GRANULE;

/// A live allocation: where it is and how much of the arena it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub ptr: u64,
    /// Bytes the application asked for.
    pub size: u64,
    /// Bytes reserved for it (rounded to the granule).
    pub span: u64,
}

/// The result of a successful [`Suballocator::alloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub alloc: Allocation,
    /// Arena bytes `[start, end)` that the frontier grew by for this call, if it grew.
    pub grown: Option<(u64, u64)>,
}

/// Errors by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubAllocError {
    /// The arena's virtual range is used up.
    ArenaFull,
    /// Zero-byte request.
    ZeroSize,
    /// Not the start of a live allocation (unknown pointer, interior pointer, double free).
    NotAllocated,
}

/// How the arena is used, for logs and out-of-memory messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fragmentation {
    /// Bytes reserved by live allocations (their spans).
    pub live_bytes: u64,
    pub live_count: usize,
    /// Bytes in free holes below the frontier (reusable by any stream).
    pub free_bytes: u64,
    pub hole_count: usize,
    /// The longest hole, and the longest page-aligned run in any hole (what a large
    /// request can get without growing the frontier; 0 when none exceeds half a page).
    pub largest_hole: u64,
    pub largest_aligned_run: u64,
    /// Freed bytes still waiting for a stream's fence.
    pub pending_bytes: u64,
    /// The arena's used part.
    pub frontier: u64,
}

impl fmt::Display for Fragmentation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} live in {} allocations, {} free in {} holes (largest hole {}, largest \
             page-aligned run {}), {} freed awaiting stream order, frontier {}",
            format_size(self.live_bytes),
            self.live_count,
            format_size(self.free_bytes),
            self.hole_count,
            format_size(self.largest_hole),
            format_size(self.largest_aligned_run),
            format_size(self.pending_bytes),
            format_size(self.frontier)
        )
    }
}

/// One stream's frees waiting for their fences: reusable by that stream now, by the others
/// after the fence. Extents are not coalesced (each keeps its own fence).
#[derive(Debug, Clone)]
struct PendingFrees {
    /// start -> (len, fence)
    by_start: BTreeMap<u64, (u64, u64)>,
    /// (fence, start), in fence order for [`Suballocator::mature`].
    by_fence: BTreeSet<(u64, u64)>,
    index: SizeIndex,
    bytes: u64,
}

impl PendingFrees {
    fn new(page: u64) -> Self {
        Self {
            by_start: BTreeMap::new(),
            by_fence: BTreeSet::new(),
            index: SizeIndex::new(page),
            bytes: 0,
        }
    }

    fn add(&mut self, start: u64, len: u64, fence: u64) {
        if len == 0 {
            return;
        }
        self.by_start.insert(start, (len, fence));
        self.by_fence.insert((fence, start));
        self.index.add(start, len);
        self.bytes += len;
    }

    /// Adds a freed range, merged with the pending ranges it touches: the merged range
    /// matures with the latest of their fences (later for the earlier parts, never sooner),
    /// and the stream can reuse it whole at once.
    fn add_merged(&mut self, mut start: u64, mut len: u64, mut fence: u64) {
        if let Some((&s, &(l, f))) = self.by_start.range(..start).next_back() {
            if s + l == start {
                self.remove(s);
                start = s;
                len += l;
                fence = fence.max(f);
            }
        }
        if let Some(&(l, f)) = self.by_start.get(&(start + len)) {
            self.remove(start + len);
            len += l;
            fence = fence.max(f);
        }
        self.add(start, len, fence);
    }

    fn remove(&mut self, start: u64) -> Option<(u64, u64)> {
        let (len, fence) = self.by_start.remove(&start)?;
        self.by_fence.remove(&(fence, start));
        self.index.remove(start, len);
        self.bytes -= len;
        Some((len, fence))
    }

    /// Best fit among this stream's pending frees; leftovers keep their fence (they are
    /// still ordered behind the same free).
    fn take(&mut self, len: u64, placement: Placement) -> Option<u64> {
        let fit = self.index.best_fit(len, placement)?;
        let (_, fence) = self.remove(fit.start)?;
        self.add(fit.start, fit.at - fit.start, fence);
        self.add(fit.at + len, fit.start + fit.len - (fit.at + len), fence);
        Some(fit.at)
    }

    /// Removes and yields the extents whose fence is at most `done`.
    fn drain_matured(&mut self, done: u64, mut each: impl FnMut(u64, u64)) {
        while let Some(&(fence, start)) = self.by_fence.first() {
            if fence > done {
                break;
            }
            if let Some((len, _)) = self.remove(start) {
                each(start, len);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

pub struct Suballocator {
    base: u64,
    capacity: u64,
    page: u64,
    grow_bytes: u64,
    frontier: u64,
    free: FreeExtents,
    /// Per stream slot.
    pending: Vec<PendingFrees>,
    allocs: BTreeMap<u64, Allocation>,
    live_bytes: u64,
    /// The most `live_bytes` has been.
    peak_live_bytes: u64,
    /// The stream slots that have allocated, by slot.
    allocating: Vec<bool>,
}

impl Suballocator {
    /// `base`/`capacity`: the arena; `page`: the swap and mapping unit (a power of two, at
    /// least [`GRANULE`]); `grow_bytes`: the least the frontier grows by at once.
    pub fn new(base: u64, capacity: u64, page: u64, grow_bytes: u64) -> Self {
        let page = page.max(GRANULE).next_power_of_two();
        Self {
            base,
            capacity: capacity / page * page,
            page,
            grow_bytes: grow_bytes.max(page).next_multiple_of(page),
            frontier: 0,
            free: FreeExtents::new(page),
            pending: Vec::new(),
            allocs: BTreeMap::new(),
            live_bytes: 0,
            peak_live_bytes: 0,
            allocating: Vec::new(),
        }
    }

    /// Whether a stream other than `slot`'s has allocated: only then can memory freed on
    /// `slot` be wanted elsewhere before that stream reuses it.
    pub fn others_allocate(&self, slot: usize) -> bool {
        self.allocating
            .iter()
            .enumerate()
            .any(|(i, &a)| a && i != slot)
    }

    /// Arena bytes in use or ever handed out (the frontier).
    pub fn frontier(&self) -> u64 {
        self.frontier
    }

    /// The most bytes live allocations have spanned at once.
    pub fn peak_live_bytes(&self) -> u64 {
        self.peak_live_bytes
    }

    pub fn live_count(&self) -> usize {
        self.allocs.len()
    }

    /// The live allocation containing `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<Allocation> {
        self.allocs
            .range(..=addr)
            .next_back()
            .map(|(_, a)| *a)
            .filter(|a| addr < a.ptr + a.size.max(1))
    }

    pub fn get(&self, ptr: u64) -> Option<Allocation> {
        self.allocs.get(&ptr).copied()
    }

    /// Whether any stream-ordered free is still waiting for its fence.
    pub fn has_pending(&self) -> bool {
        self.pending.iter().any(|p| !p.is_empty())
    }

    /// Whether a stream-ordered free of another stream than `slot` is still waiting for its
    /// fence (what only a completed fence can give to `slot`).
    pub fn has_pending_besides(&self, slot: usize) -> bool {
        self.pending
            .iter()
            .enumerate()
            .any(|(i, p)| i != slot && !p.is_empty())
    }

    /// How the arena is used now.
    pub fn fragmentation(&self) -> Fragmentation {
        let (largest_hole, largest_aligned_run) = self.free.largest();
        Fragmentation {
            live_bytes: self.live_bytes,
            live_count: self.allocs.len(),
            free_bytes: self.free.total(),
            hole_count: self.free.len(),
            largest_hole,
            largest_aligned_run,
            pending_bytes: self.pending.iter().map(|p| p.bytes).sum(),
            frontier: self.frontier,
        }
    }

    /// Moves pending frees whose fence has completed to the shared free set.
    pub fn mature(&mut self, completed: &[u64]) {
        let free = &mut self.free;
        for (slot, list) in self.pending.iter_mut().enumerate() {
            let done = completed.get(slot).copied().unwrap_or(0);
            list.drain_matured(done, |start, len| {
                let ok = free.insert(start, len);
                debug_assert!(ok, "pending free overlapped free space");
            });
        }
    }

    /// The placement of a request of `span` bytes.
    fn placement(&self, span: u64) -> Placement {
        if span > self.page / 2 {
            Placement::PageAligned
        } else {
            Placement::Packed
        }
    }

    /// Allocates `size` bytes for use on `stream_slot`.
    pub fn alloc(
        &mut self,
        size: u64,
        stream_slot: usize,
        completed: &[u64],
    ) -> Result<Placed, SubAllocError> {
        if size == 0 {
            return Err(SubAllocError::ZeroSize);
        }
        let span = size
            .checked_next_multiple_of(GRANULE)
            .filter(|&s| s <= self.capacity)
            .ok_or(SubAllocError::ArenaFull)?;
        let placement = self.placement(span);
        if self.allocating.len() <= stream_slot {
            self.allocating.resize(stream_slot + 1, false);
        }
        self.allocating[stream_slot] = true;
        self.mature(completed);
        let mut grown = None;
        let same_stream = self
            .pending
            .get_mut(stream_slot)
            .and_then(|p| p.take(span, placement));
        let off = match same_stream.or_else(|| self.free.take(span, placement)) {
            Some(off) => off,
            None => {
                let g = self.grow(span, placement)?;
                grown = Some(g);
                self.free
                    .take(span, placement)
                    .ok_or(SubAllocError::ArenaFull)?
            }
        };
        let alloc = Allocation {
            ptr: self.base + off,
            size,
            span,
        };
        self.allocs.insert(alloc.ptr, alloc);
        self.live_bytes += span;
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
        Ok(Placed { alloc, grown })
    }

    /// Grows the frontier so that the hole at its end holds `span` at `placement`.
    fn grow(&mut self, span: u64, placement: Placement) -> Result<(u64, u64), SubAllocError> {
        let full = SubAllocError::ArenaFull;
        // The hole ending at the frontier (if any) becomes part of the space.
        let tail_start = self
            .free
            .ending_at(self.frontier)
            .map_or(self.frontier, |(s, _)| s);
        let at = match placement {
            Placement::Packed => tail_start,
            Placement::PageAligned => tail_start.next_multiple_of(self.page),
        };
        let exact_end = at
            .checked_add(span)
            .and_then(|e| e.checked_next_multiple_of(self.page))
            .filter(|&e| e <= self.capacity)
            .ok_or(full)?;
        // Grow by a whole batch if it fits, else by just what is needed.
        let batch_end = self.frontier.saturating_add(self.grow_bytes);
        let end = if exact_end < batch_end && batch_end <= self.capacity {
            batch_end
        } else {
            exact_end
        };
        let start = self.frontier;
        let ok = self.free.insert(start, end - start);
        debug_assert!(ok, "the arena past the frontier was free");
        self.frontier = end;
        Ok((start, end))
    }

    /// Removes a live allocation, returning it. The caller then calls [`Self::release_now`]
    /// or [`Self::release_after`] with it.
    pub fn remove(&mut self, ptr: u64) -> Result<Allocation, SubAllocError> {
        let a = self
            .allocs
            .remove(&ptr)
            .ok_or(SubAllocError::NotAllocated)?;
        self.live_bytes -= a.span;
        Ok(a)
    }

    /// Puts back an allocation taken out by [`Self::remove`] whose free then failed.
    pub fn reinsert(&mut self, a: Allocation) {
        if self.allocs.insert(a.ptr, a).is_none() {
            self.live_bytes += a.span;
        }
    }

    /// Makes a freed allocation's span reusable by any stream now.
    pub fn release_now(&mut self, a: Allocation) {
        let ok = self.free.insert(a.ptr - self.base, a.span);
        debug_assert!(ok, "freed span overlapped free space");
    }

    /// Makes a freed span reusable by `slot` now and by other streams after fence `seq`.
    ///
    /// The span is merged with the slot's pending frees around it, so that the stream can
    /// reuse them as one: where one stream allocates, its frees record no fence
    /// (`Fences::promise`) and mature only as often as its launches record one, and pieces it
    /// could reuse only one by one grew the arena.
    pub fn release_after(&mut self, a: Allocation, slot: usize, seq: u64) {
        if self.pending.len() <= slot {
            let page = self.page;
            self.pending
                .resize_with(slot + 1, || PendingFrees::new(page));
        }
        self.pending[slot].add_merged(a.ptr - self.base, a.span, seq);
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod bench;
