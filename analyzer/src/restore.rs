//! An [`ExecPlan`] (a plan in the shim's terms, as a run used it) restated on a [`Cycle`], so
//! that the simulator can replay it: `tensile replay TRACE --plan-from RUN.trace`. The inverse
//! of [`crate::exec_plan::convert`], up to what that conversion coarsens:
//!
//! - **Launch positions become ops.** The plan's position `p` is the cycle's launch whose
//!   `Launch::seq` is `anchor_seq + p` modulo the period. A swap-out after a launch leaves
//!   after that launch's op; one before a launch, after the op before it; a prefetch before a
//!   launch is issued at that launch's op, or at the op that needs the piece if that comes
//!   first (work that is not a launch).
//! - **Roles become tensors.** A persistent role names its allocation by id. A transient role
//!   names the `ordinal`-th allocation of an iteration: the cycle's span holds one allocation
//!   of each ordinal (the pattern repeats), found by [`protocol_role`] and checked by size.
//! - **Steps become round trips.** A swap-out and the prefetch of the same piece in the same
//!   gap between two accesses make an [`Eviction`]; a swap-out in a tensor's tail (from its
//!   last access to its free) a [`TailOut`]; a swap-out with no prefetch before the next
//!   access an eviction read back on demand at that access, as the shim would.
//!
//! Steps that name no tensor of the cycle, land outside every gap, or repeat a move already
//! placed are counted in [`Restored::unplaced`] and left out.

use std::collections::HashMap;

use tensile_protocol::{Action, ExecPlan, PieceRef, Role, When};

use crate::cycle::{Cycle, TensorId};
use crate::exec_plan::{launch_ops, protocol_role};
use crate::model::{OpKind, Trace};
use crate::pieces::{Piece, PieceId};
use crate::plan::{Eviction, SwapPlan, TailOut};
use crate::timeline::{Gap, Liveness};

/// A run's plan on a cycle.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The plan, for [`crate::sim::simulate`] with [`crate::sim::Policy::Plan`].
    pub plan: SwapPlan,
    /// Steps (and host-resident pieces) left out (see the module documentation).
    pub unplaced: usize,
    /// Swap-outs read back on demand (no prefetch before the next access).
    pub on_demand: usize,
}

/// Why a plan cannot be restated on a cycle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    #[error("the plan has {plan} launches per iteration, the trace's iteration {cycle}")]
    Period { plan: u32, cycle: u64 },
    #[error(
        "the plan's launch at position {position} is kernel {plan}, the trace's is kernel \
         {trace}: the plan was made for another program"
    )]
    Kernel {
        position: u32,
        plan: u32,
        trace: u32,
    },
    #[error("the cycle (ops {start}..{end}) does not lie in the trace of {ops} ops")]
    ForeignCycle {
        start: usize,
        end: usize,
        ops: usize,
    },
    #[error("the plan moves overlapping pieces of tensor {tensor} (at byte {offset})")]
    Overlap { tensor: TensorId, offset: u64 },
}

/// Restates `exec` on `cycle` (built from `trace`'s representative span, in shim pages for a
/// plan made that way) with `budget_bytes` as the plan's budget.
pub fn restore(
    trace: &Trace,
    cycle: &Cycle,
    exec: &ExecPlan,
    budget_bytes: u64,
) -> Result<Restored, RestoreError> {
    let span = cycle.span.clone();
    if span.end > trace.ops.len() || span.len() != cycle.len() {
        return Err(RestoreError::ForeignCycle {
            start: span.start,
            end: span.end,
            ops: trace.ops.len(),
        });
    }
    let period = cycle.len() as u32;
    // The cycle's launches: their op positions and their positions in the plan.
    let mut launch_op: Vec<u32> = Vec::new();
    let mut position_of: Vec<u32> = Vec::new();
    let p = u64::from(exec.period.max(1));
    for (q, op) in cycle.ops.iter().enumerate() {
        if let OpKind::Launch { kernel } = op.kind {
            let seq = trace.ops[span.start + q].seq;
            let position = ((seq + p - exec.anchor_seq % p) % p) as u32;
            if exec.kernel_at(position) != Some(kernel) {
                return Err(RestoreError::Kernel {
                    position,
                    plan: exec.kernel_at(position).unwrap_or(u32::MAX),
                    trace: kernel,
                });
            }
            launch_op.push(q as u32);
            position_of.push(position);
        }
    }
    if launch_op.len() as u64 != u64::from(exec.period) {
        return Err(RestoreError::Period {
            plan: exec.period,
            cycle: launch_op.len() as u64,
        });
    }
    let mut op_at_position = vec![0u32; launch_op.len()];
    for (i, &pos) in position_of.iter().enumerate() {
        op_at_position[pos as usize] = launch_op[i];
    }

    // Tensors by the roles that name them.
    let all_launches = launch_ops(trace);
    let first_launch_op = span.start + launch_op[0] as usize;
    let first = all_launches.partition_point(|&op| op < first_launch_op);
    // A launch index of the trace at plan position 0.
    let anchor = first + (exec.period - position_of[0]) as usize % exec.period as usize;
    let mut persistent: HashMap<u64, TensorId> = HashMap::new();
    let mut transient: HashMap<(u32, u64), TensorId> = HashMap::new();
    for (i, t) in cycle.tensors.iter().enumerate() {
        let source = t.source;
        let Some(alloc) = trace.allocations.get(source as usize) else {
            continue;
        };
        if t.is_persistent() {
            persistent.insert(alloc.trace_id, i as TensorId);
        } else if let Some(role) =
            protocol_role(trace, &all_launches, anchor, exec.period as usize, source)
        {
            transient.insert((role.ordinal, t.bytes), i as TensorId);
        }
    }
    let tensor_of = |r: &PieceRef| -> Option<TensorId> {
        match r.role {
            Role::Persistent { alloc_id } => persistent.get(&alloc_id).copied(),
            Role::Transient { ordinal, bytes, .. } => transient.get(&(ordinal, bytes)).copied(),
        }
    };

    let liveness = Liveness::of(cycle);
    let mut gaps: HashMap<TensorId, Vec<Gap>> = HashMap::new();
    for g in &liveness.gaps {
        gaps.entry(g.tensor).or_default().push(*g);
    }
    let tails: HashMap<TensorId, Gap> = liveness.tails.iter().map(|g| (g.tensor, *g)).collect();

    let mut pieces = PieceTable::default();

    // Each piece's moves, at cycle op positions: outs after an op, prefetches at an op.
    let mut outs: HashMap<PieceId, Vec<u32>> = HashMap::new();
    let mut fetches: HashMap<PieceId, Vec<u32>> = HashMap::new();
    let mut unplaced = 0usize;
    for s in &exec.steps {
        let Some(tensor) = tensor_of(&s.piece) else {
            unplaced += 1;
            continue;
        };
        let id = pieces.id(tensor, &s.piece);
        let op = op_at_position[s.position as usize];
        match (s.action, s.when) {
            (Action::SwapOut, When::AfterLaunch) => outs.entry(id).or_default().push(op),
            (Action::SwapOut, When::BeforeLaunch) => {
                outs.entry(id).or_default().push((op + period - 1) % period)
            }
            (Action::Prefetch, _) => fetches.entry(id).or_default().push(op),
        }
    }

    let mut evictions = Vec::new();
    let mut tail_outs = Vec::new();
    let mut on_demand = 0usize;
    let mut ids: Vec<PieceId> = outs.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        let tensor = pieces.pieces[id as usize].tensor;
        let tensor_gaps = gaps.get(&tensor).map(Vec::as_slice).unwrap_or(&[]);
        let piece_fetches = fetches.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        let mut used_gaps: Vec<usize> = Vec::new();
        for &out in &outs[&id] {
            // The gap the write-out lies in: after the access that opens it, before the next.
            let unrolled = |from: u32, at: u32| from + (at + period - from % period) % period;
            let found = tensor_gaps
                .iter()
                .enumerate()
                .find(|(_, g)| unrolled(g.from, out) < g.to);
            let Some((k, g)) = found else {
                match tails.get(&tensor) {
                    Some(t) if unrolled(t.from, out) < t.to => tail_outs.push(TailOut {
                        piece: id,
                        out_after: out,
                        tail_from: t.from,
                        freed_at: t.to,
                    }),
                    _ => unplaced += 1,
                }
                continue;
            };
            if used_gaps.contains(&k) {
                unplaced += 1;
                continue;
            }
            used_gaps.push(k);
            let out_u = unrolled(g.from, out);
            // The first prefetch after the write-out in this gap; at the next access if none.
            let fetch_u = piece_fetches
                .iter()
                .map(|&f| {
                    let u = unrolled(g.from, f);
                    if u <= out_u {
                        u + period
                    } else {
                        u
                    }
                })
                .filter(|&u| u <= g.to)
                .min();
            let fetch_u = match fetch_u {
                Some(u) => u,
                None => {
                    on_demand += 1;
                    g.to
                }
            };
            evictions.push(Eviction {
                piece: id,
                out_after: out_u % period,
                fetch_at: fetch_u % period,
                needed_by: g.to % period,
                gap_from: g.from,
                fetch_unrolled: fetch_u,
                gap_to: g.to,
            });
        }
    }
    evictions.sort_by_key(|e| (e.out_after, e.piece));
    tail_outs.sort_by_key(|t| (t.out_after, t.piece));

    let mut host_resident = Vec::new();
    for r in &exec.host_resident {
        match tensor_of(r) {
            Some(tensor) if cycle.tensors[tensor as usize].is_persistent() => {
                host_resident.push(pieces.id(tensor, r));
            }
            _ => unplaced += 1,
        }
    }
    // What the plan does not move is still the tensors': the pieces tile them.
    pieces.fill(cycle)?;
    Ok(Restored {
        plan: SwapPlan {
            period,
            budget_bytes,
            evictions,
            host_resident,
            tail_outs,
            pieces: pieces.pieces,
        },
        unplaced,
        on_demand,
    })
}

/// The pieces the plan's steps name, each once.
#[derive(Default)]
struct PieceTable {
    pieces: Vec<Piece>,
    ids: HashMap<(TensorId, u64, u64), PieceId>,
}

impl PieceTable {
    /// Adds pieces (that nothing moves) for the bytes of every tensor no piece covers.
    fn fill(&mut self, cycle: &Cycle) -> Result<(), RestoreError> {
        let mut by_tensor: Vec<Vec<(u64, u64)>> = vec![Vec::new(); cycle.tensors.len()];
        for p in &self.pieces {
            if let Some(r) = by_tensor.get_mut(p.tensor as usize) {
                r.push((p.offset, p.bytes));
            }
        }
        for (t, (tensor, mut ranges)) in cycle.tensors.iter().zip(by_tensor).enumerate() {
            ranges.sort_unstable();
            let mut covered = 0;
            let mut filler = |offset: u64, bytes: u64| {
                self.pieces.push(Piece {
                    tensor: t as TensorId,
                    offset,
                    bytes,
                })
            };
            for (offset, bytes) in ranges {
                if offset < covered {
                    return Err(RestoreError::Overlap {
                        tensor: t as TensorId,
                        offset,
                    });
                }
                if offset > covered {
                    filler(covered, offset - covered);
                }
                covered = offset + bytes;
            }
            if covered < tensor.bytes || tensor.bytes == 0 && covered == 0 {
                filler(covered, tensor.bytes - covered.min(tensor.bytes));
            }
        }
        Ok(())
    }

    fn id(&mut self, tensor: TensorId, r: &PieceRef) -> PieceId {
        let pieces = &mut self.pieces;
        *self
            .ids
            .entry((tensor, r.offset, r.bytes))
            .or_insert_with(|| {
                pieces.push(Piece {
                    tensor,
                    offset: r.offset,
                    bytes: r.bytes,
                });
                (pieces.len() - 1) as PieceId
            })
    }
}
