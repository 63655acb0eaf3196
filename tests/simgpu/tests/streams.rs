//! Streams really run asynchronously and in order: overlap, events, cross-stream waits, the
//! legacy default stream, per-thread default streams, host functions, stream-ordered frees.
//! Every kernel in this binary takes a modelled 150 ms.

mod common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use cuda::api::event::*;
use cuda::api::launch::cuLaunchKernel_ptsz;
use cuda::api::memory::*;
use cuda::api::stream::*;
use tensile_driver_abi::*;
use tensile_kernels::twins::pattern_value;
use tensile_kernels::ParamBuilder;

const KERNEL: Duration = Duration::from_millis(150);

fn setup() {
    fresh_context();
    // After cuInit, which reads the (unset) environment variables.
    cuda::config::set_kernel_duration(KERNEL);
    // These tests are about stream semantics, not the shared compute engine (tests/timing.rs):
    // kernels of different streams, and of the tests running beside each other in this
    // process, may run at once.
    cuda::config::set_kernel_concurrency(64);
}

fn fill(p: CUdeviceptr, n: usize, seed: u32, stream: CUstream) -> CUresult {
    let params = ParamBuilder::new().ptr(p).u64(n as u64).u32(seed).build();
    launch_packed(function("fill_pattern"), stream, &params)
}

fn copy(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult {
    let params = ParamBuilder::new().ptr(dst).ptr(src).u64(n as u64).build();
    launch_packed(function("copy_u32"), stream, &params)
}

fn pattern(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u64).map(|i| pattern_value(seed, i)).collect()
}

fn event() -> CUevent {
    let mut e = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ck(unsafe { cuEventCreate(&mut e, 0) });
    e
}

#[test]
fn kernels_on_two_streams_overlap_and_launch_returns_at_once() {
    setup();
    let (a, b) = (
        new_stream(CU_STREAM_NON_BLOCKING),
        new_stream(CU_STREAM_NON_BLOCKING),
    );
    let (x, y) = (alloc(4096), alloc(4096));
    let start = Instant::now();
    ck(fill(x, 1024, 1, a));
    ck(fill(y, 1024, 2, b));
    assert!(
        start.elapsed() < KERNEL / 2,
        "launch blocked for {:?}",
        start.elapsed()
    );
    // SAFETY: valid stream handles.
    assert_eq!(unsafe { cuStreamQuery(a) }, CUDA_ERROR_NOT_READY);
    ck(sync(a));
    ck(sync(b));
    let took = start.elapsed();
    assert!(took >= KERNEL, "{took:?}");
    assert!(
        took < KERNEL * 2 - Duration::from_millis(30),
        "streams did not overlap: {took:?}"
    );
    // SAFETY: valid stream handle.
    ck(unsafe { cuStreamQuery(a) });
    same(
        &download_u32(x, 1024),
        &pattern(1, 1024),
        "download_u32(x, 1024)",
    );
    same(
        &download_u32(y, 1024),
        &pattern(2, 1024),
        "download_u32(y, 1024)",
    );
}

#[test]
fn work_on_one_stream_runs_in_order() {
    setup();
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let (x, y) = (alloc(4096), alloc(4096));
    ck(fill(x, 1024, 3, s));
    ck(copy(y, x, 1024, s));
    ck(sync(s));
    same(
        &download_u32(y, 1024),
        &pattern(3, 1024),
        "download_u32(y, 1024)",
    );
}

#[test]
fn a_stream_waiting_on_an_event_sees_the_producers_data() {
    setup();
    let (a, b) = (
        new_stream(CU_STREAM_NON_BLOCKING),
        new_stream(CU_STREAM_NON_BLOCKING),
    );
    let (x, y, z) = (alloc(4096), alloc(4096), alloc(4096));
    let ev = event();
    ck(fill(x, 1024, 4, a));
    // SAFETY: valid handles.
    unsafe {
        ck(cuEventRecord(ev, a));
        assert_eq!(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
        ck(cuStreamWaitEvent(b, ev, 0));
    }
    ck(copy(y, x, 1024, b));
    ck(sync(b));
    same(
        &download_u32(y, 1024),
        &pattern(4, 1024),
        "the wait was not honoured",
    );
    // SAFETY: valid handle.
    ck(unsafe { cuEventQuery(ev) });

    // Without the wait, the consumer (an async copy, which takes no modelled time) races
    // ahead and copies the old contents: an ordering bug in a caller shows up as wrong data.
    ck(fill(x, 1024, 5, a));
    // SAFETY: valid device pointers and stream.
    ck(unsafe { cuda::api::copy::cuMemcpyDtoDAsync_v2(z, x, 4096, b) });
    ck(sync(b));
    same(
        &download_u32(z, 1024),
        &pattern(4, 1024),
        "download_u32(z, 1024)",
    );
    ck(sync(a));
    same(
        &download_u32(x, 1024),
        &pattern(5, 1024),
        "download_u32(x, 1024)",
    );
}

#[test]
fn event_synchronize_and_elapsed_time() {
    setup();
    let s = new_stream(0);
    let (e0, e1) = (event(), event());
    let x = alloc(4096);
    // SAFETY: valid handles and out-pointers.
    unsafe {
        ck(cuEventRecord(e0, s));
        ck(fill(x, 1024, 6, s));
        ck(cuEventRecord(e1, s));
        let mut ms = 0f32;
        assert_eq!(cuEventElapsedTime(&mut ms, e0, e1), CUDA_ERROR_NOT_READY);
        ck(cuEventSynchronize(e1));
        ck(cuEventElapsedTime(&mut ms, e0, e1));
        assert!(ms >= KERNEL.as_millis() as f32 - 1.0, "{ms} ms");
        let never = event();
        assert_eq!(
            cuEventElapsedTime(&mut ms, e0, never),
            CUDA_ERROR_INVALID_HANDLE
        );
        let mut nt = std::ptr::null_mut();
        ck(cuEventCreate(&mut nt, CU_EVENT_DISABLE_TIMING));
        ck(cuEventRecord(nt, s));
        ck(cuEventSynchronize(nt));
        assert_eq!(
            cuEventElapsedTime(&mut ms, e0, nt),
            CUDA_ERROR_INVALID_HANDLE
        );
        ck(cuEventDestroy_v2(nt));
        assert_eq!(cuEventQuery(nt), CUDA_ERROR_INVALID_HANDLE);
    }
}

#[test]
fn legacy_stream_synchronizes_with_blocking_streams_only() {
    setup();
    let blocking = new_stream(0);
    let non_blocking = new_stream(CU_STREAM_NON_BLOCKING);
    let (x, y) = (alloc(4096), alloc(4096));
    // A synchronous copy (legacy stream) waits for the blocking stream's kernel...
    ck(fill(x, 1024, 7, blocking));
    same(
        &download_u32(x, 1024),
        &pattern(7, 1024),
        "download_u32(x, 1024)",
    );
    // ...but not for a non-blocking stream's.
    ck(fill(y, 1024, 8, non_blocking));
    same(
        &download_u32(y, 1024),
        &vec![0; 1024],
        "download_u32(y, 1024)",
    );
    ck(sync(non_blocking));
    same(
        &download_u32(y, 1024),
        &pattern(8, 1024),
        "download_u32(y, 1024)",
    );
    // Work on a blocking stream waits for earlier legacy-stream work.
    let z = alloc(4096);
    ck(fill(z, 1024, 9, std::ptr::null_mut()));
    ck(copy(x, z, 1024, blocking));
    ck(sync(blocking));
    same(
        &download_u32(x, 1024),
        &pattern(9, 1024),
        "download_u32(x, 1024)",
    );
}

#[test]
fn per_thread_default_stream_is_its_own_blocking_stream() {
    setup();
    let (x, y) = (alloc(4096), alloc(4096));
    let params = ParamBuilder::new().ptr(x).u64(1024).u32(10).build();
    let mut p = params.clone();
    let mut size = p.len();
    let mut extra = [
        CU_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
        p.as_mut_ptr() as *mut c_void,
        CU_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
        &mut size as *mut usize as *mut c_void,
        CU_LAUNCH_PARAM_END as *mut c_void,
    ];
    let f = function("fill_pattern");
    // SAFETY: valid handles and parameter list.
    unsafe {
        ck(cuLaunchKernel_ptsz(
            f,
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            extra.as_mut_ptr(),
        ));
        assert_eq!(
            cuStreamQuery_ptsz(std::ptr::null_mut()),
            CUDA_ERROR_NOT_READY
        );
        // The legacy stream is idle, but it waits for the (blocking) per-thread stream.
        ck(cuStreamQuery(std::ptr::null_mut()));
        let mut out = vec![0u32; 1024];
        ck(cuda::api::copy::cuMemcpyDtoH_v2(
            out.as_mut_ptr() as *mut c_void,
            x,
            4096,
        ));
        assert_eq!(out, pattern(10, 1024));
        // A per-thread stream on another thread is a different stream.
        ck(cuda::api::copy::cuMemcpyDtoD_v2_ptds(y, x, 4096));
        let ctx = {
            let mut c = std::ptr::null_mut();
            ck(cuda::api::context::cuCtxGetCurrent(&mut c));
            c as usize
        };
        let other = std::thread::spawn(move || {
            ck(cuda::api::context::cuCtxSetCurrent(ctx as CUcontext));
            let mut id = 0u64;
            ck(cuStreamGetId_ptsz(std::ptr::null_mut(), &mut id));
            id
        })
        .join()
        .unwrap();
        let mut mine = 0u64;
        ck(cuStreamGetId_ptsz(std::ptr::null_mut(), &mut mine));
        assert_ne!(mine, other);
    }
    same(
        &download_u32(y, 1024),
        &pattern(10, 1024),
        "download_u32(y, 1024)",
    );
}

static CALLS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn bump(data: *mut c_void) {
    CALLS.fetch_add(data as usize, Ordering::SeqCst);
}

#[test]
fn host_functions_run_in_stream_order() {
    setup();
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let x = alloc(4096);
    ck(fill(x, 1024, 11, s));
    // SAFETY: `bump` is a valid host function; the data is an integer, not a pointer.
    unsafe { ck(cuLaunchHostFunc(s, Some(bump), 5 as *mut c_void)) };
    assert_eq!(
        CALLS.load(Ordering::SeqCst),
        0,
        "host function ran before the kernel"
    );
    ck(sync(s));
    assert_eq!(CALLS.load(Ordering::SeqCst), 5);
    // SAFETY: a NULL function is refused.
    let rc = unsafe { cuLaunchHostFunc(s, None, std::ptr::null_mut()) };
    assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
}

#[test]
fn stream_ordered_free_keeps_earlier_work_valid_and_faults_later_work() {
    setup();
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let out = alloc(4096);
    let mut p = 0;
    // SAFETY: valid out-pointer and handles.
    unsafe {
        ck(cuMemAllocAsync(&mut p, 4096, s));
        ck(fill(p, 1024, 12, s)); // queued before the free: must work
        ck(copy(out, p, 1024, s));
        ck(cuMemFreeAsync(p, s));
        // A second free of the same allocation is refused at the call, even though the first
        // has not executed yet (the kernel before it takes 150 ms).
        assert_eq!(cuMemFreeAsync(p, s), CUDA_ERROR_INVALID_VALUE);
    }
    ck(sync(s));
    same(
        &download_u32(out, 1024),
        &pattern(12, 1024),
        "download_u32(out, 1024)",
    );
    // After the free executed, the memory is gone: a kernel touching it faults, and the
    // context stays broken.
    ck(fill(p, 1024, 13, s));
    assert_eq!(sync(s), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(ctx_sync(), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(fill(out, 1024, 1, s), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(try_download_u32(out, 4), Err(CUDA_ERROR_ILLEGAL_ADDRESS));
}

#[test]
fn destroying_a_stream_lets_queued_work_finish() {
    setup();
    let s = new_stream(0);
    let x = alloc(4096);
    ck(fill(x, 1024, 14, s));
    // SAFETY: valid handle.
    unsafe {
        ck(cuStreamDestroy_v2(s));
        assert_eq!(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
    }
    ck(ctx_sync());
    same(
        &download_u32(x, 1024),
        &pattern(14, 1024),
        "download_u32(x, 1024)",
    );
}

#[test]
fn unmapping_while_a_kernel_is_queued_faults_the_kernel() {
    setup();
    let va = reserve(GRAN);
    let h = create(GRAN, device_loc());
    ck(map(va, GRAN, h));
    ck(set_access(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    ck(fill(va, 1024, 15, std::ptr::null_mut()));
    // A buggy caller remaps without waiting for the queued kernel (VMM calls are not
    // stream-ordered): the kernel runs after the unmap and faults.
    ck(unmap(va, GRAN));
    assert_eq!(ctx_sync(), CUDA_ERROR_ILLEGAL_ADDRESS);
}

#[test]
fn async_copies_with_pageable_host_memory_behave_like_the_driver() {
    setup();
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let x = alloc(4096);
    // Device to pageable host: returns only once the copy (after the slow kernel) is done.
    ck(fill(x, 1024, 16, s));
    let mut out = vec![0u32; 1024];
    // SAFETY: `out` holds 4096 bytes.
    ck(unsafe {
        cuda::api::copy::cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut c_void, x, 4096, s)
    });
    same(&out, &pattern(16, 1024), "pageable destination");
    // Pageable host to device: the source is staged at the call, so reusing it at once is safe.
    let mut src = pattern(17, 1024);
    ck(fill(x, 1024, 1, s));
    // SAFETY: `src` holds 4096 bytes.
    ck(unsafe { cuda::api::copy::cuMemcpyHtoDAsync_v2(x, src.as_ptr() as *const c_void, 4096, s) });
    src.iter_mut().for_each(|v| *v = 0);
    ck(sync(s));
    same(&download_u32(x, 1024), &pattern(17, 1024), "staged source");
    // Pinned host memory is used in stream order: the call returns before the copy runs.
    let mut pinned = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the pinned buffer holds 4096 bytes.
    unsafe {
        ck(cuMemAllocHost_v2(&mut pinned, 4096));
        ck(fill(x, 1024, 18, s));
        ck(cuda::api::copy::cuMemcpyDtoHAsync_v2(pinned, x, 4096, s));
        let words = std::slice::from_raw_parts(pinned as *const u32, 1024);
        assert_eq!(words[0], 0, "pinned copy completed before the kernel");
        ck(sync(s));
        let words = std::slice::from_raw_parts(pinned as *const u32, 1024);
        same(words, &pattern(18, 1024), "pinned destination after sync");
        ck(cuMemFreeHost(pinned));
    }
}

#[test]
fn synchronous_device_copies_and_memsets_do_not_wait_but_stay_ordered() {
    setup();
    let (x, y) = (alloc(4096), alloc(4096));
    ck(fill(x, 1024, 19, std::ptr::null_mut()));
    let start = Instant::now();
    // SAFETY: allocated device ranges.
    unsafe {
        ck(cuda::api::copy::cuMemcpyDtoD_v2(y, x, 4096));
        ck(cuda::api::copy::cuMemsetD32_v2(x, 7, 1024));
    }
    assert!(
        start.elapsed() < KERNEL / 2,
        "a device-to-device copy waited: {:?}",
        start.elapsed()
    );
    // Device to host does wait, and sees everything queued before it.
    same(
        &download_u32(y, 1024),
        &pattern(19, 1024),
        "copy after the kernel",
    );
    same(&download_u32(x, 1024), &[7; 1024], "memset after the copy");
}
