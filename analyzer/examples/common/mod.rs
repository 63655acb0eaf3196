//! What the examples that look at a plan share: a trace analysed with the default cost model,
//! the budget at a percent of its peak, and the planner's plan for it (searched, if asked).
//! A module of the examples, not an example of its own (Cargo builds `examples/*.rs` only).

#![allow(dead_code)] // Each example uses the part it needs.

use std::time::Duration;

use tensile_analyzer::evaluate::Analysis;
use tensile_analyzer::import::{load, LoadOptions};
use tensile_analyzer::plan::{plan, SwapPlan};
use tensile_analyzer::search::{improve, SearchOptions};
use tensile_analyzer::{analyze, Budget, CostModel};

/// `args` (the command line after the program's name) as `TRACE PERCENT ...`: the trace
/// analysed and the budget at `PERCENT` of its peak. Prints `usage` and exits with 2 when
/// there are fewer than `min_args`.
pub fn trace_at_percent(
    args: &[String],
    min_args: usize,
    usage: &str,
) -> (Analysis, Budget, CostModel) {
    if args.len() < min_args {
        eprintln!("usage: {usage}");
        std::process::exit(2);
    }
    let trace = load(std::path::Path::new(&args[0]), LoadOptions::default()).unwrap();
    let cost = CostModel::default();
    let a = analyze(&trace, &cost).unwrap();
    let percent: u64 = args[1].parse().expect("PERCENT");
    let budget = Budget::new(a.footprint.peak_allocated * percent / 100);
    (a, budget, cost)
}

/// The planner's plan, improved by a local search of `search_ms` milliseconds (a number, as
/// given on the command line) with `patience`, if a time is given.
pub fn plan_searched(
    a: &Analysis,
    budget: Budget,
    cost: &CostModel,
    search_ms: Option<&String>,
    patience: Option<Duration>,
) -> SwapPlan {
    let p = plan(&a.cycle, &budget, cost).unwrap();
    let Some(ms) = search_ms else { return p };
    let options = SearchOptions {
        time_limit: Duration::from_millis(ms.parse().expect("SEARCH_MS")),
        patience,
        ..SearchOptions::default()
    };
    improve(&a.cycle, &p, budget, cost, &options).0
}
