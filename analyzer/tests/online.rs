//! The online learner on the shared traces, fed record by record as the shim would stream them
//! (each trace is turned into the project's own records, written with `tensile_trace::Writer`
//! and read back with its `Reader`): when the first plan comes, that it resolves on the run
//! (the shim's resolution, `common_exec`), relearning after a change of pattern, replanning on
//! drift and on a budget change, and the window's bound.

use std::path::Path;

use tensile_analyzer::import::{load, LoadOptions};
use tensile_analyzer::iteration::detect;
use tensile_analyzer::model::{CopyDir, OpKind, SyncScope, Trace};
use tensile_analyzer::online::{Learner, LearnerOptions, LearnerState};
use tensile_analyzer::timeline::Footprint;
use tensile_analyzer::{CostModel, Cycle};
use tensile_protocol::ExecPlan;
use tensile_trace::{
    Access, Alloc, AllocKind, Copy, CopyKind, Free, Header, KernelInfo, Launch, LaunchTime, Memset,
    Reader, Record, Sync, Writer,
};

mod common_exec;
use common_exec::check_plan;

fn shared(name: &str) -> Trace {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    load(&path, LoadOptions::default()).unwrap()
}

/// The records the shim would have written for `trace`, in order. Ids, launch numbers and
/// kernel ids are shifted by `shift` (to run one trace after another in one process).
fn records_of(trace: &Trace, shift: Shift) -> Vec<Record> {
    let id = |idx: u32| trace.allocations[idx as usize].trace_id + shift.ids;
    let mut out: Vec<Record> = trace
        .kernels
        .iter()
        .map(|k| {
            Record::Kernel(KernelInfo {
                id: k.id + shift.kernels,
                name: k.name.clone(),
                nparams: k.nparams,
            })
        })
        .collect();
    let mut frees: Vec<(u32, usize)> = trace
        .allocations
        .iter()
        .enumerate()
        .filter_map(|(i, a)| a.free.map(|f| (f.before_op, i)))
        .collect();
    frees.sort_by_key(|f| f.0);
    let (mut next_alloc, mut next_free, mut next_sync) = (0, 0, 0);
    for i in 0..=trace.ops.len() {
        let at = i as u32;
        while next_alloc < trace.allocations.len() && trace.allocations[next_alloc].before_op == at
        {
            let a = &trace.allocations[next_alloc];
            out.push(Record::Alloc(Alloc {
                t_ns: a.t_ns,
                stream: a.stream,
                id: a.trace_id + shift.ids,
                ptr: a.ptr,
                bytes: a.bytes,
                kind: AllocKind::Async,
            }));
            next_alloc += 1;
        }
        while next_free < frees.len() && frees[next_free].0 == at {
            let a = &trace.allocations[frees[next_free].1];
            out.push(Record::Free(Free {
                t_ns: a.free.map_or(0, |f| f.t_ns),
                stream: a.stream,
                id: a.trace_id + shift.ids,
            }));
            next_free += 1;
        }
        while next_sync < trace.syncs.len() && trace.syncs[next_sync].before_op == at {
            let s = &trace.syncs[next_sync];
            let scope = match s.scope {
                SyncScope::Stream(h) => tensile_trace::SyncScope::Stream(h),
                SyncScope::Event(h) => tensile_trace::SyncScope::Event(h),
                SyncScope::Device => tensile_trace::SyncScope::Context,
            };
            out.push(Record::Sync(Sync {
                t_ns: s.t_ns,
                scope,
            }));
            next_sync += 1;
        }
        let Some(op) = trace.ops.get(i) else { break };
        let touch = |j: usize| op.touches.get(j).map_or(0, |&t| id(t));
        match op.kind {
            OpKind::Launch { kernel } => {
                out.push(Record::Launch(Launch {
                    t_ns: op.t_ns,
                    stream: op.stream,
                    seq: op.seq + shift.seqs,
                    kernel: kernel + shift.kernels,
                    grid: [1, 1, 1],
                    block: [1, 1, 1],
                    smem: 0,
                    accesses: op
                        .touches
                        .iter()
                        .enumerate()
                        .map(|(j, &t)| Access {
                            alloc: id(t),
                            param_offset: 8 * j as u32,
                        })
                        .collect(),
                }));
                if let Some(gpu_ns) = op.gpu_ns {
                    out.push(Record::LaunchTime(LaunchTime {
                        seq: op.seq + shift.seqs,
                        gpu_ns: (gpu_ns as f64 * shift.time_scale) as u64,
                    }));
                }
            }
            OpKind::Copy { dir } => out.push(Record::Copy(Copy {
                t_ns: op.t_ns,
                stream: op.stream,
                kind: match dir {
                    CopyDir::HostToDevice => CopyKind::HostToDevice,
                    CopyDir::DeviceToHost => CopyKind::DeviceToHost,
                    CopyDir::DeviceToDevice => CopyKind::DeviceToDevice,
                    CopyDir::Any => CopyKind::Any,
                },
                dst: touch(0),
                src: touch(1),
                bytes: op.bytes,
                asynchronous: true,
            })),
            OpKind::Memset => out.push(Record::Memset(Memset {
                t_ns: op.t_ns,
                stream: op.stream,
                dst: touch(0),
                bytes: op.bytes,
                asynchronous: true,
            })),
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Shift {
    ids: u64,
    seqs: u64,
    kernels: u32,
    time_scale: f64,
}

const NO_SHIFT: Shift = Shift {
    ids: 0,
    seqs: 0,
    kernels: 0,
    time_scale: 1.0,
};

/// `records` written in the trace format, header and end included.
fn encoded(records: &[Record]) -> Vec<u8> {
    let header = Header {
        format_version: tensile_trace::FORMAT_VERSION,
        pid: 1,
        start_unix_ns: 0,
        producer: "test".into(),
        command: "test".into(),
    };
    let mut w = Writer::new(Vec::new(), &header).unwrap();
    for r in records {
        w.write(r).unwrap();
    }
    w.finish(tensile_trace::End {
        t_ns: 0,
        dropped_records: 0,
    })
    .unwrap()
}

/// The records through the trace format: written, then read back one by one.
fn through_the_format(records: &[Record]) -> Vec<Record> {
    Reader::new(&encoded(records)[..])
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

fn is_op(r: &Record) -> bool {
    matches!(r, Record::Launch(_) | Record::Copy(_) | Record::Memset(_))
}

/// Plans the learner returned while being fed `records`, with the ops fed before each, polling
/// every `poll_every` records; `after_push` sees the learner after each record.
fn feed(
    learner: &mut Learner,
    records: &[Record],
    poll_every: usize,
    mut after_push: impl FnMut(&mut Learner, &Record),
) -> Vec<(usize, ExecPlan)> {
    let mut plans = Vec::new();
    let mut ops = 0;
    for (i, r) in records.iter().enumerate() {
        learner.push(r);
        after_push(learner, r);
        ops += usize::from(is_op(r));
        if (i + 1) % poll_every == 0 {
            if let Some(plan) = learner.poll() {
                plans.push((ops, plan));
            }
        }
    }
    if let Some(plan) = learner.poll() {
        plans.push((ops, plan));
    }
    plans
}

/// Launches per iteration, as the offline analysis finds it.
fn launches_per_iteration(trace: &Trace) -> u32 {
    let iters = detect(trace).unwrap();
    trace.ops[iters.representative_span()]
        .iter()
        .filter(|op| matches!(op.kind, OpKind::Launch { .. }))
        .count() as u32
}

fn half_peak(trace: &Trace) -> u64 {
    let cost = CostModel::default();
    let iters = detect(trace).unwrap();
    let cycle = Cycle::from_trace(trace, &iters, &cost);
    Footprint::of(&cycle).peak_allocated / 2
}

#[test]
fn a_plan_comes_by_the_end_of_the_third_iteration_and_resolves_on_the_run() {
    for name in ["mlp.trace.gz", "resnet50.trace.gz", "bert.trace.gz"] {
        let trace = shared(name);
        let iters = detect(&trace).unwrap();
        let third_ends = iters.spans[2].end;
        let launches = launches_per_iteration(&trace);
        let records = through_the_format(&records_of(&trace, NO_SHIFT));
        let mut learner = Learner::new(LearnerOptions::for_budget(half_peak(&trace)));
        assert_eq!(learner.cycle_peak_bytes(), None, "{name}: no iteration yet");
        let mut polls = Vec::new();
        let mut first: Option<(usize, ExecPlan)> = None;
        let mut ops = 0;
        for (i, r) in records.iter().enumerate() {
            learner.push(r);
            ops += usize::from(is_op(r));
            if i % 100 == 0 || i + 1 == records.len() {
                let plan = learner.poll();
                if let Some(cost) = learner.last_poll_cost() {
                    polls.push(cost);
                }
                if let (Some(plan), None) = (plan, &first) {
                    first = Some((ops, plan));
                }
            }
        }
        let (at, plan) = first.unwrap_or_else(|| panic!("{name}: no plan"));
        println!(
            "{name}: plan v{} after {at} ops (third iteration ends at op {third_ends}); \
             {} launches, {} steps, predicted {:.2} ms; slowest poll: detect {:?}, plan {:?} \
             on {} ops",
            plan.version,
            plan.period,
            plan.steps.len(),
            plan.predicted_step_ns as f64 / 1e6,
            polls.iter().map(|p| p.detect).max().unwrap_or_default(),
            polls.iter().map(|p| p.plan).max().unwrap_or_default(),
            polls.iter().map(|p| p.window_ops).max().unwrap_or_default(),
        );
        // The plan comes once the third iteration has freed what the second allocated (its
        // tensors' lifetimes are then known): at its end at the latest.
        assert!(at <= third_ends, "{name}: plan after op {at}");
        assert_eq!(plan.version, 1);
        assert_eq!(plan.period, launches, "{name}");
        // The job's need, as a coordinator reads it: the iteration's peak, whole pages.
        let peak = learner.cycle_peak_bytes().expect("an iteration is known");
        let allocated = 2 * half_peak(&trace);
        assert!(
            peak >= allocated && peak <= allocated + allocated / 4,
            "{name}: peak {peak}, the iteration allocates {allocated} at most"
        );
        assert!(matches!(
            learner.state(),
            LearnerState::Planned { version: 1, .. }
        ));
        // Made from a window, the plan names the run's allocations as the shim finds them.
        check_plan(name, &trace, &plan, &[1, 2]);
    }
}

/// `tests/data/wl_train.trace.gz`: the shim's own trace of `wl_train proc:12000:0 16 3072 8`
/// (16 layers of 3 MiB tensors, 8 steps, forward and backward on two streams) run under
/// `LD_PRELOAD=libtensile.so TENSILE_TRACE=... TENSILE_POLICY=off` on the simulated GPU: its
/// records as read with the trace's own reader, and the trace as the analyzer loads it.
fn wl_train() -> (Vec<Record>, Trace) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/wl_train.trace.gz");
    let file = std::fs::File::open(&path).unwrap();
    let reader = Reader::new(flate2::read::GzDecoder::new(file)).unwrap();
    let records: Vec<Record> = reader.map(|r| r.unwrap()).collect();
    (records, load(&path, LoadOptions::default()).unwrap())
}

#[test]
fn the_shims_own_trace_read_with_its_reader_gives_a_plan_that_resolves_on_the_run() {
    let (records, trace) = wl_train();
    let third_ends = detect(&trace).unwrap().spans[2].end;
    let mut learner = Learner::new(LearnerOptions::for_budget(half_peak(&trace)));
    let plans = feed(&mut learner, &records, 50, |_, _| {});
    let (at, plan) = plans.first().expect("a plan");
    println!(
        "wl_train: plan v{} after {at} ops (third iteration ends at op {third_ends}), {} \
         launches, {} steps, predicted {:.2} ms",
        plan.version,
        plan.period,
        plan.steps.len(),
        plan.predicted_step_ns as f64 / 1e6
    );
    assert!(*at <= third_ends);
    assert_eq!(plan.period, launches_per_iteration(&trace));
    check_plan("wl_train", &trace, plan, &[1, 2]);
}

/// ResNet-50 as PyTorch trained it on an H200 under the shim (`bench/gpu/lease.sh traced`,
/// session 22, no budget). Its input batch lives a little longer than a period: the next batch
/// is copied in just before the last one is freed. The cycle calls such a tensor persistent,
/// yet each iteration's is a new allocation that no role names, so a plan cannot move it. At
/// 2 GiB of its 5.5 the planner used to send it out, the conversion dropped that move, and the
/// plan deadlocked without it: the learner made no plan at all, and the job on the card ran on
/// demand for good.
#[test]
fn a_tensor_that_outlives_its_period_stays_put_and_the_plan_runs_without_it() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/resnet50-h200-shim.trace.gz");
    let file = std::fs::File::open(&path).unwrap();
    let reader = Reader::new(flate2::read::GzDecoder::new(file)).unwrap();
    let records: Vec<Record> = reader.map(|r| r.unwrap()).collect();
    let trace = load(&path, LoadOptions::default()).unwrap();
    // The batch: 64 x 3 x 224 x 224 floats, allocated in one iteration and freed in the next.
    let batch = 64 * 3 * 224 * 224 * 4;
    let period = detect(&trace).unwrap().period;
    let outliving: Vec<_> = trace
        .allocations
        .iter()
        .filter(|a| {
            a.bytes == batch
                && a.free
                    .is_some_and(|f| (f.before_op - a.before_op) as usize > period)
        })
        .map(|a| a.trace_id)
        .collect();
    assert!(
        outliving.len() >= 5,
        "{} batches outlive a period",
        outliving.len()
    );

    let mut learner = Learner::new(LearnerOptions::for_budget(2 << 30));
    let plans = feed(&mut learner, &records, 1000, |_, _| {});
    let (at, plan) = plans.first().unwrap_or_else(|| {
        panic!("no plan at 2 GiB: {:?}", learner.state());
    });
    println!(
        "resnet50 (H200, under the shim): plan v{} after {at} ops, {} launches, {} steps, \
         {:.0} MiB out per iteration, predicted {:.2} ms",
        plan.version,
        plan.period,
        plan.steps.len(),
        plan.bytes_out_per_iteration() as f64 / (1 << 20) as f64,
        plan.predicted_step_ns as f64 / 1e6
    );
    assert!(
        plan.bytes_out_per_iteration() > 2 << 30,
        "it swaps: 5.5 GiB into 2"
    );
    // No step names a batch: it could name only one iteration's.
    let named = |id: u64| {
        plan.steps.iter().any(|s| {
            matches!(s.piece.role, tensile_protocol::Role::Persistent { alloc_id } if alloc_id == id)
        })
    };
    assert!(!outliving.iter().any(|&id| named(id)));
}

#[test]
fn a_budget_no_plan_fits_is_said_once_with_its_reason() {
    let (records, _) = wl_train();
    // 1 MiB: less than one launch of wl_train touches.
    let mut learner = Learner::new(LearnerOptions::for_budget(1 << 20));
    let plans = feed(&mut learner, &records, 50, |_, _| {});
    assert!(plans.is_empty());
    let LearnerState::NoPlan { reason } = learner.state() else {
        panic!("{:?}", learner.state());
    };
    assert_eq!(learner.take_no_plan(), Some(reason));
    assert_eq!(learner.take_no_plan(), None, "said once");
}

#[test]
fn after_a_change_of_pattern_a_new_plan_comes_within_three_iterations() {
    let mlp = shared("mlp.trace.gz");
    let bert = shared("bert.trace.gz");
    let mut records = records_of(&mlp, NO_SHIFT);
    let shift = Shift {
        ids: mlp.allocations.iter().map(|a| a.trace_id).max().unwrap(),
        seqs: mlp.ops.iter().map(|o| o.seq).max().unwrap(),
        kernels: mlp.kernels.iter().map(|k| k.id).max().unwrap() + 1,
        time_scale: 1.0,
    };
    records.extend(records_of(&bert, shift));
    let mlp_ops = mlp.ops.len();
    let bert_third_ends = detect(&bert).unwrap().spans[2].end;
    let mut learner = Learner::new(LearnerOptions::for_budget(half_peak(&bert)));
    let mut learning_at_switch = None;
    let plans = feed(&mut learner, &records, 500, |l, r| {
        if let Record::Launch(launch) = r {
            if launch.seq > shift.seqs && learning_at_switch.is_none() {
                learning_at_switch = Some(matches!(l.state(), LearnerState::Learning { .. }));
            }
        }
    });
    let (at_mlp, mlp_plan) = &plans[0];
    assert!(*at_mlp <= mlp_ops);
    let (at, bert_plan) = plans
        .iter()
        .find(|(at, _)| *at > mlp_ops)
        .expect("a plan for the new pattern");
    println!(
        "mlp plan v{} at op {at_mlp}; bert plan v{} at op {} of bert (third iteration ends at \
         {bert_third_ends})",
        mlp_plan.version,
        bert_plan.version,
        at - mlp_ops
    );
    assert_eq!(
        learning_at_switch,
        Some(true),
        "the first bert launch drops the mlp plan"
    );
    assert!(at - mlp_ops <= bert_third_ends);
    assert!(bert_plan.version > mlp_plan.version);
    assert_eq!(mlp_plan.period, launches_per_iteration(&mlp));
    assert_eq!(bert_plan.period, launches_per_iteration(&bert));
    assert!(bert_plan.kernels.iter().all(|&k| k >= shift.kernels));
    assert!(bert_plan.anchor_seq > shift.seqs);
}

#[test]
fn a_drift_in_measured_time_a_budget_change_and_more_room_each_give_a_new_version() {
    let trace = shared("mlp.trace.gz");
    let budget = half_peak(&trace);
    let plain = records_of(&trace, NO_SHIFT);
    let slow = records_of(
        &trace,
        Shift {
            time_scale: 1.5,
            ..NO_SHIFT
        },
    );
    // The first half as recorded, the rest with every launch 50% slower.
    let half = plain.len() / 2;
    let mut records = plain[..half].to_vec();
    records.extend(slow[half..].iter().cloned());
    let mut learner = Learner::new(LearnerOptions::for_budget(budget));
    let plans = feed(&mut learner, &records, 200, |_, _| {});
    assert!(plans.len() >= 2, "{} plans", plans.len());
    let (first, last) = (&plans[0].1, &plans[plans.len() - 1].1);
    println!(
        "drift: v{} assumed {:.2} ms of compute, v{} {:.2} ms",
        first.version,
        first.compute_ns as f64 / 1e6,
        last.version,
        last.compute_ns as f64 / 1e6
    );
    assert!(last.version > first.version);
    assert!(last.compute_ns as f64 > first.compute_ns as f64 * 1.3);
    // Once planned, the window keeps a few iterations (4 of 225 ops, trimmed at twice that);
    // the replan was made on a trimmed window, and its roles still resolve on the run (in
    // the two instances before the one it was made from: the trace's last step is cut).
    assert!(
        learner.window_ops() <= 2 * 4 * 225,
        "{}",
        learner.window_ops()
    );
    check_plan("mlp, replanned", &trace, last, &[-1, -2]);

    // A smaller budget: the next poll replans, once.
    let before = learner.plan().unwrap().clone();
    learner.set_budget(budget / 2);
    let replanned = learner.poll().expect("a plan for the new budget");
    assert_eq!(replanned.version, before.version + 1);
    assert_eq!(replanned.budget_bytes, budget / 2);
    assert!(replanned.bytes_out_per_iteration() > before.bytes_out_per_iteration());
    // Made on the window as trimmed at the end of the trace (fewer ops than the trace had).
    assert!(
        learner.window_ops() < trace.ops.len() * 2 / 3,
        "{}",
        learner.window_ops()
    );
    check_plan("mlp, smaller budget", &trace, &replanned, &[-1, -2]);
    assert_eq!(learner.poll(), None);

    // More room left free: the next poll replans, once, for the budget less the room.
    learner.set_room(0.1);
    assert_eq!(learner.room(), 0.1);
    let roomier = learner.poll().expect("a plan leaving the room");
    assert_eq!(roomier.version, replanned.version + 1);
    assert!(
        roomier.budget_bytes <= budget / 2 - budget / 20,
        "{} of {}",
        roomier.budget_bytes,
        budget / 2
    );
    assert!(roomier.bytes_out_per_iteration() > replanned.bytes_out_per_iteration());
    check_plan("mlp, more room", &trace, &roomier, &[-1, -2]);
    learner.set_room(0.1);
    assert_eq!(learner.poll(), None, "the same room again replans nothing");
    let replanned = roomier;

    // Lost records: learning again, and a plan again from what follows.
    learner.lost_records(10);
    assert!(matches!(learner.state(), LearnerState::Learning { .. }));
    // What follows: the same loop again, with new allocation ids and launch numbers.
    let more = records_of(
        &trace,
        Shift {
            ids: 1 << 32,
            seqs: 1 << 32,
            ..NO_SHIFT
        },
    );
    let again = feed(&mut learner, &more, 500, |_, _| {});
    assert!(again.iter().any(|(_, p)| p.version > replanned.version));
}

#[test]
fn the_window_stays_within_its_bound_while_learning() {
    let trace = shared("mlp.trace.gz");
    let records = records_of(&trace, NO_SHIFT);
    let options = LearnerOptions {
        // Less than two iterations of 225 ops: nothing can be learned.
        max_window_ops: 400,
        ..LearnerOptions::for_budget(half_peak(&trace))
    };
    let mut learner = Learner::new(options);
    let plans = feed(&mut learner, &records, 100, |l, _| {
        let LearnerState::Learning { window_ops } = l.state() else {
            panic!("{:?}", l.state());
        };
        assert!(window_ops <= 400);
    });
    assert!(plans.is_empty());
}

/// A coordinator joined mid-run is told the live allocations while some of their records are
/// still on their way, so a live stream can announce an allocation twice: the second is
/// refused, the first keeps its id (its free and the launches that touch it still find it),
/// and a plan comes as without the repeat.
#[test]
fn an_allocation_announced_twice_while_live_is_refused_and_a_plan_still_comes() {
    let (records, trace) = wl_train();
    // Every allocation live a third of the way in, announced again there.
    let cut = records.len() / 3;
    let mut live: Vec<Alloc> = Vec::new();
    for r in &records[..cut] {
        match r {
            Record::Alloc(a) => live.push(a.clone()),
            Record::Free(f) => live.retain(|a| a.id != f.id),
            _ => {}
        }
    }
    assert!(!live.is_empty());
    let freed_later = live
        .iter()
        .filter(|a| {
            records[cut..]
                .iter()
                .any(|r| matches!(r, Record::Free(f) if f.id == a.id))
        })
        .count();
    assert!(
        freed_later > 0,
        "some of them must be freed after the repeat"
    );
    let mut repeated = records[..cut].to_vec();
    repeated.extend(live.into_iter().map(Record::Alloc));
    repeated.extend_from_slice(&records[cut..]);

    // The search bounded by its count of plans, not by the clock, so that both learners
    // search alike on a loaded machine.
    let options = || {
        let mut o = LearnerOptions::for_budget(half_peak(&trace));
        o.search.time_limit = std::time::Duration::from_secs(600);
        o.search.patience = None;
        o.search.max_evaluations = 64;
        o
    };
    let mut learner = Learner::new(options());
    let plans = feed(&mut learner, &repeated, 50, |_, _| {});
    let (_, plan) = plans.first().expect("a plan despite the repeat");
    let mut clean = Learner::new(options());
    let clean_plans = feed(&mut clean, &records, 50, |_, _| {});
    let (_, clean_plan) = clean_plans.first().expect("a plan");
    assert_eq!(plan.period, clean_plan.period);
    assert_eq!(plan.steps.len(), clean_plan.steps.len());
}

/// A learner told to leave room plans within the budget less the room (and less the partial
/// last pages, as without room), and a budget too small for any plan with the room left free
/// is planned without it rather than not at all.
#[test]
fn a_plan_leaves_the_room_it_is_told_to_free_unless_nothing_would_fit() {
    let (records, trace) = wl_train();
    let budget = half_peak(&trace);
    let first_plan = |room: f64, budget: u64| {
        let mut learner = Learner::new(LearnerOptions {
            room,
            ..LearnerOptions::for_budget(budget)
        });
        let plans = feed(&mut learner, &records, 50, |_, _| {});
        plans.into_iter().next().map(|(_, p)| p)
    };
    let without = first_plan(0.0, budget).expect("a plan without room");
    let with = first_plan(0.25, budget).expect("a plan with room");
    assert!(without.budget_bytes <= budget);
    assert!(
        with.budget_bytes <= budget - budget / 4,
        "{} of {budget}",
        with.budget_bytes
    );
    assert!(
        with.bytes_out_per_iteration() >= without.bytes_out_per_iteration(),
        "less room, no fewer moves"
    );
    check_plan("wl_train with room", &trace, &with, &[1, 2]);

    // The smallest budget the planner plans at all: with 90% of it left free nothing fits,
    // so the plan fills it.
    let cycle_budgets = |room: f64, b: u64| {
        let iters = detect(&trace).unwrap();
        let cycle = Cycle::from_trace(&trace, &iters, &CostModel::default());
        tensile_analyzer::online::budgets_to_try(&cycle, b, room)
    };
    let budgets = cycle_budgets(0.9, budget);
    assert!(budgets.len() >= 2, "{budgets:?}");
    assert!(budgets[0].bytes <= budget / 10 + 1, "{budgets:?}");
    assert_eq!(budgets.last().unwrap().bytes, budget, "{budgets:?}");
    let squeezed = first_plan(0.9, budget).expect("a plan, without the room if need be");
    assert!(
        squeezed.budget_bytes > budget / 10,
        "{}",
        squeezed.budget_bytes
    );

    // A budget the whole cycle fits as it is: no room is left (nothing need move), and the
    // plan moves nothing. Just below that, the room is left again.
    // (The learner's cycle: in the shim's pages, tails included.)
    let options = LearnerOptions::for_budget(budget);
    let cycle = Cycle::from_trace(&trace, &detect(&trace).unwrap(), &options.cost)
        .with_units(options.units)
        .with_page_bytes(options.page_bytes);
    let cycle_budgets =
        |room: f64, b: u64| tensile_analyzer::online::budgets_to_try(&cycle, b, room);
    let live = tensile_analyzer::timeline::Liveness::of(&cycle);
    let held = tensile_analyzer::timeline::held_bytes(&cycle, &live);
    let fits = *held.iter().max().unwrap() + cycle.page_tail_waste();
    let budgets = cycle_budgets(0.2, fits);
    assert_eq!(budgets, cycle.plan_budgets(fits), "no room where all fits");
    let plan = first_plan(0.2, fits).expect("a plan");
    assert_eq!(plan.bytes_out_per_iteration(), 0, "all fits: nothing moves");
    let short = cycle_budgets(0.2, fits - (fits / 20));
    assert!(
        short[0].bytes <= fits - fits / 20 - (fits - fits / 20) / 5 + 1,
        "room where not all fits: {short:?}"
    );
}

/// The trace the analyzer loads from `records` (through the format).
fn trace_of(records: &[Record]) -> Trace {
    tensile_analyzer::import::read_tensile(&encoded(records)[..], "test", false, &mut || {})
        .unwrap()
}

/// A program's first steps are often not its steady state: `tensile rerun` makes the tensors
/// its played steps need in the first of them, an optimizer makes its state in the first step.
/// A plan learned from such a step names tensors by their ordinal among its allocations, so in
/// every later step it names others (in an MLP rerun, 968 of 1042 uses per step named the
/// wrong allocation, and a fifth of the steps none). The learner plans from an instance whose
/// allocations the next one makes too.
#[test]
fn a_step_that_allocates_more_than_the_next_is_not_planned_from() {
    let clean = shared("mlp.trace.gz");
    let iters = detect(&clean).unwrap();
    let records = records_of(&clean, NO_SHIFT);
    // Early in each of the first two iterations, a few more allocations (freed after the next
    // op), more in the second: no instance before the third is like the one after it.
    let extra_at = [
        (iters.spans[0].start + 3, 2u64),
        (iters.spans[1].start + 3, 5),
    ];
    let mut changed = Vec::with_capacity(records.len() + 20);
    let (mut ops, mut pending_frees) = (0usize, Vec::new());
    let mut next_id = 1u64 << 40;
    for r in &records {
        if is_op(r) {
            if let Some(&(_, n)) = extra_at.iter().find(|(at, _)| *at == ops) {
                for _ in 0..n {
                    changed.push(Record::Alloc(Alloc {
                        t_ns: 0,
                        stream: 0,
                        id: next_id,
                        ptr: next_id,
                        bytes: 1 << 20,
                        kind: AllocKind::Async,
                    }));
                    pending_frees.push(next_id);
                    next_id += 1;
                }
                changed.push(r.clone());
                changed.extend(pending_frees.drain(..).map(|id| {
                    Record::Free(Free {
                        t_ns: 0,
                        stream: 0,
                        id,
                    })
                }));
                ops += 1;
                continue;
            }
            ops += 1;
        }
        changed.push(r.clone());
    }
    let records = through_the_format(&changed);
    let trace = trace_of(&records);
    let mut learner = Learner::new(LearnerOptions::for_budget(half_peak(&clean)));
    let plans = feed(&mut learner, &records, 100, |_, _| {});
    let (_, plan) = plans.first().expect("a plan");
    // Every step resolves, in the run's terms, on every later iteration the trace holds whole.
    let changed_until = trace.ops[..iters.spans[1].end + 10]
        .iter()
        .filter(|op| matches!(op.kind, OpKind::Launch { .. }))
        .map(|op| op.seq)
        .max()
        .unwrap();
    let first = (0..)
        .find(|&k| plan.anchor_seq + k * u64::from(plan.period) > changed_until)
        .unwrap() as i64;
    check_plan("mlp, longer first steps", &trace, plan, &[first, first + 1]);
}
