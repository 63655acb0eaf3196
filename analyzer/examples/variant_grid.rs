//! Prints the simulated step of a grid of planner settings on a trace's pieces, to see which
//! settings `PLAN_VARIANTS` should hold: `variant_grid TRACE PERCENT`.
use tensile_analyzer::import::{load, LoadOptions};
use tensile_analyzer::pieces;
use tensile_analyzer::plan::{plan_with, PlanOptions};
use tensile_analyzer::sim::{simulate, Policy, SimOptions};
use tensile_analyzer::{analyze, Budget, CostModel};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: variant_grid TRACE PERCENT");
    let pct: u64 = args.next().and_then(|p| p.parse().ok()).expect("PERCENT");
    let trace = load(std::path::Path::new(&path), LoadOptions::default()).expect("trace");
    let cost = CostModel::default();
    let a = analyze(&trace, &cost).expect("iterations");
    let b = Budget::new(a.footprint.peak_allocated * pct / 100);
    let split = pieces::split(
        &a.cycle,
        &pieces::cut(&a.cycle, pieces::piece_bytes(b.bytes)),
    )
    .expect("split");
    let mut rows = Vec::new();
    for prefer_hideable in [true, false] {
        for fetch_lead in [None, Some(1.0), Some(2.0), Some(3.0), Some(6.0)] {
            for headroom in [0.0, 0.03, 0.06, 0.1] {
                for writeback_latency in [false, true] {
                    let o = PlanOptions {
                        prefer_hideable,
                        fetch_lead,
                        headroom,
                        writeback_latency,
                    };
                    let Ok(p) = plan_with(&split, &b, &cost, &o) else {
                        continue;
                    };
                    let Ok(r) = simulate(&split, Policy::Plan(&p), b, &cost, SimOptions::default())
                    else {
                        continue;
                    };
                    rows.push((r.step_ns, o));
                }
            }
        }
    }
    rows.sort_by_key(|r| r.0);
    for (t, o) in rows.iter().take(12) {
        println!("{:.2} ms {o:?}", *t as f64 / 1e6);
    }
}
