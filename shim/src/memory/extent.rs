//! A set of free address extents with best-fit, aligned allocation and coalescing.
//!
//! Pure bookkeeping over integers (offsets into the arena); no driver, no pages. Best fit
//! (smallest extent that holds the request, lowest address among equals) keeps large holes
//! intact for large tensors, and coalescing on insert undoes splitting as memory comes back.

use std::collections::{BTreeMap, BTreeSet};

/// Free extents, indexed by start and by (length, start).
#[derive(Debug, Default, Clone)]
pub struct FreeExtents {
    by_start: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
}

impl FreeExtents {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn total(&self) -> u64 {
        self.by_start.values().sum()
    }

    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// Adds `start..start+len`, merging with neighbours. Overlap with a free extent is a bug
    /// in the caller (a double free that got past the allocation map); it is refused.
    pub fn insert(&mut self, mut start: u64, mut len: u64) -> bool {
        if len == 0 {
            return true;
        }
        if let Some((&s, &l)) = self.by_start.range(..start + len).next_back() {
            if s + l > start {
                return false;
            }
        }
        if let Some((&s, &l)) = self.by_start.range(..start).next_back() {
            if s + l == start {
                self.remove(s, l);
                start = s;
                len += l;
            }
        }
        if let Some(&l) = self.by_start.get(&(start + len)) {
            self.remove(start + len, l);
            len += l;
        }
        self.by_start.insert(start, len);
        self.by_size.insert((len, start));
        true
    }

    fn remove(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_size.remove(&(len, start));
    }

    /// Takes `len` bytes aligned to `align` (a power of two) from the best-fitting extent;
    /// the pieces before and after go back. Looks at a bounded number of candidates so a
    /// badly fragmented set cannot make an allocation slow.
    pub fn take(&mut self, len: u64, align: u64) -> Option<u64> {
        const MAX_CANDIDATES: usize = 64;
        let found = self
            .by_size
            .range((len, 0)..)
            .take(MAX_CANDIDATES)
            .find_map(|&(l, s)| {
                let a = s.next_multiple_of(align);
                (a + len <= s + l).then_some((s, l, a))
            });
        let (s, l, a) = found?;
        self.remove(s, l);
        if a > s {
            self.insert(s, a - s);
        }
        if a + len < s + l {
            self.insert(a + len, s + l - (a + len));
        }
        Some(a)
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

    #[test]
    fn best_fit_and_coalescing() {
        let mut f = FreeExtents::new();
        assert!(f.insert(0, 100));
        assert!(f.insert(200, 30));
        assert_eq!(f.take(20, 1), Some(200), "the 30-byte hole fits 20 best");
        assert_eq!(f.take(50, 64), Some(0), "aligned inside the big hole");
        assert!(f.insert(0, 50));
        assert_eq!(f.len(), 2);
        assert!(
            !f.insert(220, 10),
            "220..230 is still free: overlap refused"
        );
        assert!(f.insert(200, 20));
        assert_eq!(f.len(), 2);
        assert_eq!(f.total(), 100 + 30);
        assert!(!f.insert(10, 5), "overlap refused");
        assert_eq!(f.take(1000, 1), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]
        /// Random takes and gives: extents never overlap, bytes are conserved, and each taken
        /// range is aligned and was free.
        #[test]
        fn conserves_bytes(ops in prop::collection::vec((1u64..300, 0u32..4, any::<bool>()), 1..200)) {
            let total = 10_000u64;
            let mut f = FreeExtents::new();
            f.insert(0, total);
            let mut taken: Vec<(u64, u64)> = Vec::new();
            for (len, align_log, give) in ops {
                if give && !taken.is_empty() {
                    let (s, l) = taken.swap_remove((len as usize) % taken.len());
                    prop_assert!(f.insert(s, l));
                } else if let Some(s) = f.take(len, 1 << (align_log * 3)) {
                    prop_assert_eq!(s % (1 << (align_log * 3)), 0);
                    for &(ts, tl) in &taken {
                        prop_assert!(s + len <= ts || ts + tl <= s);
                    }
                    taken.push((s, len));
                }
                let used: u64 = taken.iter().map(|t| t.1).sum();
                prop_assert_eq!(f.total() + used, total);
            }
            for (s, l) in taken { prop_assert!(f.insert(s, l)); }
            prop_assert_eq!(f.len(), 1, "everything coalesces back");
        }
    }
}
