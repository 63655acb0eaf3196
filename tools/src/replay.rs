//! `tensile replay`: simulate a trace under swap policies for a memory budget.
//!
//! Loads a trace (either format, gzipped or not), learns its iteration, and for each requested
//! policy prints the predicted step time, copies, stalls and peak residency next to the lower
//! bound for the budget. `--json` prints the same as one JSON object (one policy) or an array of
//! objects (several policies); `--plot` writes an SVG of the footprint. All the modelling is in
//! `tensile-analyzer`; this module parses arguments and formats results.

mod plan_from;
mod plot;
mod timeline;

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tensile_analyzer::bound::LowerBound;
use tensile_analyzer::cost::{format_bytes, parse_size, CostModel};
use tensile_analyzer::cycle::MoveUnits;
use tensile_analyzer::exec_plan;
use tensile_analyzer::import::{load_with_progress, LoadOptions};
use tensile_analyzer::model::SourceFormat;
use tensile_analyzer::schedule_bound::{ops_per_phase, DEFAULT_MAX_VARIABLES};
use tensile_analyzer::search::{SearchOptions, DEFAULT_SEARCH_MS};
use tensile_analyzer::timeline::Liveness;
use tensile_analyzer::{
    analyze, evaluate_many_with, Analysis, BoundOptions, Budget, Evaluation, PolicyKind, Trace,
};

/// Arguments of `tensile replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// Trace file (the project's format or capture format v1, gzipped or not).
    pub trace: PathBuf,
    /// Device memory budget: bytes with a unit (4GiB, 512MiB, 6GB) or a percentage of the
    /// steady-state iteration's peak allocated bytes (50%). With --plan-from, the plan's own
    /// budget unless given.
    #[arg(long, required_unless_present = "plan_from")]
    pub budget: Option<String>,
    /// Policies to simulate: plan, lru, none, or several (repeat the flag, separate with commas,
    /// or say `all`).
    #[arg(long, value_delimiter = ',', default_value = "plan")]
    pub policy: Vec<String>,
    /// Host-to-device bandwidth in GB/s (one direction active).
    #[arg(long, default_value_t = 55.0)]
    pub h2d_gbps: f64,
    /// Device-to-host bandwidth in GB/s (one direction active).
    #[arg(long, default_value_t = 55.0)]
    pub d2h_gbps: f64,
    /// Total bandwidth in GB/s with both directions active at once.
    #[arg(long, default_value_t = 92.0)]
    pub bidir_gbps: f64,
    /// Also charge each 2 MiB page moved what the driver's VMM calls cost the shim to remap
    /// it on the H100 (docs/gpu-results.md), as the library's planner and `tensile rerun` do:
    /// for the TENSILE_SWAPPED and TENSILE_HOST_UNITS of the environment, the per-mapping
    /// terms shared by the pages of units the size of the trace's tensors, cut as a plan's
    /// run cuts them (with host units, from 157 µs in and 205 out for one-page units to 24
    /// in and 48 out for 8-page ones).
    /// Without it, moves cost their copies alone.
    #[arg(long)]
    pub page_remaps: bool,
    /// Print JSON: one object for one policy, an array of objects for several.
    #[arg(long)]
    pub json: bool,
    /// Plot the footprint, the budget and each policy's residency to this file: a PNG image
    /// for a name ending in .png, an SVG drawing for .svg.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write the plan itself to this file as JSON: the pieces it moves (tensor, offset,
    /// bytes), every round trip (after which op a piece leaves, at which op its read-back is
    /// issued, which op needs it), and the cycle's tensors (identity and size). Needs the
    /// `plan` policy.
    #[arg(long)]
    pub plan_out: Option<PathBuf>,
    /// Write one simulated steady-state iteration per policy to this file as a Chrome
    /// trace-event timeline (Perfetto, chrome://tracing): compute, each copy engine, stalls, and
    /// the bytes on the device as a counter.
    #[arg(long)]
    pub timeline: Option<PathBuf>,
    /// Show a progress indicator while reading even when stderr is not a terminal.
    #[arg(long)]
    pub progress: bool,
    /// Analyze the complete part of a truncated trace instead of refusing it.
    #[arg(long)]
    pub allow_truncated: bool,
    /// Largest linear program the lower bound's schedule term may solve, in variables (0: leave
    /// that term out). Larger is tighter and slower: the MLP trace's exact LP has 82k variables
    /// and takes about 15 s; the default solves in a few seconds where it applies.
    #[arg(long, default_value_t = DEFAULT_MAX_VARIABLES)]
    pub lp_variables: usize,
    /// Most milliseconds the local search after the planner may spend improving the plan, each
    /// change priced by the simulator (0: no search). It stops earlier when the plan reaches
    /// the lower bound, or once it has gone 30 ms, and twice as long as its last gain took,
    /// without finding a shorter step. Longer finds more on copy-bound traces
    /// (docs/replay-results.md lists what each limit gained).
    #[arg(long, default_value_t = DEFAULT_SEARCH_MS)]
    pub search_ms: u64,
    /// Seed of the local search's choices (same seed, same evaluations: same plan).
    #[arg(long, default_value_t = 1)]
    pub search_seed: u64,
    /// Plan in the units the shim moves: whole 2 MiB pages (tensors of at most 1 MiB and the
    /// partial last page of a larger one stay on the device), so that the prediction counts
    /// what the shim will move; and run `lru` as the shim's manager does (page by page, with
    /// its free reserve, the host launching ahead). Implied by --emit-plan.
    #[arg(long)]
    pub shim_pages: bool,
    /// Write the plan for the budget to this file as the shim executes it (an encoded
    /// ExecPlan: launch positions, allocations by role), for `TENSILE_PLAN=FILE`. Plans in
    /// whole pages (--shim-pages); needs the `plan` policy.
    #[arg(long)]
    pub emit_plan: Option<PathBuf>,
    /// Replay the plan a recorded run used instead of planning: the last plan loaded in
    /// RUN.trace (written with TENSILE_TRACE under TENSILE_POLICY=plan; usually the trace
    /// replayed), simulated as the `plan` policy, with what the run measured under it beside.
    #[arg(long, value_name = "RUN.trace")]
    pub plan_from: Option<PathBuf>,
}

/// Files at least this large get a progress indicator on a terminal.
const PROGRESS_MIN_BYTES: u64 = 4 << 20;

/// Runs `tensile replay`.
pub fn run(args: ReplayArgs) -> Result<(), String> {
    let out = render(&args)?;
    print!("{out}");
    Ok(())
}

/// Does the work of `tensile replay` and returns what it prints.
fn render(args: &ReplayArgs) -> Result<String, String> {
    let mut policies = parse_policies(&args.policy)?;
    // The run's plan first: a run without one is said before any planning.
    let run_plan = match &args.plan_from {
        Some(run) => {
            if !policies.contains(&PolicyKind::Plan) {
                policies.insert(0, PolicyKind::Plan);
            }
            Some(plan_from::read(run)?)
        }
        None => None,
    };
    if let Some(path) = &args.plot {
        plot::format_for(path)?;
    }
    if args.plan_out.is_some() && !policies.contains(&PolicyKind::Plan) {
        return Err("--plan-out needs the plan policy (--policy plan)".into());
    }
    if args.emit_plan.is_some() && !policies.contains(&PolicyKind::Plan) {
        return Err("--emit-plan needs the plan policy (--policy plan)".into());
    }
    let copies = CostModel {
        h2d_gbps: args.h2d_gbps,
        d2h_gbps: args.d2h_gbps,
        bidir_gbps: args.bidir_gbps,
        ..CostModel::default()
    };
    copies.validate()?;
    let trace = load(args)?;
    let mut analysis =
        analyze(&trace, &copies).map_err(|e| format!("{}: {e}", args.trace.display()))?;
    let cost = if args.page_remaps {
        // What the library's planner charges, for the settings a run here would have.
        let config = tensile_shim::config::Config::from_env().0;
        let remaps =
            tensile_shim::planning::page_remaps(config.swapped_unmapped, config.host_frames);
        // Units as a plan's run cuts them (the LRU's are larger: `tensile rerun` prices each
        // policy's own).
        let page = tensile_analyzer::cycle::PAGE_BYTES;
        let per_unit = analysis
            .cycle
            .pages_per_unit(page, tensile_analyzer::SHIM_PLAN_UNIT_PAGES);
        copies.with_page_remaps(remaps.per_page(per_unit, page))
    } else {
        copies
    };
    if args.shim_pages || args.emit_plan.is_some() || run_plan.is_some() {
        // As the shim runs a plan: whole pages, and nothing it cannot name moves.
        let immovable = exec_plan::unnameable(&trace, &analysis.cycle);
        analysis.cycle = analysis
            .cycle
            .with_units(MoveUnits::ShimPages)
            .with_immovable(immovable);
    }
    if let Some(rp) = &run_plan {
        // A plan moves whole pages of the shim's: a scaled run's pages are smaller.
        analysis.cycle = analysis.cycle.with_page_bytes(rp.page_bytes);
    }
    let peak = analysis.footprint.peak_allocated;
    let budget = match (&args.budget, &run_plan) {
        (Some(b), _) => {
            Budget::new(parse_size(b, Some(peak)).map_err(|e| format!("--budget {e}"))?)
        }
        (None, Some(rp)) => Budget::new(rp.plan.budget_bytes),
        (None, None) => return Err("--budget is required".into()),
    };
    let bound_options = BoundOptions {
        lp_max_variables: args.lp_variables,
        // An explicit request for a large LP is honoured however coarse its phases.
        lp_max_ops_per_phase: lp_max_ops_per_phase(args),
    };
    if args.progress || std::io::stderr().is_terminal() {
        // The schedule LP of the bound can take seconds; say what the wait is for.
        eprintln!(
            "tensile: planning, simulating and bounding (the bound's LP may take a few seconds)"
        );
    }
    // With --plan-from the planner's plan only gives the bound: the run's plan replaces it, so
    // no time goes on searching around it.
    let search_ms = if run_plan.is_some() {
        0
    } else {
        args.search_ms
    };
    let search = SearchOptions {
        time_limit: std::time::Duration::from_millis(search_ms),
        seed: args.search_seed,
        ..SearchOptions::default()
    };
    let mut results = evaluate_many_with(
        &analysis.cycle,
        &policies,
        budget,
        &cost,
        &bound_options,
        &search,
    )
    .map_err(|(policy, e)| format!("policy {}: {e}", policy_name(policy)))?;
    let restored = match &run_plan {
        Some(rp) => {
            let restored = plan_from::restate(rp, &trace, &analysis.cycle)?;
            // Without --budget, a plan that does not fit its own budget on this iteration is
            // replayed at the least that fits, and the output says how much that is: the
            // measure of how differently the run's planner saw the iteration.
            let widen = args.budget.is_none();
            let (report, fitted) =
                plan_from::simulate(&analysis.cycle, &restored, budget, &cost, widen).map_err(
                    |e| {
                        format!(
                            "--plan-from {}: the run's plan, simulated at {} on this trace's \
                             iteration: {e} (the run's planner saw the iteration otherwise{})",
                            rp.run.display(),
                            format_bytes(budget.bytes),
                            if widen {
                                ", and no budget up to twice the iteration's peak fits it"
                            } else {
                                "; without --budget, replay finds the least budget that fits it"
                            }
                        )
                    },
                )?;
            if let Some(r) = results.iter_mut().find(|r| r.policy == PolicyKind::Plan) {
                r.report = report;
                r.plan = Some(restored.plan.clone());
                r.search = None;
            }
            Some((rp, restored, fitted))
        }
        None => None,
    };
    if let Some(path) = &args.plan_out {
        let plan = results
            .iter()
            .find_map(|r| r.plan.as_ref())
            .ok_or("no plan was made")?;
        let tensors: Vec<Value> = analysis
            .cycle
            .tensors
            .iter()
            .map(|t| json!({ "identity": t.identity, "bytes": t.bytes }))
            .collect();
        let doc = json!({
            "trace": args.trace.display().to_string(),
            "plan": plan,
            "tensors": tensors,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let emitted = match &args.emit_plan {
        Some(path) => Some(emit_plan(path, &trace, &analysis, &results, &cost)?),
        None => None,
    };
    if let Some(path) = &args.timeline {
        let doc = timeline::timeline_json(&analysis.cycle, &results);
        std::fs::write(path, doc.to_string() + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        plot::write(path, &analysis, budget, &results, &args.trace)?;
    }
    if args.json {
        let objects: Vec<Value> = results
            .iter()
            .map(|r| {
                let mut o = json_object(args, &trace, &analysis, budget, r);
                if let (Some((rp, restored, fitted)), PolicyKind::Plan) = (&restored, r.policy) {
                    o["plan_from"] = plan_from::json(rp, restored, *fitted);
                }
                o
            })
            .collect();
        let out = if objects.len() == 1 {
            objects.into_iter().next().unwrap_or(Value::Null)
        } else {
            Value::Array(objects)
        };
        let mut text = serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?;
        text.push('\n');
        // The JSON on stdout stays one document; where the plan went is said on stderr.
        if let Some(line) = emitted {
            eprintln!("{line}");
        }
        Ok(text)
    } else {
        let mut text = human(args, &trace, &analysis, budget, &results);
        if let Some((rp, restored, fitted)) = &restored {
            text.push_str(&plan_from::human(rp, restored, *fitted));
        }
        if let Some(line) = emitted {
            text.push_str(&line);
            text.push('\n');
        }
        Ok(text)
    }
}

/// Writes the plan of `results` as the shim executes it to `path`; returns the line that says
/// what was written.
fn emit_plan(
    path: &std::path::Path,
    trace: &Trace,
    analysis: &Analysis,
    results: &[Evaluation],
    cost: &CostModel,
) -> Result<String, String> {
    let plan = results
        .iter()
        .find_map(|r| r.plan.as_ref())
        .ok_or("no plan was made")?;
    let conversion = exec_plan::convert(trace, &analysis.cycle, plan, cost, 1)
        .map_err(|e| format!("--emit-plan: {e}"))?;
    let exec = &conversion.plan;
    std::fs::write(path, exec.encode())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let dropped = match conversion.dropped_round_trips {
        0 => String::new(),
        n => format!(" ({n} moves left out: between launches, or of tensors no role names)"),
    };
    Ok(format!(
        "exec plan  written to {}: version {}, {} launches per iteration from launch {}, {} \
         steps{dropped}, {} out per iteration, {} host-resident pieces; predicted step {} \
         (compute {})",
        path.display(),
        exec.version,
        exec.period,
        exec.anchor_seq,
        exec.steps.len(),
        format_bytes(exec.bytes_out_per_iteration()),
        exec.host_resident.len(),
        ms(exec.predicted_step_ns),
        ms(exec.compute_ns),
    ))
}

/// The coarsest phases the bound's LP may use: an explicit request for a large LP is
/// honoured however coarse its phases.
fn lp_max_ops_per_phase(args: &ReplayArgs) -> u32 {
    if args.lp_variables > DEFAULT_MAX_VARIABLES {
        u32::MAX
    } else {
        BoundOptions::default().lp_max_ops_per_phase
    }
}

fn parse_policies(values: &[String]) -> Result<Vec<PolicyKind>, String> {
    let mut out = Vec::new();
    for v in values {
        if v.trim().eq_ignore_ascii_case("all") {
            out.extend([PolicyKind::Plan, PolicyKind::Lru, PolicyKind::None]);
            continue;
        }
        out.push(
            v.parse::<PolicyKind>()
                .map_err(|e| format!("--policy: {e}"))?,
        );
    }
    let mut seen = Vec::new();
    out.retain(|p| {
        let fresh = !seen.contains(p);
        seen.push(*p);
        fresh
    });
    if out.is_empty() {
        return Err("--policy: no policy given".into());
    }
    Ok(out)
}

fn policy_name(p: PolicyKind) -> &'static str {
    match p {
        PolicyKind::Plan => "plan",
        PolicyKind::Lru => "lru",
        PolicyKind::None => "none",
    }
}

fn load(args: &ReplayArgs) -> Result<Trace, String> {
    let size = std::fs::metadata(&args.trace)
        .map_err(|e| format!("cannot read {}: {e}", args.trace.display()))?
        .len();
    let show = args.progress || (std::io::stderr().is_terminal() && size >= PROGRESS_MIN_BYTES);
    let options = LoadOptions {
        allow_truncated: args.allow_truncated,
    };
    // Due at the first tick, then every 200 ms.
    let mut last = Instant::now()
        .checked_sub(Duration::from_secs(1))
        .unwrap_or_else(Instant::now);
    let mut shown = false;
    let mut progress = |done: u64, total: u64| {
        if show && last.elapsed() >= Duration::from_millis(200) {
            last = Instant::now();
            shown = true;
            let pct = if total == 0 {
                100.0
            } else {
                done as f64 * 100.0 / total as f64
            };
            eprint!("\rreading {}: {pct:5.1}%", args.trace.display());
        }
    };
    let result = load_with_progress(&args.trace, options, &mut progress);
    if shown {
        eprintln!("\rreading {}: done  ", args.trace.display());
    }
    result.map_err(|e| e.to_string())
}

fn ms(ns: u64) -> String {
    format!("{:.2} ms", ns as f64 / 1e6)
}

fn format_name(f: SourceFormat) -> &'static str {
    match f {
        SourceFormat::CaptureV1 => "capture v1",
        SourceFormat::Tensile => "tensile",
    }
}

fn human(
    args: &ReplayArgs,
    trace: &Trace,
    analysis: &Analysis,
    budget: Budget,
    results: &[Evaluation],
) -> String {
    // Byte quantities use the unit their magnitude calls for (B, KiB, MiB, GiB), so the
    // MiB-sized traces of simulated workloads do not all read "0.00 GiB"; `--json` keeps bytes.
    let bytes = format_bytes;
    let mut out = String::new();
    let it = &analysis.iterations;
    let fp = &analysis.footprint;
    let cycle = &analysis.cycle;
    let _ = writeln!(
        out,
        "trace      {} ({}, {} ops{})",
        args.trace.display(),
        format_name(trace.format),
        trace.ops.len(),
        if trace.complete {
            ""
        } else {
            ", no clean end marker"
        }
    );
    let _ = writeln!(
        out,
        "iterations {} of {} ops (steady state: iteration {} counting from 0, ops {}..{})",
        it.spans.len(),
        it.period,
        // Counted from 0, as `steady_state_iteration` in --json and `iteration_starts` index.
        it.representative,
        cycle.span.start,
        cycle.span.end
    );
    let _ = writeln!(
        out,
        "memory     peak {} allocated, {} holding data; budget {} ({:.1}% of peak)",
        bytes(fp.peak_allocated),
        bytes(fp.peak_needed),
        bytes(budget.bytes),
        budget.bytes as f64 * 100.0 / fp.peak_allocated.max(1) as f64
    );
    let bound = results.iter().find_map(|r| r.bound);
    let _ = match bound {
        Some(b) => writeln!(
            out,
            "time       compute {} per iteration; lower bound {} ({:.2}x compute)",
            ms(b.compute_ns),
            ms(b.bound_ns),
            b.bound_ns as f64 / b.compute_ns.max(1) as f64
        ),
        None => writeln!(
            out,
            "time       compute {} per iteration; no plan fits this budget (an op touches more)",
            ms(cycle.compute_ns())
        ),
    };
    match bound.map(|b| (b.schedule, b.max_excess_bytes)) {
        Some((Some(s), _)) => {
            let _ = writeln!(
                out,
                "bound      schedule LP {} ({} variables, phases of {} op{}, solved in {:.1} s)",
                ms(s.bound_ns),
                s.variables,
                s.ops_per_phase,
                if s.ops_per_phase == 1 { "" } else { "s" },
                s.solve_ms as f64 / 1e3
            );
        }
        Some((None, excess)) if excess > 0 && args.lp_variables > 0 => {
            if let Some(b) = &bound {
                let reason = lp_left_out_reason(args, analysis, b);
                let _ = writeln!(out, "bound      schedule LP {reason}");
            }
        }
        _ => {}
    }
    if cycle.estimated_launches > 0 {
        let _ = writeln!(
            out,
            "note       {} launches had no measured duration: used their kernel's median, or {} µs",
            cycle.estimated_launches,
            tensile_analyzer::cost::DEFAULT_LAUNCH_NS / 1000
        );
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "{:<6} {:>12} {:>9} {:>12} {:>11} {:>11} {:>14}  budget",
        "policy", "step", "vs bound", "stall", "H2D/iter", "D2H/iter", "peak resident"
    );
    for r in results {
        let rep = &r.report;
        let vs = bound
            .map(|b| format!("{:.3}x", rep.step_ns as f64 / b.bound_ns.max(1) as f64))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:<6} {:>12} {:>9} {:>12} {:>11} {:>11} {:>14}  {}",
            policy_name(r.policy),
            ms(rep.step_ns),
            vs,
            ms(rep.stall_ns),
            bytes(rep.bytes_h2d),
            bytes(rep.bytes_d2h),
            bytes(rep.peak_resident_bytes),
            if rep.fits {
                "kept"
            } else {
                "EXCEEDED (would run out of memory)"
            }
        );
    }
    for r in results {
        let rep = &r.report;
        if !rep.settled {
            let _ = writeln!(
                out,
                "{}: did not settle: no iteration-boundary state repeated in {} iterations; \
                 the step is the average of the last {}",
                policy_name(r.policy),
                rep.step_ns_per_cycle.len(),
                rep.steady_iterations
            );
        } else if rep.steady_iterations > 1 {
            let _ = writeln!(
                out,
                "{}: the steady state repeats every {} iterations (from iteration {}); the step \
                 is their average",
                policy_name(r.policy),
                rep.steady_iterations,
                rep.settled_after
            );
        }
        if let Some(s) = r.search {
            let _ = writeln!(
                out,
                "{}: local search {} ms, {} plans simulated, {} kept: {} -> {}",
                policy_name(r.policy),
                s.elapsed_ms,
                s.evaluations,
                s.accepted,
                s.start_step_ns.map_or_else(|| "-".into(), ms),
                s.step_ns.map_or_else(|| "-".into(), ms),
            );
        }
    }
    out
}

/// Why the bound has no schedule LP term although data exceeds the budget: the analyzer
/// leaves it out when nothing has to move, when the LP is too large, or when it is not solved.
fn lp_left_out_reason(args: &ReplayArgs, analysis: &Analysis, bound: &LowerBound) -> String {
    if bound.min_moved_bytes == 0 {
        return "not needed: the bytes over the budget belong to tensors the iteration never \
                touches, which stay off the device without any copy"
            .into();
    }
    let live = Liveness::of(&analysis.cycle);
    let max_ops = lp_max_ops_per_phase(args);
    match ops_per_phase(&live, args.lp_variables, max_ops) {
        None => format!(
            "left out: larger than --lp-variables {} allows at phases of at most {} ops \
             (a larger value may tighten the bound, slowly)",
            args.lp_variables,
            if max_ops == u32::MAX {
                "all".to_string()
            } else {
                max_ops.to_string()
            }
        ),
        Some(_) => "left out: the solver did not reach an optimum (set TENSILE_LP_VERBOSE=1 to \
                    see its log)"
            .into(),
    }
}

fn json_object(
    args: &ReplayArgs,
    trace: &Trace,
    analysis: &Analysis,
    budget: Budget,
    r: &Evaluation,
) -> Value {
    let rep = &r.report;
    let it = &analysis.iterations;
    json!({
        "trace": args.trace.display().to_string(),
        "format": format_name(trace.format),
        "policy": policy_name(r.policy),
        "iterations": it.spans.len(),
        "period_ops": it.period,
        "iteration_starts": it.starts(),
        "steady_state_iteration": it.representative,
        "peak_bytes": analysis.footprint.peak_allocated,
        "peak_needed_bytes": analysis.footprint.peak_needed,
        "budget_bytes": budget.bytes,
        "compute_ns": rep.compute_ns,
        "predicted_ns": rep.step_ns,
        "lower_bound_ns": r.bound.map(|b| b.bound_ns),
        "trivial_bound_ns": r.bound.map(|b| b.trivial_ns),
        "schedule_bound_ns": r.bound.and_then(|b| b.schedule).map(|s| s.bound_ns),
        "schedule_ops_per_phase": r.bound.and_then(|b| b.schedule).map(|s| s.ops_per_phase),
        "bytes_h2d": rep.bytes_h2d,
        "bytes_d2h": rep.bytes_d2h,
        "stall_ns": rep.stall_ns,
        "peak_resident_bytes": rep.peak_resident_bytes,
        "fits_budget": rep.fits,
        "demand_fetches": rep.demand_fetches,
        "settled": rep.settled,
        "steady_iterations": rep.steady_iterations,
        "search_ms": r.search.map(|s| s.elapsed_ms),
        "search_start_ns": r.search.and_then(|s| s.start_step_ns),
        "evictions": r.plan.as_ref().map(|p| p.evictions.len()),
        "estimated_launches": analysis.cycle.estimated_launches,
        "default_launch_ns": tensile_analyzer::cost::DEFAULT_LAUNCH_NS,
        "h2d_gbps": args.h2d_gbps,
        "d2h_gbps": args.d2h_gbps,
        "bidir_gbps": args.bidir_gbps,
        "page_remaps": args.page_remaps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReplayArgs,
    }

    fn args(extra: &[&str]) -> ReplayArgs {
        let trace = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../analyzer/tests/data/mlp.trace.gz"
        );
        let mut argv = vec!["replay", trace];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).expect("valid arguments").args
    }

    const CONTRACT_KEYS: [&str; 10] = [
        "iterations",
        "peak_bytes",
        "budget_bytes",
        "compute_ns",
        "predicted_ns",
        "lower_bound_ns",
        "bytes_h2d",
        "bytes_d2h",
        "stall_ns",
        "policy",
    ];

    #[test]
    fn json_has_the_contract_keys_with_consistent_values() {
        let out = render(&args(&["--budget", "50%", "--json"])).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        for key in CONTRACT_KEYS {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["policy"], "plan");
        assert_eq!(v["iterations"], 8);
        let peak = v["peak_bytes"].as_u64().unwrap();
        assert_eq!(
            v["budget_bytes"].as_u64().unwrap(),
            (peak as f64 * 0.5).round() as u64
        );
        let predicted = v["predicted_ns"].as_u64().unwrap();
        let compute = v["compute_ns"].as_u64().unwrap();
        let bound = v["lower_bound_ns"].as_u64().unwrap();
        let stall = v["stall_ns"].as_u64().unwrap();
        assert!(compute <= bound && bound <= predicted);
        assert!(
            predicted.abs_diff(compute + stall) <= 2,
            "step = compute + stall"
        );
        assert!(v["bytes_h2d"].as_u64().unwrap() > 0 && v["bytes_d2h"].as_u64().unwrap() > 0);
        assert!(v["peak_resident_bytes"].as_u64().unwrap() <= v["budget_bytes"].as_u64().unwrap());
    }

    #[test]
    fn several_policies_give_an_array_in_the_order_asked() {
        let out = render(&args(&[
            "--budget", "3GiB", "--policy", "lru,none", "--json",
        ]))
        .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        let items = v.as_array().expect("an array");
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["policy"], "lru");
        assert_eq!(items[1]["policy"], "none");
        assert_eq!(items[0]["budget_bytes"], 3u64 << 30);
        assert_eq!(items[1]["bytes_h2d"], 0);
        assert_eq!(items[1]["predicted_ns"], items[1]["compute_ns"]);
        assert_eq!(items[1]["fits_budget"], false);
    }

    #[test]
    fn human_output_has_a_row_per_policy() {
        let out = render(&args(&["--budget", "75%", "--policy", "all"])).unwrap();
        for policy in ["plan", "lru", "none"] {
            assert!(
                out.lines().any(|l| l.starts_with(policy)),
                "no {policy} row in\n{out}"
            );
        }
        assert!(out.contains("iterations 8 of 225 ops"), "{out}");
        assert!(out.contains("lower bound"), "{out}");
    }

    #[test]
    fn plot_is_an_svg_with_the_curves() {
        let path = std::env::temp_dir().join(format!("replay-plot-{}.svg", std::process::id()));
        let p = path.to_string_lossy().into_owned();
        render(&args(&[
            "--budget", "50%", "--policy", "plan,lru", "--plot", &p,
        ]))
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for label in [
            "budget",
            "plan: on device",
            "lru: on device",
            "swapped out",
            "GiB",
        ] {
            assert!(svg.contains(label), "no {label:?} in the plot");
        }
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn plan_out_writes_the_plan_the_simulator_ran() {
        let path = std::env::temp_dir().join(format!("replay-plan-{}.json", std::process::id()));
        let p = path.to_string_lossy().into_owned();
        let out = render(&args(&["--budget", "50%", "--json", "--plan-out", &p])).unwrap();
        let summary: Value = serde_json::from_str(&out).unwrap();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let _ = std::fs::remove_file(&path);
        let plan = &doc["plan"];
        let pieces = plan["pieces"].as_array().unwrap();
        let tensors = doc["tensors"].as_array().unwrap();
        let evictions = plan["evictions"].as_array().unwrap();
        assert_eq!(
            summary["evictions"].as_u64().unwrap() as usize,
            evictions.len()
        );
        assert!(!evictions.is_empty());
        // Every piece lies inside its tensor, and the pieces of a tensor tile it.
        let mut covered = vec![0u64; tensors.len()];
        for piece in pieces {
            let t = piece["tensor"].as_u64().unwrap() as usize;
            let (off, bytes) = (
                piece["offset"].as_u64().unwrap(),
                piece["bytes"].as_u64().unwrap(),
            );
            assert_eq!(off, covered[t], "pieces of tensor {t} out of order");
            covered[t] += bytes;
        }
        for (t, tensor) in tensors.iter().enumerate() {
            assert_eq!(covered[t], tensor["bytes"].as_u64().unwrap(), "tensor {t}");
        }
        let period = plan["period"].as_u64().unwrap();
        for e in evictions {
            assert!((e["piece"].as_u64().unwrap() as usize) < pieces.len());
            assert!(e["out_after"].as_u64().unwrap() < period);
            assert!(e["fetch_at"].as_u64().unwrap() < period);
        }
        let lru_only = render(&args(&[
            "--budget",
            "50%",
            "--policy",
            "lru",
            "--plan-out",
            &p,
        ]));
        assert!(lru_only.unwrap_err().contains("needs the plan policy"));
    }

    #[test]
    fn emit_plan_writes_an_exec_plan_the_shim_can_decode() {
        let path = std::env::temp_dir().join(format!("replay-exec-{}.plan", std::process::id()));
        let p = path.to_string_lossy().into_owned();
        let out = render(&args(&["--budget", "50%", "--emit-plan", &p])).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let plan = tensile_protocol::ExecPlan::decode(&bytes).unwrap();
        assert_eq!(plan.version, 1);
        // The MLP's steady step: 221 launches (and 4 copies).
        assert_eq!(plan.period, 221);
        assert!(!plan.steps.is_empty());
        assert!(plan.predicted_step_ns >= plan.compute_ns);
        let line = out.lines().find(|l| l.starts_with("exec plan")).unwrap();
        assert!(line.contains(&p), "{line}");
        assert!(
            line.contains(&format!("{} steps", plan.steps.len())),
            "{line}"
        );
        // Whole pages only, and the row of the plan policy is the plan that was written.
        for s in &plan.steps {
            assert_eq!(s.piece.offset % (2 << 20), 0);
            assert_eq!(s.piece.bytes % (2 << 20), 0);
        }
        let row = out.lines().find(|l| l.starts_with("plan")).unwrap();
        assert!(row.contains(&ms(plan.predicted_step_ns)), "{row}\n{line}");
        let lru_only = render(&args(&[
            "--budget",
            "50%",
            "--policy",
            "lru",
            "--emit-plan",
            &p,
        ]));
        assert!(lru_only.unwrap_err().contains("needs the plan policy"));
    }

    #[test]
    fn bad_arguments_and_files_are_clear_errors() {
        let err = render(&args(&["--budget", "lots"])).unwrap_err();
        assert!(err.contains("--budget"), "{err}");
        let err = render(&args(&["--budget", "1GiB", "--policy", "fifo"])).unwrap_err();
        assert!(err.contains("unknown policy"), "{err}");
        let err = render(&args(&["--budget", "1MiB"])).unwrap_err();
        assert!(err.contains("alone touches"), "{err}");
        let mut a = args(&["--budget", "1GiB"]);
        a.trace = PathBuf::from("/nonexistent.trace");
        assert!(render(&a).unwrap_err().contains("cannot read"));
    }

    /// A small training loop in the project's own format: 6 steps of 8 launches over two
    /// parameters of 256 `unit`s and per-step activations of 128 `unit`s, gzipped.
    fn own_format_trace(unit: u64) -> PathBuf {
        use std::io::Write as _;
        use tensile_trace::{
            Access, Alloc, AllocKind, End, Free, Header, KernelInfo, Launch, LaunchTime, Record,
            Writer, FORMAT_VERSION,
        };
        let header = Header {
            format_version: FORMAT_VERSION,
            pid: 1,
            start_unix_ns: 0,
            producer: "replay test".into(),
            command: "train".into(),
        };
        let mut w = Writer::new(Vec::new(), &header).unwrap();
        let mut t = 0u64;
        let mut seq = 0u64;
        let mut next_id = 3u64;
        for k in 0..8u32 {
            let name = format!("kernel{k}");
            w.write(&Record::Kernel(KernelInfo {
                id: k,
                name,
                nparams: 2,
            }))
            .unwrap();
        }
        for (id, bytes) in [(1u64, 256 * unit), (2, 256 * unit)] {
            let alloc = Alloc {
                t_ns: t,
                stream: 0,
                id,
                ptr: id << 32,
                bytes,
                kind: AllocKind::Sync,
            };
            w.write(&Record::Alloc(alloc)).unwrap();
        }
        for _step in 0..6 {
            let mut acts = Vec::new();
            for k in 0..8u32 {
                t += 1000;
                let id = next_id;
                next_id += 1;
                let alloc = Alloc {
                    t_ns: t,
                    stream: 0,
                    id,
                    ptr: id << 32,
                    bytes: 128 * unit,
                    kind: AllocKind::Async,
                };
                w.write(&Record::Alloc(alloc)).unwrap();
                acts.push(id);
                let mut accesses = vec![Access {
                    alloc: id,
                    param_offset: 0,
                }];
                accesses.push(Access {
                    alloc: 1 + u64::from(k % 2),
                    param_offset: 8,
                });
                if k >= 4 {
                    // "Backward": reads the activation of the mirrored forward launch.
                    accesses.push(Access {
                        alloc: acts[7 - k as usize],
                        param_offset: 16,
                    });
                }
                let launch = Launch {
                    t_ns: t,
                    stream: 0,
                    seq,
                    kernel: k,
                    grid: [1, 1, 1],
                    block: [128, 1, 1],
                    smem: 0,
                    accesses,
                };
                w.write(&Record::Launch(launch)).unwrap();
                w.write(&Record::LaunchTime(LaunchTime {
                    seq,
                    gpu_ns: 2_000_000,
                }))
                .unwrap();
                seq += 1;
            }
            for id in acts {
                w.write(&Record::Free(Free {
                    t_ns: t,
                    stream: 0,
                    id,
                }))
                .unwrap();
            }
        }
        let bytes = w
            .finish(End {
                t_ns: t + 1,
                dropped_records: 0,
            })
            .unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).unwrap();
        let path =
            std::env::temp_dir().join(format!("replay-own-{}-{unit}.tnsl.gz", std::process::id()));
        std::fs::write(&path, gz.finish().unwrap()).unwrap();
        path
    }

    #[test]
    fn reads_the_projects_own_format() {
        let path = own_format_trace(1 << 20);
        let mut a = args(&["--budget", "50%", "--policy", "plan,lru", "--json"]);
        a.trace = path.clone();
        let out = render(&a).unwrap();
        let _ = std::fs::remove_file(path);
        let v: Value = serde_json::from_str(&out).unwrap();
        let plan = &v.as_array().unwrap()[0];
        assert_eq!(plan["format"], "tensile");
        assert_eq!(plan["iterations"], 6);
        assert_eq!(plan["period_ops"], 8);
        assert_eq!(plan["compute_ns"], 16_000_000);
        // Two 256 MiB parameters and eight 128 MiB activations at the peak.
        assert_eq!(plan["peak_bytes"], (512u64 + 8 * 128) << 20);
        assert!(plan["fits_budget"].as_bool().unwrap());
        assert!(plan["predicted_ns"].as_u64().unwrap() >= plan["lower_bound_ns"].as_u64().unwrap());
    }

    #[test]
    fn small_traces_print_bytes_in_a_readable_unit() {
        // Parameters of 256 KiB, activations of 128 KiB: the peak is 1.50 MiB.
        let path = own_format_trace(1 << 10);
        let mut a = args(&["--budget", "50%", "--policy", "all"]);
        a.trace = path.clone();
        let human = render(&a).unwrap();
        a.json = true;
        let json = render(&a).unwrap();
        let _ = std::fs::remove_file(path);
        assert!(!human.contains("0.00 GiB"), "{human}");
        assert!(
            human.contains("peak 1.50 MiB allocated"),
            "peak not in MiB:\n{human}"
        );
        assert!(human.contains("budget 768.00 KiB"), "{human}");
        let none = human.lines().find(|l| l.starts_with("none")).unwrap();
        assert!(none.contains(" 0 B "), "no copies under none: {none}");
        assert!(none.contains("1.50 MiB"), "peak resident of none: {none}");
        // JSON keys and units are unchanged: plain bytes.
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v[0]["peak_bytes"], (512u64 + 8 * 128) << 10);
        assert_eq!(v[0]["budget_bytes"], (512u64 + 8 * 128) << 9);
        assert_eq!(v[2]["bytes_h2d"], 0);
    }

    #[test]
    fn policies_parse() {
        assert_eq!(
            parse_policies(&["all".into()]).unwrap(),
            vec![PolicyKind::Plan, PolicyKind::Lru, PolicyKind::None]
        );
        assert_eq!(
            parse_policies(&["lru".into(), "LRU".into(), "plan".into()]).unwrap(),
            vec![PolicyKind::Lru, PolicyKind::Plan]
        );
        assert!(parse_policies(&["nope".into()]).is_err());
    }

    #[test]
    fn text_and_json_count_the_steady_state_iteration_alike() {
        let text = render(&args(&["--budget", "50%"])).unwrap();
        let json: Value =
            serde_json::from_str(&render(&args(&["--budget", "50%", "--json"])).unwrap()).unwrap();
        let n = json["steady_state_iteration"].as_u64().unwrap();
        assert!(
            text.contains(&format!("steady state: iteration {n} counting from 0")),
            "{text}"
        );
    }

    /// A 4-op cycle over four 10 MiB tensors, beside a 400 MiB tensor no op touches.
    fn idle_tensor_trace() -> std::path::PathBuf {
        let mut lines = vec!["# capture v1".to_string()];
        lines.extend((1..=4).map(|k| format!("N {k} 2 kern{k}")));
        for i in 1..=4u64 {
            lines.push(format!("A {i} (nil) {i} {:#x} {}", i << 32, 10u64 << 20));
        }
        lines.push(format!("A 5 (nil) 9 {:#x} {}", 9u64 << 32, 400u64 << 20));
        let mut t = 10;
        for seq in 0..32u64 {
            let k = seq % 4 + 1;
            lines.push(format!("K {t} (nil) {seq} {k} 1,1,1 1,1,1 0 {k}@0"));
            lines.push(format!("D {seq} 1000000"));
            t += 10;
        }
        lines.push("# end".into());
        let path = std::env::temp_dir().join(format!("replay-idle-{}.trace", std::process::id()));
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    }

    #[test]
    fn lp_message_says_nothing_must_move_when_the_excess_is_untouched() {
        let path = idle_tensor_trace();
        let argv = ["replay", path.to_str().unwrap(), "--budget", "50%"];
        let out = render(&Cli::try_parse_from(argv).unwrap().args).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(out.contains("iterations 8 of 4 ops"), "{out}");
        assert!(out.contains("schedule LP not needed"), "{out}");
        assert!(!out.contains("--lp-variables"), "{out}");
    }

    #[test]
    fn lp_message_names_the_variable_limit_only_when_it_is_the_cause() {
        let out = render(&args(&["--budget", "50%", "--lp-variables", "10"])).unwrap();
        assert!(
            out.contains("schedule LP left out: larger than --lp-variables 10 allows"),
            "{out}"
        );
    }
}
