//! How much a launch costs the caller: the API must return in microseconds, not
//! milliseconds (printed, and bounded loosely so a loaded machine does not fail it).

mod common;

use std::time::{Duration, Instant};

use common::*;
use tensile_driver_abi::*;
use tensile_kernels::ParamBuilder;

#[test]
fn launches_cost_microseconds() {
    fresh_context();
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let x = alloc(4096);
    let f = function("fill_pattern");
    let params = ParamBuilder::new().ptr(x).u64(16).u32(1).build();
    let n = 20_000;
    let start = Instant::now();
    for _ in 0..n {
        ck(launch_packed(f, s, &params));
    }
    let per_launch = start.elapsed() / n;
    ck(sync(s));
    let per_kernel = start.elapsed() / n;
    println!("per launch call: {per_launch:?}; launch to completion: {per_kernel:?}");
    assert!(
        per_launch < Duration::from_micros(200),
        "{per_launch:?} per launch"
    );
}
