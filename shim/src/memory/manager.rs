//! The memory manager: application allocations on the arena, the device budget, and
//! on-demand LRU swapping to the pinned host pool.
//!
//! # Invariants (each test in `tests.rs` checks them)
//! 1. **Pointers never move.** An allocation's virtual range is fixed from `alloc` to `free`;
//!    swapping changes what physical memory backs its pages, never the address.
//! 2. **Every page of a live allocation is mapped and accessible** (to a device or a host
//!    frame), so even an access the manager did not predict reads and writes the right bytes.
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
//! makes no driver call and allocates one small vector for the ticket. Swapping happens with
//! the lock held; the host pool has its own lock, taken after this one, and its grower thread
//! never takes this one. The one wait made *without* the lock is for pages pinned by other
//! threads' calls in flight: an operation that finds every evictable page pinned gives back
//! what it took, waits on `pins_released` (bounded) and starts over
//! (`MemoryManager::waiting_for_pins`).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tensile_driver_abi::{
    CUdeviceptr, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
};

use super::advice::{EvictionAdvice, NextUse};
use super::driver::{Driver, Event, Stream};
use super::failures::{human_bytes, FailureCause, FailureLog};
use super::fences::Fences;
use super::frames::{DevFrame, DevicePool, HostFrame, HostPool, HostPoolConfig, HostPoolError};
use super::page::{Frame, PageEntry, PageTable, ResidencyState, Use};
use super::stats::MemoryStats;
use super::suballoc::{SubAllocError, Suballocator};

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
}

impl ManagerConfig {
    /// Production defaults for a budget and host cap.
    pub fn new(device_budget: usize, host_cap: usize) -> Self {
        const MIB: usize = 1 << 20;
        Self {
            device: 0,
            page_size: 2 * MIB,
            // Room for a footprint of several times the card; VA is cheap.
            arena_bytes: (device_budget.saturating_mul(8)).clamp(64 << 30, 1 << 44),
            device_budget,
            grow_bytes: 32 * MIB,
            host_cap,
            host_chunk_bytes: 256 * MIB,
            numa_node: 0,
            host_background: true,
            evict_batch: 8,
            // About 3% of the budget, at least one eviction batch.
            free_reserve_pages: (device_budget / (2 * MIB) / 32).max(8),
            fence_every: 4,
            advice_sample: ADVICE_SAMPLE,
            host_mapped: true,
            host_units: false,
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
    spare_events: Vec<Event>,
    /// Pages in `ToHost` / `ToDevice`.
    outgoing: BTreeSet<usize>,
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
    /// Which pages to evict first, when a policy that knows the future says so.
    advice: Option<Arc<dyn EvictionAdvice>>,
    /// How many more times the current operation may wait for copies without the lock;
    /// after that it waits with the lock held (bounds the retries).
    unlocked_copy_waits_left: u32,
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
pub const MAX_UNIT_PAGES: usize = 32;

/// How many times one operation may release the lock to wait for swap-out copies before it
/// waits with the lock held (each wait is followed by a retry from the start).
const UNLOCKED_COPY_WAITS: u32 = 16;

/// The default of [`ManagerConfig::advice_sample`].
pub const ADVICE_SAMPLE: usize = 1024;

/// How long a request waits for pinned pages to be released before failing, by default.
pub const DEFAULT_PIN_WAIT: Duration = Duration::from_secs(10);

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
    base: CUdeviceptr,
    arena_bytes: usize,
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
                low_water_frames: (cfg.host_chunk_bytes / page / 4).max(1),
                background: cfg.host_background,
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
            spare_events: Vec::new(),
            outgoing: BTreeSet::new(),
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
            advice: None,
            unlocked_copy_waits_left: 0,
        };
        Ok(Self {
            inner: Mutex::new(inner),
            pins_released: Condvar::new(),
            pin_wait_ms: AtomicU64::new(DEFAULT_PIN_WAIT.as_millis() as u64),
            base,
            arena_bytes,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic inside the manager is a bug, but the state is still the best we have.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
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
        self.waiting_for_pins(|s| s.alloc(size, stream.unwrap_or(Stream(0))))
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

    pub fn stats(&self) -> MemoryStats {
        let s = self.lock();
        let mut st = s.stats;
        st.host_pool_bytes = s.host.size_bytes() as u64;
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
        let mut s = self.lock();
        let mut deadline: Option<Instant> = None;
        s.unlocked_copy_waits_left = UNLOCKED_COPY_WAITS;
        let mut budget_deadline: Option<Instant> = None;
        loop {
            s.pin_stall = None;
            s.budget_stall = None;
            s.copy_waits.clear();
            let result = op(&mut s);
            let waits = std::mem::take(&mut s.copy_waits);
            let err = match result {
                Ok(v) => {
                    s.unlocked_copy_waits_left = 0;
                    return Ok(v);
                }
                Err(e) => e,
            };
            if !waits.is_empty() {
                // Frames are on their way out: wait for those copies without the lock, so
                // threads whose data is resident go on meanwhile; then start over. A failed
                // wait is seen again (and reported) by the retry's completion of the swaps.
                let driver = s.driver.clone();
                drop(s);
                for ev in waits {
                    if let Err(e) = driver.event_synchronize(ev) {
                        tracing::debug!(code = e, "waiting for a swap-out copy failed");
                    }
                }
                s = self.lock();
                continue;
            }
            if let Some(needed) = s.budget_stall.take() {
                // The budget is a grant that may grow: wait for `set_budget` (which
                // notifies), up to the configured bound, then fail as a fixed budget would.
                let now = Instant::now();
                let end = *budget_deadline.get_or_insert_with(|| {
                    s.budget_waits += 1;
                    if s.budget_waits > 1 {
                        return now + s.budget_wait;
                    }
                    tracing::warn!(
                        "tensile: one access needs {} of device memory at once, more than this \
                         job's grant of {}; waiting up to {:.0} s for the coordinator to grant \
                         more (said once)",
                        human_bytes(needed),
                        human_bytes(s.dev.budget_frames() * s.page),
                        s.budget_wait.as_secs_f64()
                    );
                    now + s.budget_wait
                });
                if now >= end {
                    return Err(s.fail_budget(needed));
                }
                s = self.wait_for_wake(s, (end - now).min(Duration::from_millis(10)));
                continue;
            }
            let Some(stall) = s.pin_stall.take() else {
                s.unlocked_copy_waits_left = 0;
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
        self.lock().start_swap_out(ranges)
    }

    /// Starts swapping out the device-resident pages of `ranges` that no call in flight has
    /// pinned, ordered on the device after every use recorded so far: the copy stream waits for
    /// those uses' fences, so a page can leave right after the launch that last needs it was
    /// queued. Never waits on the host. Returns how many pages started leaving; like
    /// [`Self::start_swap_out`], an access in the meantime cancels them at no cost. For a
    /// policy that knows a page's last use before its next one (the plan executor).
    pub fn swap_out_after_use(&self, ranges: &[(CUdeviceptr, usize)]) -> Result<usize, CUresult> {
        self.lock().swap_out_after_use(ranges)
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
        let page = self.lock().page;
        let frames = bytes / page;
        if frames == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let r = self.waiting_for_pins(|s| s.set_budget(frames));
        self.pins_released.notify_all();
        r
    }

    /// How many device frames eviction ahead of need keeps free or on their way out (the
    /// least recently used pages leave to make them). A policy that makes room itself (a plan
    /// executor) sets 0 while it does, so that LRU does not evict what the plan keeps, and puts
    /// the configured value ([`ManagerConfig::free_reserve_pages`]) back when it stops.
    pub fn set_free_reserve_pages(&self, pages: usize) {
        self.lock().cfg.free_reserve_pages = pages;
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

    /// Completes whatever swaps have finished (cheap; callers may call it when idle).
    pub fn poll(&self) -> Result<(), CUresult> {
        self.lock().poll()
    }

    /// [`Self::poll`], then evicts idle pages ahead of need so that `free_reserve_pages`
    /// device frames are free or on their way (only once the budget is used up). Never waits;
    /// a background thread of the interposer may call it periodically. `prepare_access` does
    /// the same after each on-demand swap.
    pub fn maintain(&self) -> Result<(), CUresult> {
        self.lock().keep_reserve(true)
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

impl MemoryManager {
    /// Checks the bookkeeping: every device and host frame is free or owned by exactly one
    /// page (or, for host frames, waiting on a cancelled copy), the in-flight sets match the
    /// page states, and nothing pins a page. For tests; `Err` says what is wrong.
    pub fn audit(&self) -> Result<(), String> {
        use std::collections::HashSet;
        let s = self.lock();
        let mut dev: HashSet<DevFrame> = HashSet::new();
        let mut host: HashSet<HostFrame> = HashSet::new();
        let mut own_dev = |d: DevFrame, who: &str| {
            if dev.insert(d) {
                Ok(())
            } else {
                Err(format!("device frame {d:?} twice ({who})"))
            }
        };
        for d in s.dev.free_list() {
            own_dev(d, "free list")?;
        }
        let mut host_own = |h: HostFrame, who: &str| {
            if host.insert(h) {
                Ok(())
            } else {
                Err(format!("host frame {h:?} twice ({who})"))
            }
        };
        let (host_free, host_created) = s.host.free_list();
        for h in host_free {
            host_own(h, "free list")?;
        }
        for &(h, _) in &s.deferred_host {
            host_own(h, "deferred")?;
        }
        // Pins held for captured graphs are expected; any other pin is a lost ticket.
        let mut capture_pins: HashMap<usize, u32> = HashMap::new();
        for &(a, b) in s.capture_pinned.values() {
            for p in a..=b {
                *capture_pins.entry(p).or_default() += 1;
            }
        }
        for (p, e) in s.pages.iter() {
            let expected = capture_pins.get(&p).copied().unwrap_or(0);
            if e.pins != expected {
                return Err(format!(
                    "page {p} pinned {} times, {expected} of them for captured graphs",
                    e.pins
                ));
            }
            match e.state {
                ResidencyState::Unbacked => {}
                ResidencyState::Device(d) => own_dev(d, "page")?,
                ResidencyState::Host(h) => host_own(h, "page")?,
                ResidencyState::ToHost { dev, host, .. } => {
                    own_dev(dev, "page")?;
                    host_own(host, "page")?;
                    if !s.outgoing.contains(&p) {
                        return Err(format!("page {p} is ToHost but not outgoing"));
                    }
                }
                ResidencyState::ToDevice { dev, host, .. } => {
                    own_dev(dev, "page")?;
                    host_own(host, "page")?;
                    if !s.incoming.contains(&p) {
                        return Err(format!("page {p} is ToDevice but not incoming"));
                    }
                }
            }
        }
        if dev.len() != s.dev.created_frames() {
            return Err(format!(
                "{} device frames accounted for, {} created",
                dev.len(),
                s.dev.created_frames()
            ));
        }
        if host.len() != host_created {
            return Err(format!(
                "{} host frames accounted for, {host_created} created",
                host.len()
            ));
        }
        // Units whole: every page of a unit holds its frame of it, in order, in one state.
        let kind = |st: ResidencyState| match st {
            ResidencyState::ToHost { event, .. } => (1, Some(event)),
            ResidencyState::ToDevice { event, .. } => (2, Some(event)),
            ResidencyState::Host(_) => (3, None),
            ResidencyState::Device(_) => (4, None),
            ResidencyState::Unbacked => (0, None),
        };
        for (p, e) in s.pages.iter() {
            let Some(d) = e.state.device_frame() else {
                continue;
            };
            let (_, n) = s.dev.unit(d);
            let first = p
                .checked_sub(d.offset as usize)
                .ok_or_else(|| format!("page {p} holds {d:?} below the arena"))?;
            for (i, q) in (first..first + n).enumerate() {
                let other = s.pages.get(q).map(|o| o.state);
                let frame = other.and_then(|st| st.device_frame());
                if frame
                    != Some(DevFrame {
                        unit: d.unit,
                        offset: i as u32,
                    })
                {
                    return Err(format!(
                        "unit {} of page {p} is not whole: page {q} holds {frame:?}",
                        d.unit
                    ));
                }
                if other.map(kind) != Some(kind(e.state)) {
                    return Err(format!(
                        "unit {} is split: page {p} is {:?}, page {q} {other:?}",
                        d.unit, e.state
                    ));
                }
            }
        }
        // Host units whole likewise.
        for (p, e) in s.pages.iter() {
            let Some((a, n)) = s.host_unit_span(p).filter(|&(_, n)| n > 1) else {
                continue;
            };
            for q in a..a + n {
                let other = s.pages.get(q).map(|o| o.state);
                if other.map(kind) != Some(kind(e.state))
                    || s.host_unit_span(q) != Some((a, n))
                    || s.unmapped_host.contains(&q) != s.unmapped_host.contains(&p)
                {
                    return Err(format!(
                        "host unit at page {a} ({n} pages) is split: page {p} is {:?}, page {q} \
                         {other:?}",
                        e.state
                    ));
                }
            }
        }
        for &p in &s.unmapped_host {
            if !matches!(
                s.pages.get(p).map(|e| e.state),
                Some(ResidencyState::Host(_))
            ) {
                return Err(format!("page {p} noted unmapped but not Host"));
            }
        }
        Ok(())
    }
}

impl Drop for MemoryManager {
    fn drop(&mut self) {
        let mut s = self.lock();
        s.shutdown();
    }
}

impl Inner {
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

    // ---- allocation ----

    fn alloc(&mut self, size: usize, stream: Stream) -> Result<CUdeviceptr, CUresult> {
        let slot = self.fences.slot_of(stream);
        if self.sub.has_pending_besides(slot) {
            // Other streams' frees are this stream's only once their fences completed: record
            // the fences they were promised, and learn which have completed (one event query
            // per stream). A stream's own frees it reuses at once, with no driver call.
            self.fences.flush(&*self.driver)?;
            self.fences.poll_all(&*self.driver)?;
        }
        let placed = match self.sub.alloc(size as u64, slot, self.fences.completed()) {
            Ok(p) => p,
            Err(SubAllocError::ZeroSize) => return Err(CUDA_ERROR_INVALID_VALUE),
            Err(_) => {
                let f = self.sub.fragmentation();
                return Err(self.failures.record(
                    FailureCause::Fragmentation,
                    format_args!(
                        "the {} arena has no room for {size} bytes ({}): {} free in {} holes, \
                         the largest {}",
                        human_bytes(self.cfg.arena_bytes),
                        human_bytes(size),
                        human_bytes(f.free_bytes as usize),
                        f.hole_count,
                        human_bytes(f.largest_hole as usize)
                    ),
                ));
            }
        };
        let a = placed.alloc;
        let Some((first, last)) = self.pages_of(a.ptr, a.span) else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        self.pages.ensure_len(last + 1);
        self.drop_stale_host_pages(first, last);
        self.clock += 1;
        for p in first..=last {
            if let Some(e) = self.pages.entry_mut(p) {
                e.live += 1;
                e.last_access = self.clock;
            }
            self.dead_device.remove(&p);
        }
        // Back the allocation; pre-back the rest of a fresh batch while device frames last.
        let mut want: Vec<usize> = Vec::new();
        let mut optional: Vec<usize> = Vec::new();
        for p in first..=last {
            if self
                .pages
                .get(p)
                .is_some_and(|e| e.state == ResidencyState::Unbacked)
            {
                want.push(p);
            }
        }
        if let Some((gs, ge)) = placed.grown {
            let page = self.page as u64;
            for p in (gs / page) as usize..(ge / page) as usize {
                if !(first..=last).contains(&p) {
                    optional.push(p);
                }
            }
            self.pages.ensure_len((ge / page) as usize);
            for &p in &optional {
                self.dead_device.remove(&p);
            }
        }
        let ready = match self.device_frames_for_new(&want) {
            Ok(frames) => frames,
            Err(e) => {
                // Copies out are in flight: the caller waits for them without the lock and
                // starts the allocation over.
                self.undo_alloc(a.ptr);
                return Err(e);
            }
        };
        if let Err(e) = self.back_pages(&want, ready, &optional) {
            // Undo the allocation; the pages it got stay backed and become dead.
            self.undo_alloc(a.ptr);
            return Err(e);
        }
        Ok(a.ptr)
    }

    /// Device frames for `n` pages of a new allocation, evicting to make room when none is
    /// free. A new page backed by host memory instead would be copied in at its first use,
    /// though its content is undefined, and that copy cannot be skipped: an access the shim
    /// did not see may have written the page through its host mapping. The eviction would
    /// happen at that first use anyway; made now, it saves the copy in (ResNet-50's rerun
    /// under a plan: 40% of the pages fetched on demand were such pages).
    ///
    /// Gives none, and the pages are backed by host memory as before, when the allocation is
    /// over half the budget or room cannot be made without waiting for other threads' pins.
    /// `Err` only when copies out are in flight and the caller should wait for them
    /// ([`Self::acquire_device_frames`]).
    fn device_frames_for_new(&mut self, pages: &[usize]) -> Result<Vec<DevFrame>, CUresult> {
        let n = pages.len();
        if n == 0 || n > self.dev.budget_frames() / 2 {
            return Ok(Vec::new());
        }
        match self.acquire_device_frames(pages) {
            Ok(frames) => Ok(frames),
            Err(e) if !self.copy_waits.is_empty() => Err(e),
            Err(e) => {
                tracing::debug!(code = e, "no device room for a new allocation: host-backed");
                self.pin_stall = None;
                Ok(Vec::new())
            }
        }
    }

    /// Pages `first..=last`, about to hold a new allocation, that are on the host with no
    /// live allocation hold bytes nobody can ask for: copying them back at the new
    /// allocation's first use would be wasted bandwidth. The idle ones give their host frame
    /// back and are backed afresh like any unbacked page (on the device when there is room).
    fn drop_stale_host_pages(&mut self, first: usize, last: usize) {
        let completed = self.fences.completed().to_vec();
        let dead_idle = |e: &PageEntry| {
            e.live == 0 && matches!(e.state, ResidencyState::Host(_)) && e.is_idle(&completed)
        };
        let stale: Vec<usize> = (first..=last)
            .filter(|&p| self.pages.get(p).is_some_and(dead_idle))
            .collect();
        // Whole host units only (their pages beyond the allocation too): a unit is unmapped
        // whole.
        let stale = self.whole_host_units(stale, dead_idle);
        if stale.is_empty() {
            return;
        }
        let r = self.unback_host_pages(&stale, &completed);
        self.remap_host();
        if let Err(code) = r {
            // Whatever was not unbacked is still mapped to its host frame: correct, and
            // copied back at its first use like any page on the host.
            tracing::debug!(code, "dropping dead host pages for a new allocation failed");
        }
    }

    fn undo_alloc(&mut self, ptr: CUdeviceptr) {
        if let Ok(a) = self.sub.remove(ptr) {
            self.drop_live(a.ptr, a.span);
            self.sub.release_now(a);
        }
    }

    fn drop_live(&mut self, ptr: CUdeviceptr, span: u64) {
        if let Some((first, last)) = self.pages_of(ptr, span) {
            for p in first..=last {
                if let Some(e) = self.pages.entry_mut(p) {
                    e.live = e.live.saturating_sub(1);
                    if e.live == 0 && matches!(e.state, ResidencyState::Device(_)) {
                        self.dead_device.insert(p);
                    }
                }
            }
        }
    }

    /// Gives every page in `want` a frame (one of `ready` while they last, then device if any
    /// is free or reclaimable without a copy, else host), and `optional` pages device frames
    /// while free ones last. Maps them and sets access in runs.
    fn back_pages(
        &mut self,
        want: &[usize],
        ready: Vec<DevFrame>,
        optional: &[usize],
    ) -> Result<(), CUresult> {
        let mut plan: Vec<(usize, Frame)> = Vec::with_capacity(want.len() + optional.len());
        let mut result = Ok(());
        let mut ready = ready.into_iter();
        for &p in want {
            if let Some(d) = ready.next() {
                plan.push((p, Frame::Device(d)));
                continue;
            }
            let f = match self.take_device_cheap() {
                Ok(Some(d)) => Frame::Device(d),
                Ok(None) => match self.take_host() {
                    Ok(h) => Frame::Host(h),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                },
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            plan.push((p, f));
        }
        // Frames made ready for pages a failure left without one go back.
        for d in ready {
            self.dev.give(d);
        }
        if result.is_ok() {
            for &p in optional {
                match self.dev.take(&*self.driver) {
                    Ok(Some(d)) => plan.push((p, Frame::Device(d))),
                    _ => break,
                }
            }
        }
        if let Err(e) = self.map_batch(&plan) {
            for &(_, f) in &plan {
                self.give_frame(f);
            }
            return Err(e);
        }
        for &(p, f) in &plan {
            let r = match f {
                Frame::Device(d) => self.pages.back_device(p, d),
                Frame::Host(h) => self.pages.back_host(p, h),
            };
            debug_assert!(r.is_ok(), "{r:?}");
            if matches!(f, Frame::Device(_)) && self.pages.get(p).is_some_and(|e| e.live == 0) {
                self.dead_device.insert(p);
            }
        }
        self.note_resident();
        // On failure the pages that did get frames stay backed (and consistent); the caller
        // undoes the allocation, which leaves them dead and reclaimable.
        result
    }

    fn give_frame(&mut self, f: Frame) {
        match f {
            Frame::Device(d) => self.dev.give(d),
            Frame::Host(h) => self.host.give(h),
        }
    }

    /// Maps each `(page, frame)` at the page's address: a device unit once, whole, at the page
    /// of its first frame (every frame of it must be in `plan`, at consecutive pages, in
    /// order), a host frame on its own (a host frame is an allocation of its own); then sets
    /// access in contiguous runs (one call may span several mappings). Undoes its own maps
    /// on failure.
    fn map_batch(&mut self, plan: &[(usize, Frame)]) -> Result<(), CUresult> {
        let page = self.page;
        let mut pages: Vec<usize> = plan.iter().map(|&(p, _)| p).collect();
        pages.sort_unstable();
        let mut mapped: Vec<(CUdeviceptr, usize)> = Vec::new();
        let mut err = None;
        for &(p, f) in plan {
            let (h, bytes) = match f {
                Frame::Device(d) if d.offset != 0 => continue,
                Frame::Device(d) => {
                    let (h, n) = self.dev.unit(d);
                    debug_assert!(
                        (1..n).all(|i| plan.iter().any(|&(q, g)| q == p + i
                            && g == Frame::Device(DevFrame {
                                unit: d.unit,
                                offset: i as u32
                            }))),
                        "unit {d:?} not whole in a map batch"
                    );
                    (h, n * page)
                }
                Frame::Host(hf) => {
                    let (first, n) = self.host.unit_of(hf);
                    if hf != first {
                        continue;
                    }
                    debug_assert!(
                        (1..n)
                            .all(|i| plan.iter().any(|&(q, g)| q == p + i
                                && g == Frame::Host(HostFrame(first.0 + i as u32)))),
                        "host unit {first:?} not whole in a map batch"
                    );
                    (self.host.location(hf).0, n * page)
                }
            };
            if let Err(e) = self.driver.mem_map(self.va(p), bytes, 0, h) {
                err = Some(e);
                break;
            }
            mapped.push((self.va(p), bytes));
        }
        if err.is_none() {
            for (a, b) in runs(&pages) {
                if let Err(e) =
                    self.driver
                        .mem_set_access(self.va(a), (b - a + 1) * page, self.cfg.device)
                {
                    err = Some(e);
                    break;
                }
            }
        }
        match err {
            None => Ok(()),
            Some(e) => {
                for (va, bytes) in mapped {
                    let _ = self.driver.mem_unmap(va, bytes);
                }
                Err(e)
            }
        }
    }

    /// The unit page `p`'s device frame belongs to, as `(first page, pages)`.
    fn unit_span(&self, p: usize) -> Option<(usize, usize)> {
        let d = self.pages.get(p)?.state.device_frame()?;
        let (_, n) = self.dev.unit(d);
        Some((p - d.offset as usize, n))
    }

    /// The host unit page `p`'s host frame belongs to (`Host`, `ToHost` or `ToDevice`), as
    /// `(first page, pages)`.
    fn host_unit_span(&self, p: usize) -> Option<(usize, usize)> {
        let h = match self.pages.get(p)?.state {
            ResidencyState::Host(h)
            | ResidencyState::ToHost { host: h, .. }
            | ResidencyState::ToDevice { host: h, .. } => h,
            _ => return None,
        };
        let (first, n) = self.host.unit_of(h);
        Some((p - (h.0 - first.0) as usize, n))
    }

    /// `Host` pages grown to whole host units (sorted, deduplicated), as
    /// [`Self::whole_units`] does for device units.
    fn whole_host_units(&self, pages: Vec<usize>, ok: impl Fn(&PageEntry) -> bool) -> Vec<usize> {
        self.grown_to_spans(pages, |p| self.host_unit_span(p), ok)
    }

    /// `pages` grown to whole units (sorted, deduplicated): the pages of a unit are taken
    /// together if every one of them passes `ok`, and left out together otherwise; a page
    /// without a device frame is taken if it passes `ok`.
    fn whole_units(&self, pages: Vec<usize>, ok: impl Fn(&PageEntry) -> bool) -> Vec<usize> {
        self.grown_to_spans(pages, |p| self.unit_span(p), ok)
    }

    /// `pages` grown to the spans `span` gives (a page alone where it gives none), each taken
    /// whole if every page of it passes `ok` and left out otherwise. Sorted, deduplicated.
    fn grown_to_spans(
        &self,
        mut pages: Vec<usize>,
        span: impl Fn(usize) -> Option<(usize, usize)>,
        ok: impl Fn(&PageEntry) -> bool,
    ) -> Vec<usize> {
        pages.sort_unstable();
        pages.dedup();
        let mut out = Vec::with_capacity(pages.len());
        let mut covered_to = 0;
        for p in pages {
            if p < covered_to {
                continue;
            }
            let (a, n) = span(p).unwrap_or((p, 1));
            covered_to = a + n;
            if self.span_all((a, n), &ok) {
                out.extend(a..a + n);
            }
        }
        out
    }

    /// Whether every page of the span `(first, pages)` passes `ok`.
    fn span_all(&self, (a, n): (usize, usize), ok: impl Fn(&PageEntry) -> bool) -> bool {
        (a..a + n).all(|q| self.pages.get(q).is_some_and(&ok))
    }

    /// The units of sorted whole-unit `pages` (pages with device frames), as `(first, pages)`.
    fn spans(&self, pages: &[usize]) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for &p in pages {
            if out.last().is_some_and(|&(a, n)| p < a + n) {
                continue;
            }
            if let Some(span) = self.unit_span(p) {
                out.push(span);
            }
        }
        out
    }

    /// Sorted `pages` cut into the units they get when brought in together: runs of
    /// consecutive pages that one live allocation covers whole (a unit moves whole, and two
    /// tensors seldom move together again), cut after [`MAX_UNIT_PAGES`]. A tensor's last
    /// page, which it covers only in part, is a unit of its own: the arena packs small
    /// tensors into the rest of it, and an access to one of them must not bring in (or pin)
    /// the whole tensor. Sizes in page order.
    /// The pages of a host unit (all in `pages`, as [`Self::whole_host_units`] makes them)
    /// get one device unit of their own: the same pages then leave again as one.
    fn unit_sizes(&self, pages: &[usize]) -> Vec<usize> {
        // The live allocation that covers page `p` whole, if one does.
        let owner = |p: usize| {
            let start = self.va(p);
            self.sub
                .find(start)
                .filter(|a| a.ptr + a.span >= start + self.page as u64)
                .map(|a| a.ptr)
        };
        let mut sizes: Vec<usize> = Vec::new();
        let mut prev: Option<(usize, Option<CUdeviceptr>)> = None;
        let mut i = 0;
        while i < pages.len() {
            let p = pages[i];
            if let Some((a, n)) = self.host_unit_span(p).filter(|&(_, n)| n > 1) {
                if a == p
                    && pages
                        .get(i..i + n)
                        .is_some_and(|w| w.iter().copied().eq(a..a + n))
                {
                    sizes.push(n);
                    prev = None;
                    i += n;
                    continue;
                }
            }
            let own = owner(p);
            // Only pages one allocation covers whole share a unit: where tensors share a page,
            // a unit over it would pull all of them in and out whenever one is touched.
            let joins = prev.is_some_and(|(q, o)| q + 1 == p && own.is_some() && o == own);
            match sizes.last_mut() {
                Some(n) if joins && *n < MAX_UNIT_PAGES => *n += 1,
                _ => sizes.push(1),
            }
            prev = Some((p, own));
            i += 1;
        }
        sizes
    }

    /// Removes the host mappings of `pages` (all `Host`). Every page whose mapping this
    /// removed is in `unmapped_host` afterwards, also when it fails part way.
    /// A host unit's mapping goes whole: its other pages are unmapped (and noted) with it.
    fn unmap_host_pages(&mut self, pages: &[usize]) -> Result<(), CUresult> {
        for &p in pages {
            if self.unmapped_host.contains(&p) {
                continue;
            }
            let (a, n) = self.host_unit_span(p).unwrap_or((p, 1));
            self.driver.mem_unmap(self.va(a), n * self.page)?;
            self.unmapped_host.extend(a..a + n);
        }
        Ok(())
    }

    fn note_resident(&mut self) {
        let resident = (self.dev.created_frames() - self.dev.free_frames()) * self.page;
        self.stats.peak_resident_bytes = self.stats.peak_resident_bytes.max(resident as u64);
    }

    fn take_host(&mut self) -> Result<HostFrame, CUresult> {
        match self.host.take() {
            Ok(h) => Ok(h),
            Err(first) => {
                // Dead host pages hold nothing anyone can ask for: take theirs.
                if self.reclaim_dead_host()? {
                    if let Ok(h) = self.host.take() {
                        return Ok(h);
                    }
                }
                Err(match first {
                    HostPoolError::CapReached { cap_bytes } => self.failures.record(
                        FailureCause::HostPool,
                        format_args!(
                            "the pinned host pool is full ({}, TENSILE_HOST_MEMORY)",
                            human_bytes(cap_bytes)
                        ),
                    ),
                    HostPoolError::Driver(code) => self.failures.record(
                        FailureCause::HostPool,
                        format_args!("the driver refused pinned host memory (error {code})"),
                    ),
                })
            }
        }
    }

    fn reclaim_dead_host(&mut self) -> Result<bool, CUresult> {
        let completed = self.fences.completed().to_vec();
        let dead_idle = |e: &PageEntry| {
            e.live == 0 && matches!(e.state, ResidencyState::Host(_)) && e.is_idle(&completed)
        };
        let dead: Vec<usize> = self
            .pages
            .iter()
            .filter(|(_, e)| dead_idle(e))
            .map(|(p, _)| p)
            .collect();
        // Whole host units only: a unit is unmapped whole.
        let dead = self.whole_host_units(dead, dead_idle);
        let r = self.unback_host_pages(&dead, &completed);
        self.remap_host();
        r.map(|()| !dead.is_empty())
    }

    /// Drops `pages` (`Host`, dead and idle, whole host units), unmapping them first in one
    /// go. Pages a failure leaves unmapped come back through `remap_host`.
    fn unback_host_pages(&mut self, pages: &[usize], completed: &[u64]) -> Result<(), CUresult> {
        self.unmap_host_pages(pages)?;
        for &p in pages {
            if matches!(
                self.pages.get(p).map(|e| e.state),
                Some(ResidencyState::Host(_))
            ) {
                self.unback(p, completed)?;
            }
        }
        Ok(())
    }

    /// Drops page `p` (no live allocation, idle) without a copy: a host page alone, a device
    /// page with the rest of its unit, which must be dead and idle too.
    fn unback(&mut self, p: usize, completed: &[u64]) -> Result<(), CUresult> {
        let dead_idle = |e: &PageEntry| {
            e.live == 0
                && e.is_idle(completed)
                && matches!(e.state, ResidencyState::Device(_) | ResidencyState::Host(_))
        };
        if !self.pages.get(p).is_some_and(dead_idle) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let on_host = matches!(
            self.pages.get(p).map(|e| e.state),
            Some(ResidencyState::Host(_))
        );
        let (a, n) = if on_host {
            self.host_unit_span(p).unwrap_or((p, 1))
        } else {
            self.unit_span(p).ok_or(CUDA_ERROR_INVALID_VALUE)?
        };
        if !self.span_all((a, n), dead_idle) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Unmap first: if that fails the pages keep their frames and stay consistent.
        if on_host {
            self.unmap_host_pages(&[a])?;
            for q in a..a + n {
                self.unmapped_host.remove(&q);
            }
        } else {
            self.driver.mem_unmap(self.va(a), n * self.page)?;
        }
        for q in a..a + n {
            match self.pages.unback(q, completed) {
                Ok(f) => {
                    self.give_frame(f);
                    self.dead_device.remove(&q);
                }
                Err(e) => debug_assert!(false, "unback after unmap refused: {e:?}"),
            }
        }
        Ok(())
    }

    /// A unit of `pages` device frames without copying anything: free, new within budget, or
    /// made from the units of dead idle pages. Its first frame and size.
    fn take_unit_cheap(&mut self, pages: usize) -> Result<Option<(DevFrame, usize)>, CUresult> {
        if let Some(u) = self.dev.take_unit(&*self.driver, pages)? {
            return Ok(Some(u));
        }
        self.fences.poll_all(&*self.driver)?;
        let completed = self.fences.completed().to_vec();
        let dead: Vec<usize> = self.dead_device.iter().copied().collect();
        let mut dropped_to = 0;
        for p in dead {
            if p < dropped_to || self.dev.available() >= pages {
                continue;
            }
            let Some((a, n)) = self.unit_span(p) else {
                continue;
            };
            dropped_to = a + n;
            let droppable = self.span_all((a, n), |e| {
                e.live == 0 && e.is_idle(&completed) && matches!(e.state, ResidencyState::Device(_))
            });
            if droppable {
                self.unback(a, &completed)?;
            }
        }
        self.dev.take_unit(&*self.driver, pages)
    }

    /// A one-page device frame without copying anything ([`Self::take_unit_cheap`]).
    fn take_device_cheap(&mut self) -> Result<Option<DevFrame>, CUresult> {
        Ok(self.take_unit_cheap(1)?.map(|(f, _)| f))
    }

    // ---- free ----

    fn free(&mut self, ptr: CUdeviceptr, stream: Option<Stream>) -> Result<(), CUresult> {
        let a = self.sub.remove(ptr).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if let Some(run) = self.capture_pinned.remove(&a.ptr) {
            // The pages stay until the fence below (or, for a synchronous free, the caller's
            // synchronization) covers the graph's last use.
            self.unpin_or_pin(run, false);
        }
        match stream {
            None => {
                self.drop_live(a.ptr, a.span);
                self.sub.release_now(a);
            }
            Some(s) => {
                let slot = self.fences.slot_of(s);
                // The fence comes with the stream's next recorded one (every `fence_every`
                // uses, or when another stream or an eviction needs it: `Fences::wait`,
                // `event_after`, `flush`), not one event per free.
                let seq = match self.fences.note(&*self.driver, slot, self.cfg.fence_every) {
                    Ok(seq) => seq,
                    Err(e) => {
                        // Keep the allocation: the free did not happen.
                        self.sub_reinsert(a);
                        return Err(e);
                    }
                };
                // The free's fence also covers work the manager did not see on that stream.
                if let Some((first, last)) = self.pages_of(a.ptr, a.span) {
                    self.add_fence_use(first..=last, slot, seq);
                }
                self.drop_live(a.ptr, a.span);
                self.sub.release_after(a, slot, seq);
            }
        }
        Ok(())
    }

    fn sub_reinsert(&mut self, a: super::suballoc::Allocation) {
        // Removing and re-adding keeps the allocation map the single source of truth.
        self.sub.reinsert(a);
    }

    // ---- access ----

    fn prepare_access(
        &mut self,
        stream: Stream,
        ranges: &[(CUdeviceptr, usize)],
    ) -> Result<AccessTicket, CUresult> {
        self.clock += 1;
        let mut runs_v: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
        for &(a, len) in ranges {
            if let Some(r) = self.pages_of(a, len as u64) {
                runs_v.push(r);
            }
        }
        if runs_v.len() > 1 {
            runs_v.sort_unstable();
            let mut merged: Vec<(usize, usize)> = Vec::with_capacity(runs_v.len());
            for (a, b) in runs_v {
                match merged.last_mut() {
                    Some(last) if a <= last.1 + 1 => last.1 = last.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            runs_v = merged;
        }
        let ticket = AccessTicket {
            stream,
            runs: runs_v,
        };
        let resident = self.pin_pages(&ticket);
        if resident {
            self.open_tickets += 1;
            return Ok(ticket);
        }
        let t0 = Instant::now();
        match self.make_resident(&ticket, false) {
            Ok(stalled) => {
                if stalled {
                    self.stats.stalled_launches += 1;
                    self.stats.stall_ns += t0.elapsed().as_nanos() as u64;
                }
                self.open_tickets += 1;
                Ok(ticket)
            }
            Err(e) => {
                self.unpin(&ticket);
                Err(e)
            }
        }
    }

    /// Pins every page of `ticket` (and marks it used now); whether all of them are already
    /// on the device (or hold nothing yet).
    fn pin_pages(&mut self, ticket: &AccessTicket) -> bool {
        let mut resident = true;
        for &(a, b) in &ticket.runs {
            for p in a..=b {
                if let Some(e) = self.pages.entry_mut(p) {
                    resident &= matches!(
                        e.state,
                        ResidencyState::Device(_) | ResidencyState::Unbacked
                    );
                    e.pins += 1;
                    e.last_access = self.clock;
                }
            }
        }
        resident
    }

    fn pin_for_capture(&mut self, ranges: &[(CUdeviceptr, usize)]) -> Result<(), CUresult> {
        // Whole allocations, not just the bytes touched: the pin lasts as long as the
        // allocation, and is undone by its free.
        let mut allocs: Vec<(CUdeviceptr, u64)> = Vec::new();
        for &(a, len) in ranges {
            if len == 0 {
                continue;
            }
            if let Some(al) = self.sub.find(a) {
                if !self.capture_pinned.contains_key(&al.ptr)
                    && !allocs.iter().any(|x| x.0 == al.ptr)
                {
                    allocs.push((al.ptr, al.span));
                }
            }
        }
        if allocs.is_empty() {
            return Ok(());
        }
        self.clock += 1;
        let mut runs_v: Vec<(usize, usize)> = allocs
            .iter()
            .filter_map(|&(p, span)| self.pages_of(p, span))
            .collect();
        runs_v.sort_unstable();
        let ticket = AccessTicket {
            stream: self.swap_in_stream,
            runs: runs(&runs_v.iter().flat_map(|&(a, b)| a..=b).collect::<Vec<_>>()),
        };
        let resident = self.pin_pages(&ticket);
        if !resident {
            if let Err(e) = self.make_resident(&ticket, true) {
                self.unpin(&ticket);
                return Err(e);
            }
        }
        // The ticket's pins become the allocations' pins: a page shared by two pinned
        // allocations holds one pin for each.
        self.unpin(&ticket);
        for (p, span) in allocs {
            if let Some(run) = self.pages_of(p, span) {
                self.unpin_or_pin(run, true);
                self.capture_pinned.insert(p, run);
            }
        }
        Ok(())
    }

    /// Adds (`pin`) or removes one pin on each page of the inclusive run.
    fn unpin_or_pin(&mut self, (a, b): (usize, usize), pin: bool) {
        for p in a..=b {
            if let Some(e) = self.pages.entry_mut(p) {
                e.pins = if pin {
                    e.pins + 1
                } else {
                    e.pins.saturating_sub(1)
                };
            }
        }
    }

    fn unpin(&mut self, t: &AccessTicket) {
        for &(a, b) in &t.runs {
            for p in a..=b {
                if let Some(e) = self.pages.entry_mut(p) {
                    e.pins = e.pins.saturating_sub(1);
                }
            }
        }
    }

    /// The slow path of `prepare_access`. Returns whether the access had to wait for a copy
    /// in (a stall); cancelling swap-outs alone is not one.
    /// `host_waits`: wait for the copies in on the host instead of making `t.stream` wait
    /// for them (a capturing stream must not wait on anything recorded outside its capture).
    fn make_resident(&mut self, t: &AccessTicket, host_waits: bool) -> Result<bool, CUresult> {
        // What must be on the device at once: the pages touched, and the rest of their units.
        let mut touched = self.access_footprint(t);
        if touched > self.dev.budget_frames() {
            // Units reaching past the access may be what makes it too large: they go out, and
            // the pages touched come back in units of their own.
            self.split_units_around(t)?;
            touched = self.access_footprint(t);
        }
        if touched > self.dev.budget_frames() {
            let needed = touched * self.page;
            if !self.budget_wait.is_zero() {
                self.budget_stall = Some(needed);
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            return Err(self.fail_budget(needed));
        }
        // Finished swap-outs are not completed here: that is VMM work (unmap, map, set
        // access) the launch does not need unless it is short of frames (`acquire_into` then
        // completes them); `maintain` does it off the launch path, in larger batches. A page
        // of this access still `ToHost` is then simply cancelled, at no cost.
        self.poll_with(false)?;
        let mut waits: Vec<Event> = Vec::new();
        let mut bring_in: Vec<usize> = Vec::new();
        let mut leaving: Vec<usize> = Vec::new();
        for p in t.runs.iter().flat_map(|&(a, b)| a..=b) {
            match self.pages.get(p).map(|e| e.state) {
                Some(ResidencyState::ToDevice { event, .. }) => waits.push(event),
                Some(ResidencyState::ToHost { .. }) => leaving.push(p),
                Some(ResidencyState::Host(_)) => bring_in.push(p),
                _ => {}
            }
        }
        // Still on the device: keep them there, with the rest of their units (a unit leaves
        // whole); the host frames are free once the copies that fill them are done.
        let mut cancelled: Vec<usize> = Vec::new();
        for p in self.whole_units(leaving, |e| {
            matches!(e.state, ResidencyState::ToHost { .. })
        }) {
            if let Ok((h, ev)) = self.pages.cancel_swap_out(p) {
                self.outgoing.remove(&p);
                self.deferred_host.push((h, ev));
                cancelled.push(p);
            }
        }
        if !cancelled.is_empty() {
            self.guard_cancelled(&cancelled);
        }
        if !bring_in.is_empty() {
            // A host unit's mapping goes whole, so its pages come in together.
            let bring_in =
                self.whole_host_units(bring_in, |e| matches!(e.state, ResidencyState::Host(_)));
            let frames = self.acquire_device_frames(&bring_in)?;
            waits.push(self.swap_in(&bring_in, frames)?);
        }
        waits.sort_unstable();
        waits.dedup();
        let stalled = !waits.is_empty();
        for ev in waits {
            if host_waits {
                self.driver.event_synchronize(ev)?;
            } else {
                self.driver.stream_wait_event(t.stream, ev)?;
            }
        }
        // Under pressure: start the next evictions now, off the next access's critical path.
        // A failure here only means less is free ahead of time; the access itself is ready.
        if let Err(e) = self.keep_reserve(false) {
            tracing::debug!(code = e, "evicting ahead of need failed");
        }
        Ok(stalled)
    }

    /// Pages that must be on the device at once for `t`: those it touches (backed), with
    /// the rest of their units.
    fn access_footprint(&self, t: &AccessTicket) -> usize {
        let pages = self.whole_units(t.runs.iter().flat_map(|&(a, b)| a..=b).collect(), |e| {
            e.state != ResidencyState::Unbacked
        });
        let (host, other): (Vec<usize>, Vec<usize>) = pages.into_iter().partition(|&p| {
            matches!(
                self.pages.get(p).map(|e| e.state),
                Some(ResidencyState::Host(_))
            )
        });
        other.len()
            + self
                .whole_host_units(host, |e| matches!(e.state, ResidencyState::Host(_)))
                .len()
    }

    /// Sends the units that hold pages of `t` and pages outside it to the host, and waits
    /// until they are there: brought back for `t`, its pages then get units of their own. For
    /// an access that fits the budget only without those units' other pages. Units pinned by
    /// other calls in flight stay.
    fn split_units_around(&mut self, t: &AccessTicket) -> Result<(), CUresult> {
        let inside = |p: usize| t.runs.iter().any(|&(a, b)| (a..=b).contains(&p));
        let touched: Vec<usize> = t.runs.iter().flat_map(|&(a, b)| a..=b).collect();
        let straddling: Vec<(usize, usize)> = self
            .spans(&self.whole_units(touched.clone(), |e| e.state.device_frame().is_some()))
            .into_iter()
            .filter(|&(a, n)| !(a..a + n).all(inside))
            .collect();
        // This access's own pins would hold them: drop them meanwhile (the lock is held).
        self.unpin(t);
        let r = (|| {
            if straddling.is_empty() {
                return Ok(());
            }
            self.wait_incoming()?;
            let pages: Vec<usize> = straddling.iter().flat_map(|&(a, n)| a..a + n).collect();
            let victims = self.whole_units(pages, |e| {
                e.pins == 0 && matches!(e.state, ResidencyState::Device(_))
            });
            if !victims.is_empty() {
                self.order_swap_out_after_uses(&victims)?;
                let need = victims.len();
                self.swap_out_pages(victims, need, SwapOrder::AfterUses)?;
            }
            self.wait_outgoing()
        })();
        let _ = self.pin_pages(t);
        r?;
        // Then host units reaching past the access (those just made too) become single
        // frames (a copy on the host).
        let mut host_units: Vec<(usize, usize)> = Vec::new();
        for &p in &touched {
            if let Some((a, n)) = self.host_unit_span(p).filter(|&(_, n)| n > 1) {
                let host = matches!(
                    self.pages.get(p).map(|e| e.state),
                    Some(ResidencyState::Host(_))
                );
                if host && !(a..a + n).all(inside) && !host_units.contains(&(a, n)) {
                    host_units.push((a, n));
                }
            }
        }
        for (a, n) in host_units {
            self.host_unit_to_singles(a, n)?;
        }
        Ok(())
    }

    /// Moves the pages of the host unit at `a` (`n` pages, all `Host`) to single host frames:
    /// a copy between the two in the host window, then the unit's mapping goes and the single
    /// frames are mapped page by page. The unit is free afterwards.
    fn host_unit_to_singles(&mut self, a: usize, n: usize) -> Result<(), CUresult> {
        let mut singles: Vec<HostFrame> = Vec::with_capacity(n);
        let give_back = |s: &mut Self, singles: Vec<HostFrame>| {
            for h in singles {
                s.host.give(h);
            }
        };
        for _ in 0..n {
            match self.take_host() {
                Ok(h) => singles.push(h),
                Err(e) => {
                    give_back(self, singles);
                    return Err(e);
                }
            }
        }
        self.host.regroup(&mut singles);
        let mut copies: Vec<(CUdeviceptr, CUdeviceptr)> = Vec::with_capacity(n);
        for (q, &h) in (a..a + n).zip(&singles) {
            let Some(ResidencyState::Host(old)) = self.pages.get(q).map(|e| e.state) else {
                give_back(self, singles);
                return Err(CUDA_ERROR_INVALID_VALUE);
            };
            copies.push((self.host.window_address(h), self.host.window_address(old)));
        }
        let copied = coalesce(&copies, self.page)
            .into_iter()
            .try_for_each(|(dst, src, len)| {
                self.driver
                    .memcpy_dtod_async(dst, src, len, self.swap_out_stream)
            });
        // Whatever was queued must have run before the frames are reused or given back.
        let synced = self.driver.stream_synchronize(self.swap_out_stream);
        if let Err(e) = copied.and(synced) {
            give_back(self, singles);
            return Err(e);
        }
        if let Err(e) = self.unmap_host_pages(&[a]) {
            give_back(self, singles);
            return Err(e);
        }
        for (q, h) in (a..a + n).zip(singles) {
            match self.pages.rehost(q, h) {
                Ok(old) => self.host.give(old),
                Err(e) => debug_assert!(false, "rehost refused: {e:?}"),
            }
        }
        self.remap_host();
        Ok(())
    }

    /// A cancelled swap-out's copy still reads the page: the page must not be remapped before
    /// it has run. A fence on the swap-out stream, recorded now, comes after that copy; it
    /// becomes a use of the page like any launch's.
    fn guard_cancelled(&mut self, pages: &[usize]) {
        let slot = self.fences.slot_of(self.swap_out_stream);
        let seq = match self.fences.record(&*self.driver, slot) {
            Ok(seq) => seq,
            // Promised fence: recorded on demand before anyone waits for it.
            Err(_) => self.fences.next_seq(slot),
        };
        self.add_fence_use(pages.iter().copied(), slot, seq);
    }

    /// Makes the fence `seq` on stream `slot` a use of each of `pages`: they are not idle
    /// until it completes.
    fn add_fence_use(&mut self, pages: impl IntoIterator<Item = usize>, slot: usize, seq: u64) {
        let completed = self.fences.completed().to_vec();
        let u = Use {
            stream_slot: slot as u32,
            seq,
        };
        for p in pages {
            if let Some(e) = self.pages.entry_mut(p) {
                e.add_use(u, &completed);
            }
        }
    }

    /// Completes finished swaps (swap-outs too only if `complete_outgoing`: see
    /// [`Self::poll_with`]) and, once the budget is used up, starts swap-outs of idle least
    /// recently used pages until `free_reserve_pages` frames are free or on their way. Never
    /// waits for anything.
    fn keep_reserve(&mut self, complete_outgoing: bool) -> Result<(), CUresult> {
        self.poll_with(complete_outgoing)?;
        let ready = self.dev.available() + self.outgoing.len();
        let reserve = self
            .cfg
            .free_reserve_pages
            .min(self.dev.budget_frames() / 2);
        if ready < reserve {
            self.evict(reserve - ready, 0)?;
        }
        Ok(())
    }

    fn copy_event(&mut self) -> Result<Event, CUresult> {
        match self.spare_events.pop() {
            Some(e) => Ok(e),
            None => self.driver.event_create(),
        }
    }

    fn ref_event(&mut self, ev: Event, n: u32) {
        *self.copy_event_refs.entry(ev).or_insert(0) += n;
    }

    fn unref_event(&mut self, ev: Event) {
        if let Some(n) = self.copy_event_refs.get_mut(&ev) {
            *n -= 1;
            if *n == 0 {
                self.copy_event_refs.remove(&ev);
                self.spare_events.push(ev);
            }
        }
    }

    /// Remaps `pages` (all `Host`) to `frames` and queues the copies in; returns the event
    /// the work that wants them must wait on.
    fn swap_in(&mut self, pages: &[usize], frames: Vec<DevFrame>) -> Result<Event, CUresult> {
        let page = self.page;
        // The event first: once pages are remapped, nothing may fail before the copies.
        let ev = match self.copy_event() {
            Ok(ev) => ev,
            Err(e) => {
                for d in frames {
                    self.dev.give(d);
                }
                return Err(e);
            }
        };
        // Unmap the host frames first; the data stays in them (and in the host window).
        let mut err = self.unmap_host_pages(pages).err();
        let plan: Vec<(usize, Frame)> = pages
            .iter()
            .zip(&frames)
            .map(|(&p, &d)| (p, Frame::Device(d)))
            .collect();
        if err.is_none() {
            if let Err(e) = self.map_batch(&plan) {
                err = Some(e);
            }
        }
        if let Some(e) = err {
            // Put the host frames back where they were; the pages stay `Host`.
            self.remap_host();
            for d in frames {
                self.dev.give(d);
            }
            self.spare_events.push(ev);
            return Err(e);
        }
        let mut copies: Vec<(CUdeviceptr, CUdeviceptr)> = Vec::with_capacity(plan.len());
        for &(p, _) in &plan {
            if let Some(ResidencyState::Host(h)) = self.pages.get(p).map(|e| e.state) {
                copies.push((self.va(p), self.host.window_address(h)));
            }
        }
        for (dst, src, len) in coalesce(&copies, page) {
            if let Err(e) = self
                .driver
                .memcpy_dtod_async(dst, src, len, self.swap_in_stream)
            {
                self.restore_host(pages, frames, ev);
                return Err(e);
            }
        }
        if let Err(e) = self.driver.event_record(ev, self.swap_in_stream) {
            self.restore_host(pages, frames, ev);
            return Err(e);
        }
        for &(p, f) in &plan {
            if let Frame::Device(d) = f {
                let r = self.pages.start_swap_in(p, d, ev);
                debug_assert!(r.is_ok(), "{r:?}");
                self.incoming.insert(p);
                self.unmapped_host.remove(&p);
            }
        }
        self.ref_event(ev, plan.len() as u32);
        self.stats.bytes_to_device += (plan.len() * page) as u64;
        self.stats.pages_swapped_in += plan.len() as u64;
        self.note_resident();
        // Pages that shared a host run with the ones that came in.
        self.remap_host();
        Ok(ev)
    }

    /// Undoes the remap of a failed swap-in: the pages (still `Host` in the table) get their
    /// host frames mapped back, and the device frames go back to the pool.
    ///
    /// Copies already queued must not run into a remapped range: wait for them first.
    fn restore_host(&mut self, pages: &[usize], frames: Vec<DevFrame>, ev: Event) {
        if let Err(e) = self.driver.stream_synchronize(self.swap_in_stream) {
            tracing::error!(code = e, "the swap-in stream failed");
        }
        self.spare_events.push(ev);
        for (&p, &d) in pages.iter().zip(&frames) {
            if d.offset == 0 {
                let (_, n) = self.dev.unit(d);
                let _ = self.driver.mem_unmap(self.va(p), n * self.page);
            }
            self.unmapped_host.insert(p);
        }
        self.remap_host();
        for d in frames {
            self.dev.give(d);
        }
    }

    /// Maps `Host` pages left unmapped by a failed driver call back to their host frames
    /// (without host mappings, [`ManagerConfig::host_mapped`], they stay unmapped).
    fn remap_host(&mut self) {
        if self.unmapped_host.is_empty() || !self.cfg.host_mapped {
            return;
        }
        let plan: Vec<(usize, Frame)> = self
            .unmapped_host
            .iter()
            .filter_map(|&p| match self.pages.get(p).map(|e| e.state) {
                Some(ResidencyState::Host(h)) => Some((p, Frame::Host(h))),
                _ => None,
            })
            .collect();
        match self.map_batch(&plan) {
            Ok(()) => self.unmapped_host.clear(),
            Err(e) => tracing::error!(
                code = e,
                pages = plan.len(),
                "could not map swapped-out pages to host memory; retrying later"
            ),
        }
    }

    /// Device frames for `pages` (sorted), one unit per run of consecutive pages (at most
    /// [`MAX_UNIT_PAGES`] each), in page order, evicting least recently used pages if it must
    /// (and waiting for their copies: this is the on-demand stall). All or nothing.
    fn acquire_device_frames(&mut self, pages: &[usize]) -> Result<Vec<DevFrame>, CUresult> {
        let sizes = self.unit_sizes(pages);
        self.acquire_units(&sizes)
    }

    /// Units of the given sizes, their frames in order ([`Self::acquire_device_frames`]).
    fn acquire_units(&mut self, sizes: &[usize]) -> Result<Vec<DevFrame>, CUresult> {
        let mut got = Vec::with_capacity(sizes.len());
        let r = self.acquire_into(sizes, &mut got);
        let frames = got
            .into_iter()
            .flat_map(|(first, n)| DevicePool::frames(first, n));
        if r.is_err() {
            // Whatever went wrong, the units taken so far go back.
            for d in frames {
                self.dev.give(d);
            }
            return r.map(|()| Vec::new());
        }
        Ok(frames.collect())
    }

    fn acquire_into(
        &mut self,
        sizes: &[usize],
        got: &mut Vec<(DevFrame, usize)>,
    ) -> Result<(), CUresult> {
        let mut rounds = 0;
        while got.len() < sizes.len() {
            let k = sizes[got.len()];
            if let Some(u) = self.take_unit_cheap(k)? {
                got.push(u);
                continue;
            }
            // Evict enough for the rest (in flight already counts), then wait for it.
            let short: usize = sizes[got.len()..].iter().sum();
            let in_flight = self.outgoing.len();
            if short > in_flight {
                let want = (short - in_flight).max(self.cfg.evict_batch);
                self.evict(want, short - in_flight)?;
            }
            if self.dev.available() >= k {
                continue; // dead pages were dropped without a copy
            }
            if !self.outgoing.is_empty() {
                // Copies out that have finished give their frames now.
                self.poll()?;
                if self.dev.available() >= k {
                    continue;
                }
                if self.outgoing.is_empty() {
                    // All of them landed and a unit of `k` is still short: evict again.
                    rounds += 1;
                    if rounds <= 4 {
                        continue;
                    }
                } else if self.unlocked_copy_waits_left > 0 {
                    // The rest is in flight: let the caller wait for it without the lock.
                    self.unlocked_copy_waits_left -= 1;
                    self.copy_waits = self.outgoing_events();
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
            }
            rounds += 1;
            if self.outgoing.is_empty() || rounds > 4 {
                // Nothing free, nothing on its way out, and nothing evictable: the resident
                // pages are pinned by calls in flight on other threads. Not an out-of-memory:
                // the caller gives back what it holds, waits for pins to drop and retries.
                self.pin_stall = Some(PinStall {
                    bytes_needed: short * self.page,
                });
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            self.wait_outgoing()?;
        }
        Ok(())
    }

    /// Starts swap-outs of up to `want` least recently used unpinned pages (at least `need`,
    /// ordered after their last uses on the device if there are not enough idle ones).
    fn evict(&mut self, want: usize, need: usize) -> Result<(), CUresult> {
        self.fences.poll_all(&*self.driver)?;
        let mut candidates = self.eviction_candidates();
        if candidates.len() < need && !self.incoming.is_empty() {
            // Pages still arriving hold frames too: let them land, then they can leave.
            self.wait_incoming()?;
            candidates = self.eviction_candidates();
        }
        // In rank order (oldest first, or needed last first when an adviser knows the future:
        // `eviction_candidates`), idle and busy alike: a hot page that happens to be idle right
        // now stays, a colder page still used by queued work leaves once that work is done. A
        // busy page is taken only while fewer than `need` victims are found; beyond that (the
        // optional part of a batch, or eviction ahead of need) it is skipped. Its copy is
        // ordered after its uses on the device (the swap-out stream waits for their fences),
        // so nothing here waits for the application's work with the lock held.
        // A unit leaves whole: a page is taken with the rest of its unit, and only if none of
        // them is pinned; the unit ranks where its first-ranked page does.
        let mut idle_victims: Vec<usize> = Vec::with_capacity(want.max(need));
        let mut busy_victims: Vec<usize> = Vec::new();
        let mut seen: std::collections::HashSet<usize> = std::collections::HashSet::new();
        for (_, p, _) in candidates {
            let taken = idle_victims.len() + busy_victims.len();
            if taken >= want.max(need) {
                break;
            }
            let Some((a, n)) = self.unit_span(p) else {
                continue;
            };
            if !seen.insert(a) {
                continue;
            }
            let unit = a..a + n;
            let entries: Vec<&PageEntry> = unit.clone().filter_map(|q| self.pages.get(q)).collect();
            if entries.len() != n
                || !entries
                    .iter()
                    .all(|e| e.pins == 0 && matches!(e.state, ResidencyState::Device(_)))
            {
                continue;
            }
            let completed = self.fences.completed();
            if entries.iter().all(|e| e.is_idle(completed)) {
                idle_victims.extend(unit);
                continue;
            }
            if taken >= need {
                continue;
            }
            if !entries.iter().all(|e| e.live == 0) {
                busy_victims.extend(unit);
                continue;
            }
            // A dead unit is dropped, not copied, and a drop needs it idle: wait for it.
            let uses: Vec<Use> = entries.iter().flat_map(|e| e.uses.clone()).collect();
            for u in uses {
                self.fences
                    .wait(&*self.driver, u.stream_slot as usize, u.seq)?;
            }
            let completed = self.fences.completed();
            if self.span_all((a, n), |e| e.is_idle(completed)) {
                idle_victims.extend(unit);
            }
        }
        let idle_need = need.min(idle_victims.len());
        let busy_need = need - idle_need;
        self.swap_out_pages(idle_victims, idle_need, SwapOrder::Idle)?;
        if busy_victims.is_empty() {
            return Ok(());
        }
        self.order_swap_out_after_uses(&busy_victims)?;
        self.swap_out_pages(busy_victims, busy_need, SwapOrder::AfterUses)
    }

    /// Makes the swap-out stream wait (on the device) for every recorded, incomplete use of
    /// `pages`: one wait per stream, on its latest fence among them.
    fn order_swap_out_after_uses(&mut self, pages: &[usize]) -> Result<(), CUresult> {
        let completed = self.fences.completed();
        let mut fences: Vec<(u32, u64)> = pages
            .iter()
            .filter_map(|&p| self.pages.get(p))
            .flat_map(|e| e.uses.iter())
            .filter(|u| {
                completed
                    .get(u.stream_slot as usize)
                    .is_none_or(|&c| c < u.seq)
            })
            .map(|u| (u.stream_slot, u.seq))
            .collect();
        fences.sort_unstable();
        // The latest fence of a stream covers its earlier ones (stream order).
        fences.reverse();
        fences.dedup_by_key(|&mut (slot, _)| slot);
        for (slot, seq) in fences {
            if let Some(ev) = self.fences.event_after(&*self.driver, slot as usize, seq)? {
                self.driver.stream_wait_event(self.swap_out_stream, ev)?;
            }
        }
        Ok(())
    }

    /// Starts the swap-out of `victims` (unpinned `Device` pages, idle unless `order` is
    /// [`SwapOrder::AfterUses`]); dead ones are dropped without a copy. Host frames are required
    /// for the first `need` copies only.
    fn swap_out_pages(
        &mut self,
        mut victims: Vec<usize>,
        need: usize,
        order: SwapOrder,
    ) -> Result<(), CUresult> {
        if victims.is_empty() {
            return Ok(());
        }
        // Callers pass whole units; this keeps it so whatever they pass.
        victims = self.whole_units(victims, |e| matches!(e.state, ResidencyState::Device(_)));
        let completed = self.fences.completed().to_vec();
        let mut copy: Vec<(usize, HostFrame)> = Vec::new();
        let mut i = 0;
        while i < victims.len() {
            let (a, n) = self.unit_span(victims[i]).unwrap_or((victims[i], 1));
            i += n;
            let unit = a..a + n;
            if self.span_all((a, n), |e| e.live == 0) {
                // A dead unit needs no copy: drop it instead (once idle; a dead unit still in
                // use is left for a later eviction).
                if self.span_all((a, n), |e| e.is_idle(&completed)) {
                    if let Err(e) = self.unback(a, &completed) {
                        for (_, h) in copy {
                            self.host.give(h);
                        }
                        return Err(e);
                    }
                }
                continue;
            }
            // A unit with live data is copied whole (its dead pages too: it is unmapped whole).
            // When its pages are to be mapped to host memory, each run of them that one live
            // allocation covers goes into a host unit of its own (one mapping instead of one
            // per page), the rest into single frames. Cut by today's allocations, not the
            // unit's: a device unit outlives the tensor it was made for, and a host unit over
            // two tensors would bring both in whenever one is used.
            let by_units = n > 1 && self.cfg.host_mapped && self.cfg.host_units;
            let pieces = if by_units {
                self.unit_sizes(&unit.collect::<Vec<_>>())
            } else {
                vec![n]
            };
            let mut frames: Vec<(usize, HostFrame)> = Vec::with_capacity(n);
            let mut failed = None;
            let mut q = a;
            for k in pieces {
                let piece = q..q + k;
                q += k;
                if by_units && k > 1 {
                    if let Some(first) = self.host.take_unit(k) {
                        frames.extend(piece.zip((first.0..).map(HostFrame)));
                        continue;
                    }
                }
                for r in piece {
                    match self.take_host() {
                        Ok(h) => frames.push((r, h)),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                if failed.is_some() {
                    break;
                }
            }
            if let Some(e) = failed {
                for (_, h) in frames {
                    self.host.give(h);
                }
                // The extra victims of a batch are optional.
                if copy.len() >= need {
                    break;
                }
                for (_, h) in copy {
                    self.host.give(h);
                }
                return Err(e);
            }
            copy.extend(frames);
        }
        if copy.is_empty() {
            return Ok(());
        }
        // Host frames in runs, in address order along the (sorted) pages: contiguous pages
        // then land in contiguous frames, so their copies merge and, once out, their host
        // mappings do too.
        // (Single frames only: a host unit's frames are already consecutive.)
        let singles: Vec<usize> = (0..copy.len())
            .filter(|&i| self.host.unit_of(copy[i].1).1 == 1)
            .collect();
        let mut frames: Vec<HostFrame> = singles.iter().map(|&i| copy[i].1).collect();
        self.host.regroup(&mut frames);
        for (&i, h) in singles.iter().zip(frames) {
            copy[i].1 = h;
        }
        let ev = match self.copy_event() {
            Ok(ev) => ev,
            Err(e) => {
                for (_, h) in copy {
                    self.host.give(h);
                }
                return Err(e);
            }
        };
        let copies: Vec<(CUdeviceptr, CUdeviceptr)> = copy
            .iter()
            .map(|&(p, h)| (self.host.window_address(h), self.va(p)))
            .collect();
        for (dst, src, len) in coalesce(&copies, self.page) {
            if let Err(e) = self
                .driver
                .memcpy_dtod_async(dst, src, len, self.swap_out_stream)
            {
                self.abandon_swap_out(copy, ev);
                return Err(e);
            }
        }
        if let Err(e) = self.driver.event_record(ev, self.swap_out_stream) {
            self.abandon_swap_out(copy, ev);
            return Err(e);
        }
        for &(p, h) in &copy {
            let r = match order {
                SwapOrder::Idle => self.pages.start_swap_out(p, h, ev, &completed),
                SwapOrder::AfterUses => self.pages.start_swap_out_after_uses(p, h, ev),
            };
            debug_assert!(r.is_ok(), "{r:?}");
            self.outgoing.insert(p);
        }
        self.ref_event(ev, copy.len() as u32);
        self.stats.bytes_to_host += (copy.len() * self.page) as u64;
        self.stats.pages_evicted += copy.len() as u64;
        Ok(())
    }

    /// Unpinned `Device` pages as (rank, page, idle), the first to evict first: least
    /// recently used first, or, when an adviser knows the future ([`EvictionAdvice`]), the
    /// pages it knows no further use of (oldest first), then the page needed last, then the
    /// pages it cannot place (oldest first), then those left out of its sample (oldest first).
    fn eviction_candidates(&self) -> Vec<(u64, usize, bool)> {
        let completed = self.fences.completed();
        // A unit leaves whole: one with a page pinned (or not yet arrived) cannot.
        let blocked: std::collections::HashSet<u32> = self
            .pages
            .iter()
            .filter(|(_, e)| e.pins > 0 || !matches!(e.state, ResidencyState::Device(_)))
            .filter_map(|(_, e)| e.state.device_frame().map(|d| d.unit))
            .collect();
        let mut ranked: Vec<(u64, usize, bool)> = self
            .pages
            .iter()
            .filter(|(_, e)| match e.state {
                ResidencyState::Device(d) => e.pins == 0 && !blocked.contains(&d.unit),
                _ => false,
            })
            .map(|(p, e)| (e.last_access, p, e.is_idle(completed)))
            .collect();
        if let Some(advice) = &self.advice {
            // The adviser is asked about an evenly spread sample of at most `advice_sample`
            // pages (every page while there are fewer): the answer costs about 0.25 µs a page
            // with the lock held (`cargo bench -p tensile-shim --bench eviction_advice`), 6 ms
            // for the 20,000 pages of a 40 GiB budget. The furthest next use in the sample
            // stands for the furthest overall; the pages left out rank after every sampled
            // one, oldest first.
            let stride = ranked.len().div_ceil(self.cfg.advice_sample.max(1)).max(1);
            let pages: Vec<CUdeviceptr> = ranked
                .iter()
                .step_by(stride)
                .map(|&(_, p, _)| self.va(p))
                .collect();
            let mut next = Vec::with_capacity(pages.len());
            if advice.next_uses(&pages, self.page as u64, &mut next) && next.len() == pages.len() {
                // Ages are clock values far below 2^62. Pages no longer needed keep their
                // age and go first; then the pages needed again, the furthest first; the pages
                // the adviser cannot place last, oldest first (it knows nothing of their uses,
                // and evicting a hot one the plan does not see would cost a fetch per use).
                let mut next = next.into_iter();
                for (i, c) in ranked.iter_mut().enumerate() {
                    if i % stride != 0 {
                        c.0 += 3 << 62;
                        continue;
                    }
                    match next.next() {
                        Some(NextUse::Never) | None => {}
                        Some(NextUse::In(launches)) => {
                            c.0 = (1 << 62) + u64::from(u32::MAX - launches)
                        }
                        Some(NextUse::Unknown) => c.0 += 1 << 63,
                    }
                }
            }
        }
        ranked.sort_unstable();
        ranked
    }

    /// Waits for the swap-ins in flight and completes them.
    fn wait_incoming(&mut self) -> Result<(), CUresult> {
        self.wait_swaps(&self.incoming, |state| match state {
            ResidencyState::ToDevice { event, .. } => Some(event),
            _ => None,
        })?;
        self.poll()
    }

    /// Waits for the events of the swaps in flight of `pages` (the `incoming` or `outgoing`
    /// set; `event` gives the event of a page still in that swap), each event once.
    fn wait_swaps(
        &self,
        pages: &BTreeSet<usize>,
        event: impl Fn(ResidencyState) -> Option<Event>,
    ) -> Result<(), CUresult> {
        for ev in self.swap_events(pages.iter().copied(), event) {
            self.driver.event_synchronize(ev)?;
        }
        Ok(())
    }

    /// Undoes a swap-out batch that could not be queued completely: the pages stay `Device`;
    /// the host frames are reused only after the copies already queued into them have run.
    fn abandon_swap_out(&mut self, copy: Vec<(usize, HostFrame)>, ev: Event) {
        if let Err(e) = self.driver.stream_synchronize(self.swap_out_stream) {
            tracing::error!(code = e, "the swap-out stream failed");
        }
        for (_, h) in copy {
            self.host.give(h);
        }
        self.spare_events.push(ev);
    }

    /// The events of the swap-outs in flight, each once.
    fn outgoing_events(&self) -> Vec<Event> {
        self.swap_events(self.outgoing.iter().copied(), |state| match state {
            ResidencyState::ToHost { event, .. } => Some(event),
            _ => None,
        })
    }

    /// The events of `pages` still in a swap (`event` gives it for a page still in that
    /// swap), each once, in order.
    fn swap_events(
        &self,
        pages: impl IntoIterator<Item = usize>,
        event: impl Fn(ResidencyState) -> Option<Event>,
    ) -> Vec<Event> {
        let mut evs: Vec<Event> = pages
            .into_iter()
            .filter_map(|p| self.pages.get(p).and_then(|e| event(e.state)))
            .collect();
        evs.sort_unstable();
        evs.dedup();
        evs
    }

    /// Waits for the swap-outs in flight and completes them.
    fn wait_outgoing(&mut self) -> Result<(), CUresult> {
        self.wait_swaps(&self.outgoing, |state| match state {
            ResidencyState::ToHost { event, .. } => Some(event),
            _ => None,
        })?;
        self.poll()
    }

    /// Completes finished swaps: remaps swapped-out pages to their host frames (freeing the
    /// device frames), ends finished swap-ins, and frees deferred host frames.
    fn poll(&mut self) -> Result<(), CUresult> {
        self.poll_with(true)
    }

    /// [`Self::poll`]; with `complete_outgoing` false only the part that makes no VMM call:
    /// finished swap-ins and deferred host frames (for the launch path).
    fn poll_with(&mut self, complete_outgoing: bool) -> Result<(), CUresult> {
        if complete_outgoing {
            // Fences promised to frees and launches of a stream that has gone quiet: recorded
            // here, off the fast path, so that what they cover can complete.
            self.fences.flush(&*self.driver)?;
        }
        let mut done_cache: HashMap<Event, bool> = HashMap::new();
        let driver = self.driver.clone();
        let mut query = |ev: Event| -> Result<bool, CUresult> {
            if let Some(&d) = done_cache.get(&ev) {
                return Ok(d);
            }
            let d = driver.event_query(ev)?;
            done_cache.insert(ev, d);
            Ok(d)
        };
        // Swap-ins.
        let incoming: Vec<usize> = self.incoming.iter().copied().collect();
        for p in incoming {
            let Some(ResidencyState::ToDevice { event, .. }) = self.pages.get(p).map(|e| e.state)
            else {
                continue;
            };
            if query(event)? {
                if let Ok(h) = self.pages.finish_swap_in(p, |_| true) {
                    if self.pages.get(p).is_some_and(|e| e.live == 0) {
                        // Freed while it was coming in.
                        self.dead_device.insert(p);
                    }
                    self.host.give(h);
                    self.incoming.remove(&p);
                    self.unref_event(event);
                }
            }
        }
        // Deferred host frames of cancelled swap-outs.
        let deferred = std::mem::take(&mut self.deferred_host);
        let mut failed = None;
        for (h, ev) in deferred {
            // After a failed query the rest are kept as they are, never dropped.
            let done = failed.is_none() && query(ev).map_err(|e| failed = Some(e)).unwrap_or(false);
            if done {
                self.host.give(h);
                self.unref_event(ev);
            } else {
                self.deferred_host.push((h, ev));
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if !complete_outgoing {
            return Ok(());
        }
        // Swap-outs: remap to host in one batch.
        let outgoing: Vec<usize> = self.outgoing.iter().copied().collect();
        let mut finished: Vec<(usize, DevFrame, Event)> = Vec::new();
        let mut failed: Option<CUresult> = None;
        // A unit is unmapped whole, once every page of it has been copied out and none is
        // pinned.
        let mut done_to = 0;
        for p in outgoing {
            if p < done_to {
                continue;
            }
            let Some((a, n)) = self.unit_span(p) else {
                continue;
            };
            done_to = a + n;
            let mut events: Vec<Event> = Vec::with_capacity(n);
            for q in a..a + n {
                let Some(ResidencyState::ToHost { event, .. }) =
                    self.pages.get(q).filter(|e| e.pins == 0).map(|e| e.state)
                else {
                    break;
                };
                match query(event) {
                    Ok(true) => events.push(event),
                    Ok(false) => break,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if failed.is_some() {
                break;
            }
            if events.len() != n {
                continue;
            }
            // Unmap the device unit before the state says Host, so a failure leaves the
            // pages as they were (and the units finished so far are still completed below).
            if let Err(e) = self.driver.mem_unmap(self.va(a), n * self.page) {
                failed = Some(e);
                break;
            }
            for (q, event) in (a..a + n).zip(events) {
                match self.pages.finish_swap_out(q, |_| true) {
                    Ok(d) => finished.push((q, d, event)),
                    Err(e) => debug_assert!(false, "{e:?}"),
                }
            }
        }
        if !finished.is_empty() {
            // If this fails the data is still safe in the host frames; the pages are noted
            // as unmapped and mapped again later (or brought in on their next access).
            // Without host mappings they stay unmapped until they come back.
            let mapped = if self.cfg.host_mapped {
                let plan: Vec<(usize, Frame)> = finished
                    .iter()
                    .filter_map(|&(p, _, _)| match self.pages.get(p).map(|e| e.state) {
                        Some(ResidencyState::Host(h)) => Some((p, Frame::Host(h))),
                        _ => None,
                    })
                    .collect();
                self.map_batch(&plan)
            } else {
                Ok(())
            };
            for (p, d, ev) in finished {
                self.outgoing.remove(&p);
                if mapped.is_err() || !self.cfg.host_mapped {
                    self.unmapped_host.insert(p);
                }
                self.dev.give(d);
                self.unref_event(ev);
            }
            mapped?;
        }
        self.remap_host();
        failed.map_or(Ok(()), Err)
    }

    fn note_access_done(&mut self, t: AccessTicket) -> Result<(), CUresult> {
        self.open_tickets = self.open_tickets.saturating_sub(1);
        let slot = self.fences.slot_of(t.stream);
        // If the fence cannot be recorded, the pages still must not leave before the work:
        // they wait for the stream's next fence instead (recorded on demand by an eviction).
        let (seq, result) = match self.fences.note(&*self.driver, slot, self.cfg.fence_every) {
            Ok(s) => (s, Ok(())),
            Err(e) => (self.fences.next_seq(slot), Err(e)),
        };
        let completed = self.fences.completed();
        let u = Use {
            stream_slot: slot as u32,
            seq,
        };
        for &(a, b) in &t.runs {
            for p in a..=b {
                if let Some(e) = self.pages.entry_mut(p) {
                    e.pins = e.pins.saturating_sub(1);
                    e.add_use(u, completed);
                }
            }
        }
        result
    }

    /// The failure after a bounded wait for pinned pages: names the pins and who holds them.
    /// Records (and logs, the first time) that one access needs `needed` bytes, more than
    /// the whole budget.
    fn fail_budget(&mut self, needed: usize) -> CUresult {
        let budget = self.dev.budget_frames() * self.page;
        self.failures.record(
            FailureCause::Budget,
            format_args!(
                "one access needs {} of device memory at once; the budget is {}",
                human_bytes(needed),
                human_bytes(budget)
            ),
        )
    }

    fn fail_pinned(&mut self, stall: PinStall, waited: Duration) -> CUresult {
        let pinned = self
            .pages
            .iter()
            .filter(|(_, e)| e.pins > 0 && e.state.device_frame().is_some())
            .count();
        let (calls, graphs) = (self.open_tickets, self.capture_pinned.len());
        let budget = self.dev.budget_frames() * self.page;
        self.failures.record(
            FailureCause::PinnedByCalls,
            format_args!(
                "{} of device memory needed; {pinned} pages ({}) of the {} budget are pinned \
                 by {calls} in-flight calls and {graphs} captured-graph allocations, and stayed \
                 pinned for {:.1} s",
                human_bytes(stall.bytes_needed),
                human_bytes(pinned * self.page),
                human_bytes(budget),
                waited.as_secs_f64()
            ),
        )
    }

    // ---- verbs for a planned policy ----

    /// Pages of `ranges` (inclusive runs), deduplicated.
    fn pages_in(&self, ranges: &[(CUdeviceptr, usize)]) -> Vec<usize> {
        let mut pages: Vec<usize> = ranges
            .iter()
            .filter_map(|&(a, len)| self.pages_of(a, len as u64))
            .flat_map(|(a, b)| a..=b)
            .collect();
        pages.sort_unstable();
        pages.dedup();
        pages
    }

    fn start_swap_out(&mut self, ranges: &[(CUdeviceptr, usize)]) -> Result<usize, CUresult> {
        self.fences.poll_all(&*self.driver)?;
        let completed = self.fences.completed();
        let victims = self.whole_units(self.pages_in(ranges), |e| {
            matches!(e.state, ResidencyState::Device(_)) && e.is_idle(completed)
        });
        let before = self.outgoing.len();
        self.swap_out_pages(victims, 0, SwapOrder::Idle)?;
        Ok(self.outgoing.len() - before)
    }

    fn swap_out_after_use(&mut self, ranges: &[(CUdeviceptr, usize)]) -> Result<usize, CUresult> {
        self.fences.poll_all(&*self.driver)?;
        // Pinned pages belong to a call in flight (it may still add uses), and a unit leaves
        // whole; dead units that are still busy are left for the next eviction to drop (a
        // drop needs them idle: `swap_out_pages`), and dead units arriving stay.
        let pages = self.pages_in(ranges);
        let victims = self.whole_units(pages.clone(), |e| {
            e.pins == 0 && matches!(e.state, ResidencyState::Device(_))
        });
        let mut arriving = self.whole_units(pages, |e| {
            e.pins == 0 && matches!(e.state, ResidencyState::ToDevice { .. })
        });
        let dead: Vec<(usize, usize)> = self
            .spans(&arriving)
            .into_iter()
            .filter(|&span| self.span_all(span, |e| e.live == 0))
            .collect();
        arriving.retain(|&p| !dead.iter().any(|&(a, n)| (a..a + n).contains(&p)));
        let before = self.outgoing.len();
        if !victims.is_empty() {
            // The copy stream waits (on the device, not here) for the last use of each page.
            self.order_swap_out_after_uses(&victims)?;
            self.swap_out_pages(victims, 0, SwapOrder::AfterUses)?;
        }
        if !arriving.is_empty() {
            self.swap_out_arriving(arriving)?;
        }
        Ok(self.outgoing.len() - before)
    }

    /// Starts the swap-out of `pages` (unpinned, live, `ToDevice`), ordered after their copy
    /// in and their uses: the host runs ahead of the device, so a page the plan brought in
    /// for one launch is often still arriving when the plan sends it back right after that
    /// launch. Skipping it would leave it on the device, where the plan counts it gone. The
    /// copy goes back into the page's own host frame (the copy in has read it by then).
    fn swap_out_arriving(&mut self, pages: Vec<usize>) -> Result<(), CUresult> {
        let arrivals = self.swap_events(pages.iter().copied(), |state| match state {
            ResidencyState::ToDevice { event, .. } => Some(event),
            _ => None,
        });
        for &ev in &arrivals {
            self.driver.stream_wait_event(self.swap_out_stream, ev)?;
        }
        self.order_swap_out_after_uses(&pages)?;
        let ev = self.copy_event()?;
        let copies: Vec<(CUdeviceptr, CUdeviceptr)> = pages
            .iter()
            .filter_map(|&p| match self.pages.get(p).map(|e| e.state) {
                Some(ResidencyState::ToDevice { host, .. }) => {
                    Some((self.host.window_address(host), self.va(p)))
                }
                _ => None,
            })
            .collect();
        // On failure the pages stay arriving, and their host frames go back to the pool once
        // they have arrived: copies into those frames already queued must be done by then.
        let abandon = |s: &mut Self, ev: Event| {
            if let Err(e) = s.driver.stream_synchronize(s.swap_out_stream) {
                tracing::error!(code = e, "the swap-out stream failed");
            }
            s.spare_events.push(ev);
        };
        for (dst, src, len) in coalesce(&copies, self.page) {
            if let Err(e) = self
                .driver
                .memcpy_dtod_async(dst, src, len, self.swap_out_stream)
            {
                abandon(self, ev);
                return Err(e);
            }
        }
        if let Err(e) = self.driver.event_record(ev, self.swap_out_stream) {
            abandon(self, ev);
            return Err(e);
        }
        let mut started = 0u32;
        let mut stayed = false;
        for &p in &pages {
            match self.pages.start_swap_out_while_arriving(p, ev) {
                Ok(arriving) => {
                    self.incoming.remove(&p);
                    self.outgoing.insert(p);
                    self.unref_event(arriving);
                    started += 1;
                }
                Err(_) => stayed = true,
            }
        }
        if stayed {
            // Not expected (the lock is held since the pages were chosen), but a page that
            // stayed arriving must not have its frame written after it is given back.
            if let Err(e) = self.driver.event_synchronize(ev) {
                tracing::error!(code = e, "a swap-out copy failed");
            }
        }
        // An event is either referenced by pages or spare, never both (shutdown destroys each
        // once).
        if started == 0 {
            self.spare_events.push(ev);
        } else {
            self.ref_event(ev, started);
        }
        self.stats.bytes_to_host += u64::from(started) * self.page as u64;
        self.stats.pages_evicted += u64::from(started);
        Ok(())
    }

    fn prefetch(&mut self, ranges: &[(CUdeviceptr, usize)]) -> Result<usize, CUresult> {
        let pages = self.pages_in(ranges);
        let coming: usize = pages
            .iter()
            .filter(|&&p| {
                self.pages
                    .get(p)
                    .is_some_and(|e| matches!(e.state, ResidencyState::Host(_)))
            })
            .count();
        if coming == 0 {
            return Ok(0);
        }
        // A ticket on the manager's own swap-in stream: the copies in are queued there and
        // the first access waits for them on its own stream, as for any page `ToDevice`.
        self.clock += 1;
        let ticket = AccessTicket {
            stream: self.swap_in_stream,
            runs: runs(&pages),
        };
        let _resident = self.pin_pages(&ticket);
        let r = self.make_resident(&ticket, false);
        self.unpin(&ticket);
        r.map(|_| coming)
    }

    fn set_budget(&mut self, frames: usize) -> Result<(), CUresult> {
        self.dev.set_budget_frames(frames);
        for _ in 0..8 {
            self.poll()?;
            let over = self.dev.in_use().saturating_sub(frames);
            if over == 0 {
                // Frames over the budget go back to the driver, for other jobs on the card.
                let driver = self.driver.clone();
                self.dev.release_free_frames(&*driver);
                return Ok(());
            }
            let out = self.outgoing.len();
            if over > out {
                self.evict(over - out, over - out)?;
            }
            if self.outgoing.is_empty() {
                break;
            }
            self.wait_outgoing()?;
        }
        // What is left over the budget is pinned by calls in flight: wait for them.
        self.pin_stall = Some(PinStall {
            bytes_needed: self.dev.in_use().saturating_sub(frames) * self.page,
        });
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }

    // ---- shutdown ----

    fn shutdown(&mut self) {
        self.failures.log_summary();
        let d = self.driver.clone();
        let _ = d.stream_synchronize(self.swap_in_stream);
        let _ = d.stream_synchronize(self.swap_out_stream);
        let pages: Vec<usize> = self
            .pages
            .iter()
            .filter(|(_, e)| e.state != ResidencyState::Unbacked)
            .map(|(p, _)| p)
            .collect();
        for p in pages {
            let bytes = match self.pages.get(p).and_then(|e| e.state.device_frame()) {
                Some(f) if f.offset != 0 => continue,
                Some(f) => self.dev.unit(f).1 * self.page,
                None if self.unmapped_host.contains(&p) => continue,
                None => match self.host_unit_span(p) {
                    Some((a, _)) if a != p => continue,
                    Some((_, n)) => n * self.page,
                    None => self.page,
                },
            };
            let _ = d.mem_unmap(self.va(p), bytes);
        }
        self.dev.release_all(&*d);
        self.host.release_all();
        let _ = d.mem_address_free(self.base, self.cfg.arena_bytes / self.page * self.page);
        self.fences.destroy(&*d);
        for ev in self
            .spare_events
            .drain(..)
            .chain(self.copy_event_refs.drain().map(|(e, _)| e))
        {
            let _ = d.event_destroy(ev);
        }
        let _ = d.stream_destroy(self.swap_in_stream);
        let _ = d.stream_destroy(self.swap_out_stream);
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

#[cfg(test)]
mod capture_pin_tests {
    //! Pins for captured graphs: resident at once without touching the capturing stream,
    //! never evicted while allocated, released by the free.

    use std::sync::Arc;

    use super::super::fake::{FakeConfig, FakeDriver, Progress};
    use super::*;

    const PAGE: usize = 64 << 10;

    fn setup(budget_pages: usize) -> (Arc<FakeDriver>, MemoryManager) {
        let fake = Arc::new(FakeDriver::new(FakeConfig {
            device_capacity: 1 << 40,
            host_capacity: 1 << 40,
            progress: Progress::Immediate,
        }));
        let cfg = ManagerConfig {
            device: 0,
            page_size: PAGE,
            arena_bytes: 1024 * PAGE,
            device_budget: budget_pages * PAGE,
            grow_bytes: 4 * PAGE,
            host_cap: 64 * PAGE,
            host_chunk_bytes: 8 * PAGE,
            numa_node: 0,
            host_background: false,
            evict_batch: 2,
            free_reserve_pages: 1,
            fence_every: 1,
            advice_sample: ADVICE_SAMPLE,
            host_mapped: true,
            host_units: false,
        };
        let mm = MemoryManager::new(fake.clone(), cfg).unwrap();
        (fake, mm)
    }

    fn touch(fake: &FakeDriver, mm: &MemoryManager, s: Stream, p: CUdeviceptr, len: usize) {
        let t = mm.prepare_access(s, &[(p, len)]).unwrap();
        fake.app_write(s, p, vec![p as u8; len]).unwrap();
        mm.note_access_done(t).unwrap();
    }

    fn on_device(mm: &MemoryManager, p: CUdeviceptr) -> bool {
        matches!(mm.residency(p), Some(ResidencyState::Device(_)))
    }

    #[test]
    fn a_capture_pinned_allocation_stays_resident_until_freed() {
        let (fake, mm) = setup(4);
        let s = fake.stream_create().unwrap();
        let a = mm.alloc(2 * PAGE, None).unwrap();
        touch(&fake, &mm, s, a, 2 * PAGE);
        // Push `a` out first, so the pin has to bring it back.
        let b = mm.alloc(4 * PAGE, None).unwrap();
        touch(&fake, &mm, s, b, 4 * PAGE);
        assert!(!on_device(&mm, a), "the budget forced `a` out");
        mm.pin_for_capture(&[(a + 100, 8)]).unwrap();
        assert!(mm.is_capture_pinned(a));
        assert!(on_device(&mm, a) && on_device(&mm, a + PAGE as u64));
        mm.audit().unwrap();
        // Pressure on the other pages never moves `a`.
        for _ in 0..3 {
            let c = mm.alloc(2 * PAGE, None).unwrap();
            touch(&fake, &mm, s, c, 2 * PAGE);
            touch(&fake, &mm, s, b, PAGE);
            assert!(on_device(&mm, a) && on_device(&mm, a + PAGE as u64));
            mm.free(c, None).unwrap();
        }
        // More than the unpinned rest of the budget at once is out of memory.
        assert_eq!(
            mm.prepare_access(s, &[(b, 4 * PAGE)]).err(),
            Some(CUDA_ERROR_OUT_OF_MEMORY)
        );
        mm.audit().unwrap();
        // Freed: unpinned, and its pages may go.
        mm.free(a, None).unwrap();
        assert!(!mm.is_capture_pinned(a));
        touch(&fake, &mm, s, b, 4 * PAGE);
        mm.audit().unwrap();
        assert!(fake.faults().is_empty() && fake.violations().is_empty());
    }
}
