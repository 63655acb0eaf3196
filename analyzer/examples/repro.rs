use tensile_analyzer::cycle::{Cycle, Identity, Tensor};
use tensile_analyzer::*;
fn main() {
    let mut d = vec![1000u64; 40];
    for (i, x) in d.iter_mut().enumerate().skip(32) {
        *x = 500_000 + i as u64 * 1000;
    }
    let tensors = vec![
        Tensor {
            identity: Identity::Transient {
                ordinal: 0,
                bytes: 62914560,
            },
            bytes: 62914560,
            accesses: vec![11, 22],
            alloc_at: Some(0),
            free_at: Some(38),
            source: 0,
        },
        Tensor {
            identity: Identity::Persistent { trace_id: 2 },
            bytes: 16777216,
            accesses: vec![26],
            alloc_at: None,
            free_at: None,
            source: 1,
        },
    ];
    let cycle = Cycle::from_parts(&d, tensors).unwrap();
    let budget = Budget::new(62914560 + ((16777216f64) * 0.84) as u64);
    let cost = CostModel::default();
    for o in plan::PLAN_VARIANTS {
        let p = plan::plan_with(&cycle, &budget, &cost, &o).unwrap();
        println!(
            "{o:?} {:?} host {:?} start {:?}",
            p.evictions,
            p.host_resident,
            p.on_host_at_start()
        );
        println!(
            "  {:?}",
            sim::simulate(
                &cycle,
                sim::Policy::Plan(&p),
                budget,
                &cost,
                Default::default()
            )
            .map(|r| r.step_ns)
        );
    }
}
