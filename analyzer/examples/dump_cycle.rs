//! Prints a trace's steady-state cycle as plain text, for offline study of the planner's input:
//! `op <pos> <duration_ns> <tensor ids...>` lines, then
//! `tensor <id> <bytes> <persistent 0|1> <accesses...>` lines, `needed <pos> <bytes>`,
//! `gap <tensor> <from> <to>` (unrolled) and `idle <tensor>` lines.
//!
//! `cargo run --release -p tensile-analyzer --example dump_cycle -- TRACE > cycle.txt`

use tensile_analyzer::import::{load, LoadOptions};
use tensile_analyzer::timeline::{needed_bytes, Liveness};
use tensile_analyzer::{analyze, CostModel};

fn main() {
    let path = std::env::args().nth(1).expect("usage: dump_cycle TRACE");
    let trace = load(std::path::Path::new(&path), LoadOptions::default()).expect("load");
    let a = analyze(&trace, &CostModel::default()).expect("analyze");
    println!("peak_allocated {}", a.footprint.peak_allocated);
    for (i, op) in a.cycle.ops.iter().enumerate() {
        let ts: Vec<String> = op.tensors.iter().map(|t| t.to_string()).collect();
        println!("op {i} {} {}", op.duration_ns, ts.join(" "));
    }
    let live = Liveness::of(&a.cycle);
    for (i, n) in needed_bytes(&a.cycle, &live).iter().enumerate() {
        println!("needed {i} {n}");
    }
    for g in &live.gaps {
        println!("gap {} {} {}", g.tensor, g.from, g.to);
    }
    for t in &live.idle {
        println!("idle {t}");
    }
    for (i, t) in a.cycle.tensors.iter().enumerate() {
        let acc: Vec<String> = t.accesses.iter().map(|a| a.to_string()).collect();
        println!(
            "tensor {i} {} {} {}",
            t.bytes,
            u8::from(t.is_persistent()),
            acc.join(" ")
        );
    }
}
