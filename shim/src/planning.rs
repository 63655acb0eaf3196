//! Where plans come from: one thread that drains the record tap into a planner and hands each
//! new plan to the executor.
//!
//! The planner is the analyzer's [`Learner`] running on this thread (`TENSILE_COORDINATOR=off`),
//! or the coordinator, reached through its shared-memory segment ([`crate::coordination`]).
//! Either way the application's threads only put records in the tap (a bounded channel that drops and
//! counts when full); detection and planning (milliseconds) happen here, never in a hook.
//!
//! The thread also keeps the memory manager's policy knobs in step with the executor: while a
//! plan runs, LRU eviction ahead of need is off (the plan makes its own room, and the reserve
//! would evict what the plan keeps); when the plan is dropped it comes back. It also adapts the
//! share of the budget plans leave free to what the manager does beside them
//! ([`crate::plan_room`]), in the process or through the coordinator.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam::channel::Receiver;
use tensile_analyzer::online::{Learner, LearnerOptions, DEFAULT_PLAN_ROOM};
use tensile_analyzer::{CostModel, RemapModel, SwappedMapping};
use tensile_protocol::ExecPlan;
use tensile_trace::Record;

use crate::config::{Coordinator, HostFrames, PlanBandwidths, Policy};
use crate::coordination::{CoordinatorSource, DEFAULT_NAME};
use crate::executor::ExecutorState;
use crate::managed::Managed;
use crate::memory::budget::format_size;
use crate::other_devices::{FirstDeviceRecords, OtherDevices};
use crate::plan_room::RoomControl;
use crate::recorder::{Polled, Poller};
use crate::runtime::Runtime;

/// How often the planner is asked for a plan at most (it decides itself whether to work).
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Records taken from the tap before the planner is asked anyway.
const RECORDS_PER_POLL: usize = 1 << 14;

static STOP: AtomicBool = AtomicBool::new(false);
/// Whether the planning thread runs (set when it starts, cleared once its source is dropped:
/// a coordinator's slot is left then).
static RUNNING: AtomicBool = AtomicBool::new(false);
/// How long exit waits for the planning thread to leave its coordinator cleanly. A plan search
/// in progress can take longer; then the coordinator finds the slot of a dead process instead.
const STOP_WAIT: Duration = Duration::from_millis(250);

/// What the thread feeds records to and gets plans from.
pub trait PlanSource: Send {
    /// The next record of the stream, in order.
    fn push(&mut self, record: &Record);
    /// Records were lost before the one pushed next (the tap was full).
    fn lost(&mut self, count: u64);
    /// The device budget changed.
    fn set_budget(&mut self, bytes: u64);
    /// A new plan, if there is one (may take milliseconds).
    fn poll(&mut self) -> Option<ExecPlan>;
    /// A device budget granted since the last call (by a coordinator dividing the card
    /// among jobs), which the job must meet.
    fn take_grant(&mut self) -> Option<u64> {
        None
    }
    /// Called once per round with the executor's state and counters, for reporting.
    fn report(&mut self, _rt: &Runtime) {}
    /// Plans from now on leave `room` of the budget free (the next plan is made for it).
    /// False where the source cannot (the room is fixed).
    fn set_room(&mut self, _room: f64) -> bool {
        false
    }
    /// The room this source's plans leave, if the run may adapt it ([`RoomControl`]): not
    /// when `TENSILE_PLAN_ROOM` fixes it, nor before the source knows it (a coordinator says
    /// it once it has seen the job).
    fn adaptable_room(&self) -> Option<f64> {
        None
    }
}

/// The in-process planner (`TENSILE_COORDINATOR=off`).
pub struct LocalLearner {
    learner: Learner,
    /// Whether the run may change the room (it was not fixed by configuration).
    room_adapts: bool,
}

impl LocalLearner {
    /// A learner for `budget_bytes` with copies priced by `cost` and the remaps of pages
    /// moved by `remaps` ([`PlanPricing::costs`]), planning in the manager's pages of `page_bytes`,
    /// its plans leaving `room` of the budget free.
    pub fn new(
        budget_bytes: u64,
        (cost, remaps): (CostModel, Option<RemapModel>),
        page_bytes: u64,
        room: f64,
    ) -> LocalLearner {
        let mut options = LearnerOptions::for_budget(budget_bytes);
        options.cost = cost;
        options.remaps = remaps;
        options.page_bytes = page_bytes;
        options.room = room;
        LocalLearner {
            learner: Learner::new(options),
            room_adapts: false,
        }
    }

    /// Lets the run adapt the room from the one given ([`RoomControl`]).
    pub fn with_adaptable_room(mut self) -> LocalLearner {
        self.room_adapts = true;
        self
    }
}

impl PlanSource for LocalLearner {
    fn push(&mut self, record: &Record) {
        self.learner.push(record);
    }

    fn lost(&mut self, count: u64) {
        self.learner.lost_records(count);
    }

    fn set_budget(&mut self, bytes: u64) {
        self.learner.set_budget(bytes);
    }

    fn poll(&mut self) -> Option<ExecPlan> {
        let plan = self.learner.poll();
        if let (Some(p), Some(cost)) = (&plan, self.learner.last_poll_cost()) {
            tracing::info!(
                "{}; detection {:.1} ms, planning {:.1} ms over {} ops",
                learned(p),
                cost.detect.as_secs_f64() * 1e3,
                cost.plan.as_secs_f64() * 1e3,
                cost.window_ops
            );
        }
        if let Some(reason) = self.learner.take_no_plan() {
            tracing::info!(
                "tensile: no plan for the iteration found: {reason}; swapping on demand"
            );
        }
        plan
    }

    fn set_room(&mut self, room: f64) -> bool {
        self.learner.set_room(room);
        true
    }

    fn adaptable_room(&self) -> Option<f64> {
        self.room_adapts.then(|| self.learner.room())
    }
}

/// Starts what makes plans for this process, as the configuration says: nothing unless the
/// policy is `plan` without a plan file (`TENSILE_PLAN` runs that plan alone); otherwise the
/// planning thread with the learner in the process.
pub fn start_for(rt: &'static Runtime) {
    let config = &rt.config;
    if config.policy != Policy::Plan || config.plan_file.is_some() {
        return;
    }
    // A coordinator this job starts plans with the same prices (one it joins keeps its own).
    let pricing = PlanPricing::of(config);
    let costs = pricing.costs();
    let priority = config.priority;
    // Under `auto` the coordinator is the card's: its name comes from the device's UUID,
    // known once the memory manager runs (so the thread waits for it).
    let per_card = config.coordinator == Coordinator::Auto;
    let named = match &config.coordinator {
        Coordinator::Off | Coordinator::Auto => None,
        Coordinator::Named(n) => Some(n.clone()),
    };
    // The source waits for the memory manager, whose budget and page it plans for (records
    // meanwhile are kept).
    start(rt, true, move |budget| {
        let page = rt
            .memory()
            .map_or(tensile_analyzer::cycle::PAGE_BYTES, |m| {
                m.mm.page_bytes() as u64
            });
        let name = if per_card {
            Some(card_coordinator_name(rt.memory()))
        } else {
            named
        };
        if let Some(name) = name {
            // The first device's allocations only (see `FirstDeviceRecords`).
            let state = Box::new(move || {
                let mut records = rt.tracker.state_records(rt.now_ns());
                records.retain(|r| {
                    !matches!(r, Record::Alloc(a) if crate::other_devices::on_another_device(rt, a.ptr))
                });
                records
            });
            // A room set by TENSILE_PLAN_ROOM is this job's; else the coordinator's, which the
            // run may raise.
            let room = config.plan_room;
            match CoordinatorSource::connect(&name, true, pricing, priority, page, room, state) {
                Ok(mut source) => {
                    source.set_grant_wait(config.grant_wait);
                    return Box::new(source) as Box<dyn PlanSource>;
                }
                Err(why) => tracing::warn!(
                    "no coordinator ({why}); learning and planning in the process instead"
                ),
            }
        }
        // Told rates are used as told; the H100's are slowed by the remaps of pages of this
        // size (the driver's calls cost per mapping, whatever the page), in units the size
        // of the tensors of the iteration learned.
        // A room set by TENSILE_PLAN_ROOM stays; the default follows the run.
        match config.plan_room {
            Some(room) => Box::new(LocalLearner::new(budget, costs, page, room)),
            None => Box::new(
                LocalLearner::new(budget, costs, page, DEFAULT_PLAN_ROOM).with_adaptable_room(),
            ),
        }
    });
}

/// The coordinator of this process's (first) card under `TENSILE_COORDINATOR=auto`: `gpu-`
/// and the device's UUID in hex, so that jobs on one card share a coordinator and jobs on
/// different cards do not; [`DEFAULT_NAME`] when the driver gives no UUID.
fn card_coordinator_name(m: Option<&Managed>) -> String {
    card_name(m.and_then(|m| m.driver.device_uuid())).unwrap_or_else(|| DEFAULT_NAME.to_owned())
}

/// `gpu-` and the UUID in hex: the coordinator of the card with that UUID under `auto`.
pub(crate) fn card_name(uuid: Option<[u8; 16]>) -> Option<String> {
    let hex: String = uuid?.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("gpu-{hex}"))
}

/// The log's words for a plan that came in (wherever it was learned; tests and `tensile
/// rerun` read these lines).
pub(crate) fn learned(plan: &ExecPlan) -> String {
    format!(
        "plan {} learned: {} launches per iteration, {} moves ({:.1} MiB out per iteration) \
         within {:.1} MiB, predicted step {:.1} ms (compute {:.1} ms)",
        plan.version,
        plan.period,
        plan.steps.len(),
        plan.bytes_out_per_iteration() as f64 / (1 << 20) as f64,
        plan.budget_bytes as f64 / (1 << 20) as f64,
        plan.predicted_step_ns as f64 / 1e6,
        plan.compute_ns as f64 / 1e6
    )
}

/// How swapped-out pages are held (`TENSILE_SWAPPED`, `TENSILE_HOST_UNITS`), in the
/// analyzer's words.
pub fn swapped_mapping(swapped_unmapped: bool, frames: HostFrames) -> SwappedMapping {
    match (swapped_unmapped, frames) {
        (true, _) => SwappedMapping::Unmapped,
        (false, HostFrames::Units) => SwappedMapping::HostUnits,
        (false, HostFrames::Singles) => SwappedMapping::SingleFrames,
    }
}

/// What the driver charges the manager to remap the pages it moves: the H100's calls, for
/// the way swapped-out pages are held (`TENSILE_SWAPPED`, `TENSILE_HOST_UNITS`).
pub fn page_remaps(swapped_unmapped: bool, frames: HostFrames) -> RemapModel {
    RemapModel::h100(swapped_mapping(swapped_unmapped, frames))
}

/// How the planner prices a move: its copy at the card's rates, and the driver's calls that
/// remap each page moved (docs/gpu-results.md), which the learner prices per page for the
/// units of each iteration's tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanPricing {
    /// `TENSILE_PLAN_GBPS`: the copy rates (`None`: the H100's 55, 55 and 92 GB/s).
    pub gbps: Option<PlanBandwidths>,
    /// How swapped-out pages are held (`TENSILE_SWAPPED`, `TENSILE_HOST_UNITS`): which
    /// calls a remap makes.
    pub mapping: SwappedMapping,
    /// `TENSILE_PLAN_VMM_TIME`: the calls take this many times the H100's (a simulated
    /// card that keeps time slower; 0: free).
    pub vmm_time: f64,
}

impl PlanPricing {
    /// The pricing the configuration says.
    pub fn of(config: &crate::config::Config) -> PlanPricing {
        PlanPricing {
            gbps: config.plan_gbps,
            mapping: swapped_mapping(config.swapped_unmapped, config.host_frames),
            vmm_time: config.plan_vmm_time.unwrap_or(1.0),
        }
    }

    /// The H100's copy rates and remaps for pages held as `mapping` says.
    pub fn h100(mapping: SwappedMapping) -> PlanPricing {
        PlanPricing {
            gbps: None,
            mapping,
            vmm_time: 1.0,
        }
    }

    /// The copy rates and the remap calls, for [`LocalLearner::new`] and the coordinator.
    pub fn costs(&self) -> (CostModel, Option<RemapModel>) {
        let copies = match self.gbps {
            Some(b) => CostModel {
                h2d_gbps: b.to_device,
                d2h_gbps: b.to_host,
                bidir_gbps: b.both,
                ..CostModel::default()
            },
            None => CostModel::default(),
        };
        (
            copies,
            Some(RemapModel::h100(self.mapping).times(self.vmm_time)),
        )
    }
}

/// Starts the planning thread over the runtime's record tap; `source` is made once the thread
/// runs (with `wait_for_memory`, once the memory manager runs too: the records meanwhile are
/// kept and given to the source first), from the budget then known. Returns false (and logs
/// why) if the tap is taken already or the thread cannot start.
pub fn start(
    rt: &'static Runtime,
    wait_for_memory: bool,
    make_source: impl FnOnce(u64) -> Box<dyn PlanSource> + Send + 'static,
) -> bool {
    let Some(tap) = rt.take_record_tap() else {
        tracing::warn!("the record tap was taken already; no plans will be made");
        return false;
    };
    RUNNING.store(true, Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("tensile-planner".into())
        .spawn(move || {
            // A panic here is a bug in the planner; the application goes on, on demand.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // The loop starts from the budget the source was made for, so a budget that
                // becomes known while the source starts (a coordinator takes a while) is
                // passed on at the first poll.
                let (early, lost) = if wait_for_memory {
                    records_until_memory(rt, &tap)
                } else {
                    (Vec::new(), 0)
                };
                if STOP.load(Ordering::Relaxed) {
                    return;
                }
                let budget = budget_of(rt);
                let mut source = make_source(budget);
                if lost > 0 {
                    source.lost(lost);
                }
                let mut first_device = FirstDeviceRecords::default();
                for record in &early {
                    first_device.push(rt, source.as_mut(), record);
                }
                run(rt, &tap, source, budget, first_device)
            }));
            if r.is_err() {
                tracing::error!("the planner failed; swapping on demand from now on");
            }
            RUNNING.store(false, Ordering::Release);
        });
    match spawned {
        Ok(_) => true,
        Err(e) => {
            RUNNING.store(false, Ordering::Release);
            tracing::warn!("cannot start the planning thread ({e}); swapping on demand");
            false
        }
    }
}

/// The most records kept while waiting for the memory manager; later ones are counted lost.
const EARLY_RECORDS: usize = 1 << 20;

/// Drains the tap until the memory manager runs (or will never run, or the process stops);
/// returns what came, and how many records were dropped for want of room.
fn records_until_memory(rt: &Runtime, tap: &Receiver<Record>) -> (Vec<Record>, u64) {
    let mut early = Vec::new();
    let mut lost = 0u64;
    let mut poller = Poller::new();
    while rt.memory().is_none() && !rt.memory_never() && !STOP.load(Ordering::Relaxed) {
        match poller.next(tap) {
            Polled::Message(record) if early.len() < EARLY_RECORDS => early.push(record),
            Polled::Message(_) => lost += 1,
            Polled::Nothing => {}
            Polled::Gone => break,
        }
    }
    (early, lost)
}

/// Asks the planning thread to stop (at exit) and waits a little for it to leave its
/// coordinator, so the coordinator logs a job that left rather than one that died.
pub fn stop() {
    STOP.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + STOP_WAIT;
    while RUNNING.load(Ordering::Acquire) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The budget to plan for: the manager's, once it runs; until then, no limit (a plan made then
/// moves nothing, and a new one follows when the budget is known).
fn budget_of(rt: &Runtime) -> u64 {
    rt.memory().map_or(u64::MAX, |m| m.mm.budget() as u64)
}

fn run(
    rt: &'static Runtime,
    tap: &Receiver<Record>,
    mut source: Box<dyn PlanSource>,
    mut budget: u64,
    mut first_device: FirstDeviceRecords,
) {
    let mut lost_seen = rt.records().map_or(0, |s| s.tap_dropped());
    let mut last_poll = Instant::now();
    let mut since_poll = 0usize;
    let mut reserve: Option<usize> = None;
    let mut grants = Grants::default();
    let mut poller = Poller::new();
    // Made once the source knows the room (a coordinator says it a tick after the job
    // joined), with the pages out per iteration of the plan in force by then.
    let mut room: Option<RoomControl> = None;
    let mut plan_pages_out: Option<u64> = None;
    let mut other_devices = OtherDevices::default();
    while !STOP.load(Ordering::Relaxed) {
        match poller.next(tap) {
            Polled::Message(record) => {
                let lost = rt.records().map_or(lost_seen, |s| s.tap_dropped());
                if lost > lost_seen {
                    source.lost(lost - lost_seen);
                    lost_seen = lost;
                }
                first_device.push(rt, source.as_mut(), &record);
                since_poll += 1;
                for record in tap.try_iter().take(RECORDS_PER_POLL) {
                    first_device.push(rt, source.as_mut(), &record);
                    since_poll += 1;
                }
            }
            Polled::Nothing => {}
            Polled::Gone => return,
        }
        if since_poll < RECORDS_PER_POLL && last_poll.elapsed() < POLL_INTERVAL {
            continue;
        }
        let now_budget = budget_of(rt);
        if now_budget != budget {
            budget = now_budget;
            source.set_budget(budget);
        }
        if let Some(plan) = source.poll() {
            plan_pages_out = rt
                .memory()
                .map(|m| plan.bytes_out_per_iteration() / m.mm.page_bytes() as u64);
            if let (Some(room), Some(pages)) = (room.as_mut(), plan_pages_out) {
                room.plan_installed(pages);
            }
            rt.executor.install(plan, &rt.tracker);
        }
        if room.is_none() {
            room = room_control(source.as_ref(), plan_pages_out);
        }
        if let Some(control) = room.as_mut() {
            adapt_room(rt, control, source.as_mut());
        }
        grants.step(rt.memory(), source.take_grant());
        // The slots of the devices plans do not serve: polled first, so that a pause one of
        // them says holds the launches from this round's report on.
        other_devices.poll(rt);
        keep_reserve_in_step(rt, &mut reserve);
        source.report(rt);
        last_poll = Instant::now();
        since_poll = 0;
    }
}

/// The room's control, once `source` says the room it plans with and lets the run adapt it;
/// the plan in force (moving `plan_pages_out` pages out per iteration), if any, is its first.
fn room_control(source: &dyn PlanSource, plan_pages_out: Option<u64>) -> Option<RoomControl> {
    let mut control = RoomControl::new(source.adaptable_room()?);
    if let Some(pages) = plan_pages_out {
        control.plan_installed(pages);
    }
    Some(control)
}

/// Feeds the room's control what the plan and the manager moved out so far, and has the
/// source plan with the room it asks for (`tensile rerun` reads the line this logs).
fn adapt_room(rt: &Runtime, control: &mut RoomControl, source: &mut dyn PlanSource) {
    let Some(m) = rt.memory() else {
        return;
    };
    let planned = rt.executor.stats().pages_out;
    let e = m.mm.stats().evicted_for;
    let unplanned = e.access + e.prefetch + e.allocation + e.reserve;
    let Some(change) = control.observe(planned, unplanned) else {
        return;
    };
    if source.set_room(change.room) {
        tracing::info!(
            "tensile: plans now leave {:.0}% of the budget free (the manager evicted {:.0}% as \
             many pages of its own choice as the plan moved out over an iteration); planning \
             again",
            change.room * 100.0,
            change.unplanned_share * 100.0,
        );
    }
}

/// The grants of one slot as its manager meets them, a poll at a time.
#[derive(Default)]
pub(crate) struct Grants {
    /// A grant not met yet (the manager has not started, or copies out are under way).
    meeting: Option<Meeting>,
    /// The last grant met, and when it was last applied (see `regrow_after_refusal`).
    met: Option<(u64, Instant)>,
}

impl Grants {
    /// One poll: takes a grant that `came` (if any), moves manager `m` toward the grant not
    /// met yet, and otherwise raises a budget the device cut back to the last grant met.
    pub(crate) fn step(&mut self, m: Option<&Managed>, came: Option<u64>) {
        if let Some(bytes) = came {
            self.meeting = Some(Meeting::new(bytes, m));
        }
        if let Some(g) = self.meeting.as_ref().filter(|g| meet_grant(m, g)) {
            self.met = Some((g.grant, Instant::now()));
            self.meeting = None;
        }
        if self.meeting.is_none() {
            regrow_after_refusal(m, &mut self.met);
        }
    }
}

/// A grant being met: it may take several polls (the copies out of a large shrink).
struct Meeting {
    grant: u64,
    since: Instant,
    /// The budget when the grant came (`None` before the manager started).
    budget_before: Option<u64>,
}

impl Meeting {
    /// A grant of `bytes` that came now, for manager `m` (if it runs).
    fn new(bytes: u64, m: Option<&Managed>) -> Meeting {
        Meeting {
            grant: bytes,
            since: Instant::now(),
            budget_before: m.map(|m| m.mm.budget() as u64),
        }
    }
}

/// Moves the manager's budget toward a grant (within the job's own limit, and at least a
/// page) without blocking: a smaller one starts evicting what is idle, and each later poll
/// completes the copies that landed, evicts more, and gives the memory back to the driver; no
/// allocation fails for it. Returns true once the grant is met (nothing over it held). This
/// thread renews a paused job's pause every poll, so it must not wait for copies here.
fn meet_grant(m: Option<&Managed>, meeting: &Meeting) -> bool {
    let Some(m) = m else {
        return false;
    };
    let page = crate::config::MIN_MEMORY_SETTING as usize;
    let bytes = usize::try_from(meeting.grant)
        .unwrap_or(usize::MAX)
        .min(m.limit.unwrap_or(usize::MAX))
        .max(page);
    match m.mm.set_budget_without_waiting(bytes) {
        Ok(false) => false,
        Ok(true) => {
            tracing::info!(
                "tensile: the coordinator granted {} on device {} (the budget was {}); {} held \
                 on the device, met in {} ms",
                format_size(bytes as u64),
                m.driver.device(),
                meeting
                    .budget_before
                    .map_or_else(|| "not set yet".to_string(), format_size),
                format_size(m.mm.device_bytes_held() as u64),
                meeting.since.elapsed().as_millis()
            );
            true
        }
        Err(code) => {
            tracing::warn!("tensile: cannot meet a grant of {bytes} bytes (CUresult {code})");
            true
        }
    }
}

/// How often a budget the device cut below the grant is raised to the grant again.
const REGROW_INTERVAL: Duration = Duration::from_secs(1);

/// Raises the budget back to the last grant met when the device cut it: a card shared with
/// other jobs refuses memory while a job whose grant shrank is still writing out what it held
/// over its new grant, and the manager then keeps what it holds as its budget
/// (`DevicePool::take_unit`). Nothing else would raise it again: the grant has not changed, so
/// the coordinator sends nothing, and an access a little larger than what is held would wait
/// for a grant that never comes (seen after a coordinator restart, when grants are rebuilt
/// while the jobs still hold the old ones). Once a second at most; a device still full cuts it
/// again.
fn regrow_after_refusal(m: Option<&Managed>, met: &mut Option<(u64, Instant)>) {
    let (Some(m), Some((granted, at))) = (m, met.as_mut()) else {
        return;
    };
    let bytes = usize::try_from(*granted)
        .unwrap_or(usize::MAX)
        .min(m.limit.unwrap_or(usize::MAX));
    if m.mm.budget() >= bytes || at.elapsed() < REGROW_INTERVAL {
        return;
    }
    *at = Instant::now();
    tracing::debug!(
        "tensile: the budget is {} under a grant of {}: the device refused memory; raising it \
         again",
        format_size(m.mm.budget() as u64),
        format_size(bytes as u64)
    );
    if let Err(code) = m.mm.set_budget_without_waiting(bytes) {
        tracing::debug!("tensile: raising the budget failed (CUresult {code})");
    }
}

/// Turns LRU eviction ahead of need off while a plan runs and back on when it stops;
/// `saved` holds the configured reserve while it is off.
fn keep_reserve_in_step(rt: &Runtime, saved: &mut Option<usize>) {
    let Some(memory) = rt.memory() else {
        return;
    };
    let manager = &memory.mm;
    let planned = matches!(rt.executor.state(), ExecutorState::Planned { .. });
    match (planned, *saved) {
        (true, None) => {
            *saved = Some(manager.free_reserve_pages());
            manager.set_free_reserve_pages(0);
        }
        (false, Some(pages)) => {
            manager.set_free_reserve_pages(pages);
            *saved = None;
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that says its room only once told to, as a coordinator says it a tick after
    /// the job joined.
    struct SaysRoomLater(Option<f64>);

    impl PlanSource for SaysRoomLater {
        fn push(&mut self, _: &Record) {}
        fn lost(&mut self, _: u64) {}
        fn set_budget(&mut self, _: u64) {}
        fn poll(&mut self) -> Option<ExecPlan> {
            None
        }
        fn adaptable_room(&self) -> Option<f64> {
            self.0
        }
    }

    #[test]
    fn the_rooms_control_is_made_once_the_room_is_said_and_judges_the_plan_in_force() {
        let mut source = SaysRoomLater(None);
        assert!(room_control(&source, Some(100)).is_none());
        source.0 = Some(0.2);
        // The plan in force came before the room: its windows are judged all the same (the
        // first is not, as for any plan).
        let mut control = room_control(&source, Some(100)).expect("the room is said");
        assert_eq!(control.room(), 0.2);
        assert_eq!(control.observe(0, 0), None);
        assert_eq!(control.observe(100, 0), None);
        assert_eq!(control.observe(200, 50), None, "one window over the line");
        let change = control
            .observe(300, 100)
            .expect("a second window of 50% beside the plan");
        assert!((change.room - 0.3).abs() < 1e-9, "{change:?}");
        // With no plan in force yet, nothing is judged until one comes.
        let mut waiting = room_control(&source, None).unwrap();
        for at in [0, 100, 200, 300] {
            assert_eq!(waiting.observe(at, at), None);
        }
    }

    #[test]
    fn the_planner_prices_the_remaps_the_manager_makes_beside_the_rates_told() {
        let page = tensile_analyzer::cycle::PAGE_BYTES;
        let priced = |pricing: PlanPricing| {
            let (cost, remaps) = pricing.costs();
            cost.with_page_remaps(remaps.expect("remaps priced").per_page(8.0, page))
        };
        let held = |frames, unmapped| {
            let pricing = PlanPricing::h100(swapped_mapping(unmapped, frames));
            assert_eq!(
                pricing.costs().0,
                CostModel::default(),
                "copies at the card's rates"
            );
            priced(pricing)
        };
        let singles = held(HostFrames::Singles, false);
        let units = held(HostFrames::Units, false);
        let unmapped = held(HostFrames::Units, true);
        assert_eq!(
            page_remaps(true, HostFrames::Singles),
            page_remaps(true, HostFrames::Units)
        );
        let copies = CostModel::default();
        // Remapping slows every move; host units remap less than single host frames,
        // leaving pages unmapped less still.
        for (a, b) in [
            (&singles, &units),
            (&units, &unmapped),
            (&unmapped, &copies),
        ] {
            assert!(a.h2d_ns(page) > b.h2d_ns(page) && a.d2h_ns(page) > b.d2h_ns(page));
            let (a, b) = (a.sustained(), b.sustained());
            assert!(a.h2d_gbps <= b.h2d_gbps && a.d2h_gbps <= b.d2h_gbps);
            assert!(a.bidir_gbps <= b.bidir_gbps);
        }
        // Told rates are the copies'; the remaps come on top, as many times the H100's as
        // said (a simulated card keeping time 16 times slower).
        let told = PlanPricing {
            gbps: Some(PlanBandwidths {
                to_device: 10.0,
                to_host: 12.0,
                both: 20.0,
            }),
            mapping: SwappedMapping::HostUnits,
            vmm_time: 16.0,
        };
        let (c, remaps) = told.costs();
        assert_eq!((c.h2d_gbps, c.d2h_gbps, c.bidir_gbps), (10.0, 12.0, 20.0));
        let per_page = |r: Option<RemapModel>| r.expect("remaps priced").per_page(8.0, page);
        let (slow, h100) = (
            per_page(remaps),
            per_page(PlanPricing::h100(SwappedMapping::HostUnits).costs().1),
        );
        assert!(
            slow.in_ns.abs_diff(16 * h100.in_ns) <= 16,
            "{slow:?} {h100:?}"
        );
        assert!(
            slow.out_ns.abs_diff(16 * h100.out_ns) <= 16,
            "{slow:?} {h100:?}"
        );
        let free = PlanPricing {
            vmm_time: 0.0,
            ..told
        };
        assert_eq!(per_page(free.costs().1).in_ns, 0);
    }
}
