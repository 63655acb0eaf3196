//! Where the LRU model moves bytes over its steady-state iteration, op range by op range, as
//! the library's manager runs LRU (whole 2 MiB pages, its free reserve, the host running
//! ahead) with the H100's remap costs: to set beside what a rerun under `--policy lru`
//! measured (`swaps_by_cause` on its trace, whose launches follow the ops closely).
//!
//! `cargo run --release -p tensile-analyzer --example lru_by_op -- TRACE PERCENT [BUCKETS]`
//!
//! Pages are 2 MiB ones at the trace's sizes (a rerun at `--scale F` plays pages F times
//! smaller: the same counts).

mod common;

use std::collections::BTreeMap;

use tensile_analyzer::cost::{RemapModel, SwappedMapping};
use tensile_analyzer::cycle::MoveUnits;
use tensile_analyzer::pieces;
use tensile_analyzer::sim::{simulate, Policy, SimOptions};
use tensile_analyzer::SHIM_MAX_UNIT_PAGES;

const PAGE: u64 = 2 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (a, budget, cost) = common::trace_at_percent(&args, 2, "lru_by_op TRACE PERCENT [BUCKETS]");
    let buckets: usize = args.get(2).map_or(12, |b| b.parse().expect("BUCKETS"));
    let cycle = a
        .cycle
        .clone()
        .with_units(MoveUnits::ShimPages)
        .with_page_bytes(PAGE);
    let per_unit = cycle.pages_per_unit(PAGE, SHIM_MAX_UNIT_PAGES);
    let cost =
        cost.with_page_remaps(RemapModel::h100(SwappedMapping::HostUnits).per_page(per_unit, PAGE));
    let options = SimOptions {
        record_curve: true,
        ..SimOptions::default()
    };
    let r = simulate(&cycle, Policy::Lru, budget, &cost, options).expect("simulation");
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "step {:.2} ms, H2D {:.2} GiB, D2H {:.2} GiB per iteration ({} ops), {:.2} GiB of it \
         swap-outs an op cancelled ({} pages)",
        r.step_ns as f64 / 1e6,
        gib(r.bytes_h2d),
        gib(r.bytes_d2h),
        cycle.len(),
        gib(r.bytes_cancelled),
        r.bytes_cancelled.div_ceil(PAGE)
    );
    // The op running when each copy started (by the op start times of the last iteration).
    let starts: Vec<f64> = r.resident_curve.iter().map(|&(t, _)| t as f64).collect();
    let op_at = |t: f64| starts.iter().rposition(|&s| s <= t).unwrap_or(0);
    let width = cycle.len().div_ceil(buckets).max(1);
    let mut pages = vec![(0u64, 0u64); buckets];
    for c in &r.copies {
        let b = (op_at(c.start_ns) / width).min(buckets - 1);
        let n = c.bytes.div_ceil(PAGE);
        if c.to_device {
            pages[b].0 += n;
        } else {
            pages[b].1 += n;
        }
    }
    // By tensor: the copies name the pages the simulator cut the tensors into, as `cut` does.
    let pages_of = pieces::cut(&cycle, cycle.page_bytes);
    let mut by_tensor: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for c in &r.copies {
        let t = pages_of[c.tensor as usize].tensor;
        let e = by_tensor.entry(t).or_default();
        let n = c.bytes.div_ceil(PAGE);
        if c.to_device {
            e.0 += n;
        } else {
            e.1 += n;
        }
    }
    let mut rows: Vec<(u32, (u64, u64))> = by_tensor.into_iter().collect();
    rows.sort_by_key(|&(_, (back, out))| std::cmp::Reverse(out as i64 - back as i64));
    println!("by tensor (pages of 2 MiB; ops where it is made, freed, used), most out and not back first:");
    println!(
        "{:>6} {:>12} {:>6} {:>6} {:>6} {:>6}  uses",
        "tensor", "bytes", "out", "back", "made", "freed"
    );
    // TENSILE_ALL_TENSORS=1: every one.
    let shown = if std::env::var_os("TENSILE_ALL_TENSORS").is_some() {
        rows.len()
    } else {
        40
    };
    for (t, (back, out)) in rows.iter().take(shown) {
        let tensor = &cycle.tensors[*t as usize];
        let at = |o: Option<u32>| o.map_or("-".to_string(), |o| o.to_string());
        println!(
            "{t:>6} {:>12} {out:>6} {back:>6} {:>6} {:>6}  {:?}",
            tensor.bytes,
            at(tensor.alloc_at),
            at(tensor.free_at),
            tensor.accesses
        );
    }
    println!("pages (2 MiB) by the op their copy started at:");
    println!("{:>10} {:>9} {:>9}", "ops", "to device", "to host");
    for (i, (d, h)) in pages.iter().enumerate() {
        println!(
            "{:>10} {d:>9} {h:>9}",
            format!("{}-{}", i * width, (i + 1) * width)
        );
    }
}
