//! The card keeps time like an H100 (`card.rs`): one copy engine per direction shared by all
//! streams, both directions capped together, one compute engine, pageable memory staged, and
//! kernels paying for host-located bytes. Bandwidths here are a few GB/s or less so that every
//! interval is tens of milliseconds, and the assertions leave wide margins for a loaded
//! machine: each checks a lower bound the model guarantees and an upper bound well below what
//! the rule being tested rules out.
//!
//! The tests share the process's card and settings, so they take turns.

mod common;

use std::ffi::c_void;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use cuda::api::copy::*;
use cuda::api::memory::*;
use cuda::config::{self, Rates};
use tensile_driver_abi::*;
use tensile_kernels::ParamBuilder;

static TURN: Mutex<()> = Mutex::new(());

const MIB: usize = 1 << 20;

/// Takes this test's turn, with a fresh context and the given bandwidths, instantaneous
/// kernels and one compute slot.
fn setup(rates: Rates) -> std::sync::MutexGuard<'static, ()> {
    let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    fresh_context();
    config::set_rates(rates);
    config::set_kernel_duration(Duration::ZERO);
    config::set_kernel_concurrency(1);
    cuda::card::reset();
    turn
}

fn pinned(bytes: usize) -> *mut c_void {
    let mut p = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ck(unsafe { cuMemHostAlloc(&mut p, bytes, 0) });
    p
}

fn gbps(x: f64) -> u64 {
    (x * 1e9) as u64
}

/// Seconds to move `bytes` at `rate` bytes per second.
fn secs(bytes: usize, rate: u64) -> Duration {
    Duration::from_secs_f64(bytes as f64 / rate as f64)
}

#[test]
fn two_uploads_on_two_streams_take_twice_as_long_as_one() {
    let rate = gbps(1.0);
    let _turn = setup(Rates {
        to_device: rate,
        to_host: rate,
        ..Rates::UNLIMITED
    });
    let bytes = 32 * MIB;
    let one = secs(bytes, rate);
    let (src, a, b) = (pinned(bytes), alloc(bytes), alloc(bytes));
    let (s1, s2) = (new_stream(0), new_stream(0));
    // Touch every buffer once first: the first copy into fresh memory pays its page faults.
    // SAFETY: pinned source and device destinations of `bytes`.
    unsafe {
        ck(cuMemcpyHtoDAsync_v2(a, src, bytes, s1));
        ck(cuMemcpyHtoDAsync_v2(b, src, bytes, s1));
    }
    ck(sync(s1));
    let start = Instant::now();
    // SAFETY: as above.
    ck(unsafe { cuMemcpyHtoDAsync_v2(a, src, bytes, s1) });
    ck(sync(s1));
    let alone = start.elapsed();
    let start = Instant::now();
    // SAFETY: as above.
    unsafe {
        ck(cuMemcpyHtoDAsync_v2(a, src, bytes, s1));
        ck(cuMemcpyHtoDAsync_v2(b, src, bytes, s2));
    }
    ck(sync(s1));
    ck(sync(s2));
    let together = start.elapsed();
    assert!(alone >= one, "one upload: {alone:?}, modelled {one:?}");
    assert!(
        together >= one * 2,
        "two uploads: {together:?}, modelled {:?}",
        one * 2
    );
    // Had they shared nothing they would have taken `one`.
    assert!(
        together > one * 3 / 2,
        "two uploads overlapped: {together:?}"
    );
}

#[test]
fn copies_both_ways_overlap_up_to_the_duplex_cap() {
    let rate = gbps(0.25);
    let _turn = setup(Rates {
        to_device: rate,
        to_host: rate,
        duplex: gbps(0.375),
        ..Rates::UNLIMITED
    });
    let bytes = 32 * MIB;
    let one = secs(bytes, rate);
    let (host_in, host_out, a, b) = (pinned(bytes), pinned(bytes), alloc(bytes), alloc(bytes));
    let (s1, s2) = (new_stream(0), new_stream(0));
    // Touch every buffer once first: the first copy into fresh memory pays its page faults.
    // SAFETY: pinned host buffers and device ranges of `bytes`.
    unsafe {
        ck(cuMemcpyHtoDAsync_v2(a, host_in, bytes, s1));
        ck(cuMemcpyDtoHAsync_v2(host_out, b, bytes, s2));
    }
    ck(sync(s1));
    ck(sync(s2));
    cuda::card::reset();
    let start = Instant::now();
    // SAFETY: pinned host buffers and device ranges of `bytes`.
    unsafe {
        ck(cuMemcpyHtoDAsync_v2(a, host_in, bytes, s1));
        ck(cuMemcpyDtoHAsync_v2(host_out, b, bytes, s2));
    }
    ck(sync(s1));
    ck(sync(s2));
    let both = start.elapsed();
    // The cap: 2 x 32 MiB at 0.375 GB/s at best; the model gives the later copy 0.125 GB/s
    // while the first runs, then 0.25 GB/s: 1.5 x `one`.
    assert!(
        both >= secs(2 * bytes, gbps(0.375)),
        "faster than the duplex cap allows: {both:?}"
    );
    assert!(
        both < one * 2 - one / 8,
        "the two directions did not overlap: {both:?} (one copy: {one:?})"
    );
}

fn fill(p: CUdeviceptr, words: usize, stream: CUstream) {
    let params = ParamBuilder::new().ptr(p).u64(words as u64).u32(7).build();
    ck(launch_packed(function("fill_pattern"), stream, &params));
}

#[test]
fn kernels_on_two_streams_take_turns_unless_concurrency_allows_more() {
    let _turn = setup(Rates::UNLIMITED);
    let kernel = Duration::from_millis(300);
    config::set_kernel_duration(kernel);
    let (x, y) = (alloc(4096), alloc(4096));
    let (s1, s2) = (
        new_stream(CU_STREAM_NON_BLOCKING),
        new_stream(CU_STREAM_NON_BLOCKING),
    );
    let run_both = || {
        let start = Instant::now();
        fill(x, 1024, s1);
        fill(y, 1024, s2);
        ck(sync(s1));
        ck(sync(s2));
        start.elapsed()
    };
    let serial = run_both();
    assert!(serial >= kernel * 2, "kernels overlapped: {serial:?}");
    config::set_kernel_concurrency(2);
    let concurrent = run_both();
    assert!(concurrent >= kernel, "{concurrent:?}");
    assert!(
        concurrent < kernel * 2 - kernel / 4,
        "kernels did not overlap with two slots: {concurrent:?}"
    );
}

#[test]
fn a_kernel_touching_host_memory_pays_for_the_bytes_and_they_are_counted() {
    let _turn = setup(Rates::UNLIMITED);
    let bytes = MIB / 4;
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let on_device = alloc(bytes);
    // Pinned host memory through its device pointer (zero-copy).
    let host = pinned(bytes);
    let mut on_host = 0;
    // SAFETY: `host` is pinned memory of this context.
    ck(unsafe { cuMemHostGetDevicePointer_v2(&mut on_host, host, 0) });
    // Once each with no bus time, so that the timed runs pay no page faults.
    for p in [on_device, on_host] {
        fill(p, bytes / 4, s);
    }
    ck(sync(s));
    let rate = gbps(0.0005);
    config::set_rates(Rates {
        host_access: rate,
        ..Rates::UNLIMITED
    });
    let timed = |p: CUdeviceptr| {
        let (before, start) = (cuda::card::host_access_bytes(), Instant::now());
        fill(p, bytes / 4, s);
        ck(sync(s));
        (start.elapsed(), cuda::card::host_access_bytes() - before)
    };
    let (device_time, device_bytes) = timed(on_device);
    let (host_time, host_bytes) = timed(on_host);
    assert_eq!(device_bytes, 0);
    assert_eq!(host_bytes, bytes as u64);
    let bus = secs(bytes, rate);
    assert!(host_time >= bus, "{host_time:?} < {bus:?}");
    // The kernel's own run overlaps the bus time (both count from when it was ready), so
    // compare with the bus time alone.
    assert!(
        device_time < bus / 2,
        "host {host_time:?}, device {device_time:?}, bus {bus:?}"
    );
    // SAFETY: the words were written by the kernel, which has finished.
    let first = unsafe { *(host as *const u32) };
    assert_eq!(first, tensile_kernels::twins::pattern_value(7, 0));
}

#[test]
fn pageable_host_memory_is_slower_than_pinned() {
    let _turn = setup(Rates {
        to_device: gbps(2.0),
        to_host: gbps(2.0),
        pageable: gbps(0.4),
        ..Rates::UNLIMITED
    });
    let bytes = 16 * MIB;
    let dst = alloc(bytes);
    let pageable = vec![0u8; bytes];
    let pin = pinned(bytes);
    let timed = |src: *const c_void| {
        let start = Instant::now();
        // SAFETY: `src` holds `bytes`; `dst` is a device range of `bytes`.
        ck(unsafe { cuMemcpyHtoD_v2(dst, src, bytes) });
        start.elapsed()
    };
    // The first copy of each pays the page faults of fresh memory: time the second.
    let (_, slow) = (
        timed(pageable.as_ptr().cast()),
        timed(pageable.as_ptr().cast()),
    );
    let (_, fast) = (timed(pin.cast_const()), timed(pin.cast_const()));
    assert!(slow >= secs(bytes, gbps(0.4)), "pageable: {slow:?}");
    assert!(fast >= secs(bytes, gbps(2.0)), "pinned: {fast:?}");
    assert!(
        fast * 2 < slow,
        "pinned {fast:?} is not faster than pageable {slow:?}"
    );
}

/// Runs `f` `n` times and returns the fastest run (the others may be descheduled).
fn fastest(n: usize, mut f: impl FnMut()) -> Duration {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

#[test]
fn vmm_calls_hold_their_caller_per_mapping_as_on_the_h100() {
    let _turn = setup(Rates::UNLIMITED);
    let costs = config::VmmCosts::SIMULATED;
    const PAGE: usize = 2 * MIB;
    let va = reserve(8 * PAGE);
    let pages: Vec<_> = (0..4).map(|_| create(PAGE, device_loc())).collect();
    // Free unless asked for (the test suite's default) ...
    config::set_vmm_time(0.0);
    let free = fastest(5, || {
        for (i, &h) in pages.iter().enumerate() {
            ck(map(va + (i * PAGE) as u64, PAGE, h));
        }
        ck(set_access(va, 4 * PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
        ck(unmap(va, 4 * PAGE));
    });
    // ... and with the H100's costs, one access and one unmap call over four one-page
    // mappings cost four times what they cost for one: the cost is per mapping.
    config::set_vmm_time(1.0);
    let modelled = |n: u64| {
        Duration::from_nanos(n * (costs.map_ns[0] + costs.access_ns[0] + costs.unmap_ns[0]))
    };
    let four = fastest(5, || {
        for (i, &h) in pages.iter().enumerate() {
            ck(map(va + (i * PAGE) as u64, PAGE, h));
        }
        ck(set_access(va, 4 * PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
        ck(unmap(va, 4 * PAGE));
    });
    let whole = create(4 * PAGE, device_loc());
    let one = fastest(5, || {
        ck(map(va, 4 * PAGE, whole));
        ck(set_access(va, 4 * PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
        ck(unmap(va, 4 * PAGE));
    });
    // Host memory's access and unmap calls cost per page of a mapping too.
    let host = create(4 * PAGE, host_loc());
    let host_one = fastest(3, || {
        ck(map(va, 4 * PAGE, host));
        ck(set_access(va, 4 * PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
        ck(unmap(va, 4 * PAGE));
    });
    let host_modelled = Duration::from_nanos(
        costs.map_ns[1]
            + costs.access_ns[1]
            + costs.unmap_ns[1]
            + 4 * (costs.access_page_ns[1] + costs.unmap_page_ns[1]),
    );
    config::set_vmm_time(0.0);
    assert!(
        host_one >= host_modelled,
        "{host_one:?} for one host mapping of four pages"
    );
    assert!(four >= modelled(4), "{four:?} for four mappings");
    assert!(one >= modelled(1), "{one:?} for one mapping");
    assert!(
        one < four / 2,
        "{one:?} against {four:?}: one mapping of four pages costs as one"
    );
    assert!(
        free < four / 2,
        "{free:?} with the costs off, {four:?} with"
    );
    for h in pages.into_iter().chain([whole, host]) {
        // SAFETY: a handle this test created.
        ck(unsafe { cuda::api::vmm::cuMemRelease(h) });
    }
}
