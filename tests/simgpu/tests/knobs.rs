//! The environment knobs: modelled kernel duration and copy bandwidth, read at cuInit, make
//! copy/compute overlap (and its absence) observable.

mod common;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use common::*;
use cuda::api::copy::*;
use cuda::api::memory::*;
use tensile_driver_abi::*;
use tensile_kernels::ParamBuilder;

#[test]
fn modelled_kernel_time_and_copy_bandwidth_overlap_on_different_streams() {
    std::env::set_var("TENSILE_SIM_KERNEL_US", "200000");
    std::env::set_var("TENSILE_SIM_COPY_GBPS", "0.05"); // 50 MB/s: 10 MB take 200 ms
    fresh_context();
    let bytes = 10_000_000usize;
    let mut pinned = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ck(unsafe { cuMemAllocHost_v2(&mut pinned, bytes) });
    let dev = alloc(bytes);
    let (copy_stream, compute) = (
        new_stream(CU_STREAM_NON_BLOCKING),
        new_stream(CU_STREAM_NON_BLOCKING),
    );
    let x = alloc(4096);
    let fill = ParamBuilder::new().ptr(x).u64(16).u32(1).build();

    let start = Instant::now();
    // SAFETY: `pinned` holds `bytes` bytes.
    ck(unsafe { cuMemcpyHtoDAsync_v2(dev, pinned as *const c_void, bytes, copy_stream) });
    ck(launch_packed(function("fill_pattern"), compute, &fill));
    ck(sync(copy_stream));
    let copy_done = start.elapsed();
    ck(sync(compute));
    let both = start.elapsed();
    assert!(
        copy_done >= Duration::from_millis(195),
        "copy took {copy_done:?}"
    );
    assert!(
        both < Duration::from_millis(380),
        "copy and kernel did not overlap: {both:?}"
    );

    // On one stream they serialize.
    let start = Instant::now();
    // SAFETY: as above.
    ck(unsafe { cuMemcpyHtoDAsync_v2(dev, pinned as *const c_void, bytes, compute) });
    ck(launch_packed(function("fill_pattern"), compute, &fill));
    ck(sync(compute));
    assert!(
        start.elapsed() >= Duration::from_millis(395),
        "{:?}",
        start.elapsed()
    );
    // SAFETY: allocated above.
    ck(unsafe { cuMemFreeHost(pinned) });
}
