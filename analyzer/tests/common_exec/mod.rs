//! The shim's side of the executable plan, written out independently of `exec_plan`: how it
//! resolves a step's role to an allocation, and the checks that a plan names, at every launch
//! of an instance of the iteration, allocations of the right size live there.

#![allow(dead_code)]

use tensile_analyzer::model::{OpKind, Trace};
use tensile_protocol::{Action, ExecPlan, Iteration, PieceRef, Role, When};

/// The trace's op index of the launch numbered `seq`.
pub fn op_of_seq(trace: &Trace, seq: u64) -> Option<usize> {
    trace
        .ops
        .iter()
        .position(|op| matches!(op.kind, OpKind::Launch { .. }) && op.seq == seq)
}

/// The shim's resolution: the allocation a piece names at the launch numbered `seq` of an
/// iteration whose first launch is numbered `iteration_start` (`period` launches each).
pub fn resolve(
    trace: &Trace,
    piece: &PieceRef,
    iteration_start: u64,
    period: u64,
) -> Result<usize, String> {
    match piece.role {
        Role::Persistent { alloc_id } => trace
            .allocations
            .iter()
            .rposition(|a| a.trace_id == alloc_id)
            .ok_or_else(|| format!("no allocation with id {alloc_id}")),
        Role::Transient {
            ordinal,
            bytes,
            iteration,
        } => {
            let first = match iteration {
                Iteration::Current => iteration_start,
                Iteration::Previous => iteration_start - period,
            };
            // An allocation belongs to the iteration of the first launch made after it.
            let belongs = |before_op: u32| {
                let next_launch = trace.ops[before_op as usize..]
                    .iter()
                    .find(|op| matches!(op.kind, OpKind::Launch { .. }));
                next_launch.is_some_and(|op| op.seq >= first && op.seq < first + period)
            };
            let (index, a) = trace
                .allocations
                .iter()
                .enumerate()
                .filter(|(_, a)| belongs(a.before_op))
                .nth(ordinal as usize)
                .ok_or_else(|| {
                    format!("iteration from launch {first} has no allocation {ordinal}")
                })?;
            if a.bytes != bytes {
                return Err(format!(
                    "allocation {ordinal} of the iteration from launch {first} has {} bytes, \
                     the plan says {bytes}",
                    a.bytes
                ));
            }
            Ok(index)
        }
    }
}

/// What [`check_against_instance`] found.
pub struct Checked {
    /// Steps whose launch the trace has.
    pub steps: usize,
    /// Of those, swap-outs after which no op of this instance touches the allocation until its
    /// free (a tail's write-out; a round trip's piece comes back).
    pub dead_outs: usize,
}

/// What a step names, whatever iteration it is seen from.
fn piece_key(p: &PieceRef) -> (u64, u64, u64) {
    match p.role {
        Role::Persistent { alloc_id } => (0, alloc_id, p.offset),
        Role::Transient { ordinal, bytes, .. } => (1 + u64::from(ordinal), bytes, p.offset),
    }
}

/// The tail write-outs of `plan`: per piece, the swap-outs beyond its prefetches (a round
/// trip's piece comes back, a tail's never). Checks that a piece has at most one (one
/// lifetime per iteration) and only a transient's.
pub fn tail_outs(name: &str, plan: &ExecPlan) -> usize {
    let mut balance: std::collections::HashMap<(u64, u64, u64), (i64, bool)> = Default::default();
    for s in &plan.steps {
        let entry = balance
            .entry(piece_key(&s.piece))
            .or_insert((0, matches!(s.piece.role, Role::Transient { .. })));
        entry.0 += if s.action == Action::SwapOut { 1 } else { -1 };
    }
    let mut tails = 0;
    for (key, (extra, transient)) in balance {
        assert!(
            extra == 0 || (extra == 1 && transient),
            "{name}: piece {key:?} goes out {extra} more times than it comes back"
        );
        tails += extra as usize;
    }
    tails
}

/// Checks `plan` against the instance of the iteration `k` iterations after the one it was
/// made from. Launches past the end of the trace (its last step can be cut) are skipped.
pub fn check_against_instance(name: &str, trace: &Trace, plan: &ExecPlan, k: i64) -> Checked {
    let period = u64::from(plan.period);
    let start = (plan.anchor_seq as i64 + k * period as i64) as u64;
    for p in 0..period {
        let Some(op) = op_of_seq(trace, start + p) else {
            continue;
        };
        assert_eq!(
            trace.ops[op].kind,
            OpKind::Launch {
                kernel: plan.kernels[p as usize]
            },
            "{name}: kernel at position {p} of instance {k}"
        );
    }
    assert!(!plan.steps.is_empty(), "{name}: the plan moves something");
    let mut checked = 0;
    let mut dead_outs = 0;
    for (i, s) in plan.steps.iter().enumerate() {
        let Some(op) = op_of_seq(trace, start + u64::from(s.position)) else {
            continue;
        };
        checked += 1;
        let index = resolve(trace, &s.piece, start, period)
            .unwrap_or_else(|e| panic!("{name}: instance {k}, step {i} ({s:?}): {e}"));
        let a = &trace.allocations[index];
        assert!(
            s.piece.offset + s.piece.bytes <= a.bytes,
            "{name}: step {i} reaches past its allocation"
        );
        // Live at the launch: allocated before it, freed after it.
        assert!(
            (a.before_op as usize) <= op,
            "{name}: instance {k}, step {i} names an allocation made after its launch"
        );
        assert!(
            a.free.is_none_or(|f| f.before_op as usize > op),
            "{name}: instance {k}, step {i} ({s:?}) names an allocation freed before its launch"
        );
        // The shim's page rule: pieces that move whole pages, from page boundaries.
        assert_eq!(s.piece.offset % (2 << 20), 0, "{name}: step {i}");
        assert_eq!(s.piece.bytes % (2 << 20), 0, "{name}: step {i}");
        assert!(a.bytes > 1 << 20, "{name}: step {i} moves a small tensor");
        let after = match s.when {
            When::BeforeLaunch => op,
            When::AfterLaunch => op + 1,
        };
        let freed = a.free.map_or(trace.ops.len(), |f| f.before_op as usize);
        if s.action == Action::SwapOut
            && trace.ops[after..freed.max(after)]
                .iter()
                .all(|o| !o.touches.contains(&(index as u32)))
        {
            dead_outs += 1;
        }
    }
    Checked {
        steps: checked,
        dead_outs,
    }
}

pub fn check_plan(name: &str, trace: &Trace, plan: &ExecPlan, instances: &[i64]) {
    // Each instance named is checked where the trace has it; the first must be in the trace
    // for the most part (a trace's last step can be cut), the others whole.
    let tails = tail_outs(name, plan);
    for (i, &k) in instances.iter().enumerate() {
        let checked = check_against_instance(name, trace, plan, k);
        if i == 0 {
            assert!(
                checked.steps * 10 >= plan.steps.len() * 8,
                "{name}: only {} of {} steps fall in instance {k}",
                checked.steps,
                plan.steps.len()
            );
        } else {
            assert_eq!(
                checked.steps,
                plan.steps.len(),
                "{name}: instance {k} is complete"
            );
        }
        // The cycle's last access is the representative instance's; another instance can
        // touch a tensor later (a stale pointer word in a kernel's parameters lands in
        // whatever allocation sits at that address: docs/planner.md), which the shim then
        // fetches on demand. Most tails are dead there too.
        if checked.steps == plan.steps.len() {
            println!(
                "{name}: instance {k}: {} swap-outs dead until the free, {tails} tail write-outs",
                checked.dead_outs
            );
            assert!(
                checked.dead_outs * 10 >= tails * 9,
                "{name}: instance {k}: {} swap-outs dead until the free, {tails} tail write-outs",
                checked.dead_outs
            );
        }
    }
    let next = plan.anchor_seq + u64::from(plan.period);
    let period = u64::from(plan.period);
    for p in &plan.host_resident {
        assert_eq!(p.offset % (2 << 20), 0, "{name}: host-resident {p:?}");
        assert_eq!(p.bytes % (2 << 20), 0, "{name}: host-resident {p:?}");
        let index = resolve(trace, p, next, period).unwrap();
        assert!(trace.allocations[index]
            .free
            .is_none_or(|f| { f.before_op as usize > op_of_seq(trace, next - 1).unwrap() }));
    }
    // Every piece written out is read back, except tails (never used again): as many
    // prefetches as swap-outs that are not tails'.
    let outs = plan
        .steps
        .iter()
        .filter(|s| s.action == Action::SwapOut)
        .count();
    assert_eq!(outs - tails, plan.steps.len() - outs, "{name}");
    assert!(plan.steps.iter().any(|s| s.when == When::AfterLaunch));
    assert_eq!(ExecPlan::decode(&plan.encode()).as_ref(), Ok(plan));
}
