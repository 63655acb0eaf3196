//! The records of a trace: what happened in the process, in call order.
//!
//! Times (`t_ns`) are nanoseconds since the trace started, on the host clock, taken when the
//! application made the call. Streams are the handle values as the application passed them
//! (`0` is the legacy default stream). Allocations are named by ids unique within a trace;
//! pointers appear only in [`Alloc`], so accesses stay small and stable across runs.

use serde::{Deserialize, Serialize};

/// One event of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// Always the first record.
    Header(Header),
    /// Names a kernel id; written before the first launch that uses the id.
    Kernel(KernelInfo),
    /// A device allocation the application made.
    Alloc(Alloc),
    /// An allocation was freed (for stream-ordered frees: when the free was enqueued).
    Free(Free),
    /// A kernel launch and the allocations its parameters point into.
    Launch(Launch),
    /// The measured GPU duration of an earlier launch; may come much later, or never.
    LaunchTime(LaunchTime),
    /// A memory copy.
    Copy(Copy),
    /// A memset.
    Memset(Memset),
    /// The host waited for the device.
    Sync(Sync),
    /// Swap statistics, written at exit.
    Stats(Stats),
    /// Clean close. Absent when the process died.
    End(End),
    /// The library queued a copy of pages between the device and its host pool (format 2;
    /// where the pages are since format 3).
    Swap(Swap),
    /// Host time the library spent on a call of the application's or on its own threads
    /// (format 2).
    Busy(Busy),
    /// A plan came into force or was dropped (format 2).
    Plan(PlanChange),
}

/// Who wrote the trace, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Equal to [`crate::FORMAT_VERSION`] for files this crate writes.
    pub format_version: u16,
    /// Process id of the traced program.
    pub pid: u32,
    /// Wall-clock start of the trace, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    /// The library that wrote it, e.g. `libtensile 0.1.0`.
    pub producer: String,
    /// The traced program's command line.
    pub command: String,
}

/// A kernel handle, numbered by the recorder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInfo {
    pub id: u32,
    /// The (mangled) name the driver reports.
    pub name: String,
    pub nparams: u32,
}

/// Which driver call made an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AllocKind {
    /// `cuMemAlloc_v2`
    Sync,
    /// `cuMemAllocPitch_v2`
    Pitch,
    /// `cuMemAllocAsync`
    Async,
    /// `cuMemAllocFromPoolAsync`
    Pool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alloc {
    pub t_ns: u64,
    pub stream: u64,
    pub id: u64,
    pub ptr: u64,
    pub bytes: u64,
    pub kind: AllocKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Free {
    pub t_ns: u64,
    pub stream: u64,
    pub id: u64,
}

/// One parameter word of a launch that pointed into a live allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Access {
    /// Allocation id.
    pub alloc: u64,
    /// Byte offset of the word within the launch's parameter buffer.
    pub param_offset: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub t_ns: u64,
    pub stream: u64,
    /// Launch number within the process, from 0.
    pub seq: u64,
    /// A [`KernelInfo::id`].
    pub kernel: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub smem: u32,
    /// Every parameter word that pointed into a live allocation (an allocation may repeat).
    pub accesses: Vec<Access>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchTime {
    pub seq: u64,
    pub gpu_ns: u64,
}

/// Direction of a copy, as the driver call states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CopyKind {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
    /// `cuMemcpy`/`cuMemcpyAsync`: direction inferred from the pointers.
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Copy {
    pub t_ns: u64,
    pub stream: u64,
    pub kind: CopyKind,
    /// Allocation id of the destination; 0 for host or untracked memory.
    pub dst: u64,
    /// Allocation id of the source; 0 for host or untracked memory.
    pub src: u64,
    pub bytes: u64,
    pub asynchronous: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memset {
    pub t_ns: u64,
    pub stream: u64,
    /// Allocation id; 0 for untracked memory.
    pub dst: u64,
    pub bytes: u64,
    pub asynchronous: bool,
}

/// What the host waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SyncScope {
    Stream(u64),
    Event(u64),
    Context,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sync {
    pub t_ns: u64,
    pub scope: SyncScope,
}

/// Per-process swap statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub bytes_to_host: u64,
    pub bytes_to_device: u64,
    /// Launches that waited for a swap-in.
    pub stalled_launches: u64,
    pub stall_ns: u64,
    pub peak_resident_bytes: u64,
    pub host_pool_bytes: u64,
}

/// Which way a swap moved pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SwapDir {
    /// Device to the host pool (a swap-out).
    ToHost,
    /// Host pool to the device (a swap-in).
    ToDevice,
}

/// Why the library moved pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SwapCause {
    /// A plan's step named them (a planned swap-out, or a prefetch).
    Plan,
    /// An access (launch, copy, memset) found them on the host and waited for them; or, out,
    /// the frames were wanted for such an access.
    Access,
    /// Out: the frames were wanted for a prefetch.
    Prefetch,
    /// Out: the frames were wanted for a new allocation's pages.
    Allocation,
    /// Out: the free reserve kept ahead of need.
    Reserve,
    /// Out: the budget shrank.
    Budget,
}

/// One copy the library queued (on its own stream for that direction) and the pages it
/// moves. Written when the copy is queued: when the device ran it is not measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Swap {
    pub t_ns: u64,
    pub dir: SwapDir,
    pub cause: SwapCause,
    /// Pages that change place (a unit moves whole).
    pub pages: u32,
    /// Bytes copied: pages no allocation holds any more move without a copy.
    pub bytes: u64,
    /// Where those pages are, as runs of consecutive pages: the address of each run's first
    /// page (an address of the library's arena, as in [`Alloc::ptr`]) and its pages, in page
    /// order. Empty in format 2, which did not record them.
    pub runs: Vec<(u64, u32)>,
}

/// What the library spent host time on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BusyKind {
    /// An access of the application's waited for pages to be brought in (or for frames): the
    /// whole call, waits and driver calls included.
    Stall,
    /// The driver calls that remap pages whose swap-in was decided (made without the lock).
    RemapIn,
    /// The driver calls that complete landed swap-outs (made without the lock).
    RemapOut,
    /// Pinning host memory for the pool.
    HostPin,
    /// Waiting for the memory manager's lock, which another thread held.
    LockWait,
    /// A call that is not a stalled access (an allocation, an access whose pages were on the
    /// device, a prefetch, a budget change) stopped for the library's own work: swap-outs to
    /// land or be completed, pinned pages, host memory. The whole call.
    Waited,
}

/// A span of host time the library spent, on the thread named by its kernel thread id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Busy {
    pub t_ns: u64,
    pub dur_ns: u64,
    pub kind: BusyKind,
    /// The thread's id (`gettid`).
    pub thread: u32,
    /// Pages concerned, where the kind has any (0 otherwise).
    pub pages: u32,
}

/// A plan came into force or was dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanChange {
    pub t_ns: u64,
    /// The plan's version, as the executor numbers them (from 1).
    pub version: u64,
    /// Launches the process had made when it happened.
    pub launches: u64,
    pub change: PlanChangeKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlanChangeKind {
    /// The plan was loaded, to apply from the launch numbered `applies_from` (an iteration
    /// boundary), in a process whose memory manager moves pages of `page_bytes`: its encoding
    /// (`tensile_protocol::ExecPlan::encode`).
    Loaded {
        applies_from: u64,
        page_bytes: u64,
        plan: Vec<u8>,
    },
    /// The plan was dropped, and why.
    Dropped { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    pub t_ns: u64,
    /// Records the recorder had to drop (its queue was full); 0 in a complete trace.
    pub dropped_records: u64,
}

impl Record {
    /// The host time of the event, for records that have one.
    pub fn t_ns(&self) -> Option<u64> {
        match self {
            Record::Alloc(r) => Some(r.t_ns),
            Record::Free(r) => Some(r.t_ns),
            Record::Launch(r) => Some(r.t_ns),
            Record::Copy(r) => Some(r.t_ns),
            Record::Memset(r) => Some(r.t_ns),
            Record::Sync(r) => Some(r.t_ns),
            Record::End(r) => Some(r.t_ns),
            Record::Swap(r) => Some(r.t_ns),
            Record::Busy(r) => Some(r.t_ns),
            Record::Plan(r) => Some(r.t_ns),
            Record::Header(_) | Record::Kernel(_) | Record::LaunchTime(_) | Record::Stats(_) => {
                None
            }
        }
    }
}
