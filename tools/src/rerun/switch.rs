//! `tensile rerun TRACE --then TRACE2`: a program that changes what it runs, as one switching
//! from training to evaluation, to another input shape or another model does. The player plays
//! the first trace's script, checks every stamp, frees what it held, then plays the second's
//! in the same process (its recorded kernels renamed, so they are other kernels). Under
//! `--policy plan`, the plan learned for the first stops matching at the switch; the run
//! measures how many of the second's iterations began before a plan for it was in force
//! (issue 11: back to planned within 3), and each iteration's time beside the plan in force.
//!
//! The figures per phase are the player's (step times) and the library's trace (its `Plan`
//! records: which plan was loaded, from which launch it applied, when it was dropped); there is
//! no baseline run, so bytes moved are the whole run's, not per iteration.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};
use tensile_analyzer::cost::format_bytes;
use tensile_analyzer::PolicyKind;
use tensile_trace::{PlanChangeKind, Reader, Record};

use super::{
    failed_runs, median, ms, policy_name, predict, predictions_json, print_json, steps, Phase,
    PolicyCosts, Predicted, RerunArgs, Session,
};

/// One trace of a switching rerun, with how its moves are priced.
pub(super) struct Played<'a> {
    pub phase: &'a Phase,
    pub costs: &'a PolicyCosts,
}

/// A plan as the library's trace records it: loaded, in force from a launch, until dropped or
/// replaced.
#[derive(Debug, Clone, PartialEq)]
struct PlanSpan {
    version: u64,
    /// Launches the process had made when the plan was loaded.
    loaded_at: u64,
    /// The launch from which it applies (an iteration boundary of the learner's).
    applies_from: u64,
    /// The launch at which it was dropped or replaced (`None`: in force to the end).
    until: Option<u64>,
    /// Why it was dropped, where it was.
    dropped: Option<String>,
}

/// The plans a run's trace records, in the order they were loaded.
fn plan_spans(trace: &Path) -> Result<Vec<PlanSpan>, String> {
    let reader = Reader::open(trace)
        .map_err(|e| format!("cannot read the trace {}: {e}", trace.display()))?;
    let mut spans: Vec<PlanSpan> = Vec::new();
    for record in reader {
        let Ok(Record::Plan(change)) = record else {
            continue;
        };
        match change.change {
            PlanChangeKind::Loaded { applies_from, .. } => {
                // A plan loaded while another is in force replaces it where it applies.
                if let Some(last) = spans.last_mut().filter(|s| s.until.is_none()) {
                    last.until = Some(applies_from.max(last.applies_from));
                }
                spans.push(PlanSpan {
                    version: change.version,
                    loaded_at: change.launches,
                    applies_from,
                    until: None,
                    dropped: None,
                });
            }
            PlanChangeKind::Dropped { reason } => {
                if let Some(span) = spans.iter_mut().rev().find(|s| s.version == change.version) {
                    span.until = Some(change.launches.min(span.until.unwrap_or(u64::MAX)));
                    span.dropped = Some(reason);
                }
            }
        }
    }
    Ok(spans)
}

/// One trace's part of one run: its iterations and which plan governed them.
#[derive(Debug, Clone, PartialEq)]
struct PhaseTimeline {
    /// Median of the measured iterations (after the warm-up), trace time.
    step_ns: u64,
    /// Every played iteration, warm-up included, trace time.
    iteration_ns: Vec<u64>,
    /// The plan in force over all of each iteration, if one was.
    iteration_plan: Vec<Option<u64>>,
    /// The first plan that governed launches of this trace's.
    first_plan: Option<FirstPlan>,
}

/// The first plan in force during a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FirstPlan {
    version: u64,
    /// The launch it applied from.
    applies_from: u64,
    /// How many of the trace's iterations (warm-up included) began before it.
    iterations_before: u32,
}

/// What the player's result for one phase (`phase`) and the library's plans say about it.
/// `started_at` is the launches made before the phase (by the traces before it).
fn timeline(
    phase: &Value,
    started_at: u64,
    spans: &[PlanSpan],
    trace_time: impl Fn(u64) -> u64,
) -> PhaseTimeline {
    let numbers = |key: &str| -> Vec<u64> {
        phase[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    // The launches made before each iteration, and after the last (before the final check).
    let bounds = numbers("iteration_launches");
    let (starts, ends) = match bounds.split_last() {
        Some((_, starts)) => (starts, &bounds[1..]),
        None => (&bounds[..], &bounds[..]),
    };
    let ended = phase["launches"].as_u64().unwrap_or(0);
    let iteration_plan = starts
        .iter()
        .zip(ends)
        .map(|(&start, &end)| {
            spans
                .iter()
                .rev()
                .find(|s| s.applies_from <= start && s.until.is_none_or(|u| u >= end))
                .map(|s| s.version)
        })
        .collect();
    // A plan the learner made from the trace before may arrive after the switch: dropped at
    // its first launch, it never governed this trace's.
    let first_plan = spans
        .iter()
        .filter(|s| s.until.is_none_or(|u| u > s.applies_from))
        .find(|s| s.applies_from >= started_at && s.applies_from < ended)
        .map(|s| FirstPlan {
            version: s.version,
            applies_from: s.applies_from,
            iterations_before: starts.iter().filter(|&&st| st < s.applies_from).count() as u32,
        });
    PhaseTimeline {
        step_ns: trace_time(median(&steps(phase))),
        iteration_ns: numbers("iteration_ns")
            .into_iter()
            .map(trace_time)
            .collect(),
        iteration_plan,
        first_plan,
    }
}

/// One managed run over both traces.
struct SwitchRun {
    policy: PolicyKind,
    verified: bool,
    stamps_checked: u64,
    failure: Option<String>,
    /// Per trace, in play order (empty when a stamp failed).
    phases: Vec<PhaseTimeline>,
    plans: Vec<PlanSpan>,
    /// The library's lines on the plans it learned and dropped.
    plans_learned: Vec<String>,
    /// Bytes each way over the whole run, at the traces' sizes.
    run_bytes: (u64, u64),
}

impl Session {
    /// One run of both scripts under the library with `policy`.
    fn managed_switch(&self, policy: PolicyKind) -> Result<SwitchRun, String> {
        let name = policy_name(policy);
        self.announce_managed(policy, ", both traces");
        let env = self.managed_env(policy);
        let trace = self.trace_path(name);
        let out = self.run_player(None, &env, Some(&trace), name, self.log_path(name))?;
        let stamps_checked = out.json["stamps_checked"].as_u64().unwrap_or(0);
        if out.json["verified"] != Value::Bool(true) {
            let message = out.json["message"].as_str().unwrap_or("stamp mismatch");
            let phase = out.json["phase"].as_u64().unwrap_or(1);
            return Ok(SwitchRun {
                policy,
                verified: false,
                stamps_checked,
                failure: Some(format!("trace {phase}: {message}")),
                phases: Vec::new(),
                plans: Vec::new(),
                plans_learned: out.plans_learned,
                run_bytes: (0, 0),
            });
        }
        let plans = plan_spans(&trace)?;
        let played = out.json["phases"]
            .as_array()
            .filter(|p| p.len() == 2)
            .ok_or("the player's result has no two phases")?;
        let mut started_at = 0;
        let mut phases = Vec::new();
        for phase in played {
            phases.push(timeline(phase, started_at, &plans, |ns| {
                self.trace_time(ns)
            }));
            started_at = phase["launches"].as_u64().unwrap_or(started_at);
        }
        let stats = out.stats.as_ref();
        Ok(SwitchRun {
            policy,
            verified: true,
            stamps_checked,
            failure: None,
            phases,
            plans,
            plans_learned: out.plans_learned,
            run_bytes: (
                stats.map_or(0, |s| s.bytes_to_device) * self.scale,
                stats.map_or(0, |s| s.bytes_to_host) * self.scale,
            ),
        })
    }
}

/// Runs `tensile rerun TRACE --then TRACE2` (the scripts are written; `session` plays them).
pub(super) fn run(
    args: &RerunArgs,
    session: &Session,
    played: &[Played<'_>; 2],
    policies: &[PolicyKind],
    budget: u64,
    room: f64,
) -> Result<(), String> {
    let predicted: Vec<Vec<(PolicyKind, Option<Predicted>)>> = played
        .iter()
        .map(|p| {
            predict(
                &p.phase.analysis,
                policies,
                budget,
                session.scale,
                p.costs,
                room,
            )
        })
        .collect();
    if args.predict_only {
        return print_predictions(args, played, budget, &predicted);
    }
    let traces = [&played[0].phase.trace, &played[1].phase.trace];
    let native = session.native(&traces)?;
    let native_steps: Vec<u64> = native["phases"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| session.trace_time(median(&steps(p))))
                .collect()
        })
        .unwrap_or_default();
    let runs = policies
        .iter()
        .map(|&p| session.managed_switch(p))
        .collect::<Result<Vec<_>, _>>()?;
    let prediction = |phase: usize, policy: PolicyKind| {
        predicted[phase]
            .iter()
            .find(|(p, _)| *p == policy)
            .and_then(|(_, p)| *p)
    };
    if args.json {
        let doc = json!({
            "trace": played[0].phase.path.display().to_string(),
            "then": played[1].phase.path.display().to_string(),
            "iterations": args.iterations,
            "time_scale": session.time_scale,
            "scale": session.scale,
            "budget_bytes": budget,
            "device": if session.gpu { "gpu" } else { "simulated" },
            "native_stamps_checked": native["stamps_checked"].as_u64().unwrap_or(0),
            "phases": played.iter().enumerate().map(|(i, p)| json!({
                "trace": p.phase.path.display().to_string(),
                "peak_bytes": p.phase.peak(),
                "native_step_ns": native_steps.get(i).copied().unwrap_or(0),
                "compute_ns": p.phase.analysis.cycle.compute_ns(),
                "launches_per_iteration": p.phase.analysis.cycle.len(),
            })).collect::<Vec<_>>(),
            "runs": runs.iter().map(|r| run_json(r, |i| prediction(i, r.policy))).collect::<Vec<_>>(),
        });
        print_json(&doc)?;
    } else {
        print!(
            "{}",
            human(
                args,
                session,
                played,
                budget,
                &native,
                &native_steps,
                &runs,
                &prediction
            )
        );
    }
    failed_runs(runs.iter().map(|r| (r.policy, r.failure.as_deref())))
}

fn run_json(r: &SwitchRun, prediction: impl Fn(usize) -> Option<Predicted>) -> Value {
    json!({
        "policy": policy_name(r.policy),
        "verified": r.verified,
        "stamps_checked": r.stamps_checked,
        "failure": r.failure,
        "run_bytes_h2d": r.run_bytes.0,
        "run_bytes_d2h": r.run_bytes.1,
        "phases": r.phases.iter().enumerate().map(|(i, p)| json!({
            "step_ns": p.step_ns,
            "predicted_ns": prediction(i).map(|p| p.step_ns),
            "iteration_ns": p.iteration_ns,
            "iteration_plan": p.iteration_plan,
            "first_plan": p.first_plan.map(|f| json!({
                "version": f.version,
                "applies_from_launch": f.applies_from,
                "iterations_before": f.iterations_before,
            })),
        })).collect::<Vec<_>>(),
        "plans": r.plans.iter().map(|s| json!({
            "version": s.version,
            "loaded_at_launch": s.loaded_at,
            "applies_from_launch": s.applies_from,
            "until_launch": s.until,
            "dropped": s.dropped,
        })).collect::<Vec<_>>(),
    })
}

fn print_predictions(
    args: &RerunArgs,
    played: &[Played<'_>; 2],
    budget: u64,
    predicted: &[Vec<(PolicyKind, Option<Predicted>)>],
) -> Result<(), String> {
    if args.json {
        let doc = json!({
            "trace": played[0].phase.path.display().to_string(),
            "then": played[1].phase.path.display().to_string(),
            "budget_bytes": budget,
            "phases": played.iter().zip(predicted).map(|(p, pred)| json!({
                "trace": p.phase.path.display().to_string(),
                "predictions": predictions_json(pred),
            })).collect::<Vec<_>>(),
        });
        print_json(&doc)?;
        return Ok(());
    }
    println!(
        "{:<14} {:<8} {:>12} {:>11} {:>11}",
        "trace", "policy", "predicted", "H2D/iter", "D2H/iter"
    );
    for (p, pred) in played.iter().zip(predicted) {
        for &(policy, step) in pred {
            match step {
                Some(s) => println!(
                    "{:<14} {:<8} {:>12} {:>11} {:>11}",
                    p.phase.name(),
                    policy_name(policy),
                    ms(s.step_ns),
                    format_bytes(s.bytes_h2d),
                    format_bytes(s.bytes_d2h)
                ),
                None => println!(
                    "{:<14} {:<8} no prediction",
                    p.phase.name(),
                    policy_name(policy)
                ),
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn human(
    args: &RerunArgs,
    session: &Session,
    played: &[Played<'_>; 2],
    budget: u64,
    native: &Value,
    native_steps: &[u64],
    runs: &[SwitchRun],
    prediction: &dyn Fn(usize, PolicyKind) -> Option<Predicted>,
) -> String {
    let mut out = String::new();
    let names: Vec<String> = played.iter().map(|p| p.phase.name()).collect();
    let _ = writeln!(
        out,
        "traces     {}, then {} in the same process ({} iterations of each played after its \
         prologue and warm-up; time scale {}, scale {})",
        played[0].phase.path.display(),
        played[1].phase.path.display(),
        args.iterations,
        session.time_scale,
        session.scale
    );
    for (i, p) in played.iter().enumerate() {
        let _ = writeln!(
            out,
            "native     {}: step {} (median, trace time); recorded compute {} per iteration",
            names[i],
            ms(native_steps.get(i).copied().unwrap_or(0)),
            ms(p.phase.analysis.cycle.compute_ns())
        );
    }
    let _ = writeln!(
        out,
        "           {} stamps checked",
        native["stamps_checked"].as_u64().unwrap_or(0)
    );
    let share = |p: &Played<'_>| budget as f64 * 100.0 / p.phase.peak().max(1) as f64;
    let _ = writeln!(
        out,
        "budget     {} ({:.1}% of {}'s peak {}, {:.1}% of {}'s peak {})",
        format_bytes(budget),
        share(&played[0]),
        names[0],
        format_bytes(played[0].phase.peak()),
        share(&played[1]),
        names[1],
        format_bytes(played[1].phase.peak())
    );
    if runs.is_empty() {
        return out;
    }
    out.push('\n');
    let width = names.iter().map(String::len).max().unwrap_or(5).max(5);
    let _ = writeln!(
        out,
        "{:<7} {:<width$} {:>12} {:>12}  first plan in force",
        "policy", "trace", "step", "predicted"
    );
    for r in runs {
        if !r.verified {
            let _ = writeln!(
                out,
                "{:<7} FAILED: {}",
                policy_name(r.policy),
                r.failure.as_deref().unwrap_or("stamp mismatch")
            );
            continue;
        }
        for (i, p) in r.phases.iter().enumerate() {
            let first = match (r.policy, p.first_plan) {
                (PolicyKind::Plan, Some(f)) => format!(
                    "plan {} from launch {}: {} iteration(s) began without it",
                    f.version, f.applies_from, f.iterations_before
                ),
                (PolicyKind::Plan, None) => "none".into(),
                _ => "-".into(),
            };
            let _ = writeln!(
                out,
                "{:<7} {:<width$} {:>12} {:>12}  {first}",
                policy_name(r.policy),
                names[i],
                ms(p.step_ns),
                prediction(i, r.policy).map_or("-".into(), |p| ms(p.step_ns)),
            );
        }
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "each iteration, warm-up included (ms of trace time; * under a plan all through):"
    );
    for r in runs.iter().filter(|r| r.verified) {
        for (i, p) in r.phases.iter().enumerate() {
            let times: Vec<String> = p
                .iteration_ns
                .iter()
                .zip(&p.iteration_plan)
                .map(|(&ns, plan)| {
                    format!(
                        "{:.1}{}",
                        ns as f64 / 1e6,
                        if plan.is_some() { "*" } else { "" }
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "{:<7} {:<width$} {}",
                policy_name(r.policy),
                names[i],
                times.join(" ")
            );
        }
    }
    for r in runs {
        let _ = writeln!(
            out,
            "{:<7} {} stamps checked, {}; {} to the device and {} to the host over the run",
            policy_name(r.policy),
            r.stamps_checked,
            if r.verified { "verified" } else { "FAILED" },
            format_bytes(r.run_bytes.0),
            format_bytes(r.run_bytes.1)
        );
        for line in &r.plans_learned {
            let _ = writeln!(out, "           {line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_plan(version: u64, applies_from: u64, iterations_before: u32) -> FirstPlan {
        FirstPlan {
            version,
            applies_from,
            iterations_before,
        }
    }

    fn span(version: u64, applies_from: u64, until: Option<u64>) -> PlanSpan {
        PlanSpan {
            version,
            loaded_at: applies_from.saturating_sub(1),
            applies_from,
            until,
            dropped: None,
        }
    }

    #[test]
    fn a_phases_iterations_are_planned_where_a_plan_covers_them_and_its_first_plan_is_counted_from_its_start(
    ) {
        // Trace 1: iterations start at launches 10, 20, 30, 40 and end at 50; plan 1 applies
        // from 30 and is dropped at 52 (the final check of every stamp). Trace 2: 60, 70, 80,
        // 90, ending at 100; plan 2, learned from trace 1 before the switch, applies from 60
        // and is dropped there; plan 3 applies from 85 (mid-iteration).
        let spans = [
            span(1, 30, Some(52)),
            span(2, 60, Some(60)),
            span(3, 85, None),
        ];
        let first = json!({
            "steps_ns": [16, 32],
            "iteration_ns": [160, 160, 16, 32],
            "iteration_launches": [10, 20, 30, 40, 50],
            "launches": 52,
        });
        let t = timeline(&first, 0, &spans, |ns| ns / 16);
        assert_eq!(t.iteration_plan, [None, None, Some(1), Some(1)]);
        assert_eq!(t.first_plan, Some(first_plan(1, 30, 2)));
        assert_eq!(t.iteration_ns, [10, 10, 1, 2]);
        assert_eq!(t.step_ns, 1);
        let second = json!({
            "steps_ns": [16],
            "iteration_ns": [16, 16, 16, 16],
            "iteration_launches": [60, 70, 80, 90, 100],
            "launches": 101,
        });
        let t = timeline(&second, 52, &spans, |ns| ns);
        assert_eq!(t.iteration_plan, [None, None, None, Some(3)]);
        // Plan 1 applied before the trace began and plan 2 governed no launch: plan 3 is the
        // trace's first, which came during its third iteration: three began without it.
        assert_eq!(t.first_plan, Some(first_plan(3, 85, 3)));
    }

    #[test]
    fn a_trace_without_a_plan_says_so() {
        let spans = [span(1, 30, Some(50))];
        let second = json!({
            "steps_ns": [],
            "iteration_ns": [1, 1],
            "iteration_launches": [60, 70, 80],
            "launches": 81,
        });
        let t = timeline(&second, 50, &spans, |ns| ns);
        assert_eq!(t.iteration_plan, [None, None]);
        assert_eq!(t.first_plan, None);
    }
}
