//! The process's memory managers, as the hooks see them: one per device, each created on the
//! first allocation (or `cuMemGetInfo`) in a context of its device, from the configuration's
//! policy, budget and host cap (each device gets the budget, a percentage being of each card;
//! the host cap is the process's, shared by the devices' pools). See "Several devices" in `docs/memory.md`.
//!
//! Creation is lazy because it needs a current context (the application's) and the card's
//! free memory, neither of which exists when the library is loaded. If the manager cannot be
//! created (the policy is `off`, the driver lacks the VMM calls, reserving the arena fails)
//! the hooks forward to the driver exactly as without a manager. Which calls the manager
//! serves is decided in [`crate::hooks`]; what it does with them is [`crate::memory`].
//!
//! Once started, a maintenance thread per manager calls [`MemoryManager::maintain`] every
//! millisecond: swaps whose copies finished are completed (their unmaps and remaps) and pages
//! are evicted ahead of need there, off the launch path. They are stopped at exit
//! ([`stop_maintenance`]) before the driver is torn down.
//!
//! Every driver call of the manager, from any thread, runs in relaxed stream-capture mode
//! (see [`crate::real_memory`]), and the maintenance thread is relaxed for good, so that
//! none of them can invalidate an application's graph capture.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tensile_driver_abi::CUdevice;

use crate::config::{Config, Policy};
use crate::memory::budget::{self, format_size};
use crate::memory::frames::SharedHostCap;
use crate::memory::{Driver, ManagerConfig, MemoryManager, PhysLocation, SizeSpec};
use crate::real::RealDriver;
use crate::real_memory::{RealMemoryDriver, SetupError};

/// A running memory manager and the context it serves.
pub struct Managed {
    pub mm: MemoryManager,
    /// The same driver the manager uses, for the context checks and synchronous frees the
    /// hooks need.
    pub driver: Arc<RealMemoryDriver>,
    /// Whether the statistics are logged at exit (the log filter admits `info`). Decided
    /// now: at exit the logging machinery's thread-locals may already be gone.
    pub log_stats_at_exit: bool,
    /// The most device memory this job may use whatever it is granted: the budget
    /// `TENSILE_DEVICE_MEMORY` resolves to (`None`: not set, the card is the limit).
    pub limit: Option<usize>,
    /// The card's total memory, as the driver reported it when the manager started.
    pub card_bytes: u64,
}

/// The most devices whose memory one process manages; a device of a higher ordinal is left
/// to the driver (said once).
pub const MAX_MANAGED_DEVICES: usize = 16;

/// The process's memory managers: one per device it allocates on, each created on the first
/// allocation (or `cuMemGetInfo`) in a context of that device, with its own arena, budget,
/// host pool and maintenance thread. Per device, `None` inside means "never": creation failed
/// for good (or the policy is `off`).
///
/// Lookups on the hooks' paths are lock-free: the managers running are kept in the order they
/// started in a fixed array, and a process with one manager (every process using one device)
/// finds it with the same loads as when there could be only one.
pub struct Managers {
    /// By device ordinal: the device's manager, once its creation was decided.
    by_device: [OnceLock<Option<Managed>>; MAX_MANAGED_DEVICES],
    /// The managers running, in the order they started: the first `count` are set.
    started: [OnceLock<&'static Managed>; MAX_MANAGED_DEVICES],
    count: AtomicUsize,
    /// Whether creating a manager failed for good on some device (or the policy is `off`).
    refused: AtomicBool,
    init: Mutex<()>,
}

impl Default for Managers {
    fn default() -> Self {
        Managers {
            by_device: std::array::from_fn(|_| OnceLock::new()),
            started: std::array::from_fn(|_| OnceLock::new()),
            count: AtomicUsize::new(0),
            refused: AtomicBool::new(false),
            init: Mutex::new(()),
        }
    }
}

impl std::fmt::Debug for Managers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<_> = self.running().map(|m| m.driver.device()).collect();
        f.debug_struct("Managers")
            .field("devices", &devices)
            .field("refused", &self.refused.load(Ordering::Relaxed))
            .finish()
    }
}

/// The pinned host memory all of the process's managers may hold together
/// (`TENSILE_HOST_MEMORY`, or its default): set by the first manager started.
static PROCESS_HOST_CAP: OnceLock<SharedHostCap> = OnceLock::new();

/// [`PROCESS_HOST_CAP`], made with `cap_bytes` by its first caller.
fn process_host_cap(cap_bytes: usize) -> &'static SharedHostCap {
    PROCESS_HOST_CAP.get_or_init(|| SharedHostCap::new(cap_bytes))
}

/// What the manager will be set up with, resolved against the card and the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    pub device_budget: usize,
    pub host_cap: usize,
}

/// The budget and host cap from the configuration, and one line for each setting that could
/// not be used as given. `TENSILE_DEVICE_MEMORY` (default: the card's free memory less
/// headroom, [`budget::default_device_budget`]; a percentage is of the card's total) and
/// `TENSILE_HOST_MEMORY` (default: half the host's physical memory; a percentage is of the
/// physical memory). A value below one page is refused for the default; a budget above the
/// card's memory, or a host cap above the physical memory (when known), is clamped to it.
pub fn sizing(
    device: Option<SizeSpec>,
    host: Option<SizeSpec>,
    card_free: u64,
    card_total: u64,
    host_total: u64,
) -> (Sizing, Vec<String>) {
    let mut notes = Vec::new();
    let page = crate::config::MIN_MEMORY_SETTING;
    let default_budget = budget::default_device_budget(card_free, card_total);
    let device_budget = match device {
        Some(spec) => {
            let b = spec.resolve(card_total);
            if b < page {
                notes.push(format!(
                    "TENSILE_DEVICE_MEMORY={} is {} of the card's {}, below one page ({}); \
                     using {} ({})",
                    show(spec),
                    format_size(b),
                    format_size(card_total),
                    format_size(page),
                    crate::config::DEFAULT_DEVICE_MEMORY,
                    format_size(default_budget)
                ));
                default_budget
            } else if card_total > 0 && b > card_total {
                notes.push(format!(
                    "TENSILE_DEVICE_MEMORY={} is above the card's memory ({}); the budget is \
                     capped at {}",
                    show(spec),
                    format_size(card_total),
                    format_size(card_total)
                ));
                card_total
            } else {
                b
            }
        }
        None => default_budget,
    };
    let default_host = host_total / 2;
    let host_cap = match host {
        Some(spec) => {
            let h = spec.resolve(host_total);
            if h < page {
                notes.push(format!(
                    "TENSILE_HOST_MEMORY={} is {} of the host's {}, below one page ({}); \
                     using {} ({})",
                    show(spec),
                    format_size(h),
                    format_size(host_total),
                    format_size(page),
                    crate::config::DEFAULT_HOST_MEMORY,
                    format_size(default_host)
                ));
                default_host
            } else if host_total > 0 && h > host_total {
                notes.push(format!(
                    "TENSILE_HOST_MEMORY={} is above the host's physical memory ({}); the \
                     pinned host pool is capped at {}",
                    show(spec),
                    format_size(host_total),
                    format_size(host_total)
                ));
                host_total
            } else {
                h
            }
        }
        None => default_host,
    };
    let sizing = Sizing {
        device_budget: usize::try_from(device_budget).unwrap_or(usize::MAX),
        host_cap: usize::try_from(host_cap).unwrap_or(usize::MAX),
    };
    (sizing, notes)
}

/// A size setting as the user wrote it, near enough (`40%`, `6 GiB`).
fn show(spec: SizeSpec) -> String {
    match spec {
        SizeSpec::Bytes(b) => format_size(b).replace(' ', ""),
        SizeSpec::Fraction(f) => {
            let pct = format!("{:.4}", f * 100.0);
            format!("{}%", pct.trim_end_matches('0').trim_end_matches('.'))
        }
    }
}

/// Host frames the swap engine holds beyond the pages that are off the device: the device
/// frames it keeps free ahead of need (each was emptied by a swap-out, whose host copy
/// stays), plus one eviction batch in flight. See "The host pool" in `docs/memory.md`.
pub fn host_frames_in_flight(mc: &ManagerConfig) -> usize {
    mc.free_reserve_pages + mc.evict_batch
}

/// What [`fit_to_host_cap`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostCapFit {
    /// The cap holds the defaults with room to spare.
    Fits,
    /// The free reserve and the eviction batch were shrunk to half the cap (the user's cap
    /// is a limit on pinned memory, and is kept): the line says so.
    Shrunk(String),
    /// Not even one page in flight plus one swapped page fit: any run over the budget fails.
    TooSmall(String),
}

/// Fits what the swap engine holds in flight to the host cap, known at start: the free
/// reserve and the eviction batch may take at most half the pool, so that the other half
/// holds swapped pages. A cap below two pages cannot swap anything; that is said at start.
pub fn fit_to_host_cap(mc: &mut ManagerConfig) -> HostCapFit {
    let cap_pages = mc.host_cap / mc.page_size;
    if cap_pages >= 2 * host_frames_in_flight(mc) {
        return HostCapFit::Fits;
    }
    if cap_pages < 2 {
        return HostCapFit::TooSmall(format!(
            "the pinned host pool cap of {} cannot hold one page being swapped out and one \
             swapped page: any run over the device budget of {} will fail \
             (TENSILE_HOST_MEMORY; at least {} is needed)",
            format_size(mc.host_cap as u64),
            format_size(mc.device_budget as u64),
            format_size(2 * mc.page_size as u64),
        ));
    }
    let (reserve, batch) = (mc.free_reserve_pages, mc.evict_batch);
    let room = cap_pages / 2;
    mc.evict_batch = batch.min((room / 2).max(1));
    mc.free_reserve_pages = reserve.min(room - mc.evict_batch);
    HostCapFit::Shrunk(format!(
        "the pinned host pool cap of {} holds what is off the device plus what the swap engine \
         holds in flight: it now keeps {} frames free ahead of need and evicts {} pages at \
         once (instead of {reserve} and {batch}), so footprints up to {} fit",
        format_size(mc.host_cap as u64),
        mc.free_reserve_pages,
        mc.evict_batch,
        format_size(footprint_reach(mc) as u64),
    ))
}

/// The largest footprint the host cap can take at this budget (see "The host pool" in
/// `docs/memory.md`).
pub fn footprint_reach(mc: &ManagerConfig) -> usize {
    let cap = mc.host_cap / mc.page_size * mc.page_size;
    mc.device_budget
        .saturating_add(cap.saturating_sub(host_frames_in_flight(mc) * mc.page_size))
}

/// Physical memory of the host, in bytes (0 if unknown).
fn host_physical_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return 0;
    }
    (pages as u64).saturating_mul(page as u64)
}

impl Managers {
    /// The first manager started: the one plans serve (`TENSILE_POLICY=plan`), and the one a
    /// process using one device has.
    #[inline]
    pub fn first(&self) -> Option<&'static Managed> {
        self.started[0].get().copied()
    }

    /// The managers running, in the order they started.
    #[inline]
    pub fn running(&self) -> impl Iterator<Item = &'static Managed> + '_ {
        let count = self.count.load(Ordering::Acquire);
        self.started[..count]
            .iter()
            .filter_map(|m| m.get().copied())
    }

    /// How many managers run.
    #[inline]
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// The manager whose arena holds `ptr`, if any (the arenas are disjoint address ranges).
    #[inline]
    pub fn owning(&self, ptr: u64) -> Option<&'static Managed> {
        self.running().find(|m| m.mm.owns(ptr))
    }

    /// The manager of device `device`, if it runs.
    pub fn on_device(&self, device: CUdevice) -> Option<&'static Managed> {
        self.running().find(|m| m.driver.device() == device)
    }

    /// The manager whose context is current on this thread, if any (one driver call).
    pub fn of_current_context(&self) -> Option<&'static Managed> {
        let first = self.first()?;
        let current = first.driver.current_context();
        self.running().find(|m| m.driver.context() == current)
    }

    /// Whether no manager runs and none will: the policy is `off`, or creation failed for
    /// good.
    pub fn never(&self) -> bool {
        self.count() == 0 && self.refused.load(Ordering::Acquire)
    }

    /// The manager serving allocations made now on this thread: the one of the current
    /// context's device, created now if the policy asks for one and none was tried on that
    /// device yet. `None`: the driver serves them (policy `off`, creation failed, no context
    /// current yet, or the current context is not the one the device's manager serves).
    #[inline]
    pub fn for_current_context(
        &'static self,
        config: &Config,
        real: &RealDriver,
    ) -> Option<&'static Managed> {
        if let Some(first) = self.first() {
            // One driver call, as when the process could have one manager only.
            let current = first.driver.current_context();
            if current == first.driver.context() {
                return Some(first);
            }
            if self.count() > 1 {
                if let Some(m) = self.running().find(|m| m.driver.context() == current) {
                    return Some(m);
                }
            }
            // Another context: a device not tried yet gets a manager, a device tried (its
            // manager serves another of its contexts, or failed) is the driver's.
            let device = first.driver.current_device()?;
            let cell = self.cell_of(device)?;
            if cell.get().is_some() {
                return None;
            }
        } else if self.never() {
            return None;
        }
        self.create_for_current_context(config, real)
    }

    /// The cell of `device`'s manager; `None` (said once) for an ordinal beyond
    /// [`MAX_MANAGED_DEVICES`].
    fn cell_of(&self, device: CUdevice) -> Option<&OnceLock<Option<Managed>>> {
        let cell = usize::try_from(device)
            .ok()
            .and_then(|d| self.by_device.get(d));
        if cell.is_none() {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "tensile: device {device} is beyond the {MAX_MANAGED_DEVICES} devices whose \
                     memory libtensile manages; its memory is not managed"
                );
            }
        }
        cell
    }

    #[cold]
    fn create_for_current_context(
        &'static self,
        config: &Config,
        real: &RealDriver,
    ) -> Option<&'static Managed> {
        if config.policy == Policy::Off {
            self.refused.store(true, Ordering::Release);
            return None;
        }
        // The driver's functions are looked up (the dynamic loader's lock) before `init` is
        // taken: a thread inside `dlopen` (a library constructor allocating) may be waiting
        // for `init`, and must never wait for a thread that waits for the loader.
        let driver = RealMemoryDriver::for_current_context(real);
        let _guard = self.init.lock().unwrap_or_else(|e| e.into_inner());
        let driver = match driver {
            Ok(d) => d,
            // Not an error yet: the application calls before making a context current.
            Err(SetupError::NoContext) => return None,
            Err(why) => {
                tracing::warn!("tensile: {}", cannot_start(&why));
                self.refused.store(true, Ordering::Release);
                return None;
            }
        };
        let cell = self.cell_of(driver.device())?;
        if let Some(m) = cell.get() {
            // Another thread created it meanwhile: served if it is this context's.
            return m
                .as_ref()
                .filter(|m| m.driver.context() == driver.context());
        }
        let index = self.count();
        let others: Vec<CUdevice> = self.running().map(|m| m.driver.device()).collect();
        let created = create(config, driver, index == 0);
        let m = match created {
            Ok(m) => cell.get_or_init(|| Some(m)).as_ref(),
            Err(why) => {
                tracing::warn!("tensile: {}", cannot_start(&why));
                self.refused.store(true, Ordering::Release);
                cell.get_or_init(|| None).as_ref()
            }
        }?;
        if index > 0 {
            say_another_device(config, m, &others);
        }
        let _ = self.started[index].set(m);
        self.count.store(index + 1, Ordering::Release);
        start_maintenance(m);
        Some(m)
    }
}

/// The line a second (third, ...) device's manager starts with: what it shares with the
/// first and what it does not.
fn say_another_device(config: &Config, m: &Managed, others: &[CUdevice]) {
    let first = others.first().copied().unwrap_or_default();
    let planning = if config.policy == Policy::Plan {
        format!(
            "; plans are learned and run for device {first} only: device {} swaps on demand \
             (lru)",
            m.driver.device()
        )
    } else {
        String::new()
    };
    tracing::info!(
        "tensile: this process uses several devices ({} and {}): each has its own memory \
         manager, budget and pinned host pool (TENSILE_DEVICE_MEMORY applies to each; \
         TENSILE_HOST_MEMORY caps their pools together){planning}",
        others
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        m.driver.device()
    );
}

/// The manager's page: the driver's VMM granularity for device memory (2 MiB on the H100;
/// smaller on a simulated GPU set up for a scaled trace). 2 MiB if the driver does not say or
/// says something unusable (not a power of two, or outside 64 KiB to 1 GiB).
fn page_of(driver: &RealMemoryDriver) -> usize {
    const H100_PAGE: usize = 2 << 20;
    match driver.mem_granularity(PhysLocation::Device(driver.device())) {
        Ok(g) if g.is_power_of_two() && (64 << 10..=1 << 30).contains(&g) => g,
        Ok(g) => {
            tracing::warn!(
                "tensile: the driver's VMM granularity of {g} bytes is unusable as a page; \
                 using 2 MiB"
            );
            H100_PAGE
        }
        Err(code) => {
            tracing::debug!(code, "cuMemGetAllocationGranularity failed; 2 MiB pages");
            H100_PAGE
        }
    }
}

/// The line for a manager that cannot start: why, and what that means for the program.
fn cannot_start(why: &dyn std::fmt::Display) -> String {
    format!(
        "the memory manager cannot start ({why}); memory is not managed: allocations go to \
         the driver, no budget is enforced"
    )
}

/// Starts the manager of `driver`'s context; `serves_plans`: it is the process's first, the
/// one plans serve.
fn create(
    config: &Config,
    driver: RealMemoryDriver,
    serves_plans: bool,
) -> Result<Managed, SetupError> {
    let driver = Arc::new(driver);
    let (free, total) = driver
        .mem_get_info()
        .map_err(|e| SetupError::Driver("cuMemGetInfo_v2", e))?;
    let (s, notes) = sizing(
        config.device_memory,
        config.host_memory,
        free as u64,
        total as u64,
        host_physical_bytes(),
    );
    for note in notes {
        tracing::warn!("tensile: {note}");
    }
    let mut mc = ManagerConfig::with_page(s.device_budget, s.host_cap, page_of(&driver));
    mc.device = driver.device();
    // The host cap is the process's: the pools of all its devices' managers pin no more
    // than it together (the first manager's cap, which every device resolves alike).
    mc.shared_host_cap = Some(process_host_cap(s.host_cap));
    mc.host_mapped = !config.swapped_unmapped;
    mc.host_units = config.host_frames == crate::config::HostFrames::Units;
    mc.hand_over = !config.handover_off;
    if config.swapped_unmapped {
        tracing::info!(
            "tensile: TENSILE_SWAPPED=unmapped: a swapped-out page's address is left unmapped; \
             an access the shim does not foresee faults the GPU"
        );
    }
    // The defaults suit budgets of gigabytes; a budget of a few pages (tests, the demo) must
    // not keep most of itself free, nor evict most of itself in one round.
    let budget_pages = (s.device_budget / mc.page_size).max(1);
    mc.free_reserve_pages = mc.free_reserve_pages.min(budget_pages / 4);
    mc.evict_batch = mc.evict_batch.clamp(1, (budget_pages / 4).max(1));
    match fit_to_host_cap(&mut mc) {
        HostCapFit::Fits => {}
        HostCapFit::Shrunk(line) => tracing::info!("tensile: {line}"),
        HostCapFit::TooSmall(line) => tracing::warn!("tensile: {line}"),
    }
    let as_driver: Arc<dyn Driver> = driver.clone();
    let mm = MemoryManager::new(as_driver, mc)
        .map_err(|e| SetupError::Driver("reserving the arena", e))?;
    if config.trace.is_some() {
        // Every swap and stall into the trace, for `tensile trace-info --timeline`.
        mm.set_journal(Arc::new(crate::recorder::TraceJournal));
    }
    // A named coordinator divides the first device only (see `crate::other_devices`).
    let coordinated = serves_plans || config.coordinator == crate::config::Coordinator::Auto;
    if shares_the_card(config) && coordinated {
        // A grant grows as other jobs give memory back: an access larger than it waits
        // for that (a job just joined gets little until the others have shrunk) rather
        // than failing the application's call.
        mm.set_budget_wait(config.grant_wait.bound());
    }
    if config.policy == Policy::Plan && serves_plans {
        // While a plan is in effect, what the manager evicts on its own is the page the plan
        // needs last, not the least recently used.
        mm.set_eviction_advice(Some(Arc::new(crate::executor::PlanAdvice)));
    }
    let policy = match (config.policy, &config.plan_file) {
        (Policy::Plan, _) if !serves_plans => "lru on demand (plans serve the first device)",
        (Policy::Plan, Some(_)) => "the plan file's plan, on demand beside it",
        (Policy::Plan, None) => "learned plans, on demand until the first and beside them",
        _ => "lru on demand",
    };
    tracing::info!(
        "tensile: memory manager on device {}: budget {} (card: {} free of {}), page {}, host \
         pool cap {} (room for a footprint up to {}), swapping: {policy}",
        mc.device,
        format_size(s.device_budget as u64),
        format_size(free as u64),
        format_size(total as u64),
        format_size(mc.page_size as u64),
        format_size(mc.host_cap as u64),
        format_size(footprint_reach(&mc) as u64),
    );
    Ok(Managed {
        mm,
        driver,
        log_stats_at_exit: tracing::enabled!(tracing::Level::INFO),
        limit: config.device_memory.map(|_| s.device_budget),
        card_bytes: total as u64,
    })
}

/// Whether this job's device budget comes from a coordinator that divides the card among
/// jobs (and so may shrink while it runs).
fn shares_the_card(config: &Config) -> bool {
    config.policy == Policy::Plan
        && config.plan_file.is_none()
        && config.coordinator != crate::config::Coordinator::Off
}

static STOP: AtomicBool = AtomicBool::new(false);
/// Maintenance threads running (one per manager).
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Starts the maintenance thread of `m` (one per manager).
fn start_maintenance(m: &'static Managed) {
    RUNNING.fetch_add(1, Ordering::AcqRel);
    let spawned = std::thread::Builder::new()
        .name("tensile-maintain".into())
        .spawn(move || {
            // A panic here must not take the application down; the thread just ends. (The
            // manager's state stays usable after one: its lock recovers from poisoning.)
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| maintain_loop(m)));
            RUNNING.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        RUNNING.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!("tensile: no maintenance thread ({e}); evictions happen on demand only");
    }
}

fn maintain_loop(m: &'static Managed) {
    // This thread's calls (evictions, syncs) must never break an application's capture.
    m.driver.relax_thread_for_good();
    if let Err(code) = m.driver.bind_current_thread() {
        tracing::warn!("tensile: the maintenance thread cannot use the context (error {code})");
        return;
    }
    let mut failures = 0u32;
    while !STOP.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
        match m.mm.maintain() {
            Ok(()) => failures = 0,
            Err(code) => {
                failures += 1;
                // A broken context fails every call: say so once and stop trying.
                if failures == 100 {
                    tracing::warn!(
                        "tensile: background maintenance keeps failing (error {code}); stopped"
                    );
                    return;
                }
            }
        }
    }
}

/// Stops the maintenance threads (at exit), waiting for them at most 100 ms.
pub fn stop_maintenance() {
    STOP.store(true, Ordering::Release);
    let deadline = Instant::now() + Duration::from_millis(100);
    while RUNNING.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn spec(text: &str) -> Option<SizeSpec> {
        Some(SizeSpec::parse(text).unwrap())
    }

    #[test]
    fn sizing_defaults_and_settings() {
        let (s, notes) = sizing(None, None, 70 * GIB, 80 * GIB, 32 * GIB);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(s.device_budget as u64, 66 * GIB, "free less 5% of the card");
        assert_eq!(s.host_cap as u64, 16 * GIB);
        let (s, notes) = sizing(spec("40%"), spec("6GiB"), 70 * GIB, 80 * GIB, 32 * GIB);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(s.device_budget as u64, 32 * GIB);
        assert_eq!(s.host_cap as u64, 6 * GIB);
        let (s, _) = sizing(None, spec("50%"), 1, 2, 10 * GIB);
        assert_eq!(s.host_cap as u64, 5 * GIB);
    }

    #[test]
    fn a_percentage_below_one_page_is_refused_for_the_default() {
        let (s, notes) = sizing(spec("1%"), spec("0.001%"), 60 << 20, 100 << 20, 100 * GIB);
        assert_eq!(
            s.device_budget as u64,
            (105 << 20) / 2,
            "60 MiB free less an eighth"
        );
        assert_eq!(s.host_cap as u64, 50 * GIB);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes[0].starts_with("TENSILE_DEVICE_MEMORY=1% is 1 MiB of the card's 100 MiB")
                && notes[0].contains("below one page (2 MiB)")
                && notes[0].ends_with("(52.5 MiB)"),
            "{}",
            notes[0]
        );
        assert!(
            notes[1].starts_with("TENSILE_HOST_MEMORY=0.001%")
                && notes[1].contains("below one page")
                && notes[1].ends_with("(50 GiB)"),
            "{}",
            notes[1]
        );
    }

    #[test]
    fn a_host_cap_above_physical_memory_is_clamped() {
        for text in ["1TiB", "100TiB"] {
            let (s, notes) = sizing(None, spec(text), GIB, GIB, 23 * GIB);
            assert_eq!(s.host_cap as u64, 23 * GIB, "{text}");
            assert_eq!(notes.len(), 1);
            assert_eq!(
                notes[0],
                format!(
                    "TENSILE_HOST_MEMORY={text} is above the host's physical memory (23 GiB); \
                     the pinned host pool is capped at 23 GiB"
                )
            );
        }
        // The same for a budget above the card.
        let (s, notes) = sizing(spec("100TiB"), None, GIB, 2 * GIB, 23 * GIB);
        assert_eq!(s.device_budget as u64, 2 * GIB);
        assert_eq!(
            notes,
            [
                "TENSILE_DEVICE_MEMORY=100TiB is above the card's memory (2 GiB); the budget is \
              capped at 2 GiB"
            ]
        );
        // Unknown physical memory: nothing to clamp against.
        let (s, notes) = sizing(None, spec("1TiB"), GIB, GIB, 0);
        assert_eq!((s.host_cap as u64, notes.len()), (1 << 40, 0));
    }

    #[test]
    fn a_small_host_cap_shrinks_what_swapping_holds_in_flight() {
        const MIB: usize = 1 << 20;
        let defaults = |host_cap| {
            let mut mc = ManagerConfig::new(64 * MIB, host_cap);
            mc.free_reserve_pages = 8;
            mc.evict_batch = 8;
            mc
        };
        let mut mc = defaults(64 * MIB);
        assert_eq!(host_frames_in_flight(&mc), 16);
        assert_eq!(fit_to_host_cap(&mut mc), HostCapFit::Fits);
        assert_eq!((mc.free_reserve_pages, mc.evict_batch), (8, 8));
        assert_eq!(
            footprint_reach(&mc),
            96 * MIB,
            "64 MiB budget + 64 - 32 MiB"
        );

        // Issue 9, item 6: 48 MiB (24 pages) held 16 pages in flight and ran dry.
        let mut mc = defaults(48 * MIB);
        let HostCapFit::Shrunk(line) = fit_to_host_cap(&mut mc) else {
            panic!("{mc:?}")
        };
        assert_eq!((mc.free_reserve_pages, mc.evict_batch), (6, 6));
        assert_eq!(footprint_reach(&mc), 88 * MIB);
        assert!(
            line.starts_with("the pinned host pool cap of 48 MiB")
                && line.contains(
                    "keeps 6 frames free ahead of need and evicts 6 pages at once \
                                  (instead of 8 and 8), so footprints up to 88 MiB fit"
                ),
            "{line}"
        );

        let mut mc = defaults(4 * MIB);
        assert!(matches!(fit_to_host_cap(&mut mc), HostCapFit::Shrunk(_)));
        assert_eq!((mc.free_reserve_pages, mc.evict_batch), (0, 1));
        assert_eq!(mc.host_cap, 4 * MIB, "the user's cap is kept");

        let mut mc = defaults(2 * MIB);
        let HostCapFit::TooSmall(line) = fit_to_host_cap(&mut mc) else {
            panic!("{mc:?}")
        };
        assert_eq!(
            line,
            "the pinned host pool cap of 2 MiB cannot hold one page being swapped out and one \
             swapped page: any run over the device budget of 64 MiB will fail \
             (TENSILE_HOST_MEMORY; at least 4 MiB is needed)"
        );
    }

    #[test]
    fn a_manager_that_cannot_start_says_what_that_means() {
        assert_eq!(
            cannot_start(&"reserving the arena failed with error 2"),
            "the memory manager cannot start (reserving the arena failed with error 2); memory \
             is not managed: allocations go to the driver, no budget is enforced"
        );
    }

    #[test]
    fn host_memory_is_known() {
        assert!(host_physical_bytes() > 0);
    }
}
