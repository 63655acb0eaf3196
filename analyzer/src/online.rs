//! The online learner: a live stream of trace records in, executable plans out.
//!
//! The planner's thread (the coordinator, or a thread inside the job with
//! `TENSILE_COORDINATOR=off`) feeds every record the shim produces to [`Learner::push`], in
//! order, and calls [`Learner::poll`] now and then. The learner keeps a window of the stream as
//! a [`Trace`] (the importers' builder, lenient about a stream that started mid-run or lost
//! records) and runs the offline pipeline on it when there is something new to learn:
//! iteration detection, the cycle, the planner, a short local search, and the conversion to an
//! [`ExecPlan`] with an increasing version.
//!
//! - **Learning**: detection is tried after 64 launches and then each time the launches seen
//!   since learning began grew by an eighth (so its total cost stays within about eight times
//!   that of the last attempt), and sooner while the iteration shows but cannot be planned
//!   yet. A plan needs an instance of the iteration that is complete, preceded by a launch in
//!   the window, in the steady state (the next instance starts with as many bytes allocated),
//!   and followed by an instance that is complete or has freed every tensor the first one
//!   allocated (or kept it a whole period), so that every tensor's lifetime is known. A
//!   pattern inside the iteration (the layers of a forward pass, the set-up of each parameter)
//!   is refused: its instances do not explain most of the window, are not all about as long,
//!   or do not free what they allocate. On the shared traces the first plan comes in the
//!   third step.
//! - **Planned**: every launch is checked against the plan's kernel at its position (one
//!   lookup). At the first mismatch the shim drops the plan by itself; the learner forgets the
//!   window before that launch and learns again. Measured durations (`LaunchTime`) feed a
//!   moving average per position; when the iteration's measured total drifts from what the
//!   plan assumed by more than [`LearnerOptions::drift`], the learner replans (a new version).
//!   A budget change replans too, and lost records mean relearning from scratch.
//!
//! Memory stays bounded: before the iteration is known the window is capped at
//! [`LearnerOptions::max_window_ops`] ops (the oldest half is dropped when full); once it is
//! known, a few iterations' worth is kept.

use std::time::{Duration, Instant};

use tensile_protocol::ExecPlan;
use tensile_trace::Record;

use crate::bound::{lower_bound_with, BoundOptions};
use crate::cost::{Budget, CostModel, RemapModel, SHIM_PLAN_UNIT_PAGES};
use crate::cycle::{Cycle, MoveUnits};
use crate::exec_plan::{convert, unnameable, ExecPlanError};
use crate::import::builder::TraceBuilder;
use crate::iteration::{allocated_before_ops, detect, Iterations};
use crate::model::{OpKind, SourceFormat};
use crate::plan::{plan, SwapPlan};
use crate::search::{improve, SearchOptions};
use crate::sim::{simulate, Policy, SimOptions};

/// Launches before the first detection attempt (and after a relearn).
const FIRST_ATTEMPT_LAUNCHES: u64 = 64;
/// Weight of a new measurement in a position's moving average.
const DURATION_EMA_WEIGHT: f64 = 0.2;

/// The share of the budget the library's plans leave free (`TENSILE_PLAN_ROOM`): room for
/// what a run does that its plan cannot place. Freed pages still busy on the device or
/// sharing a unit with live ones, pages that small tensors share, and whatever comes in on
/// demand all take frames the plan counts free; with none left, the manager evicts pages the
/// plan keeps, which come back on demand and evict others in turn. ResNet-50's rerun at 50%
/// of its peak (`--scale 4`) moved twice what its plan did and ran at 1.0x of LRU with no
/// room, 1.36x with 20% (docs/rerun.md).
pub const DEFAULT_PLAN_ROOM: f64 = 0.2;

/// [`DEFAULT_PLAN_ROOM`] as `TENSILE_PLAN_ROOM` writes it, for messages that say what is used
/// instead of a value that cannot be read.
pub const DEFAULT_PLAN_ROOM_TEXT: &str = "20%";

/// The most room a plan leaves: `TENSILE_PLAN_ROOM` accepts up to this, and a plan made with
/// more would plan for almost nothing.
pub const MAX_PLAN_ROOM: f64 = 0.9;

/// The bytes a plan may fill of `budget_bytes` when it leaves `room` (a share, `0..1`) free.
pub fn plan_bytes(budget_bytes: u64, room: f64) -> u64 {
    let room = room.clamp(0.0, MAX_PLAN_ROOM);
    budget_bytes - (budget_bytes as f64 * room) as u64
}

/// A share of the budget, `TENSILE_PLAN_ROOM`'s way: a percentage from 0 to 90, with or
/// without `%`.
pub fn parse_room(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let number = t.strip_suffix('%').unwrap_or(t).trim();
    match number.parse::<f64>() {
        Ok(p) if (0.0..=90.0).contains(&p) => Ok(p / 100.0),
        Ok(_) => Err("out of range; expected a percentage from 0 to 90, e.g. 20%".into()),
        Err(_) => {
            Err("not a percentage; expected e.g. 20% (or 0 to plan for the whole budget)".into())
        }
    }
}

/// The budgets a plan for `cycle` within `budget_bytes` is tried at, in order: leaving
/// `room` free, less the partial last pages ([`Cycle::plan_budgets`]), then without the room
/// (where nothing fits with it, a plan that fills the budget beats none). When the whole cycle
/// fits the budget as it is, nothing need move and no room is left: the room is for what a
/// plan that moves data cannot place, and a plan for the smaller budget would move a fifth of
/// a working set that fits, every iteration (a job granted its need on a shared card ran its
/// MLP at 57 ms a step against 18.5 so).
pub fn budgets_to_try(cycle: &Cycle, budget_bytes: u64, room: f64) -> Vec<Budget> {
    let live = crate::timeline::Liveness::of(cycle);
    let peak = crate::timeline::held_bytes(cycle, &live)
        .into_iter()
        .max()
        .unwrap_or(0);
    if peak <= cycle.plan_budget(budget_bytes).bytes {
        return cycle.plan_budgets(budget_bytes);
    }
    let mut budgets = cycle.plan_budgets(plan_bytes(budget_bytes, room));
    for b in cycle.plan_budgets(budget_bytes) {
        if !budgets.contains(&b) {
            budgets.push(b);
        }
    }
    budgets
}

/// The room `TENSILE_PLAN_ROOM` asks for in `lookup`'s environment, else the default; a
/// value it cannot read is the default, with the reason.
pub fn room_from_env(lookup: impl Fn(&str) -> Option<String>) -> (f64, Option<String>) {
    match lookup("TENSILE_PLAN_ROOM").filter(|v| !v.trim().is_empty()) {
        None => (DEFAULT_PLAN_ROOM, None),
        Some(v) => match parse_room(&v) {
            Ok(room) => (room, None),
            Err(why) => (
                DEFAULT_PLAN_ROOM,
                Some(format!(
                    "TENSILE_PLAN_ROOM={v:?} is not valid ({why}); using {DEFAULT_PLAN_ROOM_TEXT}"
                )),
            ),
        },
    }
}

/// How the learner plans.
#[derive(Debug, Clone)]
pub struct LearnerOptions {
    /// The device budget to plan for.
    pub budget_bytes: u64,
    /// The share of the budget plans leave free ([`DEFAULT_PLAN_ROOM`] in the library; none
    /// by default here, so that a learned plan is the offline planner's for the budget).
    pub room: f64,
    /// Copy and launch costs.
    pub cost: CostModel,
    /// What remapping a moved page costs, on top of `cost`'s copies, priced for each cycle's
    /// tensors ([`Learner::cost_for`]); `None`: moves cost their copies alone.
    pub remaps: Option<RemapModel>,
    /// The local search after the planner; keep its time limit short (it runs in `poll`).
    pub search: SearchOptions,
    /// Most ops kept in the window while no iteration is known.
    pub max_window_ops: usize,
    /// Iterations kept in the window once one is known (at least 3).
    pub keep_iterations: usize,
    /// Relative change of the iteration's measured GPU time that triggers a replan.
    pub drift: f64,
    /// What plans may move (the shim's pages for plans it executes).
    pub units: MoveUnits,
    /// The shim's page under [`MoveUnits::ShimPages`] ([`crate::cycle::PAGE_BYTES`] on the
    /// H100: the job's manager says).
    pub page_bytes: u64,
}

impl LearnerOptions {
    /// Defaults for a budget: a 150 ms search, a window of up to 256 Ki ops, 4 iterations kept,
    /// replanning at a 15% drift, whole shim pages.
    pub fn for_budget(budget_bytes: u64) -> LearnerOptions {
        LearnerOptions {
            budget_bytes,
            room: 0.0,
            cost: CostModel::default(),
            remaps: None,
            search: SearchOptions {
                time_limit: Duration::from_millis(150),
                ..SearchOptions::default()
            },
            max_window_ops: 1 << 18,
            keep_iterations: 4,
            drift: 0.15,
            units: MoveUnits::ShimPages,
            page_bytes: crate::cycle::PAGE_BYTES,
        }
    }
}

/// The fewest launches an iteration must have to be planned.
const MIN_ITERATION_LAUNCHES: usize = 2;

/// Instances in the window after which the learner plans on one whose allocations differ from
/// the next instance's, none being like its successor (the steps of the program all differ).
const UNLIKE_INSTANCES_TAKEN: usize = 6;

/// Where the learner stands (for `tensile status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LearnerState {
    /// Looking for the iteration.
    Learning {
        /// Ops in the window.
        window_ops: usize,
    },
    /// A plan is out.
    Planned {
        /// Its version.
        version: u32,
        /// Launches per iteration.
        period: u32,
    },
    /// The iteration is known but no plan runs within the budget (it is tried again when the
    /// budget changes or the pattern does).
    NoPlan {
        /// Why, in one line.
        reason: String,
    },
}

/// What the last [`Learner::poll`] that did work cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PollCost {
    /// Iteration detection and the cycle.
    pub detect: Duration,
    /// Planning, search and conversion.
    pub plan: Duration,
    /// Ops in the window it worked on.
    pub window_ops: usize,
}

/// The plan out, as the learner checks the stream against it.
struct Active {
    plan: ExecPlan,
    /// Moving average of each position's measured GPU time, ns (the cycle's to begin with).
    measured_ns: Vec<f64>,
    /// The iteration's launch time the plan was made for, ns.
    assumed_ns: f64,
    /// Measurements since the last drift check.
    since_check: u32,
}

/// Learns a job's iteration from its record stream and plans it (see the module documentation).
pub struct Learner {
    options: LearnerOptions,
    window: TraceBuilder,
    state: LearnerState,
    active: Option<Active>,
    /// Launches pushed since learning (re)started.
    launches_learning: u64,
    /// Launch count at which to try detection next.
    next_attempt: u64,
    /// A replan is due (budget change, drift).
    replan: bool,
    next_version: u32,
    last_cost: Option<PollCost>,
    /// Ops per iteration of the last detection (window trimming).
    period_ops: Option<usize>,
    /// The iteration last planned, for [`Learner::predict_step`].
    last_cycle: Option<Cycle>,
    /// [`Learner::cycle_peak_bytes`] of `last_cycle`.
    last_peak: Option<u64>,
    /// Bumped each time an iteration is found anew (a prediction made for an earlier one is
    /// stale).
    cycle_generation: u64,
    /// Why the last planning found no plan, until [`Learner::take_no_plan`] reports it.
    unreported_no_plan: Option<String>,
}

impl Learner {
    /// A learner with nothing seen yet.
    pub fn new(options: LearnerOptions) -> Learner {
        Learner {
            options,
            window: TraceBuilder::lenient(SourceFormat::Tensile),
            state: LearnerState::Learning { window_ops: 0 },
            active: None,
            launches_learning: 0,
            next_attempt: FIRST_ATTEMPT_LAUNCHES,
            replan: false,
            next_version: 1,
            last_cost: None,
            period_ops: None,
            last_cycle: None,
            last_peak: None,
            cycle_generation: 0,
            unreported_no_plan: None,
        }
    }

    /// Takes the next record of the stream (cheap: appends to the window, checks a launch
    /// against the plan).
    pub fn push(&mut self, record: &Record) {
        // Errors are records the window cannot place (a free of an allocation it never saw,
        // a duration of a launch it dropped): leaving them out is all a live stream allows.
        if let Record::Launch(l) = record {
            self.check_launch(l.seq, l.kernel);
        }
        let _ = self.window.record(record);
        match record {
            Record::Launch(_) => self.launches_learning += 1,
            Record::LaunchTime(t) => self.measure(t.seq, t.gpu_ns),
            _ => {}
        }
        self.bound_window();
    }

    /// Does the expensive work when it is due (detection, planning: milliseconds to a few
    /// hundred) and returns a new plan when there is one.
    pub fn poll(&mut self) -> Option<ExecPlan> {
        // While a plan is out, only a replan is due (and, if it finds nothing, tried again
        // like a detection).
        let due =
            self.launches_learning >= self.next_attempt && (self.active.is_none() || self.replan);
        if !due {
            return None;
        }
        // Next attempt, if this one finds nothing: once the launches seen grew by an eighth
        // (at most a period's worth once one is known).
        let growth = (self.launches_learning / 8)
            .min(self.period_ops.map_or(u64::MAX, |p| p as u64))
            .max(16);
        self.next_attempt = self.launches_learning + growth;
        let started = Instant::now();
        let trace = self.window.trace();
        let window_ops = trace.ops.len();
        let (iters, cycle) = match self.detect() {
            Ok(found) => found,
            Err(waiting) => {
                if let Some(period) = waiting {
                    // The iteration shows, the instance to plan is not complete yet: look again
                    // a little later rather than after the usual growth.
                    let soon = self.launches_learning + (period as u64 / 8).max(16);
                    self.next_attempt = self.next_attempt.min(soon);
                }
                self.last_cost = Some(PollCost {
                    detect: started.elapsed(),
                    plan: Duration::ZERO,
                    window_ops,
                });
                return None;
            }
        };
        let detected = started.elapsed();
        self.period_ops = Some(iters.period);
        let result = self.plan_cycle(&cycle);
        let live = crate::timeline::Liveness::of(&cycle);
        self.last_peak = crate::timeline::held_bytes(&cycle, &live).into_iter().max();
        self.last_cycle = Some(cycle.clone());
        self.cycle_generation += 1;
        self.last_cost = Some(PollCost {
            detect: detected,
            plan: started.elapsed() - detected,
            window_ops,
        });
        self.replan = false;
        match result {
            Ok(plan) => {
                let launch_ns: Vec<f64> = cycle
                    .ops
                    .iter()
                    .filter(|o| matches!(o.kind, OpKind::Launch { .. }))
                    .map(|o| o.duration_ns as f64)
                    .collect();
                self.state = LearnerState::Planned {
                    version: plan.version,
                    period: plan.period,
                };
                self.active = Some(Active {
                    assumed_ns: launch_ns.iter().sum(),
                    measured_ns: launch_ns,
                    since_check: 0,
                    plan: plan.clone(),
                });
                Some(plan)
            }
            Err(reason) => {
                self.unreported_no_plan = Some(reason.clone());
                self.state = LearnerState::NoPlan { reason };
                self.active = None;
                // Trying again on the same pattern would fail the same way: wait for twice
                // the stream (or a budget or pattern change).
                self.next_attempt = self.launches_learning.saturating_mul(2);
                None
            }
        }
    }

    /// The step the last iteration found would take at a budget of `budget_bytes`, ns, with
    /// a plan made for that budget by the planner alone (no local search) and simulated; `None`
    /// before an iteration is known, or where no plan runs within the budget. A coordinator
    /// weighs one job's memory against another's with it; a few to tens of milliseconds.
    pub fn predict_step(&self, budget_bytes: u64) -> Option<u64> {
        let cycle = self.last_cycle.as_ref()?;
        let cost = &self.cost_for(cycle);
        budgets_to_try(cycle, budget_bytes, self.options.room)
            .into_iter()
            .find_map(|budget| {
                let planned = plan(cycle, &budget, cost).ok()?;
                simulate(
                    cycle,
                    Policy::Plan(&planned),
                    budget,
                    cost,
                    SimOptions::default(),
                )
                .ok()
                .map(|r| r.step_ns)
            })
    }

    /// The most the last iteration found holds on the device at once when nothing moves, in
    /// bytes as the planner counts them: the job's need. `None` before an iteration is known.
    /// (A footprint sampled while learning can fall short of it: a job that allocates state
    /// at its first optimizer step peaks higher from the second iteration on.)
    pub fn cycle_peak_bytes(&self) -> Option<u64> {
        self.last_peak
    }

    /// Which iteration [`Learner::predict_step`] answers for: bumped each time one is found.
    pub fn cycle_generation(&self) -> u64 {
        self.cycle_generation
    }

    /// Why the last planning of an iteration found no plan, once: a job then swaps on demand
    /// until its pattern or budget changes, and whoever runs the learner should say why.
    pub fn take_no_plan(&mut self) -> Option<String> {
        self.unreported_no_plan.take()
    }

    /// Where the learner stands.
    pub fn state(&self) -> LearnerState {
        match (&self.state, &self.active) {
            (LearnerState::Learning { .. }, _) => LearnerState::Learning {
                window_ops: self.window.trace().ops.len(),
            },
            (state, _) => state.clone(),
        }
    }

    /// The plan out, if any.
    pub fn plan(&self) -> Option<&ExecPlan> {
        self.active.as_ref().map(|a| &a.plan)
    }

    /// Ops in the window.
    pub fn window_ops(&self) -> usize {
        self.window.trace().ops.len()
    }

    /// What the last poll that did work cost.
    pub fn last_poll_cost(&self) -> Option<PollCost> {
        self.last_cost
    }

    /// The budget changed: the next poll replans (or tries again, if no plan fitted).
    pub fn set_budget(&mut self, bytes: u64) {
        if bytes == self.options.budget_bytes {
            return;
        }
        self.options.budget_bytes = bytes;
        self.plan_again();
    }

    /// Has the next poll replan (or try again, if no plan fitted).
    fn plan_again(&mut self) {
        if self.active.is_some() {
            self.replan = true;
        }
        if self.active.is_some() || matches!(self.state, LearnerState::NoPlan { .. }) {
            self.next_attempt = self.launches_learning;
        }
    }

    /// The share of the budget plans leave free changed ([`plan_bytes`]): the next poll
    /// replans (or tries again, if no plan fitted), as for a budget change.
    pub fn set_room(&mut self, room: f64) {
        let room = room.clamp(0.0, MAX_PLAN_ROOM);
        if room == self.options.room {
            return;
        }
        self.options.room = room;
        self.plan_again();
    }

    /// The copy costs plans are made with changed (another job's swaps now share the copy
    /// engines, or stopped sharing them): the next poll replans, as for a budget change.
    pub fn set_cost(&mut self, cost: CostModel) {
        if cost == self.options.cost {
            return;
        }
        self.options.cost = cost;
        self.plan_again();
    }

    /// The share of the budget plans leave free now.
    pub fn room(&self) -> f64 {
        self.options.room
    }

    /// `count` records were lost (the ring was full): the window no longer describes the
    /// run; forget it (allocations still live are kept) and learn again.
    pub fn lost_records(&mut self, count: u64) {
        if count == 0 {
            return;
        }
        self.relearn(self.window.trace().ops.len());
    }

    /// Forgets the ops before `cut` and starts learning again.
    fn relearn(&mut self, cut: usize) {
        self.window.drop_ops_before(cut);
        self.active = None;
        self.replan = false;
        self.state = LearnerState::Learning { window_ops: 0 };
        self.launches_learning = 0;
        self.next_attempt = FIRST_ATTEMPT_LAUNCHES;
        self.period_ops = None;
    }

    fn check_launch(&mut self, seq: u64, kernel: u32) {
        let Some(active) = &self.active else {
            return;
        };
        let position = active.plan.position_of(seq);
        if active.plan.kernel_at(position) != Some(kernel) {
            // The pattern changed: what came before this launch is the old one.
            let cut = self.window.trace().ops.len();
            self.relearn(cut);
        }
    }

    fn measure(&mut self, seq: u64, gpu_ns: u64) {
        let Some(active) = &mut self.active else {
            return;
        };
        let position = active.plan.position_of(seq) as usize;
        let Some(avg) = active.measured_ns.get_mut(position) else {
            return;
        };
        *avg += DURATION_EMA_WEIGHT * (gpu_ns as f64 - *avg);
        active.since_check += 1;
        if active.since_check >= active.plan.period {
            active.since_check = 0;
            let total: f64 = active.measured_ns.iter().sum();
            if (total - active.assumed_ns).abs() > self.options.drift * active.assumed_ns
                && !self.replan
            {
                self.replan = true;
                self.next_attempt = self.launches_learning;
            }
        }
    }

    /// Keeps the window within its bounds.
    fn bound_window(&mut self) {
        let ops = self.window.trace().ops.len();
        match self.period_ops {
            Some(period) if self.active.is_some() => {
                let keep = period.max(1) * self.options.keep_iterations.max(3);
                if ops > 2 * keep {
                    self.window.drop_ops_before(ops - keep);
                }
            }
            _ => {
                if ops > self.options.max_window_ops.max(2) {
                    self.window.drop_ops_before(ops / 2);
                }
            }
        }
    }

    /// The iteration and the cycle to plan, when the window shows two complete instances of
    /// it and enough of a third. Otherwise `Err(Some(period))` if the iteration shows but no
    /// instance can be planned yet, `Err(None)` if it does not show.
    fn detect(&self) -> Result<(Iterations, Cycle), Option<usize>> {
        let trace = self.window.trace();
        let mut iters = detect(trace).map_err(|_| None)?;
        // A pattern inside the iteration repeats too (the layers of a forward pass, the set-up
        // of each parameter), and a short window can make it score best. The whole iteration is
        // told apart by three things: its instances explain most of the window (they start in
        // its first half), they are all about as long (the first may be longer), and an
        // instance frees what it allocates (a forward layer only allocates).
        let n = trace.ops.len();
        let spans = &iters.spans;
        if spans.len() < 3 || spans[0].start > n / 2 {
            return Err(None);
        }
        // An "iteration" of one launch (a kernel repeated, as in a program's final checks)
        // has nothing to plan around: a training step launches more than one kernel.
        let launches = trace.ops[spans[1].clone()]
            .iter()
            .filter(|op| matches!(op.kind, OpKind::Launch { .. }))
            .count();
        if launches < MIN_ITERATION_LAUNCHES {
            return Err(None);
        }
        let tolerance = iters.period / 10;
        if spans[1..spans.len() - 1]
            .iter()
            .any(|s| s.len().abs_diff(iters.period) > tolerance)
        {
            return Err(None);
        }
        // The latest complete instance that is followed by another (where tensors that outlive
        // it are freed) and starts with as many bytes allocated as that one; a launch must come
        // before it in the window, so that its allocations' ordinals are counted from inside
        // the window (those made before the window are all placed at its start).
        // And every allocation it makes is freed in the window or older than a period: one not
        // freed yet may be a tensor that outlives the iteration, whose lifetime (hence role)
        // is known only once it is freed.
        let allocated = allocated_before_ops(trace);
        let resolved = |span: &std::ops::Range<usize>| {
            trace.allocations.iter().all(|a| {
                let at = a.before_op as usize;
                !span.contains(&at) || a.free.is_some() || at + iters.period <= n
            })
        };
        let launch_before = |at: usize| {
            trace.ops[..at]
                .iter()
                .any(|op| matches!(op.kind, OpKind::Launch { .. }))
        };
        let plannable = |k: usize| {
            spans[k].len() == iters.period
                && (k > 0 || launch_before(spans[0].start))
                && allocated[spans[k].start] == allocated[spans[k + 1].start]
                && resolved(&spans[k])
        };
        // Plans name tensors by their ordinal among the iteration's allocations, so the
        // instance planned must make the allocations the next one makes (as far as it has
        // gone), at the same positions: the first steps of a program are often not the steady
        // state (a rerun's prologue, an optimizer's state made in the first step), and a plan
        // from one of them names other tensors in every later step. Only when no instance
        // in a long window is like the next (a program whose steps all differ) is the
        // latest plannable one taken as it is.
        let repeats = |k: usize| {
            let next = &spans[k + 1];
            let seen = n.min(next.end).saturating_sub(next.start);
            let made = |span: std::ops::Range<usize>| {
                trace.allocations.iter().filter_map(move |a| {
                    let at = (a.before_op as usize).checked_sub(span.start)?;
                    (at < seen.min(span.len())).then_some((at, a.bytes))
                })
            };
            made(spans[k].clone()).eq(made(next.clone()))
        };
        let latest_plannable = || (0..spans.len() - 1).rev().filter(|&k| plannable(k));
        let k = latest_plannable()
            .find(|&k| repeats(k))
            .or_else(|| {
                (spans.len() >= UNLIKE_INSTANCES_TAKEN)
                    .then(|| latest_plannable().next())
                    .flatten()
            })
            .ok_or(Some(iters.period))?;
        iters.representative = k;
        let cycle = Cycle::from_trace(trace, &iters, &self.options.cost)
            .with_units(self.options.units)
            .with_page_bytes(self.options.page_bytes);
        // What the shim cannot name stays put: a plan that moved it would lose those moves in
        // conversion and might not run at its budget without them.
        let immovable = unnameable(trace, &cycle);
        Ok((iters, cycle.with_immovable(immovable)))
    }

    fn plan_cycle(&mut self, cycle: &Cycle) -> Result<ExecPlan, String> {
        // Under shim pages, the partial last pages the planner does not count come off first
        // (`Cycle::plan_budgets`).
        let mut budgets =
            budgets_to_try(cycle, self.options.budget_bytes, self.options.room).into_iter();
        let mut result = Err("no budget to plan for".to_string());
        while result.is_err() {
            let Some(budget) = budgets.next() else { break };
            result = self.plan_for(cycle, budget);
        }
        result
    }

    /// The copy costs a plan for `cycle` is made with: `cost`, its rates slowed by the remaps
    /// of pages in units the size of this cycle's tensors as a plan's run cuts them
    /// ([`Cycle::pages_per_unit`], [`SHIM_PLAN_UNIT_PAGES`]).
    pub fn cost_for(&self, cycle: &Cycle) -> CostModel {
        let page = self.options.page_bytes;
        match self.options.remaps {
            Some(m) => {
                let per_unit = cycle.pages_per_unit(page, SHIM_PLAN_UNIT_PAGES);
                self.options
                    .cost
                    .with_page_remaps(m.per_page(per_unit, page))
            }
            None => self.options.cost,
        }
    }

    fn plan_for(&mut self, cycle: &Cycle, budget: Budget) -> Result<ExecPlan, String> {
        let cost = &self.cost_for(cycle);
        let planned = plan(cycle, &budget, cost).map_err(|e| e.to_string())?;
        // The bound without the schedule LP: cheap, and all a build without the solver has.
        let floor = lower_bound_with(
            cycle,
            &budget,
            cost,
            &BoundOptions {
                lp_max_variables: 0,
                ..BoundOptions::default()
            },
        )
        .map_or(0, |b| b.bound_ns);
        let search = SearchOptions {
            floor_ns: floor,
            ..self.options.search
        };
        let improved = if search.time_limit.is_zero() {
            planned.clone()
        } else {
            improve(cycle, &planned, budget, cost, &search).0
        };
        let convert_plan =
            |p: &SwapPlan| convert(self.window.trace(), cycle, p, cost, self.next_version);
        let conversion = match convert_plan(&improved) {
            Ok(c) => c,
            // The search prices plans on the cycle; as the shim executes one, a round trip whose
            // write-out and read-back fall at the same launch is left out, and the rest may not
            // run without it. Then the planner's plan, which the search started from.
            Err(ExecPlanError::Sim(_)) if improved != planned => {
                convert_plan(&planned).map_err(|e| e.to_string())?
            }
            Err(e) => return Err(e.to_string()),
        };
        self.next_version += 1;
        Ok(conversion.plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Launch `seq` of `kernel` at `t_ns`, touching allocation `alloc`.
    fn launch(t_ns: u64, seq: u64, kernel: u32, alloc: u64) -> Record {
        Record::Launch(tensile_trace::Launch {
            t_ns,
            stream: 0,
            seq,
            kernel,
            grid: [1; 3],
            block: [1; 3],
            smem: 0,
            accesses: vec![tensile_trace::Access {
                alloc,
                param_offset: 0,
            }],
        })
    }

    #[test]
    fn the_default_room_reads_as_it_is_written_in_messages() {
        assert_eq!(parse_room(DEFAULT_PLAN_ROOM_TEXT), Ok(DEFAULT_PLAN_ROOM));
        let (room, why) = room_from_env(|_| Some("lots".into()));
        assert_eq!(room, DEFAULT_PLAN_ROOM);
        assert!(why
            .unwrap()
            .ends_with(&format!("using {DEFAULT_PLAN_ROOM_TEXT}")));
    }

    #[test]
    fn the_learner_prices_remaps_for_the_units_of_the_cycle_it_plans() {
        use crate::cost::SwappedMapping;
        use crate::cycle::persistent_tensor;
        let page = crate::cycle::PAGE_BYTES;
        let big = Cycle::from_parts(&[10], vec![persistent_tensor(0, 64 * page, vec![0])]).unwrap();
        let small =
            Cycle::from_parts(&[10], vec![persistent_tensor(0, page / 2, vec![0])]).unwrap();
        let mut options = LearnerOptions::for_budget(1 << 30);
        let copies = Learner::new(options.clone());
        assert_eq!(
            copies.cost_for(&big),
            CostModel::default(),
            "no remaps: copies alone"
        );
        options.remaps = Some(RemapModel::h100(SwappedMapping::HostUnits));
        let learner = Learner::new(options);
        let (big, small) = (learner.cost_for(&big), learner.cost_for(&small));
        // Units of 8 pages under a plan share the calls; a half-page tensor's unit pays them
        // all for its page.
        let per_page = RemapModel::h100(SwappedMapping::HostUnits).per_page(8.0, page);
        assert_eq!(big, CostModel::default().with_page_remaps(per_page));
        assert!(small.h2d_ns(page) > big.h2d_ns(page) && small.d2h_ns(page) > big.d2h_ns(page));
        assert!(big.h2d_ns(page) > CostModel::default().h2d_ns(page));
    }

    #[test]
    fn the_learner_can_move_to_the_planners_thread() {
        fn send<T: Send>() {}
        send::<Learner>();
    }

    #[test]
    fn records_it_cannot_place_are_left_out_and_nothing_is_planned_from_noise() {
        let mut learner = Learner::new(LearnerOptions::for_budget(1 << 30));
        // A free and a duration of things never seen, launches touching an unknown id.
        learner.push(&Record::Free(tensile_trace::Free {
            t_ns: 0,
            stream: 0,
            id: 99,
        }));
        learner.push(&Record::LaunchTime(tensile_trace::LaunchTime {
            seq: 5,
            gpu_ns: 10,
        }));
        for seq in 0..200u64 {
            // No repetition: a new kernel every launch.
            learner.push(&launch(seq, seq, seq as u32, 77));
        }
        assert_eq!(learner.poll(), None);
        assert_eq!(learner.state(), LearnerState::Learning { window_ops: 200 });
        assert!(learner
            .window
            .trace()
            .ops
            .iter()
            .all(|op| op.touches.is_empty()));
    }

    #[test]
    fn one_kernel_launched_over_and_over_is_not_an_iteration() {
        let mut learner = Learner::new(LearnerOptions::for_budget(1 << 30));
        learner.push(&Record::Alloc(tensile_trace::Alloc {
            t_ns: 0,
            stream: 0,
            id: 1,
            ptr: 1 << 32,
            bytes: 4 << 20,
            kind: tensile_trace::AllocKind::Async,
        }));
        // A program's final checks: the same kernel on the same tensor, many times.
        for seq in 0..400u64 {
            learner.push(&launch(seq + 1, seq, 7, 1));
        }
        assert_eq!(learner.poll(), None);
        assert!(matches!(learner.state(), LearnerState::Learning { .. }));
    }
}
