//! The planner's targets on the shared PyTorch traces, and the results table in
//! docs/replay-results.md (regenerate it with
//! `cargo test --release -p tensile-analyzer --test shared_traces -- --ignored --nocapture`).

use std::path::Path;

use tensile_analyzer::cycle::MoveUnits;
use tensile_analyzer::import::{load, LoadOptions};
use tensile_analyzer::sim::{simulate, Policy, SimOptions, SimReport};
use tensile_analyzer::{
    analyze, evaluate_many, Analysis, BoundOptions, Budget, CostModel, Evaluation, PolicyKind,
};

const TRACES: [&str; 3] = ["mlp", "resnet50", "bert"];

fn analysis(name: &str) -> Analysis {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/{name}.trace.gz"));
    let trace = load(&path, LoadOptions::default()).unwrap();
    analyze(&trace, &CostModel::default()).unwrap()
}

fn budget(a: &Analysis, percent: u64) -> Budget {
    Budget::new(a.footprint.peak_allocated * percent / 100)
}

/// Plan, LRU and no swapping at `budget`, bounded once with the default options (as `tensile
/// replay` does).
fn evaluations(a: &Analysis, budget: Budget) -> [Evaluation; 3] {
    let policies = [PolicyKind::Plan, PolicyKind::Lru, PolicyKind::None];
    let v = evaluate_many(
        &a.cycle,
        &policies,
        budget,
        &CostModel::default(),
        &BoundOptions::default(),
    )
    .unwrap();
    v.try_into().unwrap()
}

#[test]
fn plan_keeps_the_budget_beats_lru_and_respects_the_bound() {
    for name in TRACES {
        let a = analysis(name);
        for percent in [75, 50, 30] {
            let b = budget(&a, percent);
            let [plan, lru, _] = evaluations(&a, b);
            let bound = plan.bound.unwrap().bound_ns;
            let (p, l) = (&plan.report, &lru.report);
            assert!(
                p.fits && p.peak_resident_bytes <= b.bytes,
                "{name} {percent}%"
            );
            assert!(
                l.fits && l.peak_resident_bytes <= b.bytes,
                "{name} {percent}%"
            );
            assert_eq!(p.demand_fetches, 0, "{name} {percent}%");
            assert!(
                p.step_ns >= bound && l.step_ns >= bound,
                "{name} {percent}%: below the bound"
            );
            assert!(
                p.step_ns < l.step_ns,
                "{name} {percent}%: plan {} lru {}",
                p.step_ns,
                l.step_ns
            );
        }
    }
}

#[test]
// The ratio is to the bound with its schedule LP term; without the solver the bound is looser.
#[cfg_attr(
    not(feature = "lp"),
    ignore = "compares with the schedule LP's bound (feature lp)"
)]
fn at_half_the_peak_the_plan_is_near_the_bound_and_far_below_lru() {
    // (trace, plan / bound at most, lru / plan at least): the target is within 10% of
    // the bound at half the peak.
    for (name, max_ratio, min_lru_ratio) in [
        ("resnet50", 1.10, 1.4),
        ("bert", 1.10, 1.6),
        ("mlp", 1.10, 2.5),
    ] {
        let a = analysis(name);
        let b = budget(&a, 50);
        let [plan, lru, _] = evaluations(&a, b);
        let bound = plan.bound.unwrap().bound_ns as f64;
        let ratio = plan.report.step_ns as f64 / bound;
        assert!(ratio <= max_ratio, "{name}: plan is {ratio:.3}x the bound");
        let lru_ratio = lru.report.step_ns as f64 / plan.report.step_ns as f64;
        assert!(
            lru_ratio >= min_lru_ratio,
            "{name}: lru only {lru_ratio:.2}x the plan"
        );
    }
}

/// LRU as the shim runs it, on BERT at half its peak, for copy rates a few percent apart
/// (those of the H100 with the remaps of LRU's units priced, as `tensile rerun` predicts, are
/// 40.2/28.5/44.1 GB/s): the model flipped from 7 to 17.6 GiB moved per iteration between
/// 41/30/47 and 40.4/28.7/44.4 (it let the host pass the op the compute stream waited at, and
/// that op then evicted the pages of the ops issued after it), where the manager on the
/// simulated GPU moves about 6.2 GiB (docs/rerun.md).
#[test]
fn lru_in_shim_pages_moves_about_the_same_bytes_at_nearby_copy_rates() {
    let a = analysis("bert");
    let cycle = a.cycle.clone().with_units(MoveUnits::ShimPages);
    let b = budget(&a, 50);
    let gib = (1u64 << 30) as f64;
    let runs: Vec<(f64, SimReport)> = [(41.0, 30.0, 47.0), (40.4, 28.7, 44.4), (40.0, 28.0, 44.0)]
        .into_iter()
        .map(|(h2d, d2h, both)| {
            let cost = CostModel {
                h2d_gbps: h2d,
                d2h_gbps: d2h,
                bidir_gbps: both,
                ..CostModel::default()
            };
            let r = simulate(&cycle, Policy::Lru, b, &cost, SimOptions::default()).unwrap();
            assert!(r.settled && r.fits, "{h2d} GB/s: {r:?}");
            (h2d, r)
        })
        .collect();
    let moved: Vec<f64> = runs.iter().map(|(_, r)| r.bytes_h2d as f64 / gib).collect();
    let (lo, hi) = moved
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), &m| (lo.min(m), hi.max(m)));
    assert!(
        hi < 1.1 * lo && hi < 8.0,
        "GiB copied in per iteration at each rate: {moved:?}"
    );
    // Slower copies, a longer step, but not by more than the rates differ.
    let steps: Vec<u64> = runs.iter().map(|(_, r)| r.step_ns).collect();
    assert!(
        steps.windows(2).all(|w| w[0] <= w[1]) && steps[2] < steps[0] * 11 / 10,
        "steps (ns): {steps:?}"
    );
}

#[test]
#[ignore = "prints the results table of docs/replay-results.md"]
fn results_table() {
    let ms = |ns: u64| format!("{:.1}", ns as f64 / 1e6);
    let gib = |b: u64| format!("{:.2}", b as f64 / (1u64 << 30) as f64);
    println!(
        "| trace | budget | compute ms | lower bound ms | plan ms | plan/bound | lru ms | \
         none ms | plan H2D+D2H GiB/iter | lru H2D+D2H GiB/iter |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for name in TRACES {
        let a = analysis(name);
        for percent in [75, 50, 30] {
            let b = budget(&a, percent);
            let [plan, lru, none] = evaluations(&a, b);
            let bound = plan.bound.unwrap().bound_ns;
            let (p, l, n) = (&plan.report, &lru.report, &none.report);
            println!(
                "| {name} | {percent}% ({} GiB) | {} | {} | {} | {:.3} | {} | {}{} | {} | {} |",
                gib(b.bytes),
                ms(p.compute_ns),
                ms(bound),
                ms(p.step_ns),
                p.step_ns as f64 / bound as f64,
                ms(l.step_ns),
                ms(n.step_ns),
                if n.fits { "" } else { " (over budget: OOM)" },
                gib(p.bytes_h2d + p.bytes_d2h),
                gib(l.bytes_h2d + l.bytes_d2h),
            );
        }
    }
}
