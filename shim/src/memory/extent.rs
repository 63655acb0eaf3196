//! Free address extents of the arena, with exact best fit in O(log n) for the two placements
//! the sub-allocator uses, and coalescing on insert.
//!
//! Pure bookkeeping over integers (offsets into the arena); no driver, no pages' state, no
//! streams (the stream-ordered part is [`super::suballoc`]). Every start and length is a
//! multiple of [`GRANULE`], and the page size is a multiple of it.
//!
//! Why two size indexes: a *packed* request fits any extent at least as long as itself (all
//! starts are granule-aligned), so the smallest such extent is the first entry of a
//! `(len, start)` set at or after `(want, 0)`. A *page-aligned* request fits an extent only if
//! the part from its first page boundary is long enough; indexing that part too,
//! `(aligned_len, start)`, makes page-aligned best fit one range lookup as well. No scan of
//! candidates (the old allocator looked at the 64 smallest holes only, and 64 one-MiB holes
//! that could not hold a page-aligned request made every later one fail).

use std::collections::{BTreeMap, BTreeSet};

/// Allocation granularity and the alignment of packed requests (what `cudaMalloc` gives).
pub const GRANULE: u64 = 256;

/// Where in an extent a request may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Anywhere (every start is granule-aligned).
    Packed,
    /// On a page boundary.
    PageAligned,
}

/// Size-ordered indexes over a set of disjoint extents (no coalescing: the owner decides).
#[derive(Debug, Clone)]
pub struct SizeIndex {
    page: u64,
    by_len: BTreeSet<(u64, u64)>,
    /// `(bytes from the extent's first page boundary to its end, start)`, for extents where
    /// that is more than half a page: only requests larger than half a page are
    /// page-aligned, so smaller runs need no entry (most holes then cost one set, not two).
    by_aligned_len: BTreeSet<(u64, u64)>,
}

/// A best-fit answer: the extent `[start, start + len)` and where the request goes in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fit {
    pub start: u64,
    pub len: u64,
    pub at: u64,
}

impl SizeIndex {
    /// `page`: a power of two, a multiple of [`GRANULE`].
    pub fn new(page: u64) -> Self {
        debug_assert!(page.is_power_of_two() && page >= GRANULE);
        Self {
            page,
            by_len: BTreeSet::new(),
            by_aligned_len: BTreeSet::new(),
        }
    }

    /// The page-aligned run of an extent, if it is long enough to be indexed.
    fn aligned_len(&self, start: u64, len: u64) -> Option<u64> {
        let u = (start + len).saturating_sub(start.next_multiple_of(self.page));
        (u > self.page / 2).then_some(u)
    }

    pub fn add(&mut self, start: u64, len: u64) {
        self.by_len.insert((len, start));
        if let Some(u) = self.aligned_len(start, len) {
            self.by_aligned_len.insert((u, start));
        }
    }

    pub fn remove(&mut self, start: u64, len: u64) {
        self.by_len.remove(&(len, start));
        if let Some(u) = self.aligned_len(start, len) {
            self.by_aligned_len.remove(&(u, start));
        }
    }

    /// The smallest extent that holds `want` bytes at `placement` (lowest start among
    /// equals), and where they go in it. O(log n). A page-aligned `want` must be more than
    /// half a page (smaller runs are not indexed).
    pub fn best_fit(&self, want: u64, placement: Placement) -> Option<Fit> {
        match placement {
            Placement::Packed => self
                .by_len
                .range((want, 0)..)
                .next()
                .map(|&(len, start)| Fit {
                    start,
                    len,
                    at: start,
                }),
            Placement::PageAligned => {
                debug_assert!(want > self.page / 2, "page-aligned requests are large");
                self.by_aligned_len
                    .range((want, 0)..)
                    .next()
                    .map(|&(u, start)| {
                        let at = start.next_multiple_of(self.page);
                        Fit {
                            start,
                            len: at - start + u,
                            at,
                        }
                    })
            }
        }
    }

    /// The longest extent's length, and the longest page-aligned run in any extent (0 when
    /// none is longer than half a page).
    pub fn largest(&self) -> (u64, u64) {
        (
            self.by_len.last().map_or(0, |&(l, _)| l),
            self.by_aligned_len.last().map_or(0, |&(u, _)| u),
        )
    }

    pub fn len(&self) -> usize {
        self.by_len.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_len.is_empty()
    }
}

/// Free extents, coalesced: no two are adjacent.
#[derive(Debug, Clone)]
pub struct FreeExtents {
    by_start: BTreeMap<u64, u64>,
    index: SizeIndex,
    total: u64,
}

impl FreeExtents {
    pub fn new(page: u64) -> Self {
        Self {
            by_start: BTreeMap::new(),
            index: SizeIndex::new(page),
            total: 0,
        }
    }

    /// Free bytes in all extents.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Number of extents (holes).
    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// See [`SizeIndex::largest`].
    pub fn largest(&self) -> (u64, u64) {
        self.index.largest()
    }

    /// The extents in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_start.iter().map(|(&s, &l)| (s, l))
    }

    /// Adds `start..start+len`, merging with neighbours. Overlap with a free extent is a bug
    /// in the caller (a double free that got past the allocation map); it is refused.
    pub fn insert(&mut self, mut start: u64, mut len: u64) -> bool {
        if len == 0 {
            return true;
        }
        // The extent starting last before our end: overlapping, touching (merge), or apart.
        if let Some((&s, &l)) = self.by_start.range(..start + len).next_back() {
            if s + l > start {
                return false;
            }
            if s + l == start {
                self.unlink(s, l);
                self.total -= l;
                start = s;
                len += l;
            }
        }
        self.total += len;
        if let Some(&l) = self.by_start.get(&(start + len)) {
            self.unlink(start + len, l);
            len += l;
        }
        self.by_start.insert(start, len);
        self.index.add(start, len);
        true
    }

    fn unlink(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.index.remove(start, len);
    }

    /// Takes `len` bytes at `placement` from the best-fitting extent; the pieces before and
    /// after go back. `None` only if no extent can hold them.
    pub fn take(&mut self, len: u64, placement: Placement) -> Option<u64> {
        let fit = self.index.best_fit(len, placement)?;
        self.unlink(fit.start, fit.len);
        self.total -= fit.len;
        self.put_back(fit.start, fit.at - fit.start);
        self.put_back(fit.at + len, fit.start + fit.len - (fit.at + len));
        Some(fit.at)
    }

    /// Re-adds a leftover piece (never adjacent to another extent: it was part of one).
    fn put_back(&mut self, start: u64, len: u64) {
        if len > 0 {
            self.by_start.insert(start, len);
            self.index.add(start, len);
            self.total += len;
        }
    }

    /// The extent ending exactly at `end`, if any (used to grow the arena's last hole).
    pub fn ending_at(&self, end: u64) -> Option<(u64, u64)> {
        self.by_start
            .range(..end)
            .next_back()
            .filter(|(&s, &l)| s + l == end)
            .map(|(&s, &l)| (s, l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PAGE: u64 = 4096;

    #[test]
    fn best_fit_and_coalescing() {
        let mut f = FreeExtents::new(PAGE);
        assert!(f.insert(0, 25_600));
        assert!(f.insert(51_200, 7680));
        assert_eq!(
            f.take(5120, Placement::Packed),
            Some(51_200),
            "the smaller hole fits best"
        );
        assert_eq!(f.take(12_800, Placement::PageAligned), Some(0));
        assert!(f.insert(0, 12_800));
        assert_eq!(f.len(), 2);
        assert!(!f.insert(56_320, 256), "still free: overlap refused");
        assert!(f.insert(51_200, 5120));
        assert_eq!(f.len(), 2);
        assert_eq!(f.total(), 25_600 + 7680);
        assert!(!f.insert(2560, 256), "overlap refused");
        assert_eq!(f.take(1 << 20, Placement::Packed), None);
    }

    #[test]
    fn page_aligned_best_fit_skips_holes_without_an_aligned_run() {
        let mut f = FreeExtents::new(PAGE);
        // Many half-page holes off the page boundary (the old allocator's 1 MiB trap), then
        // one that holds an aligned page.
        for i in 0..200 {
            assert!(f.insert(i * 2 * PAGE + PAGE / 2, PAGE / 2));
        }
        assert!(f.insert(1000 * PAGE + 256, 2 * PAGE));
        assert_eq!(
            f.take(PAGE / 2 + 256, Placement::PageAligned),
            Some(1001 * PAGE)
        );
        assert_eq!(
            f.largest(),
            (PAGE - 256, 0),
            "no aligned run over half a page left"
        );
        // The head piece before the boundary went back and packs a small request.
        assert_eq!(
            f.take(PAGE - 256, Placement::Packed),
            Some(1000 * PAGE + 256)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]
        /// Random takes and gives: extents never overlap nor touch, bytes are conserved, each
        /// taken range is aligned and was free, a refused take had no extent that could hold
        /// it, and everything coalesces back.
        #[test]
        fn conserves_bytes(ops in prop::collection::vec((1u64..40, any::<bool>(), any::<bool>()), 1..200)) {
            let total = 200 * PAGE;
            let mut f = FreeExtents::new(PAGE);
            f.insert(0, total);
            let mut taken: Vec<(u64, u64)> = Vec::new();
            for (granules, aligned, give) in ops {
                // Page-aligned requests are larger than half a page, as in the allocator.
                let len = granules * GRANULE * 3 + if aligned { PAGE / 2 } else { 0 };
                let placement = if aligned { Placement::PageAligned } else { Placement::Packed };
                if give && !taken.is_empty() {
                    let (s, l) = taken.swap_remove((len as usize) % taken.len());
                    prop_assert!(f.insert(s, l));
                } else if let Some(s) = f.take(len, placement) {
                    prop_assert_eq!(s % if aligned { PAGE } else { GRANULE }, 0);
                    for &(ts, tl) in &taken {
                        prop_assert!(s + len <= ts || ts + tl <= s);
                    }
                    taken.push((s, len));
                } else {
                    for (s, l) in f.iter() {
                        let at = if aligned { s.next_multiple_of(PAGE) } else { s };
                        prop_assert!(at + len > s + l, "hole {s}+{l} could hold {len}");
                    }
                }
                let used: u64 = taken.iter().map(|t| t.1).sum();
                prop_assert_eq!(f.total() + used, total);
                let holes: Vec<_> = f.iter().collect();
                for w in holes.windows(2) {
                    prop_assert!(w[0].0 + w[0].1 < w[1].0, "adjacent holes not coalesced");
                }
            }
            for (s, l) in taken { prop_assert!(f.insert(s, l)); }
            prop_assert_eq!(f.len(), 1, "everything coalesces back");
        }
    }
}
