//! The plan executor: carries out an [`ExecPlan`] as the application launches.
//!
//! Policy, not mechanism: this module decides *when* (at which launch) a piece of which
//! allocation moves; the memory manager moves pages. Per launch, the launch hook calls
//! [`Executor::before_launch`] before forwarding and [`Executor::after_launch`] once the
//! driver accepted it:
//!
//! - With no plan, each is one relaxed load.
//! - The launch's number (`Launch::seq`, the tracker's numbering, the same a trace records)
//!   gives its position in the iteration; the plan's kernel at that position must be the
//!   launch's kernel. A mismatch drops the plan at once (one log line), and everything is
//!   swapped on demand until a new plan arrives.
//! - The steps at the position ([`ExecPlan::step_index`]) are resolved to address ranges
//!   ([`roles`]) and queued, one job per verb, to the executor's threads (one per verb,
//!   [`worker`]), which call the manager's verbs: a swap-out moves only the pages entirely
//!   inside the piece (a neighbour sharing a page is never evicted), a prefetch every page the
//!   piece overlaps.
//!   Launches on a capturing stream are checked but trigger nothing (their work runs at the
//!   graph's launch, not now).
//! - A plan takes effect at an iteration boundary: at its anchor if that is still ahead, else
//!   at the next launch at position 0 (one later if that launch is the very next one, since
//!   allocations of its iteration may predate the plan). Until then the plan it replaces
//!   stays in force (the outgoing plan): a relearned plan's iteration may start at another
//!   launch than the old one's, and up to an iteration on demand between them cost the MLP's
//!   rerun a step of several times the planned one. Host-resident pieces are swapped out
//!   once, at the first launch of the plan's first iteration.
//!
//! Allocations are reported by the allocation hook ([`Executor::allocated`]) only while a
//! plan is installed. Frees need no report: a role resolves only to an allocation the
//! allocation index still holds at the same address under the same id.

pub mod advice;
pub mod counters;
pub mod plan_file;
pub mod roles;
pub mod worker;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwapOption;
use tensile_driver_abi::CUresult;
use tensile_protocol::plan::{Action, ExecPlan, PieceRef, Step, When};
use tensile_trace::{PlanChange, PlanChangeKind, Record};

use crate::kernels::KernelMeta;
use crate::memory::advice::{EvictionAdvice, NextUse};
use crate::memory::MemoryStats;
use crate::tracker::Tracker;
use advice::UseTable;
use counters::{Counters, ExecutorStats};
use roles::{iteration_of, whole_pages, RoleTables, Slot, Unresolved};
use worker::{Job, Mover, Verb, Worker};

/// The H100's page, what a [`Mover`] moves unless it says otherwise: a swap-out moves whole
/// pages (aligned to the page).
pub const PAGE_BYTES: u64 = 2 << 20;

/// Where the executor stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorState {
    /// No plan was ever installed: on demand.
    NoPlan,
    /// Executing plan `version`.
    Planned { version: u32 },
    /// Plan `version` was dropped (a launch did not match): on demand until a new one.
    Fallback { version: u32 },
}

/// An installed plan, with what the launch path needs precomputed.
#[derive(Debug)]
struct Loaded {
    plan: ExecPlan,
    /// `index[p]..index[p + 1]`: the steps at position `p`.
    index: Vec<u32>,
    /// `index[p]..before_end[p]`: its `BeforeLaunch` steps; the rest are `AfterLaunch`.
    before_end: Vec<u32>,
    /// The first launch the plan applies to (position 0).
    start_seq: u64,
    /// Host-resident pieces not yet sent out.
    host_resident_pending: AtomicBool,
    /// When each allocation is used next (eviction advice).
    uses: UseTable,
    /// The plan's role tables. Taken by launches with steps and by allocations while the
    /// plan is installed; never held across a driver call.
    roles: Mutex<RoleTables>,
}

impl Loaded {
    fn new(plan: ExecPlan, start_seq: u64, roles: RoleTables) -> Loaded {
        let index = plan.step_index();
        let before_end = index
            .windows(2)
            .map(|w| {
                let steps = &plan.steps[w[0] as usize..w[1] as usize];
                w[0] + steps
                    .iter()
                    .take_while(|s| s.when == When::BeforeLaunch)
                    .count() as u32
            })
            .collect();
        let host_resident_pending = AtomicBool::new(!plan.host_resident.is_empty());
        let uses = UseTable::new(&plan);
        Loaded {
            uses,
            plan,
            index,
            before_end,
            start_seq,
            host_resident_pending,
            roles: Mutex::new(roles),
        }
    }

    /// The position of launch `seq` if the plan applies to it.
    #[inline]
    fn position(&self, seq: u64) -> Option<u32> {
        (seq >= self.start_seq).then(|| self.plan.position_of(seq))
    }

    fn steps(&self, position: u32, when: When) -> &[Step] {
        let p = position as usize;
        let (lo, hi) = match when {
            When::BeforeLaunch => (self.index[p], self.before_end[p]),
            When::AfterLaunch => (self.before_end[p], self.index[p + 1]),
        };
        &self.plan.steps[lo as usize..hi as usize]
    }
}

/// The plan executor of the process (see the module documentation).
pub struct Executor {
    /// Whether a plan is installed: the launch path's only load without one.
    active: AtomicBool,
    /// The plan installed last.
    plan: ArcSwapOption<Loaded>,
    /// The plan it replaced, in force until the launch it starts at (see the module
    /// documentation); `None` once it is in force, or when there was none.
    outgoing: ArcSwapOption<Loaded>,
    /// Serializes installing and dropping plans.
    changes: Mutex<()>,
    last_version: AtomicU32,
    fallback: AtomicBool,
    /// Whether a skipped step was logged already.
    skip_logged: AtomicBool,
    mover: Arc<dyn Mover>,
    worker: OnceLock<Option<Worker>>,
    counters: Arc<Counters>,
    /// The counters at the last iteration's start, for its account at debug level.
    last_iteration: Mutex<Option<IterationMark>>,
}

/// Where the counters stood when an iteration began.
struct IterationMark {
    version: u32,
    iteration: i64,
    at: std::time::Instant,
    memory: MemoryStats,
    executor: ExecutorStats,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("state", &self.state())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Executor {
    /// An executor without a plan, whose moves `mover` carries out.
    pub fn new(mover: Arc<dyn Mover>) -> Executor {
        Executor {
            active: AtomicBool::new(false),
            plan: ArcSwapOption::empty(),
            outgoing: ArcSwapOption::empty(),
            changes: Mutex::new(()),
            last_version: AtomicU32::new(0),
            fallback: AtomicBool::new(false),
            skip_logged: AtomicBool::new(false),
            mover,
            worker: OnceLock::new(),
            counters: Arc::new(Counters::default()),
            last_iteration: Mutex::new(None),
        }
    }

    /// Installs `plan` (replacing any other); it takes effect at the next iteration
    /// boundary (see the module documentation). A plan that breaks the format's rules
    /// ([`ExecPlan::validate`]) is refused with one line, and whatever ran before goes on.
    pub fn install(&self, plan: ExecPlan, tracker: &Tracker) -> bool {
        if let Err(why) = plan.validate() {
            tracing::warn!("tensile: plan {} refused: {why}", plan.version);
            return false;
        }
        let worker = self
            .worker
            .get_or_init(|| Worker::start(Arc::clone(&self.mover), Arc::clone(&self.counters)));
        if worker.is_none() {
            return false;
        }
        let _change = lock(&self.changes);
        let next = tracker.next_launch_seq();
        let period = u64::from(plan.period);
        let mut start = if plan.anchor_seq >= next {
            plan.anchor_seq
        } else {
            next + (period - u64::from(plan.position_of(next))) % period
        };
        if start == next && next > 0 {
            start += period;
        }
        let mut roles = RoleTables::new(&plan, iteration_of(plan.anchor_seq, plan.period, start));
        for r in tracker.allocs.snapshot().iter() {
            if roles.wants_persistent(r.id) {
                roles.note_persistent(Slot {
                    id: r.id,
                    ptr: r.start,
                    bytes: r.len,
                });
            }
        }
        let version = plan.version;
        // The plan in force now goes on until this one starts: the one installed last if it
        // has started, else the one it was to replace.
        let outgoing = match self.plan.load_full() {
            Some(last) if last.start_seq <= next => Some(last),
            Some(_) => self.outgoing.load_full(),
            None => None,
        };
        trace_plan_change(
            version,
            next,
            PlanChangeKind::Loaded {
                applies_from: start,
                page_bytes: self.mover.page_bytes(),
                plan: plan.encode(),
            },
        );
        self.mover.set_unit_pages(
            unit_pages(&plan, self.mover.page_bytes()).map(|g| g.max(MIN_UNIT_PAGES)),
        );
        if let Some(old) = &outgoing {
            tracing::info!(
                "tensile: plan {} stays in force until launch {start}",
                old.plan.version
            );
        }
        self.outgoing.store(outgoing);
        self.plan
            .store(Some(Arc::new(Loaded::new(plan, start, roles))));
        self.last_version.store(version, Ordering::Relaxed);
        self.fallback.store(false, Ordering::Relaxed);
        self.active.store(true, Ordering::Release);
        self.counters.plans_loaded.fetch_add(1, Ordering::Relaxed);
        tracing::info!("tensile: plan {version} installed; it applies from launch {start}");
        true
    }

    /// Where the executor stands.
    pub fn state(&self) -> ExecutorState {
        let version = self.last_version.load(Ordering::Relaxed);
        if self.active.load(Ordering::Relaxed) {
            ExecutorState::Planned { version }
        } else if self.fallback.load(Ordering::Relaxed) {
            ExecutorState::Fallback { version }
        } else {
            ExecutorState::NoPlan
        }
    }

    /// The counters now.
    pub fn stats(&self) -> ExecutorStats {
        self.counters.snapshot()
    }

    /// Waits (a bounded time) until the moves queued so far have been carried out.
    pub fn flush(&self) -> bool {
        match self.worker.get() {
            Some(Some(w)) => w.flush(std::time::Duration::from_secs(5)),
            _ => true,
        }
    }

    /// For each page of `pages` (`page_bytes` each), how many launches from the next one
    /// until the plan uses an allocation on it (the soonest of them; `Never` when it uses none
    /// of them again, `Unknown` when one is an allocation the plan does not name); `false`
    /// when no plan is in effect. Called by the memory manager, with its lock held, when it must evict.
    pub fn next_uses(
        &self,
        tracker: &Tracker,
        pages: &[u64],
        page_bytes: u64,
        out: &mut Vec<NextUse>,
    ) -> bool {
        if !self.active.load(Ordering::Relaxed) {
            return false;
        }
        let seq = tracker.next_launch_seq();
        let Some((loaded, position)) = self.in_force(seq) else {
            return false;
        };
        let now = iteration_of(loaded.plan.anchor_seq, loaded.plan.period, seq);
        let roles = lock(&loaded.roles);
        let index = tracker.allocs.snapshot();
        out.clear();
        // An allocation the plan does not name (made outside the iteration, or one no role
        // names) makes its page `Unknown`: the manager keeps such pages longest, least recently
        // used first among them. Ranking one a period away instead evicted hot unnamed memory
        // first (ResNet-50's rerun: 9.5 GiB fetched per iteration where 2.7 were planned).
        for &page in pages {
            let mut next = NextUse::Never;
            for r in index.overlapping(page, page_bytes) {
                // Persistent first: one made after the plan arrived is tabled too.
                let known = match loaded.uses.next_persistent(r.id, position) {
                    Some(launches) => NextUse::In(launches),
                    None => match roles.transient_of(r.id).and_then(|(home, ordinal, bytes)| {
                        loaded
                            .uses
                            .next_transient(ordinal, bytes, home, now, position)
                    }) {
                        Some(known) => known,
                        None => {
                            next = NextUse::Unknown;
                            break;
                        }
                    },
                };
                if let NextUse::In(launches) = known {
                    next = match next {
                        NextUse::In(sooner) => NextUse::In(sooner.min(launches)),
                        _ => NextUse::In(launches),
                    };
                }
            }
            out.push(next);
        }
        true
    }

    /// An allocation the tracker numbered `id`, at `ptr`, of `bytes`. Cheap without a plan.
    #[inline]
    pub fn allocated(&self, tracker: &Tracker, id: u64, ptr: u64, bytes: u64) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        let next = tracker.next_launch_seq();
        let slot = Slot { id, ptr, bytes };
        for installed in [self.plan.load(), self.outgoing.load()] {
            if let Some(loaded) = installed.as_ref() {
                lock(&loaded.roles).allocated(next, slot);
            }
        }
    }

    /// The plan in force at launch `seq`, and the launch's position in it.
    #[inline]
    fn in_force(&self, seq: u64) -> Option<(Arc<Loaded>, u32)> {
        let last = self.plan.load();
        let last = last.as_ref()?;
        if let Some(position) = last.position(seq) {
            return Some((Arc::clone(last), position));
        }
        let outgoing = self.outgoing.load_full()?;
        let position = outgoing.position(seq)?;
        Some((outgoing, position))
    }

    /// Forgets the outgoing plan once `last`, the plan installed last, is in force.
    #[inline]
    fn retire_outgoing(&self, last: &Loaded) {
        if self.outgoing.load().is_none() {
            return;
        }
        let _change = lock(&self.changes);
        if is_installed(&self.plan, last) {
            self.outgoing.store(None);
        }
    }

    /// Before launch of `kernel` is forwarded: its `BeforeLaunch` steps, if the kernel is
    /// the plan's at the position of the next launch number. `capturing` says whether the
    /// launch's stream is capturing (asked only when there are steps).
    #[inline]
    pub fn before_launch(
        &self,
        tracker: &Tracker,
        kernel: &KernelMeta,
        capturing: impl FnOnce() -> bool,
    ) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        self.before_planned(tracker, kernel, capturing);
    }

    /// Once the launch numbered `seq` was accepted: the position check (a mismatch drops
    /// the plan), then its `AfterLaunch` steps.
    #[inline]
    pub fn after_launch(
        &self,
        tracker: &Tracker,
        kernel: &KernelMeta,
        seq: u64,
        capturing: impl FnOnce() -> bool,
    ) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        self.after_planned(tracker, kernel, seq, capturing);
    }

    fn before_planned(
        &self,
        tracker: &Tracker,
        kernel: &KernelMeta,
        capturing: impl FnOnce() -> bool,
    ) {
        // Another thread may take this number first; the check after the launch, on the
        // number it really got, is the one that counts.
        let seq = tracker.next_launch_seq();
        let Some((loaded, position)) = self.in_force(seq) else {
            return;
        };
        if loaded.plan.kernel_at(position) != Some(kernel.id) {
            return;
        }
        let steps = loaded.steps(position, When::BeforeLaunch);
        if !steps.is_empty() && !capturing() {
            self.carry_out(&loaded, steps, &[], seq, tracker);
        }
    }

    fn after_planned(
        &self,
        tracker: &Tracker,
        kernel: &KernelMeta,
        seq: u64,
        capturing: impl FnOnce() -> bool,
    ) {
        let Some((loaded, position)) = self.in_force(seq) else {
            return;
        };
        if loaded.plan.kernel_at(position) != Some(kernel.id) {
            self.mismatch(&loaded, position, seq, kernel, tracker);
            return;
        }
        if position == 0 {
            self.retire_outgoing(&loaded);
            if tracing::enabled!(tracing::Level::DEBUG) {
                self.account_iteration(&loaded, seq);
            }
        }
        let steps = loaded.steps(position, When::AfterLaunch);
        let host_resident: &[PieceRef] = if position == 0
            && loaded.host_resident_pending.load(Ordering::Relaxed)
            && loaded.host_resident_pending.swap(false, Ordering::Relaxed)
        {
            &loaded.plan.host_resident
        } else {
            &[]
        };
        if (!steps.is_empty() || !host_resident.is_empty()) && !capturing() {
            self.carry_out(&loaded, steps, host_resident, seq, tracker);
        }
    }

    /// Logs what the iteration that ends at launch `seq` (position 0) moved, planned and not:
    /// where a run departs from its plan. Host time: the host runs ahead of the device.
    #[cold]
    fn account_iteration(&self, loaded: &Loaded, seq: u64) {
        let Some(memory) = self.mover.memory_stats() else {
            return;
        };
        let now = IterationMark {
            version: loaded.plan.version,
            iteration: iteration_of(loaded.plan.anchor_seq, loaded.plan.period, seq),
            at: std::time::Instant::now(),
            memory,
            executor: self.counters.snapshot(),
        };
        let mut last = lock(&self.last_iteration);
        if let Some(was) = last
            .as_ref()
            .filter(|w| w.version == now.version && w.iteration + 1 == now.iteration)
        {
            let (m, w) = (&now.memory, &was.memory);
            let (e, we) = (&now.executor, &was.executor);
            let d = |a: u64, b: u64| a.saturating_sub(b);
            tracing::debug!(
                "tensile: iteration {} of plan {} took {:.1} ms on the host; the plan moved {} \
                 pages out and {} in; the manager chose {} out for launches, {} for \
                 prefetches, {} for allocations, {} ahead, and brought {} in on demand; its \
                 prefetches found {} pages still leaving; {} pages were read back into \
                 frames still leaving; {} accesses stalled for {:.1} ms; \
                 now {} frames in use, {} of them dead pages",
                was.iteration,
                loaded.plan.version,
                now.at.duration_since(was.at).as_secs_f64() * 1e3,
                d(e.pages_out, we.pages_out),
                d(e.pages_in, we.pages_in),
                d(m.evicted_for.access, w.evicted_for.access),
                d(m.evicted_for.prefetch, w.evicted_for.prefetch),
                d(m.evicted_for.allocation, w.evicted_for.allocation),
                d(m.evicted_for.reserve, w.evicted_for.reserve),
                d(m.pages_in_on_demand, w.pages_in_on_demand),
                d(m.prefetch_pages_leaving, w.prefetch_pages_leaving),
                d(m.pages_handed_over, w.pages_handed_over),
                d(m.stalled_launches, w.stalled_launches),
                d(m.stall_ns, w.stall_ns) as f64 / 1e6,
                m.frames_in_use,
                m.dead_device_pages,
            );
        }
        *last = Some(now);
    }

    /// Resolves `steps` (and `host_resident` pieces, swapped out) for the launch numbered
    /// `seq` and queues them, one job per verb.
    #[cold]
    fn carry_out(
        &self,
        loaded: &Loaded,
        steps: &[Step],
        host_resident: &[PieceRef],
        seq: u64,
        tracker: &Tracker,
    ) {
        let iteration = iteration_of(loaded.plan.anchor_seq, loaded.plan.period, seq);
        let index = tracker.allocs.snapshot();
        let is_live = |s: &Slot| {
            index
                .find(s.ptr)
                .is_some_and(|r| r.id == s.id && r.start == s.ptr)
        };
        let queued = std::time::Instant::now();
        let mut out = Job {
            verb: Verb::SwapOut,
            ranges: Vec::new(),
            steps: 0,
            seq,
            queued,
        };
        let mut ahead = Job {
            verb: Verb::Prefetch,
            ranges: Vec::new(),
            steps: 0,
            seq,
            queued,
        };
        let mut skipped = 0u64;
        let page = self.mover.page_bytes();
        {
            let roles = lock(&loaded.roles);
            let moves = steps
                .iter()
                .map(|s| (s.action, &s.piece))
                .chain(host_resident.iter().map(|p| (Action::SwapOut, p)));
            for (action, piece) in moves {
                let range = roles.piece_range(piece, iteration, is_live);
                let placed = match (action, range) {
                    (Action::SwapOut, Ok((start, len))) => {
                        whole_pages(start, len, page).map(|r| (&mut out, r))
                    }
                    (Action::Prefetch, Ok(r)) => Some((&mut ahead, r)),
                    (_, Err(why)) => {
                        self.log_skip_once(piece, seq, why);
                        None
                    }
                };
                match placed {
                    Some((job, (start, len))) => {
                        job.ranges.push((start, len as usize));
                        job.steps += 1;
                    }
                    None => skipped += 1,
                }
            }
        }
        if skipped > 0 {
            self.counters
                .steps_skipped
                .fetch_add(skipped, Ordering::Relaxed);
        }
        let Some(Some(worker)) = self.worker.get() else {
            return;
        };
        for job in [out, ahead] {
            if job.steps == 0 {
                continue;
            }
            let steps = job.steps;
            if !worker.send(job) {
                self.counters
                    .steps_dropped
                    .fetch_add(steps, Ordering::Relaxed);
            }
        }
    }

    #[cold]
    fn log_skip_once(&self, piece: &PieceRef, seq: u64, why: Unresolved) {
        if !self.skip_logged.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "tensile: a plan step at launch {seq} was skipped: {piece:?} does not resolve \
                 ({why:?}); later skips are only counted"
            );
        }
    }

    /// Drops `loaded` (if it is still installed) after a kernel mismatch. An outgoing plan
    /// goes alone (the plan installed last takes over at its start); the plan installed last
    /// takes the outgoing one with it.
    #[cold]
    fn mismatch(
        &self,
        loaded: &Loaded,
        position: u32,
        seq: u64,
        kernel: &KernelMeta,
        tracker: &Tracker,
    ) {
        let _change = lock(&self.changes);
        let then = if is_installed(&self.plan, loaded) {
            self.active.store(false, Ordering::Release);
            self.plan.store(None);
            self.outgoing.store(None);
            self.mover.set_unit_pages(None);
            self.fallback.store(true, Ordering::Relaxed);
            "swapping on demand until a new plan".to_string()
        } else if is_installed(&self.outgoing, loaded) {
            self.outgoing.store(None);
            let starts = self.plan.load().as_ref().map_or(0, |l| l.start_seq);
            format!("on demand until the new plan starts at launch {starts}")
        } else {
            return; // Another thread dropped or replaced it already.
        };
        self.counters.mismatches.fetch_add(1, Ordering::Relaxed);
        self.counters.plans_dropped.fetch_add(1, Ordering::Relaxed);
        let expected = loaded
            .plan
            .kernel_at(position)
            .map(|id| {
                tracker
                    .kernels
                    .name_of(id)
                    .unwrap_or_else(|| format!("<kernel {id}, not launched in this process>"))
            })
            .unwrap_or_default();
        let reason = format!(
            "at launch {seq} (position {position} of {}): expected kernel `{expected}`, got `{}`",
            loaded.plan.period, kernel.name
        );
        tracing::warn!(
            "tensile: plan {} dropped {reason}; {then}",
            loaded.plan.version,
        );
        trace_plan_change(loaded.plan.version, seq, PlanChangeKind::Dropped { reason });
    }
}

/// Whether `loaded` is the plan `slot` holds.
fn is_installed(slot: &ArcSwapOption<Loaded>, loaded: &Loaded) -> bool {
    slot.load()
        .as_ref()
        .is_some_and(|l| std::ptr::eq(Arc::as_ptr(l), loaded))
}

/// Writes a plan's coming into force or its drop into the trace, when one is written (for
/// `tensile replay --plan-from`).
fn trace_plan_change(version: u32, launches: u64, change: PlanChangeKind) {
    if let Some(rec) = crate::runtime::existing().and_then(|rt| rt.recorder()) {
        rec.record(Record::Plan(PlanChange {
            t_ns: rec.now_ns(),
            version: u64::from(version),
            launches,
            change,
        }));
    }
}

/// The fewest pages the executor asks units to be capped at. Every unit costs the driver's
/// calls per mapping (on the H100 about 150 µs in, 180 out), which the planner prices spread
/// over units of at most this many pages (`tensile_analyzer::RemapModel`): capping units at
/// the 2-page pieces of a finely cut plan made the MLP's step (simulated, 50%) 2.6 times
/// longer though it moved fewer pages. A plan whose pieces are finer than this moves some
/// pieces with neighbours.
const MIN_UNIT_PAGES: usize = tensile_analyzer::SHIM_PLAN_UNIT_PAGES as usize;

/// The largest unit (in pages of `page` bytes) whose multiples tile every piece `plan` moves:
/// the greatest common divisor of the whole-page offsets and lengths of its pieces (a
/// swap-out moves only a piece's whole pages). With the manager's units no larger, and
/// starting at a tensor's first page as its pieces do, a piece moves without its neighbours.
/// `None` when the plan moves no whole page.
fn unit_pages(plan: &ExecPlan, page: u64) -> Option<usize> {
    let page = page.max(1);
    let mut g = 0u64;
    let pieces = plan
        .steps
        .iter()
        .map(|s| &s.piece)
        .chain(plan.host_resident.iter());
    for piece in pieces {
        let start = piece.offset.div_ceil(page);
        let end = (piece.offset + piece.bytes) / page;
        if end > start {
            g = gcd(gcd(g, start), end - start);
        }
    }
    (g > 0).then_some(g.min(usize::MAX as u64) as usize)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The memory manager's verbs, on the process's manager (nothing to do before it starts).
/// (Turning the manager's eviction ahead of need off while a plan runs is the planning
/// thread's job: `crate::planning`.)
#[derive(Debug, Default)]
pub struct ManagerMover;

impl Mover for ManagerMover {
    fn swap_out(&self, ranges: &[(u64, usize)]) -> Result<usize, CUresult> {
        match crate::runtime::existing().and_then(|rt| rt.memory()) {
            Some(m) => m.mm.swap_out_after_use(ranges),
            None => Ok(0),
        }
    }

    fn prefetch(&self, ranges: &[(u64, usize)]) -> Result<usize, CUresult> {
        match crate::runtime::existing().and_then(|rt| rt.memory()) {
            Some(m) => m.mm.prefetch(ranges),
            None => Ok(0),
        }
    }

    fn set_unit_pages(&self, pages: Option<usize>) {
        if let Some(m) = crate::runtime::existing().and_then(|rt| rt.memory()) {
            m.mm.set_max_unit_pages(pages);
        }
    }

    fn page_bytes(&self) -> u64 {
        crate::runtime::existing()
            .and_then(|rt| rt.memory())
            .map_or(PAGE_BYTES, |m| m.mm.page_bytes() as u64)
    }

    fn memory_stats(&self) -> Option<MemoryStats> {
        crate::runtime::existing()
            .and_then(|rt| rt.memory())
            .map(|m| m.mm.stats())
    }
}

/// The executor's eviction advice, for the process's memory manager (see [`advice`]).
#[derive(Debug, Default)]
pub struct PlanAdvice;

impl EvictionAdvice for PlanAdvice {
    fn next_uses(&self, pages: &[u64], page_bytes: u64, out: &mut Vec<NextUse>) -> bool {
        crate::runtime::existing()
            .is_some_and(|rt| rt.executor.next_uses(&rt.tracker, pages, page_bytes, out))
    }
}

/// Locks `m`; a panic elsewhere cannot leave these tables half-changed in a way that
/// matters (the worst is a skipped step), so a poisoned lock is still used.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
