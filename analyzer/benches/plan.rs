//! Analysis and planning of one iteration of the shared ResNet-50 and transformer traces
//! (target: under 100 ms each on the development machine, fast enough to re-plan online).
//!
//! `cargo bench -p tensile-analyzer --bench plan`

use std::path::Path;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use tensile_analyzer::import::{load, LoadOptions};
use tensile_analyzer::{analyze, Budget, CostModel};

fn bench(c: &mut Criterion) {
    let cost = CostModel::default();
    for name in ["resnet50", "bert"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(format!("{name}.trace.gz"));
        let trace = load(&path, LoadOptions::default()).expect("shared trace");
        let analysis = analyze(&trace, &cost).expect("iterations");
        let budget = Budget::new(analysis.footprint.peak_allocated / 2);
        let mut group = c.benchmark_group(name);
        group.sample_size(20);
        group.bench_function("analyze (iteration, cycle, footprint)", |b| {
            b.iter(|| analyze(black_box(&trace), &cost).expect("iterations"))
        });
        group.bench_function("plan at 50% (variants simulated)", |b| {
            b.iter(|| tensile_analyzer::plan::plan(black_box(&analysis.cycle), &budget, &cost))
        });
        // As `tensile replay` searches: it knows the lower bound and stops there.
        let floor_ns = tensile_analyzer::bound::lower_bound(&analysis.cycle, &budget, &cost)
            .expect("bound")
            .bound_ns;
        for (label, floor_ns) in [
            ("plan + default local search at 50%", floor_ns),
            ("plan + default local search at 50%, no bound known", 0),
        ] {
            let options = tensile_analyzer::search::SearchOptions {
                floor_ns,
                ..Default::default()
            };
            group.bench_function(label, |b| {
                b.iter(|| {
                    let p =
                        tensile_analyzer::plan::plan(black_box(&analysis.cycle), &budget, &cost)
                            .expect("plan");
                    tensile_analyzer::search::improve(&analysis.cycle, &p, budget, &cost, &options)
                })
            });
        }
        group.bench_function("lower bound at 50%", |b| {
            b.iter(|| {
                tensile_analyzer::bound::lower_bound(black_box(&analysis.cycle), &budget, &cost)
            })
        });
        group.bench_function("analyze + plan at 50%", |b| {
            b.iter(|| {
                let a = analyze(black_box(&trace), &cost).expect("iterations");
                let budget = Budget::new(a.footprint.peak_allocated / 2);
                tensile_analyzer::plan::plan(&a.cycle, &budget, &cost).expect("plan")
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
