//! `tensile replay TRACE --plan-from RUN.trace`: the plan a recorded run used, replayed, with
//! what the run measured beside it.
//!
//! A run under `TENSILE_POLICY=plan` with `TENSILE_TRACE` set records each plan it loads (the
//! encoded [`ExecPlan`], `Record::Plan`), the copies the library queued (`Record::Swap`) and the
//! host time it stalled (`Record::Busy`). This module takes the last plan loaded, restates it on
//! the replayed trace's cycle ([`tensile_analyzer::restore`]) for the simulator, and measures the
//! run over the iterations that plan was in force: the host time between the launches at its
//! position 0 (the step), and per step the bytes each way and the stalled accesses' time.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tensile_analyzer::restore::{restore, Restored};
use tensile_analyzer::sim::{self, Policy, SimError, SimOptions, SimReport};
use tensile_analyzer::timeline::Footprint;
use tensile_analyzer::{Budget, CostModel, Trace};
use tensile_protocol::ExecPlan;
use tensile_trace::{BusyKind, PlanChangeKind, Reader, Record, SwapDir, TraceError};

use tensile_analyzer::cycle::Cycle;

use super::ms;

/// The plan a run used and what the run measured while it was in force.
pub struct RunPlan {
    /// The run's trace.
    pub run: PathBuf,
    pub plan: ExecPlan,
    /// The launch the plan applied from (an iteration boundary).
    pub applies_from: u64,
    /// The run's page (the memory manager's): what the plan's pieces are made of.
    pub page_bytes: u64,
    /// Why it was dropped, if it was.
    pub dropped: Option<String>,
    /// The run's figures over the plan's whole iterations (`None`: fewer than two began).
    pub measured: Option<Measured>,
}

/// What a run measured per step under its plan.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// Whole iterations measured.
    pub iterations: usize,
    /// Median host time from one position-0 launch to the next.
    pub step_ns: u64,
    pub bytes_h2d: u64,
    pub bytes_d2h: u64,
    /// Stalled accesses' host time.
    pub stall_ns: u64,
    pub stalled_accesses: u64,
}

/// A plan a run loaded, as its trace tells.
struct LoadedPlan {
    version: u64,
    applies_from: u64,
    page_bytes: u64,
    bytes: Vec<u8>,
    /// At which launch it was dropped, and why.
    dropped: Option<(u64, String)>,
}

/// Reads the last plan `run` loaded and measures the run under it.
pub fn read(run: &Path) -> Result<RunPlan, String> {
    let cant = |why: String| format!("--plan-from {}: {why}", run.display());
    let reader = Reader::open(run).map_err(|e| cant(e.to_string()))?;
    let mut launches: Vec<(u64, u64)> = Vec::new();
    let mut swaps: Vec<(u64, SwapDir, u64)> = Vec::new();
    let mut stalls: Vec<(u64, u64)> = Vec::new();
    let mut plans: Vec<LoadedPlan> = Vec::new();
    for record in reader {
        let record = match record {
            Ok(r) => r,
            // A cut run: what was written is still the run.
            Err(TraceError::Truncated { .. }) => break,
            Err(e) => return Err(cant(e.to_string())),
        };
        match record {
            Record::Launch(l) => launches.push((l.seq, l.t_ns)),
            Record::Swap(s) => swaps.push((s.t_ns, s.dir, s.bytes)),
            Record::Busy(b) if b.kind == BusyKind::Stall => stalls.push((b.t_ns, b.dur_ns)),
            Record::Plan(p) => match p.change {
                PlanChangeKind::Loaded {
                    applies_from,
                    page_bytes,
                    plan,
                } => plans.push(LoadedPlan {
                    version: p.version,
                    applies_from,
                    page_bytes,
                    bytes: plan,
                    dropped: None,
                }),
                PlanChangeKind::Dropped { reason } => {
                    if let Some(last) = plans.iter_mut().rev().find(|q| q.version == p.version) {
                        last.dropped.get_or_insert((p.launches, reason));
                    }
                }
            },
            _ => {}
        }
    }
    let Some(LoadedPlan {
        applies_from,
        page_bytes,
        bytes,
        dropped,
        ..
    }) = plans.pop()
    else {
        return Err(cant(
            "the run loaded no plan (trace a run under TENSILE_POLICY=plan with TENSILE_TRACE \
             set, with a libtensile that records its plans)"
                .into(),
        ));
    };
    let plan = ExecPlan::decode(&bytes).map_err(|e| cant(format!("its plan: {e}")))?;
    // Iterations start at the launches at position 0 from the load on, until the drop.
    let period = u64::from(plan.period.max(1));
    let until = dropped.as_ref().map_or(u64::MAX, |d| d.0);
    let starts: Vec<u64> = launches
        .iter()
        .filter(|&&(seq, _)| {
            seq >= applies_from
                && seq < until
                && (seq + period - plan.anchor_seq % period).is_multiple_of(period)
        })
        .map(|&(_, t)| t)
        .collect();
    let measured = (starts.len() >= 2).then(|| {
        let (first, last) = (starts[0], starts[starts.len() - 1]);
        let n = (starts.len() - 1) as u64;
        let mut steps: Vec<u64> = starts
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
            .collect();
        steps.sort_unstable();
        let within = |t: u64| t >= first && t < last;
        let bytes = |dir: SwapDir| {
            swaps
                .iter()
                .filter(|s| s.1 == dir && within(s.0))
                .map(|s| s.2)
                .sum::<u64>()
                / n
        };
        let stalled: Vec<u64> = stalls.iter().filter(|s| within(s.0)).map(|s| s.1).collect();
        Measured {
            iterations: n as usize,
            step_ns: steps[steps.len() / 2],
            bytes_h2d: bytes(SwapDir::ToDevice),
            bytes_d2h: bytes(SwapDir::ToHost),
            stall_ns: stalled.iter().sum::<u64>() / n,
            stalled_accesses: stalled.len() as u64 / n,
        }
    });
    Ok(RunPlan {
        run: run.to_path_buf(),
        plan,
        applies_from,
        page_bytes,
        dropped: dropped.map(|d| d.1),
        measured,
    })
}

/// The run's plan restated on `cycle` (of `trace`), for its own budget.
pub fn restate(rp: &RunPlan, trace: &Trace, cycle: &Cycle) -> Result<Restored, String> {
    restore(trace, cycle, &rp.plan, rp.plan.budget_bytes).map_err(|e| {
        format!(
            "--plan-from {}: its plan does not fit this trace: {e}",
            rp.run.display()
        )
    })
}

/// Simulates the restated plan at `budget`; with `widen`, where it does not fit there, at the
/// least budget (to within half a percent) up to twice the iteration's peak that it fits,
/// which is returned beside the report. The error is the one at `budget`.
pub fn simulate(
    cycle: &Cycle,
    restored: &Restored,
    budget: Budget,
    cost: &CostModel,
    widen: bool,
) -> Result<(SimReport, Option<u64>), SimError> {
    let at = |bytes: u64| {
        sim::simulate(
            cycle,
            Policy::Plan(&restored.plan),
            Budget::new(bytes),
            cost,
            SimOptions::default(),
        )
    };
    let error = match at(budget.bytes) {
        Ok(report) => return Ok((report, None)),
        Err(e) if widen => e,
        Err(e) => return Err(e),
    };
    // Bisect between a budget it fails (`fails`) and one it fits (`fits`, with its report).
    let mut fits = budget.bytes.max(Footprint::of(cycle).peak_allocated) * 2;
    let Ok(mut report) = at(fits) else {
        return Err(error);
    };
    let mut fails = budget.bytes;
    while fits - fails > (fits / 200).max(1) {
        let mid = fails + (fits - fails) / 2;
        match at(mid) {
            Ok(r) => (fits, report) = (mid, r),
            Err(_) => fails = mid,
        }
    }
    Ok((report, Some(fits)))
}

/// The human lines that say which plan ran and what the run measured; `fitted`: the budget
/// it was simulated at, where it did not fit its own.
pub fn human(rp: &RunPlan, restored: &Restored, fitted: Option<u64>) -> String {
    let bytes = tensile_analyzer::cost::format_bytes;
    let p = &restored.plan;
    let mut out = format!(
        "plan from {}: version {}, applied from launch {}{}; {} steps: {} round trips ({} read back \
         on demand), {} tails out, {} host-resident pieces, {} left out, in pages of {}; \
         predicted by the run's planner {}\n",
        rp.run.display(),
        rp.plan.version,
        rp.applies_from,
        rp.dropped
            .as_ref()
            .map_or(String::new(), |r| format!(", dropped {r}")),
        rp.plan.steps.len(),
        p.evictions.len(),
        restored.on_demand,
        p.tail_outs.len(),
        p.host_resident.len(),
        restored.unplaced,
        bytes(rp.page_bytes),
        ms(rp.plan.predicted_step_ns),
    );
    if let Some(fitted) = fitted {
        out.push_str(&format!(
            "           it does not fit the budget it was made for ({}) on this trace's \
             iteration (its planner saw the iteration otherwise): simulated at the least that \
             fits, {} ({:+.1}%)\n",
            bytes(rp.plan.budget_bytes),
            bytes(fitted),
            (fitted as f64 / rp.plan.budget_bytes.max(1) as f64 - 1.0) * 100.0,
        ));
    }
    match rp.measured {
        Some(m) => out.push_str(&format!(
            "measured   in that run, over {} iterations under the plan: step {} (median host \
             time between its first launches), per step {} in, {} out, {} accesses stalled for {}\n",
            m.iterations,
            ms(m.step_ns),
            bytes(m.bytes_h2d),
            bytes(m.bytes_d2h),
            m.stalled_accesses,
            ms(m.stall_ns),
        )),
        None => out.push_str("measured   nothing: fewer than two iterations ran under the plan\n"),
    }
    out
}

/// The same as JSON, under the policy's object's `plan_from`.
pub fn json(rp: &RunPlan, restored: &Restored, fitted: Option<u64>) -> Value {
    json!({
        "plan_budget_bytes": rp.plan.budget_bytes,
        // The least budget the plan fits on this iteration, where it did not fit its own.
        "fitted_budget_bytes": fitted,
        "run": rp.run.display().to_string(),
        "version": rp.plan.version,
        "applies_from_launch": rp.applies_from,
        "page_bytes": rp.page_bytes,
        "dropped": rp.dropped,
        "steps": rp.plan.steps.len(),
        "round_trips": restored.plan.evictions.len(),
        "read_back_on_demand": restored.on_demand,
        "tails_out": restored.plan.tail_outs.len(),
        "left_out": restored.unplaced,
        "planner_predicted_ns": rp.plan.predicted_step_ns,
        "measured": rp.measured.map(|m| json!({
            "iterations": m.iterations,
            "step_ns": m.step_ns,
            "bytes_h2d": m.bytes_h2d,
            "bytes_d2h": m.bytes_d2h,
            "stall_ns": m.stall_ns,
            "stalled_accesses": m.stalled_accesses,
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_analyzer::import::read_capture;
    use tensile_analyzer::plan::SwapPlan;
    use tensile_analyzer::{analyze, pieces};

    /// A plan that moves nothing, on a loop whose every step touches a 4 MiB weight and a fresh
    /// 2 MiB activation: it fits only the whole 6 MiB.
    fn keep_everything() -> (Cycle, Restored) {
        let mut text = String::from("# capture v1\nA 0 (nil) 1 1000000 4194304\n");
        let mut seq = 0;
        for step in 0..6u64 {
            let a = 10 + step;
            text.push_str(&format!("A 0 (nil) {a} {:x} 2097152\n", a << 24));
            for k in 0..4 {
                seq += 1;
                text.push_str(&format!(
                    "K {seq} (nil) {seq} {k} 1,1,1 1,1,1 0 1@0 {a}@0\n"
                ));
            }
            text.push_str(&format!("F 0 (nil) {a}\n"));
        }
        let trace = read_capture(text.as_bytes(), "loop", &mut || {}).unwrap();
        let cycle = analyze(&trace, &CostModel::default()).unwrap().cycle;
        let plan = SwapPlan {
            period: cycle.len() as u32,
            budget_bytes: 3 << 20,
            evictions: Vec::new(),
            host_resident: Vec::new(),
            tail_outs: Vec::new(),
            pieces: pieces::whole(&cycle),
        };
        let restored = Restored {
            plan,
            unplaced: 0,
            on_demand: 0,
        };
        (cycle, restored)
    }

    #[test]
    fn a_plan_over_its_own_budget_is_replayed_at_the_least_that_fits_when_asked() {
        let (cycle, restored) = keep_everything();
        let cost = CostModel::default();
        let own = Budget::new(3 << 20);
        // Asked for its own budget: the simulator's refusal, as before.
        assert!(simulate(&cycle, &restored, own, &cost, false).is_err());
        // Widened: the least that fits, to within half a percent: the 6 MiB it holds.
        let (report, fitted) = simulate(&cycle, &restored, own, &cost, true).unwrap();
        let fitted = fitted.expect("it did not fit its own budget");
        assert!(
            (6 << 20..=(6 << 20) + (12 << 20) / 200).contains(&fitted),
            "{fitted}"
        );
        assert_eq!(report.peak_resident_bytes, 6 << 20);
        // A plan that fits is simulated where it was asked to be.
        let (_, fitted) = simulate(&cycle, &restored, Budget::new(8 << 20), &cost, true).unwrap();
        assert_eq!(fitted, None);
    }
}
