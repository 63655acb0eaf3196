use tensile_analyzer::*;
fn main() {
    for name in std::env::args().skip(1) {
        let t0 = std::time::Instant::now();
        let trace = import::load(std::path::Path::new(&name), Default::default()).unwrap();
        let t1 = t0.elapsed();
        let it = iteration::detect(&trace).unwrap();
        let t2 = t0.elapsed();
        println!("{name}: ops {} load {:?} detect {:?} period {} score {} starts {:?} lens {:?} rep {}",
            trace.ops.len(), t1, t2 - t1, it.period, it.score_millis, it.starts(),
            it.spans.iter().map(|s| s.len()).collect::<Vec<_>>(), it.representative);
        let cycle = Cycle::from_trace(&trace, &it, &CostModel::default());
        let fp = timeline::Footprint::of(&cycle);
        println!("  tensors {} compute {:.2} ms peak alloc {:.3} GiB needed {:.3} GiB est {}",
            cycle.tensors.len(), fp.compute_ns as f64 / 1e6, fp.peak_allocated as f64 / (1u64<<30) as f64,
            fp.peak_needed as f64 / (1u64<<30) as f64, cycle.estimated_launches);
        let whole = iteration::allocated_before_ops(&trace);
        println!("  whole-trace alloc peak {:.3} GiB", *whole.iter().max().unwrap() as f64 / (1u64<<30) as f64);
    }
}
