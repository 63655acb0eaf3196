use tensile_analyzer::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let trace = import::load(std::path::Path::new(&args[1]), Default::default()).unwrap();
    let pct: u64 = args[2].parse().unwrap();
    let it = iteration::detect(&trace).unwrap();
    let cost = CostModel::default();
    let cycle = Cycle::from_trace(&trace, &it, &cost);
    let fp = timeline::Footprint::of(&cycle);
    let budget = Budget::new(fp.peak_allocated * pct / 100);
    let live = timeline::Liveness::of(&cycle);
    let need = timeline::needed_bytes(&cycle, &live);
    let times = timeline::op_start_times(&cycle);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!("budget {:.3} GiB", gib(budget.bytes));
    let plan = plan::plan(&cycle, &budget, &cost).unwrap();
    for e in &plan.evictions {
        let t = &cycle.tensors[e.tensor as usize];
        println!("evict t{} {:.1}MiB pers={} out_after {} fetch {} need {} (t {:.2}->{:.2} fetch {:.2} ms)", e.tensor, t.bytes as f64/1048576.0, t.is_persistent(), e.gap_from, e.fetch_unrolled, e.gap_to,
            times[e.out_after as usize] as f64/1e6, times[e.needed_by as usize] as f64/1e6, times[e.fetch_at as usize] as f64/1e6);
    }
    let r = sim::simulate(
        &cycle,
        sim::Policy::Plan(&plan),
        budget,
        &cost,
        sim::SimOptions {
            cycles: 3,
            record_curve: true,
        },
    )
    .unwrap();
    let step = if args.len() > 3 {
        args[3].parse().unwrap()
    } else {
        10
    };
    for i in (0..cycle.len()).step_by(step) {
        println!(
            "op {i:4} t {:7.2} need {:.3} ntens {} dur {:.3} simt {:.2} simres {:.3}",
            times[i] as f64 / 1e6,
            gib(need[i]),
            cycle.ops[i].tensors.len(),
            cycle.ops[i].duration_ns as f64 / 1e6,
            r.resident_curve[i].0 as f64 / 1e6,
            gib(r.resident_curve[i].1)
        );
    }
}
