use tensile_analyzer::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let trace = import::load(std::path::Path::new(&args[1]), Default::default()).unwrap();
    let it = iteration::detect(&trace).unwrap();
    let cycle = Cycle::from_trace(&trace, &it, &CostModel::default());
    let (a, b): (usize, usize) = (args[2].parse().unwrap(), args[3].parse().unwrap());
    for i in a..b {
        let op = &cycle.ops[i];
        let name = match op.kind {
            model::OpKind::Launch { kernel } => trace
                .kernel_name(kernel)
                .unwrap_or("?")
                .chars()
                .take(60)
                .collect::<String>(),
            k => format!("{k:?}"),
        };
        let ts: Vec<String> = op
            .tensors
            .iter()
            .map(|&t| {
                format!(
                    "{}{}:{}",
                    if cycle.tensors[t as usize].is_persistent() {
                        "P"
                    } else {
                        "t"
                    },
                    t,
                    cycle.tensors[t as usize].bytes >> 20
                )
            })
            .collect();
        println!(
            "{i} {:.3} {name} {}",
            op.duration_ns as f64 / 1e6,
            ts.join(" ")
        );
    }
}
