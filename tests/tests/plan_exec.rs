//! The plan executor under `LD_PRELOAD`, on the simulated GPU.
//!
//! The training-like workload (`wl_train`, tensors of exactly one 2 MiB page) is traced once
//! with room to spare; a plan is built from that trace here with a simple rule and the
//! protocol's role definition (an allocation belongs to the iteration of the first launch
//! after it; its ordinal counts the earlier allocations of that iteration): every tensor of
//! at least one page leaves after the use that opens its longest gap without a launch using
//! it, and is prefetched a few launches before its next use. The plan is then executed with
//! `TENSILE_PLAN` under a budget that forces swapping: the results are bit for bit those of
//! a run without the shim, the planned moves happened (the executor's counters), and fewer
//! accesses stalled on demand than under `TENSILE_POLICY=lru` at the same budget.
//!
//! Plans that do not fit the run are harmless: one whose kernels do not match is dropped
//! with one line, one whose roles do not resolve is skipped step by step, and a corrupt plan
//! file gets one line naming it and the cause, then on-demand swapping.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tensile_protocol::plan::{
    Action, ExecPlan, Iteration, PieceRef, Role, Step, When, PLAN_FORMAT_VERSION,
};
use tensile_tests::check::read_trace;
use tensile_tests::expect::named_digests;
use tensile_tests::harness::{temp_trace, Output, Run};
use tensile_trace::{Record, Stats};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 2 * MIB;

/// The workload's shape: layers, tensor KiB (one page), iterations.
const LAYERS: u64 = 6;
const TENSOR_KIB: u64 = 2048;
const ITERATIONS: u64 = 4;
/// Launches per iteration: three per layer forward, the loss, three per layer backward.
const PERIOD: u64 = 6 * LAYERS + 1;
/// The device budget of the swapping runs: 10 of the 26 pages of the footprint. (The
/// stall counts of `lru` and the plan differ by 10 to 20% at this size, since the first
/// iteration runs without the plan and the simulated device, not the host, is the
/// bottleneck; four iterations keep the difference clear of the run-to-run noise.)
const BUDGET: &str = "20MiB";
/// How many launches ahead of the next use a prefetch is issued.
const PREFETCH_LEAD: u64 = 3;

fn train() -> Run {
    Run::new(env!("CARGO_BIN_EXE_wl_train"))
        .arg("proc:13000:0")
        .arg(LAYERS.to_string())
        .arg(TENSOR_KIB.to_string())
        .arg(ITERATIONS.to_string())
}

/// A run under the shim at [`BUDGET`], traced (for its swap statistics).
fn under_budget(policy: &str, plan: Option<&Path>, name: &str) -> (Output, Stats) {
    let (out, stats, trace) = under_budget_traced(policy, plan, name);
    let _ = std::fs::remove_file(&trace);
    (out, stats)
}

/// [`under_budget`], keeping its trace.
fn under_budget_traced(policy: &str, plan: Option<&Path>, name: &str) -> (Output, Stats, PathBuf) {
    let trace = temp_trace(name);
    let mut run = train()
        .trace(&trace)
        .env("TENSILE_POLICY", policy)
        .env("TENSILE_DEVICE_MEMORY", BUDGET)
        .env("TENSILE_LOG", "info");
    if let Some(plan) = plan {
        run = run.env("TENSILE_PLAN", plan.to_string_lossy());
    }
    let out = run.output();
    out.assert_ok(name);
    let stats = read_trace(&trace)
        .records
        .iter()
        .find_map(|r| match r {
            Record::Stats(s) => Some(s.clone()),
            _ => None,
        })
        .expect("the trace has a Stats record");
    (out, stats, trace)
}

/// `tensile replay TRACE --plan-from TRACE --json`.
fn replay_plan_from(trace: &Path) -> std::process::Output {
    std::process::Command::new(&tensile_tests::harness::artifacts().tensile)
        .arg("replay")
        .arg(trace)
        .arg("--plan-from")
        .arg(trace)
        .args(["--json", "--search-ms", "0"])
        .output()
        .expect("tensile replay")
}

/// What one traced run of the workload says about its launches and allocations.
struct Traced {
    /// Kernel id of each launch, by `seq`.
    kernels: Vec<u32>,
    /// Kernel names by id.
    names: HashMap<u32, String>,
    /// Allocation ids each launch touched, by `seq`.
    touched: Vec<Vec<u64>>,
    /// Per allocation id: bytes, the next launch's `seq` when it was made, and when it was
    /// freed (the next launch's `seq` then), in trace order.
    allocs: Vec<TracedAlloc>,
}

#[derive(Debug, Clone, Copy)]
struct TracedAlloc {
    id: u64,
    bytes: u64,
    made_before: u64,
    freed_before: Option<u64>,
}

fn read_traced(path: &Path) -> Traced {
    let mut t = Traced {
        kernels: Vec::new(),
        names: HashMap::new(),
        touched: Vec::new(),
        allocs: Vec::new(),
    };
    for r in read_trace(path).records {
        match r {
            Record::Kernel(k) => {
                t.names.insert(k.id, k.name);
            }
            Record::Launch(l) => {
                assert_eq!(l.seq, t.kernels.len() as u64, "launches numbered in order");
                t.kernels.push(l.kernel);
                t.touched.push(l.accesses.iter().map(|a| a.alloc).collect());
            }
            Record::Alloc(a) => t.allocs.push(TracedAlloc {
                id: a.id,
                bytes: a.bytes,
                made_before: t.kernels.len() as u64,
                freed_before: None,
            }),
            Record::Free(f) => {
                let n = t.kernels.len() as u64;
                if let Some(a) = t.allocs.iter_mut().find(|a| a.id == f.id) {
                    a.freed_before = Some(n);
                }
            }
            _ => {}
        }
    }
    t
}

/// The plan the simple rule makes from `t` (see the module documentation). Its anchor is
/// the second iteration: the first one's allocations include the persistent ones, so its
/// ordinals are not those of the steady state.
fn simple_plan(t: &Traced) -> ExecPlan {
    let launches = t.kernels.len() as u64;
    assert_eq!(launches, PERIOD * ITERATIONS, "launches per run");
    for s in 0..launches - PERIOD {
        assert_eq!(
            t.kernels[s as usize],
            t.kernels[(s + PERIOD) as usize],
            "launch {s}: the iteration repeats"
        );
    }
    let anchor = PERIOD;
    // Roles of the allocations: persistent ones live to the end; transient ones of the
    // anchor's iteration (iteration 1), by ordinal.
    let iteration = |made_before: u64| made_before / PERIOD;
    let mut roles: Vec<(u64, Role, u64)> = Vec::new(); // (alloc id, role, bytes)
    let mut ordinal_in: BTreeMap<u64, u32> = BTreeMap::new();
    for a in &t.allocs {
        let it = iteration(a.made_before);
        let ordinal = *ordinal_in.entry(it).and_modify(|o| *o += 1).or_insert(0);
        let persistent = a.freed_before.is_none_or(|f| f >= launches);
        let role = if persistent {
            Role::Persistent { alloc_id: a.id }
        } else if it == 1 {
            Role::Transient {
                ordinal,
                bytes: a.bytes,
                iteration: Iteration::Current,
            }
        } else {
            continue;
        };
        if a.bytes >= PAGE {
            roles.push((a.id, role, a.bytes));
        }
    }
    let mut steps = Vec::new();
    for (id, role, bytes) in roles {
        // Positions of the launches of iteration 1 that touch it.
        let uses: Vec<u64> = (PERIOD..2 * PERIOD)
            .filter(|&s| t.touched[s as usize].contains(&id))
            .map(|s| s - PERIOD)
            .collect();
        if uses.is_empty() {
            continue;
        }
        let mut gaps: Vec<(u64, u64)> = uses.windows(2).map(|w| (w[0], w[1])).collect();
        if matches!(role, Role::Persistent { .. }) {
            gaps.push((uses[uses.len() - 1], uses[0] + PERIOD));
        }
        let Some(&(last, next)) = gaps.iter().max_by_key(|(a, b)| b - a) else {
            continue;
        };
        if next - last < PREFETCH_LEAD + 2 {
            continue;
        }
        let piece = PieceRef {
            role,
            offset: 0,
            bytes,
        };
        steps.push(Step {
            position: last as u32,
            when: When::AfterLaunch,
            action: Action::SwapOut,
            piece,
        });
        steps.push(Step {
            position: ((next - PREFETCH_LEAD) % PERIOD) as u32,
            when: When::BeforeLaunch,
            action: Action::Prefetch,
            piece,
        });
    }
    steps.sort_by_key(|s| (s.position, s.when));
    let plan = ExecPlan {
        version: 1,
        period: PERIOD as u32,
        kernels: t.kernels[..PERIOD as usize].to_vec(),
        anchor_seq: anchor,
        steps,
        uses: vec![],
        host_resident: vec![],
        budget_bytes: 20 * MIB,
        predicted_step_ns: 0,
        compute_ns: 0,
    };
    plan.validate().expect("the rule makes a valid plan");
    plan
}

/// The workload without the shim (its results) and traced with room to spare.
struct Reference {
    native: Output,
    traced: Traced,
}

fn reference() -> &'static Reference {
    static REFERENCE: OnceLock<Reference> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let trace = temp_trace("plan-exec-reference");
        let (native, traced) = std::thread::scope(|s| {
            let native = s.spawn(|| train().output());
            let traced = s.spawn(|| {
                train()
                    .trace(&trace)
                    .env("TENSILE_POLICY", "lru")
                    .env("TENSILE_DEVICE_MEMORY", "1GiB")
                    .output()
            });
            (native.join().unwrap(), traced.join().unwrap())
        });
        native.assert_ok("the native run");
        traced.assert_ok("the traced run");
        assert_eq!(
            named_digests(&traced.stdout),
            named_digests(&native.stdout),
            "the traced run"
        );
        let t = read_traced(&trace);
        let _ = std::fs::remove_file(&trace);
        Reference { native, traced: t }
    })
}

fn write_plan(plan: &ExecPlan, name: &str) -> PathBuf {
    let path = temp_trace(name).with_extension("plan");
    std::fs::write(&path, plan.encode()).expect("writing the plan");
    path
}

/// The executor's counters from its line at exit.
fn executor_counters(out: &Output) -> BTreeMap<String, u64> {
    let line = out
        .stderr
        .lines()
        .find_map(|l| l.split_once("plan executor: ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no executor line at exit\n{}", out.stderr));
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .chunks(2)
        .map(|kv| (kv[0].to_owned(), kv[1].parse().expect("a count")))
        .collect()
}

fn assert_same_results(out: &Output, what: &str) {
    assert_eq!(
        named_digests(&out.stdout),
        named_digests(&reference().native.stdout),
        "{what}: results differ from the run without the shim\n{}",
        out.stderr
    );
    out.assert_quiet(what);
}

#[test]
fn a_plan_from_the_trace_moves_ahead_of_need_and_stalls_less_than_lru() {
    let r = reference();
    let plan = simple_plan(&r.traced);
    let swap_outs = plan
        .steps
        .iter()
        .filter(|s| s.action == Action::SwapOut)
        .count() as u64;
    assert!(swap_outs >= 2 * LAYERS, "{plan:?}");
    let path = write_plan(&plan, "simple");
    let ((lru, lru_stats), planned) = std::thread::scope(|s| {
        let lru = s.spawn(|| under_budget("lru", None, "plan-exec-lru"));
        let planned = s.spawn(|| under_budget_traced("plan", Some(&path), "plan-exec-plan"));
        (lru.join().unwrap(), planned.join().unwrap())
    });
    let _ = std::fs::remove_file(&path);
    let (planned, plan_stats, planned_trace) = planned;
    assert_same_results(&lru, "lru");
    assert_same_results(&planned, "plan");
    let c = executor_counters(&planned);
    // The plan applies from iteration 1 on.
    let steps = (ITERATIONS - 1) * plan.steps.len() as u64;
    assert_eq!(
        (c["plans_loaded"], c["plans_dropped"], c["mismatches"]),
        (1, 0, 0),
        "{c:?}"
    );
    assert_eq!(
        c["steps_done"] + c["steps_skipped"] + c["steps_dropped"] + c["steps_failed"],
        steps,
        "{c:?}"
    );
    assert_eq!(c["steps_skipped"] + c["steps_failed"], 0, "{c:?}");
    assert!(c["pages_out"] > 0 && c["pages_in"] > 0, "{c:?}");
    assert!(
        lru_stats.bytes_to_host > 0 && plan_stats.bytes_to_host > 0,
        "the budget forces swapping: {lru_stats:?} {plan_stats:?}"
    );
    eprintln!(
        "stalled accesses: lru {} ({:.1} ms), plan {} ({:.1} ms); executor {c:?}",
        lru_stats.stalled_launches,
        lru_stats.stall_ns as f64 / 1e6,
        plan_stats.stalled_launches,
        plan_stats.stall_ns as f64 / 1e6
    );
    assert!(
        plan_stats.stalled_launches < lru_stats.stalled_launches,
        "the plan stalled {} accesses, lru {}",
        plan_stats.stalled_launches,
        lru_stats.stalled_launches
    );
    // The run's trace holds the plan: replayed with what the run measured beside it.
    let out = replay_plan_from(&planned_trace);
    let _ = std::fs::remove_file(&planned_trace);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_str(&text).expect("replay --json");
    let from = &doc["plan_from"];
    assert_eq!(from["version"], 1, "{from}");
    assert_eq!(from["steps"], plan.steps.len(), "{from}");
    assert_eq!(from["left_out"], 0, "{from}");
    assert_eq!(doc["budget_bytes"], plan.budget_bytes, "{from}");
    // The run's plan fits the budget it was made for on the run's own iteration.
    assert!(from["fitted_budget_bytes"].is_null(), "{from}");
    let round_trips = from["round_trips"].as_u64().unwrap() + from["tails_out"].as_u64().unwrap();
    assert_eq!(
        round_trips, swap_outs,
        "every swap-out of the plan is placed: {from}"
    );
    let measured = &from["measured"];
    // Iterations 1 to 3 ran under the plan: two whole ones between their first launches.
    assert_eq!(measured["iterations"], ITERATIONS - 2, "{from}");
    assert!(measured["step_ns"].as_u64() > Some(0), "{from}");
    assert!(measured["bytes_d2h"].as_u64() > Some(0), "{from}");
    assert!(doc["predicted_ns"].as_u64() > Some(0), "{doc}");
}

#[test]
fn a_plan_whose_kernels_do_not_match_is_dropped_with_one_line() {
    let r = reference();
    let mut plan = simple_plan(&r.traced);
    // Position 4 is the second layer's `axpy`; the plan expects the launch's neighbour.
    let (expected, actual) = (plan.kernels[3], plan.kernels[4]);
    assert_ne!(expected, actual);
    plan.kernels[4] = expected;
    let path = write_plan(&plan, "mismatch");
    let (out, stats, trace) = under_budget_traced("plan", Some(&path), "plan-exec-mismatch");
    let _ = std::fs::remove_file(&path);
    // The trace says the plan was dropped; replayed, it does not fit the program.
    let replay = replay_plan_from(&trace);
    let _ = std::fs::remove_file(&trace);
    let err = String::from_utf8_lossy(&replay.stderr);
    assert!(!replay.status.success());
    assert!(
        err.contains("its plan does not fit this trace") && err.contains("position 4"),
        "{err}"
    );
    assert_same_results(&out, "mismatch");
    assert!(stats.bytes_to_host > 0, "{stats:?}");
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("plan 1 dropped"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    let want = format!(
        "plan 1 dropped at launch {} (position 4 of {PERIOD}): expected kernel `{}`, got `{}`",
        PERIOD + 4,
        r.traced.names[&expected],
        r.traced.names[&actual]
    );
    assert!(lines[0].contains(&want), "{}\nwanted: {want}", lines[0]);
    let c = executor_counters(&out);
    assert_eq!((c["mismatches"], c["plans_dropped"]), (1, 1), "{c:?}");
    // Steps at positions 0..4 of the first planned iteration may have run; none after.
    let early = plan.steps.iter().filter(|s| s.position < 4).count() as u64;
    assert!(c["steps_done"] + c["steps_skipped"] <= early, "{c:?}");
}

#[test]
fn a_plan_whose_roles_do_not_resolve_is_skipped_harmlessly() {
    let r = reference();
    let plan = simple_plan(&r.traced);
    let kernels = plan.kernels.clone();
    let piece = |role| PieceRef {
        role,
        offset: 0,
        bytes: PAGE,
    };
    let steps = vec![
        // An ordinal the iteration does not have.
        Step {
            position: 1,
            when: When::AfterLaunch,
            action: Action::SwapOut,
            piece: piece(Role::Transient {
                ordinal: 999,
                bytes: PAGE,
                iteration: Iteration::Current,
            }),
        },
        // The input's ordinal, with another size.
        Step {
            position: 2,
            when: When::BeforeLaunch,
            action: Action::Prefetch,
            piece: PieceRef {
                role: Role::Transient {
                    ordinal: 0,
                    bytes: 3 * PAGE,
                    iteration: Iteration::Current,
                },
                offset: 0,
                bytes: PAGE,
            },
        },
        // An allocation id the run never has.
        Step {
            position: 5,
            when: When::AfterLaunch,
            action: Action::SwapOut,
            piece: piece(Role::Persistent {
                alloc_id: 1_000_000,
            }),
        },
    ];
    let bad = ExecPlan {
        steps,
        kernels,
        ..plan
    };
    let path = write_plan(&bad, "unresolved");
    let (out, stats) = under_budget("plan", Some(&path), "plan-exec-unresolved");
    let _ = std::fs::remove_file(&path);
    assert_same_results(&out, "unresolved");
    assert!(stats.bytes_to_host > 0, "{stats:?}");
    let c = executor_counters(&out);
    assert_eq!(
        (c["steps_skipped"], c["steps_done"], c["mismatches"]),
        ((ITERATIONS - 1) * 3, 0, 0),
        "{c:?}"
    );
}

#[test]
fn a_corrupt_plan_file_gets_one_clear_line_and_an_lru_run() {
    reference();
    let path = temp_trace("corrupt").with_extension("plan");
    std::fs::write(&path, b"this is not a plan at all").unwrap();
    let mut other_version = simple_plan(&reference().traced).encode();
    other_version[8..10].copy_from_slice(&(PLAN_FORMAT_VERSION + 1).to_le_bytes());
    let newer = temp_trace("newer").with_extension("plan");
    std::fs::write(&newer, other_version).unwrap();
    let cases = [
        (&path, "not a libtensile plan (bad magic)".to_owned()),
        (
            &newer,
            format!(
                "plan format version {}, this libtensile reads version {PLAN_FORMAT_VERSION}",
                PLAN_FORMAT_VERSION + 1
            ),
        ),
    ];
    let runs: Vec<(Output, Stats)> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(file, _)| s.spawn(|| under_budget("plan", Some(file), "plan-exec-corrupt")))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((file, cause), (out, stats)) in cases.iter().zip(runs) {
        let _ = std::fs::remove_file(file);
        assert_same_results(&out, "corrupt");
        assert!(stats.bytes_to_host > 0, "on-demand swapping: {stats:?}");
        let want = format!(
            "TENSILE_PLAN={}: cannot use the plan: {cause}; swapping on demand (lru)",
            file.display()
        );
        let lines: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.contains("TENSILE_PLAN"))
            .collect();
        assert_eq!(lines.len(), 1, "{}", out.stderr);
        assert!(lines[0].contains(&want), "{}\nwanted: {want}", lines[0]);
        assert!(
            !out.stderr.contains("plan executor:"),
            "no plan was loaded\n{}",
            out.stderr
        );
    }
}
