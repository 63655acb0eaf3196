//! The shim's memory manager: application allocations served from a VMM arena, a device
//! budget, and on-demand (LRU) swapping of 2 MiB pages to a pinned host pool.
//!
//! The interposition layer calls [`MemoryManager`] from its hooks: `alloc`/`free` for the
//! allocating calls, `prepare_access` + `note_access_done` around every launch, copy and
//! memset that touches arena memory, `mem_get_info` for `cuMemGetInfo`. Everything the
//! manager asks of the driver goes through the [`Driver`] trait, so it is tested on the
//! in-memory `fake::FakeDriver` (tests only) and on the simulated GPU ([`cuda::DlDriver`]).
//!
//! Not here (yet): the hooks themselves, PyTorch specifics, the planned (non-LRU) policy,
//! pinning of IPC-exported or peer-mapped memory. See `docs/memory.md`.
//!
//! | module | concept |
//! | --- | --- |
//! | [`advice`] | which pages to evict first, from a policy that knows the future |
//! | [`budget`] | parsing `TENSILE_DEVICE_MEMORY` / `TENSILE_HOST_MEMORY` |
//! | [`driver`] | the driver operations the manager needs |
//! | `fake` | an in-memory driver for tests (built for tests only) |
//! | [`cuda`] | the trait over a dynamically loaded `libcuda.so.1` |
//! | [`table`] | the trait over a table of the driver's function pointers |
//! | [`page`] | the per-page residency state machine and page table |
//! | [`frames`] | device frames within the budget; the pinned host pool |
//! | [`extent`] | best-fit free extents |
//! | [`suballoc`] | carving allocations out of the arena, stream-ordered reuse |
//! | [`failures`] | out-of-memory failures by cause: log once, count, summarize |
//! | [`fences`] | per-stream fences: which queued work has finished |
//! | [`journal`] | each swap and span of host time, told as it happens (to the trace) |
//! | [`manager`] | the manager tying these together |
//! | [`stats`] | swap statistics |

pub mod advice;
pub mod budget;
pub mod cuda;

pub mod driver;
pub mod extent;
pub mod failures;
/// Test-only: not in the library's production build.
#[cfg(test)]
pub mod fake;
pub mod fences;
pub mod frames;
pub mod journal;
pub mod manager;
pub mod page;
pub mod stats;
pub mod suballoc;
pub mod table;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod bench;

#[cfg(test)]
mod vmm_count;

pub use budget::{parse_size, BudgetError, SizeSpec};
pub use driver::{Driver, Event, PhysHandle, PhysLocation, Stream};
pub use failures::FailureCause;
pub use journal::Journal;
pub use manager::{AccessTicket, ManagerConfig, MemoryManager};
pub use page::{PageTable, ResidencyState};
pub use stats::{Demand, EvictedFor, MemoryStats};
