//! A job's floor: the device memory its largest launch needs resident at once, learned from
//! its event stream. Below it the job cannot run a step however it swaps, so the coordinator
//! never squeezes a job under it and says when even that cannot be had.
//!
//! A launch's needs are known only once it is made, so a job's floor is learned during its
//! first iteration. Where an earlier run of the same command left its floor
//! ([`crate::coordinator::remembered`]), that floor counts from the job's first tick until its
//! own iteration has been seen ([`FloorTracker::settle`]): a job that cannot fit is told as it
//! starts, not at the first launch that cannot run.

use std::collections::HashMap;

use tensile_protocol::DEFAULT_PAGE_BYTES;
use tensile_trace::Record;

/// Pages the shim needs beyond a launch's own: a swap in flight while the launch's pages come
/// in, so that one launch at the floor can always make progress.
const SLACK_PAGES: u64 = 2;

/// Follows a job's allocations and launches.
#[derive(Debug)]
pub struct FloorTracker {
    /// Live allocations by id: bytes.
    sizes: HashMap<u64, u64>,
    /// The largest floor seen so far.
    largest: u64,
    /// The floor an earlier run of the same command left, until this run's is known (0: none).
    remembered: u64,
    /// Whether the job's own iteration has been seen.
    settled: bool,
    /// The job's page.
    page: u64,
}

impl Default for FloorTracker {
    fn default() -> FloorTracker {
        FloorTracker::new(DEFAULT_PAGE_BYTES)
    }
}

impl FloorTracker {
    /// A tracker for a job whose memory manager's page is `page_bytes` ([`JobSnapshot::page`]).
    ///
    /// [`JobSnapshot::page`]: tensile_protocol::JobSnapshot::page
    pub fn new(page_bytes: u64) -> FloorTracker {
        FloorTracker {
            sizes: HashMap::new(),
            largest: 0,
            remembered: 0,
            settled: false,
            page: page_bytes,
        }
    }

    /// Counts `bytes`, the floor an earlier run of the job's command left, until
    /// [`Self::settle`].
    pub fn remember(&mut self, bytes: u64) {
        self.remembered = bytes;
    }

    /// The job's own iteration has been seen: its floor is what it launched, from now on.
    pub fn settle(&mut self) {
        self.remembered = 0;
        self.settled = true;
    }

    /// What to remember of this run for the next run of its command: its own floor once its
    /// iteration was seen, else the larger of what it launched and what was remembered (a run
    /// that stopped early saw part of its launches). 0: nothing to remember.
    pub fn to_remember(&self) -> u64 {
        if self.settled {
            self.largest
        } else {
            self.floor()
        }
    }

    /// Whether the floor counts one remembered from an earlier run.
    pub fn is_remembered(&self) -> bool {
        self.remembered > self.largest
    }

    pub fn push(&mut self, record: &Record) {
        match record {
            Record::Alloc(a) => {
                self.sizes.insert(a.id, a.bytes);
            }
            Record::Free(f) => {
                self.sizes.remove(&f.id);
            }
            Record::Launch(l) => {
                let mut ids: Vec<u64> = l.accesses.iter().map(|a| a.alloc).collect();
                ids.sort_unstable();
                ids.dedup();
                // Allocations it never heard of (made before a coordinator joined and not
                // announced, or lost with a full ring) count for nothing: the floor is a
                // lower bound.
                let sizes: Vec<u64> = ids
                    .iter()
                    .filter_map(|id| self.sizes.get(id))
                    .copied()
                    .collect();
                self.largest = self.largest.max(launch_floor(&sizes, self.page));
            }
            _ => {}
        }
    }

    /// The floor in bytes: the largest launch seen, or the remembered floor if larger until
    /// the job's iteration is known (0 while neither is).
    pub fn floor(&self) -> u64 {
        self.largest.max(self.remembered)
    }
}

/// Device bytes the shim needs for one launch touching allocations of `sizes`, in pages of
/// `page` bytes: each allocation of a page or more whole pages (its tail holds a page of its
/// own), the small ones packed together, and the slack of [`SLACK_PAGES`].
pub fn launch_floor(sizes: &[u64], page: u64) -> u64 {
    if sizes.is_empty() {
        return 0;
    }
    let (large, small): (Vec<u64>, Vec<u64>) = sizes.iter().partition(|&&b| b >= page);
    let large_pages: u64 = large.iter().map(|b| b.div_ceil(page)).sum();
    let small_pages = small.iter().sum::<u64>().div_ceil(page);
    (large_pages + small_pages + SLACK_PAGES) * page
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_trace::{Access, Alloc, AllocKind, Free, Launch};

    fn alloc(id: u64, bytes: u64) -> Record {
        Record::Alloc(Alloc {
            t_ns: 0,
            stream: 0,
            id,
            ptr: id << 32,
            bytes,
            kind: AllocKind::Async,
        })
    }

    fn launch(ids: &[u64]) -> Record {
        Record::Launch(Launch {
            t_ns: 0,
            stream: 0,
            seq: 0,
            kernel: 0,
            grid: [1; 3],
            block: [1; 3],
            smem: 0,
            accesses: ids
                .iter()
                .map(|&alloc| Access {
                    alloc,
                    param_offset: 0,
                })
                .collect(),
        })
    }

    #[test]
    fn the_floor_is_the_largest_launch_in_pages_with_slack() {
        const MIB: u64 = 1 << 20;
        let mut t = FloorTracker::default();
        assert_eq!(t.floor(), 0);
        for r in [
            alloc(1, 5 * MIB),
            alloc(2, 64 << 10),
            alloc(3, 64 << 10),
            alloc(4, 100 * MIB),
        ] {
            t.push(&r);
        }
        // 5 MiB: 3 pages; two 64 KiB share one; 2 of slack. The same id twice counts once.
        t.push(&launch(&[1, 2, 3, 1]));
        assert_eq!(t.floor(), (3 + 1 + 2) * DEFAULT_PAGE_BYTES);
        t.push(&launch(&[4]));
        assert_eq!(t.floor(), (50 + 2) * DEFAULT_PAGE_BYTES);
    }

    #[test]
    fn a_remembered_floor_counts_until_the_jobs_own_iteration_is_seen() {
        const MIB: u64 = 1 << 20;
        let mut t = FloorTracker::default();
        t.remember(200 * MIB);
        assert_eq!(t.floor(), 200 * MIB);
        assert!(t.is_remembered());
        t.push(&alloc(1, 100 * MIB));
        t.push(&launch(&[1]));
        assert_eq!(t.floor(), 200 * MIB, "the first launches do not replace it");
        // This run's program changed: its own floor, smaller, is the one once its
        // iteration is known.
        assert_eq!(t.to_remember(), 200 * MIB, "a run that stopped early");
        t.settle();
        assert!(!t.is_remembered());
        assert_eq!(t.floor(), 52 * DEFAULT_PAGE_BYTES);
        assert_eq!(t.to_remember(), 52 * DEFAULT_PAGE_BYTES);
        // Smaller launches and unknown or freed allocations do not lower or raise it.
        t.push(&Record::Free(Free {
            t_ns: 0,
            stream: 0,
            id: 4,
        }));
        t.push(&launch(&[4, 99]));
        t.push(&launch(&[2]));
        assert_eq!(t.floor(), (50 + 2) * DEFAULT_PAGE_BYTES);
    }
}
