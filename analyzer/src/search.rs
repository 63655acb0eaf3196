//! Local search after the planner: small changes to a plan, each priced by the simulator.
//!
//! [`crate::plan::plan`] decides at op granularity from estimates of when copies finish; the
//! simulator knows exactly. This pass closes part of the gap between the two: it mutates a plan
//! (issue a read-back earlier or later, write a piece out later, drop a round trip) and keeps a
//! mutation when the simulated steady-state step (see [`crate::sim`]) gets shorter. Half the
//! changes are aimed at where the current plan waits, which the simulator reports op by op: on
//! the MLP trace at 75% of its peak only a handful of its 225 ops wait, and a change far from
//! them rarely helps. A mutation
//! the simulator refuses (over the budget, a deadlock) or that makes a plan fetch on demand is
//! rejected. It never returns a plan slower than the one it was given; given one the simulator
//! refuses, it returns the first that runs, if it finds one.
//!
//! Under [`crate::cycle::MoveUnits::ShimPages`] it also adds, drops and postpones tail
//! write-outs ([`crate::plan::TailOut`]), and makes room for an op that waited for memory by
//! writing out a tail across it.
//!
//! Where the cycle stays small with pieces of [`FINE_PIECE_PAGES`] (at most [`MAX_FINE_PIECES`]),
//! a search that stops gaining goes on with its best plan cut into such pieces
//! ([`SwapPlan::refined`]) instead of stopping; the plan it returns may then move finer pieces
//! than the one it was given.
//!
//! It is not a planner of its own (it starts from a plan) and has no model of its own: whatever
//! the simulator says is what it optimises. Deterministic for a seed and a number of evaluations;
//! a wall-clock budget stops it earlier, so with a time limit the result depends on the machine.

use std::time::{Duration, Instant};

use crate::cost::{Budget, CostModel};
use crate::cycle::{Cycle, TensorId};
use crate::pieces;
use crate::plan::{Eviction, SwapPlan, TailOut};
use crate::sim::{simulate_with, OpWait, Policy, SimOptions};
use crate::timeline::{Gap, Liveness};

/// Limits and seed of a search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchOptions {
    /// Wall-clock time the search may take (it stops at the first evaluation past it).
    pub time_limit: Duration,
    /// Stop earlier once the search has gone this long, and at least twice as long as it took
    /// to find its last gain, without a shorter step (`None`: run to the limits). A search that
    /// keeps finding runs on; one that finds nothing (a plan already at or near its bound)
    /// stops after `patience`.
    pub patience: Option<Duration>,
    /// Most plans it simulates (the deterministic limit).
    pub max_evaluations: u32,
    /// Seed of the mutation choices.
    pub seed: u64,
    /// A lower bound on the step (see [`crate::bound`]), 0 if none is known: the search stops
    /// once its plan is within a thousandth of it. It stops at the compute time in any case.
    pub floor_ns: u64,
}

/// A candidate is abandoned once one of its iterations (after the first) is longer than the best
/// step so far by more than 1/this: a plan that alternates between step lengths can have one
/// iteration above its average, and the slack keeps such plans in play.
const ABANDON_SLACK_DIVISOR: u64 = 10;

/// Default wall-clock limit of `tensile replay`'s search.
pub const DEFAULT_SEARCH_MS: u64 = 300;

/// Default [`SearchOptions::patience`], chosen so that default planning stays under 100 ms on
/// the ResNet-50 and transformer traces, where the search finds little (docs/replay-results.md).
pub const DEFAULT_PATIENCE_MS: u64 = 30;

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            time_limit: Duration::from_millis(DEFAULT_SEARCH_MS),
            patience: Some(Duration::from_millis(DEFAULT_PATIENCE_MS)),
            max_evaluations: u32::MAX,
            seed: 1,
            floor_ns: 0,
        }
    }
}

/// What a search did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchReport {
    /// Steady-state step of the plan it started from (`None` if the simulator refused it).
    pub start_step_ns: Option<u64>,
    /// Steady-state step of the plan it returns (`None`: no plan the simulator accepts was found,
    /// and the given one is returned).
    pub step_ns: Option<u64>,
    /// Plans simulated.
    pub evaluations: u32,
    /// Mutations kept.
    pub accepted: u32,
    /// Wall-clock time spent.
    pub elapsed_ms: u64,
}

/// A small deterministic generator (xorshift64*): mutation choices only, no statistics.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Improves `plan` for `cycle` and `budget` by local search within `options`' limits; returns
/// the best plan found (the given one if nothing beat it) and what the search did.
pub fn improve(
    cycle: &Cycle,
    plan: &SwapPlan,
    budget: Budget,
    cost: &CostModel,
    options: &SearchOptions,
) -> (SwapPlan, SearchReport) {
    let started = Instant::now();
    let mut report = SearchReport {
        start_step_ns: None,
        step_ns: None,
        evaluations: 0,
        accepted: 0,
        elapsed_ms: 0,
    };
    let mut rng = Rng::new(options.seed);
    let mut stage = Stage {
        cycle,
        budget,
        cost,
        options,
        started,
        report: &mut report,
        rng: &mut rng,
    };
    // A search that stops gaining goes on with the plan's pieces cut finer, where that keeps
    // the cycle small (see `MAX_FINE_PIECES`): smaller copies hold less memory in flight and
    // queue less behind one another, moves a search on coarse pieces cannot make.
    let fine_bytes = fine_piece_bytes(cycle);
    let fine_pieces = pieces::refine(&plan.pieces, fine_bytes).0.len();
    let refinable = fine_pieces > plan.pieces.len() && fine_pieces <= MAX_FINE_PIECES;
    let (mut best_plan, mut best, stale) = stage.run(plan, refinable);
    if stale && refinable {
        let fine = best_plan.refined(fine_bytes);
        let (fine_plan, fine_best, _) = stage.run(&fine, false);
        if fine_best.is_some_and(|f| best.is_none_or(|b| f < b)) {
            best_plan = fine_plan;
            best = fine_best;
        }
    }
    report.step_ns = best;
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    (best_plan, report)
}

/// Size, in the cycle's pages, that the search cuts a plan's pieces to once its search on them
/// stops gaining (4 MiB on the H100).
pub const FINE_PIECE_PAGES: u64 = 2;

/// [`FINE_PIECE_PAGES`] in bytes for `cycle`'s page.
pub fn fine_piece_bytes(cycle: &Cycle) -> u64 {
    FINE_PIECE_PAGES * cycle.page_bytes
}

/// The search cuts pieces finer only if the cycle then has at most this many pieces: a
/// simulation costs more the more pieces an op touches, and a search that tries few plans
/// gains little (the MLP trace at 4 MiB has 1,488 pieces; ResNet-50 and the transformer have
/// 2,577 and 3,011 at their default 16 MiB, and are left alone).
pub const MAX_FINE_PIECES: usize = 2048;

/// A search on coarse pieces counts as stale, and goes on with finer ones, once it has
/// simulated this many plans, and as many as it took to find its last gain, without a shorter
/// step (or once its patience runs out).
const STALE_EVALUATIONS: u32 = 200;

/// What every stage of [`improve`] shares.
struct Stage<'a> {
    cycle: &'a Cycle,
    budget: Budget,
    cost: &'a CostModel,
    options: &'a SearchOptions,
    started: Instant,
    report: &'a mut SearchReport,
    rng: &'a mut Rng,
}

impl Stage<'_> {
    /// Searches from `plan` on its pieces until a limit of the options; returns the best plan
    /// (on `plan`'s pieces), its step, and whether the stage stopped because it stopped
    /// gaining (its patience, or, when `coarse`, [`STALE_EVALUATIONS`]) rather than at a limit
    /// or the floor. `coarse`: a finer stage may follow, so the stage ends once stale. The
    /// report counts across stages; its start step is the first stage's.
    fn run(&mut self, plan: &SwapPlan, coarse: bool) -> (SwapPlan, Option<u64>, bool) {
        let (cycle, budget, cost, options) = (self.cycle, self.budget, self.cost, self.options);
        let started = self.started;
        let stage_start = started.elapsed();
        let rng = &mut *self.rng;
        let report = &mut *self.report;
        // Search on the cycle cut into the plan's pieces, so each simulation need not cut it
        // again.
        let split;
        let (work_cycle, mut current) = if pieces::is_whole(cycle, &plan.pieces) {
            (cycle, plan.clone())
        } else {
            match pieces::split(cycle, &plan.pieces) {
                Ok(s) => split = s,
                Err(_) => return (plan.clone(), None, false),
            }
            let mut p = plan.clone();
            p.pieces = pieces::whole(&split);
            (&split, p)
        };
        let live = Liveness::of(work_cycle);
        // The tensor each of the work cycle's pieces was cut from.
        let tensor_of: Vec<TensorId> = plan.pieces.iter().map(|p| p.tensor).collect();
        // Plans no faster than the best so far are abandoned as soon as that shows.
        let price = |p: &SwapPlan, best: Option<u64>| -> Option<(u64, Vec<OpWait>)> {
            let options = SimOptions {
                record_waits: true,
                abandon_above_ns: best.map(|b| b + b / ABANDON_SLACK_DIVISOR),
                ..SimOptions::default()
            };
            match simulate_with(
                work_cycle,
                Some(&live),
                Policy::Plan(p),
                budget,
                cost,
                options,
            ) {
                Ok(r) if r.demand_fetches == 0 && r.settled => Some((r.step_ns, r.waits)),
                _ => None,
            }
        };
        // A start the simulator refuses (the planner's estimates can deadlock a tight budget)
        // is searched from too: the first mutation that runs is an improvement.
        let (mut best, mut waits) = match price(&current, None) {
            Some((step, waits)) => (Some(step), waits),
            None => (None, Vec::new()),
        };
        if report.evaluations == 0 {
            report.start_step_ns = best;
        }
        report.evaluations += 1;
        let period = current.period;
        // Gaps of movable tensors with some op inside, which a move can use.
        let usable = |gaps: &[Gap]| -> Vec<Gap> {
            gaps.iter()
                .copied()
                .filter(|g| g.to > g.from + 1 && work_cycle.is_movable(g.tensor))
                .collect()
        };
        let gaps = usable(&live.gaps);
        // Tails (shim pages only) that a write-out can shorten.
        let tails = usable(&live.tails);
        // Since the stage started: the time and the plans until its last gain.
        let mut last_gain_at = Duration::ZERO;
        let first_evaluation = report.evaluations;
        let mut last_gain_evaluations = 0;
        // A plan at the bound cannot be beaten; one that never waits runs at the compute time.
        let floor_ns = work_cycle
            .compute_ns()
            .max(options.floor_ns + options.floor_ns / 1000);
        let mut stale = false;
        while report.evaluations < options.max_evaluations
            && started.elapsed() < options.time_limit
            && (!current.evictions.is_empty() || !gaps.is_empty() || !tails.is_empty())
            && best.is_none_or(|b| b > floor_ns)
        {
            let quiet = started.elapsed() - stage_start - last_gain_at;
            let quiet_evaluations = report.evaluations - first_evaluation - last_gain_evaluations;
            if options
                .patience
                .is_some_and(|p| quiet >= p.max(2 * last_gain_at))
                || (coarse && quiet_evaluations >= STALE_EVALUATIONS.max(last_gain_evaluations))
            {
                stale = true;
                break;
            }
            let mut candidate = current.clone();
            // One to three mutations at once: some improvements need two round trips to move
            // together (one makes room that the other uses).
            let count = 1 + rng.below(3);
            let mut changed = false;
            // Half the time, aim at where the current plan waits: most of a plan's ops never
            // wait, and a change far from every wait rarely shortens the step.
            if !waits.is_empty() && rng.below(2) == 0 {
                changed = aim(
                    &mut candidate,
                    &waits,
                    &gaps,
                    &tails,
                    work_cycle,
                    &tensor_of,
                    rng,
                );
            }
            for _ in 0..count {
                if changed && rng.below(2) == 0 {
                    break;
                }
                // (No draw without tails: plans in bytes search exactly as before.)
                if !tails.is_empty() && rng.below(4) == 0 {
                    changed |= mutate_tail(&mut candidate.tail_outs, &tails, period, rng);
                } else if candidate.evictions.is_empty() || rng.below(6) == 0 {
                    changed |= add_round_trip(&mut candidate.evictions, &gaps, period, rng);
                } else {
                    let i = rng.below(candidate.evictions.len() as u64) as usize;
                    changed |= mutate(&mut candidate.evictions, i, period, rng);
                }
            }
            if !changed {
                continue;
            }
            // The plan's order (by the op after which a piece leaves) is also the order in
            // which read-backs issued at one op queue up, so it is part of what is priced.
            candidate.evictions.sort_by_key(|e| (e.out_after, e.piece));
            candidate.tail_outs.sort_by_key(|t| (t.out_after, t.piece));
            report.evaluations += 1;
            if let Some((step, new_waits)) = price(&candidate, best) {
                // Equal steps are accepted too, so the search can cross plateaus.
                if best.is_none_or(|b| step <= b) {
                    if best.is_none_or(|b| step < b) {
                        report.accepted += 1;
                        last_gain_at = started.elapsed() - stage_start;
                        last_gain_evaluations = report.evaluations - first_evaluation;
                    }
                    best = Some(step);
                    current = candidate;
                    waits = new_waits;
                }
            }
        }
        current.pieces = plan.pieces.clone();
        (current, best, stale)
    }
}

/// Applies one change aimed at a wait of the current plan (the simulator's [`OpWait`]s), chosen
/// in proportion to how long it waited. For a piece that arrived late: issue its read-back
/// earlier (and, as often as not, make room for that by sending out another piece that is idle
/// across the stretch), postpone past the wait a read-back that queues ahead of it and is needed
/// later, or drop its round trip. For an op that waited for memory alone: make room across it
/// (with tails, half the time by writing one out). False if nothing applied.
fn aim(
    plan: &mut SwapPlan,
    waits: &[OpWait],
    gaps: &[Gap],
    tails: &[Gap],
    cycle: &Cycle,
    tensor_of: &[TensorId],
    rng: &mut Rng,
) -> bool {
    let period = plan.period;
    let total: u64 = waits.iter().map(|w| w.waited_ns.max(1)).sum();
    let mut pick = rng.below(total);
    let wait = waits
        .iter()
        .find(|w| {
            let weight = w.waited_ns.max(1);
            if pick < weight {
                true
            } else {
                pick -= weight;
                false
            }
        })
        .unwrap_or(&waits[0]);
    // The round trips of the pieces it waited for that end at this op, in the order of
    // `wait.tensors` (the op's order).
    let mut ending: Vec<(TensorId, usize)> = plan
        .evictions
        .iter()
        .enumerate()
        .filter(|(_, e)| e.gap_to % period == wait.op)
        .map(|(i, e)| (e.piece, i))
        .collect();
    ending.sort_unstable();
    let late: Vec<usize> = wait
        .tensors
        .iter()
        .filter_map(|&t| {
            let k = ending.partition_point(|&(p, _)| p < t);
            ending.get(k).filter(|&&(p, _)| p == t).map(|&(_, i)| i)
        })
        .collect();
    let op_tensors = &cycle.ops[wait.op as usize].tensors;
    if late.is_empty() {
        // Waited for memory to hold what it creates: free some across it.
        if !tails.is_empty() && rng.below(2) == 0 {
            return write_out_tail_across(&mut plan.tail_outs, tails, wait.op, period, rng);
        }
        if rng.below(2) == 0 {
            return postpone_past(&mut plan.evictions, tensor_of, wait.op, period, rng);
        }
        return make_room(
            &mut plan.evictions,
            gaps,
            op_tensors,
            wait.op,
            wait.op,
            period,
            rng,
        );
    }
    let evictions = &mut plan.evictions;
    let i = late[rng.below(late.len() as u64) as usize];
    let e = evictions[i];
    match rng.below(6) {
        // Drop the round trip: keep the piece through its gap.
        0 => {
            evictions.remove(i);
            true
        }
        // Postpone past the wait a read-back issued from a little before this one and needed
        // after the wait: it queues ahead of this one on the copy engine and holds memory.
        1 => {
            let dist = |a: u32, b: u32| (b + period - a) % period;
            let window = (e.fetch_at + period - 16.min(period - 1)) % period;
            let rivals: Vec<(usize, u32, u32)> = evictions
                .iter()
                .enumerate()
                .filter(|&(j, r)| j != i && dist(window, r.fetch_at) <= dist(window, wait.op))
                .map(|(j, r)| (j, dist(r.fetch_at, wait.op), r.gap_to - r.fetch_unrolled))
                .filter(|&(_, to_op, to_need)| to_need > to_op)
                .collect();
            if rivals.is_empty() {
                return false;
            }
            let (j, to_op, to_need) = rivals[rng.below(rivals.len() as u64) as usize];
            let later = to_op + 1 + rng.below(u64::from(to_need - to_op)) as u32;
            let fetch = evictions[j].fetch_unrolled + later;
            set_fetch(&mut evictions[j], fetch, period);
            true
        }
        // Issue the read-back earlier, and make room for it over the stretch it now spans.
        _ => {
            let out = out_unrolled(&e, period);
            let reach = [4, 16, 64][rng.below(3) as usize];
            let step = 1 + rng.below(reach) as u32;
            let fetch = e.fetch_unrolled.saturating_sub(step).max(out + 1);
            if fetch == e.fetch_unrolled {
                return false;
            }
            set_fetch(&mut evictions[i], fetch, period);
            if rng.below(2) == 0 {
                make_room(
                    evictions,
                    gaps,
                    op_tensors,
                    fetch % period,
                    wait.op,
                    period,
                    rng,
                );
            }
            true
        }
    }
}

/// Postpones past op `op` (a position in the cycle, where the plan waited for memory) the
/// read-back of a tensor's pieces that are back on the device there but needed only later.
/// While an op waits for memory, every byte on the device that it does not need delays it by
/// that byte's copy out, and a read-back issued long before its use holds its memory through
/// every wait in between (the MLP at 50%: a 32 MiB tensor read back at op 123 for op 6 of the
/// next iteration, through a 13 ms wait at op 145). The piece is, half the time, the one needed
/// last, else the one needed last of three drawn; its read-back and those of the other pieces
/// of its tensor back early for the same use move together, half the time to just after the
/// last read-back issued after the wait and needed before them (so that they queue behind
/// every copy needed sooner), else to a random op after the wait, up to their use.
fn postpone_past(
    evictions: &mut [Eviction],
    tensor_of: &[TensorId],
    op: u32,
    period: u32,
    rng: &mut Rng,
) -> bool {
    // (round trip, unrolled position of `op` between its read-back and its use)
    let back_early: Vec<(usize, u32)> = evictions
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            [op, op + period, op + 2 * period]
                .into_iter()
                .find(|&u| e.fetch_unrolled <= u && u + 1 < e.gap_to)
                .map(|u| (i, u))
        })
        .collect();
    let lead = |&(i, u): &(usize, u32)| evictions[i].gap_to - u;
    let chosen = if rng.below(2) == 0 {
        back_early.iter().copied().max_by_key(lead)
    } else {
        (0..3)
            .filter_map(|_| {
                let k = rng.below(back_early.len() as u64) as usize;
                back_early.get(k).copied()
            })
            .max_by_key(lead)
    };
    let Some((i, at)) = chosen else {
        return false;
    };
    let e = evictions[i];
    let fetch = if rng.below(2) == 0 {
        let latest_sooner = evictions
            .iter()
            .filter_map(|f| {
                // The instance of `f` whose use falls between the wait and this one's.
                let shift = [0, period, 2 * period]
                    .into_iter()
                    .find(|&k| at < f.gap_to + k && f.gap_to + k < e.gap_to)?;
                Some(f.fetch_unrolled + shift).filter(|&issued| issued > at)
            })
            .max()
            .unwrap_or(at);
        (latest_sooner + 1).min(e.gap_to)
    } else {
        at + 1 + rng.below(u64::from(e.gap_to - at)) as u32
    };
    let tensor = tensor_of[e.piece as usize];
    for &(j, u) in &back_early {
        let other = evictions[j];
        if tensor_of[other.piece as usize] == tensor
            && (other.gap_from, other.gap_to) == (e.gap_from, e.gap_to)
            && u == at
        {
            set_fetch(&mut evictions[j], fetch, period);
        }
    }
    true
}

/// Adds a round trip for a random gap, not evicted yet and of a piece `needed` does not hold,
/// that spans the ops from `first` to `last` (positions in the cycle, `first` at or before
/// `last` going forward, possibly across the iteration's end); its read-back is issued after
/// `last`, a random distance before its use.
fn make_room(
    evictions: &mut Vec<Eviction>,
    gaps: &[Gap],
    needed: &[TensorId],
    first: u32,
    last: u32,
    period: u32,
    rng: &mut Rng,
) -> bool {
    let span = (last + period - first) % period;
    // The gaps evicted already, by (piece, start), sorted for lookups.
    let mut evicted: Vec<(TensorId, u32)> =
        evictions.iter().map(|e| (e.piece, e.gap_from)).collect();
    evicted.sort_unstable();
    let spanning: Vec<(Gap, u32)> = gaps
        .iter()
        .filter(|g| !needed.contains(&g.tensor))
        .filter_map(|g| {
            // The unrolled position of `first` inside the gap, if the whole stretch is inside.
            [first, first + period]
                .into_iter()
                .find(|&u| g.from < u && u + span < g.to)
                .map(|u| (*g, u + span))
        })
        .filter(|(g, _)| evicted.binary_search(&(g.tensor, g.from)).is_err())
        .collect();
    if spanning.is_empty() {
        return false;
    }
    // The longest of a few random candidates: a long gap hides its two copies most easily.
    let (g, last_u) = (0..3)
        .map(|_| spanning[rng.below(spanning.len() as u64) as usize])
        .max_by_key(|(g, _)| g.to - g.from)
        .unwrap_or(spanning[0]);
    let room = u64::from(g.to - last_u);
    let back = rng.below(room.min(16)) as u32;
    evictions.push(round_trip(g, g.to - back, period));
    true
}

/// Writes out a random tail, not written out yet, that spans op `op` (a position in the
/// cycle), right after its last access. False if there is none.
fn write_out_tail_across(
    tail_outs: &mut Vec<TailOut>,
    tails: &[Gap],
    op: u32,
    period: u32,
    rng: &mut Rng,
) -> bool {
    let spanning: Vec<Gap> = tails
        .iter()
        .filter(|g| [op, op + period].iter().any(|&u| g.from < u && u < g.to))
        .filter(|g| !tail_outs.iter().any(|t| t.piece == g.tensor))
        .copied()
        .collect();
    if spanning.is_empty() {
        return false;
    }
    let g = spanning[rng.below(spanning.len() as u64) as usize];
    tail_outs.push(tail_out(g));
    true
}

/// The write-out of tail `g` right after its last access.
fn tail_out(g: Gap) -> TailOut {
    TailOut {
        piece: g.tensor,
        out_after: g.from,
        tail_from: g.from,
        freed_at: g.to,
    }
}

/// Adds the write-out of a random tail, or, if it has one, drops it or moves it later in the
/// tail (before the op that precedes the free: a copy out that late frees nothing).
fn mutate_tail(tail_outs: &mut Vec<TailOut>, tails: &[Gap], period: u32, rng: &mut Rng) -> bool {
    let g = tails[rng.below(tails.len() as u64) as usize];
    let Some(i) = tail_outs.iter().position(|t| t.piece == g.tensor) else {
        tail_outs.push(tail_out(g));
        return true;
    };
    if rng.below(2) == 0 {
        tail_outs.remove(i);
        return true;
    }
    let out = tail_outs[i].out_unrolled(period);
    let reach = [2, 16][rng.below(2) as usize];
    let step = 1 + rng.below(reach) as u32;
    let new_out = (out + step).min(g.to.saturating_sub(2));
    if new_out <= out {
        return false;
    }
    tail_outs[i].out_after = new_out % period;
    true
}

/// The round trip of gap `g`: written out after the access that opens it, read back at
/// unrolled position `fetch`.
fn round_trip(g: Gap, fetch: u32, period: u32) -> Eviction {
    Eviction {
        piece: g.tensor,
        out_after: g.from % period,
        fetch_at: fetch % period,
        needed_by: g.to % period,
        gap_from: g.from,
        fetch_unrolled: fetch,
        gap_to: g.to,
    }
}

/// Applies one random mutation to eviction `i`; false if the chosen one does not apply.
fn mutate(evictions: &mut Vec<Eviction>, i: usize, period: u32, rng: &mut Rng) -> bool {
    let e = evictions[i];
    // Mostly one or two ops, sometimes a longer jump.
    let reach = [2, 16, 64][rng.below(3) as usize];
    let step = 1 + rng.below(reach) as u32;
    match rng.below(5) {
        // Issue the read-back earlier (not before the write-out's op).
        0 | 1 => {
            let out = out_unrolled(&e, period);
            let fetch = e.fetch_unrolled.saturating_sub(step).max(out + 1);
            if fetch == e.fetch_unrolled {
                return false;
            }
            set_fetch(&mut evictions[i], fetch, period);
        }
        // Issue it later (at the latest at the op that needs it).
        2 => {
            let fetch = (e.fetch_unrolled + step).min(e.gap_to);
            if fetch == e.fetch_unrolled {
                return false;
            }
            set_fetch(&mut evictions[i], fetch, period);
        }
        // Write out later in the gap (within this iteration, before the read-back).
        3 => {
            let out = out_unrolled(&e, period);
            let latest = e.fetch_unrolled.saturating_sub(1).min(period - 1);
            let new_out = (out + step).min(latest);
            if new_out <= out {
                return false;
            }
            evictions[i].out_after = new_out;
        }
        // Drop the round trip (keep the piece on the device through its gap).
        _ => {
            evictions.remove(i);
        }
    }
    true
}

/// Adds a round trip for a random gap not evicted yet: written out after the access that opens
/// it, read back a random distance (mostly short) before the access that closes it.
fn add_round_trip(evictions: &mut Vec<Eviction>, gaps: &[Gap], period: u32, rng: &mut Rng) -> bool {
    if gaps.is_empty() {
        return false;
    }
    let g = gaps[rng.below(gaps.len() as u64) as usize];
    if evictions
        .iter()
        .any(|e| e.piece == g.tensor && e.gap_from == g.from)
    {
        return false;
    }
    let room = u64::from(g.to - g.from - 1);
    let reach = if rng.below(2) == 0 { 16 } else { room };
    let back = rng.below(room.min(reach)) as u32;
    evictions.push(round_trip(g, g.to - back, period));
    true
}

/// Unrolled position of the op after which `e` is written out (at or after the gap's start).
fn out_unrolled(e: &Eviction, period: u32) -> u32 {
    e.gap_from + (e.out_after + period - e.gap_from % period) % period
}

fn set_fetch(e: &mut Eviction, fetch_unrolled: u32, period: u32) {
    e.fetch_unrolled = fetch_unrolled;
    e.fetch_at = fetch_unrolled % period;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cycle::persistent_tensor as persistent;
    use crate::sim::simulate;

    const MIB: u64 = 1 << 20;

    /// Four 64 MiB tensors, each touched by two ops in a row of 1 ms, room for three.
    fn rotation() -> Cycle {
        let tensors = (0..4)
            .map(|i| {
                let mut accesses = vec![i, (i + 1) % 4];
                accesses.sort_unstable();
                persistent(i, 64 * MIB, accesses)
            })
            .collect();
        Cycle::from_parts(&[1_000_000; 4], tensors).unwrap()
    }

    /// Every tensor out after its second access and read back one op before its next: the
    /// read-back (about 1.2 ms) waits for the write-out before it and cannot hide behind one
    /// op, so the plan waits and the search has something to try.
    fn rotation_plan(cycle: &Cycle) -> SwapPlan {
        let evictions = Liveness::of(cycle)
            .gaps
            .iter()
            .filter(|g| g.to - g.from == 3)
            .map(|g| Eviction {
                piece: g.tensor,
                out_after: g.from % 4,
                fetch_at: (g.to - 1) % 4,
                needed_by: g.to % 4,
                gap_from: g.from,
                fetch_unrolled: g.to - 1,
                gap_to: g.to,
            })
            .collect();
        SwapPlan {
            period: 4,
            budget_bytes: 200 * MIB,
            evictions,
            host_resident: Vec::new(),
            tail_outs: Vec::new(),
            pieces: pieces::whole(cycle),
        }
    }

    fn search(options: SearchOptions) -> SearchReport {
        let cycle = rotation();
        let p = rotation_plan(&cycle);
        let (budget, cost) = (Budget::new(200 * MIB), CostModel::default());
        improve(&cycle, &p, budget, &cost, &options).1
    }

    #[test]
    fn a_read_back_postponed_past_a_wait_moves_with_its_tensor_and_behind_sooner_uses() {
        let period = 10;
        let trip = |piece, gap_from, fetch_unrolled, gap_to: u32| Eviction {
            piece,
            out_after: gap_from % period,
            fetch_at: fetch_unrolled % period,
            needed_by: gap_to % period,
            gap_from,
            fetch_unrolled,
            gap_to,
        };
        // Pieces 0 and 1 (tensor 0) are back at op 4 for op 8 of the next iteration; piece 2
        // is read back at op 6 for op 7; piece 3 is back at op 4 for op 9. Op 5 waits.
        let tensor_of = [0, 0, 1, 2];
        let start = vec![
            trip(0, 2, 4, 18),
            trip(1, 2, 4, 18),
            trip(2, 1, 6, 7),
            trip(3, 3, 4, 9),
        ];
        let mut behind_sooner_uses = false;
        for seed in 1..=64 {
            let mut evictions = start.clone();
            let mut rng = Rng::new(seed);
            assert!(postpone_past(
                &mut evictions,
                &tensor_of,
                5,
                period,
                &mut rng
            ));
            // Piece 2 was not back at the wait.
            assert_eq!(evictions[2], start[2]);
            let moved: Vec<usize> = (0..4).filter(|&i| evictions[i] != start[i]).collect();
            match moved.as_slice() {
                [0, 1] => {
                    let fetch = evictions[0].fetch_unrolled;
                    assert_eq!(evictions[1].fetch_unrolled, fetch);
                    assert!((6..=18).contains(&fetch), "{fetch}");
                    assert_eq!(evictions[0].fetch_at, fetch % period);
                    // Right after piece 2's read-back, issued after the wait for a sooner use.
                    behind_sooner_uses |= fetch == 7;
                }
                [3] => assert!((6..=9).contains(&evictions[3].fetch_unrolled)),
                other => panic!("seed {seed} moved {other:?}"),
            }
        }
        assert!(behind_sooner_uses);
    }

    #[test]
    fn a_search_stops_once_its_plan_reaches_the_floor() {
        let free = search(SearchOptions {
            max_evaluations: 200,
            patience: None,
            ..SearchOptions::default()
        });
        let start = free.start_step_ns.unwrap();
        assert!(start > rotation().compute_ns(), "{free:?}");
        assert_eq!(free.evaluations, 200);
        let at_floor = search(SearchOptions {
            max_evaluations: 200,
            patience: None,
            floor_ns: start,
            ..SearchOptions::default()
        });
        assert_eq!(at_floor.evaluations, 1);
        assert_eq!(at_floor.step_ns, Some(start));
    }

    #[test]
    fn a_refined_plan_makes_the_same_moves_in_smaller_pieces() {
        let cycle = rotation();
        let p = rotation_plan(&cycle);
        let fine = p.refined(16 * MIB);
        assert_eq!(fine.pieces.len(), 16);
        assert_eq!(fine.evictions.len(), 4 * p.evictions.len());
        assert_eq!(fine.bytes_out(), p.bytes_out());
        assert_eq!(pieces::check_cover(&cycle, &fine.pieces), Ok(()));
        // Each part leaves and returns where its piece did.
        for e in &fine.evictions {
            let whole = fine.pieces[e.piece as usize].tensor;
            let coarse = p.evictions.iter().find(|c| c.piece == whole).unwrap();
            assert_eq!(Eviction { piece: whole, ..*e }, *coarse);
        }
        let (budget, cost) = (Budget::new(200 * MIB), CostModel::default());
        let r = simulate(
            &cycle,
            Policy::Plan(&fine),
            budget,
            &cost,
            SimOptions::default(),
        );
        assert!(r.is_ok_and(|r| r.demand_fetches == 0 && r.settled));
    }

    #[test]
    fn a_stale_search_goes_on_with_finer_pieces_deterministically() {
        let cycle = rotation();
        let p = rotation_plan(&cycle);
        let (budget, cost) = (Budget::new(200 * MIB), CostModel::default());
        let options = SearchOptions {
            max_evaluations: 600,
            patience: None,
            ..SearchOptions::default()
        };
        let (a, ra) = improve(&cycle, &p, budget, &cost, &options);
        let (b, rb) = improve(&cycle, &p, budget, &cost, &options);
        assert_eq!(a, b);
        assert_eq!((ra.step_ns, ra.evaluations), (rb.step_ns, rb.evaluations));
        assert_eq!(ra.evaluations, 600);
        assert!(ra.step_ns <= ra.start_step_ns, "{ra:?}");
        // 600 plans are more than the coarse stage takes to go stale on four tensors: the
        // search went on with 4 MiB pieces (64 of them), found a shorter step there, and what
        // it returns runs as reported.
        assert_eq!(a.pieces.len(), 64);
        assert_eq!(pieces::check_cover(&cycle, &a.pieces), Ok(()));
        let r = simulate(
            &cycle,
            Policy::Plan(&a),
            budget,
            &cost,
            SimOptions::default(),
        )
        .unwrap();
        assert_eq!(Some(r.step_ns), ra.step_ns);
        assert_eq!(r.demand_fetches, 0);
    }

    #[test]
    fn a_search_that_stops_gaining_stops_long_before_its_time_limit() {
        // Without patience this search would run for the whole minute.
        let r = search(SearchOptions {
            time_limit: Duration::from_secs(60),
            patience: Some(Duration::from_millis(20)),
            ..SearchOptions::default()
        });
        assert!(r.elapsed_ms < 10_000, "{r:?}");
        assert!(r.step_ns <= r.start_step_ns, "{r:?}");
    }
}
