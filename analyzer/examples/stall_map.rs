//! Where a plan's steady-state iteration waits: each op that waited, how long, and for which
//! pieces (their eviction: written out after, read back from, needed by).
//!
//! `cargo run --release -p tensile-analyzer --example stall_map -- TRACE PERCENT [SEARCH_MS]`

use std::time::Duration;

use tensile_analyzer::import::{load, LoadOptions};
use tensile_analyzer::search::{improve, SearchOptions};
use tensile_analyzer::sim::{simulate, Policy, SimOptions};
use tensile_analyzer::{analyze, pieces, plan::plan, Budget, CostModel};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: stall_map TRACE PERCENT [SEARCH_MS]");
        std::process::exit(2);
    }
    let trace = load(std::path::Path::new(&args[0]), LoadOptions::default()).unwrap();
    let cost = CostModel::default();
    let a = analyze(&trace, &cost).unwrap();
    let percent: u64 = args[1].parse().expect("PERCENT");
    let budget = Budget::new(a.footprint.peak_allocated * percent / 100);
    let mut p = plan(&a.cycle, &budget, &cost).unwrap();
    if let Some(ms) = args.get(2) {
        let options = SearchOptions {
            time_limit: Duration::from_millis(ms.parse().expect("SEARCH_MS")),
            ..SearchOptions::default()
        };
        p = improve(&a.cycle, &p, budget, &cost, &options).0;
    }
    let split = pieces::split(&a.cycle, &p.pieces).unwrap();
    let mut whole = p.clone();
    whole.pieces = pieces::whole(&split);
    let options = SimOptions {
        record_waits: true,
        ..SimOptions::default()
    };
    let r = simulate(&split, Policy::Plan(&whole), budget, &cost, options).unwrap();
    println!(
        "period {} ops, {} pieces, {} evictions; step {:.3} ms, stall {:.3} ms, compute {:.3} ms",
        split.len(),
        split.tensors.len(),
        whole.evictions.len(),
        r.step_ns as f64 / 1e6,
        r.stall_ns as f64 / 1e6,
        r.compute_ns as f64 / 1e6
    );
    println!(
        "settled after {} iterations, {} per steady cycle",
        r.settled_after, r.steady_iterations
    );
    for w in &r.waits {
        print!("op {:4} waited {:8.3} us:", w.op, w.waited_ns as f64 / 1e3);
        for &t in &w.tensors {
            let mb = split.tensors[t as usize].bytes as f64 / (1 << 20) as f64;
            let e = whole
                .evictions
                .iter()
                .find(|e| e.piece == t && e.needed_by == w.op);
            match e {
                Some(e) => print!(
                    " [{t} {mb:.1}MiB out {} fetch {} need {}]",
                    e.out_after, e.fetch_at, e.needed_by
                ),
                None => print!(" [{t} {mb:.1}MiB absent]"),
            }
        }
        println!();
    }
}
