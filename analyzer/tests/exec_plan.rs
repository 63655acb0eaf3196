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
use tensile_analyzer::restore::{restore, RestoreError};
use tensile_analyzer::search::{improve, SearchOptions};
use tensile_analyzer::sim::{simulate, Policy, SimOptions};
use tensile_analyzer::timeline::Footprint;
use tensile_analyzer::{Budget, CostModel};
use tensile_protocol::{Action, Iteration, Role, Step, When};

mod common_exec;
use common_exec::check_plan;

fn shared(name: &str) -> Trace {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    load(&path, LoadOptions::default()).unwrap()
}

#[test]
fn plans_for_the_shared_traces_name_the_next_iterations_allocations() {
    let cost = CostModel::default();
    // Steps by role kind over all plans: persistent, current iteration, previous iteration.
    let mut kinds = [0usize; 3];
    // Tails written out (shim pages: the shim holds a tensor until its free), over all plans.
    let mut tails_out = 0;
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
            tails_out += conversion.executed.tail_outs.len();
            println!(
                "{name} at {fraction}: {} launches, {} steps ({} tails out), {} dropped, \
                 predicted {:.2} ms (compute {:.2} ms)",
                plan.period,
                plan.steps.len(),
                conversion.executed.tail_outs.len(),
                conversion.dropped_round_trips,
                plan.predicted_step_ns as f64 / 1e6,
                plan.compute_ns as f64 / 1e6
            );
            check_plan(name, &trace, plan, &[1, -1]);
            // Restated on the cycle again (`replay --plan-from`), the plan is the one the
            // prediction was made for, up to the launch points its moves were placed on.
            let restored = restore(&trace, &cycle, plan, budget.bytes).unwrap();
            assert_eq!((restored.unplaced, restored.on_demand), (0, 0), "{name}");
            assert_eq!(
                restored.plan.evictions.len(),
                conversion.executed.evictions.len(),
                "{name} at {fraction}"
            );
            assert_eq!(
                restored.plan.tail_outs.len(),
                conversion.executed.tail_outs.len(),
                "{name} at {fraction}"
            );
            assert_eq!(
                restored.plan.host_resident.len(),
                conversion.executed.host_resident.len()
            );
            let step = simulate(
                &cycle,
                Policy::Plan(&restored.plan),
                budget,
                &cost,
                SimOptions::default(),
            )
            .unwrap()
            .step_ns;
            let ratio = step as f64 / plan.predicted_step_ns as f64;
            println!(
                "{name} at {fraction}: restored plan simulates at {ratio:.4} of the prediction"
            );
            assert!(
                (0.995..=1.005).contains(&ratio),
                "{name} at {fraction}: {ratio}"
            );
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
    assert!(tails_out > 0, "tail write-outs are exercised");
}

#[test]
fn a_plan_is_not_restated_on_another_programs_iteration() {
    let cost = CostModel::default();
    let cycle_of = |trace: &Trace| {
        let iters = detect(trace).unwrap();
        Cycle::from_trace(trace, &iters, &cost).with_units(MoveUnits::ShimPages)
    };
    let mlp = shared("mlp.trace.gz");
    let cycle = cycle_of(&mlp);
    let budget = Budget::new(Footprint::of(&cycle).peak_allocated / 2);
    let planned = plan(&cycle, &budget, &cost).unwrap();
    let exec = convert(&mlp, &cycle, &planned, &cost, 1).unwrap().plan;
    let resnet = shared("resnet50.trace.gz");
    let err = restore(&resnet, &cycle_of(&resnet), &exec, budget.bytes).unwrap_err();
    assert!(
        matches!(
            err,
            RestoreError::Kernel { .. } | RestoreError::Period { .. }
        ),
        "{err}"
    );
    // The same program, its kernels at other positions: refused by kernel.
    let mut shifted = exec.clone();
    shifted.anchor_seq += 1;
    let err = restore(&mlp, &cycle, &shifted, budget.bytes).unwrap_err();
    assert!(matches!(err, RestoreError::Kernel { .. }), "{err}");
    assert!(
        err.to_string().contains("made for another program"),
        "{err}"
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
    check_plan("synthetic", &trace, plan, &[1, -1]);
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
