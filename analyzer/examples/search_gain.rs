//! What the local search after the planner gains on a trace for a time limit: prints the plan's
//! steady-state step before and after, the lower bound, and the evaluations spent.
//!
//! `cargo run --release -p tensile-analyzer --example search_gain -- TRACE PERCENT LIMIT...`,
//! each LIMIT a number of milliseconds (a search of exactly that long), `default` (what
//! `tensile replay` does: at most `DEFAULT_SEARCH_MS`, stopping early when it stops gaining) or
//! `eN` (exactly N plans simulated, whatever the time: the same result on any machine).

mod common;

use std::time::{Duration, Instant};

use tensile_analyzer::bound::lower_bound_with;
use tensile_analyzer::search::{improve, SearchOptions};
use tensile_analyzer::{plan::plan, BoundOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seed: u64 = std::env::var("SEARCH_SEED").map_or(1, |s| s.parse().expect("SEARCH_SEED"));
    let (a, budget, cost) =
        common::trace_at_percent(&args, 3, "search_gain TRACE PERCENT SEARCH_MS...");
    let bound = lower_bound_with(&a.cycle, &budget, &cost, &BoundOptions::default()).unwrap();
    let t = Instant::now();
    let p = plan(&a.cycle, &budget, &cost).unwrap();
    let plan_ms = t.elapsed().as_millis();
    println!("| search limit | ms spent | planning ms | plan ms before | after | bound ms | after/bound | evaluations | kept |");
    for limit in &args[2..] {
        let options = if let Some(n) = limit.strip_prefix('e') {
            // A number of plans, whatever the time: deterministic for the seed.
            SearchOptions {
                time_limit: Duration::from_secs(3600),
                patience: None,
                max_evaluations: n.parse().expect("eN: N plans"),
                ..SearchOptions::default()
            }
        } else if limit == "default" {
            // What `tensile replay` does by default: stops early when stale or at the bound.
            SearchOptions {
                floor_ns: bound.bound_ns,
                ..SearchOptions::default()
            }
        } else {
            // A fixed time: no early stop.
            SearchOptions {
                time_limit: Duration::from_millis(limit.parse().expect("SEARCH_MS")),
                patience: None,
                ..SearchOptions::default()
            }
        };
        let options = SearchOptions { seed, ..options };
        let (_, r) = improve(&a.cycle, &p, budget, &cost, &options);
        let ms_of = |ns: Option<u64>| ns.map_or(f64::NAN, |n| n as f64 / 1e6);
        println!(
            "| {limit} | {} | {plan_ms} | {:.2} | {:.2} | {:.2} | {:.3} | {} | {} |",
            r.elapsed_ms,
            ms_of(r.start_step_ns),
            ms_of(r.step_ns),
            bound.bound_ns as f64 / 1e6,
            ms_of(r.step_ns) / (bound.bound_ns as f64 / 1e6),
            r.evaluations,
            r.accepted
        );
    }
}
