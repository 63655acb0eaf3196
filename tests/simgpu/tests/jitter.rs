//! TENSILE_SIM_JITTER_US reorders the interleaving of streams without changing what a
//! correctly synchronized program computes (its own process: it changes global timing).

mod common;

use std::time::Duration;

use common::*;
use tensile_driver_abi::*;

#[test]
fn jitter_shuffles_timing_but_not_the_results_of_correct_programs() {
    std::env::set_var("TENSILE_SIM_JITTER_US", "300");
    fresh_context();
    let delays: Vec<Duration> = (0..200).map(|_| cuda::config::jitter_delay()).collect();
    assert!(delays.iter().all(|d| *d <= Duration::from_micros(300)));
    assert!(
        delays.iter().filter(|d| !d.is_zero()).count() > 100,
        "jitter not configured"
    );
    let (a, b) = (
        new_stream(CU_STREAM_NON_BLOCKING),
        new_stream(CU_STREAM_NON_BLOCKING),
    );
    let (x, y) = (alloc(4096), alloc(4096));
    let mut ev = std::ptr::null_mut();
    // SAFETY: valid out-pointer and handles.
    unsafe { ck(cuda::api::event::cuEventCreate(&mut ev, 0)) };
    for seed in 0..20u32 {
        ck(launch_packed(
            function("fill_pattern"),
            a,
            &tensile_kernels::args::fill_pattern(x, 1024, seed),
        ));
        // SAFETY: valid handles.
        unsafe {
            ck(cuda::api::event::cuEventRecord(ev, a));
            ck(cuda::api::stream::cuStreamWaitEvent(b, ev, 0));
        }
        ck(launch_packed(
            function("copy_u32"),
            b,
            &tensile_kernels::args::copy_u32(y, x, 1024),
        ));
        // SAFETY: as above.
        unsafe {
            ck(cuda::api::event::cuEventRecord(ev, b));
            ck(cuda::api::stream::cuStreamWaitEvent(a, ev, 0));
        }
        ck(sync(b));
        let want: Vec<u32> = (0..1024)
            .map(|i| tensile_kernels::twins::pattern_value(seed, i))
            .collect();
        same(&download_u32(y, 1024), &want, "pipeline under jitter");
    }
    cuda::config::set_jitter(Duration::ZERO);
    ck(ctx_sync());
}
