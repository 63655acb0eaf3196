//! How busy each copy engine is over a plan's steady-state iteration, op range by op range:
//! where the plan leaves an engine idle while the compute stream waits.
//!
//! `cargo run --release -p tensile-analyzer --example engine_map -- TRACE PERCENT [SEARCH_MS [BIN]]`

mod common;

use tensile_analyzer::pieces;
use tensile_analyzer::sim::{simulate, Policy, SimOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (a, budget, cost) =
        common::trace_at_percent(&args, 2, "engine_map TRACE PERCENT [SEARCH_MS [BIN]]");
    let p = common::plan_searched(&a, budget, &cost, args.get(2), None);
    let bin: usize = args.get(3).map_or(8, |b| b.parse().expect("BIN"));
    let split = pieces::split(&a.cycle, &p.pieces).unwrap();
    let mut whole = p.clone();
    whole.pieces = pieces::whole(&split);
    let options = SimOptions {
        record_curve: true,
        record_waits: true,
        ..SimOptions::default()
    };
    let r = simulate(&split, Policy::Plan(&whole), budget, &cost, options).unwrap();
    let n = split.len();
    let mut starts: Vec<f64> = r.resident_curve.iter().map(|c| c.0 as f64).collect();
    starts.push(r.step_ns as f64);
    let busy = |to_device: bool, lo: f64, hi: f64| -> f64 {
        r.copies
            .iter()
            .filter(|c| c.to_device == to_device)
            .map(|c| (c.end_ns.min(hi) - c.start_ns.max(lo)).max(0.0))
            .sum::<f64>()
    };
    println!(
        "step {:.3} ms, stall {:.3} ms; per {bin} ops: wall ms, compute ms, wait ms, H2D busy, D2H busy",
        r.step_ns as f64 / 1e6,
        r.stall_ns as f64 / 1e6
    );
    let (mut idle_h, mut idle_d) = (0.0, 0.0);
    for lo in (0..n).step_by(bin) {
        let hi = (lo + bin).min(n);
        // Wall window: from the end of op lo-1 to the end of op hi-1 (includes the waits).
        let w_lo = if lo == 0 {
            0.0
        } else {
            starts[lo - 1] + split.ops[lo - 1].duration_ns as f64
        };
        let w_hi = starts[hi - 1] + split.ops[hi - 1].duration_ns as f64;
        let compute: u64 = split.ops[lo..hi].iter().map(|o| o.duration_ns).sum();
        let wait: u64 = r
            .waits
            .iter()
            .filter(|w| (lo..hi).contains(&(w.op as usize)))
            .map(|w| w.waited_ns)
            .sum();
        let len = (w_hi - w_lo).max(1.0);
        let bh = busy(true, w_lo, w_hi);
        let bd = busy(false, w_lo, w_hi);
        idle_h += len - bh;
        idle_d += len - bd;
        println!(
            "ops {lo:3}-{:3}: {:7.3} {:7.3} {:7.3}  H2D {:5.1}%  D2H {:5.1}%",
            hi - 1,
            len / 1e6,
            compute as f64 / 1e6,
            wait as f64 / 1e6,
            100.0 * bh / len,
            100.0 * bd / len
        );
    }
    println!(
        "idle H2D {:.3} ms, idle D2H {:.3} ms; bytes H2D {:.3} GiB D2H {:.3} GiB",
        idle_h / 1e6,
        idle_d / 1e6,
        r.bytes_h2d as f64 / (1u64 << 30) as f64,
        r.bytes_d2h as f64 / (1u64 << 30) as f64
    );
}
