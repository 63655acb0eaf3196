//! The analyzer's front door: analyze a trace once, then evaluate policies for budgets.
//!
//! [`analyze`] runs iteration detection and builds the steady-state cycle and its footprint;
//! [`evaluate`] plans (for `plan`), simulates, and bounds. This is what `tensile replay` and an
//! online re-planner call; it adds no modelling of its own.

use std::str::FromStr;

use serde::Serialize;

use crate::bound::{lower_bound_with, BoundError, BoundOptions, LowerBound};
use crate::cost::{Budget, CostModel};
use crate::cycle::Cycle;
use crate::iteration::{detect, IterationError, Iterations};
use crate::model::Trace;
use crate::plan::{plan, PlanError, SwapPlan};
use crate::search::{improve, SearchOptions, SearchReport};
use crate::sim::{simulate, Policy, SimError, SimOptions, SimReport};
use crate::timeline::Footprint;

/// A trace's structure, ready for planning.
#[derive(Debug, Clone)]
pub struct Analysis {
    /// The detected iterations.
    pub iterations: Iterations,
    /// The steady-state iteration.
    pub cycle: Cycle,
    /// Its footprint.
    pub footprint: Footprint,
}

/// Detects the iteration and builds the steady-state cycle.
pub fn analyze(trace: &Trace, cost: &CostModel) -> Result<Analysis, IterationError> {
    let iterations = detect(trace)?;
    let cycle = Cycle::from_trace(trace, &iterations, cost);
    let footprint = Footprint::of(&cycle);
    Ok(Analysis {
        iterations,
        cycle,
        footprint,
    })
}

/// How many times per steady-state iteration LRU moves each tensor of `cycle` (in shim pages)
/// whole, each way together: its bytes copied over its size, from one simulated iteration at
/// `budget` with copies at `cost`. What the remaps' per-unit costs are shared by depends on
/// which tensors move ([`Cycle::pages_per_unit_weighted`]).
pub fn lru_moves_per_tensor(
    cycle: &Cycle,
    budget: Budget,
    cost: &CostModel,
) -> Result<Vec<f64>, SimError> {
    let options = SimOptions {
        record_curve: true,
        ..SimOptions::default()
    };
    let report = simulate(cycle, Policy::Lru, budget, cost, options)?;
    // LRU in shim pages runs on the cycle cut into its pages, in this order (`sim`).
    let pages =
        crate::sim::lru_in_pages(cycle).then(|| crate::pieces::cut(cycle, cycle.page_bytes));
    let mut moved = vec![0.0; cycle.tensors.len()];
    for c in &report.copies {
        let tensor = match &pages {
            Some(pages) => pages.get(c.tensor as usize).map(|p| p.tensor),
            None => Some(c.tensor),
        };
        if let Some(t) = tensor.filter(|&t| (t as usize) < moved.len()) {
            moved[t as usize] += c.bytes as f64;
        }
    }
    for (m, t) in moved.iter_mut().zip(&cycle.tensors) {
        *m /= t.bytes.max(1) as f64;
    }
    Ok(moved)
}

/// A policy by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum PolicyKind {
    /// The planner's periodic plan.
    Plan,
    /// On-demand LRU.
    Lru,
    /// No swapping.
    None,
}

impl FromStr for PolicyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "plan" => Ok(PolicyKind::Plan),
            "lru" => Ok(PolicyKind::Lru),
            "none" | "off" => Ok(PolicyKind::None),
            other => Err(format!(
                "unknown policy {other:?} (expected plan, lru or none)"
            )),
        }
    }
}

/// The outcome of one policy at one budget.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    /// Which policy.
    pub policy: PolicyKind,
    /// The simulated steady state.
    pub report: SimReport,
    /// The plan, for `plan`.
    pub plan: Option<SwapPlan>,
    /// What the local search after the planner did, for `plan`.
    #[serde(skip)]
    pub search: Option<SearchReport>,
    /// The lower bound for this budget (`None`: no plan can run within it; only `none`, which
    /// ignores the budget, is evaluated then).
    pub bound: Option<LowerBound>,
}

/// Why a policy could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// No plan exists for this budget.
    #[error("{0}")]
    Plan(#[from] PlanError),
    /// The budget is infeasible for any plan.
    #[error("{0}")]
    Bound(#[from] BoundError),
    /// The simulator found a violation or a deadlock.
    #[error("simulation failed: {0}")]
    Sim(#[from] SimError),
}

/// Plans (if needed), simulates and bounds `policy` for `budget`.
pub fn evaluate(
    cycle: &Cycle,
    policy: PolicyKind,
    budget: Budget,
    cost: &CostModel,
) -> Result<Evaluation, EvalError> {
    evaluate_many(cycle, &[policy], budget, cost, &BoundOptions::default())
        .map(|mut v| v.remove(0))
        .map_err(|(_, e)| e)
}

/// Evaluates each of `policies` for `budget`, computing the lower bound once (its schedule term
/// can take seconds), with the default local search after the planner. The error names the
/// policy that failed.
pub fn evaluate_many(
    cycle: &Cycle,
    policies: &[PolicyKind],
    budget: Budget,
    cost: &CostModel,
    bound_options: &BoundOptions,
) -> Result<Vec<Evaluation>, (PolicyKind, EvalError)> {
    evaluate_many_with(
        cycle,
        policies,
        budget,
        cost,
        bound_options,
        &SearchOptions::default(),
    )
}

/// [`evaluate_many`] with the local search's limits given (a zero time limit leaves it out).
pub fn evaluate_many_with(
    cycle: &Cycle,
    policies: &[PolicyKind],
    budget: Budget,
    cost: &CostModel,
    bound_options: &BoundOptions,
    search: &SearchOptions,
) -> Result<Vec<Evaluation>, (PolicyKind, EvalError)> {
    let bound = lower_bound_with(cycle, &budget, cost, bound_options);
    let options = SimOptions {
        record_curve: true,
        ..SimOptions::default()
    };
    let mut out = Vec::with_capacity(policies.len());
    for &policy in policies {
        let fail = |e: EvalError| (policy, e);
        let bound = match (&bound, policy) {
            (Ok(b), _) => Some(*b),
            (Err(_), PolicyKind::None) => None,
            (Err(e), _) => return Err(fail(e.clone().into())),
        };
        let (report, plan, searched) = match policy {
            PolicyKind::Plan => {
                let mut plan = plan(cycle, &budget, cost).map_err(|e| fail(e.into()))?;
                let mut searched = None;
                if !search.time_limit.is_zero() && search.max_evaluations > 0 {
                    let search = SearchOptions {
                        floor_ns: bound.map_or(0, |b| b.bound_ns),
                        ..*search
                    };
                    let (better, r) = improve(cycle, &plan, budget, cost, &search);
                    plan = better;
                    searched = Some(r);
                }
                let report = simulate(cycle, Policy::Plan(&plan), budget, cost, options)
                    .map_err(|e| fail(e.into()))?;
                (report, Some(plan), searched)
            }
            PolicyKind::Lru => (
                simulate(cycle, Policy::Lru, budget, cost, options).map_err(|e| fail(e.into()))?,
                None,
                None,
            ),
            PolicyKind::None => (
                simulate(cycle, Policy::None, budget, cost, options).map_err(|e| fail(e.into()))?,
                None,
                None,
            ),
        };
        out.push(Evaluation {
            policy,
            report,
            plan,
            search: searched,
            bound,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cycle::{persistent_tensor, MoveUnits};

    const MIB: u64 = 1 << 20;

    #[test]
    fn lru_moves_are_counted_per_tensor() {
        // Four 64 MiB tensors touched in turn, room for three: LRU sends pages of each out and
        // back every iteration, the same share of each (the rotation is symmetric); a fifth,
        // small and touched by every op, never moves.
        let mut tensors: Vec<_> = (0..4)
            .map(|i| persistent_tensor(i, 64 * MIB, vec![i, (i + 1) % 4]))
            .collect();
        tensors.push(persistent_tensor(4, 2 * MIB, vec![0, 1, 2, 3]));
        let cycle = Cycle::from_parts(&[100_000; 4], tensors)
            .unwrap()
            .with_units(MoveUnits::ShimPages);
        let moves =
            lru_moves_per_tensor(&cycle, Budget::new(200 * MIB), &CostModel::default()).unwrap();
        assert_eq!(moves.len(), 5);
        assert_eq!(moves[4], 0.0, "{moves:?}");
        // Each moves more than once (out, and most of it back), all alike.
        assert!(moves[0] > 1.0, "{moves:?}");
        assert!(
            moves[..4].iter().all(|&m| (m - moves[0]).abs() < 1e-9),
            "{moves:?}"
        );
    }
}
