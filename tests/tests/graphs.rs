//! Stream capture under `LD_PRELOAD`, on the simulated GPU: a graph captured in GLOBAL mode
//! (with a graph allocation inside) and launched repeatedly while uncaptured work forces
//! eviction must give the same bytes as without the shim, and nothing the shim does may
//! break or invalidate the capture.
//!
//! The workload (`wl_graph`) runs once natively, then under the shim with a device budget
//! well under its footprint, with and without randomized stream timing. The trace must show
//! that the manager really swapped.

use tensile_tests::check::trace_stats;
use tensile_tests::expect::named_digests;
use tensile_tests::harness::{temp_trace, Output, Run};
use tensile_trace::Stats;

const MIB: usize = 1 << 20;
const TENSOR_KIB: usize = 1536;
const LAUNCHES: usize = 6;
const PRESSURE: usize = 8;
/// Parameters and accumulator (5 tensors) plus one round of pressure tensors.
const FOOTPRINT: usize = (5 + PRESSURE) * TENSOR_KIB * 1024;
/// Room for what the graph touches (5 tensors, 4 pages) and a little more.
const BUDGET: usize = 12 * MIB;

fn graph_run(lookup: &str) -> Run {
    Run::new(env!("CARGO_BIN_EXE_wl_graph"))
        .arg(lookup)
        .arg(TENSOR_KIB.to_string())
        .arg(LAUNCHES.to_string())
        .arg(PRESSURE.to_string())
}

#[test]
fn a_captured_graph_gives_the_same_bytes_under_eviction() {
    const { assert!(BUDGET < FOOTPRINT) };
    let native = graph_run("proc:13000:0").output();
    native.assert_ok("the native run");
    let want = named_digests(&native.stdout);
    assert_eq!(want.len(), LAUNCHES + 6, "{}", native.stdout);

    // (what, lookup, jitter µs, kernel µs, copy GB/s). Slow kernels and copies widen the
    // window in which an eviction the manager thinks is safe would race a running graph.
    let cases = [
        ("budget", "proc:13000:0", 0, 0, 0),
        ("budget, jitter", "proc:13000:0", 40, 0, 0),
        ("budget, jitter, dlsym", "dlsym:13000:0", 40, 0, 0),
        (
            "budget, slow kernels and copies",
            "proc:13000:0",
            0,
            1000,
            4,
        ),
    ];
    let results: Vec<(&str, Output, Stats)> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|&(what, lookup, jitter, kernel_us, copy_gbps)| {
                scope.spawn(move || {
                    let trace =
                        temp_trace(&format!("graphs-{jitter}-{kernel_us}-{}", lookup.len()));
                    let mut run = graph_run(lookup)
                        .trace(&trace)
                        .env("TENSILE_POLICY", "lru")
                        .env("TENSILE_DEVICE_MEMORY", BUDGET.to_string())
                        .env("TENSILE_SIM_JITTER_US", jitter.to_string())
                        .env("TENSILE_SIM_KERNEL_US", kernel_us.to_string());
                    if copy_gbps > 0 {
                        run = run.env("TENSILE_SIM_COPY_GBPS", copy_gbps.to_string());
                    }
                    let out = run.output();
                    out.assert_ok(what);
                    (what, out.clone(), trace_stats(&trace))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a run thread panicked"))
            .collect()
    });
    for (what, out, stats) in results {
        assert_eq!(
            named_digests(&out.stdout),
            want,
            "{what}: results differ from the native run\n{}",
            out.stderr
        );
        assert!(
            stats.bytes_to_host > 0,
            "{what}: nothing was evicted: {stats:?}"
        );
        assert!(
            stats.peak_resident_bytes as usize <= BUDGET,
            "{what}: peak {} over the budget {BUDGET}",
            stats.peak_resident_bytes
        );
    }
}
