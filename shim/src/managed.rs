//! The process's memory manager, as the hooks see it: created on the first allocation (or
//! `cuMemGetInfo`) in a context, from the configuration's policy, budget and host cap.
//!
//! Creation is lazy because it needs a current context (the application's) and the card's
//! free memory, neither of which exists when the library is loaded. If the manager cannot be
//! created (the policy is `off`, the driver lacks the VMM calls, reserving the arena fails)
//! the hooks forward to the driver exactly as without a manager. Which calls the manager
//! serves is decided in [`crate::hooks`]; what it does with them is [`crate::memory`].
//!
//! Once started, a maintenance thread calls [`MemoryManager::maintain`] every millisecond:
//! swaps whose copies finished are completed (their unmaps and remaps) and pages are evicted
//! ahead of need there, off the launch path. It is stopped at exit ([`stop_maintenance`])
//! before the driver is torn down.
//!
//! Every driver call of the manager, from any thread, runs in relaxed stream-capture mode
//! (see [`crate::real_memory`]), and the maintenance thread is relaxed for good, so that
//! none of them can invalidate an application's graph capture.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::config::{Config, Policy};
use crate::memory::{Driver, ManagerConfig, MemoryManager, SizeSpec};
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
}

impl Managed {
    /// Whether the calling thread's current context is the manager's (allocations made in
    /// another context go to the driver).
    pub fn in_our_context(&self) -> bool {
        self.driver.current_context() == self.driver.context()
    }
}

/// Holds the manager once created; `None` inside means "never": creation failed for good
/// or the policy is `off`.
#[derive(Default)]
pub struct MemorySlot {
    cell: OnceLock<Option<Managed>>,
    init: Mutex<()>,
}

impl std::fmt::Debug for MemorySlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.cell.get() {
            None => "not created",
            Some(None) => "off",
            Some(Some(_)) => "running",
        };
        f.debug_struct("MemorySlot").field("state", &state).finish()
    }
}

/// What the manager will be set up with, resolved against the card and the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    pub device_budget: usize,
    pub host_cap: usize,
}

/// The budget and host cap from the configuration: `TENSILE_DEVICE_MEMORY` (default: the
/// card's free memory; a percentage is of the card's total) and `TENSILE_HOST_MEMORY`
/// (default: half the host's physical memory; a percentage is of the physical memory).
pub fn sizing(
    device: Option<SizeSpec>,
    host: Option<SizeSpec>,
    card_free: u64,
    card_total: u64,
    host_total: u64,
) -> Sizing {
    let device_budget = match device {
        Some(spec) => spec.resolve(card_total),
        None => crate::memory::budget::default_device_budget(card_free),
    };
    let host_cap = match host {
        Some(spec) => spec.resolve(host_total),
        None => host_total / 2,
    };
    Sizing {
        device_budget: usize::try_from(device_budget).unwrap_or(usize::MAX),
        host_cap: usize::try_from(host_cap).unwrap_or(usize::MAX),
    }
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

impl MemorySlot {
    /// The manager, if it has been created.
    #[inline]
    pub fn get(&self) -> Option<&Managed> {
        self.cell.get().and_then(Option::as_ref)
    }

    /// The manager, created now if it was not yet and the policy asks for one. `None`: no
    /// manager (policy `off`, creation failed, or no context is current yet: then the next
    /// call tries again).
    pub fn get_or_create(
        &'static self,
        config: &Config,
        real: &RealDriver,
    ) -> Option<&'static Managed> {
        if let Some(m) = self.cell.get() {
            return m.as_ref();
        }
        if config.policy == Policy::Off {
            return self.cell.get_or_init(|| None).as_ref();
        }
        // The driver's functions are looked up (the dynamic loader's lock) before `init` is
        // taken: a thread inside `dlopen` (a library constructor allocating) may be waiting
        // for `init`, and must never wait for a thread that waits for the loader.
        let driver = RealMemoryDriver::for_current_context(real);
        let _guard = self.init.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = self.cell.get() {
            return m.as_ref();
        }
        match driver.and_then(|d| create(config, d)) {
            Ok(m) => {
                let m = self.cell.get_or_init(|| Some(m)).as_ref();
                if let Some(m) = m {
                    start_maintenance(m);
                }
                m
            }
            // Not an error yet: the application calls before making a context current.
            Err(SetupError::NoContext) => None,
            Err(why) => {
                tracing::warn!(
                    "tensile: the memory manager cannot start ({why}); allocations go to the \
                     driver unmanaged"
                );
                self.cell.get_or_init(|| None).as_ref()
            }
        }
    }
}

fn create(config: &Config, driver: RealMemoryDriver) -> Result<Managed, SetupError> {
    let driver = Arc::new(driver);
    let (free, total) = driver
        .mem_get_info()
        .map_err(|e| SetupError::Driver("cuMemGetInfo_v2", e))?;
    let s = sizing(
        config.device_memory,
        config.host_memory,
        free as u64,
        total as u64,
        host_physical_bytes(),
    );
    let mut mc = ManagerConfig::new(s.device_budget, s.host_cap);
    mc.device = driver.device();
    // The defaults suit budgets of gigabytes; a budget of a few pages (tests, the demo) must
    // not keep most of itself free, nor evict most of itself in one round.
    let budget_pages = (s.device_budget / mc.page_size).max(1);
    mc.free_reserve_pages = mc.free_reserve_pages.min(budget_pages / 4);
    mc.evict_batch = mc.evict_batch.clamp(1, (budget_pages / 4).max(1));
    let as_driver: Arc<dyn Driver> = driver.clone();
    let mm = MemoryManager::new(as_driver, mc)
        .map_err(|e| SetupError::Driver("reserving the arena", e))?;
    if config.policy == Policy::Plan {
        tracing::info!(
            "tensile: TENSILE_POLICY=plan: the planner is not integrated yet; using lru"
        );
    }
    tracing::info!(
        "tensile: memory manager on device {}: budget {} MiB (card: {} MiB free of {} MiB), \
         host pool cap {} MiB, policy lru",
        mc.device,
        s.device_budget >> 20,
        free >> 20,
        total >> 20,
        s.host_cap >> 20
    );
    Ok(Managed {
        mm,
        driver,
        log_stats_at_exit: tracing::enabled!(tracing::Level::INFO),
    })
}

static STOP: AtomicBool = AtomicBool::new(false);
static RUNNING: AtomicBool = AtomicBool::new(false);

/// Starts the maintenance thread of `m` (once per process).
fn start_maintenance(m: &'static Managed) {
    if RUNNING.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("tensile-maintain".into())
        .spawn(move || {
            // A panic here must not take the application down; the thread just ends.
            let _ = std::panic::catch_unwind(|| maintain_loop(m));
            RUNNING.store(false, Ordering::Release);
        });
    if let Err(e) = spawned {
        RUNNING.store(false, Ordering::Release);
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

/// Stops the maintenance thread (at exit), waiting for it at most 100 ms.
pub fn stop_maintenance() {
    STOP.store(true, Ordering::Release);
    let deadline = Instant::now() + Duration::from_millis(100);
    while RUNNING.load(Ordering::Acquire) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn sizing_defaults_and_settings() {
        let s = sizing(None, None, 70 * GIB, 80 * GIB, 32 * GIB);
        assert_eq!(s.device_budget as u64, 70 * GIB);
        assert_eq!(s.host_cap as u64, 16 * GIB);
        let s = sizing(
            Some(SizeSpec::parse("40%").unwrap()),
            Some(SizeSpec::parse("6GiB").unwrap()),
            70 * GIB,
            80 * GIB,
            32 * GIB,
        );
        assert_eq!(s.device_budget as u64, 32 * GIB);
        assert_eq!(s.host_cap as u64, 6 * GIB);
        let s = sizing(None, Some(SizeSpec::parse("50%").unwrap()), 1, 2, 10 * GIB);
        assert_eq!(s.host_cap as u64, 5 * GIB);
    }

    #[test]
    fn host_memory_is_known() {
        assert!(host_physical_bytes() > 0);
    }
}
