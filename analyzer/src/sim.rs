//! The simulator: replays a cycle under a policy with the bandwidth model and kernel durations.
//!
//! Model (the same one the planner and the bound reason about, see docs/planner.md):
//! - one compute stream runs the ops in order, each for its duration; ops recorded on several
//!   streams are serialized (the trace does not record cross-stream dependencies);
//! - two copy engines, one per direction, each a FIFO; alone a direction runs at its own
//!   bandwidth, both at once share the bidirectional total;
//! - device memory counts tensors on the device and in flight either way (a swap-out frees its
//!   memory when the copy completes, a swap-in holds it from the moment it starts);
//! - a tensor's data appears at its first access (no copy: its contents were garbage) and
//!   disappears after its last access (`plan`, which knows the future) or at its free (`lru`,
//!   `none`, which do not). Under [`MoveUnits::ShimPages`] a plan's tensors too are released at
//!   their free, as the shim releases their pages: from the last access to the free (the tail)
//!   a tensor holds memory, unless the plan writes it out ([`crate::plan::TailOut`]: a copy to
//!   the host, queued on the device-to-host engine like any write-out, that releases the memory
//!   when it ends);
//! - every access may write a tensor, so leaving after an access costs a device-to-host copy;
//!   leaving with a valid host copy (brought in, not touched since) is free;
//! - `lru` under [`MoveUnits::ShimPages`] is the shim's manager: page by page, with its free
//!   reserve, cancelled swap-outs, and a host that issues launches (and the manager's work for
//!   them) in order ahead of the compute stream as far as memory lets it, the compute stream
//!   running only what the host has issued (docs/planner.md, "LRU as the shim runs it").
//!
//! Invariants checked on every step, not assumed: device bytes never exceed the budget (`plan`,
//! `lru`), and every tensor an op touches is on the device when the op starts. A violation is an
//! error ([`SimError`]), as is a deadlock. A plan whose pieces do not tile its tensors exactly
//! is refused before anything runs ([`SimError::PiecesDoNotCover`]).
//!
//! **Steady state.** The cycle is run again and again from an idealised initial state until the
//! state at an iteration boundary repeats one seen at an earlier boundary (or [`SimOptions::
//! max_cycles`] is reached). The *state* at a boundary is: where every tensor (piece) is
//! (absent, on the device, on the host, moving either way), whether its host copy is valid, the
//! device bytes in use, each copy engine's queue in order and its active copy with the bytes it
//! has left (compared within [`REMAINING_BYTES_TOLERANCE`], since they are floats), and for LRU
//! the recency order of the tensors. The simulation is deterministic given that state, so from
//! a repeat on it runs through the same cycle of states forever; the report gives the average
//! step over that cycle (which may span several iterations: a plan can alternate between two
//! step lengths). A run that reaches the cap without a repeat is reported as not settled, with
//! the average over its last half. The first iteration starts from an idealised state and can be
//! faster than any steady state; the lower bound holds for the steady state only.

use std::collections::VecDeque;

use serde::Serialize;

use crate::cost::{format_bytes, Budget, CostModel};
use crate::cycle::{Cycle, MoveUnits, TensorId};
use crate::pieces::CoverError;
use crate::plan::SwapPlan;
use crate::timeline::{unrolled_accesses, Liveness};

/// Which policy to simulate.
#[derive(Debug, Clone, Copy)]
pub enum Policy<'a> {
    /// No swapping at all: the footprint is whatever the program needs.
    None,
    /// On-demand: bring a tensor in when an op needs it, evict the least recently used.
    Lru,
    /// Follow a precomputed periodic plan.
    Plan(&'a SwapPlan),
}

impl Policy<'_> {
    /// The policy's name as `tensile replay` prints it.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Lru => "lru",
            Policy::Plan(_) => "plan",
        }
    }
}

/// Simulation settings.
#[derive(Debug, Clone, Copy)]
pub struct SimOptions {
    /// Most iterations simulated while waiting for the state at an iteration boundary to repeat
    /// (at least 2).
    pub max_cycles: u32,
    /// Record device bytes at each op start of the last cycle (for plots).
    pub record_curve: bool,
    /// Record which ops of the last cycle waited, how long and for which tensors (what the
    /// local search aims its changes at).
    pub record_waits: bool,
    /// Give up ([`SimError::Abandoned`]) as soon as an iteration after the first lasts longer
    /// than this: a search that only wants plans faster than one it has need not finish the
    /// others. Most plans settle after one iteration, whose successor is then the steady
    /// state; a plan with a longer transient, or that alternates between step lengths, can be
    /// abandoned although its steady average is within the limit (callers leave slack).
    pub abandon_above_ns: Option<u64>,
}

/// Default [`SimOptions::max_cycles`]. Every plan and LRU run on the shared traces settles within
/// a few iterations; the cap only bounds the cost of a plan that does not.
pub const DEFAULT_MAX_CYCLES: u32 = 64;

/// Two boundary states whose in-flight copies differ by at most this many bytes left count as
/// the same (a thousandth of a byte: far below anything that changes a decision, far above the
/// rounding of the fluid copy model's arithmetic).
pub const REMAINING_BYTES_TOLERANCE: f64 = 1e-3;

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            max_cycles: DEFAULT_MAX_CYCLES,
            record_curve: false,
            record_waits: false,
            abandon_above_ns: None,
        }
    }
}

/// What a simulated steady-state iteration looked like.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    /// Policy name.
    pub policy: &'static str,
    /// Budget in bytes.
    pub budget_bytes: u64,
    /// GPU time of the ops alone.
    pub compute_ns: u64,
    /// Predicted duration of one iteration in the steady state: the average over the repeating
    /// cycle of states (see the module doc).
    pub step_ns: u64,
    /// Time the compute stream waited for copies or memory per steady-state iteration.
    pub stall_ns: u64,
    /// Host-to-device bytes per steady-state iteration.
    pub bytes_h2d: u64,
    /// Device-to-host bytes per steady-state iteration.
    pub bytes_d2h: u64,
    /// Of those, the bytes of swap-outs an op cancelled (LRU in shim pages: the op needed the
    /// page before it left, so it stayed; its copy ran all the same).
    pub bytes_cancelled: u64,
    /// Whether the state at an iteration boundary repeated within the cap. When false, the
    /// figures are the average over the last half of the simulated iterations.
    pub settled: bool,
    /// First iteration (0-based) of the repeating cycle of states.
    pub settled_after: u32,
    /// Iterations in the repeating cycle of states (1: every steady iteration is the same).
    pub steady_iterations: u32,
    /// Most device bytes at any instant (all simulated iterations).
    pub peak_resident_bytes: u64,
    /// Whether the policy stayed within the budget (always true for `plan` and `lru`, which
    /// fail instead; `none` can exceed it).
    pub fits: bool,
    /// Tensors a plan had not brought back in time and that were fetched on demand.
    pub demand_fetches: u64,
    /// Duration of each simulated iteration.
    pub step_ns_per_cycle: Vec<u64>,
    /// (time since the iteration started, device bytes) at each op start of the last iteration,
    /// when requested.
    pub resident_curve: Vec<(u64, u64)>,
    /// Copies that completed in the last iteration, when requested (with the curve), in order
    /// of completion; times since that iteration started (a copy begun in the previous one
    /// starts at a negative time).
    pub copies: Vec<CopySpan>,
    /// Ops of the last iteration that waited before starting, when requested, in op order.
    pub waits: Vec<OpWait>,
}

/// One op that waited for copies or memory before it could start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpWait {
    /// Op position in the cycle.
    pub op: u32,
    /// How long the compute stream waited.
    pub waited_ns: u64,
    /// Its tensors (pieces, for a plan on pieces: ids of the cycle cut into them) that were not
    /// on the device when the compute stream reached it.
    pub tensors: Vec<TensorId>,
}

/// One copy as the simulator ran it (for timelines).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CopySpan {
    /// True for host-to-device (a read-back), false for device-to-host (a write-out).
    pub to_device: bool,
    /// The tensor (or piece, for a plan on pieces) it moved.
    pub tensor: TensorId,
    /// Bytes moved.
    pub bytes: u64,
    /// Start, ns since the iteration started.
    pub start_ns: f64,
    /// End, ns since the iteration started.
    pub end_ns: f64,
}

/// Why a simulation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// Device bytes would exceed the budget.
    #[error(
        "budget exceeded at op {op}: {} on the device, budget {}",
        format_bytes(*bytes),
        format_bytes(*budget)
    )]
    BudgetExceeded {
        /// Op position in the cycle.
        op: u32,
        /// Device bytes.
        bytes: u64,
        /// Budget.
        budget: u64,
    },
    /// An op started while one of its tensors was not on the device.
    #[error("op {op} started while tensor {tensor} was not on the device")]
    NotResident {
        /// Op position.
        op: u32,
        /// Tensor.
        tensor: TensorId,
    },
    /// One op's tensors alone exceed the budget.
    #[error(
        "op {op} alone touches {}, more than the budget of {}",
        format_bytes(*bytes),
        format_bytes(*budget)
    )]
    OpTooLarge {
        /// Op position.
        op: u32,
        /// Bytes it touches.
        bytes: u64,
        /// Budget.
        budget: u64,
    },
    /// Nothing can make progress.
    #[error("deadlock at op {op}: waiting for memory that nothing will free")]
    Deadlock {
        /// Op position.
        op: u32,
    },
    /// A plan refers to something the cycle does not have.
    #[error("the plan does not match the cycle: {0}")]
    BadPlan(String),
    /// An iteration lasted longer than [`SimOptions::abandon_above_ns`].
    #[error("abandoned: an iteration lasted longer than {limit_ns} ns")]
    Abandoned {
        /// The limit it passed.
        limit_ns: u64,
    },
    /// A plan's pieces do not tile one of the cycle's tensors exactly.
    #[error("the plan's pieces do not cover tensor {tensor} exactly: {problem}")]
    PiecesDoNotCover {
        /// The tensor.
        tensor: TensorId,
        /// What is wrong with its pieces.
        problem: CoverError,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Holds no data (before its first access, after its last).
    Absent,
    Device,
    Host,
    ToHost,
    ToDevice,
}

/// A copy in a copy engine.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    tensor: TensorId,
    remaining: f64,
    /// Simulated time it started.
    started: f64,
}

struct Engine {
    queue: VecDeque<TensorId>,
    active: Option<Transfer>,
    /// How many times each tensor is in `queue`, so that membership costs no scan.
    queued: Vec<u32>,
}

impl Engine {
    fn new(tensors: usize) -> Engine {
        Engine {
            queue: VecDeque::new(),
            active: None,
            queued: vec![0; tensors],
        }
    }

    fn push_back(&mut self, t: TensorId) {
        self.queued[t as usize] += 1;
        self.queue.push_back(t);
    }

    fn push_front(&mut self, t: TensorId) {
        self.queued[t as usize] += 1;
        self.queue.push_front(t);
    }

    fn pop_front(&mut self) -> Option<TensorId> {
        let t = self.queue.pop_front()?;
        self.queued[t as usize] -= 1;
        Some(t)
    }

    fn contains(&self, t: TensorId) -> bool {
        self.queued[t as usize] > 0
    }

    /// Takes every entry of `t` out of the queue.
    fn remove(&mut self, t: TensorId) {
        if self.contains(t) {
            self.queue.retain(|&q| q != t);
            self.queued[t as usize] = 0;
        }
    }
}

/// A remap: its tensor and the ns it takes (or, being made, has left).
type Remap = (TensorId, f64);

/// The remaps that follow one direction's copies ([`CostModel::remaps`]): one thread,
/// in the copies' order.
#[derive(Default)]
struct Remaps {
    /// The remaps waiting, each with the ns it takes.
    queue: VecDeque<Remap>,
    /// The remap being made.
    active: Option<Remap>,
}

impl Remaps {
    fn contains(&self, t: TensorId) -> bool {
        self.active.is_some_and(|(a, _)| a == t) || self.queue.iter().any(|&(q, _)| q == t)
    }

    /// Queues `t`'s remap of `ns`, starting it at once if the thread is idle.
    fn push(&mut self, t: TensorId, ns: f64) {
        match self.active {
            None => self.active = Some((t, ns)),
            Some(_) => self.queue.push_back((t, ns)),
        }
    }

    /// Ends the remap being made, if it has no time left, and starts the next; returns the
    /// tensor whose remap ended.
    fn finish(&mut self) -> Option<TensorId> {
        let (t, ns) = self.active?;
        // Done within a rounding error of zero.
        if ns > 1e-6 {
            return None;
        }
        self.active = self.queue.pop_front();
        Some(t)
    }

    /// Takes `t` out (its tensor was released); the next remap starts if it was the one
    /// being made.
    fn remove(&mut self, t: TensorId) {
        self.queue.retain(|&(q, _)| q != t);
        if self.active.is_some_and(|(a, _)| a == t) {
            self.active = self.queue.pop_front();
        }
    }

    fn state(&self) -> (Vec<Remap>, Option<Remap>) {
        (self.queue.iter().copied().collect(), self.active)
    }
}

/// Per-op actions, precomputed from the policy.
#[derive(Default, Clone)]
struct OpActions {
    /// Tensors whose data dies after this op (a plan in bytes) or that are freed before it
    /// (lru, none, a plan in shim pages).
    release: Vec<TensorId>,
    /// Plan: tensors to write out after this op (round trips and tails).
    evict_after: Vec<TensorId>,
    /// Plan: tensors to start bringing back when the compute stream reaches this op.
    fetch_at: Vec<TensorId>,
    /// LRU in shim pages: tensors allocated before this op, which take their memory when the
    /// host issues it ([`Sim::issue_ahead`]).
    allocate: Vec<TensorId>,
}

struct Sim<'a> {
    cycle: &'a Cycle,
    cost: CostModel,
    budget: u64,
    enforce_budget: bool,
    lru: bool,
    /// LRU as the shim's manager runs it (in shim pages), else `None`.
    shim: Option<ShimLru>,
    /// The unrolled op the compute stream is at.
    now_op: u64,
    place: Vec<Place>,
    host_valid: Vec<bool>,
    /// One more than the unrolled op that last used each tensor (0: none since the start), so
    /// that the tensors an op is issued or run with are told from those left from the start.
    last_use: Vec<u64>,
    used: u64,
    peak: u64,
    time: f64,
    d2h: Engine,
    h2d: Engine,
    /// The remaps after each direction's copies, with a [`CostModel::remaps`].
    d2h_remaps: Remaps,
    h2d_remaps: Remaps,
    /// LRU in shim pages: the remaps the host makes itself, after the write-outs it waits
    /// for (the thread short of frames completes the swap-outs it waited for; the others
    /// the maintenance thread does, in `d2h_remaps`).
    host_remaps: Remaps,
    /// LRU in shim pages: write-outs the host waits for whose copies have landed. It remaps
    /// them once the copies of all it waits for have (it waits for those, then completes
    /// what landed), so that a batch's copies and remaps take turns, as in the shim.
    host_landed: Vec<TensorId>,
    /// LRU in shim pages: the remaps of pages brought in, made by the host before it queues
    /// their copies (a copy starts once its page's remap is done). The host makes them one
    /// after another, after the remaps of `host_remaps` (one thread: it completes the
    /// write-outs it waited for, then maps what comes in), and issues no further op while
    /// one is left: the application's thread maps the pages of a launch before it returns.
    /// So while the host runs ahead they cost the compute stream nothing, and when it does
    /// not they hold each launch back.
    host_in: Remaps,
    actions: Vec<OpActions>,
    /// Whether tensors are released at their free (else after their last access).
    release_at_free: bool,
    stats_cycle: usize,
    bytes_h2d: Vec<u64>,
    bytes_d2h: Vec<u64>,
    bytes_cancelled: Vec<u64>,
    demand_fetches: u64,
    /// Record completed copies (for timelines), relative to `iteration_start`.
    record_copies: bool,
    iteration_start: f64,
    copies: Vec<CopySpan>,
    /// Record [`OpWait`]s (cleared at each iteration start, so the last iteration's remain).
    record_waits: bool,
    waits: Vec<OpWait>,
    /// The current op's tensors not yet on the device, in the op's order (see `run_op`).
    pending: Vec<TensorId>,
}

/// LRU as the shim's manager runs it ([`MoveUnits::ShimPages`]; docs/planner.md, "LRU as the
/// shim runs it").
struct ShimLru {
    /// Bytes kept free (or on their way out) ahead of need once the budget is full
    /// ([`shim_free_reserve_pages`]).
    reserve: u64,
    /// The first unrolled op the host has not issued ([`Sim::issue_ahead`]).
    next: u64,
    /// Prices the remaps of pages brought in, which the host makes before it queues their
    /// copies ([`Sim::host_in`]).
    remaps_in: CostModel,
    /// Write-outs the host waits for before it issues another op.
    host_waits: Vec<TensorId>,
    /// Allocations the host has made while the tensor's previous incarnation still held it
    /// (its free is stream-ordered: the compute stream has not got there), with the host's
    /// latest stamp of the new one. Their frames are taken (counted in `used`) when the host
    /// allocates; at the free the new one takes the tensor's place ([`Sim::release`]).
    backed: Vec<Backed>,
    /// Per tensor: whether it is part of an allocation of more than half the budget, which
    /// the shim backs with host memory (it comes in at its first use) rather than evict for
    /// it.
    host_backed: Vec<bool>,
}

/// An allocation the host has made ahead of the free of its tensor's previous incarnation
/// ([`ShimLru::backed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Backed {
    tensor: TensorId,
    /// The host's latest use of it.
    stamp: u64,
}

impl ShimLru {
    fn backed_stamp(&mut self, t: TensorId) -> Option<&mut u64> {
        self.backed
            .iter_mut()
            .find(|b| b.tensor == t)
            .map(|b| &mut b.stamp)
    }
}

/// Most ops the host of a modelled LRU run issues ahead of the compute stream
/// ([`Sim::issue_ahead`]): about what a CUDA stream queues before a launch blocks. Memory
/// bounds the lead long before this on the shared traces under pressure.
pub const HOST_LEAD_OPS: u64 = 1024;

/// Whether LRU runs page by page ([`simulate_with`]): in shim pages, where a tensor spans
/// more than one page.
pub fn lru_in_pages(cycle: &Cycle) -> bool {
    cycle.units == MoveUnits::ShimPages && cycle.tensors.iter().any(|t| t.bytes > cycle.page_bytes)
}

/// Pages the shim's manager keeps free (or on their way out) ahead of need under a budget of
/// `budget_pages`, once the budget is full, for a program whose live allocations peak at
/// `peak_pages`: [`free_reserve_pages_for`] with the shim's default floor (a 32nd of the
/// budget, at least one eviction batch of 8 pages; `ManagerConfig`, a test in the shim checks
/// that they agree), kept by the simulator's LRU in shim pages.
pub fn shim_free_reserve_pages(budget_pages: u64, peak_pages: u64) -> u64 {
    free_reserve_pages_for((budget_pages / 32).max(8), budget_pages, peak_pages)
}

/// The free reserve rule the shim's manager keeps (`keep_reserve`) and the simulator models:
/// an eighth of what must turn over (the pages of the peak beyond the budget), at least
/// `floor`, at most a quarter of the budget unless the floor is more, and never more than
/// half of it. Under heavy pressure a frame kept free costs no hit (nearly every page turns
/// over each iteration), and the frames the maintenance thread empties ahead of need spare
/// the application's thread waiting for its victims' copies and remapping them itself;
/// under light pressure it would cost hits (docs/rerun.md, "Session 30").
pub fn free_reserve_pages_for(floor: u64, budget_pages: u64, peak_pages: u64) -> u64 {
    let over = peak_pages.saturating_sub(budget_pages);
    (over / 8)
        .min(budget_pages / 4)
        .max(floor)
        .min(budget_pages / 2)
}

/// Simulates `cycle` under `policy` within `budget`.
pub fn simulate(
    cycle: &Cycle,
    policy: Policy<'_>,
    budget: Budget,
    cost: &CostModel,
    options: SimOptions,
) -> Result<SimReport, SimError> {
    simulate_with(cycle, None, policy, budget, cost, options)
}

/// [`simulate`] with the cycle's [`Liveness`] computed by the caller, for one that simulates
/// many plans of one cycle (the local search). `live` must be `Liveness::of(cycle)`; `None`
/// computes it (as does a plan on pieces, which runs on the cycle cut into them).
pub fn simulate_with(
    cycle: &Cycle,
    live: Option<&Liveness>,
    policy: Policy<'_>,
    budget: Budget,
    cost: &CostModel,
    options: SimOptions,
) -> Result<SimReport, SimError> {
    // A plan made on pieces moves pieces: replay it on the cycle whose tensors are its pieces.
    if let Policy::Plan(plan) = policy {
        crate::pieces::check_cover(cycle, &plan.pieces)
            .map_err(|(tensor, problem)| SimError::PiecesDoNotCover { tensor, problem })?;
    }
    let split;
    // The size of the allocation each tensor (page) is part of.
    let whole_bytes: Vec<u64>;
    let (cycle, live) = match policy {
        Policy::Plan(plan) if !crate::pieces::is_whole(cycle, &plan.pieces) => {
            whole_bytes = Vec::new();
            split = crate::pieces::split(cycle, &plan.pieces).map_err(SimError::BadPlan)?;
            // The caller's liveness is of the tensors, not of the pieces.
            (&split, None)
        }
        // LRU as the shim runs it: page by page (a tensor's partial last page is a unit of its
        // own), so that its write-outs and read-backs pipeline as the manager's do.
        Policy::Lru if lru_in_pages(cycle) => {
            let pages = crate::pieces::cut(cycle, cycle.page_bytes);
            whole_bytes = pages
                .iter()
                .map(|p| cycle.tensors[p.tensor as usize].bytes)
                .collect();
            split = crate::pieces::split(cycle, &pages).map_err(SimError::BadPlan)?;
            (&split, None)
        }
        _ => {
            whole_bytes = cycle.tensors.iter().map(|t| t.bytes).collect();
            (cycle, live)
        }
    };
    let p = cycle.len();
    let cycles = options.max_cycles.max(2) as usize;
    let n_t = cycle.tensors.len();
    let enforce_budget = !matches!(policy, Policy::None);
    if enforce_budget {
        for (i, op) in cycle.ops.iter().enumerate() {
            let bytes: u64 = op
                .tensors
                .iter()
                .map(|&t| cycle.tensors[t as usize].bytes)
                .sum();
            if bytes > budget.bytes {
                return Err(SimError::OpTooLarge {
                    op: i as u32,
                    bytes,
                    budget: budget.bytes,
                });
            }
        }
    }
    let mut actions = vec![OpActions::default(); p];
    // Only a plan knows the last access; in shim pages it does not help, the shim holds the
    // pages until the free.
    let release_at_free = !matches!(policy, Policy::Plan(_)) || cycle.units == MoveUnits::ShimPages;
    let shim_lru = matches!(policy, Policy::Lru) && cycle.units == MoveUnits::ShimPages;
    for (tid, t) in cycle.tensors.iter().enumerate() {
        let tid = tid as TensorId;
        if t.is_persistent() || t.accesses.is_empty() {
            continue;
        }
        if !release_at_free {
            let last = t.accesses[t.accesses.len() - 1];
            actions[last as usize].release.push(tid);
        } else if let Some(free) = t.free_at {
            actions[free as usize % p.max(1)].release.push(tid);
        }
        if let (Some(alloc), true) = (t.alloc_at, shim_lru) {
            actions[alloc as usize % p.max(1)].allocate.push(tid);
        }
    }
    if let Policy::Plan(plan) = policy {
        for e in &plan.evictions {
            if e.piece as usize >= n_t || e.out_after as usize >= p || e.fetch_at as usize >= p {
                return Err(SimError::BadPlan(format!("eviction {e:?} is out of range")));
            }
            actions[e.out_after as usize].evict_after.push(e.piece);
            actions[e.fetch_at as usize].fetch_at.push(e.piece);
        }
        if !plan.tail_outs.is_empty() && cycle.units != MoveUnits::ShimPages {
            // Outside shim pages a tensor is released at its last access: there is no tail.
            return Err(SimError::BadPlan(
                "tail write-outs in a plan that is not in shim pages".into(),
            ));
        }
        for t in &plan.tail_outs {
            let out = t.out_unrolled(p as u32);
            if t.piece as usize >= n_t || t.out_after as usize >= p || out >= t.freed_at {
                return Err(SimError::BadPlan(format!(
                    "tail write-out {t:?} is out of range"
                )));
            }
            actions[t.out_after as usize].evict_after.push(t.piece);
        }
    }
    let mut sim = Sim {
        cycle,
        // The executor remaps a plan's pages beside the copies (the remap stage). The shim's
        // LRU remaps a page in on the host before it queues its copy (`host_in`, priced by
        // `ShimLru::remaps_in`), and a page out after its copy on the thread that completes
        // the swap-out (`host_remaps`, `d2h_remaps`). The textbook LRU copies and remaps in
        // turn.
        cost: match policy {
            Policy::Plan(_) => *cost,
            _ if shim_lru => cost.without_remaps_in(),
            _ => cost.folded(),
        },
        budget: budget.bytes,
        enforce_budget,
        lru: matches!(policy, Policy::Lru),
        shim: shim_lru.then(|| {
            let page = cycle.page_bytes.max(1);
            let peak_bytes = crate::timeline::allocated_bytes(cycle)
                .into_iter()
                .max()
                .unwrap_or(0);
            let budget_pages = budget.bytes / page;
            // As the shim's `device_frames_for_new`: more pages than half the budget's.
            let host_backed = whole_bytes
                .iter()
                .map(|b| b.div_ceil(page) > budget_pages / 2)
                .collect();
            ShimLru {
                reserve: shim_free_reserve_pages(budget_pages, peak_bytes.div_ceil(page))
                    * cycle.page_bytes,
                next: 0,
                remaps_in: *cost,
                host_waits: Vec::new(),
                backed: Vec::new(),
                host_backed,
            }
        }),
        now_op: 0,
        place: vec![Place::Absent; n_t],
        host_valid: vec![false; n_t],
        last_use: vec![0; n_t],
        used: 0,
        peak: 0,
        time: 0.0,
        d2h: Engine::new(n_t),
        h2d: Engine::new(n_t),
        d2h_remaps: Remaps::default(),
        h2d_remaps: Remaps::default(),
        host_remaps: Remaps::default(),
        host_landed: Vec::new(),
        host_in: Remaps::default(),
        actions,
        release_at_free,
        stats_cycle: 0,
        bytes_h2d: vec![0; cycles],
        bytes_d2h: vec![0; cycles],
        bytes_cancelled: vec![0; cycles],
        demand_fetches: 0,
        record_copies: options.record_curve,
        iteration_start: 0.0,
        copies: Vec::new(),
        record_waits: options.record_waits,
        waits: Vec::new(),
        pending: Vec::new(),
    };
    let computed;
    let live = match live {
        Some(l) => l,
        None => {
            computed = Liveness::of(cycle);
            &computed
        }
    };
    sim.initial_state(policy, live)?;

    let mut boundaries = Vec::with_capacity(cycles + 1);
    let mut states: Vec<BoundaryState> = Vec::with_capacity(cycles + 1);
    let mut stall = vec![0f64; cycles];
    let mut curve = Vec::new();
    // (first iteration of the repeating cycle, one past its last)
    let mut repeat: Option<(usize, usize)> = None;
    for c in 0..cycles {
        sim.stats_cycle = c;
        boundaries.push(sim.time);
        states.push(sim.boundary_state((c * p) as u64));
        if options.record_curve {
            curve.clear();
            sim.copies.clear();
            sim.iteration_start = sim.time;
        }
        sim.waits.clear();
        for pos in 0..p {
            if options.record_curve {
                curve.push(((sim.time - boundaries[c]).max(0.0) as u64, sim.used));
            }
            let global = (c * p + pos) as u64;
            let waited = sim.run_op(pos, global)?;
            stall[c] += waited;
            if let Some(limit) = options.abandon_above_ns {
                if c > 0 && sim.time - boundaries[c] > limit as f64 {
                    return Err(SimError::Abandoned { limit_ns: limit });
                }
            }
        }
        let now = sim.boundary_state(((c + 1) * p) as u64);
        if let Some(first) = states.iter().position(|s| s.same_as(&now)) {
            repeat = Some((first, c + 1));
            break;
        }
    }
    boundaries.push(sim.time);
    let steps: Vec<f64> = boundaries.windows(2).map(|w| w[1] - w[0]).collect();
    let (settled, (from, to)) = match repeat {
        Some(r) => (true, r),
        None => (false, (cycles / 2, cycles)),
    };
    let n = (to - from) as f64;
    let average = |xs: &[f64]| (xs[from..to].iter().sum::<f64>() / n).round() as u64;
    let as_f64 = |xs: &[u64]| xs.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let compute_ns = cycle.compute_ns();
    Ok(SimReport {
        policy: policy.name(),
        budget_bytes: budget.bytes,
        compute_ns,
        step_ns: average(&steps),
        stall_ns: average(&stall),
        bytes_h2d: average(&as_f64(&sim.bytes_h2d)),
        bytes_d2h: average(&as_f64(&sim.bytes_d2h)),
        bytes_cancelled: average(&as_f64(&sim.bytes_cancelled)),
        settled,
        settled_after: from as u32,
        steady_iterations: (to - from) as u32,
        peak_resident_bytes: sim.peak,
        fits: sim.peak <= budget.bytes,
        demand_fetches: sim.demand_fetches,
        step_ns_per_cycle: steps.iter().map(|s| s.round() as u64).collect(),
        resident_curve: curve,
        copies: std::mem::take(&mut sim.copies),
        waits: std::mem::take(&mut sim.waits),
    })
}

/// What the host of LRU in shim pages carries across an iteration boundary.
type HostState = (u64, Vec<TensorId>, Vec<Backed>);

/// The simulator's state at an iteration boundary (see the module doc): what must repeat for
/// the simulation to have reached its steady state.
#[derive(Debug, Clone)]
struct BoundaryState {
    place: Vec<Place>,
    host_valid: Vec<bool>,
    used: u64,
    d2h_queue: Vec<TensorId>,
    h2d_queue: Vec<TensorId>,
    d2h_active: Option<(TensorId, f64)>,
    h2d_active: Option<(TensorId, f64)>,
    /// Each direction's remaps: those queued, and the one being made with the ns it has left.
    d2h_remaps: (Vec<Remap>, Option<Remap>),
    h2d_remaps: (Vec<Remap>, Option<Remap>),
    /// LRU in shim pages: the host's remaps, and the write-outs it waits for that landed.
    host_remaps: (Vec<Remap>, Option<Remap>),
    host_landed: Vec<TensorId>,
    host_in: (Vec<Remap>, Option<Remap>),
    /// LRU: tensors in order of last use (ties by id), which is all its decisions look at.
    recency: Vec<TensorId>,
    /// LRU in shim pages: how far ahead of the boundary the host has issued, the write-outs
    /// it waits for, and the allocations it has backed ahead of their tensor's free (with
    /// their stamps, relative to the boundary).
    host: Option<HostState>,
}

impl BoundaryState {
    /// Equal, with bytes left in flight compared within [`REMAINING_BYTES_TOLERANCE`].
    fn same_as(&self, other: &BoundaryState) -> bool {
        let close = |a: Option<(TensorId, f64)>, b: Option<(TensorId, f64)>| match (a, b) {
            (None, None) => true,
            (Some((ta, ra)), Some((tb, rb))) => {
                ta == tb && (ra - rb).abs() <= REMAINING_BYTES_TOLERANCE
            }
            _ => false,
        };
        self.used == other.used
            && self.place == other.place
            && self.host_valid == other.host_valid
            && self.d2h_queue == other.d2h_queue
            && self.h2d_queue == other.h2d_queue
            && close(self.d2h_active, other.d2h_active)
            && close(self.h2d_active, other.h2d_active)
            && self.d2h_remaps.0 == other.d2h_remaps.0
            && self.h2d_remaps.0 == other.h2d_remaps.0
            && close(self.d2h_remaps.1, other.d2h_remaps.1)
            && close(self.h2d_remaps.1, other.h2d_remaps.1)
            && self.host_remaps.0 == other.host_remaps.0
            && close(self.host_remaps.1, other.host_remaps.1)
            && self.host_landed == other.host_landed
            && self.host_in.0 == other.host_in.0
            && close(self.host_in.1, other.host_in.1)
            && self.recency == other.recency
            && self.host == other.host
    }
}

impl Sim<'_> {
    /// The state at the iteration boundary before the unrolled op `boundary`.
    fn boundary_state(&self, boundary: u64) -> BoundaryState {
        let recency = if self.lru {
            let mut order: Vec<TensorId> = (0..self.place.len() as TensorId).collect();
            order.sort_by_key(|&t| (self.last_use[t as usize], t));
            order
        } else {
            Vec::new()
        };
        BoundaryState {
            place: self.place.clone(),
            host_valid: self.host_valid.clone(),
            used: self.used,
            d2h_queue: self.d2h.queue.iter().copied().collect(),
            h2d_queue: self.h2d.queue.iter().copied().collect(),
            d2h_active: self.d2h.active.map(|a| (a.tensor, a.remaining)),
            h2d_active: self.h2d.active.map(|a| (a.tensor, a.remaining)),
            d2h_remaps: self.d2h_remaps.state(),
            h2d_remaps: self.h2d_remaps.state(),
            host_remaps: self.host_remaps.state(),
            host_landed: self.host_landed.clone(),
            host_in: self.host_in.state(),
            recency,
            host: self.shim.as_ref().map(|s| {
                let mut backed: Vec<Backed> = s
                    .backed
                    .iter()
                    .map(|&b| Backed {
                        stamp: b.stamp.saturating_sub(boundary),
                        ..b
                    })
                    .collect();
                backed.sort_unstable();
                (
                    s.next.saturating_sub(boundary),
                    s.host_waits.clone(),
                    backed,
                )
            }),
        }
    }

    /// What `t`'s remap after its copy takes ([`CostModel::remaps`]).
    fn remap_ns(&self, t: TensorId, to_device: bool) -> f64 {
        self.cost.remap_ns(self.bytes(t), to_device)
    }

    fn bytes(&self, t: TensorId) -> u64 {
        self.cycle.tensors[t as usize].bytes
    }

    /// An op needs `t`, on its way out: the shim cancels its swap-out (`t` stays; its copy,
    /// queued on the card, runs anyway).
    fn cancel_swap_out(&mut self, t: TensorId) {
        self.place[t as usize] = Place::Device;
        self.bytes_cancelled[self.stats_cycle] += self.bytes(t);
    }

    fn grow(&mut self, bytes: u64, op: usize) -> Result<(), SimError> {
        self.used += bytes;
        self.peak = self.peak.max(self.used);
        if self.enforce_budget && self.used > self.budget {
            return Err(SimError::BudgetExceeded {
                op: op as u32,
                bytes: self.used,
                budget: self.budget,
            });
        }
        Ok(())
    }

    fn free_bytes(&self) -> u64 {
        self.budget.saturating_sub(self.used)
    }

    /// Places every tensor that holds data at the start of the cycle.
    fn initial_state(&mut self, policy: Policy<'_>, live: &Liveness) -> Result<(), SimError> {
        let cycle = self.cycle;
        let period = cycle.len() as u32;
        // Tensors holding data at position 0, with the unrolled position of their next use.
        let mut holding: Vec<(TensorId, u32)> = Vec::new();
        for g in &live.gaps {
            if g.to >= period {
                holding.push((g.tensor, g.to));
            }
        }
        for &t in &live.idle {
            holding.push((t, u32::MAX));
        }
        // A plan in shim pages: tails that span the boundary hold memory (or, written out
        // before it, are on the host).
        if matches!(policy, Policy::Plan(_)) {
            for g in live.tails.iter().filter(|g| g.to > period) {
                holding.push((g.tensor, u32::MAX - 1));
            }
        }
        // Transient tensors whose lifetime wraps and that are released at their free under
        // lru/none: they hold memory from their last access to the free.
        if !matches!(policy, Policy::Plan(_)) {
            for (tid, t) in cycle.tensors.iter().enumerate() {
                if let (Some(a), Some(f)) = (t.alloc_at, t.free_at) {
                    if t.accesses.is_empty() {
                        continue;
                    }
                    let acc = unrolled_accesses(&t.accesses, period);
                    let last = acc[acc.len() - 1];
                    // Dead but not yet freed at position 0 of the next cycle.
                    let wraps_free = f < a;
                    if wraps_free && last < period && !holding.iter().any(|h| h.0 == tid as u32) {
                        holding.push((tid as TensorId, u32::MAX - 1));
                    }
                }
            }
        }
        match policy {
            Policy::Plan(plan) => {
                let mut on_host = vec![false; self.place.len()];
                for t in plan.on_host_at_start() {
                    if let Some(h) = on_host.get_mut(t as usize) {
                        *h = true;
                    }
                }
                for (t, _) in holding {
                    if on_host[t as usize] || plan.host_resident.contains(&t) {
                        self.place[t as usize] = Place::Host;
                        self.host_valid[t as usize] = true;
                    } else {
                        self.place[t as usize] = Place::Device;
                        self.grow(self.bytes(t), 0)?;
                    }
                }
            }
            Policy::Lru | Policy::None => {
                holding.sort_by_key(|h| h.1);
                for (t, _) in holding {
                    let b = self.bytes(t);
                    if matches!(policy, Policy::None) || self.used + b <= self.budget {
                        self.place[t as usize] = Place::Device;
                        self.grow(b, 0)?;
                    } else {
                        self.place[t as usize] = Place::Host;
                        self.host_valid[t as usize] = true;
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs op `pos`; returns how long the compute stream waited before it could start.
    fn run_op(&mut self, pos: usize, global: u64) -> Result<f64, SimError> {
        let cycle = self.cycle;
        let op = &cycle.ops[pos];
        // Frees recorded before this op (lru, none, a plan in shim pages).
        if self.release_at_free {
            for i in 0..self.actions[pos].release.len() {
                let t = self.actions[pos].release[i];
                self.release(t);
            }
        }
        // Plan: prefetches issued when the compute stream reaches this op.
        for i in 0..self.actions[pos].fetch_at.len() {
            let t = self.actions[pos].fetch_at[i];
            if matches!(self.place[t as usize], Place::Host | Place::ToHost) {
                self.h2d.push_back(t);
            }
        }
        self.now_op = global;
        self.issue_ahead(pos);
        let ready_at = self.time;
        // Only the op's tensors not on the device can hold it back, and while it waits none of
        // those on the device leaves (evictions and releases happen between ops, LRU evicts no
        // tensor of the op), so each check looks at the ones still missing.
        self.pending.clear();
        for &t in &op.tensors {
            if self.place[t as usize] != Place::Device {
                self.pending.push(t);
            }
        }
        let missing = if self.record_waits {
            self.pending.clone()
        } else {
            Vec::new()
        };
        loop {
            self.start_copies(pos)?;
            // (In shim pages the GPU runs only what the host has launched.)
            if self.try_make_ready(pos)? && self.shim.as_ref().is_none_or(|s| s.next > global) {
                break;
            }
            // Requests made while checking (LRU evictions, demand fetches) may start now.
            self.start_copies(pos)?;
            if !self.advance_to_next_copy_event(pos)? {
                return Err(SimError::Deadlock { op: pos as u32 });
            }
        }
        let waited = self.time - ready_at;
        if self.record_waits && waited > 0.0 {
            self.waits.push(OpWait {
                op: pos as u32,
                waited_ns: waited.round() as u64,
                tensors: missing,
            });
        }
        for &t in &op.tensors {
            if self.place[t as usize] != Place::Device {
                return Err(SimError::NotResident {
                    op: pos as u32,
                    tensor: t,
                });
            }
            self.host_valid[t as usize] = false;
            // (A host running ahead may have stamped a later use already.)
            self.last_use[t as usize] = self.last_use[t as usize].max(global + 1);
        }
        // The op runs; copies progress meanwhile.
        let end = self.time + op.duration_ns as f64;
        self.advance_copies_until(end, pos)?;
        self.time = end;
        if !self.release_at_free {
            for i in 0..self.actions[pos].release.len() {
                let t = self.actions[pos].release[i];
                self.release(t);
            }
        }
        for i in 0..self.actions[pos].evict_after.len() {
            let t = self.actions[pos].evict_after[i];
            if self.place[t as usize] == Place::Device {
                self.evict(t);
            }
        }
        if let Some(reserve) = self.shim.as_ref().map(|s| s.reserve) {
            // The shim's manager evicts ahead of need once an access is ready.
            self.make_room_before(reserve, pos, global);
        }
        Ok(waited)
    }

    /// LRU in shim pages (else nothing): the host's work for the ops from the one the compute
    /// stream is at (`pos`) on, as far ahead as memory lets it run (at most
    /// [`HOST_LEAD_OPS`]), as the shim does it when the application launches them. An op's
    /// tensors are stamped as used (and so kept until it has run: the shim's recency is the
    /// host's), those on the host are queued to come in, and least recently used ones that no
    /// issued op needs are evicted to make room for every read-back queued; the host then
    /// waits for those write-outs, as the shim waits for the frames an access lacks. It stops
    /// at the first op whose tensors would not fit without evicting the issued ops' own, and
    /// the compute stream runs no op the host has not issued.
    ///
    /// The host issues ops in order and never passes one it has not done the work of: an op
    /// the compute stream is waiting at is issued (its allocations backed, its read-backs
    /// queued) before any later one takes memory. A model that let the host pass it (marking
    /// it issued once the compute stream got there) had the later ops' stamps and allocations
    /// take the frames the waiting op needed; the waiting op then evicted the pages of the
    /// ops issued after it, soonest needed first, and BERT at 50% flipped from 7 to 17.6 GiB
    /// moved per iteration between nearby copy rates (docs/planner.md, "LRU as the shim runs
    /// it").
    ///
    /// Nothing the host has issued may count on frames that do not come: a swap-out an op
    /// cancels gives no frame, so the op fits only if the read-backs queued before it still
    /// have theirs; and an allocation of a tensor whose next incarnation is already backed
    /// waits for the compute stream. Otherwise the compute stream, at an issued op, had to
    /// take the pages of ops issued after it, and the frames of allocations backed ahead of
    /// their free, which nothing can take, left it waiting for ever (a `Deadlock`).
    fn issue_ahead(&mut self, pos: usize) {
        let p = self.cycle.len() as u64;
        let Some(mut shim) = self.shim.take() else {
            return;
        };
        let global = self.now_op;
        // Every op the compute stream has run was issued; the one it is at may not be yet.
        shim.next = shim.next.max(global);
        while shim.next <= global + HOST_LEAD_OPS {
            shim.host_waits
                .retain(|&t| self.place[t as usize] == Place::ToHost);
            if !shim.host_waits.is_empty() || self.host_in.active.is_some() {
                break;
            }
            let gj = shim.next;
            let j = (gj % p) as usize;
            let op = &self.cycle.ops[j];
            if op.host_waits && gj > global {
                // A recorded synchronization: the host waits for the compute stream.
                break;
            }
            let queued = self.bytes_on_host(&self.h2d.queue);
            // New allocations take frames when the host makes them (the shim backs them at
            // once), stamped as just used: an absent tensor takes its place on the device; one
            // whose previous incarnation still holds it (its free is stream-ordered, the
            // compute stream has not reached it) is backed beside it until then.
            // (An allocation of more than half the budget is backed by host memory and comes
            // in at its first use.)
            let is_backed = |t: TensorId| shim.backed.iter().any(|b| b.tensor == t);
            let allocates = |t: TensorId| {
                self.place[t as usize] == Place::Absent
                    || (!is_backed(t) && self.cycle.tensors[t as usize].free_at.is_some())
            };
            // (allocated, wanted) with the allocations of more than half the budget, or with
            // all of them (`spill`), backed by host memory.
            let demand = |spill: bool| {
                let on_host = |t: TensorId| spill || shim.host_backed[t as usize];
                let allocated: u64 = self.actions[j]
                    .allocate
                    .iter()
                    .filter(|&&t| allocates(t) && !on_host(t))
                    .map(|&t| self.bytes(t))
                    .sum();
                let fetched: u64 = op
                    .tensors
                    .iter()
                    // A tensor backed earlier is the new incarnation: its bytes were counted
                    // with its allocation, and it is never fetched.
                    .filter(|&&t| !is_backed(t))
                    .filter(|&&t| {
                        if self.actions[j].allocate.contains(&t) {
                            // Backed by host memory here and fetched at once.
                            return on_host(t) && self.place[t as usize] == Place::Absent;
                        }
                        match self.place[t as usize] {
                            Place::Host => !self.h2d.contains(t),
                            // Allocated earlier but not holding memory: takes it when it runs.
                            Place::Absent => true,
                            _ => false,
                        }
                    })
                    .map(|&t| self.bytes(t))
                    .sum();
                (allocated, allocated + fetched)
            };
            // The model holds two incarnations of a tensor at most: its place and one
            // allocation backed ahead of the free. One backed by host memory comes in at its
            // first use, and while its previous incarnation holds the tensor that read-back
            // cannot be queued; a host a whole lifetime further ahead would allocate a third
            // (skipping it left the tensor absent when the compute stream got there: it waited
            // for an allocation the host had passed). In both cases the host waits for the
            // compute stream to get to the op, by when the frees before it have been made.
            if gj > global
                && self.actions[j].allocate.iter().any(|&t| {
                    is_backed(t)
                        || (shim.host_backed[t as usize]
                            && allocates(t)
                            && self.place[t as usize] != Place::Absent)
                })
            {
                break;
            }
            let evictable: u64 = (0..self.place.len() as TensorId)
                .filter(|&t| self.evictable(t, pos, global) && !op.tensors.contains(&t))
                .map(|t| self.bytes(t))
                .sum();
            // The op's own pages on their way out stay (their swap-outs are cancelled below):
            // their frames, which the read-backs queued for the ops issued before may be
            // counting on, do not come free. An op that takes no new frame but cancels is
            // checked too.
            let cancelled: u64 = op
                .tensors
                .iter()
                .filter(|&&t| {
                    !is_backed(t)
                        && !self.actions[j].allocate.contains(&t)
                        && self.place[t as usize] == Place::ToHost
                })
                .map(|&t| self.bytes(t))
                .sum();
            let room = self.free_bytes() + self.outgoing_bytes() - cancelled + evictable;
            let (mut allocated, mut wanted) = demand(false);
            let mut spill = false;
            if (wanted > 0 || cancelled > 0) && queued + wanted > room {
                // An op that does not fit waits for the compute stream to run the issued ones
                // (their pages can go then). When the compute stream waits for this one, its
                // own pages are what is left: its allocations are backed by host memory, as
                // the shim backs an allocation it cannot find device frames for, and come in
                // at their first use.
                (allocated, wanted) = demand(true);
                spill = true;
                if gj > global || queued + wanted > room {
                    break;
                }
            }
            // Its tensors are the host's most recent: no room is made with them. (Those it
            // allocates are stamped when they are.)
            for &t in &op.tensors {
                if self.actions[j].allocate.contains(&t) {
                    continue;
                }
                match shim.backed_stamp(t) {
                    Some(stamp) => *stamp = gj + 1,
                    None => {
                        let u = t as usize;
                        self.last_use[u] = self.last_use[u].max(gj + 1);
                        // The shim cancels the swap-out of a page an access needs, before it
                        // makes room for the rest.
                        if self.place[u] == Place::ToHost {
                            self.cancel_swap_out(t);
                        }
                    }
                }
            }
            if queued + wanted > self.free_bytes() {
                shim.host_waits = self.make_room_before(queued + wanted, pos, global);
            }
            if allocated > 0 && queued + allocated > self.free_bytes() {
                // The host waits for the frames of the allocation before it goes on (and
                // issues the op when a copy out has ended). The read-backs queued for the ops
                // issued before take theirs first: the shim found them their frames before
                // it returned from those launches.
                if shim.host_waits.is_empty() {
                    shim.host_waits = self.outgoing().collect();
                }
                break;
            }
            for i in 0..self.actions[j].allocate.len() {
                let t = self.actions[j].allocate[i];
                let u = t as usize;
                let on_host = spill || shim.host_backed[u];
                if self.place[u] == Place::Absent {
                    self.last_use[u] = self.last_use[u].max(gj + 1);
                    if on_host {
                        self.place[u] = Place::Host;
                        self.host_valid[u] = true;
                        continue;
                    }
                    self.place[u] = Place::Device;
                } else if !on_host
                    && shim.backed_stamp(t).is_none()
                    && self.cycle.tensors[u].free_at.is_some()
                {
                    shim.backed.push(Backed {
                        tensor: t,
                        stamp: gj + 1,
                    });
                } else {
                    continue;
                }
                self.used += self.bytes(t);
                self.peak = self.peak.max(self.used);
            }
            for &t in &op.tensors {
                let u = t as usize;
                if shim.backed_stamp(t).is_some() {
                    continue;
                }
                match self.place[u] {
                    // The shim cancels the swap-out of a page an access needs.
                    Place::ToHost => self.cancel_swap_out(t),
                    Place::Host
                        if !self.h2d.contains(t)
                            && self.h2d.active.is_none_or(|a| a.tensor != t) =>
                    {
                        let ns = shim.remaps_in.remap_ns(self.bytes(t), true);
                        self.host_in.push(t, ns);
                        self.h2d.push_back(t);
                    }
                    _ => {}
                }
            }
            shim.next = gj + 1;
        }
        self.shim = Some(shim);
    }

    fn release(&mut self, t: TensorId) {
        // Wherever it is, a read-back queued for it goes, with its remap in.
        self.h2d.remove(t);
        self.host_in.remove(t);
        if matches!(
            self.place[t as usize],
            Place::Device | Place::ToDevice | Place::ToHost
        ) {
            self.used -= self.bytes(t);
            self.d2h.remove(t);
            self.d2h_remaps.remove(t);
            self.h2d_remaps.remove(t);
            self.host_remaps.remove(t);
            self.host_landed.retain(|&h| h != t);
            if self.d2h.active.is_some_and(|a| a.tensor == t) {
                self.d2h.active = None;
            }
            if self.h2d.active.is_some_and(|a| a.tensor == t) {
                self.h2d.active = None;
            }
        }
        self.place[t as usize] = Place::Absent;
        self.host_valid[t as usize] = false;
        // An allocation the host made ahead of this free takes the tensor's place, in the
        // frames it took then.
        if let Some(shim) = self.shim.as_mut() {
            if let Some(i) = shim.backed.iter().position(|b| b.tensor == t) {
                let b = shim.backed.swap_remove(i);
                self.last_use[t as usize] = b.stamp;
                self.place[t as usize] = Place::Device;
            }
        }
    }

    /// Starts moving `t` off the device: free if its host copy is valid, else a write-back.
    fn evict(&mut self, t: TensorId) {
        if self.host_valid[t as usize] {
            self.place[t as usize] = Place::Host;
            self.used -= self.bytes(t);
        } else {
            self.place[t as usize] = Place::ToHost;
            self.d2h.push_back(t);
            self.bytes_d2h[self.stats_cycle] += self.bytes(t);
        }
    }

    /// Whether op `pos` can start now; for LRU, requests what it needs. Looks at `pending`
    /// (the op's tensors that were not on the device) and drops those that now are.
    fn try_make_ready(&mut self, pos: usize) -> Result<bool, SimError> {
        let mut ready = true;
        let mut absent_bytes = 0;
        let mut pending = std::mem::take(&mut self.pending);
        pending.retain(|&t| self.place[t as usize] != Place::Device);
        for &t in &pending {
            match self.place[t as usize] {
                Place::Device => {}
                Place::Absent => {
                    absent_bytes += self.bytes(t);
                    ready = false;
                }
                Place::ToDevice => ready = false,
                Place::ToHost if self.shim.is_some() => {
                    // The shim cancels a swap-out of a page an access needs: the page stays,
                    // its copy still runs (it was queued on the card), and its completion
                    // leaves the page where it is (`progress`).
                    self.cancel_swap_out(t);
                }
                Place::Host | Place::ToHost => {
                    ready = false;
                    if !self.h2d.contains(t) && self.h2d.active.is_none_or(|a| a.tensor != t) {
                        // On demand: LRU's normal path, a plan's miss.
                        if !self.lru {
                            self.demand_fetches += 1;
                        }
                        if let Some(shim) = &self.shim {
                            // Mapped by the host, which is waiting for this op.
                            let ns = shim.remaps_in.remap_ns(self.bytes(t), true);
                            self.host_in.push(t, ns);
                        }
                        self.h2d.push_front(t);
                    }
                }
            }
        }
        // In shim pages the host allocates (`issue_ahead`), and the op waits for it.
        if absent_bytes > 0 && self.shim.is_none() {
            if self.enforce_budget && absent_bytes > self.free_bytes() && self.lru {
                self.make_room_sparing_issued(absent_bytes, pos);
            }
            if !self.enforce_budget || absent_bytes <= self.free_bytes() {
                for &t in &pending {
                    if self.place[t as usize] == Place::Absent {
                        self.place[t as usize] = Place::Device;
                        if let Err(e) = self.grow(self.bytes(t), pos) {
                            self.pending = pending;
                            return Err(e);
                        }
                    }
                }
                self.pending = pending;
                return self.try_make_ready(pos);
            }
        }
        if !ready && self.shim.is_some() {
            // The shim's manager frees frames for all the pages an access lacks at once.
            let need = self.bytes_on_host(&pending);
            if need > self.free_bytes() {
                self.make_room_sparing_issued(need, pos);
            }
        } else if !ready && self.lru {
            // Make room for the head of the fetch queue if it is waiting for memory.
            if let Some(&head) = self.h2d.queue.front() {
                if self.h2d.active.is_none() && self.place[head as usize] == Place::Host {
                    let need = self.bytes(head);
                    if need > self.free_bytes() {
                        self.make_room(need, pos);
                    }
                }
            }
        }
        self.pending = pending;
        Ok(ready)
    }

    /// LRU: evicts least recently used device tensors not needed by op `pos` until `need` bytes
    /// are free or on their way to being free.
    fn make_room(&mut self, need: u64, pos: usize) {
        self.make_room_before(need, pos, u64::MAX);
    }

    /// [`Self::make_room`] for op `pos`; in shim pages, the pages of the ops the host has
    /// issued since stay if anything else can go.
    fn make_room_sparing_issued(&mut self, need: u64, pos: usize) {
        if self.shim.is_some() {
            self.make_room_before(need, pos, self.now_op);
        }
        self.make_room(need, pos);
    }

    /// Whether `t` may be evicted to make room for op `pos`: on the device, not one of the
    /// op's, and last used before the unrolled op `pinned_from`.
    fn evictable(&self, t: TensorId, pos: usize, pinned_from: u64) -> bool {
        self.place[t as usize] == Place::Device
            && self.last_use[t as usize] <= pinned_from
            && !self.cycle.ops[pos].tensors.contains(&t)
    }

    /// Bytes of those of `tensors` that are on the host.
    fn bytes_on_host<'t>(&self, tensors: impl IntoIterator<Item = &'t TensorId>) -> u64 {
        tensors
            .into_iter()
            .filter(|&&t| self.place[t as usize] == Place::Host)
            .map(|&t| self.bytes(t))
            .sum()
    }

    /// [`Self::make_room`], leaving also every tensor used at or after the unrolled op
    /// `pinned_from` (those a host running ahead has already issued work for).
    fn make_room_before(&mut self, need: u64, pos: usize, pinned_from: u64) -> Vec<TensorId> {
        let mut coming = self.free_bytes() + self.outgoing_bytes();
        let mut evicted = Vec::new();
        if coming >= need {
            return evicted;
        }
        let mut candidates: Vec<TensorId> = (0..self.cycle.tensors.len() as TensorId)
            .filter(|&t| self.evictable(t, pos, pinned_from))
            .collect();
        candidates.sort_by_key(|&t| self.last_use[t as usize]);
        for t in candidates {
            if coming >= need {
                break;
            }
            coming += self.bytes(t);
            self.evict(t);
            evicted.push(t);
        }
        evicted
    }

    /// The tensors whose write-outs are still on their way (not those of cancelled swap-outs:
    /// their tensors stay on the device), each once: a page whose swap-out was cancelled and
    /// made again is queued twice, and its frame comes free once (counted twice, it had the
    /// host issue read-backs on a frame that did not come).
    fn outgoing(&self) -> impl Iterator<Item = TensorId> + '_ {
        (0..self.place.len() as TensorId).filter(|&t| {
            self.place[t as usize] == Place::ToHost
                && (self.d2h.contains(t)
                    || self.d2h.active.is_some_and(|a| a.tensor == t)
                    || self.d2h_remaps.contains(t)
                    || self.host_remaps.contains(t)
                    || self.host_landed.contains(&t))
        })
    }

    /// Bytes of [`Self::outgoing`].
    fn outgoing_bytes(&self) -> u64 {
        self.outgoing().map(|t| self.bytes(t)).sum()
    }

    fn rates(&self) -> (f64, f64) {
        match (self.h2d.active.is_some(), self.d2h.active.is_some()) {
            (true, true) => self.cost.shared_rates(),
            _ => (self.cost.h2d_gbps, self.cost.d2h_gbps),
        }
    }

    /// Starts the head of each idle engine's queue when it can start.
    fn start_copies(&mut self, pos: usize) -> Result<(), SimError> {
        if self.d2h.active.is_none() {
            if let Some(t) = self.d2h.pop_front() {
                self.d2h.active = Some(Transfer {
                    tensor: t,
                    remaining: self.bytes(t) as f64,
                    started: self.time,
                });
            }
        }
        while self.h2d.active.is_none() {
            let Some(&t) = self.h2d.queue.front() else {
                break;
            };
            match self.place[t as usize] {
                Place::Host => {
                    let b = self.bytes(t);
                    if (b > self.free_bytes() && self.enforce_budget) || self.host_in.contains(t) {
                        break;
                    }
                    self.h2d.pop_front();
                    self.place[t as usize] = Place::ToDevice;
                    self.grow(b, pos)?;
                    self.bytes_h2d[self.stats_cycle] += b;
                    self.h2d.active = Some(Transfer {
                        tensor: t,
                        remaining: b as f64,
                        started: self.time,
                    });
                }
                // Still being written out: the read-back waits for it.
                Place::ToHost => break,
                _ => {
                    self.h2d.pop_front();
                }
            }
        }
        Ok(())
    }

    /// Time until the next copy or remap completes, if any is running.
    fn next_copy_event(&self) -> Option<f64> {
        let (rh, rd) = self.rates();
        [
            self.h2d.active.map(|a| a.remaining / rh),
            self.d2h.active.map(|a| a.remaining / rd),
            self.h2d_remaps.active.map(|(_, ns)| ns),
            self.d2h_remaps.active.map(|(_, ns)| ns),
            self.host_remaps.active.map(|(_, ns)| ns),
            self.host_in_running().map(|(_, ns)| ns),
        ]
        .into_iter()
        .flatten()
        .reduce(f64::min)
    }

    /// The remap in the host is making, if it is not completing write-outs (one thread does
    /// both, those first).
    fn host_in_running(&self) -> Option<Remap> {
        self.host_in
            .active
            .filter(|_| self.host_remaps.active.is_none())
    }

    /// Moves copies forward by `dt`, completing those that finish.
    fn progress(&mut self, dt: f64) {
        let (rh, rd) = self.rates();
        if self.host_in_running().is_some() {
            if let Some((_, ns)) = self.host_in.active.as_mut() {
                *ns -= dt;
            }
        }
        if let Some(a) = self.h2d.active.as_mut() {
            a.remaining -= dt * rh;
        }
        if let Some(a) = self.d2h.active.as_mut() {
            a.remaining -= dt * rd;
        }
        for remaps in [
            &mut self.h2d_remaps,
            &mut self.d2h_remaps,
            &mut self.host_remaps,
        ] {
            if let Some((_, ns)) = remaps.active.as_mut() {
                *ns -= dt;
            }
        }
        self.time += dt;
        // Completion within a rounding error of zero. A remap ends before the copy that
        // ends at the same time queues its own.
        if let Some(t) = self.h2d_remaps.finish() {
            self.arrived(t);
        }
        if self.host_remaps.active.is_none() {
            // (Its copy starts in `start_copies`.)
            self.host_in.finish();
        }
        for t in [self.d2h_remaps.finish(), self.host_remaps.finish()]
            .into_iter()
            .flatten()
        {
            // (Unless a cancelled swap-out was made again and copies once more.)
            if !self.d2h.contains(t) && self.d2h.active.is_none_or(|a| a.tensor != t) {
                self.left(t);
            }
        }
        if let Some(a) = self.h2d.active {
            if a.remaining <= 1e-6 {
                self.record_copy(a, true);
                self.h2d.active = None;
                if self.cost.remaps.is_some() {
                    let ns = self.remap_ns(a.tensor, true);
                    self.h2d_remaps.push(a.tensor, ns);
                } else {
                    self.arrived(a.tensor);
                }
            }
        }
        if let Some(a) = self.d2h.active {
            if a.remaining <= 1e-6 {
                self.record_copy(a, false);
                self.d2h.active = None;
                // A cancelled swap-out (LRU in shim pages) leaves its tensor on the device,
                // with no remap.
                if self.place[a.tensor as usize] == Place::ToHost {
                    if self.cost.remaps.is_none() {
                        self.left(a.tensor);
                    } else if self
                        .shim
                        .as_ref()
                        .is_some_and(|s| s.host_waits.contains(&a.tensor))
                    {
                        self.host_landed.push(a.tensor);
                    } else {
                        let ns = self.remap_ns(a.tensor, false);
                        self.d2h_remaps.push(a.tensor, ns);
                    }
                }
            }
        }
        if !self.host_landed.is_empty() {
            self.remap_landed_on_the_host();
        }
    }

    /// LRU in shim pages: once the copies of every write-out the host waits for have landed
    /// (or been cancelled), the host remaps those that landed, one after another.
    fn remap_landed_on_the_host(&mut self) {
        self.host_landed
            .retain(|&t| self.place[t as usize] == Place::ToHost);
        let copying = |t: TensorId| {
            self.place[t as usize] == Place::ToHost
                && (self.d2h.contains(t) || self.d2h.active.is_some_and(|a| a.tensor == t))
        };
        let waiting = self
            .shim
            .as_ref()
            .is_some_and(|s| s.host_waits.iter().any(|&t| copying(t)));
        if waiting {
            return;
        }
        for t in std::mem::take(&mut self.host_landed) {
            let ns = self.remap_ns(t, false);
            self.host_remaps.push(t, ns);
        }
    }

    /// `t`'s read-back is done (its copy, and its remap if any).
    fn arrived(&mut self, t: TensorId) {
        self.place[t as usize] = Place::Device;
        self.host_valid[t as usize] = true;
    }

    /// `t`'s write-out is done (its copy, and its remap if any): its memory is free, unless
    /// the swap-out was cancelled meanwhile.
    fn left(&mut self, t: TensorId) {
        if self.place[t as usize] == Place::ToHost {
            self.place[t as usize] = Place::Host;
            self.host_valid[t as usize] = true;
            self.used -= self.bytes(t);
        }
    }

    fn record_copy(&mut self, a: Transfer, to_device: bool) {
        if self.record_copies {
            self.copies.push(CopySpan {
                to_device,
                tensor: a.tensor,
                bytes: self.bytes(a.tensor),
                start_ns: a.started - self.iteration_start,
                end_ns: self.time - self.iteration_start,
            });
        }
    }

    /// Advances to the next copy completion; false if nothing is running.
    fn advance_to_next_copy_event(&mut self, pos: usize) -> Result<bool, SimError> {
        match self.next_copy_event() {
            Some(dt) => {
                self.progress(dt.max(0.0));
                // A host that waited for write-outs issues what it can.
                self.issue_ahead(pos);
                self.start_copies(pos)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Runs copies until time `end` (an op is computing meanwhile).
    fn advance_copies_until(&mut self, end: f64, pos: usize) -> Result<(), SimError> {
        loop {
            self.start_copies(pos)?;
            let remaining = end - self.time;
            if remaining <= 0.0 {
                return Ok(());
            }
            match self.next_copy_event() {
                Some(dt) if dt < remaining => {
                    self.progress(dt.max(0.0));
                    self.issue_ahead(pos);
                }
                _ => {
                    self.progress(remaining);
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cycle::persistent_tensor as persistent;
    use crate::pieces::Piece;
    use crate::plan::{plan, Eviction};

    const MIB: u64 = 1 << 20;

    /// `n` 64 MiB tensors touched in turn, each by two ops, by ops of 100 µs.
    fn ring(n: u32) -> Cycle {
        let tensors = (0..n)
            .map(|i| {
                let mut accesses = vec![i, (i + 1) % n];
                accesses.sort_unstable();
                persistent(i, 64 * MIB, accesses)
            })
            .collect();
        Cycle::from_parts(&vec![100_000; n as usize], tensors).unwrap()
    }

    /// Four 64 MiB tensors touched in turn by ops of 100 µs, room for three: a plan must rotate.
    fn rotation() -> Cycle {
        let tensors = (0..4)
            .map(|i| persistent(i, 64 * MIB, vec![i, (i + 1) % 4]))
            .collect();
        Cycle::from_parts(&[100_000; 4], tensors).unwrap()
    }

    #[test]
    fn a_plan_whose_pieces_do_not_cover_their_tensors_is_refused() {
        let cycle = rotation();
        let budget = Budget::new(200 * MIB);
        let cost = CostModel::default();
        let mut bad = plan(&cycle, &budget, &cost).unwrap();
        // The audit's plan: a single byte stands for each tensor, so nothing needs to move.
        bad.evictions.clear();
        bad.pieces = (0..4)
            .map(|t| Piece {
                tensor: t,
                offset: 0,
                bytes: 1,
            })
            .collect();
        let err = simulate(
            &cycle,
            Policy::Plan(&bad),
            budget,
            &cost,
            SimOptions::default(),
        )
        .unwrap_err();
        assert_eq!(
            err,
            SimError::PiecesDoNotCover {
                tensor: 0,
                problem: CoverError::Gap { offset: 1 }
            }
        );
        assert!(err.to_string().contains("tensor 0"));
    }

    /// LRU on whole tensors and as the shim runs it (in shim pages), recording waits.
    fn lru_both_ways(cycle: &Cycle, budget: u64) -> (SimReport, SimReport) {
        let cost = CostModel::default();
        let options = SimOptions {
            record_waits: true,
            record_curve: true,
            ..SimOptions::default()
        };
        let run = |c: &Cycle| simulate(c, Policy::Lru, Budget::new(budget), &cost, options);
        let pages = cycle.clone().with_units(MoveUnits::ShimPages);
        (run(cycle).unwrap(), run(&pages).unwrap())
    }

    #[test]
    fn lru_in_shim_pages_reads_back_while_it_writes_out() {
        // Each op needs a 64 MiB tensor that is on the host. Whole tensors: it waits for one
        // to go out, then for its own to come in, each at 55 GB/s. Pages: the first page
        // comes in as soon as the first has left, both directions sharing 92 GB/s (and the
        // 8 MiB left over keep part of a tensor).
        let (whole, pages) = lru_both_ways(&ring(4), 200 * MIB);
        assert_eq!((whole.bytes_h2d, whole.bytes_d2h), (256 * MIB, 256 * MIB));
        assert!(pages.settled);
        assert!(pages.bytes_h2d <= whole.bytes_h2d && pages.bytes_d2h <= whole.bytes_d2h);
        let cost = CostModel::default();
        let floor = ((pages.bytes_h2d + pages.bytes_d2h) as f64 / cost.bidir_gbps)
            .max(pages.bytes_h2d as f64 / cost.h2d_gbps);
        // (Both engines busy the whole step: at the floor, to the nanosecond it is rounded to.)
        assert!(
            pages.step_ns as f64 + 1.0 >= floor,
            "{} < {floor}",
            pages.step_ns
        );
        assert!(
            (pages.step_ns as f64) < 0.6 * whole.step_ns as f64,
            "pages {} ns, whole tensors {} ns",
            pages.step_ns,
            whole.step_ns
        );
        let overlap = |a: &CopySpan, b: &CopySpan| a.start_ns < b.end_ns && b.start_ns < a.end_ns;
        let ins = pages.copies.iter().filter(|c| c.to_device);
        let overlapping = ins
            .filter(|i| pages.copies.iter().any(|o| !o.to_device && overlap(i, o)))
            .count();
        assert!(overlapping > 0, "no read-back overlaps a write-out");
        let whole_ins = whole.copies.iter().filter(|c| c.to_device);
        assert!(
            whole_ins
                .clone()
                .all(|i| !whole.copies.iter().any(|o| !o.to_device && overlap(i, o))),
            "whole tensors: each read-back waits for the write-out that makes its room"
        );
    }

    #[test]
    fn lru_in_shim_pages_fetches_while_the_host_runs_ahead() {
        // Five 64 MiB tensors in rotation, room for four and the reserve; op 0 computes for
        // 5 ms. Whole tensors: op 1's tensor comes when the compute stream gets to op 1. The
        // shim's host has launched op 1 while op 0 runs, and its pages come in meanwhile.
        let mut cycle = ring(5);
        cycle.ops[0].duration_ns = 5_000_000;
        let (whole, pages) = lru_both_ways(&cycle, 272 * MIB);
        let waited = |r: &SimReport, op: u32| r.waits.iter().any(|w| w.op == op);
        assert!(waited(&whole, 1), "{:?}", whole.waits);
        assert!(!waited(&pages, 1), "{:?}", pages.waits);
        // Pages written out ahead of need and needed again stay: their copies ran, but
        // nothing comes back for them.
        assert!(pages.bytes_h2d < pages.bytes_d2h, "{pages:?}");
        assert!(pages.step_ns < whole.step_ns, "{pages:?} {whole:?}");
    }

    /// How long op `op` waited in the last iteration of `r` (0 if it did not).
    fn waited_ns(r: &SimReport, op: u32) -> u64 {
        r.waits
            .iter()
            .filter(|w| w.op == op)
            .map(|w| w.waited_ns)
            .sum()
    }

    #[test]
    fn lru_in_shim_pages_runs_no_op_ahead_of_a_recorded_synchronization() {
        // As in `lru_in_shim_pages_fetches_while_the_host_runs_ahead`, but the program waited
        // for the device before it launched op 1 (a `loss.item()`): the host cannot launch
        // op 1 while op 0 runs, so op 1's pages come in only after it, and it waits for them.
        let mut cycle = ring(5);
        cycle.ops[0].duration_ns = 5_000_000;
        let (_, ahead) = lru_both_ways(&cycle, 272 * MIB);
        cycle.ops[1].host_waits = true;
        let (_, synced) = lru_both_ways(&cycle, 272 * MIB);
        assert_eq!(waited_ns(&ahead, 1), 0, "{:?}", ahead.waits);
        // 64 MiB at 55 GB/s: 1.22 ms.
        assert!(waited_ns(&synced, 1) >= 1_200_000, "{:?}", synced.waits);
        assert!(synced.step_ns > ahead.step_ns, "{synced:?} {ahead:?}");
    }

    #[test]
    fn lru_in_shim_pages_maps_pages_in_on_the_host_as_it_runs_ahead() {
        // The ring of `lru_in_shim_pages_fetches_while_the_host_runs_ahead`, each page coming
        // in remapped for 100 µs by the host before its copy: op 1's pages (up to 32) take
        // up to 3.2 ms of the host's time, which op 0's 5 ms hide while the host runs ahead.
        // After a recorded synchronization they do not: op 1 waits for the remap of every
        // page it lacks, one after another (each copy, 38 µs, overlaps the next remap).
        let mut cycle = ring(5).with_units(MoveUnits::ShimPages);
        cycle.ops[0].duration_ns = 5_000_000;
        let cost = CostModel::default().with_page_remaps(crate::PageRemapCost {
            page_bytes: 2 * MIB,
            in_ns: 100_000,
            out_ns: 0,
        });
        let options = SimOptions {
            record_waits: true,
            ..SimOptions::default()
        };
        let run = |c: &Cycle| simulate(c, Policy::Lru, Budget::new(272 * MIB), &cost, options);
        let ahead = run(&cycle).unwrap();
        assert_eq!(waited_ns(&ahead, 1), 0, "{:?}", ahead.waits);
        cycle.ops[1].host_waits = true;
        let synced = run(&cycle).unwrap();
        let wait = synced.waits.iter().find(|w| w.op == 1).expect("op 1 waits");
        let remaps = wait.tensors.len() as u64 * 100_000;
        assert!(
            remaps > 0 && (remaps..remaps + 100_000).contains(&wait.waited_ns),
            "{wait:?}"
        );
    }

    /// A transient of `bytes` allocated before op `alloc`, accessed at `accesses`, freed
    /// before op `free`.
    fn transient(
        i: u32,
        bytes: u64,
        accesses: Vec<u32>,
        alloc: u32,
        free: u32,
    ) -> crate::cycle::Tensor {
        crate::cycle::Tensor {
            identity: crate::cycle::Identity::Transient { ordinal: i, bytes },
            bytes,
            accesses,
            alloc_at: Some(alloc),
            free_at: Some(free),
            source: i,
        }
    }

    #[test]
    fn lru_in_shim_pages_allocates_ahead_of_the_previous_incarnations_free() {
        // Budget of two pages. Tensor 0 (a page, ops 10 to 18) and tensor 1 (two pages, more
        // than half the budget: backed by host memory at its allocation, brought in at op 12,
        // freed at op 0 of the next iteration). The host runs iterations ahead and allocates
        // tensor 0 again while the previous one still holds it (its free at op 18 comes after
        // op 12): those frames must not be the ones op 12 needs for tensor 1, and tensor 1
        // cannot be allocated again before the compute stream has freed the previous one.
        // (The property test `plans_in_shim_pages_fit_with_their_tails_and_never_beat_the_bound`
        // found this deadlock.)
        let mut durations = vec![1000; 21];
        durations[7] = 1_065_642;
        durations[20] = 495_691;
        let tensors = vec![
            transient(0, 2 * MIB, vec![10], 10, 18),
            transient(1, 4 * MIB, vec![12], 12, 0),
        ];
        let cycle = Cycle::from_parts(&durations, tensors)
            .unwrap()
            .with_units(MoveUnits::ShimPages);
        let budget = Budget::new(4 * MIB);
        let r = simulate(
            &cycle,
            Policy::Lru,
            budget,
            &CostModel::default(),
            SimOptions::default(),
        )
        .expect("no deadlock");
        assert!(r.settled && r.fits, "{r:?}");
        // Tensor 1 comes in every iteration (4 MiB), tensor 0 makes room for it.
        assert_eq!(r.bytes_h2d, 4 * MIB, "{r:?}");
    }

    /// LRU in shim pages on `cycle` within `budget`: it must not deadlock, and settles within
    /// the budget.
    fn shim_lru(cycle: Cycle, budget: u64) -> SimReport {
        let cycle = cycle.with_units(MoveUnits::ShimPages);
        let cost = CostModel::default();
        let r = simulate(
            &cycle,
            Policy::Lru,
            Budget::new(budget),
            &cost,
            SimOptions::default(),
        )
        .expect("no deadlock");
        assert!(r.settled && r.fits && r.step_ns >= r.compute_ns, "{r:?}");
        r
    }

    #[test]
    fn lru_in_shim_pages_counts_no_frame_from_a_swap_out_its_op_cancels() {
        // The property test's seed on which 16e655a deadlocked at op 27 (kept in
        // tests/plan_invariants.proptest-regressions), durations rounded. Budget of four
        // pages. Tensor 1 (four pages, backed by host memory) is allocated before op 23,
        // used at 27 and 44, freed before op 1 of the next iteration; tensor 0 (a page)
        // allocated before op 42, used at op 10 of the next iteration, freed before op 33.
        // The host, ahead of the compute stream, issued op 44 counting on the frame of a page
        // of tensor 1 on its way out, which op 44 itself needs (its swap-out was cancelled):
        // one read-back had no frame. The compute stream at op 44 took tensor 0's page, which
        // op 61 (issued) needs, at op 61 a page of tensor 1 that op 78 needs, and at op 78 the
        // frames left were held by tensor 0's next incarnation, allocated ahead of its free.
        let mut durations = vec![1000; 51];
        durations[1] = 1_000_000;
        durations[26] = 100_000;
        let tensors = vec![
            transient(0, 2 * MIB, vec![10], 42, 33),
            transient(1, 8 * MIB, vec![27, 44], 23, 1),
        ];
        let r = shim_lru(Cycle::from_parts(&durations, tensors).unwrap(), 8 * MIB);
        // Tensor 1 comes in every iteration (it is allocated on the host), and tensor 0 and a
        // page of tensor 1 make room for each other.
        assert_eq!((r.bytes_h2d, r.bytes_d2h), (12 * MIB, 14 * MIB), "{r:?}");
        // Of the 14 MiB written out, two pages' swap-outs were cancelled by the ops that needed
        // them (op 44's page of tensor 1 among them): copied, and for nothing.
        assert_eq!(r.bytes_cancelled, 4 * MIB, "{r:?}");
    }

    #[test]
    fn lru_in_shim_pages_issues_no_op_whose_cancelled_swap_out_a_read_back_waits_for() {
        // Found by a stress run of random cycles after the fix above. Budget of five pages.
        // Op 4 needs tensor 0 (four pages, on the host) and tensor 3 (a page); op 5 tensors 0
        // and 2 (a page). The host issued op 4 with the frame of tensor 2's page, on its way
        // out, for tensor 0's read-backs, then op 5, which needs no new frame but cancelled
        // that swap-out. The compute stream at op 4 took that page back, and at op 5 the
        // frames left were held by tensor 2's next incarnation, allocated ahead of its free.
        let tensors = vec![
            transient(0, 8 * MIB, vec![4, 5], 3, 7),
            transient(1, 6 * MIB, vec![0], 0, 1),
            transient(2, 2 * MIB, vec![5], 11, 10),
            transient(3, 2 * MIB, vec![4], 4, 5),
        ];
        shim_lru(Cycle::from_parts(&[1000; 12], tensors).unwrap(), 10 * MIB);
    }

    #[test]
    fn lru_in_shim_pages_allocates_no_third_incarnation_ahead() {
        // Found by the same stress run. Budget of ten pages; two transients whose lifetimes
        // wrap. While op 17 computes, the host runs iterations ahead: it allocates each
        // tensor's next incarnation ahead of the previous one's free, then comes to the
        // allocation of the one after, which the model cannot hold (one place and one backed
        // allocation per tensor). Skipping it left tensor 1 absent when the compute stream
        // got to op 31 of the third iteration, with no allocation to wait for.
        let mut durations = vec![1000; 56];
        durations[17] = 345_641;
        let tensors = vec![
            transient(0, 8 * MIB, vec![52], 52, 34),
            transient(1, 6 * MIB, vec![31], 31, 18),
        ];
        shim_lru(Cycle::from_parts(&durations, tensors).unwrap(), 20 * MIB);
    }

    #[test]
    fn lru_in_shim_pages_counts_a_page_queued_twice_for_the_host_once() {
        // Found by the property test `lru_in_shim_pages_never_deadlocks` with the on-demand
        // eviction of an issued op's page made to fail. Budget of ten pages. Tensor 3's
        // pages, whose swap-outs had been cancelled and made again, were each queued twice
        // to go out, and counted twice as frames coming free: the host issued op 34's
        // read-backs of tensor 1 (19 MiB, allocated on the host) and then op 39 (op 2 of the
        // next iteration), which takes tensor 3's pages back; the compute stream at op 34
        // took them (31.5 MiB in and 32 out per iteration). What comes in now is tensor 1,
        // tensor 3 and tensor 2 at their first uses, once each.
        let tensors = vec![
            transient(0, 10 * MIB, vec![32, 33], 31, 34),
            transient(1, 19 * MIB, vec![34], 34, 35),
            transient(2, MIB, vec![20], 32, 25),
            transient(3, 10 * MIB, vec![32, 2], 30, 14),
        ];
        let r = shim_lru(Cycle::from_parts(&[1000; 37], tensors).unwrap(), 20 * MIB);
        assert_eq!((r.bytes_h2d, r.bytes_d2h), (30 * MIB, 23 * MIB), "{r:?}");
    }

    #[test]
    fn a_tensor_whose_accesses_wrap_starts_on_the_device_once() {
        // Tensor 3 of the rotation is accessed at op 3, then op 0 (lifetime order). All four
        // fit in 300 MiB: nothing moves. Its gap from op 0 to op 3 was listed as from 4 to 7
        // (`Liveness::of` did not fold it into the cycle), so the simulator placed it twice at
        // the start, counted 64 MiB that no tensor held, and LRU moved 256 MiB each way.
        let cost = CostModel::default();
        let budget = Budget::new(300 * MIB);
        let cycle = rotation();
        let p = plan(&cycle, &budget, &cost).unwrap();
        for policy in [Policy::Lru, Policy::Plan(&p)] {
            let r = simulate(&cycle, policy, budget, &cost, SimOptions::default()).unwrap();
            assert_eq!(r.step_ns, cycle.compute_ns(), "{}", policy.name());
            assert_eq!((r.bytes_h2d, r.bytes_d2h), (0, 0), "{}", policy.name());
            assert_eq!(r.peak_resident_bytes, 256 * MIB, "{}", policy.name());
        }
    }

    #[test]
    fn the_report_is_the_average_over_the_repeating_cycle_of_states() {
        let cycle = rotation();
        let budget = Budget::new(200 * MIB);
        let cost = CostModel::default();
        for policy in [
            Policy::Lru,
            Policy::Plan(&plan(&cycle, &budget, &cost).unwrap()),
        ] {
            let r = simulate(&cycle, policy, budget, &cost, SimOptions::default()).unwrap();
            assert!(r.settled, "{} did not settle: {r:?}", policy.name());
            let from = r.settled_after as usize;
            let to = from + r.steady_iterations as usize;
            assert_eq!(r.step_ns_per_cycle.len(), to, "stops at the first repeat");
            let avg = r.step_ns_per_cycle[from..to].iter().sum::<u64>() as f64
                / r.steady_iterations as f64;
            assert!((r.step_ns as f64 - avg).abs() <= 1.0, "{r:?}");
            assert!(r.step_ns > cycle.compute_ns(), "rotation must stall: {r:?}");
        }
    }

    fn eviction(piece: u32, out_after: u32, fetch: u32, gap: (u32, u32), period: u32) -> Eviction {
        Eviction {
            piece,
            out_after,
            fetch_at: fetch % period,
            needed_by: gap.1 % period,
            gap_from: gap.0,
            fetch_unrolled: fetch,
            gap_to: gap.1,
        }
    }

    fn whole_plan(cycle: &Cycle, evictions: Vec<Eviction>) -> SwapPlan {
        SwapPlan {
            period: cycle.len() as u32,
            budget_bytes: 0,
            evictions,
            host_resident: Vec::new(),
            tail_outs: Vec::new(),
            pieces: crate::pieces::whole(cycle),
        }
    }

    #[test]
    fn a_plan_alternating_between_two_steps_is_reported_at_its_average() {
        // Found by a random search over plans: two round trips in one gap of tensor 0. Its
        // iterations run 95.065 (idealised start), 109.789, 109.789, then 108.173 and 109.789
        // alternately. Iteration 3 alone (what was reported before) says 109.789 µs.
        let cycle = Cycle::from_parts(
            &[48_000, 28_000],
            vec![
                persistent(0, MIB, vec![0]),
                persistent(1, 2 * MIB, vec![0, 1]),
                persistent(2, 2 * MIB, vec![1]),
            ],
        )
        .unwrap();
        let plan = whole_plan(
            &cycle,
            vec![
                eviction(0, 1, 2, (0, 2), 2),
                eviction(0, 0, 1, (0, 2), 2),
                eviction(2, 1, 2, (1, 3), 2),
            ],
        );
        let r = simulate(
            &cycle,
            Policy::Plan(&plan),
            Budget::new(5 * MIB),
            &CostModel::default(),
            SimOptions::default(),
        )
        .unwrap();
        assert_eq!(r.step_ns_per_cycle, vec![95_065, 109_789, 109_789, 108_173]);
        assert!(r.settled);
        assert_eq!((r.settled_after, r.steady_iterations), (2, 2));
        assert_eq!(r.step_ns, 108_981);
    }

    #[test]
    fn a_plan_whose_state_keeps_changing_is_reported_as_not_settled() {
        // Also found by random search: two round trips per gap, so read-backs are queued for
        // pieces already on their way, and the read-back queue grows by an entry every
        // iteration. The step is steady, the state never repeats.
        let cycle = Cycle::from_parts(
            &[48_000, 22_000],
            vec![
                persistent(0, 2 * MIB, vec![0]),
                persistent(1, 2 * MIB, vec![1]),
            ],
        )
        .unwrap();
        let plan = whole_plan(
            &cycle,
            vec![
                eviction(0, 0, 2, (0, 2), 2),
                eviction(0, 0, 1, (0, 2), 2),
                eviction(1, 1, 3, (1, 3), 2),
                eviction(1, 1, 2, (1, 3), 2),
            ],
        );
        let r = simulate(
            &cycle,
            Policy::Plan(&plan),
            Budget::new(3 * MIB),
            &CostModel::default(),
            SimOptions::default(),
        )
        .unwrap();
        assert!(!r.settled, "{r:?}");
        assert_eq!(r.step_ns_per_cycle.len(), DEFAULT_MAX_CYCLES as usize);
        assert_eq!(
            (r.settled_after, r.steady_iterations),
            (DEFAULT_MAX_CYCLES / 2, DEFAULT_MAX_CYCLES / 2)
        );
        assert_eq!(r.step_ns, 222_520);
    }

    #[test]
    fn the_recorded_waits_add_up_to_the_stall_and_name_tensors_of_the_op() {
        // 64 MiB copies take about 1.2 ms against ops of 100 us: the rotation must wait.
        let cycle = rotation();
        let budget = Budget::new(200 * MIB);
        let cost = CostModel::default();
        let p = plan(&cycle, &budget, &cost).unwrap();
        let options = SimOptions {
            record_waits: true,
            ..SimOptions::default()
        };
        let r = simulate(&cycle, Policy::Plan(&p), budget, &cost, options).unwrap();
        let cut = crate::pieces::split(&cycle, &p.pieces).unwrap();
        assert_eq!(r.steady_iterations, 1);
        assert!(r.stall_ns > 0, "{r:?}");
        let waited: u64 = r.waits.iter().map(|w| w.waited_ns).sum();
        // Each wait is rounded to the nanosecond on its own.
        assert!(waited.abs_diff(r.stall_ns) <= r.waits.len() as u64, "{r:?}");
        for w in &r.waits {
            assert!(!w.tensors.is_empty(), "{w:?}");
            for t in &w.tensors {
                assert!(cut.ops[w.op as usize].tensors.contains(t), "{w:?}");
            }
        }
        let without = simulate(
            &cycle,
            Policy::Plan(&p),
            budget,
            &cost,
            SimOptions::default(),
        );
        assert!(without.unwrap().waits.is_empty());
    }

    #[test]
    fn a_plan_slower_than_the_limit_is_abandoned_and_one_within_it_is_not() {
        // At 150 MiB the plan's first iteration (from the idealised start) is not its steady
        // one, so there is an iteration after the first to abandon.
        let cycle = rotation();
        let budget = Budget::new(150 * MIB);
        let cost = CostModel::default();
        let p = plan(&cycle, &budget, &cost).unwrap();
        let full = simulate(
            &cycle,
            Policy::Plan(&p),
            budget,
            &cost,
            SimOptions::default(),
        )
        .unwrap();
        let at = |limit: u64| {
            let options = SimOptions {
                abandon_above_ns: Some(limit),
                ..SimOptions::default()
            };
            simulate(&cycle, Policy::Plan(&p), budget, &cost, options)
        };
        // (+1: the per-iteration figures are rounded to the nanosecond.)
        let longest = full.step_ns_per_cycle[1..].iter().max().copied().unwrap() + 1;
        assert_eq!(at(longest).unwrap(), full);
        assert_eq!(
            at(full.step_ns / 2).unwrap_err(),
            SimError::Abandoned {
                limit_ns: full.step_ns / 2
            }
        );
    }

    /// Page-sized tensors `first..first + n`, each accessed by op `op` alone.
    fn pages_at(first: u32, n: u32, op: u32) -> Vec<crate::cycle::Tensor> {
        (first..first + n)
            .map(|t| persistent(t, 2 * MIB, vec![op]))
            .collect()
    }

    /// Remaps slower than a page's copy at 55 GB/s (38.1 µs).
    const REMAP: crate::cost::PageRemapCost = crate::cost::PageRemapCost {
        page_bytes: 2 * MIB,
        in_ns: 50_000,
        out_ns: 60_000,
    };

    fn step_under(cycle: &Cycle, plan: &SwapPlan, budget: u64, cost: CostModel) -> u64 {
        let r = simulate(
            cycle,
            Policy::Plan(plan),
            Budget::new(budget),
            &cost,
            SimOptions::default(),
        )
        .unwrap();
        assert!(r.settled, "{r:?}");
        r.step_ns
    }

    #[test]
    fn a_page_moved_with_its_remap_after_the_copy_arrives_no_sooner_than_with_both_in_turn() {
        // One page's room: after each op its page leaves and the other's comes in, nothing to
        // overlap. Remapped beside the copies or after them, every move takes its copy and
        // then its remap.
        let mut tensors = pages_at(0, 1, 0);
        tensors.extend(pages_at(1, 1, 1));
        let cycle = Cycle::from_parts(&[1_000_000, 1_000_000], tensors).unwrap();
        let plan = whole_plan(
            &cycle,
            vec![eviction(0, 0, 1, (0, 2), 2), eviction(1, 1, 2, (1, 3), 2)],
        );
        let copies = CostModel::default();
        let copy = copies.h2d_ns(2 * MIB) as f64;
        let alone = step_under(&cycle, &plan, 2 * MIB, copies) as f64;
        assert!((alone - (2e6 + 4.0 * copy)).abs() <= 4.0, "{alone}");
        let serial = step_under(
            &cycle,
            &plan,
            2 * MIB,
            copies.with_page_remaps(REMAP).folded(),
        ) as f64;
        let beside = step_under(&cycle, &plan, 2 * MIB, copies.with_page_remaps(REMAP)) as f64;
        let expected = 2e6 + 4.0 * copy + 2.0 * (50_000.0 + 60_000.0);
        assert!(
            (serial - expected).abs() <= 4.0,
            "{serial} against {expected}"
        );
        assert!(
            (beside - expected).abs() <= 4.0,
            "{beside} against {expected}"
        );
        // The planner's one-move latency counts the remap too.
        assert_eq!(
            copies.with_page_remaps(REMAP).h2d_ns(2 * MIB),
            copies.h2d_ns(2 * MIB) + 50_000
        );
    }

    #[test]
    fn remaps_beside_the_copies_hold_each_direction_to_the_slower_of_the_two() {
        // Sixteen pages in use at op 0, sixteen others at op 1, room for sixteen: after each
        // op its pages leave and the others come in as frames come free.
        let mut tensors = pages_at(0, 16, 0);
        tensors.extend(pages_at(16, 16, 1));
        let cycle = Cycle::from_parts(&[100_000, 100_000], tensors).unwrap();
        let mut evictions: Vec<Eviction> = (0..16)
            .map(|t| eviction(t, 0, 1, (0, 2), 2))
            .chain((16..32).map(|t| eviction(t, 1, 2, (1, 3), 2)))
            .collect();
        evictions.sort_by_key(|e| (e.out_after, e.piece));
        let plan = whole_plan(&cycle, evictions);
        let copies = CostModel::default();
        let budget = 32 * MIB;
        let alone = step_under(&cycle, &plan, budget, copies);
        let serial = step_under(
            &cycle,
            &plan,
            budget,
            copies.with_page_remaps(REMAP).folded(),
        );
        let beside = step_under(&cycle, &plan, budget, copies.with_page_remaps(REMAP));
        // Each phase's write-outs are remapped one after another on one thread: 16 x 60 µs
        // at least, twice a step; copied and remapped in turn they take 16 x 98.1 µs.
        assert!(beside >= 200_000 + 2 * 16 * 60_000, "{beside}");
        assert!(alone < beside, "{alone} {beside}");
        assert!(
            (beside as f64) < 0.8 * serial as f64,
            "pipelined {beside} against serial {serial}"
        );
        // The bound's sustained rates: each direction at the slower of copy and remap.
        let sustained = copies.with_page_remaps(REMAP).sustained();
        let per_page = |gbps: f64| (2 * MIB) as f64 / gbps;
        assert!((per_page(sustained.h2d_gbps) - 50_000.0).abs() < 1.0);
        assert!((per_page(sustained.d2h_gbps) - 60_000.0).abs() < 1.0);
        assert!((2.0 * per_page(sustained.bidir_gbps) - 60_000.0).abs() < 1.0);
        assert_eq!(sustained.remaps, None);
    }
}
