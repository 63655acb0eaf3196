//! Feeds a trace in the project's own format to the online learner, record by record, as the
//! planner's thread would get them, and prints each plan it makes and what polling cost.
//!
//! ```text
//! cargo run --release -p tensile-analyzer --example learn -- TRACE BUDGET_MIB [POLL_EVERY]
//! ```
//! `POLL_EVERY` is the number of records between polls (default 1000).

use std::time::{Duration, Instant};

use tensile_analyzer::online::{Learner, LearnerOptions};
use tensile_trace::{Reader, Record};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [trace, budget, rest @ ..] = args.as_slice() else {
        return Err("usage: learn TRACE BUDGET_MIB [POLL_EVERY]".into());
    };
    let budget_mib: u64 = budget
        .parse()
        .map_err(|e| format!("budget {budget:?}: {e}"))?;
    let poll_every: usize = match rest.first() {
        Some(n) => n.parse().map_err(|e| format!("poll interval {n:?}: {e}"))?,
        None => 1000,
    };
    let reader = Reader::open(trace).map_err(|e| format!("{trace}: {e}"))?;
    let mut learner = Learner::new(LearnerOptions::for_budget(budget_mib << 20));
    let (mut records, mut launches) = (0usize, 0u64);
    let (mut push_time, mut poll_time, mut slowest) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for item in reader {
        let record = item.map_err(|e| format!("{trace}: {e}"))?;
        launches += u64::from(matches!(record, Record::Launch(_)));
        let t = Instant::now();
        learner.push(&record);
        push_time += t.elapsed();
        records += 1;
        if records.is_multiple_of(poll_every) {
            let t = Instant::now();
            let plan = learner.poll();
            let took = t.elapsed();
            poll_time += took;
            slowest = slowest.max(took);
            if let Some(plan) = plan {
                println!(
                    "record {records} (launch {launches}): plan v{}, {} launches from launch \
                     {}, {} steps, {:.1} MiB out per iteration, predicted {:.2} ms (compute \
                     {:.2} ms); poll {:.1} ms",
                    plan.version,
                    plan.period,
                    plan.anchor_seq,
                    plan.steps.len(),
                    plan.bytes_out_per_iteration() as f64 / (1 << 20) as f64,
                    plan.predicted_step_ns as f64 / 1e6,
                    plan.compute_ns as f64 / 1e6,
                    took.as_secs_f64() * 1e3,
                );
            }
        }
    }
    println!(
        "{records} records, {launches} launches; state {:?}; push {:.0} ns per record, polls \
         {:.1} ms in all, slowest {:.1} ms",
        learner.state(),
        push_time.as_nanos() as f64 / records.max(1) as f64,
        poll_time.as_secs_f64() * 1e3,
        slowest.as_secs_f64() * 1e3,
    );
    Ok(())
}
