//! Carves application allocations out of the arena's virtual range, with stream-ordered
//! reuse of freed memory.
//!
//! - Sizes are rounded to 512 bytes (the alignment `cudaMallocAsync` users expect).
//! - Requests of half a page or more start on a page boundary, so a large tensor never shares
//!   its first page with another allocation and swaps as a unit; its tail page is shared with
//!   small allocations rather than wasted. Small requests pack together.
//! - Free space is one best-fit [`FreeExtents`] set over arena offsets; the arena's used part
//!   grows (the *frontier*) in batches when nothing fits, and the caller backs the new pages
//!   with physical memory in one go.
//! - Stream-ordered frees: memory freed on stream S goes to S's pending list with the fence
//!   recorded at the free. An allocation on S may reuse it at once (stream order makes that
//!   safe, as in the caching allocators); other streams get it only once the fence has
//!   completed and it has moved to the shared free set.
//!
//! It does not know about pages' physical state; the manager handles that.

use std::collections::BTreeMap;

use super::extent::FreeExtents;

/// Allocation granularity and alignment of small requests.
pub const MIN_ALIGN: u64 = 512;

/// A live allocation: where it is and how much of the arena it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub ptr: u64,
    /// Bytes the application asked for.
    pub size: u64,
    /// Bytes reserved for it (rounded).
    pub span: u64,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    seq: u64,
    start: u64,
    len: u64,
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

pub struct Suballocator {
    base: u64,
    capacity: u64,
    page: u64,
    grow_bytes: u64,
    frontier: u64,
    free: FreeExtents,
    /// Per stream slot, in fence order.
    pending: Vec<Vec<Pending>>,
    allocs: BTreeMap<u64, Allocation>,
}

impl Suballocator {
    /// `base`/`capacity`: the arena; `grow_bytes`: the least the frontier grows by at once.
    pub fn new(base: u64, capacity: u64, page: u64, grow_bytes: u64) -> Self {
        Self {
            base,
            capacity,
            page,
            grow_bytes: grow_bytes.max(page),
            frontier: 0,
            free: FreeExtents::new(),
            pending: Vec::new(),
            allocs: BTreeMap::new(),
        }
    }

    /// Arena bytes in use or ever handed out (the frontier).
    pub fn frontier(&self) -> u64 {
        self.frontier
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
        self.pending.iter().any(|l| !l.is_empty())
    }

    /// Moves pending frees whose fence has completed to the shared free set.
    pub fn mature(&mut self, completed: &[u64]) {
        for (slot, list) in self.pending.iter_mut().enumerate() {
            let done = completed.get(slot).copied().unwrap_or(0);
            let n = list.iter().take_while(|p| p.seq <= done).count();
            for p in list.drain(..n) {
                let ok = self.free.insert(p.start, p.len);
                debug_assert!(ok, "pending free overlapped free space");
            }
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
            .checked_next_multiple_of(MIN_ALIGN)
            .ok_or(SubAllocError::ArenaFull)?;
        let align = if span >= self.page / 2 {
            self.page
        } else {
            MIN_ALIGN
        };
        self.mature(completed);
        let mut grown = None;
        let off = match self.take_same_stream(span, align, stream_slot) {
            Some(off) => off,
            None => match self.free.take(span, align) {
                Some(off) => off,
                None => {
                    let g = self.grow(span.saturating_add(align))?;
                    grown = Some(g);
                    self.free
                        .take(span, align)
                        .ok_or(SubAllocError::ArenaFull)?
                }
            },
        };
        let alloc = Allocation {
            ptr: self.base + off,
            size,
            span,
        };
        self.allocs.insert(alloc.ptr, alloc);
        Ok(Placed { alloc, grown })
    }

    /// Best fit among the recent frees of the same stream (bounded scan).
    fn take_same_stream(&mut self, span: u64, align: u64, slot: usize) -> Option<u64> {
        const SCAN: usize = 64;
        let list = self.pending.get_mut(slot)?;
        let from = list.len().saturating_sub(SCAN);
        let (i, _) = list[from..]
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let a = p.start.next_multiple_of(align);
                (a + span <= p.start + p.len).then_some((from + i, p.len))
            })
            .min_by_key(|&(_, len)| len)?;
        let p = list.remove(i);
        let a = p.start.next_multiple_of(align);
        // Leftovers keep the same fence: they are still ordered behind the same free.
        let mut rest = Vec::new();
        if a > p.start {
            rest.push(Pending {
                seq: p.seq,
                start: p.start,
                len: a - p.start,
            });
        }
        if a + span < p.start + p.len {
            rest.push(Pending {
                seq: p.seq,
                start: a + span,
                len: p.start + p.len - a - span,
            });
        }
        for r in rest {
            // Keep fence order: insert before the first entry with a larger fence.
            let at = list.partition_point(|q| q.seq <= r.seq);
            list.insert(at, r);
        }
        Some(a)
    }

    fn grow(&mut self, need: u64) -> Result<(u64, u64), SubAllocError> {
        // Only the part not covered by a free hole at the frontier needs new space.
        let tail = self.free.ending_at(self.frontier).map_or(0, |(_, l)| l);
        let need = need.saturating_sub(tail);
        let full = SubAllocError::ArenaFull;
        let exact = need.checked_next_multiple_of(self.page).ok_or(full)?;
        let exact_end = self.frontier.checked_add(exact).ok_or(full)?;
        if exact_end > self.capacity {
            return Err(full);
        }
        // Grow by a whole batch if it fits, else by just what is needed.
        let batch_end = self.frontier.saturating_add(exact.max(self.grow_bytes));
        let end = if batch_end <= self.capacity {
            batch_end
        } else {
            exact_end
        };
        let start = self.frontier;
        self.free.insert(start, end - start);
        self.frontier = end;
        Ok((start, end))
    }

    /// Removes a live allocation, returning it. The caller then calls [`Self::release_now`]
    /// or [`Self::release_after`] with its span.
    pub fn remove(&mut self, ptr: u64) -> Result<Allocation, SubAllocError> {
        self.allocs.remove(&ptr).ok_or(SubAllocError::NotAllocated)
    }

    /// Puts back an allocation taken out by [`Self::remove`] whose free then failed.
    pub fn reinsert(&mut self, a: Allocation) {
        self.allocs.insert(a.ptr, a);
    }

    /// Makes a freed allocation's span reusable by any stream now.
    pub fn release_now(&mut self, a: Allocation) {
        let ok = self.free.insert(a.ptr - self.base, a.span);
        debug_assert!(ok, "freed span overlapped free space");
    }

    /// Makes a freed span reusable by `slot` now and by other streams after fence `seq`.
    pub fn release_after(&mut self, a: Allocation, slot: usize, seq: u64) {
        if self.pending.len() <= slot {
            self.pending.resize_with(slot + 1, Vec::new);
        }
        let list = &mut self.pending[slot];
        let at = list.partition_point(|q| q.seq <= seq);
        list.insert(
            at,
            Pending {
                seq,
                start: a.ptr - self.base,
                len: a.span,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 1 << 21;

    #[test]
    fn large_allocations_are_page_aligned_and_small_ones_pack() {
        let mut s = Suballocator::new(0x1000_0000, 1 << 34, PAGE, 8 * PAGE);
        let done = [0u64];
        let a = s.alloc(3 * PAGE + 100, 0, &done).unwrap();
        assert_eq!(a.alloc.ptr % PAGE, 0);
        assert_eq!(a.grown, Some((0, 8 * PAGE)));
        let b = s.alloc(1000, 0, &done).unwrap();
        assert_eq!(b.alloc.ptr % MIN_ALIGN, 0);
        assert_eq!(b.alloc.span, 1024);
        // The tail of `a`'s last page is reused by the small one.
        assert_eq!(b.alloc.ptr, a.alloc.ptr + 3 * PAGE + 512);
        assert_eq!(b.grown, None);
        assert_eq!(s.find(a.alloc.ptr + 5), Some(a.alloc));
        assert_eq!(s.find(b.alloc.ptr + 1000), None, "past the requested size");
    }

    #[test]
    fn stream_ordered_reuse() {
        let mut s = Suballocator::new(0, 1 << 30, PAGE, PAGE);
        let a = s.alloc(4096, 0, &[0, 0]).unwrap().alloc;
        let fill = s.alloc(PAGE - 4096, 0, &[0, 0]).unwrap().alloc; // uses up the page
        let _ = fill;
        let freed = s.remove(a.ptr).unwrap();
        s.release_after(freed, 0, 7);
        // Another stream must not get it while fence 7 of stream 0 is incomplete.
        let b = s.alloc(4096, 1, &[6, 0]).unwrap().alloc;
        assert_ne!(b.ptr, a.ptr);
        // The same stream may.
        let c = s.alloc(4096, 0, &[6, 0]).unwrap().alloc;
        assert_eq!(c.ptr, a.ptr);
        let freed = s.remove(c.ptr).unwrap();
        s.release_after(freed, 0, 8);
        let d = s.alloc(4096, 1, &[8, 0]).unwrap().alloc;
        assert_eq!(d.ptr, a.ptr, "after the fence, any stream");
        assert_eq!(s.remove(0x999), Err(SubAllocError::NotAllocated));
        assert_eq!(s.remove(d.ptr + 512), Err(SubAllocError::NotAllocated));
        s.remove(d.ptr).unwrap();
        assert_eq!(
            s.remove(d.ptr),
            Err(SubAllocError::NotAllocated),
            "double free"
        );
    }

    #[test]
    fn arena_full_is_an_error() {
        let mut s = Suballocator::new(0, 4 * PAGE, PAGE, 2 * PAGE);
        let done = [0u64];
        s.alloc(3 * PAGE, 0, &done).unwrap();
        assert_eq!(s.alloc(2 * PAGE, 0, &done), Err(SubAllocError::ArenaFull));
        assert!(s.alloc(PAGE, 0, &done).is_ok(), "the last page still fits");
        assert_eq!(s.alloc(0, 0, &done), Err(SubAllocError::ZeroSize));
        assert_eq!(s.alloc(u64::MAX, 0, &done), Err(SubAllocError::ArenaFull));
        assert_eq!(
            s.alloc(u64::MAX - 600, 0, &done),
            Err(SubAllocError::ArenaFull)
        );
        assert_eq!(s.alloc(1 << 62, 0, &done), Err(SubAllocError::ArenaFull));
    }
}
