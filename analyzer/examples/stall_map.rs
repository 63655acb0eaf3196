//! Where a plan's steady-state iteration waits: each op that waited, how long, and for which
//! pieces (their eviction: written out after, read back from, needed by).
//!
//! `cargo run --release -p tensile-analyzer --example stall_map -- TRACE PERCENT [SEARCH_MS]`

mod common;

use tensile_analyzer::pieces;
use tensile_analyzer::search::SearchOptions;
use tensile_analyzer::sim::{simulate, Policy, SimOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (a, budget, cost) =
        common::trace_at_percent(&args, 2, "stall_map TRACE PERCENT [SEARCH_MS]");
    let p = common::plan_searched(
        &a,
        budget,
        &cost,
        args.get(2),
        SearchOptions::default().patience,
    );
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
