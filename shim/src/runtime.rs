//! The process-wide runtime: created on first use, never torn down.
//!
//! Creation is lazy (the first managed call or managed `dlsym`), not in the library
//! constructor: `LD_PRELOAD` is inherited by every child process (shells, `nvidia-smi`,
//! data-loader workers), and only the ones that use CUDA should load the driver or open a
//! trace file. The constructor only reads the configuration and sets up logging
//! ([`on_load`]).
//!
//! Creation may be re-entered on the same thread (loading the real driver runs its
//! constructors, which may call `dlsym`); a re-entrant caller gets `None` and falls back to
//! plain forwarding instead of deadlocking. Other threads wait for creation to finish, but
//! never while the creating thread needs the dynamic loader's lock (see `create_once`).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use tensile_trace::Stats;

use crossbeam::channel::Receiver;
use tensile_trace::Record;

use crate::config::{Config, Policy};
use crate::executor::{self, Executor, ManagerMover};
use crate::managed::{Managed, Managers};
use crate::real::RealDriver;
use crate::recorder::{self, RecordSink, Recorder};
use crate::timing::Timing;
use crate::tracker::Tracker;

/// The library name and version written into traces.
pub const PRODUCER: &str = concat!("libtensile ", env!("CARGO_PKG_VERSION"));

/// Everything the hooks share.
#[derive(Debug)]
pub struct Runtime {
    pub config: Config,
    pub driver: RealDriver,
    pub tracker: Tracker,
    /// Where the hooks' records go: the trace (`TENSILE_TRACE`) and, under
    /// `TENSILE_POLICY=plan`, the tap the planner drains (see [`Runtime::records`]).
    records: Option<RecordSink>,
    /// GPU durations of launches: when tracing, and sampled for the planner.
    pub timing: Option<Timing>,
    /// Carries out the plan, when there is one.
    pub executor: Executor,
    /// The memory managers, one per device (each created on the first allocation in a
    /// context of its device).
    pub memory: Managers,
    pid: u32,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());
static FAILED: AtomicBool = AtomicBool::new(false);

/// The configuration, read from the environment once (problems are logged once).
pub fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (config, problems) = Config::from_env();
        crate::log::init(config.log.as_deref());
        for p in problems {
            tracing::warn!("{p}");
        }
        config
    })
}

/// What the library constructor does: configuration and logging, and PyTorch's allocator
/// choice (see [`crate::pytorch`]). Nothing that loads the driver.
pub fn on_load() {
    let config = config();
    tracing::debug!(pid = std::process::id(), ?config, "libtensile loaded");
    if config.policy != Policy::Off {
        // Runs in the constructor, while the process is still single-threaded.
        crate::pytorch::configure_allocator();
    }
}

/// The runtime, created on first call. `None` if the real driver cannot be loaded, or if
/// this thread is creating the runtime right now (a re-entrant call).
#[inline]
pub fn get() -> Option<&'static Runtime> {
    match RUNTIME.get() {
        Some(rt) => Some(rt),
        None => create(),
    }
}

/// The runtime if it exists already; never creates it.
pub fn existing() -> Option<&'static Runtime> {
    RUNTIME.get()
}

thread_local! {
    // Const-initialised, no destructor: readable at any time, even during thread teardown.
    static CREATING: Cell<bool> = const { Cell::new(false) };
}

#[cold]
fn create() -> Option<&'static Runtime> {
    if FAILED.load(Ordering::Acquire) || CREATING.replace(true) {
        return None;
    }
    let created = std::panic::catch_unwind(create_once);
    CREATING.set(false);
    match created {
        Ok(Ok(rt)) => rt,
        Ok(Err(why)) => {
            tracing::warn!("{why}; libtensile stays out of the way");
            FAILED.store(true, Ordering::Release);
            None
        }
        Err(_) => {
            tracing::error!("creating the runtime panicked; libtensile stays out of the way");
            FAILED.store(true, Ordering::Release);
            None
        }
    }
}

/// Creates the runtime, or returns the one another thread created meanwhile.
fn create_once() -> Result<Option<&'static Runtime>, String> {
    let config = config().clone();
    // Everything that takes the dynamic loader's lock (dlopen, dlsym) happens before
    // INIT_LOCK: a thread inside `dlopen` (a library constructor) may be waiting for
    // INIT_LOCK, and must never wait for a thread that waits for the loader lock. Racing
    // threads may each load the table; all but one are discarded.
    let driver = RealDriver::load()?;
    // GPU times of launches: for the trace, and for the planner (sampled, see
    // `RecordSink::wants_launch_time`).
    let timing = (config.trace.is_some() || config.policy == Policy::Plan)
        .then_some(())
        .and_then(|()| {
            let t = Timing::new(&driver);
            if t.is_none() {
                tracing::warn!(
                    "the driver lacks event functions; launches are traced without GPU times"
                );
            }
            t
        });
    let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = RUNTIME.get() {
        return Ok(Some(rt));
    }
    if FAILED.load(Ordering::Acquire) {
        return Ok(None);
    }
    let rt = Runtime::create(config, driver, timing);
    let _ = RUNTIME.set(rt);
    // SAFETY: registering plain `extern "C"` functions that never unwind.
    unsafe {
        libc::pthread_atfork(None, None, Some(in_forked_child));
        // Always: the swap statistics are logged at exit even without a trace.
        libc::atexit(at_exit);
    }
    if let Some(rt) = RUNTIME.get() {
        // Once the runtime is reachable: the plan's coming into force goes into the trace.
        rt.install_plan_file();
        crate::planning::start_for(rt);
    }
    Ok(RUNTIME.get())
}

impl Runtime {
    /// The runtime over a loaded driver: opens the trace if one is asked for.
    fn create(config: Config, driver: RealDriver, timing: Option<Timing>) -> Runtime {
        let recorder = config.trace.as_deref().and_then(|path| {
            match Recorder::start(path, PRODUCER.to_owned(), recorder::command_line()) {
                Ok(r) => {
                    tracing::info!("writing the trace to {}", path.display());
                    Some(r)
                }
                Err(e) => {
                    tracing::warn!(
                        "TENSILE_TRACE: cannot write the trace to {}: {e}; tracing is off",
                        path.display()
                    );
                    None
                }
            }
        });
        let timing = timing.filter(|_| recorder.is_some() || config.policy == Policy::Plan);
        let records = RecordSink::new(recorder, config.policy == Policy::Plan);
        let tracker = Tracker::new(driver.introspection);
        let executor = Executor::new(std::sync::Arc::new(ManagerMover));
        Runtime {
            config,
            driver,
            tracker,
            records,
            timing,
            executor,
            memory: Managers::default(),
            pid: std::process::id(),
        }
    }

    /// Installs the plan of `TENSILE_PLAN`, if one is set (under `TENSILE_POLICY=plan` only).
    fn install_plan_file(&self) {
        let Some(path) = &self.config.plan_file else {
            return;
        };
        if self.config.policy != Policy::Plan {
            tracing::warn!(
                "tensile: TENSILE_PLAN={} is ignored: plans run under TENSILE_POLICY=plan",
                path.display()
            );
            return;
        }
        match executor::plan_file::read(path) {
            Ok(plan) => {
                self.executor.install(plan, &self.tracker);
            }
            Err(why) => tracing::warn!("tensile: {why}; swapping on demand (lru)"),
        }
    }

    /// The consuming end of the record tap (under `TENSILE_POLICY=plan`), for the planner:
    /// from this call on, every record the hooks make, in order (a full tap drops and
    /// counts). Handed out once. Until it is taken the hooks build no records for it; take it
    /// before the application's first launch to see every `Kernel` record.
    pub fn take_record_tap(&self) -> Option<Receiver<Record>> {
        self.records.as_ref().and_then(RecordSink::take_tap)
    }

    /// Where the hooks send records, if anything takes them now (the trace file, or the tap
    /// once its consumer took it); `None`: the hooks build no records.
    #[inline]
    pub fn records(&self) -> Option<&RecordSink> {
        self.records.as_ref().filter(|s| s.is_live())
    }

    /// The trace file, when tracing.
    #[inline]
    pub fn recorder(&self) -> Option<&Recorder> {
        self.records.as_ref().and_then(RecordSink::file)
    }

    /// The first memory manager started, if one is running: the one plans serve, and the
    /// only one of a process using one device.
    #[inline]
    pub fn memory(&self) -> Option<&'static Managed> {
        self.memory.first()
    }

    /// The memory manager whose arena holds `ptr`, if any.
    #[inline]
    pub fn memory_owning(&self, ptr: u64) -> Option<&'static Managed> {
        self.memory.owning(ptr)
    }

    /// Whether no memory manager will ever run in this process.
    pub fn memory_never(&self) -> bool {
        self.memory.never()
    }

    /// The memory manager of the current context, started now if the policy asks for one and
    /// its device has none yet (see [`Managers::for_current_context`]).
    #[inline]
    pub fn memory_or_start(&'static self) -> Option<&'static Managed> {
        self.memory.for_current_context(&self.config, &self.driver)
    }

    /// Trace time of a call made now (0 when no records are made: nothing reads it).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.records().map_or(0, RecordSink::now_ns)
    }

    /// Collects finished launch times (after the host waited for the device).
    pub fn collect_launch_times(&self) {
        if let (Some(rec), Some(timing)) = (self.records(), &self.timing) {
            timing.collect(rec);
        }
    }

    /// The process's statistics: the memory managers' swap counters when one runs (peak
    /// resident bytes is then device memory mapped at arena pages; with several devices,
    /// the counters and peaks of all added up), else the peak of live tracked allocations and
    /// no swapping.
    pub fn stats(&self) -> Stats {
        match self.memory() {
            Some(_) => self
                .memory
                .running()
                .map(|m| Stats::from(m.mm.stats()))
                .reduce(|a, b| Stats {
                    bytes_to_host: a.bytes_to_host + b.bytes_to_host,
                    bytes_to_device: a.bytes_to_device + b.bytes_to_device,
                    stalled_launches: a.stalled_launches + b.stalled_launches,
                    stall_ns: a.stall_ns + b.stall_ns,
                    peak_resident_bytes: a.peak_resident_bytes + b.peak_resident_bytes,
                    host_pool_bytes: a.host_pool_bytes + b.host_pool_bytes,
                })
                .unwrap_or_default(),
            None => Stats {
                bytes_to_host: 0,
                bytes_to_device: 0,
                stalled_launches: 0,
                stall_ns: 0,
                peak_resident_bytes: self.tracker.peak_bytes(),
                host_pool_bytes: 0,
            },
        }
    }

    /// Logs the statistics and completes the trace (statistics and the end marker).
    pub fn finish(&self) {
        crate::managed::stop_maintenance();
        // No driver calls here (the driver and thread-locals may be half torn down at
        // exit): launch times were collected at the program's syncs, and the manager's
        // statistics are plain counters.
        let stats = self.stats();
        // With several devices each line names its device; one device's line is as it was.
        let several = self.memory.count() > 1;
        for (i, m) in self.memory.running().enumerate() {
            if !m.log_stats_at_exit {
                continue;
            }
            let device = if several {
                format!("device {}: ", m.driver.device())
            } else {
                String::new()
            };
            log_stats_at_exit(&device, &m.mm.stats());
            let exec = self.executor.stats();
            if i == 0 && exec.plans_loaded > 0 {
                // The manager's share of the plan's swap-outs, as more `name value` pairs on
                // the same line (`tensile rerun` reads them).
                let mm = m.mm.stats();
                let f = mm.evicted_for;
                crate::log::emergency(&format!(
                    "{exec} out_named {} out_unit_live {} out_unit_dead {} unplanned_out_access {} \
                     unplanned_out_prefetch {} unplanned_out_allocation {} unplanned_out_reserve \
                     {} unplanned_out_budget {} in_on_demand {}",
                    mm.planned_out_named,
                    mm.planned_out_unnamed_live,
                    mm.planned_out_unnamed_dead,
                    f.access,
                    f.prefetch,
                    f.allocation,
                    f.reserve,
                    f.budget,
                    mm.pages_in_on_demand,
                ));
            }
        }
        if let Some(rec) = self.recorder() {
            rec.finish(Some(stats));
        }
    }
}

/// One manager's statistics line at exit, after `device` (empty, or which device).
fn log_stats_at_exit(device: &str, mm: &crate::memory::MemoryStats) {
    // Written directly: `tracing`'s thread-locals are gone by the time atexit handlers run.
    let stats = Stats::from(*mm);
    crate::log::emergency(&format!(
        "{device}swapped {} MiB to host and {} MiB to device ({} pages out, {} in, {} swap-outs \
         cancelled by an access); {} accesses stalled for {:.3} ms in all; the memory \
         manager's lock found held {} times by the application's threads ({:.3} ms in \
         all) and {} times by the library's ({:.3} ms), and {} waits were made holding \
         it; peak resident {} MiB; host pool {} MiB",
        stats.bytes_to_host >> 20,
        stats.bytes_to_device >> 20,
        mm.pages_evicted,
        mm.pages_swapped_in,
        mm.pages_out_cancelled,
        stats.stalled_launches,
        stats.stall_ns as f64 / 1e6,
        mm.app_lock_waits,
        mm.app_lock_wait_ns as f64 / 1e6,
        mm.library_lock_waits,
        mm.library_lock_wait_ns as f64 / 1e6,
        mm.locked_waits,
        stats.peak_resident_bytes >> 20,
        stats.host_pool_bytes >> 20,
    ));
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        crate::planning::stop();
        if let Some(rt) = RUNTIME.get() {
            // A forked child inherits the handler but not the writer thread.
            if rt.pid == std::process::id() {
                rt.finish();
            }
        }
    });
}

extern "C" fn in_forked_child() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(rec) = RUNTIME.get().and_then(Runtime::recorder) {
            rec.abandon();
        }
    });
}
