//! A job's floor: the device memory its largest launch needs resident at once, learned from
//! its event stream. Below it the job cannot run a step however it swaps, so the coordinator
//! never squeezes a job under it and says when even that cannot be had.

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
            page: page_bytes,
        }
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

    /// The floor in bytes (0 while no launch touched a known allocation).
    pub fn floor(&self) -> u64 {
        self.largest
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
