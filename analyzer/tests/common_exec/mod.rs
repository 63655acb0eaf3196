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

/// Checks `plan` against the instance of the iteration `k` iterations after the one it was
/// made from. Launches past the end of the trace (its last step can be cut) are skipped;
/// returns how many steps were checked.
pub fn check_against_instance(name: &str, trace: &Trace, plan: &ExecPlan, k: i64) -> usize {
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
    }
    checked
}

pub fn check_plan(name: &str, trace: &Trace, plan: &ExecPlan, instances: &[i64]) {
    // Each instance named is checked where the trace has it; the first must be in the trace
    // for the most part (a trace's last step can be cut), the others whole.
    for (i, &k) in instances.iter().enumerate() {
        let checked = check_against_instance(name, trace, plan, k);
        if i == 0 {
            assert!(
                checked * 10 >= plan.steps.len() * 8,
                "{name}: only {checked} of {} steps fall in instance {k}",
                plan.steps.len()
            );
        } else {
            assert_eq!(
                checked,
                plan.steps.len(),
                "{name}: instance {k} is complete"
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
    // Every piece written out is read back: as many prefetches as swap-outs.
    let outs = plan
        .steps
        .iter()
        .filter(|s| s.action == Action::SwapOut)
        .count();
    assert_eq!(outs * 2, plan.steps.len(), "{name}");
    assert!(plan.steps.iter().any(|s| s.when == When::AfterLaunch));
    assert_eq!(ExecPlan::decode(&plan.encode()).as_ref(), Ok(plan));
}
