//! The arena allocator under `LD_PRELOAD`, on the simulated GPU: thousands of live
//! allocations of every size class (exactly 1 MiB, 2 MiB, a page +/- 1 byte and +/- 64 KiB,
//! 1,769,472 bytes among them), freed and reallocated in a seeded random order over two
//! streams, every page of every buffer stamped and checked (`wl_sizes`).
//!
//! The old allocator refused exactly-1-MiB requests after about 65 were live, and GPT-2's
//! 1,769,472-byte ones under swapping. Here the run must succeed and read back exactly what
//! the run without the shim read, with the budget above the footprint (nothing swapped)
//! and at about 30% of it (swapping both ways, within the budget, with stream jitter).

use tensile_tests::check::trace_stats;
use tensile_tests::harness::{temp_trace, Output, Run};

const MIB: u64 = 1 << 20;
const SEED: &str = "7";
const LIVE: &str = "2000";
const ROUNDS: &str = "3";

fn sizes() -> Run {
    Run::new(env!("CARGO_BIN_EXE_wl_sizes"))
        .arg(SEED)
        .arg(LIVE)
        .arg(ROUNDS)
}

/// The lines every run of the seed must print alike (allocations, checks and digest).
fn summary(out: &Output) -> Vec<&str> {
    out.stdout
        .lines()
        .filter(|l| l.starts_with("S ") || l.starts_with("A ") || l.starts_with("C "))
        .collect()
}

#[test]
fn every_size_class_with_thousands_live_above_the_footprint_and_at_30_percent() {
    // The run without the shim and the one with room to spare, side by side.
    let trace = temp_trace("sizes-unlimited");
    let (native, roomy) = std::thread::scope(|scope| {
        let native = scope.spawn(|| sizes().output());
        let roomy = sizes()
            .trace(&trace)
            .env("TENSILE_POLICY", "lru")
            .env("TENSILE_DEVICE_MEMORY", "4GiB")
            .output();
        (native.join().expect("the native run's thread"), roomy)
    });
    native.assert_ok("the native run");
    let want = summary(&native);
    assert_eq!(want.len(), 3, "{}", native.stdout);
    assert!(native.stdout.ends_with("done\n"), "{}", native.stdout);

    // Under the shim with room to spare: the peak resident memory is the footprint.
    roomy.assert_ok("a budget above the footprint");
    assert_eq!(summary(&roomy), want, "{}", roomy.stderr);
    let stats = trace_stats(&trace);
    assert_eq!(
        (stats.bytes_to_host, stats.bytes_to_device),
        (0, 0),
        "swapped with room to spare: {stats:?}"
    );
    let footprint = stats.peak_resident_bytes;
    let _ = std::fs::remove_file(&trace);

    // At 30% of that footprint, in whole pages: it swaps, and stays within the budget; the
    // streams' work is shuffled by up to 20 us per operation, so that memory reused before
    // another stream's free has executed would show.
    let budget = (footprint * 3 / 10) / (2 * MIB) * (2 * MIB);
    let trace = temp_trace("sizes-30pct");
    let tight = sizes()
        .trace(&trace)
        .env("TENSILE_POLICY", "lru")
        .env("TENSILE_DEVICE_MEMORY", budget.to_string())
        .env("TENSILE_SIM_JITTER_US", "20")
        .output();
    tight.assert_ok("a budget of 30% of the footprint");
    assert_eq!(summary(&tight), want, "{}", tight.stderr);
    let stats = trace_stats(&trace);
    let _ = std::fs::remove_file(&trace);
    assert!(
        stats.bytes_to_host > 0 && stats.bytes_to_device > 0,
        "no swapping at {budget} bytes for a {footprint}-byte footprint: {stats:?}"
    );
    assert!(
        stats.peak_resident_bytes <= budget,
        "peak {} over the budget {budget}",
        stats.peak_resident_bytes
    );
    roomy.assert_quiet("with room");
    tight.assert_quiet("at 30% of the footprint");
}
