//! An interval index over the live device allocations, built for the launch path.
//!
//! Every launch asks "which live allocation, if any, contains this 8-byte word?" for each
//! pointer-sized word of its parameters, from any thread, at up to a few hundred thousand
//! launches per second. Allocations and frees are rarer but not rare (about one each per
//! kernel in PyTorch with `cudaMallocAsync`, with thousands live). So reads must be
//! lock-free and cache-friendly, and writes must not be `O(n)` copies of everything:
//!
//! - The index is an immutable [`Snapshot`]: the live ranges, sorted by start and cut into
//!   chunks of at most [`MAX_CHUNK`] (a chunk keeps starts, ends and ids in parallel arrays,
//!   so a binary search touches only starts), plus the first start of every chunk, and the
//!   lowest start and highest end, so that words that clearly are not device pointers
//!   (small integers, floats) are rejected with two comparisons.
//! - Readers load the current snapshot through `arc_swap` (no lock, no reference-count
//!   traffic on the common path) and search it: chunk, then range.
//! - Writers (alloc, free) serialize on a mutex, copy only the chunk they change (chunks
//!   are shared between snapshots through `Arc`) and the small top-level arrays, and publish
//!   the new snapshot atomically. A launch never waits for a writer; it sees the snapshot
//!   before or after the change.
//!
//! This module knows nothing about CUDA or traces: it maps address ranges to ids.

use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::{ArcSwap, Guard};

/// The most ranges a chunk holds; a fuller one is split in two.
pub const MAX_CHUNK: usize = 128;
/// A chunk this small is merged with a neighbour when the two fit in one.
const MIN_CHUNK: usize = MAX_CHUNK / 8;

/// One live allocation: `[start, start + len)` is `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub len: u64,
    pub id: u64,
}

impl Range {
    /// One past the last byte (saturating, so a range at the top of the address space is
    /// still well-formed).
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }

    fn overlaps(&self, other: &Range) -> bool {
        self.start < other.end() && other.start < self.end()
    }
}

/// Up to [`MAX_CHUNK`] consecutive ranges (never empty).
#[derive(Debug)]
struct Chunk {
    starts: Box<[u64]>,
    ends: Box<[u64]>,
    ids: Box<[u64]>,
}

impl Chunk {
    fn new(ranges: &[Range]) -> Arc<Chunk> {
        Arc::new(Chunk {
            starts: ranges.iter().map(|r| r.start).collect(),
            ends: ranges.iter().map(|r| r.end()).collect(),
            ids: ranges.iter().map(|r| r.id).collect(),
        })
    }

    fn len(&self) -> usize {
        self.starts.len()
    }

    fn range(&self, i: usize) -> Range {
        Range {
            start: self.starts[i],
            len: self.ends[i] - self.starts[i],
            id: self.ids[i],
        }
    }

    fn ranges(&self) -> impl Iterator<Item = Range> + '_ {
        (0..self.len()).map(|i| self.range(i))
    }
}

/// An immutable, sorted view of the live allocations.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// First start of each chunk.
    firsts: Vec<u64>,
    chunks: Vec<Arc<Chunk>>,
    len: usize,
    /// Lowest start (`u64::MAX` when empty).
    lo: u64,
    /// Highest end (`0` when empty).
    hi: u64,
}

impl Snapshot {
    fn from_chunks(chunks: Vec<Arc<Chunk>>) -> Self {
        let firsts: Vec<u64> = chunks.iter().map(|c| c.starts[0]).collect();
        let len = chunks.iter().map(|c| c.len()).sum();
        let lo = firsts.first().copied().unwrap_or(u64::MAX);
        // Ranges are sorted and disjoint, so ends are sorted too.
        let hi = chunks
            .last()
            .and_then(|c| c.ends.last().copied())
            .unwrap_or(0);
        Snapshot {
            firsts,
            chunks,
            len,
            lo,
            hi,
        }
    }

    /// Sorted, disjoint `ranges`, cut into half-full chunks.
    fn from_sorted(ranges: &[Range]) -> Self {
        Self::from_chunks(ranges.chunks(MAX_CHUNK / 2).map(Chunk::new).collect())
    }

    /// The number of live allocations.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no live allocations.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk that would hold a range starting at `addr` (the last chunk starting at
    /// or below it, or the first chunk).
    #[inline]
    fn chunk_for(&self, addr: u64) -> usize {
        self.firsts
            .partition_point(|&s| s <= addr)
            .saturating_sub(1)
    }

    /// (chunk, position) of the allocation containing `addr`.
    #[inline]
    fn position(&self, addr: u64) -> Option<(usize, usize)> {
        if addr < self.lo || addr >= self.hi {
            return None;
        }
        let c = self.chunk_for(addr);
        let chunk = &self.chunks[c];
        // Ranges never overlap (the writer guarantees it), so the only candidate is the
        // last one starting at or below `addr`.
        let i = chunk
            .starts
            .partition_point(|&s| s <= addr)
            .checked_sub(1)?;
        (addr < chunk.ends[i]).then_some((c, i))
    }

    /// The id of the live allocation containing `addr`.
    #[inline]
    pub fn find_id(&self, addr: u64) -> Option<u64> {
        self.position(addr).map(|(c, i)| self.chunks[c].ids[i])
    }

    /// The live allocation containing `addr`.
    pub fn find(&self, addr: u64) -> Option<Range> {
        self.position(addr).map(|(c, i)| self.chunks[c].range(i))
    }

    /// Every live allocation, by start address.
    pub fn iter(&self) -> impl Iterator<Item = Range> + '_ {
        self.chunks.iter().flat_map(|c| c.ranges())
    }

    /// The live allocations overlapping `[start, start + len)`, by start address.
    pub fn overlapping(&self, start: u64, len: u64) -> impl Iterator<Item = Range> + '_ {
        let end = start.saturating_add(len);
        let c = self.chunk_for(start);
        // From the last range starting at or below `start` (it may reach into the window).
        let first = self.chunks.get(c).map_or(0, |ch| {
            ch.starts.partition_point(|&s| s <= start).saturating_sub(1)
        });
        self.chunks
            .iter()
            .skip(c)
            .enumerate()
            .flat_map(move |(k, ch)| ch.ranges().skip(if k == 0 { first } else { 0 }))
            .take_while(move |r| r.start < end)
            .filter(move |r| r.start + r.len > start)
    }

    /// Whether any live range overlaps `r`.
    fn overlaps(&self, r: &Range) -> bool {
        if self.is_empty() || r.len == 0 {
            return false;
        }
        let c = self.chunk_for(r.start);
        // The candidates: the last range starting at or below `r.start`, and the first
        // starting above it (later ones start even further up).
        let chunk = &self.chunks[c];
        let after = chunk.starts.partition_point(|&s| s <= r.start);
        let before = after.checked_sub(1).map(|i| chunk.range(i));
        let next = if after < chunk.len() {
            Some(chunk.range(after))
        } else {
            self.chunks.get(c + 1).map(|n| n.range(0))
        };
        before.iter().chain(next.iter()).any(|x| x.overlaps(r))
    }
}

/// The live allocations of the process.
#[derive(Debug)]
pub struct AllocIndex {
    current: ArcSwap<Snapshot>,
    writer: Mutex<()>,
}

impl Default for AllocIndex {
    fn default() -> Self {
        AllocIndex {
            current: ArcSwap::from_pointee(Snapshot::from_sorted(&[])),
            writer: Mutex::new(()),
        }
    }
}

impl AllocIndex {
    /// The current snapshot. Lock-free; hold the guard only for the duration of one lookup
    /// batch (it pins the snapshot).
    #[inline]
    pub fn snapshot(&self) -> Guard<Arc<Snapshot>> {
        self.current.load()
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        // A panic while holding the lock cannot leave the snapshot half-built (snapshots
        // are built aside and published whole), so a poisoned lock is still good.
        self.writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds `range`. Live ranges it overlaps can only be allocations whose free the shim
    /// did not see (freed through a path it does not manage); they are dropped from the
    /// index and returned, so the caller can account for them.
    pub fn insert(&self, range: Range) -> Vec<Range> {
        let _w = self.lock();
        let old = self.current.load_full();
        if old.overlaps(&range) {
            // Rare: rebuild everything.
            let (displaced, mut kept): (Vec<Range>, Vec<Range>) =
                old.iter().partition(|r| r.overlaps(&range));
            let at = kept.partition_point(|r| r.start < range.start);
            kept.insert(at, range);
            self.current.store(Arc::new(Snapshot::from_sorted(&kept)));
            return displaced;
        }
        if old.is_empty() {
            self.current
                .store(Arc::new(Snapshot::from_sorted(&[range])));
            return Vec::new();
        }
        let c = old.chunk_for(range.start);
        let mut ranges: Vec<Range> = old.chunks[c].ranges().collect();
        let at = ranges.partition_point(|r| r.start < range.start);
        ranges.insert(at, range);
        let replacement: Vec<Arc<Chunk>> = if ranges.len() > MAX_CHUNK {
            let (a, b) = ranges.split_at(ranges.len() / 2);
            vec![Chunk::new(a), Chunk::new(b)]
        } else {
            vec![Chunk::new(&ranges)]
        };
        self.current
            .store(Arc::new(splice(&old, c..c + 1, replacement)));
        Vec::new()
    }

    /// Removes the allocation that starts exactly at `start` (frees take the base pointer).
    pub fn remove(&self, start: u64) -> Option<Range> {
        let _w = self.lock();
        let old = self.current.load_full();
        let (c, i) = old.position(start)?;
        let chunk = &old.chunks[c];
        if chunk.starts[i] != start {
            return None;
        }
        let removed = chunk.range(i);
        let mut ranges: Vec<Range> = chunk.ranges().collect();
        ranges.remove(i);
        // Merge a small chunk into a neighbour so chunks cannot dwindle to singletons.
        let mut span = c..c + 1;
        if ranges.len() < MIN_CHUNK {
            let fits = |n: &Arc<Chunk>| n.len() + ranges.len() <= MAX_CHUNK;
            if c + 1 < old.chunks.len() && fits(&old.chunks[c + 1]) {
                ranges.extend(old.chunks[c + 1].ranges());
                span = c..c + 2;
            } else if c > 0 && fits(&old.chunks[c - 1]) {
                let mut merged: Vec<Range> = old.chunks[c - 1].ranges().collect();
                merged.append(&mut ranges);
                ranges = merged;
                span = c - 1..c + 1;
            }
        }
        let replacement = if ranges.is_empty() {
            Vec::new()
        } else {
            vec![Chunk::new(&ranges)]
        };
        self.current
            .store(Arc::new(splice(&old, span, replacement)));
        Some(removed)
    }
}

/// `old` with the chunks in `span` replaced by `with` (unchanged chunks are shared).
fn splice(old: &Snapshot, span: std::ops::Range<usize>, with: Vec<Arc<Chunk>>) -> Snapshot {
    let mut chunks = Vec::with_capacity(old.chunks.len() + 1);
    chunks.extend_from_slice(&old.chunks[..span.start]);
    chunks.extend(with);
    chunks.extend_from_slice(&old.chunks[span.end..]);
    Snapshot::from_chunks(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, len: u64, id: u64) -> Range {
        Range { start, len, id }
    }

    #[test]
    fn lists_the_ranges_overlapping_a_window_across_chunks() {
        let ix = AllocIndex::default();
        // Enough ranges for several chunks: 0x100 bytes every 0x1000.
        let n = 3 * MAX_CHUNK as u64;
        for i in 0..n {
            assert!(ix.insert(r(0x1000 * (i + 1), 0x100, i)).is_empty());
        }
        let s = ix.snapshot();
        let ids = |start, len| s.overlapping(start, len).map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(ids(0, 0x1000), Vec::<u64>::new());
        assert_eq!(ids(0, 0x1001), vec![0]);
        // Starting inside a range takes it; ending where one starts does not.
        assert_eq!(ids(0x10ff, 0x1f01), vec![0, 1]);
        assert_eq!(ids(0x1100, 0xf00), Vec::<u64>::new());
        let mid = 0x1000 * (MAX_CHUNK as u64 + 1);
        assert_eq!(
            ids(mid - 0x2000, 0x5000),
            (MAX_CHUNK as u64 - 2..MAX_CHUNK as u64 + 3).collect::<Vec<_>>()
        );
        assert_eq!(ids(0x1000 * (n + 1), 0x1000), Vec::<u64>::new());
        assert_eq!(s.overlapping(0, u64::MAX).count() as u64, n);
    }

    #[test]
    fn finds_containing_range_and_rejects_gaps() {
        let ix = AllocIndex::default();
        assert!(ix.insert(r(0x1000, 0x100, 1)).is_empty());
        assert!(ix.insert(r(0x3000, 0x10, 3)).is_empty());
        assert!(ix.insert(r(0x2000, 0x800, 2)).is_empty());
        let s = ix.snapshot();
        assert_eq!(s.len(), 3);
        assert_eq!(s.find_id(0x0fff), None);
        assert_eq!(s.find_id(0x1000), Some(1));
        assert_eq!(s.find_id(0x10ff), Some(1));
        assert_eq!(s.find_id(0x1100), None);
        assert_eq!(s.find_id(0x27ff), Some(2));
        assert_eq!(s.find_id(0x2800), None);
        assert_eq!(s.find_id(0x300f), Some(3));
        assert_eq!(s.find_id(0x3010), None);
        assert_eq!(s.find_id(u64::MAX), None);
        assert_eq!(s.find(0x2004), Some(r(0x2000, 0x800, 2)));
    }

    #[test]
    fn remove_takes_only_exact_starts() {
        let ix = AllocIndex::default();
        ix.insert(r(0x1000, 0x100, 1));
        ix.insert(r(0x2000, 0x100, 2));
        assert_eq!(ix.remove(0x1008), None);
        assert_eq!(ix.remove(0x1000), Some(r(0x1000, 0x100, 1)));
        assert_eq!(ix.remove(0x1000), None);
        let s = ix.snapshot();
        assert_eq!(s.find_id(0x1000), None);
        assert_eq!(s.find_id(0x2000), Some(2));
    }

    #[test]
    fn overlapping_insert_displaces_stale_ranges() {
        let ix = AllocIndex::default();
        ix.insert(r(0x1000, 0x100, 1));
        ix.insert(r(0x1100, 0x100, 2));
        ix.insert(r(0x2000, 0x100, 3));
        let displaced = ix.insert(r(0x10f0, 0x20, 4));
        assert_eq!(displaced, vec![r(0x1000, 0x100, 1), r(0x1100, 0x100, 2)]);
        let s = ix.snapshot();
        assert_eq!(s.iter().map(|r| r.id).collect::<Vec<_>>(), vec![4, 3]);
        assert_eq!(s.find_id(0x1000), None);
        assert_eq!(s.find_id(0x10f0), Some(4));
    }

    #[test]
    fn old_snapshots_stay_valid_while_the_index_changes() {
        let ix = AllocIndex::default();
        ix.insert(r(0x1000, 0x100, 1));
        let before = ix.snapshot();
        ix.remove(0x1000);
        assert_eq!(before.find_id(0x1000), Some(1));
        assert_eq!(ix.snapshot().find_id(0x1000), None);
    }

    /// The structural invariants every published snapshot keeps.
    fn check(s: &Snapshot) {
        assert_eq!(s.firsts.len(), s.chunks.len());
        let mut prev_end = 0;
        for (c, chunk) in s.chunks.iter().enumerate() {
            assert!(
                chunk.len() > 0 && chunk.len() <= MAX_CHUNK,
                "chunk {c} has {}",
                chunk.len()
            );
            assert_eq!(s.firsts[c], chunk.starts[0]);
            for r in chunk.ranges() {
                assert!(
                    r.start >= prev_end,
                    "unsorted or overlapping at {:#x}",
                    r.start
                );
                prev_end = r.end();
            }
        }
        assert_eq!(s.len(), s.iter().count());
    }

    #[test]
    fn agrees_with_a_linear_search_on_random_ranges() {
        // A small deterministic generator keeps the test reproducible without a dependency.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let ix = AllocIndex::default();
        let mut model: Vec<Range> = Vec::new();
        let base = 0x7f00_0000_0000u64;
        for id in 1..6000u64 {
            // Grow to about a thousand live ranges, then churn; remove in bursts so that
            // chunks also shrink and merge.
            let removals = if id % 1000 < 100 {
                3
            } else {
                usize::from(next() % 4 == 0)
            };
            for _ in 0..removals {
                if model.is_empty() {
                    break;
                }
                let victim = model.remove((next() % model.len() as u64) as usize);
                assert_eq!(ix.remove(victim.start), Some(victim));
            }
            let start = base + (next() % 65536) * 512;
            let len = 1 + next() % if id % 97 == 0 { 1 << 20 } else { 4096 };
            let new = r(start, len, id);
            let mut displaced = ix.insert(new);
            let mut expect: Vec<Range> =
                model.iter().copied().filter(|m| m.overlaps(&new)).collect();
            model.retain(|m| !m.overlaps(&new));
            model.push(new);
            displaced.sort_by_key(|r| r.start);
            expect.sort_by_key(|r| r.start);
            assert_eq!(displaced, expect, "insert #{id}");
            if id % 250 == 0 {
                let s = ix.snapshot();
                check(&s);
                assert_eq!(s.len(), model.len());
                for _ in 0..2_000 {
                    let addr = base + next() % (65536 * 512 + (1 << 20));
                    let want = model
                        .iter()
                        .find(|m| m.start <= addr && addr < m.end())
                        .map(|m| m.id);
                    assert_eq!(s.find_id(addr), want, "{addr:#x}");
                }
                for m in &model {
                    assert_eq!(s.find_id(m.start), Some(m.id));
                    assert_eq!(s.find_id(m.end() - 1), Some(m.id));
                }
            }
        }
        let chunks = ix.snapshot().chunks.len();
        assert!(
            chunks > 4,
            "the test must exercise several chunks ({} live, {chunks} chunks)",
            model.len()
        );
    }

    #[test]
    fn readers_see_whole_snapshots_while_writers_churn() {
        let ix = AllocIndex::default();
        // Anchors stay live throughout; churn happens between and around them.
        let anchors: Vec<Range> = (0..64)
            .map(|i| r(0x10_0000 + i * 0x10000, 0x100, 1_000_000 + i))
            .collect();
        for a in &anchors {
            ix.insert(*a);
        }
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut seed = 7u64;
                let mut live = Vec::new();
                for id in 1..20_000u64 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    // Churn only in the gaps after each anchor's 0x100 bytes.
                    let slot = seed % 64;
                    let start = 0x10_0000 + slot * 0x10000 + 0x1000 + (seed >> 8) % 0x8000;
                    let range = r(start, 1 + (seed >> 20) % 0x100, id);
                    let displaced = ix.insert(range);
                    live.retain(|x: &Range| !displaced.contains(x));
                    live.push(range);
                    if live.len() > 300 {
                        let victim = live.swap_remove((seed % 300) as usize);
                        assert_eq!(ix.remove(victim.start), Some(victim));
                    }
                }
                stop.store(true, std::sync::atomic::Ordering::Release);
            });
            for _ in 0..2 {
                scope.spawn(|| {
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Acquire) || n == 0 {
                        let s = ix.snapshot();
                        for a in &anchors {
                            assert_eq!(s.find_id(a.start + (n % 0x100)), Some(a.id));
                            // Between an anchor's end and the churn area nothing is ever live.
                            assert_eq!(s.find_id(a.end() + 0x10), None);
                        }
                        n += 1;
                    }
                });
            }
        });
    }
}
