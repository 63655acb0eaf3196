//! A [`SwapPlan`] restated in the shim's terms: a [`tensile_protocol::ExecPlan`].
//!
//! The planner works on ops of a [`Cycle`] (launches, application copies and memsets) and on
//! tensors of a [`Trace`]; the shim sees launches as they happen and allocations whose
//! addresses change from step to step. This module maps one onto the other:
//!
//! - **Positions are launches.** Launch position 0 is the first launch of the representative
//!   span, `anchor_seq` its `Launch::seq`, and `kernels` the kernel ids of the span's launches.
//!   A read-back issued at op `p` becomes a prefetch *before* the first launch at or after `p`
//!   (cyclically). A write-out after op `p` runs *after* launch `p` if `p` is a launch, and
//!   *before* the next launch if `p` is a copy or memset (so it is ordered after that op). A
//!   round trip whose write-out would not come strictly before its read-back in launch terms
//!   (only ops that are not launches lie between them) is left out, and the plan the
//!   prediction is made for leaves it out too. So are the moves of a tensor that the span
//!   allocates but that lives longer than a period (the cycle treats it as persistent): it is
//!   a new allocation every iteration, and no role names it in all of them.
//! - **Tails written out** ([`crate::plan::TailOut`], shim pages only) are a write-out placed
//!   as a round trip's is, with no prefetch: the piece is never read back, and the shim drops
//!   its pages on the host when the application frees the tensor. One whose write-out would
//!   not come before the free in launch terms (only ops that are not launches between the
//!   last access and the free) is left out like such a round trip.
//! - **Roles** follow the protocol's definition, not the cycle's: an allocation belongs to the
//!   iteration of the first launch made after it, and its ordinal counts the allocations of
//!   that iteration before it, from 0. A step names the allocation of its own launch's
//!   iteration ([`Iteration::Current`]) or of the one before ([`Iteration::Previous`]: the
//!   tensor outlives the iteration's end).
//!
//! This module decides nothing about what to move; that is the planner's job.

use std::collections::BTreeSet;

use tensile_protocol::{Action, ExecPlan, Iteration, PieceRef, Role, Step, Use, When};

use crate::cost::{Budget, CostModel};
use crate::cycle::{Cycle, Tensor, TensorId};
use crate::model::{AllocIdx, OpKind, Trace};
use crate::plan::{Eviction, SwapPlan};
use crate::sim::{simulate, Policy, SimError, SimOptions};

/// An executable plan and what the conversion left out.
#[derive(Debug, Clone)]
pub struct Conversion {
    /// The plan in the shim's terms.
    pub plan: ExecPlan,
    /// Round trips (and host-resident pieces and tail write-outs) left out: those that could
    /// not be placed on launches, and those of tensors no role names in every iteration (see
    /// the module documentation).
    pub dropped_round_trips: usize,
    /// The swap plan `plan` carries out (the given one less the dropped round trips): what the
    /// prediction was made for.
    pub executed: SwapPlan,
}

/// Why a plan cannot be restated in the shim's terms.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecPlanError {
    /// The cycle's ops hold no launch to attach steps to.
    #[error("the iteration has no kernel launches; the shim can only act at launches")]
    NoLaunches,
    /// The cycle was not built from this trace's iteration.
    #[error("the cycle (ops {start}..{end}) does not lie in the trace of {ops} ops")]
    ForeignCycle {
        /// First op of the cycle's span.
        start: usize,
        /// End of the span.
        end: usize,
        /// Ops in the trace.
        ops: usize,
    },
    /// A transient tensor's lifetime spans more than two iterations in launch terms.
    #[error(
        "a step of tensor {tensor} lands {distance} iterations after its allocation's; \
         a plan can name only the current or the previous iteration"
    )]
    TooLongLived {
        /// The tensor.
        tensor: u32,
        /// Iterations between them.
        distance: u64,
    },
    /// A transient tensor allocated after the trace's last launch.
    #[error("tensor {0} is allocated after the last launch of the trace")]
    Unplaceable(u32),
    /// A host-resident piece of a tensor that is not persistent.
    #[error("host-resident tensor {0} is not persistent")]
    HostResidentTransient(u32),
    /// The simulator refused the plan as executed.
    #[error("the plan as the shim executes it does not simulate: {0}")]
    Sim(#[from] SimError),
}

/// A point in the launch stream: an unrolled launch position (0 = the span's first launch) and
/// before or after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct LaunchPoint {
    launch: u64,
    when: When,
}

/// The span's ops seen as launches.
struct LaunchMap {
    /// Ops per iteration.
    period: u64,
    /// Launches per iteration.
    launches: u64,
    /// For each op position `q` (and `q = period`), the position of the first launch at or
    /// after it; `launches` when there is none before the span's end.
    next_launch: Vec<u64>,
    /// The launch position of each op that is a launch.
    launch_at: Vec<Option<u64>>,
}

impl LaunchMap {
    fn of(cycle: &Cycle) -> LaunchMap {
        let period = cycle.ops.len();
        let mut launch_at = Vec::with_capacity(period);
        let mut n = 0u64;
        for op in &cycle.ops {
            if matches!(op.kind, OpKind::Launch { .. }) {
                launch_at.push(Some(n));
                n += 1;
            } else {
                launch_at.push(None);
            }
        }
        let mut next_launch = vec![n; period + 1];
        for q in (0..period).rev() {
            next_launch[q] = launch_at[q].unwrap_or(next_launch[q + 1]);
        }
        LaunchMap {
            period: period as u64,
            launches: n,
            next_launch,
            launch_at,
        }
    }

    /// The first launch at or after unrolled op `u`.
    fn launch_at_or_after(&self, u: u64) -> u64 {
        let (k, q) = (u / self.period, u % self.period);
        k * self.launches + self.next_launch[q as usize]
    }

    /// Where a read-back issued at the start of unrolled op `u` runs.
    fn fetch_point(&self, u: u64) -> LaunchPoint {
        LaunchPoint {
            launch: self.launch_at_or_after(u),
            when: When::BeforeLaunch,
        }
    }

    /// Where a write-out after unrolled op `u` runs.
    fn out_point(&self, u: u64) -> LaunchPoint {
        let (k, q) = (u / self.period, u % self.period);
        match self.launch_at[q as usize] {
            Some(l) => LaunchPoint {
                launch: k * self.launches + l,
                when: When::AfterLaunch,
            },
            None => LaunchPoint {
                launch: self.launch_at_or_after(u + 1),
                when: When::BeforeLaunch,
            },
        }
    }
}

/// How the shim names an allocation of the trace: its iteration (relative to the
/// representative span's, in launch terms) and its ordinal in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolRole {
    /// Iteration of the first launch made after the allocation, counted from the one that
    /// starts at `anchor` (negative: before it).
    pub iteration: i64,
    /// Allocations of that iteration made before it.
    pub ordinal: u32,
}

/// The protocol's role of allocation `alloc` of `trace`, for iterations of `period` launches of
/// which one starts at the launch with index `anchor` (launches counted in trace order, from 0).
/// `None` if no launch follows the allocation.
pub fn protocol_role(
    trace: &Trace,
    launch_ops: &[usize],
    anchor: usize,
    period: usize,
    alloc: AllocIdx,
) -> Option<ProtocolRole> {
    let a = trace.allocations.get(alloc as usize)?;
    // The first launch made after the allocation: at or after the op recorded after it.
    let home = launch_ops.partition_point(|&op| op < a.before_op as usize);
    if home >= launch_ops.len() || period == 0 {
        return None;
    }
    let iteration = (home as i64 - anchor as i64).div_euclid(period as i64);
    let first_launch = anchor as i64 + iteration * period as i64;
    if first_launch <= 0 && trace.predating_allocations > 0 {
        // The iteration began before a learner's window: allocations it made before the
        // window are among those kept at its start, in no known place. Counted from there,
        // every ordinal of the iteration would be off by their number.
        return None;
    }
    // The iteration's allocations are those made after the last launch of the iteration before.
    let after_op = if first_launch <= 0 {
        None
    } else {
        launch_ops.get(first_launch as usize - 1).copied()
    };
    let first_alloc = match after_op {
        None => 0,
        Some(op) => trace
            .allocations
            .partition_point(|x| (x.before_op as usize) <= op),
    };
    Some(ProtocolRole {
        iteration,
        ordinal: (alloc as usize).checked_sub(first_alloc)? as u32,
    })
}

/// Op indices of the trace's launches, in order.
pub fn launch_ops(trace: &Trace) -> Vec<usize> {
    trace
        .ops
        .iter()
        .enumerate()
        .filter(|(_, op)| matches!(op.kind, OpKind::Launch { .. }))
        .map(|(i, _)| i)
        .collect()
}

/// Unrolled position of the op after which `e` writes its piece out (its `out_after` may have
/// been moved later in the gap than the access that opens it).
fn out_unrolled(e: &Eviction, period: u32) -> u32 {
    e.gap_from + (e.out_after + period - e.gap_from % period) % period
}

/// The trace allocations behind `cycle`'s tensors that no role names in every iteration: a
/// tensor the cycle treats as persistent although its span allocates it lives longer than a
/// period (ResNet-50's input batch: the next one is copied in before the last is freed), so
/// each iteration's is a new allocation with a new id. A plan for the shim leaves them where
/// they are ([`Cycle::with_immovable`]); [`convert`] drops any move of theirs. So are the
/// transient tensors made in an iteration that began before a learner's window (a trace with
/// [`Trace::predating_allocations`]): their ordinals are not known ([`protocol_role`]).
pub fn unnameable(trace: &Trace, cycle: &Cycle) -> BTreeSet<AllocIdx> {
    // The launches as `convert` numbers them, where ordinals may be unknown.
    let launches = (trace.predating_allocations > 0).then(|| {
        let all = launch_ops(trace);
        let anchor = all.partition_point(|&op| op < first_launch_op(cycle));
        (anchor, LaunchMap::of(cycle).launches as usize, all)
    });
    cycle
        .tensors
        .iter()
        .filter(|t| {
            if t.is_persistent() {
                return trace
                    .allocations
                    .get(t.source as usize)
                    .is_some_and(|a| cycle.span.contains(&(a.before_op as usize)));
            }
            launches.as_ref().is_some_and(|(anchor, period, all)| {
                protocol_role(trace, all, *anchor, *period, t.source).is_none()
            })
        })
        .map(|t| t.source)
        .collect()
}

/// The trace op of the cycle span's first launch (the span's start if it has none): position
/// 0 of a plan for it.
fn first_launch_op(cycle: &Cycle) -> usize {
    cycle.span.start
        + cycle
            .ops
            .iter()
            .position(|o| matches!(o.kind, OpKind::Launch { .. }))
            .unwrap_or(0)
}

/// Restates `plan` (made for `cycle`, which was built from `trace`'s representative span) as an
/// [`ExecPlan`] numbered `version`, with the step the simulator predicts for it.
pub fn convert(
    trace: &Trace,
    cycle: &Cycle,
    plan: &SwapPlan,
    cost: &CostModel,
    version: u32,
) -> Result<Conversion, ExecPlanError> {
    let span = cycle.span.clone();
    if span.end > trace.ops.len() || span.is_empty() || span.len() != cycle.len() {
        return Err(ExecPlanError::ForeignCycle {
            start: span.start,
            end: span.end,
            ops: trace.ops.len(),
        });
    }
    let map = LaunchMap::of(cycle);
    if map.launches == 0 {
        return Err(ExecPlanError::NoLaunches);
    }
    let all_launches = launch_ops(trace);
    let anchor_op = first_launch_op(cycle);
    let anchor = all_launches.partition_point(|&op| op < anchor_op);
    let kernels: Vec<u32> = trace.ops[span.clone()]
        .iter()
        .filter_map(|op| match op.kind {
            OpKind::Launch { kernel } => Some(kernel),
            _ => None,
        })
        .collect();
    let period = cycle.len() as u32;
    let launches = map.launches;
    let unnameable_sources = unnameable(trace, cycle);
    let unnameable = |t: &Tensor| unnameable_sources.contains(&t.source);

    // How tensor `t` is named from the launch `launch` (unrolled: iteration 0 is the span's).
    let role_at = |t: TensorId, launch: u64| -> Result<Role, ExecPlanError> {
        let tensor = &cycle.tensors[t as usize];
        if tensor.alloc_at.is_none() {
            return Ok(Role::Persistent {
                alloc_id: trace.allocations[tensor.source as usize].trace_id,
            });
        }
        let ProtocolRole {
            iteration: home,
            ordinal,
        } = protocol_role(
            trace,
            &all_launches,
            anchor,
            launches as usize,
            tensor.source,
        )
        .ok_or(ExecPlanError::Unplaceable(t))?;
        let iteration = match (launch / launches) as i64 - home {
            0 => Iteration::Current,
            1 => Iteration::Previous,
            d => {
                return Err(ExecPlanError::TooLongLived {
                    tensor: t,
                    distance: d.unsigned_abs(),
                })
            }
        };
        Ok(Role::Transient {
            ordinal,
            bytes: tensor.bytes,
            iteration,
        })
    };

    // What each launch touches, for the shim's eviction of what the plan did not foresee.
    // Work that is not a launch counts at the next launch; a use before its tensor's
    // allocation in the span belongs to the next iteration (its lifetime wraps). Tensors no
    // role names are left out (the shim then knows nothing of their future).
    let mut uses: Vec<Use> = Vec::new();
    for (q, op) in cycle.ops.iter().enumerate() {
        for &t in &op.tensors {
            let tensor = &cycle.tensors[t as usize];
            if unnameable(tensor) {
                continue;
            }
            let wraps = tensor.alloc_at.is_some_and(|a| (q as u32) < a);
            let launch = map.next_launch[q] + if wraps { launches } else { 0 };
            if let Ok(role) = role_at(t, launch) {
                uses.push(Use {
                    position: (launch % launches) as u32,
                    role,
                });
            }
        }
    }
    uses.sort_by_key(|u| u.position);
    uses.dedup();

    // Steps, with a key that orders the steps at one launch point as their ops are ordered.
    let mut steps: Vec<(i64, Step)> = Vec::new();
    let mut executed = plan.clone();
    executed.evictions.clear();
    let mut dropped = 0usize;
    for e in &plan.evictions {
        let piece = plan.pieces[e.piece as usize];
        let tensor = &cycle.tensors[piece.tensor as usize];
        if unnameable(tensor) {
            dropped += 1;
            continue;
        }
        // Positions of a transient tensor's gap counted from its allocation in the span: a gap
        // that starts before the allocation's position was folded from the next iteration.
        let shift = match tensor.alloc_at {
            Some(a) if e.gap_from < a => u64::from(period),
            _ => 0,
        };
        let out_u = u64::from(out_unrolled(e, period)) + shift;
        let fetch_u = u64::from(e.fetch_unrolled) + shift;
        let out = map.out_point(out_u);
        let fetch = map.fetch_point(fetch_u);
        if out >= fetch {
            dropped += 1;
            continue;
        }
        let bytes = piece.bytes.min(tensor.bytes.saturating_sub(piece.offset));
        if bytes == 0 {
            dropped += 1;
            continue;
        }
        executed.evictions.push(*e);
        for (point, action, u, late) in [
            (out, Action::SwapOut, out_u, 1),
            (fetch, Action::Prefetch, fetch_u, 0),
        ] {
            let role = role_at(piece.tensor, point.launch)?;
            let k = point.launch / launches;
            let key = 2 * (u as i64 - (k * u64::from(period)) as i64) + late;
            steps.push((
                key,
                Step {
                    position: (point.launch % launches) as u32,
                    when: point.when,
                    action,
                    piece: PieceRef {
                        role,
                        offset: piece.offset,
                        bytes,
                    },
                },
            ));
        }
    }
    executed.tail_outs.clear();
    for t in &plan.tail_outs {
        let piece = plan.pieces[t.piece as usize];
        let tensor = &cycle.tensors[piece.tensor as usize];
        let bytes = piece.bytes.min(tensor.bytes.saturating_sub(piece.offset));
        let Some(alloc) = tensor.alloc_at else {
            // Only transients have tails; a plan that says otherwise is not carried out.
            dropped += 1;
            continue;
        };
        // Counted from the allocation in the span, as for round trips.
        let shift = if t.tail_from < alloc {
            u64::from(period)
        } else {
            0
        };
        let out_u = u64::from(t.out_unrolled(period)) + shift;
        let out = map.out_point(out_u);
        // The free is recorded before op `freed_at`; a step at or after the first launch from
        // there would name a freed allocation.
        let freed = map.launch_at_or_after(u64::from(t.freed_at) + shift);
        if out.launch >= freed || bytes == 0 {
            dropped += 1;
            continue;
        }
        executed.tail_outs.push(*t);
        let role = role_at(piece.tensor, out.launch)?;
        let k = out.launch / launches;
        steps.push((
            2 * (out_u as i64 - (k * u64::from(period)) as i64) + 1,
            Step {
                position: (out.launch % launches) as u32,
                when: out.when,
                action: Action::SwapOut,
                piece: PieceRef {
                    role,
                    offset: piece.offset,
                    bytes,
                },
            },
        ));
    }
    steps.sort_by_key(|(key, s)| (s.position, s.when, *key));

    let mut host_resident = Vec::with_capacity(plan.host_resident.len());
    executed.host_resident.clear();
    for &id in &plan.host_resident {
        let piece = plan.pieces[id as usize];
        let tensor = &cycle.tensors[piece.tensor as usize];
        if !tensor.is_persistent() {
            return Err(ExecPlanError::HostResidentTransient(piece.tensor));
        }
        if unnameable(tensor) {
            dropped += 1;
            continue;
        }
        executed.host_resident.push(id);
        if piece.bytes == 0 {
            continue;
        }
        host_resident.push(PieceRef {
            role: Role::Persistent {
                alloc_id: trace.allocations[tensor.source as usize].trace_id,
            },
            offset: piece.offset,
            bytes: piece.bytes,
        });
    }

    let report = simulate(
        cycle,
        Policy::Plan(&executed),
        Budget::new(plan.budget_bytes),
        cost,
        SimOptions::default(),
    )?;
    let plan = ExecPlan {
        version,
        period: launches as u32,
        kernels,
        anchor_seq: trace.ops[anchor_op].seq,
        steps: steps.into_iter().map(|(_, s)| s).collect(),
        uses,
        host_resident,
        budget_bytes: plan.budget_bytes,
        predicted_step_ns: report.step_ns,
        compute_ns: cycle.compute_ns(),
    };
    Ok(Conversion {
        plan,
        dropped_round_trips: dropped,
        executed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Allocation, CopyDir, Op, SourceFormat};
    use crate::pieces;

    /// Three instances of `L M C L L` (launch, memset, copy, launch, launch); a persistent 4 MiB
    /// tensor touched by the memset and the last launch.
    fn trace() -> Trace {
        let mut t = Trace::new(SourceFormat::Tensile);
        t.allocations.push(Allocation {
            trace_id: 5,
            ptr: 1 << 32,
            bytes: 4 << 20,
            stream: 0,
            t_ns: 0,
            before_op: 0,
            free: None,
        });
        let mut seq = 100;
        for _ in 0..3 {
            for (i, kind) in [
                OpKind::Launch { kernel: 1 },
                OpKind::Memset,
                OpKind::Copy {
                    dir: CopyDir::HostToDevice,
                },
                OpKind::Launch { kernel: 2 },
                OpKind::Launch { kernel: 3 },
            ]
            .into_iter()
            .enumerate()
            {
                let touches = if i == 1 || i == 4 { vec![0] } else { vec![] };
                push_op(&mut t, &mut seq, kind, touches);
            }
        }
        t
    }

    /// Appends an op: a launch of 1 ms numbered `seq` (which then advances), or a 1 MiB copy
    /// or memset, touching `touches`.
    fn push_op(t: &mut Trace, seq: &mut u64, kind: OpKind, touches: Vec<u32>) {
        let launch = matches!(kind, OpKind::Launch { .. });
        t.ops.push(Op {
            kind,
            t_ns: 0,
            stream: 0,
            seq: if launch { *seq } else { 0 },
            bytes: if launch { 0 } else { 1 << 20 },
            touches,
            gpu_ns: launch.then_some(1_000_000),
        });
        *seq += u64::from(launch);
    }

    fn round_trip(gap: (u32, u32), out_after: u32, fetch: u32) -> Eviction {
        Eviction {
            piece: 0,
            out_after,
            fetch_at: fetch % 5,
            needed_by: gap.1 % 5,
            gap_from: gap.0,
            fetch_unrolled: fetch,
            gap_to: gap.1,
        }
    }

    fn convert_with(evictions: Vec<Eviction>) -> Conversion {
        // The second instance; the allocation was made before it.
        convert_span(evictions, 5)
    }

    fn convert_span(evictions: Vec<Eviction>, start: usize) -> Conversion {
        let t = trace();
        let cycle =
            Cycle::from_span(&t, start..start + 5, start + 5, &CostModel::default()).unwrap();
        let plan = SwapPlan {
            period: 5,
            budget_bytes: 1 << 30,
            evictions,
            host_resident: vec![],
            tail_outs: vec![],
            pieces: pieces::whole(&cycle),
        };
        convert(&t, &cycle, &plan, &CostModel::default(), 3).unwrap()
    }

    fn step(position: u32, when: When, action: Action) -> Step {
        Step {
            position,
            when,
            action,
            piece: PieceRef {
                role: Role::Persistent { alloc_id: 5 },
                offset: 0,
                bytes: 4 << 20,
            },
        }
    }

    #[test]
    fn ops_that_are_not_launches_place_their_steps_on_the_next_launch() {
        // Out after the memset (op 1): before the launch at op 3 (position 1). Back at op 4:
        // before position 2. Out after the launch at op 4: after position 2; back at op 0 of
        // the next iteration: before position 0.
        let c = convert_with(vec![round_trip((1, 4), 1, 4), round_trip((4, 6), 4, 5)]);
        assert_eq!(c.dropped_round_trips, 0);
        let p = &c.plan;
        assert_eq!((p.version, p.period, p.anchor_seq), (3, 3, 103));
        assert_eq!(p.kernels, vec![1, 2, 3]);
        assert_eq!(
            p.steps,
            vec![
                step(0, When::BeforeLaunch, Action::Prefetch),
                step(1, When::BeforeLaunch, Action::SwapOut),
                step(2, When::BeforeLaunch, Action::Prefetch),
                step(2, When::AfterLaunch, Action::SwapOut),
            ]
        );
        // The tensor's uses: the memset counts at the next launch (position 1), the last
        // launch at its own.
        let used = |position| Use {
            position,
            role: Role::Persistent { alloc_id: 5 },
        };
        assert_eq!(p.uses, vec![used(1), used(2)]);
        // The memset and copy are priced by the cost model; the three launches ran 1 ms each.
        assert!(p.compute_ns > 3_000_000);
        assert!(p.predicted_step_ns >= p.compute_ns);
    }

    #[test]
    fn a_round_trip_with_no_launch_between_its_copies_is_left_out() {
        // Out after the memset and back at the copy (op 2): both before position 1.
        let c = convert_with(vec![round_trip((1, 4), 1, 2), round_trip((4, 6), 4, 5)]);
        assert_eq!(c.dropped_round_trips, 1);
        assert_eq!(c.executed.evictions.len(), 1);
        assert_eq!(c.plan.steps.len(), 2);
        // A write-out moved later than the access opening its gap (as the search does) is
        // placed where it was moved: after the copy at op 2, before position 1.
        let moved = convert_with(vec![round_trip((1, 4), 2, 4)]);
        assert_eq!(
            moved.plan.steps[0],
            step(1, When::BeforeLaunch, Action::SwapOut)
        );
    }

    /// Three instances of `L M M L`; each allocates two 4 MiB tensors before its first op and
    /// frees them before its last: `x`, touched by the first launch, and `y`, touched by the
    /// first memset. Both hold their memory after their last access (their tails).
    fn tails_trace() -> Trace {
        let mut t = Trace::new(SourceFormat::Tensile);
        let mut seq = 100;
        for k in 0..3u32 {
            let start = 4 * k;
            for i in 0..2u64 {
                t.allocations.push(Allocation {
                    trace_id: u64::from(k) * 2 + i + 1,
                    ptr: (u64::from(k) * 2 + i + 1) << 32,
                    bytes: 4 << 20,
                    stream: 0,
                    t_ns: 0,
                    before_op: start,
                    free: Some(crate::model::FreeEvent {
                        t_ns: 0,
                        before_op: start + 3,
                    }),
                });
            }
            let (x, y) = (2 * k, 2 * k + 1);
            for (kind, touches) in [
                (OpKind::Launch { kernel: 1 }, vec![x]),
                (OpKind::Memset, vec![y]),
                (OpKind::Memset, vec![]),
                (OpKind::Launch { kernel: 2 }, vec![]),
            ] {
                push_op(&mut t, &mut seq, kind, touches);
            }
        }
        t
    }

    #[test]
    fn a_tail_write_out_is_a_swap_out_after_the_last_access_with_no_prefetch() {
        let t = tails_trace();
        let cycle = Cycle::from_span(&t, 4..8, 8, &CostModel::default())
            .unwrap()
            .with_units(crate::cycle::MoveUnits::ShimPages);
        let live = crate::timeline::Liveness::of(&cycle);
        let tail = |tensor, from, to| crate::timeline::Gap { tensor, from, to };
        assert_eq!(live.tails, vec![tail(0, 0, 3), tail(1, 1, 3)]);
        let out = |piece, from| crate::plan::TailOut {
            piece,
            out_after: from,
            tail_from: from,
            freed_at: 3,
        };
        let plan = SwapPlan {
            period: 4,
            budget_bytes: 1 << 30,
            evictions: vec![],
            host_resident: vec![],
            tail_outs: vec![out(0, 0), out(1, 1)],
            pieces: pieces::whole(&cycle),
        };
        let c = convert(&t, &cycle, &plan, &CostModel::default(), 1).unwrap();
        // `x` leaves after the launch that last touched it, with the role of this iteration.
        assert_eq!(
            c.plan.steps,
            vec![Step {
                position: 0,
                when: When::AfterLaunch,
                action: Action::SwapOut,
                piece: PieceRef {
                    role: Role::Transient {
                        ordinal: 0,
                        bytes: 4 << 20,
                        iteration: Iteration::Current,
                    },
                    offset: 0,
                    bytes: 4 << 20,
                },
            }]
        );
        // `y`'s write-out would run before the next launch, after its free: left out.
        assert_eq!(c.dropped_round_trips, 1);
        assert_eq!(c.executed.tail_outs, vec![out(0, 0)]);
    }

    #[test]
    fn a_tensor_the_span_allocates_that_outlives_a_period_is_left_where_it_is() {
        // The first instance makes the allocation (before its first op) and it is never freed:
        // the cycle calls it persistent, but in steady state that would be a new allocation in
        // every iteration, which no role names.
        let c = convert_span(vec![round_trip((1, 4), 1, 4), round_trip((4, 6), 4, 5)], 0);
        assert_eq!(c.dropped_round_trips, 2);
        assert!(c.plan.steps.is_empty());
        assert!(c.plan.uses.is_empty(), "no role names it, so no use either");
        assert!(c.executed.evictions.is_empty());
    }

    /// A learner's window that starts inside an iteration keeps that iteration's earlier
    /// allocations at its start, beside older live ones: the iteration's ordinals are not
    /// known and none is given; the later iterations' are those of the whole trace.
    #[test]
    fn no_ordinal_is_given_in_an_iteration_that_began_before_the_window() {
        use crate::import::builder::TraceBuilder;
        // A weight, then 4 iterations of 2 launches, each making two activations (one before
        // each launch) freed at its end.
        let mut b = TraceBuilder::lenient(SourceFormat::Tensile);
        let (mut t, mut id, mut seq) = (0u64, 100u64, 0u64);
        let mut tick = || {
            t += 1;
            t
        };
        b.alloc(tick(), 0, 1, 0x1000_0000, 1 << 20).unwrap();
        for _ in 0..4 {
            let made = [id, id + 1];
            id += 2;
            for (k, &a) in made.iter().enumerate() {
                b.alloc(tick(), 0, a, a << 24, 2 << 20).unwrap();
                b.launch(tick(), 0, seq, k as u32, [1, a]).unwrap();
                seq += 1;
            }
            for a in made {
                b.free(tick(), a).unwrap();
            }
        }
        let whole = b.trace().clone();
        assert_eq!(whole.predating_allocations, 0);
        // The window starts at the second iteration's second launch (op 3).
        b.drop_ops_before(3);
        let window = b.trace();
        assert_eq!(
            window.predating_allocations, 2,
            "the weight and iteration 1's first"
        );
        let launches = launch_ops(window);
        // Launch 0 of the window is the second of its iteration: iterations start at odd
        // launches, anchored at launch 1.
        let role = |a: AllocIdx| protocol_role(window, &launches, 1, 2, a);
        let by_id = |id: u64| {
            window
                .allocations
                .iter()
                .position(|x| x.trace_id == id)
                .unwrap() as AllocIdx
        };
        assert_eq!(role(by_id(102)), None, "made before the window");
        assert_eq!(
            role(by_id(103)),
            None,
            "made in the window, in an iteration begun before"
        );
        for (k, id) in [(0, 104), (0, 105), (1, 106), (1, 107)] {
            let r = role(by_id(id)).unwrap();
            assert_eq!(
                (r.iteration, r.ordinal),
                (k, (id % 2) as u32),
                "allocation {id}"
            );
        }
        // The whole trace gives the same ordinals to the same allocations.
        let all = launch_ops(&whole);
        let r = protocol_role(&whole, &all, 0, 2, 5).unwrap();
        assert_eq!((r.iteration, r.ordinal), (2, 0));
    }

    #[test]
    fn what_no_role_names_is_immovable_to_the_planner_and_its_pieces_too() {
        let t = trace();
        let cost = CostModel::default();
        // The first instance allocates the tensor: no role names it from there on.
        let first = Cycle::from_span(&t, 0..5, 5, &cost).unwrap();
        assert_eq!(unnameable(&t, &first), BTreeSet::from([0]));
        // Seen from the second, it was allocated before: persistent, named by its id.
        let second = Cycle::from_span(&t, 5..10, 10, &cost).unwrap();
        assert!(unnameable(&t, &second).is_empty());

        let immovable = unnameable(&t, &first);
        let pinned = first.clone().with_immovable(immovable);
        assert!(first.is_movable(0));
        assert!(!pinned.is_movable(0));
        let cut = pieces::cut(&pinned, 1 << 20);
        assert_eq!(cut.len(), 4);
        let split = pieces::split(&pinned, &cut).unwrap();
        assert!((0..4).all(|p| !split.is_movable(p)));
    }
}
