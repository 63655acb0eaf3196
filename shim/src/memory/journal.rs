//! The manager's journal: each copy it queues between the device and the host pool, and each
//! span of host time it spends (stalled accesses, remaps, pinning host memory, waits for its
//! lock), told as they happen to whoever listens: the trace, when one is written
//! (`Record::Swap`, `Record::Busy`). The counters of [`super::MemoryStats`] say how much; the
//! journal says when, so a timeline can show what the GPU waited for.
//!
//! Mechanism only: the manager says what it did, the listener decides what to keep. Without a
//! listener the manager pays one branch per event (and the two clock reads a remap takes
//! anyway).

use std::time::Instant;

pub use tensile_trace::{BusyKind, SwapCause, SwapDir};

use super::stats::Demand;

/// Listens to the manager's journal. Called with the manager's lock held, on the thread that
/// did the work: it must not block (a full queue drops).
pub trait Journal: Send + Sync {
    /// A copy of the pages in `runs` (runs of consecutive pages: the address of the first, and
    /// how many), `bytes` of them copied, was queued at `at`.
    fn swap(&self, at: Instant, dir: SwapDir, cause: SwapCause, runs: &[(u64, u32)], bytes: u64);
    /// The calling thread spent `start..end` on `kind`, concerning `pages` pages.
    fn busy(&self, start: Instant, end: Instant, kind: BusyKind, pages: usize);
}

/// Why pages were evicted for a [`Demand`].
pub fn eviction_cause(demand: Demand) -> SwapCause {
    match demand {
        Demand::Access => SwapCause::Access,
        Demand::Prefetch => SwapCause::Prefetch,
        Demand::Allocation => SwapCause::Allocation,
        Demand::Reserve => SwapCause::Reserve,
        Demand::Budget => SwapCause::Budget,
    }
}

/// A journal that keeps everything, for tests.
#[cfg(test)]
#[derive(Default)]
pub struct Kept {
    /// Direction, cause, pages, bytes, and the pages as runs.
    #[allow(clippy::type_complexity)]
    pub swaps: std::sync::Mutex<Vec<(SwapDir, SwapCause, usize, u64, Vec<(u64, u32)>)>>,
    pub busy: std::sync::Mutex<Vec<(BusyKind, usize, std::time::Duration)>>,
}

#[cfg(test)]
impl Journal for Kept {
    fn swap(&self, _at: Instant, dir: SwapDir, cause: SwapCause, runs: &[(u64, u32)], bytes: u64) {
        let pages = runs.iter().map(|&(_, n)| n as usize).sum();
        self.swaps
            .lock()
            .unwrap()
            .push((dir, cause, pages, bytes, runs.to_vec()));
    }

    fn busy(&self, start: Instant, end: Instant, kind: BusyKind, pages: usize) {
        self.busy
            .lock()
            .unwrap()
            .push((kind, pages, end.duration_since(start)));
    }
}
