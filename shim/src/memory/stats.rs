//! Swap statistics of one process, as the manager counts them.
//!
//! `stall_ns` is host time spent inside `prepare_access` calls that had to bring pages in or
//! wait for them (the launch could not be queued before that), from the call to its return:
//! the waits and driver calls made without the manager's lock on the way included. The extra
//! time the GPU spends waiting on the swap-in event is not measured here.

/// Counters kept by the memory manager.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub bytes_to_host: u64,
    pub bytes_to_device: u64,
    /// Accesses (launches, copies, memsets) that had to wait for a swap-in.
    pub stalled_launches: u64,
    pub stall_ns: u64,
    /// Most device bytes mapped at arena pages at once.
    pub peak_resident_bytes: u64,
    /// Pinned host memory created for the pool.
    pub host_pool_bytes: u64,
    /// Pages evicted (device → host).
    pub pages_evicted: u64,
    /// Pages brought back (host → device).
    pub pages_swapped_in: u64,
    /// Times a request found every evictable page pinned by other threads' in-flight calls
    /// and waited (without the lock) for pins to drop.
    pub pin_waits: u64,
    /// Pages on the device that planned swap-outs named.
    pub planned_out_named: u64,
    /// Pages planned swap-outs took besides those (the rest of their units: a unit leaves
    /// whole), by whether an allocation still held them.
    pub planned_out_unnamed_live: u64,
    pub planned_out_unnamed_dead: u64,
    /// Pages evicted on the manager's own choice (not named by a plan), by what needed the
    /// frames: what a plan did not foresee shows here.
    pub evicted_for: EvictedFor,
    /// Pages brought in because an access found them on the host (not prefetched).
    pub pages_in_on_demand: u64,
    /// Pages a prefetch named that were still on their way out (`ToHost`) when it came: the
    /// host runs ahead of the device, so a prefetch can come before the swap-out it undoes
    /// has copied anything (those pages are left to leave, and an access reads them back).
    pub prefetch_pages_leaving: u64,
    /// Pages read back into the frames of a unit still on its way out, the copy in ordered
    /// after its copy out on the device (`manager/handover.rs`).
    pub pages_handed_over: u64,
    /// Pages whose swap-out an access cancelled (it needed them before the swap-out was
    /// completed): the host pays nothing, but the copy out, queued or done, was for nothing.
    pub pages_out_cancelled: u64,
    /// Times one of the application's threads found the manager's lock held, and how long
    /// such waits took in all (`MemoryManager::lock`); the same for the library's own threads
    /// (maintenance, plan executor: named `tensile-…`).
    pub app_lock_waits: u64,
    pub app_lock_wait_ns: u64,
    pub library_lock_waits: u64,
    pub library_lock_wait_ns: u64,
    /// Times an operation that had used up its unlocked rounds waited for copies or fences,
    /// or made a swap's VMM calls, with the manager's lock held: every other thread that
    /// wanted the lock waited with it. Bounded retries end there; a large swap should not.
    pub locked_waits: u64,
    /// Gauges, as of the snapshot: device frames in use, and those of them holding pages no
    /// allocation holds any more.
    pub frames_in_use: u64,
    pub dead_device_pages: u64,
}

/// Pages the manager evicted of its own choice, by what wanted the frames (see
/// [`Demand`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EvictedFor {
    pub access: u64,
    pub prefetch: u64,
    pub allocation: u64,
    pub reserve: u64,
    pub budget: u64,
}

impl EvictedFor {
    pub fn add(&mut self, demand: Demand, pages: u64) {
        let counter = match demand {
            Demand::Access => &mut self.access,
            Demand::Prefetch => &mut self.prefetch,
            Demand::Allocation => &mut self.allocation,
            Demand::Reserve => &mut self.reserve,
            Demand::Budget => &mut self.budget,
        };
        *counter += pages;
    }
}

/// What the manager is finding device frames for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Demand {
    /// A launch, copy or memset touching pages on the host.
    #[default]
    Access,
    /// A prefetch (a plan's, ahead of use).
    Prefetch,
    /// A new allocation's pages.
    Allocation,
    /// The free reserve kept ahead of need.
    Reserve,
    /// A smaller budget.
    Budget,
}

impl From<MemoryStats> for tensile_trace::Stats {
    fn from(s: MemoryStats) -> Self {
        tensile_trace::Stats {
            bytes_to_host: s.bytes_to_host,
            bytes_to_device: s.bytes_to_device,
            stalled_launches: s.stalled_launches,
            stall_ns: s.stall_ns,
            peak_resident_bytes: s.peak_resident_bytes,
            host_pool_bytes: s.host_pool_bytes,
        }
    }
}
