//! The executable plan agrees with the shim's view of the run: every step of a plan converted
//! for the shared traces, resolved the way the shim resolves it (by the protocol's definition,
//! written out again here, independently of `exec_plan`) against the instance of the
//! iteration after the one the plan was made from, names an allocation of the right size that
//! is live at that launch; and the plan's kernels are that instance's launches.

use std::path::Path;
use std::time::Duration;

use tensile_analyzer::cycle::{Cycle, MoveUnits};
use tensile_analyzer::exec_plan::convert;
use tensile_analyzer::import::{load, LoadOptions};
use tensile_analyzer::iteration::detect;
use tensile_analyzer::model::{AllocIdx, Allocation, FreeEvent, Op, OpKind, SourceFormat, Trace};
use tensile_analyzer::plan::plan;
use tensile_analyzer::search::{improve, SearchOptions};
use tensile_analyzer::timeline::Footprint;
use tensile_analyzer::{Budget, CostModel};
use tensile_protocol::{Action, ExecPlan, Iteration, PieceRef, Role, Step, When};

fn shared(name: &str) -> Trace {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    load(&path, LoadOptions::default()).unwrap()
}

/// The trace's op index of the launch numbered `seq`.
fn op_of_seq(trace: &Trace, seq: u64) -> Option<usize> {
    trace
        .ops
        .iter()
        .position(|op| matches!(op.kind, OpKind::Launch { .. }) && op.seq == seq)
}

/// The shim's resolution: the allocation a piece names at the launch numbered `seq` of an
/// iteration whose first launch is numbered `iteration_start` (`period` launches each).
fn resolve(
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
fn check_against_instance(name: &str, trace: &Trace, plan: &ExecPlan, k: i64) -> usize {
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

fn check_plan(name: &str, trace: &Trace, plan: &ExecPlan) {
    // The instance after the plan's (where the shim applies it), and the one before (complete
    // in every shared trace, where the last step may be cut).
    let after = check_against_instance(name, trace, plan, 1);
    let before = check_against_instance(name, trace, plan, -1);
    assert_eq!(
        before,
        plan.steps.len(),
        "{name}: the instance before is complete"
    );
    assert!(
        after * 10 >= plan.steps.len() * 8,
        "{name}: only {after} of {} steps fall in the trace's next instance",
        plan.steps.len()
    );
    let next = plan.anchor_seq + u64::from(plan.period);
    let period = u64::from(plan.period);
    for p in &plan.host_resident {
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

#[test]
fn plans_for_the_shared_traces_name_the_next_iterations_allocations() {
    let cost = CostModel::default();
    // Steps by role kind over all plans: persistent, current iteration, previous iteration.
    let mut kinds = [0usize; 3];
    for name in ["mlp.trace.gz", "resnet50.trace.gz", "bert.trace.gz"] {
        let trace = shared(name);
        let iters = detect(&trace).unwrap();
        assert!(iters.representative + 1 < iters.spans.len());
        let cycle = Cycle::from_trace(&trace, &iters, &cost).with_units(MoveUnits::ShimPages);
        let peak = Footprint::of(&cycle).peak_allocated;
        for fraction in [0.5, 0.3] {
            let budget = Budget::new((peak as f64 * fraction) as u64);
            let planned = plan(&cycle, &budget, &cost).unwrap();
            // A short deterministic search: it moves write-outs later than the access that
            // opens their gap, which the conversion must follow.
            let search = SearchOptions {
                time_limit: Duration::from_secs(30),
                patience: None,
                max_evaluations: 150,
                ..SearchOptions::default()
            };
            let (searched, _) = improve(&cycle, &planned, budget, &cost, &search);
            let conversion = convert(&trace, &cycle, &searched, &cost, 1).unwrap();
            let plan = &conversion.plan;
            println!(
                "{name} at {fraction}: {} launches, {} steps, {} dropped, predicted {:.2} ms \
                 (compute {:.2} ms)",
                plan.period,
                plan.steps.len(),
                conversion.dropped_round_trips,
                plan.predicted_step_ns as f64 / 1e6,
                plan.compute_ns as f64 / 1e6
            );
            check_plan(name, &trace, plan);
            for s in &plan.steps {
                kinds[match s.piece.role {
                    Role::Persistent { .. } => 0,
                    Role::Transient {
                        iteration: Iteration::Current,
                        ..
                    } => 1,
                    Role::Transient {
                        iteration: Iteration::Previous,
                        ..
                    } => 2,
                }] += 1;
            }
        }
    }
    println!("steps naming persistent, current, previous allocations: {kinds:?}");
    // Iterations start where the footprint is lowest, so that few tensors outlive them: the
    // shared traces' plans name no previous iteration's allocation (the synthetic test does).
    assert!(
        kinds[0] > 0 && kinds[1] > 0,
        "persistent and transient roles are exercised"
    );
}

/// A training loop of 8 launches and a memset per step whose gradient-like tensor `g` is
/// allocated before launch 7 and freed after launch 4 of the next step; iterations start at
/// launch 1, where the footprint is lowest, so `g`'s round trip across the boundary is read
/// back in the iteration after its allocation's.
fn wrapping_trace(steps: u64) -> Trace {
    const MIB: u64 = 1 << 20;
    let mut trace = Trace::new(SourceFormat::Tensile);
    let mut next_id = 1u64;
    let mut seq = 1u64;
    let mut alloc = |trace: &mut Trace, bytes: u64| -> AllocIdx {
        let before_op = trace.ops.len() as u32;
        trace.allocations.push(Allocation {
            trace_id: next_id,
            ptr: next_id << 32,
            bytes,
            stream: 0,
            t_ns: u64::from(before_op),
            before_op,
            free: None,
        });
        next_id += 1;
        (trace.allocations.len() - 1) as AllocIdx
    };
    let free = |trace: &mut Trace, a: AllocIdx| {
        let before_op = trace.ops.len() as u32;
        trace.allocations[a as usize].free = Some(FreeEvent {
            t_ns: u64::from(before_op),
            before_op,
        });
    };
    let mut op = |trace: &mut Trace, kind: OpKind, touches: &[AllocIdx]| {
        let mut touches = touches.to_vec();
        touches.sort_unstable();
        let launch = matches!(kind, OpKind::Launch { .. });
        trace.ops.push(Op {
            kind,
            t_ns: trace.ops.len() as u64,
            stream: 0,
            seq: if launch { seq } else { 0 },
            bytes: if launch { 0 } else { 32 * MIB },
            touches,
            gpu_ns: launch.then_some(2_000_000),
        });
        if launch {
            seq += 1;
        }
    };
    let k = |kernel| OpKind::Launch { kernel };
    let p = alloc(&mut trace, 48 * MIB);
    let mut g_prev: Option<AllocIdx> = None;
    for _ in 0..steps {
        op(&mut trace, k(1), &[p]);
        let a = alloc(&mut trace, 32 * MIB);
        op(&mut trace, k(2), &[a]);
        op(&mut trace, k(3), &[a]);
        match g_prev {
            Some(g) => {
                op(&mut trace, k(4), &[a, g]);
                free(&mut trace, g);
            }
            None => op(&mut trace, k(4), &[a]),
        }
        let t = alloc(&mut trace, 32 * MIB);
        op(&mut trace, OpKind::Memset, &[a]);
        op(&mut trace, k(5), &[a, t]);
        op(&mut trace, k(6), &[a, t]);
        free(&mut trace, t);
        let g = alloc(&mut trace, 32 * MIB);
        op(&mut trace, k(7), &[g]);
        op(&mut trace, k(8), &[a, g]);
        free(&mut trace, a);
        g_prev = Some(g);
    }
    trace.complete = true;
    trace
}

#[test]
fn a_tensor_that_outlives_its_iteration_is_named_in_the_previous_iteration() {
    let cost = CostModel::default();
    let trace = wrapping_trace(8);
    let iters = detect(&trace).unwrap();
    let cycle = Cycle::from_trace(&trace, &iters, &cost).with_units(MoveUnits::ShimPages);
    let planned = plan(&cycle, &Budget::new(64 << 20), &cost).unwrap();
    let conversion = convert(&trace, &cycle, &planned, &cost, 7).unwrap();
    let plan = &conversion.plan;
    assert_eq!(plan.version, 7);
    assert_eq!(plan.period, 8);
    assert_eq!(conversion.dropped_round_trips, 0);
    // Position 0 is launch 1 (the footprint's low point) of some step.
    assert_eq!(plan.kernels, vec![1, 2, 3, 4, 5, 6, 7, 8]);
    check_plan("synthetic", &trace, plan);
    let g_steps: Vec<&Step> = plan
        .steps
        .iter()
        .filter(|s| matches!(s.piece.role, Role::Transient { ordinal: 2, .. }))
        .collect();
    // `g` (the third allocation of an iteration) leaves after launch 8, its last use in its
    // own iteration, and comes back in the next one, before launch 4 at the latest.
    assert!(g_steps.iter().any(|s| s.action == Action::SwapOut
        && s.when == When::AfterLaunch
        && s.position == 7
        && matches!(
            s.piece.role,
            Role::Transient {
                iteration: Iteration::Current,
                ..
            }
        )));
    assert!(g_steps.iter().any(|s| s.action == Action::Prefetch
        && s.position <= 3
        && matches!(
            s.piece.role,
            Role::Transient {
                iteration: Iteration::Previous,
                ..
            }
        )));
}
