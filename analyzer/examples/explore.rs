use tensile_analyzer::*;
fn main() {
    for name in std::env::args().skip(1) {
        let t0 = std::time::Instant::now();
        let trace = import::load(std::path::Path::new(&name), Default::default()).unwrap();
        let t1 = t0.elapsed();
        let it = iteration::detect(&trace).unwrap();
        let t2 = t0.elapsed();
        println!(
            "{name}: ops {} load {:?} detect {:?} period {} score {} starts {:?} lens {:?} rep {}",
            trace.ops.len(),
            t1,
            t2 - t1,
            it.period,
            it.score_millis,
            it.starts(),
            it.spans.iter().map(|s| s.len()).collect::<Vec<_>>(),
            it.representative
        );
        let cycle = Cycle::from_trace(&trace, &it, &CostModel::default());
        let fp = timeline::Footprint::of(&cycle);
        println!(
            "  tensors {} compute {:.2} ms peak alloc {:.3} GiB needed {:.3} GiB est {}",
            cycle.tensors.len(),
            fp.compute_ns as f64 / 1e6,
            fp.peak_allocated as f64 / (1u64 << 30) as f64,
            fp.peak_needed as f64 / (1u64 << 30) as f64,
            cycle.estimated_launches
        );
        let cost = CostModel::default();
        for pct in [75u64, 50, 30] {
            let budget = Budget::new(fp.peak_allocated * pct / 100);
            let t3 = std::time::Instant::now();
            let plan = plan::plan(&cycle, &budget, &cost);
            let tp = t3.elapsed();
            let lb = bound::lower_bound(&cycle, &budget, &cost);
            println!(
                "  {pct}% bound {:?}",
                lb.map(|b| (
                    b.bound_ns as f64 / 1e6,
                    b.trivial_ns as f64 / 1e6,
                    b.critical_op
                ))
            );
            match plan {
                Ok(plan) => {
                    let r = sim::simulate(
                        &cycle,
                        sim::Policy::Plan(&plan),
                        budget,
                        &cost,
                        Default::default(),
                    );
                    let l =
                        sim::simulate(&cycle, sim::Policy::Lru, budget, &cost, Default::default());
                    let n =
                        sim::simulate(&cycle, sim::Policy::None, budget, &cost, Default::default());
                    let show = |r: &Result<sim::SimReport, sim::SimError>| {
                        match r {
                        Ok(r) => format!("{:.2}ms stall {:.2} h2d {:.2}GB d2h {:.2}GB peak {:.2}GiB dem {} cyc {:?}", r.step_ns as f64/1e6, r.stall_ns as f64/1e6, r.bytes_h2d as f64/1e9, r.bytes_d2h as f64/1e9, r.peak_resident_bytes as f64/(1u64<<30) as f64, r.demand_fetches, r.step_ns_per_cycle),
                        Err(e) => format!("ERR {e}"),
                    }
                    };
                    println!(
                        "  {pct}%: plan({:?}, {} evictions) {}",
                        tp,
                        plan.evictions.len(),
                        show(&r)
                    );
                    println!("        lru {}", show(&l));
                    println!("        none {}", show(&n));
                }
                Err(e) => println!("  {pct}%: {e}"),
            }
        }
        let whole = iteration::allocated_before_ops(&trace);
        println!(
            "  whole-trace alloc peak {:.3} GiB",
            *whole.iter().max().unwrap() as f64 / (1u64 << 30) as f64
        );
    }
}
