//! Advice on which pages to evict, from a policy that knows the future.
//!
//! The manager evicts what it must to serve an access it was not told about ahead of time
//! (an on-demand fetch, a prefetch with no room left). On its own it takes the least recently
//! used page, which in a repeating training iteration is the page needed next. A policy that
//! knows the iteration (the plan executor) can say, for each resident page, how many launches
//! remain until it is needed again; the manager then evicts the page needed last (Belady's
//! choice). Mechanism and policy stay apart: the manager asks, the adviser answers, and the
//! manager still decides only among pages it may evict.

use tensile_driver_abi::CUdeviceptr;

/// When a page is needed next, as an adviser sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NextUse {
    /// Nothing the adviser knows uses it again: evict it first (oldest first among these).
    Never,
    /// Used again in this many launches (0: by the next launch made).
    In(u32),
    /// The adviser cannot say (memory it knows nothing of): the page is ranked least
    /// recently used first among such pages, after every page the adviser can place.
    Unknown,
}

/// Asked, with the manager's lock held, each time the manager chooses pages to evict.
///
/// An implementation must not call back into the memory manager (it would deadlock), and
/// should be cheap per page: it is on the path of an access that waits for room (the manager
/// asks about a sample of at most `ManagerConfig::advice_sample` pages).
pub trait EvictionAdvice: Send + Sync {
    /// Fills `out` with one answer per page of `pages` (addresses of page starts, each page
    /// `page_bytes` long), or returns `false` without touching it when it has no advice now
    /// (the manager then evicts least recently used first).
    fn next_uses(&self, pages: &[CUdeviceptr], page_bytes: u64, out: &mut Vec<NextUse>) -> bool;
}
