//! The planner: a periodic swap plan for a memory budget.
//!
//! Works on the live gaps of a [`Cycle`] (the stretches between two accesses of a tensor; see
//! `timeline`). A plan evicts some gaps: the tensor is written to the host after the access that
//! opens the gap and read back before the access that closes it. Three passes, all at op
//! granularity, then the simulator prices the result in time:
//!
//! 1. **Select** (Belady): sweep the ops once around the cycle, starting at the footprint's low
//!    point. Wherever the bytes holding data exceed the budget, evict, among the gaps spanning
//!    that op, the one whose next use is furthest ahead, preferring gaps long enough (in GPU
//!    time, on both sides of the op) to hide the copies. Never-touched persistent tensors count
//!    as needed infinitely far ahead and go first (they cost nothing in the steady state).
//! 2. **Repair and prune**: ops left over the budget (possible when an eviction's memory is
//!    counted free only after its write-back) get reliefs extended or more gaps; then an eviction
//!    the budget no longer needs (later choices covered it) is undone, most recent first.
//! 3. **Fetch as early as memory allows**: in order of next use, each evicted tensor's read-back
//!    is issued at the earliest op from which keeping it on the device stays within the budget
//!    up to its use.
//!
//! [`plan`] runs these passes with several settings ([`PLAN_VARIANTS`]), simulates each plan,
//! and keeps the fastest; [`plan_with`] runs one setting.
//!
//! Under [`crate::cycle::MoveUnits::ShimPages`] a transient tensor also holds memory from its
//! last access to its free (its tail, [`Liveness::tails`]): the shim frees its pages only when
//! the application frees it. A tail is one more candidate for the selection, one that is never
//! needed again: writing it out ([`TailOut`]) costs the copy out alone, and the memory is free
//! once that copy ends. The selection takes tails before any gap (Belady's choice: no next use),
//! after the never-touched tensors (which cost nothing).
//!
//! The plan is periodic by construction: the same actions at the same positions in every
//! iteration, and a gap that wraps past the end of the iteration is evicted at the end of one
//! iteration and fetched in the next, so the state at the end is the state at the start.

use std::collections::BinaryHeap;

use serde::Serialize;

use crate::cost::{format_bytes, Budget, CostModel};
use crate::cycle::{Cycle, TensorId};
use crate::pieces::{self, Piece, PieceId};
use crate::search;
use crate::timeline::{held_bytes, op_start_times, Gap, Liveness};

/// One planned round trip of a piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Eviction {
    /// The piece (an index into [`SwapPlan::pieces`]).
    pub piece: PieceId,
    /// Position of the op after which it is written out.
    pub out_after: u32,
    /// Position of the op at whose start (when the compute stream reaches it) the read-back is
    /// issued.
    pub fetch_at: u32,
    /// Position of the op that needs it back.
    pub needed_by: u32,
    /// Unrolled positions (see [`Gap`]): `gap_from < fetch_unrolled <= gap_to`.
    pub gap_from: u32,
    /// Unrolled position of the read-back's issue.
    pub fetch_unrolled: u32,
    /// Unrolled position of the next use.
    pub gap_to: u32,
}

/// A planned write-out of a tail (see [`Liveness::tails`]): the piece is copied to the host
/// after its last access and never read back; its device memory is free once the copy ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TailOut {
    /// The piece (an index into [`SwapPlan::pieces`]).
    pub piece: PieceId,
    /// Position of the op after which it is written out (the last access, or later in the
    /// tail).
    pub out_after: u32,
    /// Position of the last access (in `[0, period)`).
    pub tail_from: u32,
    /// Unrolled position of the op before which the tensor is freed (`tail_from < freed_at`).
    pub freed_at: u32,
}

impl TailOut {
    /// Unrolled position of the op after which the piece is written out (`tail_from <=` it
    /// `< freed_at`).
    pub fn out_unrolled(&self, period: u32) -> u32 {
        self.tail_from + (self.out_after + period - self.tail_from % period) % period
    }
}

/// A periodic swap plan for one cycle and budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwapPlan {
    /// Ops per cycle the plan was made for.
    pub period: u32,
    /// Budget it respects.
    pub budget_bytes: u64,
    /// Round trips, in order of the op after which they leave.
    pub evictions: Vec<Eviction>,
    /// Pieces of persistent tensors that are never touched: kept on the host for good (no copy
    /// in the steady state).
    pub host_resident: Vec<PieceId>,
    /// Tails written out, in order of the op after which they leave (only under
    /// [`crate::cycle::MoveUnits::ShimPages`]; empty, and left out of the JSON, otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tail_outs: Vec<TailOut>,
    /// The units the plan moves: byte ranges of the cycle's tensors, which [`Eviction::piece`]
    /// and `host_resident` index. One whole piece per tensor when the plan was made on the
    /// cycle as it is ([`plan_with`]); [`plan`] cuts large tensors (see [`crate::pieces`]).
    pub pieces: Vec<Piece>,
}

impl SwapPlan {
    /// Pieces the plan keeps on the host at the start of an iteration: those whose read-back is
    /// issued in the iteration and whose write-out happened in the previous one, and the tails
    /// across the boundary written out before it.
    pub fn on_host_at_start(&self) -> Vec<PieceId> {
        self.evictions
            .iter()
            .filter(|e| e.fetch_unrolled >= self.period)
            .map(|e| e.piece)
            .chain(self.host_resident.iter().copied())
            .chain(
                self.tail_outs
                    .iter()
                    .filter(|t| {
                        t.freed_at > self.period && t.out_unrolled(self.period) < self.period
                    })
                    .map(|t| t.piece),
            )
            .collect()
    }

    /// The same plan on its pieces cut to at most `max_piece` bytes ([`pieces::refine`]): each
    /// round trip, tail write-out and host-resident piece becomes one per part, at the same
    /// positions. The parts of a piece are accessed by the same ops, so the plan means the same
    /// moves; only its copies are smaller.
    pub fn refined(&self, max_piece: u64) -> SwapPlan {
        let (fine, of) = pieces::refine(&self.pieces, max_piece);
        let parts = |piece: PieceId| of[piece as usize].clone().map(|p| p as PieceId);
        let mut evictions: Vec<Eviction> = self
            .evictions
            .iter()
            .flat_map(|e| parts(e.piece).map(move |piece| Eviction { piece, ..*e }))
            .collect();
        evictions.sort_by_key(|e| (e.out_after, e.piece));
        let mut tail_outs: Vec<TailOut> = self
            .tail_outs
            .iter()
            .flat_map(|t| parts(t.piece).map(move |piece| TailOut { piece, ..*t }))
            .collect();
        tail_outs.sort_by_key(|t| (t.out_after, t.piece));
        SwapPlan {
            period: self.period,
            budget_bytes: self.budget_bytes,
            evictions,
            host_resident: self.host_resident.iter().flat_map(|&p| parts(p)).collect(),
            tail_outs,
            pieces: fine,
        }
    }

    /// Bytes written out per iteration (round trips and tails).
    pub fn bytes_out(&self) -> u64 {
        self.evictions
            .iter()
            .map(|e| e.piece)
            .chain(self.tail_outs.iter().map(|t| t.piece))
            .map(|piece| self.pieces[piece as usize].bytes)
            .sum()
    }
}

/// Why no plan exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// One op touches more than the budget: no amount of swapping helps.
    #[error(
        "op {op} alone touches {}, more than the budget of {}; no swap plan can run it",
        format_bytes(*bytes),
        format_bytes(*budget)
    )]
    OpTooLarge {
        /// Op position.
        op: u32,
        /// Bytes its tensors occupy.
        bytes: u64,
        /// Budget.
        budget: u64,
    },
    /// The cycle has no ops.
    #[error("the iteration has no ops")]
    Empty,
    /// The cycle is inconsistent (a tensor accessed by an op it does not have).
    #[error("inconsistent iteration: {0}")]
    InvalidCycle(String),
}

/// Bytes the tensors of each op occupy (what must be on the device while it runs).
pub fn op_bytes(cycle: &Cycle) -> Vec<u64> {
    cycle
        .ops
        .iter()
        .map(|op| {
            op.tensors
                .iter()
                .map(|&t| cycle.tensors[t as usize].bytes)
                .sum()
        })
        .collect()
}

/// A candidate for eviction during the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    /// How far ahead the next use is (max-heap: furthest first): the unrolled position of the
    /// next use, shifted into the sweep's frame, for a gap; [`TAIL_RANK`] for a tail (never
    /// used again); `u64::MAX` for an idle tensor.
    rank: u64,
    /// Index into the interval list (gaps, then tails; `usize::MAX - i` for idle tensor `i`).
    gap: usize,
    /// Unrolled end (the next use, or the free), shifted into the sweep's frame.
    to: u64,
    /// Unrolled start, shifted into the sweep's frame.
    from: u64,
}

/// The rank of a tail among the candidates: after the idle tensors (which cost nothing to keep
/// on the host), before every gap (a tail is never needed again: it costs one copy, not two).
const TAIL_RANK: u64 = u64::MAX - 1;

/// Knobs of one planning pass; [`plan`] tries several and keeps the fastest in simulation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanOptions {
    /// In the selection, prefer gaps whose copies can hide behind compute (else pure Belady).
    pub prefer_hideable: bool,
    /// Issue each read-back no earlier than this many times its copy duration before its use
    /// (`None`: as early as memory allows).
    pub fetch_lead: Option<f64>,
    /// Fraction of the budget the selection leaves free (read-backs use the full budget).
    pub headroom: f64,
    /// Count an eviction's memory as free only from the first op that starts after its
    /// write-back could have finished (else right after the access that opens the gap).
    pub writeback_latency: bool,
}

/// The variants [`plan`] compares.
pub const PLAN_VARIANTS: [PlanOptions; 8] = [
    PlanOptions {
        prefer_hideable: true,
        fetch_lead: None,
        headroom: 0.0,
        writeback_latency: false,
    },
    PlanOptions {
        prefer_hideable: false,
        fetch_lead: None,
        headroom: 0.0,
        writeback_latency: false,
    },
    PlanOptions {
        prefer_hideable: true,
        fetch_lead: Some(3.0),
        headroom: 0.0,
        writeback_latency: false,
    },
    PlanOptions {
        prefer_hideable: false,
        fetch_lead: Some(3.0),
        headroom: 0.0,
        writeback_latency: false,
    },
    PlanOptions {
        prefer_hideable: true,
        fetch_lead: None,
        headroom: 0.0,
        writeback_latency: true,
    },
    PlanOptions {
        prefer_hideable: false,
        fetch_lead: None,
        headroom: 0.0,
        writeback_latency: true,
    },
    PlanOptions {
        prefer_hideable: true,
        fetch_lead: None,
        headroom: 0.03,
        writeback_latency: true,
    },
    PlanOptions {
        prefer_hideable: false,
        fetch_lead: Some(3.0),
        headroom: 0.0,
        writeback_latency: true,
    },
];

/// Makes a periodic swap plan for `cycle` within `budget`: cuts its large tensors into pieces
/// ([`pieces::piece_bytes_in_pages`] for the budget and the cycle's page), plans each of [`PLAN_VARIANTS`] on the pieces,
/// simulates them, and returns the one with the shortest predicted step (the first on ties).
/// A cycle that cut into [`search::fine_piece_bytes`] pieces has at most
/// [`search::MAX_FINE_PIECES`] is planned on those too, and the faster plan kept.
pub fn plan(cycle: &Cycle, budget: &Budget, cost: &CostModel) -> Result<SwapPlan, PlanError> {
    let size = pieces::piece_bytes_in_pages(budget.bytes, cycle.page_bytes);
    let (step, mut best) = plan_in_pieces(cycle, budget, cost, size)?;
    // A small cycle is planned on finer pieces too (what the local search would cut them to),
    // and the faster plan kept: the MLP trace at 50% of its peak plans 78.6 ms on 4 MiB pieces
    // against 79.2 on 16 MiB, and its search gains more from there.
    let fine = search::fine_piece_bytes(cycle);
    if size > fine && pieces::cut(cycle, fine).len() <= search::MAX_FINE_PIECES {
        let (fine_step, fine_plan) = plan_in_pieces(cycle, budget, cost, fine)?;
        if fine_step < step {
            best = fine_plan;
        }
    }
    Ok(best)
}

/// [`plan`] on the cycle cut into pieces of at most `size` bytes: every variant, simulated;
/// the fastest with its step (`u64::MAX` if the simulator refused them all).
fn plan_in_pieces(
    cycle: &Cycle,
    budget: &Budget,
    cost: &CostModel,
    size: u64,
) -> Result<(u64, SwapPlan), PlanError> {
    let cut = pieces::cut(cycle, size);
    let split = if pieces::is_whole(cycle, &cut) {
        cycle.clone()
    } else {
        pieces::split(cycle, &cut).map_err(PlanError::InvalidCycle)?
    };
    let mut best: Option<(u64, SwapPlan)> = None;
    for options in PLAN_VARIANTS {
        let candidate = plan_with(&split, budget, cost, &options)?;
        let sim = crate::sim::simulate(
            &split,
            crate::sim::Policy::Plan(&candidate),
            *budget,
            cost,
            crate::sim::SimOptions::default(),
        );
        // A variant the simulator rejects is skipped; if all are rejected the first is returned
        // so the caller's own simulation reports why.
        let Ok(report) = sim else { continue };
        if best.as_ref().is_none_or(|(t, _)| report.step_ns < *t) {
            best = Some((report.step_ns, candidate));
        }
    }
    let (step, mut plan) = match best {
        Some(b) => b,
        None => (
            u64::MAX,
            plan_with(&split, budget, cost, &PLAN_VARIANTS[0])?,
        ),
    };
    // The plan was made on the split cycle, whose tensors are the pieces.
    plan.pieces = cut;
    Ok((step, plan))
}

/// One planning pass with the given knobs.
pub fn plan_with(
    cycle: &Cycle,
    budget: &Budget,
    cost: &CostModel,
    options: &PlanOptions,
) -> Result<SwapPlan, PlanError> {
    let p = cycle.len();
    if p == 0 {
        return Err(PlanError::Empty);
    }
    let b = i128::from(budget.bytes);
    // Selection aims below the budget by the headroom, so that read-backs find room earlier.
    let b_sel = i128::from(budget.bytes) - (budget.bytes as f64 * options.headroom) as i128;
    for (i, &bytes) in op_bytes(cycle).iter().enumerate() {
        if bytes > budget.bytes {
            return Err(PlanError::OpTooLarge {
                op: i as u32,
                bytes,
                budget: budget.bytes,
            });
        }
    }
    let live = Liveness::of(cycle);
    let held = held_bytes(cycle, &live);
    let mut resident: Vec<i128> = held.iter().map(|&x| i128::from(x)).collect();
    // The intervals a plan may evict: the gaps, then the tails (index `live.gaps.len()` on).
    let intervals: Vec<Gap> = live.gaps.iter().chain(&live.tails).copied().collect();
    let is_tail = |i: usize| i >= live.gaps.len();
    let times = op_start_times(cycle);
    let period_ns = times[p];
    let tensor_bytes = |t: TensorId| cycle.tensors[t as usize].bytes;

    // Sweep from the op with the least data, so that gaps spanning the start are seen whole.
    let start = (0..p).min_by_key(|&i| held[i]).unwrap_or(0);
    let mut picks = Picks {
        selected: vec![false; intervals.len()],
        order: Vec::new(),
    };
    let mut idle_selected = vec![false; live.idle.len()];

    // Candidate intervals in the sweep frame [start, start + p): each gap shifted by 0 or p.
    let mut events: Vec<(u64, Candidate)> = Vec::new();
    for (gi, g) in intervals.iter().enumerate() {
        if !cycle.is_movable(g.tensor) {
            continue;
        }
        // The sweep runs over [start + p, start + 2p); a gap (with `from` in [0, p)) may cover
        // parts of it shifted by 0, p or 2p.
        for shift in [0u64, p as u64, 2 * p as u64] {
            let from = u64::from(g.from) + shift;
            let to = u64::from(g.to) + shift;
            let first = from + 1;
            let last = to.saturating_sub(1);
            let lo = (start + p) as u64;
            let hi = (start + 2 * p) as u64;
            if first <= last && first < hi && last >= lo {
                let rank = if is_tail(gi) { TAIL_RANK } else { to };
                events.push((
                    first.max(lo),
                    Candidate {
                        rank,
                        gap: gi,
                        to,
                        from,
                    },
                ));
            }
        }
    }
    events.sort_unstable_by_key(|e| e.0);
    let mut heap: BinaryHeap<Candidate> = BinaryHeap::new();
    for i in (0..live.idle.len()).filter(|&i| cycle.is_movable(live.idle[i])) {
        heap.push(Candidate {
            rank: u64::MAX,
            gap: usize::MAX - i,
            to: u64::MAX,
            from: 0,
        });
    }
    let mut next_event = 0;
    let time_at = |unrolled: u64| -> u64 {
        let k = unrolled / p as u64;
        times[(unrolled % p as u64) as usize] + k * period_ns
    };
    // Where each selected gap's memory counts as free (unrolled position).
    let mut relief_start: Vec<u64> = intervals.iter().map(|g| u64::from(g.from) + 1).collect();
    // First op starting after a write-back of `bytes` issued at the end of op `from` finished.
    let ready_after = |from: u64, to: u64, bytes: u64| -> u64 {
        let done = time_at(from + 1) + cost.d2h_ns(bytes);
        let (mut lo, mut hi) = (from + 1, to);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if time_at(mid) >= done {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    };
    for j in (start + p) as u64..(start + 2 * p) as u64 {
        while next_event < events.len() && events[next_event].0 <= j {
            heap.push(events[next_event].1);
            next_event += 1;
        }
        let pos = (j % p as u64) as usize;
        if resident[pos] <= b_sel {
            continue;
        }
        let mut deferred: Vec<Candidate> = Vec::new();
        while resident[pos] > b_sel {
            let Some(c) = heap.pop() else { break };
            if c.gap >= usize::MAX / 2 {
                let i = usize::MAX - c.gap;
                if !idle_selected[i] {
                    idle_selected[i] = true;
                    let bytes = i128::from(tensor_bytes(live.idle[i]));
                    resident.iter_mut().for_each(|r| *r -= bytes);
                }
                continue;
            }
            if c.to <= j || picks.selected[c.gap] {
                continue;
            }
            let bytes = tensor_bytes(intervals[c.gap].tensor);
            let out_slack = time_at(j).saturating_sub(time_at(c.from + 1));
            let in_slack = time_at(c.to).saturating_sub(time_at(j));
            // A tail is never read back: only its copy out must hide.
            let hidden = out_slack >= cost.d2h_ns(bytes)
                && (is_tail(c.gap) || in_slack >= cost.h2d_ns(bytes));
            if options.prefer_hideable && !hidden {
                deferred.push(c);
                continue;
            }
            let g = intervals[c.gap];
            let ready = ready_after(u64::from(g.from), u64::from(g.to), bytes);
            if options.writeback_latency && ready + c.from > j + u64::from(g.from) {
                // Its memory would not be free yet at this op: keep it for later ops.
                deferred.push(c);
                continue;
            }
            if options.writeback_latency {
                relief_start[c.gap] = ready;
            }
            select(
                &mut picks,
                &mut resident,
                &intervals,
                c.gap,
                p,
                bytes,
                relief_start[c.gap],
            );
        }
        if resident[pos] > b_sel {
            // Nothing hideable left: take the others, furthest next use first.
            deferred.sort_unstable_by(|x, y| y.cmp(x));
            let mut rest = Vec::new();
            for c in deferred {
                if resident[pos] > b_sel {
                    let bytes = tensor_bytes(intervals[c.gap].tensor);
                    // Needed here even if its write-back makes the op wait: count it free from
                    // right after its access.
                    relief_start[c.gap] = u64::from(intervals[c.gap].from) + 1;
                    select(
                        &mut picks,
                        &mut resident,
                        &intervals,
                        c.gap,
                        p,
                        bytes,
                        relief_start[c.gap],
                    );
                } else {
                    rest.push(c);
                }
            }
            deferred = rest;
        }
        heap.extend(deferred);
    }

    // Repair: a gap chosen late in the sweep may count its memory free only from where its
    // write-back ends, leaving ops the sweep visited earlier over the budget. Extend such
    // reliefs back (the op will wait for the write-back), or pick more gaps, furthest next use
    // first.
    for pos in 0..p {
        if resident[pos] <= b_sel {
            continue;
        }
        let mut covering: Vec<(u64, usize, u64)> = Vec::new(); // (rank, interval, pos unrolled)
        for (gi, g) in intervals.iter().enumerate() {
            if !cycle.is_movable(g.tensor) {
                continue;
            }
            let (from, to) = (u64::from(g.from), u64::from(g.to));
            let at = [pos as u64, (pos + p) as u64]
                .into_iter()
                .find(|&u| from < u && u < to);
            if let Some(u) = at {
                if !picks.selected[gi] || relief_start[gi] > u {
                    let rank = if is_tail(gi) { TAIL_RANK } else { to };
                    covering.push((rank, gi, u));
                }
            }
        }
        covering.sort_unstable_by(|a, b| b.cmp(a));
        for (_, gi, u) in covering {
            if resident[pos] <= b_sel {
                break;
            }
            let g = intervals[gi];
            let bytes = tensor_bytes(g.tensor);
            if picks.selected[gi] {
                add_range(&mut resident, p, u, relief_start[gi], -i128::from(bytes));
                relief_start[gi] = u;
            } else {
                relief_start[gi] = u64::from(g.from) + 1;
                select(
                    &mut picks,
                    &mut resident,
                    &intervals,
                    gi,
                    p,
                    bytes,
                    relief_start[gi],
                );
            }
        }
    }

    // Prune: undo evictions the budget does not need, most recent first.
    for &gi in picks.order.iter().rev() {
        let g = intervals[gi];
        let bytes = i128::from(tensor_bytes(g.tensor));
        let first = relief_start[gi];
        if fits_with(&resident, p, first, u64::from(g.to), bytes, b_sel) {
            picks.selected[gi] = false;
            add_range(&mut resident, p, first, u64::from(g.to), bytes);
        }
    }

    // Tails written out: no read-back to place.
    let mut tail_outs: Vec<TailOut> = live
        .tails
        .iter()
        .zip(&picks.selected[live.gaps.len()..])
        .filter(|(_, &s)| s)
        .map(|(g, _)| TailOut {
            piece: g.tensor,
            out_after: g.from,
            tail_from: g.from,
            freed_at: g.to,
        })
        .collect();
    tail_outs.sort_unstable_by_key(|t| (t.out_after, t.piece));

    // Fetch as early as memory allows, nearest next use first.
    let mut chosen: Vec<(Gap, u64)> = live
        .gaps
        .iter()
        .zip(&picks.selected)
        .zip(&relief_start)
        .filter(|((_, &s), _)| s)
        .map(|((g, _), &r)| (*g, r))
        .collect();
    chosen.sort_unstable_by_key(|(g, _)| (time_at(u64::from(g.to)) % period_ns.max(1), g.to));
    let mut evictions = Vec::with_capacity(chosen.len());
    for (g, first) in chosen {
        let bytes = i128::from(tensor_bytes(g.tensor));
        let mut fetch = u64::from(g.to);
        let lead = options
            .fetch_lead
            .map(|k| (cost.h2d_ns(tensor_bytes(g.tensor)) as f64 * k) as u64);
        let need_at = time_at(u64::from(g.to));
        while fetch > first {
            let pos = ((fetch - 1) % p as u64) as usize;
            if resident[pos] + bytes > b {
                break;
            }
            if lead.is_some_and(|l| need_at - time_at(fetch) >= l) {
                break;
            }
            fetch -= 1;
        }
        if fetch == first {
            // Fits for the whole gap after all: keep it on the device.
            add_range(&mut resident, p, first, u64::from(g.to), bytes);
            continue;
        }
        add_range(&mut resident, p, fetch, u64::from(g.to), bytes);
        evictions.push(Eviction {
            piece: g.tensor,
            out_after: g.from % p as u32,
            fetch_at: (fetch % p as u64) as u32,
            needed_by: g.to % p as u32,
            gap_from: g.from,
            fetch_unrolled: fetch as u32,
            gap_to: g.to,
        });
    }
    evictions.sort_unstable_by_key(|e| (e.out_after, e.piece));
    let host_resident = live
        .idle
        .iter()
        .zip(&idle_selected)
        .filter(|(_, &s)| s)
        .map(|(&t, _)| t)
        .collect();
    Ok(SwapPlan {
        period: p as u32,
        budget_bytes: budget.bytes,
        evictions,
        host_resident,
        tail_outs,
        pieces: pieces::whole(cycle),
    })
}

/// The gaps chosen for eviction, and in which order they were chosen.
struct Picks {
    selected: Vec<bool>,
    order: Vec<usize>,
}

/// Marks gap `gi` evicted and removes its bytes from the resident curve from `relief_start` (where
/// its memory counts as free) to the gap's end.
fn select(
    picks: &mut Picks,
    resident: &mut [i128],
    gaps: &[Gap],
    gi: usize,
    p: usize,
    bytes: u64,
    relief_start: u64,
) {
    let g = gaps[gi];
    picks.selected[gi] = true;
    picks.order.push(gi);
    add_range(
        resident,
        p,
        relief_start,
        u64::from(g.to),
        -i128::from(bytes),
    );
}

/// Adds `delta` to positions `[first, end)` (unrolled, taken modulo `p`).
fn add_range(curve: &mut [i128], p: usize, first: u64, end: u64, delta: i128) {
    for j in first..end {
        curve[(j % p as u64) as usize] += delta;
    }
}

/// Whether adding `bytes` on `[first, end)` keeps every position within `budget`.
fn fits_with(curve: &[i128], p: usize, first: u64, end: u64, bytes: i128, budget: i128) -> bool {
    (first..end).all(|j| curve[(j % p as u64) as usize] + bytes <= budget)
}
