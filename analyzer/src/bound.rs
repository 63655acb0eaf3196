//! A lower bound on the step time of any swap plan for a budget.
//!
//! Same model as the planner and the simulator (see `sim` and docs/planner.md for the full
//! derivation). At op `i`, `E(i)` = bytes holding data minus the budget must be on the host,
//! fully copied, for the whole op. Each such byte belongs to a tensor that was accessed at some
//! op `a` before `i` (so it may be dirty and can only leave after `a` ends) and is needed again
//! at some op `b` after `i` (so it must be back before `b` starts).
//!
//! For a window of compute time `W` ending where op `i` starts, the tensors whose previous
//! access ended before the window can have left before it; everything else of the `E(i)` bytes
//! must cross in the window, at no more than the device-to-host bandwidth. If that takes longer
//! than the window's compute time, the compute stream must stall for the difference inside the
//! window. The same holds after op `i` for the read-back at the host-to-device bandwidth. A
//! window before and a window after op `i` that together fit in one iteration are disjoint, so
//! their stalls add up. The bound is the compute time plus the largest such sum over all ops and
//! window pairs, and never less than the bandwidth needed to move the largest excess each way.
//!
//! It is a relaxation (each window is priced as if the other copies and the cheapest choice of
//! tensors were free), so real plans can be slower; no plan under this model can be faster.

use serde::Serialize;

use crate::cost::{format_bytes, Budget, CostModel};
use crate::cycle::Cycle;
use crate::plan::op_bytes;
use crate::timeline::{needed_bytes, op_start_times, Liveness};

/// The bound and what it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LowerBound {
    /// GPU time of the ops.
    pub compute_ns: u64,
    /// Stall no plan can avoid.
    pub stall_ns: u64,
    /// `compute_ns + stall_ns`: the least step time of any plan.
    pub bound_ns: u64,
    /// The op whose excess forces that stall (if any).
    pub critical_op: Option<u32>,
    /// Largest excess of data over the budget at any op.
    pub max_excess_bytes: u64,
    /// The trivial bound: max(compute, excess moved each way at full bandwidth).
    pub trivial_ns: u64,
}

/// Why there is no finite bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundError {
    /// An op touches more than the budget: infeasible at any speed.
    #[error(
        "op {op} alone touches {}, more than the budget of {}",
        format_bytes(*bytes),
        format_bytes(*budget)
    )]
    OpTooLarge {
        /// Op.
        op: u32,
        /// Bytes it touches.
        bytes: u64,
        /// Budget.
        budget: u64,
    },
}

/// One candidate tensor at an op: bytes, and the compute time available before and after.
#[derive(Debug, Clone, Copy)]
struct Side {
    window: u64,
    bytes: u64,
}

/// Computes the lower bound for `cycle` under `budget`.
pub fn lower_bound(
    cycle: &Cycle,
    budget: &Budget,
    cost: &CostModel,
) -> Result<LowerBound, BoundError> {
    let p = cycle.len();
    for (i, &bytes) in op_bytes(cycle).iter().enumerate() {
        if bytes > budget.bytes {
            return Err(BoundError::OpTooLarge {
                op: i as u32,
                bytes,
                budget: budget.bytes,
            });
        }
    }
    let times = op_start_times(cycle);
    let compute = times[p];
    let live = Liveness::of(cycle);
    let needed = needed_bytes(cycle, &live);
    let idle_bytes: u64 = live
        .idle
        .iter()
        .map(|&t| cycle.tensors[t as usize].bytes)
        .sum();
    let max_excess = needed
        .iter()
        .map(|&m| m.saturating_sub(budget.bytes))
        .max()
        .unwrap_or(0);
    let d2h_rate = cost.d2h_gbps;
    let h2d_rate = cost.h2d_gbps;
    // Never-touched tensors can cover part of the excess without moving; the rest was touched
    // in the iteration, so it must leave and come back once per iteration at least.
    let moving = max_excess.saturating_sub(idle_bytes) as f64;
    let trivial = [
        compute as f64,
        moving / d2h_rate,
        moving / h2d_rate,
        2.0 * moving / cost.bidir_gbps,
    ]
    .into_iter()
    .fold(0.0, f64::max);

    // Unrolled start/end times.
    let start_at = |u: u64| times[(u % p as u64) as usize] + (u / p as u64) * compute;
    let end_at = |u: u64| start_at(u) + cycle.ops[(u % p as u64) as usize].duration_ns;

    let mut best_stall = 0.0f64;
    let mut critical = None;
    for (i, &need) in needed.iter().enumerate() {
        let excess = need.saturating_sub(budget.bytes);
        if excess == 0 {
            continue;
        }
        // Every gap covering op i, seen from op i: i is placed in the period after the gap's
        // start so that from < i < to in unrolled positions.
        let mut before = Vec::new();
        let mut after = Vec::new();
        for g in &live.gaps {
            let (from, to) = (u64::from(g.from), u64::from(g.to));
            // Op i in the unrolled frame of the gap, if the gap covers it.
            let (i0, i1) = (i as u64, i as u64 + p as u64);
            let i_u = if from < i0 && i0 < to {
                i0
            } else if from < i1 && i1 < to {
                i1
            } else {
                continue;
            };
            let bytes = cycle.tensors[g.tensor as usize].bytes;
            before.push(Side {
                window: start_at(i_u) - end_at(from),
                bytes,
            });
            after.push(Side {
                window: start_at(to) - end_at(i_u),
                bytes,
            });
        }
        let f = side_stalls(&mut before, excess, idle_bytes, d2h_rate);
        let g = side_stalls(&mut after, excess, idle_bytes, h2d_rate);
        let limit = compute.saturating_sub(cycle.ops[i].duration_ns);
        let stall = best_pair(&f, &g, limit);
        if stall > best_stall {
            best_stall = stall;
            critical = Some(i as u32);
        }
    }
    let bound = (compute as f64 + best_stall).max(trivial);
    Ok(LowerBound {
        compute_ns: compute,
        stall_ns: (bound - compute as f64).max(0.0).round() as u64,
        bound_ns: bound.round() as u64,
        critical_op: critical,
        max_excess_bytes: max_excess,
        trivial_ns: trivial.round() as u64,
    })
}

/// For each window length (ending at / starting from the op) the stall forced inside it:
/// `(window, stall)` points. Tensors whose window is longer than `W` could cross outside a
/// window of length `W`; the rest of the excess must cross inside it.
fn side_stalls(sides: &mut [Side], excess: u64, free_bytes: u64, rate: f64) -> Vec<(u64, f64)> {
    sides.sort_unstable_by_key(|s| std::cmp::Reverse(s.window));
    let mut outside = free_bytes; // never-touched tensors cost nothing anywhere
    let mut points = Vec::new();
    let mut k = 0;
    while k < sides.len() {
        let w = sides[k].window;
        // Tensors with a longer window than w were added already; those with exactly w cross
        // inside this window.
        let required = excess.saturating_sub(outside);
        let stall = required as f64 / rate - w as f64;
        if stall > 0.0 {
            points.push((w, stall));
        }
        while k < sides.len() && sides[k].window == w {
            outside += sides[k].bytes;
            k += 1;
        }
    }
    points
}

/// Largest `f(W) + g(W')` with `W + W' <= limit` (either side may be absent).
fn best_pair(f: &[(u64, f64)], g: &[(u64, f64)], limit: u64) -> f64 {
    let mut g_sorted: Vec<(u64, f64)> = g.iter().copied().filter(|x| x.0 <= limit).collect();
    g_sorted.sort_unstable_by_key(|x| x.0);
    let mut prefix_max = Vec::with_capacity(g_sorted.len());
    let mut m = 0.0f64;
    for &(_, s) in &g_sorted {
        m = m.max(s);
        prefix_max.push(m);
    }
    let mut best = m; // g alone
    for &(w, s) in f.iter().filter(|x| x.0 <= limit) {
        let room = limit - w;
        let idx = g_sorted.partition_point(|x| x.0 <= room);
        let other = if idx == 0 { 0.0 } else { prefix_max[idx - 1] };
        best = best.max(s + other);
    }
    best
}
