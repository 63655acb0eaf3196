//! The memory manager: application allocations on the arena, the device budget, and
//! on-demand LRU swapping to the pinned host pool.
//!
//! # Invariants (each test in `tests.rs` checks them)
//! 1. **Pointers never move.** An allocation's virtual range is fixed from `alloc` to `free`;
//!    swapping changes what physical memory backs its pages, never the address.
//! 2. **Every page of a live allocation is mapped and accessible** (to a device or a host
//!    frame), so even an access the manager did not predict reads and writes the right bytes;
//!    except that while a leaving unit's frames are handed over to pages read back
//!    (`handover.rs`), the victim's address maps the reader's frame until its completion.
//! 3. **The budget holds.** Device memory is created only through [`DevicePool`], which never
//!    exceeds the budget.
//! 4. **No remap under queued work.** A page is unmapped only when idle: not pinned by a
//!    `prepare_access` whose work is not yet reported, and every fence after its recorded uses
//!    completed. Copy states end only after their copy's event completed.
//! 5. **No byte is lost.** A page leaves the device only through a completed copy to its host
//!    frame; it returns through a copy ordered before any work that asked for it
//!    (`stream_wait_event` on the app's stream). A page with no live allocation holds no data
//!    anyone can ask for, so it may be dropped without a copy.
//! 6. **Units move whole.** The driver maps and unmaps only whole physical allocations, and a
//!    page's device frame is part of a *unit*, one allocation of one or more pages mapped at
//!    consecutive pages ([`DevicePool`]). All pages of a unit are in the same state (with
//!    the same copy event while one runs) and change state together: they are evicted,
//!    dropped, cancelled and brought in as one.
//! 7. **Stream-ordered reuse.** Memory freed on stream S is reused by another stream only
//!    after the fence promised at the free has completed (see [`Suballocator`]).
//!
//! # Locking
//! One mutex around all state. The hot path (everything already resident) takes it once,
//! makes no driver call and allocates one small vector for the ticket. Swaps are started with
//! the lock held; the host pool has its own lock, taken after this one, and its grower thread
//! never takes this one. Waits are made *without* the lock, each bounded, and the operation
//! starts over after them (`MemoryManager::waiting_for_pins`): for pages pinned by other
//! threads' calls in flight (an operation that finds every evictable page pinned gives back
//! what it took and waits on `pins_released`), for swap-out copies to land (`copy_waits`),
//! for another thread's remap of pages it needs (`remap_stall`) and for the budget to grow
//! (`budget_stall`). The VMM calls that complete swap-outs (`completion.rs`,
//! `MemoryManager::complete`), those of swap-ins (`arrival.rs`, `MemoryManager::arrive`) and
//! those of a new allocation's first backing (`first_backing.rs`, `MemoryManager::alloc`:
//! its maps, and the unmaps of the dead units whose frames it takes), and host memory pinned
//! for swap-outs (`host_wanted`), are made without the lock too. Re-cutting device units
//! (a `cuMemRelease` and a `cuMemCreate`) and dropping dead units for an eviction are still
//! made with it held.
//!
//! # Files
//! This file holds the public front ([`MemoryManager`]: the lock, and the waits made without
//! it, for pinned pages, for the budget to grow and for swap-out copies) and the state
//! (`Inner`'s fields); `impl Inner` is split by concern into the child modules:
//!
//! | file | concern |
//! | --- | --- |
//! | `allocation.rs` | `alloc` and `free`: arena ranges and their first backing |
//! | `backing.rs` | frames mapped at pages, dropped without a copy, released at shutdown |
//! | `units.rs` | which unit a page is in; cutting and re-cutting units |
//! | `access.rs` | `prepare_access` / `note_access_done`, pins, capture pins |
//! | `export.rs` | allocations pinned for other processes, and the units behind them |
//! | `eviction.rs` | finding device frames: cheap ones, LRU or advised victims, the reserve |
//! | `swap.rs` | the copies to and from the host, their events, `poll` and waits |
//! | `completion.rs` | completing landed swap-outs (their VMM calls) without the lock |
//! | `arrival.rs` | swap-ins (their VMM calls, copies and event) without the lock |
//! | `handover.rs` | a read-back taking a leaving unit's frames, ordered on the device |
//! | `first_backing.rs` | a new allocation's maps (and its dead units' unmaps) without the lock |
//! | `verbs.rs` | swap out, prefetch and budget changes for a planned policy |
//! | `audit.rs` | the bookkeeping check tests run |

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tensile_driver_abi::{
    CUdeviceptr, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
};

use super::advice::EvictionAdvice;
use super::driver::{Driver, Event, Stream};
use super::failures::{human_bytes, FailureCause, FailureLog};
use super::fences::Fences;
use super::frames::{
    DevFrame, DevicePool, HostFrame, HostPool, HostPoolConfig, HostPoolRefill, SharedHostCap,
};
use super::journal::{BusyKind, Journal};
use super::page::{Frame, PageTable, ResidencyState};
use super::stats::{Demand, MemoryStats};
use super::suballoc::Suballocator;

mod access;
mod allocation;
mod arrival;
mod audit;
mod backing;
mod completion;
mod eviction;
mod export;
mod first_backing;
mod handover;
mod swap;
mod units;
mod verbs;

pub use export::{ExportedAllocation, ExportedUnit};

#[cfg(test)]
mod capture_pin_tests;
#[cfg(test)]
mod lock_tests;

/// How the manager is set up. [`ManagerConfig::new`] gives the production defaults.
#[derive(Debug, Clone, Copy)]
pub struct ManagerConfig {
    /// Device ordinal the arena lives on.
    pub device: i32,
    /// Page size: the VMM granularity (2 MiB on the H100). Smaller values are for tests.
    pub page_size: usize,
    /// Virtual bytes reserved for the arena (may exceed the device; swapping covers it).
    pub arena_bytes: usize,
    /// Device bytes the process may hold (`TENSILE_DEVICE_MEMORY`).
    pub device_budget: usize,
    /// The arena's used part grows (and is backed) by at least this much at once.
    pub grow_bytes: usize,
    /// Cap of the pinned host pool (`TENSILE_HOST_MEMORY`).
    pub host_cap: usize,
    /// A cap on pinned host memory shared with the other managers of the process (one per
    /// device): together their pools pin no more than it (`None`: this pool's cap alone).
    pub shared_host_cap: Option<&'static SharedHostCap>,
    /// The host pool grows by this much at a time (one allocation per page in it).
    pub host_chunk_bytes: usize,
    /// NUMA node of the host pool.
    pub numa_node: i32,
    /// Grow the host pool on a background thread.
    pub host_background: bool,
    /// Pages evicted at least per eviction round (amortizes the LRU scan and the events).
    pub evict_batch: usize,
    /// Device pages kept free (or on their way out) ahead of need once the budget is full,
    /// so that an on-demand swap-in finds a frame without waiting for an eviction's copy.
    pub free_reserve_pages: usize,
    /// `note_access_done` records a fence (one `cuEventRecord`) on every `fence_every`-th
    /// launch of a stream; the launches between are covered by the next one.
    pub fence_every: u32,
    /// The most pages the eviction adviser is asked about per choice ([`EvictionAdvice`]):
    /// an evenly spread sample when more are resident.
    pub advice_sample: usize,
    /// Whether a swapped-out page's address is mapped to its host frame (`TENSILE_SWAPPED`):
    /// an access nobody foresaw then runs at PCIe speed instead of faulting, at the price of
    /// a map and an access call per page out and an unmap per page in, about 60% of the
    /// driver's VMM time per page moved (docs/memory.md).
    pub host_mapped: bool,
    /// Whether a device unit leaving the device while pages are mapped to host memory goes
    /// into one host unit of its size (`TENSILE_HOST_UNITS`; docs/memory.md, "Host units").
    pub host_units: bool,
    /// Whether a page read back when no device frame is free may take the frames of a unit
    /// still on its way out, its copy in ordered after that unit's copy out on the device
    /// (`TENSILE_HANDOVER`; `handover.rs`), instead of waiting for the copy out on the host
    /// and completing that swap-out first.
    pub hand_over: bool,
}

impl ManagerConfig {
    /// Production defaults for a budget and host cap, with the H100's 2 MiB pages.
    pub fn new(device_budget: usize, host_cap: usize) -> Self {
        Self::with_page(device_budget, host_cap, 2 << 20)
    }

    /// Production defaults for a budget and host cap on a driver whose VMM granularity is
    /// `page` (a power of two; 2 MiB on the H100, smaller on a scaled simulated GPU): the
    /// batch and reserve sizes are in pages, as at 2 MiB.
    pub fn with_page(device_budget: usize, host_cap: usize, page: usize) -> Self {
        const MIB: usize = 1 << 20;
        Self {
            device: 0,
            page_size: page,
            // Room for a footprint of several times the card; VA is cheap.
            arena_bytes: (device_budget.saturating_mul(8)).clamp(64 << 30, 1 << 44),
            device_budget,
            grow_bytes: 16 * page,
            host_cap,
            shared_host_cap: None,
            // Small chunks: a thread that finds the pool empty waits for the grower's chunk
            // (with the manager's lock held), about 8 ms for 32 MiB on the H100.
            host_chunk_bytes: 32 * MIB,
            numa_node: 0,
            host_background: true,
            evict_batch: 8,
            // About 3% of the budget, at least one eviction batch.
            free_reserve_pages: (device_budget / page.max(1) / 32).max(8),
            fence_every: 4,
            advice_sample: ADVICE_SAMPLE,
            host_mapped: true,
            host_units: false,
            hand_over: true,
        }
    }
}

/// Pages pinned by a `prepare_access`, to be handed back to
/// [`MemoryManager::note_access_done`] once the work is queued.
#[derive(Debug)]
#[must_use = "pass the ticket to note_access_done, or the pages stay pinned"]
pub struct AccessTicket {
    stream: Stream,
    /// Inclusive page runs, sorted and disjoint.
    runs: Vec<(usize, usize)>,
}

impl AccessTicket {
    /// Number of arena pages the access touches.
    pub fn pages(&self) -> usize {
        self.runs.iter().map(|&(a, b)| b - a + 1).sum()
    }
}

struct Inner {
    driver: Arc<dyn Driver>,
    cfg: ManagerConfig,
    base: CUdeviceptr,
    page: usize,
    pages: PageTable,
    sub: Suballocator,
    dev: DevicePool,
    host: HostPool,
    fences: Fences,
    clock: u64,
    swap_in_stream: Stream,
    swap_out_stream: Stream,
    /// Copy events and how many pages (or deferred frames) still refer to each.
    copy_event_refs: HashMap<Event, u32>,
    /// When each copy event was last handed out, by a count of hand-outs: the order of the
    /// copies on a swap stream, which complete in it ([`Inner::first_copied`]).
    copy_event_order: HashMap<Event, u64>,
    copy_events_handed: u64,
    spare_events: Vec<Event>,
    /// Pages in `ToHost` / `ToDevice`.
    outgoing: BTreeSet<usize>,
    /// Units of `outgoing` whose frames a read-back took before their copy out landed, by
    /// unit (`handover.rs`): their completion unmaps the victim's address and keeps the
    /// frames, which the pages read back hold.
    handed: HashMap<u32, handover::HandedUnit>,
    /// Set while frames are found for a read-back, which may take a leaving unit's.
    hand_over_ok: bool,
    /// First pages of handed-over units an access waits for: completed before the others.
    urgent_completions: Vec<usize>,
    /// `ToHost` pages (of `outgoing`) whose swap-out is being completed without the lock
    /// (`completion.rs`): nothing may remap them or cancel their swap-out meanwhile.
    completing: BTreeSet<usize>,
    incoming: BTreeSet<usize>,
    /// Host frames of cancelled swap-outs, free once the copy into them completed.
    deferred_host: Vec<(HostFrame, Event)>,
    /// Pages with a device frame and no live allocation.
    dead_device: BTreeSet<usize>,
    /// `Host` pages whose address is not mapped to their host frame: a driver call failed.
    /// Their data is safe in the frame; `remap_host` (also from `poll`) maps them again.
    /// Every page is mapped on its own (a frame is an allocation of its own, frames.rs).
    unmapped_host: BTreeSet<usize>,
    /// Allocations touched by work captured into a CUDA graph, with their page runs: each
    /// holds one pin on every page of its run until it is freed, so a graph launched at any
    /// later time finds them resident and at the same physical memory.
    capture_pinned: HashMap<CUdeviceptr, (usize, usize)>,
    stats: MemoryStats,
    /// Out-of-memory failures by cause (logged once each, counted, summarized at exit).
    failures: FailureLog,
    /// Tickets handed out and not yet returned: calls between `prepare_access` and
    /// `note_access_done`, whose pages are pinned.
    open_tickets: usize,
    /// Set (instead of logging a failure) when frames could not be found only because every
    /// evictable page is pinned: the caller releases the lock, waits for pins to drop and
    /// retries (see `MemoryManager::waiting_for_pins`).
    pin_stall: Option<PinStall>,
    /// Set (instead of logging a failure) when one access needs more pages than the budget
    /// while the budget may grow ([`MemoryManager::set_budget_wait`]): the caller releases
    /// the lock and waits for `set_budget`, then retries. The bytes the access needs.
    budget_stall: Option<usize>,
    /// How long an access larger than the budget waits for it to grow (zero: it fails at
    /// once, as a fixed budget never grows).
    budget_wait: Duration,
    /// Accesses that waited for the budget to grow (the first is logged).
    budget_waits: u64,
    /// Threads waiting in `MemoryManager::waiting_for_pins`; pin drops notify only then.
    pin_waiters: usize,
    /// Set (instead of waiting with the lock held) when frames will come only from swap-outs
    /// in flight: the caller gives back what it took, releases the lock, waits for these
    /// copies' events and retries.
    copy_waits: Vec<Event>,
    /// Set when the frames an operation needs come from swap-outs that have landed (or are
    /// about to): the caller completes them without the lock ([`MemoryManager::complete`])
    /// and retries.
    completion_wanted: bool,
    /// Set when an operation needs pages whose swap-out another thread is completing without
    /// the lock: the caller releases the lock, waits for that commit and retries.
    remap_stall: bool,
    /// Remaps committed by threads that made them without the lock (completions, arrivals):
    /// a wait on another thread's remap is bounded by the time without one.
    remaps_committed: u64,
    /// Which pages to evict first, when a policy that knows the future says so.
    advice: Option<Arc<dyn EvictionAdvice>>,
    /// The state of the operation running now ([`OpState`]; the default outside
    /// [`MemoryManager::waiting_for_pins`] and its like).
    op: OpState,
    /// `Host` pages whose swap-in is being remapped without the lock (`arrival.rs`): nothing
    /// may remap, drop or re-host them meanwhile.
    arriving: BTreeSet<usize>,
    /// The device frames those swap-ins hold (owned by their [`arrival::Arrival`]; kept here
    /// for the audit).
    arriving_frames: Vec<DevFrame>,
    /// `Unbacked` pages whose addresses a thread maps or unmaps without the lock: a new
    /// allocation's, and those of the dead units it takes frames from (`first_backing.rs`).
    /// An allocation landing on one waits for the commit.
    mapping: BTreeSet<usize>,
    /// The frames those backings hold (owned by their [`first_backing::FirstBacking`]; kept
    /// here for the audit).
    backing_frames: Vec<Frame>,
    /// Dead units dropped for their frames by the operation running now, their unmaps left
    /// to its backing ([`Inner::unback_for_reuse`]).
    dead_unmaps: Vec<first_backing::DeadUnmap>,
    /// Set while an allocation decides its backing: only then may unmaps be left for later.
    defer_dead_unmaps: bool,
    /// Set when an operation decided a swap-in for its caller to make without the lock
    /// ([`MemoryManager::arrive`]), then start it over.
    arrival: Option<arrival::Arrival>,
    /// Set while `maintain` keeps the free reserve: its evictions have host memory pinned
    /// (without the lock) rather than stop for it, as the application's threads' do.
    reserve_pins: bool,
    /// Set when an operation found no free host frame or host unit: the caller has the pool
    /// make it without the lock ([`HostPoolRefill`]) and starts over.
    host_wanted: Option<HostWant>,
    /// The most pages a unit made now may have ([`MAX_UNIT_PAGES`] unless a plan asks for
    /// fewer: [`MemoryManager::set_max_unit_pages`]).
    max_unit_pages: usize,
    /// What the frames being found now are for (counted in `stats.evicted_for`).
    demand: Demand,
    /// Who hears of each swap and span of host time, if anyone ([`Journal`]).
    journal: Option<Arc<dyn Journal>>,
}

/// An operation's state across its rounds in [`MemoryManager::waiting_for_pins`]: kept by
/// the facade between rounds and lent to `Inner` (`Inner::op`) for each, since other
/// threads' operations run on the same `Inner` whenever the lock is released between them.
#[derive(Clone, Copy, Debug, Default)]
struct OpState {
    /// How many more times the operation may release the lock to wait (for copies, fences)
    /// or to make VMM calls without it, then start over; after that it does them with the
    /// lock held (bounds the retries).
    unlocked_rounds_left: u32,
    /// How many more times it may stop for host memory to be pinned without the lock (a
    /// round apart from the others: pinning a unit takes about 0.4 ms a page on the card, an
    /// eviction may want hundreds of units, and pinning with the lock held stalled every
    /// launch of a job for seconds on the shared card; each such round adds memory to the
    /// pool, whose cap ends them).
    host_rounds_left: u32,
    /// Pages its arrivals brought in (a prefetch counts them).
    arrived_pages: usize,
    /// Whether it is an access that had to bring pages in or wait for them: a stalled
    /// launch, counted with the whole call's time when it returns.
    stalled: bool,
    /// Whether it ran before and stopped part way (what it was asked for is not counted
    /// again).
    rerun: bool,
}

/// What an operation stopped for: host memory of a kind (set where it found none free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HostWant {
    /// A free single frame (the pool grows by a chunk).
    Frames,
    /// A free host unit of this many pages.
    Unit(usize),
}

/// What the host pool is asked to make without the manager's lock: enough of a kind that
/// `at_least` are free ([`Inner::take_host_wanted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HostNeed {
    want: HostWant,
    at_least: usize,
}

/// What blocked an eviction: frames wanted while every resident page was pinned.
#[derive(Clone, Copy, Debug)]
struct PinStall {
    bytes_needed: usize,
}

/// The most pages one device unit (one physical allocation, mapped whole) holds: pages
/// brought in together get units of up to this size. Larger units cost fewer VMM calls per
/// page (per mapping, not per byte: docs/gpu-results.md) but move more at once: a unit
/// leaves the device only whole.
pub const MAX_UNIT_PAGES: usize = tensile_analyzer::SHIM_MAX_UNIT_PAGES as usize;

/// How many times one operation may release the lock to wait for copies or fences, or to
/// make a swap's VMM calls, before it does so with the lock held (each round is followed by
/// a retry from the start).
const UNLOCKED_ROUNDS: u32 = 16;

/// The rounds an operation may make before its unlocked rounds stop being refunded
/// (`MemoryManager::refund_round`).
const REFUNDED_ROUNDS: u32 = 256;

/// [`OpState::host_rounds_left`] of an operation whose caller can pin without the lock.
const HOST_ROUNDS: u32 = 4096;

/// The default of [`ManagerConfig::advice_sample`].
pub const ADVICE_SAMPLE: usize = 1024;

/// How long a request waits for pinned pages to be released before failing, by default.
pub const DEFAULT_PIN_WAIT: Duration = Duration::from_secs(10);

/// How long one step of [`MemoryManager::set_budget_without_waiting`] goes on pinning host
/// memory and completing swap-outs (its caller renews a pause of 500 ms at every step).
const SHRINK_STEP: Duration = Duration::from_millis(150);

/// Waits for the lock shorter than this are counted but not told to the journal (each
/// launch of a busy job may wait a few microseconds).
const JOURNAL_LOCK_WAIT_NS: u64 = 50_000;

/// What a swap-out's copy is ordered after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SwapOrder {
    /// Nothing: the pages are idle (every recorded use completed).
    Idle,
    /// The pages' recorded uses, which the swap-out stream has been made to wait for.
    AfterUses,
}

/// The memory manager. See the module docs for what it guarantees.
pub struct MemoryManager {
    inner: Mutex<Inner>,
    /// Signalled when pins drop or memory is freed while someone waits for pinned pages.
    pins_released: Condvar,
    /// Bound on a wait for pinned pages, in milliseconds.
    pin_wait_ms: AtomicU64,
    /// Until when (ns after `created`) time spent waiting for the budget to grow does not
    /// count toward its bound ([`MemoryManager::stop_budget_clock_until`]); 0: it counts.
    budget_clock_stopped_until: AtomicU64,
    created: Instant,
    base: CUdeviceptr,
    arena_bytes: usize,
    /// The page (fixed for the manager's life).
    page: usize,
    /// Acquisitions of the manager's lock that found it held, and the time they waited, by
    /// the application's threads and by the library's own (`tensile-…`): what the
    /// application loses to the manager's own work (driver calls made under the lock
    /// included), where the stall counters see only swap-ins.
    lock_waits: [AtomicU64; 2],
    lock_wait_ns: [AtomicU64; 2],
    /// The host pool's pinning, made without the lock ([`HostWant`]).
    host_refill: HostPoolRefill,
    /// [`Inner::journal`], for what is done without the lock.
    journal: OnceLock<Arc<dyn Journal>>,
}

impl MemoryManager {
    /// Reserves the arena and the host window, creates the two copy streams and starts the
    /// host pool's grower.
    pub fn new(driver: Arc<dyn Driver>, cfg: ManagerConfig) -> Result<Self, CUresult> {
        let page = cfg.page_size;
        if page == 0 || !page.is_power_of_two() || cfg.arena_bytes < page {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let arena_bytes = cfg.arena_bytes / page * page;
        let base = driver.mem_address_reserve(arena_bytes, page)?;
        let host = HostPool::new(
            driver.clone(),
            HostPoolConfig {
                page,
                device: cfg.device,
                numa_node: cfg.numa_node,
                cap_bytes: cfg.host_cap,
                chunk_bytes: cfg.host_chunk_bytes.max(page),
                // Two chunks ahead (64 MiB by default).
                low_water_frames: (cfg.host_chunk_bytes / page * 2).max(1),
                background: cfg.host_background,
                shared_cap: cfg.shared_host_cap,
            },
        );
        let host = match host {
            Ok(h) => h,
            Err(e) => {
                let _ = driver.mem_address_free(base, arena_bytes);
                return Err(e);
            }
        };
        let streams = driver
            .stream_create()
            .and_then(|a| Ok((a, driver.stream_create()?)));
        let (swap_in_stream, swap_out_stream) = match streams {
            Ok(s) => s,
            Err(e) => {
                let _ = driver.mem_address_free(base, arena_bytes);
                return Err(e);
            }
        };
        let host_refill = host.refill_handle();
        let inner = Inner {
            driver,
            cfg,
            base,
            page,
            pages: PageTable::new(),
            sub: Suballocator::new(base, arena_bytes as u64, page as u64, cfg.grow_bytes as u64),
            dev: DevicePool::new(page, cfg.device, cfg.device_budget),
            host,
            fences: Fences::new(),
            clock: 0,
            swap_in_stream,
            swap_out_stream,
            copy_event_refs: HashMap::new(),
            copy_event_order: HashMap::new(),
            copy_events_handed: 0,
            spare_events: Vec::new(),
            outgoing: BTreeSet::new(),
            handed: HashMap::new(),
            hand_over_ok: false,
            urgent_completions: Vec::new(),
            completing: BTreeSet::new(),
            incoming: BTreeSet::new(),
            deferred_host: Vec::new(),
            dead_device: BTreeSet::new(),
            unmapped_host: BTreeSet::new(),
            capture_pinned: HashMap::new(),
            stats: MemoryStats::default(),
            failures: FailureLog::default(),
            open_tickets: 0,
            pin_stall: None,
            budget_stall: None,
            budget_wait: Duration::ZERO,
            budget_waits: 0,
            pin_waiters: 0,
            copy_waits: Vec::new(),
            completion_wanted: false,
            remap_stall: false,
            remaps_committed: 0,
            advice: None,
            op: OpState::default(),
            arriving: BTreeSet::new(),
            arriving_frames: Vec::new(),
            arrival: None,
            mapping: BTreeSet::new(),
            backing_frames: Vec::new(),
            dead_unmaps: Vec::new(),
            defer_dead_unmaps: false,
            reserve_pins: false,
            host_wanted: None,
            max_unit_pages: MAX_UNIT_PAGES,
            demand: Demand::Access,
            journal: None,
        };
        Ok(Self {
            inner: Mutex::new(inner),
            pins_released: Condvar::new(),
            pin_wait_ms: AtomicU64::new(DEFAULT_PIN_WAIT.as_millis() as u64),
            budget_clock_stopped_until: AtomicU64::new(0),
            created: Instant::now(),
            base,
            arena_bytes,
            page,
            lock_waits: [AtomicU64::new(0), AtomicU64::new(0)],
            lock_wait_ns: [AtomicU64::new(0), AtomicU64::new(0)],
            host_refill,
            journal: OnceLock::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic inside the manager is a bug, but the state is still the best we have.
        match self.inner.try_lock() {
            Ok(guard) => return guard,
            Err(std::sync::TryLockError::Poisoned(e)) => return e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        // Held by another thread: only then is the wait timed (two clock reads), and whose.
        let started = Instant::now();
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let waited = started.elapsed().as_nanos() as u64;
        let library = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("tensile-"));
        let who = usize::from(library);
        self.lock_waits[who].fetch_add(1, Ordering::Relaxed);
        self.lock_wait_ns[who].fetch_add(waited, Ordering::Relaxed);
        if let Some(j) = guard
            .journal
            .as_ref()
            .filter(|_| waited >= JOURNAL_LOCK_WAIT_NS)
        {
            j.busy(started, Instant::now(), BusyKind::LockWait, 0);
        }
        guard
    }

    /// Whether `ptr` lies in the arena (then the manager, not the driver, answers for it).
    pub fn owns(&self, ptr: CUdeviceptr) -> bool {
        ptr >= self.base && ptr - self.base < self.arena_bytes as u64
    }

    /// The live allocation containing `addr`: `(start, size)`.
    pub fn allocation_containing(&self, addr: CUdeviceptr) -> Option<(CUdeviceptr, usize)> {
        if !self.owns(addr) {
            return None;
        }
        self.lock().sub.find(addr).map(|a| (a.ptr, a.size as usize))
    }

    /// Allocates `size` bytes. `stream` is `Some` for stream-ordered allocations
    /// (`cuMemAllocAsync`), `None` for `cuMemAlloc_v2`.
    pub fn alloc(&self, size: usize, stream: Option<Stream>) -> Result<CUdeviceptr, CUresult> {
        let backing = self.waiting_for_pins(|s| s.alloc(size, stream.unwrap_or(Stream(0))))?;
        if backing.is_empty() {
            return Ok(backing.ptr());
        }
        // The maps (and the unmaps of the dead units whose frames the allocation takes) are
        // made without the lock (`first_backing.rs`), then committed.
        let outcome = backing.run();
        let mut s = self.lock();
        let r = s.commit_first_backing(backing, outcome);
        // Allocations waiting for these pages (`remap_stall`) look again.
        self.wake_pin_waiters(s);
        r
    }

    /// `cuMemAllocPitch_v2`: `height` rows of `width` bytes, each row starting at a multiple of
    /// the returned pitch (512 bytes, the pitch alignment of current NVIDIA GPUs). Like the
    /// driver, element sizes other than 4, 8 and 16 bytes and empty sizes are
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub fn alloc_pitch(
        &self,
        width: usize,
        height: usize,
        element_size: u32,
    ) -> Result<(CUdeviceptr, usize), CUresult> {
        const PITCH_ALIGN: usize = 512;
        if !matches!(element_size, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pitch = width
            .checked_next_multiple_of(PITCH_ALIGN)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let bytes = pitch.checked_mul(height).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        Ok((self.alloc(bytes, None)?, pitch))
    }

    /// Frees an allocation. With `Some(stream)` (`cuMemFreeAsync`) the memory is reused by
    /// other streams only after the work queued on `stream` so far has completed. With `None`
    /// (`cuMemFree_v2`, which synchronizes in the driver) it is reusable at once: the caller
    /// must have synchronized as the driver would.
    ///
    /// Unknown pointers, interior pointers and double frees give `CUDA_ERROR_INVALID_VALUE`.
    pub fn free(&self, ptr: CUdeviceptr, stream: Option<Stream>) -> Result<(), CUresult> {
        let mut s = self.lock();
        let r = s.free(ptr, stream);
        self.wake_pin_waiters(s);
        r
    }

    /// Makes every page of `ranges` device-resident for work about to be queued on `stream`
    /// (a launch, copy or memset), swapping in (and evicting) as needed; `stream` is made to
    /// wait for any copy still in flight. Addresses outside the arena are ignored. Returns a
    /// ticket to give to [`Self::note_access_done`] right after queuing the work, also if
    /// queuing it failed.
    pub fn prepare_access(
        &self,
        stream: Stream,
        ranges: &[(CUdeviceptr, usize)],
    ) -> Result<AccessTicket, CUresult> {
        self.waiting_for_pins(|s| s.prepare_access(stream, ranges))
    }

    /// Makes every arena allocation `ranges` touch device-resident *now* (the calling thread
    /// waits for the swap-in copies, made on the manager's own streams) and pins it until it
    /// is freed: for work captured into a CUDA graph, which runs whenever the graph is
    /// launched and on which no stream wait or fence can be placed. Nothing is queued on the
    /// capturing stream. Addresses outside the arena are ignored.
    pub fn pin_for_capture(&self, ranges: &[(CUdeviceptr, usize)]) -> Result<(), CUresult> {
        self.waiting_for_pins(|s| s.pin_for_capture(ranges))
    }

    /// Whether the allocation starting at `ptr` is pinned for a captured graph.
    pub fn is_capture_pinned(&self, ptr: CUdeviceptr) -> bool {
        self.lock().capture_pinned.contains_key(&ptr)
    }

    /// Reports that the work a ticket was for has been queued on its stream: its pages stay
    /// unevictable until that work completes.
    pub fn note_access_done(&self, ticket: AccessTicket) -> Result<(), CUresult> {
        let mut s = self.lock();
        let r = s.note_access_done(ticket);
        self.wake_pin_waiters(s);
        r
    }

    /// `(free, total)` as the budget sees it: total is the budget, free is the budget less
    /// the device memory holding live data.
    pub fn mem_get_info(&self) -> (usize, usize) {
        let s = self.lock();
        let budget = s.dev.budget_frames() * s.page;
        let used = s
            .pages
            .iter()
            .filter(|(_, e)| e.live > 0 && e.state.device_frame().is_some())
            .count()
            * s.page;
        (budget.saturating_sub(used), budget)
    }

    /// Units made from now on have at most `pages` pages (`None`: [`MAX_UNIT_PAGES`]). A unit
    /// moves whole, so a policy that moves tensors in pieces asks for units no larger than its
    /// pieces (the units of a tensor then start at its first page, as its pieces do). Units
    /// already made keep their size until their pages next move.
    pub fn set_max_unit_pages(&self, pages: Option<usize>) {
        self.lock().max_unit_pages = pages.map_or(MAX_UNIT_PAGES, |n| n.clamp(1, MAX_UNIT_PAGES));
    }

    /// The page: the unit of residency, the driver's VMM granularity.
    pub fn page_bytes(&self) -> usize {
        self.page
    }

    pub fn stats(&self) -> MemoryStats {
        let s = self.lock();
        let mut st = s.stats;
        st.host_pool_bytes = s.host.size_bytes() as u64;
        st.frames_in_use = s.dev.in_use() as u64;
        st.dead_device_pages = s.dead_device.len() as u64;
        drop(s);
        st.app_lock_waits = self.lock_waits[0].load(Ordering::Relaxed);
        st.app_lock_wait_ns = self.lock_wait_ns[0].load(Ordering::Relaxed);
        st.library_lock_waits = self.lock_waits[1].load(Ordering::Relaxed);
        st.library_lock_wait_ns = self.lock_wait_ns[1].load(Ordering::Relaxed);
        st
    }

    /// Runs `op` on the state; when it fails only because every evictable page is pinned by
    /// other threads' in-flight calls, releases the lock, waits for pins to drop (bounded by
    /// [`Self::set_pin_wait`]) and runs it again. `op` must leave no pin or frame behind when
    /// it fails (every `Inner` entry point does). After the bound the failure names the pins.
    fn waiting_for_pins<T>(
        &self,
        mut op: impl FnMut(&mut Inner) -> Result<T, CUresult>,
    ) -> Result<T, CUresult> {
        let started = Instant::now();
        let mut s = self.lock();
        let failures_before = s.failures.total();
        let mut deadline: Option<Instant> = None;
        let mut remap_deadline: Option<Instant> = None;
        let mut remap_seen: Option<u64> = None;
        // This operation's own state across its rounds: other threads' operations run on the
        // same `Inner` whenever the lock is released between them.
        let mut op_state = OpState {
            unlocked_rounds_left: UNLOCKED_ROUNDS,
            host_rounds_left: HOST_ROUNDS,
            ..OpState::default()
        };
        // Time counted toward the budget wait's bound, and when it was last counted.
        let mut budget_waited: Option<(Duration, Instant)> = None;
        // Rounds made: after the first, the operation stopped for the library's own work.
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            s.pin_stall = None;
            s.budget_stall = None;
            s.copy_waits.clear();
            s.completion_wanted = false;
            s.remap_stall = false;
            s.host_wanted = None;
            s.op = op_state;
            let result = op(&mut s);
            op_state = std::mem::take(&mut s.op);
            let waits = std::mem::take(&mut s.copy_waits);
            if let Some(arrival) = s.arrival.take() {
                // The operation decided a swap-in: its VMM calls and copies are made without
                // the lock, then the operation starts over with the lock held from the
                // commit, and finds the pages on their way in.
                debug_assert!(
                    result.is_err(),
                    "an operation left an arrival and succeeded"
                );
                let failed;
                (s, failed) = self.arrive(s, arrival, &mut op_state);
                if let Some(e) = failed {
                    // As the swap-in made with the lock held would: the access fails with
                    // the driver's error, its pages still on the host.
                    return Err(e);
                }
                self.refund_round(&mut op_state, rounds, started);
                continue;
            }
            let err = match result {
                Ok(v) => {
                    if op_state.stalled {
                        // From the call to here: the copies in and any waits made without
                        // the lock on the way.
                        let end = Instant::now();
                        s.stats.stalled_launches += 1;
                        s.stats.stall_ns += end.duration_since(started).as_nanos() as u64;
                        if let Some(j) = &s.journal {
                            j.busy(started, end, BusyKind::Stall, op_state.arrived_pages);
                        }
                    } else if rounds > 1 {
                        if let Some(j) = &s.journal {
                            j.busy(started, Instant::now(), BusyKind::Waited, 0);
                        }
                    }
                    return Ok(v);
                }
                Err(e) => e,
            };
            if let Some(want) = s.take_host_wanted() {
                // No free host frame or unit: the pool pins one without the lock (about
                // 0.5 ms a page), then the operation starts over.
                drop(s);
                self.provide_host(want);
                s = self.lock();
                continue;
            }
            if !waits.is_empty() || s.completion_wanted {
                // Frames are on their way out, or pages on their way in, or the work a dead
                // unit waits for is queued: wait for those events without the lock, so
                // threads whose data is resident go on meanwhile, finish the swaps (the
                // swap-outs' VMM calls also without it), then start over. A failed wait is
                // seen again (and reported) by the retry's polling of the swaps.
                let committed = s.remaps_committed;
                if !waits.is_empty() {
                    let driver = s.driver.clone();
                    drop(s);
                    for ev in waits {
                        if let Err(e) = driver.event_synchronize(ev) {
                            tracing::debug!(code = e, "waiting for a copy or fence failed");
                        }
                    }
                    s = self.lock();
                    if let Err(e) = s.poll_with(false) {
                        tracing::debug!(code = e, "polling swap-ins failed");
                    }
                }
                s = self.complete(s);
                // A round in which swaps were committed (by this thread or another) freed
                // frames or brought pages in: it does not count against the rounds, which
                // bound the retries that achieve nothing. A swap of many units may take a
                // round per batch of copies landing; once out of rounds, an operation waits
                // for copies and makes VMM calls with the lock held, every other thread
                // waiting with it (`MemoryStats::locked_waits`). Refunded only within the pin
                // wait's bound, after which the rounds run out and end the operation.
                if s.remaps_committed != committed {
                    self.refund_round(&mut op_state, rounds, started);
                }
                continue;
            }
            if s.remap_stall {
                // Another thread is remapping pages this operation needs without the lock:
                // its commit wakes us. Bounded like a wait for pins, but by the time without
                // any commit: a shrink that completes batch after batch keeps every page on
                // its way out completing for longer than that, and an allocation waiting for
                // one of them failed although the remaps went on.
                let now = Instant::now();
                let wait = Duration::from_millis(self.pin_wait_ms.load(Ordering::Relaxed));
                if remap_seen != Some(s.remaps_committed) {
                    remap_seen = Some(s.remaps_committed);
                    remap_deadline = None;
                }
                let end = *remap_deadline.get_or_insert(now + wait);
                if now < end {
                    s = self.wait_for_wake(s, (end - now).min(Duration::from_millis(2)));
                    continue;
                }
                return Err(s.failures.record(
                    FailureCause::Internal,
                    format_args!(
                        "pages this call needs stayed in another thread's remap for {:.1} s",
                        wait.as_secs_f64()
                    ),
                ));
            }
            if let Some(needed) = s.budget_stall.take() {
                // The budget is a grant that may grow: wait for `set_budget` (which
                // notifies), up to the configured bound, then fail as a fixed budget would.
                // Time while the clock is stopped (the job waits its turn for the card, and
                // its grant with it) does not count.
                let now = Instant::now();
                let (counted, last) = budget_waited.get_or_insert_with(|| {
                    s.budget_waits += 1;
                    if s.budget_waits == 1 {
                        let how_long = if s.budget_wait == Duration::MAX {
                            "until it does".to_string()
                        } else {
                            format!("up to {:.0} s for it", s.budget_wait.as_secs_f64())
                        };
                        tracing::warn!(
                            "tensile: one access needs {} of device memory at once, more than \
                             this job's grant of {}; waiting {how_long} (TENSILE_GRANT_WAIT) for \
                             the coordinator to grant more (said once)",
                            human_bytes(needed),
                            human_bytes(s.dev.budget_frames() * s.page),
                        );
                    }
                    (Duration::ZERO, now)
                });
                if !self.budget_clock_stopped(now) {
                    *counted += now.saturating_duration_since(*last);
                }
                *last = now;
                if *counted >= s.budget_wait {
                    return Err(s.fail_budget(needed));
                }
                let left = s.budget_wait - *counted;
                s = self.wait_for_wake(s, left.min(Duration::from_millis(10)));
                continue;
            }
            let Some(stall) = s.pin_stall.take() else {
                if err == CUDA_ERROR_OUT_OF_MEMORY && s.failures.total() == failures_before {
                    // Every out-of-memory the manager makes has its cause recorded; one
                    // without is the driver's own or a round's signal that escaped (a bug,
                    // as one did while these rounds were built): say so rather than fail the
                    // application's call unexplained.
                    return Err(s.failures.record(
                        FailureCause::Internal,
                        format_args!(
                            "a call failed for want of memory with no cause recorded by the \
                             manager (a driver call's own out-of-memory, or a bug)"
                        ),
                    ));
                }
                return Err(err);
            };
            let now = Instant::now();
            let wait = Duration::from_millis(self.pin_wait_ms.load(Ordering::Relaxed));
            let end = *deadline.get_or_insert(now + wait);
            if now >= end {
                return Err(s.fail_pinned(stall, wait));
            }
            s.stats.pin_waits += 1;
            // Re-check at least every few milliseconds: frames also come back through swaps
            // completing and the maintenance thread, which do not signal.
            s = self.wait_for_wake(s, (end - now).min(Duration::from_millis(2)));
        }
    }

    /// Gives an operation back the unlocked round it just spent, if that round moved swaps on
    /// (see the caller), the operation has made fewer than [`REFUNDED_ROUNDS`] rounds and it
    /// started within the pin wait's bound: the rounds bound the retries that achieve nothing,
    /// not the batches of a large swap. Commits by other threads count too, so an operation
    /// whose frames keep going to others still ends, with the lock held, after a bounded
    /// number of rounds.
    fn refund_round(&self, op: &mut OpState, rounds: u32, started: Instant) {
        let bound = Duration::from_millis(self.pin_wait_ms.load(Ordering::Relaxed));
        if rounds < REFUNDED_ROUNDS && started.elapsed() < bound {
            op.unlocked_rounds_left = (op.unlocked_rounds_left + 1).min(UNLOCKED_ROUNDS);
        }
    }

    /// Completes the swap-outs that have landed, their VMM calls made without the lock
    /// (`completion.rs`); returns the lock taken again. Wakes the threads waiting for pages
    /// that were completing, or for frames.
    fn complete<'a>(&'a self, mut s: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        let completions = match s.begin_completions() {
            Ok(c) if !c.is_empty() => c,
            Ok(_) => return s,
            Err(e) => {
                tracing::debug!(code = e, "polling swap-outs failed");
                return s;
            }
        };
        let driver = s.driver.clone();
        drop(s);
        let outcome = completions.run(&*driver);
        let mut s = self.lock();
        s.commit_completions(completions, outcome);
        if s.pin_waiters > 0 {
            self.pins_released.notify_all();
        }
        s
    }

    /// [`Self::complete`] batch after batch while batches complete something, for up to
    /// [`SHRINK_STEP`] from `started`.
    fn completing_for<'a>(
        &'a self,
        mut s: MutexGuard<'a, Inner>,
        started: Instant,
    ) -> MutexGuard<'a, Inner> {
        loop {
            let leaving = s.outgoing.len();
            s = self.complete(s);
            if s.outgoing.len() == leaving || started.elapsed() >= SHRINK_STEP {
                return s;
            }
        }
    }

    /// Has the host pool make what an operation found missing; called without the lock.
    fn provide_host(&self, need: HostNeed) {
        let started = Instant::now();
        let pages = match need.want {
            HostWant::Frames => {
                self.host_refill.frames(need.at_least);
                0
            }
            HostWant::Unit(pages) => {
                self.host_refill.unit(pages, need.at_least);
                pages
            }
        };
        if let Some(j) = self.journal.get() {
            j.busy(started, Instant::now(), BusyKind::HostPin, pages);
        }
    }

    /// Makes the driver calls of a swap-in decided under the lock without it (`arrival.rs`);
    /// returns the lock taken again, the swap-in committed, and the driver error that stopped
    /// it, if one did. Wakes the threads waiting for the pages that were arriving.
    fn arrive<'a>(
        &'a self,
        s: MutexGuard<'a, Inner>,
        arrival: arrival::Arrival,
        op_state: &mut OpState,
    ) -> (MutexGuard<'a, Inner>, Option<CUresult>) {
        let driver = s.driver.clone();
        drop(s);
        let outcome = arrival.run(&*driver);
        let mut s = self.lock();
        s.op = *op_state;
        s.commit_arrival(arrival, outcome);
        *op_state = std::mem::take(&mut s.op);
        if s.pin_waiters > 0 {
            self.pins_released.notify_all();
        }
        (s, outcome.error())
    }

    /// Releases the lock until pins drop, memory is freed or the budget changes (all of which
    /// notify waiters), or `slice` passes; returns it taken again.
    fn wait_for_wake<'a>(
        &self,
        mut s: MutexGuard<'a, Inner>,
        slice: Duration,
    ) -> MutexGuard<'a, Inner> {
        s.pin_waiters += 1;
        let mut s = match self.pins_released.wait_timeout(s, slice) {
            Ok((g, _)) => g,
            Err(poisoned) => poisoned.into_inner().0,
        };
        s.pin_waiters -= 1;
        s
    }

    /// Releases the lock and wakes the threads waiting for pinned pages, if any (a wake-up is
    /// a system call: the hot path makes it only when someone waits).
    fn wake_pin_waiters(&self, s: MutexGuard<'_, Inner>) {
        let waiters = s.pin_waiters > 0;
        drop(s);
        if waiters {
            self.pins_released.notify_all();
        }
    }

    /// Makes an access larger than the whole budget wait up to `wait` for the budget to grow
    /// (a job whose budget is a coordinator's grant, which grows as other jobs give memory
    /// back) instead of failing at once. Zero (the default): fail at once.
    pub fn set_budget_wait(&self, wait: Duration) {
        self.lock().budget_wait = wait;
    }

    /// Stops the clock of waits for the budget to grow until `until`: time spent waiting
    /// before then does not count toward [`MemoryManager::set_budget_wait`]'s bound. Renewed
    /// as a lease by whoever knows the budget will grow (the job waits its turn for a shared
    /// card, and its grant with it), so the clock starts again by itself if they stop.
    pub fn stop_budget_clock_until(&self, until: Instant) {
        let ns = until.saturating_duration_since(self.created).as_nanos() as u64;
        self.budget_clock_stopped_until
            .store(ns.max(1), Ordering::Relaxed);
    }

    fn budget_clock_stopped(&self, now: Instant) -> bool {
        let until = self.budget_clock_stopped_until.load(Ordering::Relaxed);
        until != 0 && (now.saturating_duration_since(self.created).as_nanos() as u64) < until
    }

    /// Bounds how long a request waits for pages pinned by in-flight calls before failing
    /// with an error that names them (default [`DEFAULT_PIN_WAIT`]).
    pub fn set_pin_wait(&self, wait: Duration) {
        self.pin_wait_ms
            .store(wait.as_millis() as u64, Ordering::Relaxed);
    }

    /// Starts swapping out the pages of `ranges` that are on the device and idle (pages still
    /// used by queued work or pinned are skipped: this never waits). Returns how many pages
    /// started leaving; they complete in the background, and an access in the meantime
    /// cancels them at no cost. For a policy that knows what is not needed soon.
    pub fn start_swap_out(&self, ranges: &[(CUdeviceptr, usize)]) -> Result<usize, CUresult> {
        self.swapping_out(|s| s.start_swap_out(ranges))
    }

    /// Starts swapping out the device-resident pages of `ranges` that no call in flight has
    /// pinned, ordered on the device after every use recorded so far: the copy stream waits for
    /// those uses' fences, so a page can leave right after the launch that last needs it was
    /// queued. Never waits on the host. Returns how many pages started leaving; like
    /// [`Self::start_swap_out`], an access in the meantime cancels them at no cost. For a
    /// policy that knows a page's last use before its next one (the plan executor).
    pub fn swap_out_after_use(&self, ranges: &[(CUdeviceptr, usize)]) -> Result<usize, CUresult> {
        self.swapping_out(|s| s.swap_out_after_use(ranges))
    }

    /// Runs an operation that starts swap-outs (a verb, or `maintain`'s reserve; `op`
    /// returns the pages it started); when it stopped for host memory (a host unit or frames
    /// not yet pinned), pins that without the lock and runs it again for the rest, a bounded
    /// number of times. Never waits for anything else.
    fn swapping_out(
        &self,
        mut op: impl FnMut(&mut Inner) -> Result<usize, CUresult>,
    ) -> Result<usize, CUresult> {
        let mut s = self.lock();
        let mut op_state = OpState {
            unlocked_rounds_left: UNLOCKED_ROUNDS,
            host_rounds_left: HOST_ROUNDS,
            ..OpState::default()
        };
        let mut started = 0;
        loop {
            s.host_wanted = None;
            s.op = op_state;
            let r = op(&mut s);
            op_state = std::mem::take(&mut s.op);
            started += r?;
            let Some(want) = s.take_host_wanted() else {
                return Ok(started);
            };
            drop(s);
            self.provide_host(want);
            s = self.lock();
            op_state.rerun = true;
        }
    }

    /// Starts bringing the swapped-out pages of `ranges` back to the device (evicting the
    /// least recently used pages if it must), without waiting for the copies: the first
    /// access waits for them on its own stream. Returns how many pages are coming in.
    pub fn prefetch(&self, ranges: &[(CUdeviceptr, usize)]) -> Result<usize, CUresult> {
        self.waiting_for_pins(|s| s.prefetch(ranges))
    }

    /// The device budget in bytes.
    pub fn budget(&self) -> usize {
        let s = self.lock();
        s.dev.budget_frames() * s.page
    }

    /// Changes the device budget at run time. Growing takes effect at once; shrinking evicts
    /// (and waits for the copies out) until the pages on the device fit, waiting for pages
    /// pinned by in-flight calls like an eviction does. Allocations never fail because of a
    /// shrink: they are swapped like any other. A budget below one page is
    /// `CUDA_ERROR_INVALID_VALUE`. Device memory a shrink frees goes back to the driver
    /// frame by frame, as frames become free.
    pub fn set_budget(&self, bytes: usize) -> Result<(), CUresult> {
        let frames = bytes / self.page;
        if frames == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let r = self.waiting_for_pins(|s| s.set_budget(frames));
        self.pins_released.notify_all();
        r
    }

    /// [`Self::set_budget`] as one step that never waits: sets the budget, completes the
    /// swap-outs that have landed, and starts swap-outs of what is over the budget and can go
    /// (pages pinned by calls in flight stay). `Ok(true)` once nothing over the budget is
    /// held; `Ok(false)` while copies out are under way or pages are pinned: call it again
    /// later. For a thread that must not block (the planning thread, which renews the job's
    /// pause every poll: a shrink that waited for its copies while the job's own accesses
    /// brought pages back in held that thread for 23 s once, and the pause lapsed meanwhile).
    pub fn set_budget_without_waiting(&self, bytes: usize) -> Result<bool, CUresult> {
        let frames = bytes / self.page;
        if frames == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let started = Instant::now();
        let mut s = self.completing_for(self.lock(), started);
        loop {
            // Each round a fresh operation: host memory it lacks is pinned below without the
            // lock (about 0.4 ms a page on the card; every launch of the job takes the lock,
            // and a swap-out's completion commits under it), never with it.
            s.host_wanted = None;
            s.op = OpState {
                unlocked_rounds_left: UNLOCKED_ROUNDS,
                host_rounds_left: HOST_ROUNDS,
                ..OpState::default()
            };
            let r = s.shrink_step(frames);
            s.op = OpState::default();
            r?;
            let Some(want) = s.take_host_wanted() else {
                break;
            };
            if started.elapsed() >= SHRINK_STEP {
                break;
            }
            drop(s);
            self.provide_host(want);
            s = self.lock();
        }
        // What started leaving may have landed already (an idle engine): remapped now, so a
        // call that found nothing in its way reports the budget met.
        s = self.completing_for(s, started);
        let met = s.dev.in_use() <= frames;
        if met {
            let driver = s.driver.clone();
            s.dev.release_free_frames(&*driver);
        }
        self.wake_pin_waiters(s);
        Ok(met)
    }

    /// How many device frames eviction ahead of need keeps free or on their way out (the
    /// least recently used pages leave to make them). A policy that makes room itself (a plan
    /// executor) sets 0 while it does, so that LRU does not evict what the plan keeps, and puts
    /// the configured value ([`ManagerConfig::free_reserve_pages`]) back when it stops.
    pub fn set_free_reserve_pages(&self, pages: usize) {
        self.lock().cfg.free_reserve_pages = pages;
    }

    /// Tells `journal` of every swap and span of host time from now on (once: a later call
    /// changes nothing and returns false).
    pub fn set_journal(&self, journal: Arc<dyn Journal>) -> bool {
        if self.journal.set(Arc::clone(&journal)).is_err() {
            return false;
        }
        self.lock().journal = Some(journal);
        true
    }

    /// Asks `advice` which pages to evict first from now on (`None`: least recently used
    /// first). See [`EvictionAdvice`] for what it may do.
    pub fn set_eviction_advice(&self, advice: Option<Arc<dyn EvictionAdvice>>) {
        self.lock().advice = advice;
    }

    /// The current value of [`Self::set_free_reserve_pages`].
    pub fn free_reserve_pages(&self) -> usize {
        self.lock().cfg.free_reserve_pages
    }

    /// Out-of-memory failures so far, by cause.
    pub fn failure_summary(&self) -> Vec<(FailureCause, u64)> {
        self.lock().failures.summary()
    }

    /// Completes whatever swaps have finished (cheap; callers may call it when idle). The
    /// VMM calls that complete swap-outs are made without the lock.
    pub fn poll(&self) -> Result<(), CUresult> {
        self.polled().map(drop)
    }

    /// [`Self::poll`], returning the lock taken.
    fn polled(&self) -> Result<MutexGuard<'_, Inner>, CUresult> {
        let mut s = self.lock();
        let driver = s.driver.clone();
        s.fences.flush(&*driver)?;
        s.poll_with(false)?;
        Ok(self.complete(s))
    }

    /// [`Self::poll`], then evicts idle pages ahead of need so that `free_reserve_pages`
    /// device frames are free or on their way (only once the budget is used up). Never waits;
    /// a background thread of the interposer may call it periodically. `prepare_access` does
    /// the same after each on-demand swap.
    pub fn maintain(&self) -> Result<(), CUresult> {
        drop(self.polled()?);
        // Host memory the evictions want pinned is pinned without the lock (this thread can
        // afford the wait), and they are made again.
        self.swapping_out(|s| {
            s.reserve_pins = true;
            let r = s.keep_reserve(false);
            s.reserve_pins = false;
            r.map(|()| 0)
        })
        .map(drop)
    }

    /// Residency of the page holding `addr` (for tests and diagnostics).
    pub fn residency(&self, addr: CUdeviceptr) -> Option<ResidencyState> {
        let s = self.lock();
        let p = s.page_of(addr)?;
        s.pages.get(p).map(|e| e.state)
    }

    /// Bytes of the pages that hold live data, wherever they are (device or host): what the
    /// process would keep resident if it could.
    pub fn footprint_bytes(&self) -> usize {
        let s = self.lock();
        s.pages
            .iter()
            .filter(|(_, e)| e.live > 0 && e.state != ResidencyState::Unbacked)
            .count()
            * s.page
    }

    /// Device bytes created and not given back (free frames included): what the process
    /// holds.
    pub fn device_bytes_held(&self) -> usize {
        let s = self.lock();
        s.dev.created_frames() * s.page
    }

    /// Host pool bytes created and free frames (waits for background growth to settle).
    pub fn host_pool_state(&self) -> (usize, usize) {
        let s = self.lock();
        s.host.quiesce();
        (s.host.size_bytes(), s.host.free_frames())
    }
}

impl Drop for MemoryManager {
    fn drop(&mut self) {
        let mut s = self.lock();
        s.shutdown();
    }
}

impl Inner {
    /// Whether pages may have to leave the device: some have before (a step that overran the
    /// budget once overruns it again), or the frames in use reach the free reserve. Until
    /// then a device unit's shape costs nothing, and units cut afresh for new allocations
    /// cost VMM calls on the allocation path (and event queries for whether the old unit is
    /// idle): without a budget on the H100 they made ResNet-50's step under the shim 1.5 to 2
    /// times native (docs/gpu-results.md).
    fn pages_may_move(&self) -> bool {
        self.stats.pages_evicted > 0 || self.dev.available() <= self.cfg.free_reserve_pages
    }

    /// What the operation that just stopped for host memory needs made, taken under the
    /// lock. It gave back what it had taken of that kind before it stopped, so the pool must
    /// hold one more than is free now: asked only for "one free", the pool found the ones
    /// given back and pinned nothing, and an eviction that needed many host units spun
    /// through all its host rounds (4,096, 1.3 s on the card) before pinning them with the
    /// lock held, every launch of the job waiting (GPT-2 under `lru` on the H200).
    fn take_host_wanted(&mut self) -> Option<HostNeed> {
        let want = self.host_wanted.take()?;
        let free = match want {
            HostWant::Frames => self.host.free_single_frames(),
            HostWant::Unit(pages) => self.host.free_units(pages),
        };
        Some(HostNeed {
            want,
            at_least: free + 1,
        })
    }

    /// Whether the operation may stop to have host memory pinned without the lock (and
    /// counts the round).
    fn host_round(&mut self) -> bool {
        let left = self.op.host_rounds_left > 0;
        if left {
            self.op.host_rounds_left -= 1;
        }
        left
    }

    /// Takes one of the operation's unlocked rounds if it has one left: then it stops, for
    /// its caller to wait or make driver calls without the lock and start it over.
    fn unlocked_round(&mut self) -> bool {
        let left = self.op.unlocked_rounds_left > 0;
        if left {
            self.op.unlocked_rounds_left -= 1;
        } else {
            self.stats.locked_waits += 1;
        }
        left
    }

    /// Whether the operation stopped to have its caller wait or make driver calls without
    /// the lock, and start it over (`MemoryManager::waiting_for_pins`).
    fn wants_unlocked_round(&self) -> bool {
        !self.copy_waits.is_empty()
            || self.completion_wanted
            || self.remap_stall
            || self.host_wanted.is_some()
            || self.arrival.is_some()
    }

    /// Runs `f` with its evictions counted as for `demand`.
    fn for_demand<T>(&mut self, demand: Demand, f: impl FnOnce(&mut Self) -> T) -> T {
        let outer = std::mem::replace(&mut self.demand, demand);
        let r = f(self);
        self.demand = outer;
        r
    }

    fn page_of(&self, addr: CUdeviceptr) -> Option<usize> {
        let off = addr.checked_sub(self.base)?;
        (off < self.sub.frontier()).then_some((off / self.page as u64) as usize)
    }

    fn va(&self, page: usize) -> CUdeviceptr {
        self.base + (page * self.page) as u64
    }

    /// Inclusive page runs of the arena part of `[a, a+len)`.
    fn pages_of(&self, a: CUdeviceptr, len: u64) -> Option<(usize, usize)> {
        let lo = a.max(self.base);
        let hi = a.saturating_add(len).min(self.base + self.sub.frontier());
        (lo < hi).then(|| {
            let p = self.page as u64;
            (
                ((lo - self.base) / p) as usize,
                ((hi - 1 - self.base) / p) as usize,
            )
        })
    }
}

/// Page copies `(dst, src)` merged into as few copies as possible: consecutive pages whose
/// destinations and sources are both contiguous become one (the host pool hands out frames
/// in address order, so a run of evicted pages usually lands in one run of frames).
fn coalesce(
    copies: &[(CUdeviceptr, CUdeviceptr)],
    page: usize,
) -> Vec<(CUdeviceptr, CUdeviceptr, usize)> {
    let mut out: Vec<(CUdeviceptr, CUdeviceptr, usize)> = Vec::new();
    for &(dst, src) in copies {
        match out.last_mut() {
            Some((d, s, len)) if *d + *len as u64 == dst && *s + *len as u64 == src => *len += page,
            _ => out.push((dst, src, page)),
        }
    }
    out
}

/// Inclusive runs of consecutive numbers in a sorted slice.
fn runs(sorted: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &p in sorted {
        match out.last_mut() {
            Some(last) if p == last.1 + 1 => last.1 = p,
            Some(last) if p == last.1 => {}
            _ => out.push((p, p)),
        }
    }
    out
}
