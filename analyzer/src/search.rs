//! Local search after the planner: small changes to a plan, each priced by the simulator.
//!
//! [`crate::plan::plan`] decides at op granularity from estimates of when copies finish; the
//! simulator knows exactly. This pass closes part of the gap between the two: it mutates a plan
//! (issue a read-back earlier or later, write a piece out later, drop a round trip) and keeps a
//! mutation when the simulated steady-state step (see [`crate::sim`]) gets shorter. A mutation
//! the simulator refuses (over the budget, a deadlock) or that makes a plan fetch on demand is
//! rejected. It never returns a plan slower than the one it was given; given one the simulator
//! refuses, it returns the first that runs, if it finds one.
//!
//! It is not a planner of its own (it starts from a plan) and has no model of its own: whatever
//! the simulator says is what it optimises. Deterministic for a seed and a number of evaluations;
//! a wall-clock budget stops it earlier, so with a time limit the result depends on the machine.

use std::time::{Duration, Instant};

use crate::cost::{Budget, CostModel};
use crate::cycle::Cycle;
use crate::pieces;
use crate::plan::{Eviction, SwapPlan};
use crate::sim::{simulate, Policy, SimOptions};
use crate::timeline::{Gap, Liveness};

/// Limits and seed of a search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchOptions {
    /// Wall-clock time the search may take (it stops at the first evaluation past it).
    pub time_limit: Duration,
    /// Most plans it simulates (the deterministic limit).
    pub max_evaluations: u32,
    /// Seed of the mutation choices.
    pub seed: u64,
}

/// Default wall-clock limit of `tensile replay`'s search, chosen so that default planning stays
/// under 100 ms on the ResNet-50 and transformer traces (docs/replay-results.md).
pub const DEFAULT_SEARCH_MS: u64 = 30;

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            time_limit: Duration::from_millis(DEFAULT_SEARCH_MS),
            max_evaluations: u32::MAX,
            seed: 1,
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
    // Search on the cycle cut into the plan's pieces, so each simulation need not cut it again.
    let split;
    let (work_cycle, mut current) = if pieces::is_whole(cycle, &plan.pieces) {
        (cycle, plan.clone())
    } else {
        match pieces::split(cycle, &plan.pieces) {
            Ok(s) => split = s,
            Err(_) => return (plan.clone(), report),
        }
        let mut p = plan.clone();
        p.pieces = pieces::whole(&split);
        (&split, p)
    };
    let sim_options = SimOptions::default();
    let price = |p: &SwapPlan| -> Option<u64> {
        match simulate(work_cycle, Policy::Plan(p), budget, cost, sim_options) {
            Ok(r) if r.demand_fetches == 0 && r.settled => Some(r.step_ns),
            _ => None,
        }
    };
    // A start the simulator refuses (the planner's estimates can deadlock a tight budget) is
    // searched from too: the first mutation that runs is an improvement.
    let mut best = price(&current);
    report.start_step_ns = best;
    report.evaluations = 1;
    let period = current.period;
    let gaps: Vec<Gap> = Liveness::of(work_cycle)
        .gaps
        .into_iter()
        .filter(|g| g.to > g.from + 1)
        .collect();
    let mut rng = Rng::new(options.seed);
    while report.evaluations < options.max_evaluations
        && started.elapsed() < options.time_limit
        && (!current.evictions.is_empty() || !gaps.is_empty())
    {
        let mut candidate = current.clone();
        // One to three mutations at once: some improvements need two round trips to move
        // together (one makes room that the other uses).
        let count = 1 + rng.below(3);
        let mut changed = false;
        for _ in 0..count {
            if candidate.evictions.is_empty() || rng.below(6) == 0 {
                changed |= add_round_trip(&mut candidate.evictions, &gaps, period, &mut rng);
            } else {
                let i = rng.below(candidate.evictions.len() as u64) as usize;
                changed |= mutate(&mut candidate.evictions, i, period, &mut rng);
            }
        }
        if !changed {
            continue;
        }
        // The plan's order (by the op after which a piece leaves) is also the order in which
        // read-backs issued at one op queue up, so it is part of what is priced.
        candidate.evictions.sort_by_key(|e| (e.out_after, e.piece));
        report.evaluations += 1;
        if let Some(step) = price(&candidate) {
            // Equal steps are accepted too, so the search can cross plateaus.
            if best.is_none_or(|b| step <= b) {
                if best.is_none_or(|b| step < b) {
                    report.accepted += 1;
                }
                best = Some(step);
                current = candidate;
            }
        }
    }
    report.step_ns = best;
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    current.pieces = plan.pieces.clone();
    (current, report)
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
    let fetch = g.to - back;
    evictions.push(Eviction {
        piece: g.tensor,
        out_after: g.from % period,
        fetch_at: fetch % period,
        needed_by: g.to % period,
        gap_from: g.from,
        fetch_unrolled: fetch,
        gap_to: g.to,
    });
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
