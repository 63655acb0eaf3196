//! Stream capture and graphs: captured work does not run until the graph is launched, runs
//! at every launch, graph allocations live with the graph, and the capture-mode rules
//! (unsafe calls, isolation, captured events) refuse and invalidate as the driver does.
//!
//! A global capture affects every thread of the process, so the tests of this binary take
//! one lock each and run one at a time.

mod common;

use std::sync::Mutex;

use common::*;
use cuda::api::context::{cuCtxSetCurrent, cuCtxSynchronize};
use cuda::api::event::*;
use cuda::api::graph::*;
use cuda::api::memory::*;
use cuda::api::stream::*;
use tensile_driver_abi::*;
use tensile_kernels::twins::pattern_value;
use tensile_kernels::ParamBuilder;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn fill(p: CUdeviceptr, n: usize, seed: u32, stream: CUstream) -> CUresult {
    let params = ParamBuilder::new().ptr(p).u64(n as u64).u32(seed).build();
    launch_packed(function("fill_pattern"), stream, &params)
}

fn copy(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult {
    let params = ParamBuilder::new().ptr(dst).ptr(src).u64(n as u64).build();
    launch_packed(function("copy_u32"), stream, &params)
}

fn axpy(a: f32, x: CUdeviceptr, y: CUdeviceptr, n: usize, stream: CUstream) -> CUresult {
    let params = ParamBuilder::new()
        .f32(a)
        .ptr(x)
        .ptr(y)
        .u64(n as u64)
        .build();
    launch_packed(function("axpy"), stream, &params)
}

fn pattern(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u64).map(|i| pattern_value(seed, i)).collect()
}

fn begin(s: CUstream, mode: u32) -> CUresult {
    // SAFETY: plain driver call.
    unsafe { cuStreamBeginCapture_v2(s, mode) }
}

fn end(s: CUstream) -> (CUresult, CUgraph) {
    let mut g = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let r = unsafe { cuStreamEndCapture(s, &mut g) };
    (r, g)
}

fn instantiate(g: CUgraph) -> CUgraphExec {
    let mut e = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ck(unsafe { cuGraphInstantiateWithFlags(&mut e, g, 0) });
    e
}

fn status(s: CUstream) -> u32 {
    let mut st = 99;
    // SAFETY: valid out-pointer.
    ck(unsafe { cuStreamIsCapturing(s, &mut st) });
    st
}

fn event() -> CUevent {
    let mut e = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ck(unsafe { cuEventCreate(&mut e, 0) });
    e
}

#[test]
fn captured_work_runs_only_at_each_launch() {
    let _g = serial();
    fresh_context();
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let n = 1024;
    let (x, y, z) = (alloc(n * 4), alloc(n * 4), alloc(n * 4));
    let zeros = vec![0u32; n];
    upload_u32(y, &zeros);
    upload_u32(z, &zeros);
    assert_eq!(status(s), CU_STREAM_CAPTURE_STATUS_NONE);
    ck(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    assert_eq!(status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    let (mut st, mut id, mut count) = (0, 0u64, 99usize);
    let mut graph = std::ptr::null_mut();
    let mut deps = std::ptr::null();
    let mut edges = std::ptr::null();
    // SAFETY: valid out-pointers.
    ck(unsafe {
        cuStreamGetCaptureInfo_v3(
            s, &mut st, &mut id, &mut graph, &mut deps, &mut edges, &mut count,
        )
    });
    assert_eq!(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_ne!(id, 0);
    ck(fill(x, n, 7, s));
    ck(copy(y, x, n, s));
    // Captured work has not run. (A synchronous copy is an unsafe call: this thread must be
    // relaxed to make it without breaking the capture.)
    let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: valid pointer.
    ck(unsafe { cuThreadExchangeStreamCaptureMode(&mut mode) });
    same(&download_u32(y, n), &zeros, "y during capture");
    // SAFETY: valid pointer.
    ck(unsafe { cuThreadExchangeStreamCaptureMode(&mut mode) });
    let (r, g) = end(s);
    ck(r);
    assert_eq!(status(s), CU_STREAM_CAPTURE_STATUS_NONE);
    same(
        &download_u32(y, n),
        &zeros,
        "y after capture, before launch",
    );
    let exec = instantiate(g);
    // SAFETY: valid handles.
    ck(unsafe { cuGraphLaunch(exec, s) });
    ck(sync(s));
    same(&download_u32(y, n), &pattern(7, n), "y after one launch");

    // Repeated launches repeat the work: y += x, three times.
    let xs: Vec<u32> = (0..n).map(|i| (i as f32).to_bits()).collect();
    upload_u32(x, &xs);
    upload_u32(z, &zeros);
    ck(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ck(axpy(1.0, x, z, n, s));
    let (r, g2) = end(s);
    ck(r);
    let exec2 = instantiate(g2);
    for _ in 0..3 {
        // SAFETY: valid handles.
        ck(unsafe { cuGraphLaunch(exec2, s) });
    }
    ck(sync(s));
    let want: Vec<u32> = (0..n).map(|i| (3.0 * i as f32).to_bits()).collect();
    same(&download_u32(z, n), &want, "z after three launches");
    // SAFETY: valid handles.
    unsafe {
        ck(cuGraphExecDestroy(exec));
        ck(cuGraphDestroy(g));
        ck(cuGraphExecDestroy(exec2));
        ck(cuGraphDestroy(g2));
    }
}

#[test]
fn graph_allocations_live_with_the_graph() {
    let _g = serial();
    fresh_context();
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let n = 256;
    let out = alloc(n * 4);
    let (free_before, _) = mem_info();
    ck(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    let mut tmp = 0;
    // SAFETY: valid out-pointer.
    ck(unsafe { cuMemAllocAsync(&mut tmp, n * 4, s) });
    ck(fill(tmp, n, 3, s));
    ck(copy(out, tmp, n, s));
    // SAFETY: plain driver call.
    ck(unsafe { cuMemFreeAsync(tmp, s) });
    let (r, g) = end(s);
    ck(r);
    let exec = instantiate(g);
    for _ in 0..2 {
        upload_u32(out, &vec![0; n]);
        // SAFETY: valid handles.
        ck(unsafe { cuGraphLaunch(exec, s) });
        ck(sync(s));
        same(&download_u32(out, n), &pattern(3, n), "out after a launch");
    }
    assert!(mem_info().0 < free_before, "the graph holds its allocation");
    // SAFETY: valid handles.
    unsafe {
        ck(cuGraphExecDestroy(exec));
        ck(cuGraphDestroy(g));
    }
    assert_eq!(
        mem_info().0,
        free_before,
        "destroying the graph frees its memory"
    );
}

#[test]
fn global_capture_refuses_unsafe_calls_from_other_threads_unless_relaxed() {
    let _g = serial();
    let ctx = fresh_context();
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let x = alloc(4096);
    ck(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ck(fill(x, 1024, 1, s));
    let ctx_addr = ctx as usize;
    let other = std::thread::spawn(move || {
        // SAFETY: plain driver calls with valid out-pointers.
        unsafe {
            ck(cuCtxSetCurrent(ctx_addr as CUcontext));
            let mut p = 0;
            let relaxed_first = {
                let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
                ck(cuThreadExchangeStreamCaptureMode(&mut mode));
                assert_eq!(mode, CU_STREAM_CAPTURE_MODE_GLOBAL, "the default mode");
                let r = cuMemAlloc_v2(&mut p, 4096);
                ck(cuMemFree_v2(p));
                ck(cuThreadExchangeStreamCaptureMode(&mut mode));
                assert_eq!(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
                r
            };
            (relaxed_first, cuMemAlloc_v2(&mut p, 4096))
        }
    });
    let (relaxed, global) = other.join().unwrap();
    assert_eq!(relaxed, CUDA_SUCCESS, "a relaxed thread may allocate");
    assert_eq!(global, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    assert_eq!(fill(x, 1024, 2, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    let (r, g) = end(s);
    assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert!(g.is_null());
    // Once the capture is over, the same call is fine again.
    let y = alloc(4096);
    // SAFETY: plain driver call.
    ck(unsafe { cuMemFree_v2(y) });
}

#[test]
fn thread_local_capture_ignores_other_threads() {
    let _g = serial();
    let ctx = fresh_context();
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    ck(begin(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    let ctx_addr = ctx as usize;
    let other = std::thread::spawn(move || {
        // SAFETY: plain driver calls with valid out-pointers.
        unsafe {
            ck(cuCtxSetCurrent(ctx_addr as CUcontext));
            let mut p = 0;
            let r = cuMemAlloc_v2(&mut p, 4096);
            ck(cuMemFree_v2(p));
            r
        }
    });
    assert_eq!(other.join().unwrap(), CUDA_SUCCESS);
    // The capturing thread itself is still bound by its capture.
    // SAFETY: plain driver call.
    let r = unsafe { cuCtxSynchronize() };
    assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    let (r, _) = end(s);
    assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

#[test]
fn waiting_on_an_outside_event_is_an_isolation_error() {
    let _g = serial();
    fresh_context();
    let (s, other) = (
        new_stream(CU_STREAM_NON_BLOCKING),
        new_stream(CU_STREAM_NON_BLOCKING),
    );
    let e = event();
    // SAFETY: valid handles.
    ck(unsafe { cuEventRecord(e, other) });
    ck(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    // SAFETY: valid handles.
    let r = unsafe { cuStreamWaitEvent(s, e, 0) };
    assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    let (r, _) = end(s);
    assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    // An event recorded inside the same capture may be waited on; a query of it is refused.
    let inside = event();
    ck(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    // SAFETY: valid handles.
    unsafe {
        ck(cuEventRecord(inside, s));
        ck(cuStreamWaitEvent(s, inside, 0));
        assert_eq!(cuEventQuery(inside), CUDA_ERROR_CAPTURED_EVENT);
    }
    let (r, _) = end(s);
    assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

#[test]
fn synchronizing_a_capturing_stream_and_capturing_the_legacy_stream_are_refused() {
    let _g = serial();
    fresh_context();
    let s = new_stream(0);
    ck(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    assert_eq!(
        begin(s, CU_STREAM_CAPTURE_MODE_RELAXED),
        CUDA_ERROR_ILLEGAL_STATE
    );
    assert_eq!(sync(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    let (r, _) = end(s);
    assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_eq!(end(s).0, CUDA_ERROR_ILLEGAL_STATE);
    assert_eq!(
        begin(std::ptr::null_mut(), CU_STREAM_CAPTURE_MODE_GLOBAL),
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    );
    // A relaxed capture may be ended by another thread; a global one may not.
    ck(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    let h = s as usize;
    let r = std::thread::spawn(move || end(h as CUstream).0)
        .join()
        .unwrap();
    assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    ck(end(s).0);
}

#[test]
fn querying_an_outside_event_from_another_thread_breaks_a_global_capture_unless_relaxed() {
    let _g = serial();
    let ctx = fresh_context();
    let (s, other) = (
        new_stream(CU_STREAM_NON_BLOCKING),
        new_stream(CU_STREAM_NON_BLOCKING),
    );
    let e = event();
    // SAFETY: valid handles.
    ck(unsafe { cuEventRecord(e, other) });
    ck(sync(other));
    let query_from_thread = |relaxed: bool| {
        let (ctx, e) = (ctx as usize, e as usize);
        std::thread::spawn(move || {
            // SAFETY: plain driver calls with valid handles and pointers.
            unsafe {
                ck(cuCtxSetCurrent(ctx as CUcontext));
                if relaxed {
                    let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
                    ck(cuThreadExchangeStreamCaptureMode(&mut mode));
                }
                cuEventQuery(e as CUevent)
            }
        })
        .join()
        .unwrap()
    };
    ck(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    assert_eq!(query_from_thread(true), CUDA_SUCCESS);
    assert_eq!(status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_eq!(
        query_from_thread(false),
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    );
    assert_eq!(status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    assert_eq!(end(s).0, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    // No capture: the same query is fine.
    assert_eq!(query_from_thread(false), CUDA_SUCCESS);
}

#[test]
fn instantiation_refuses_the_flag_combinations_the_driver_refuses() {
    let _serial = serial();
    fresh_context();
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let p = alloc(4096);
    ck(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ck(fill(p, 1024, 3, s));
    let (r, g) = end(s);
    ck(r);
    let with_flags = |flags: u64| {
        let mut e = std::ptr::null_mut();
        // SAFETY: valid out-pointer and graph.
        unsafe { cuGraphInstantiateWithFlags(&mut e, g, flags) }
    };
    let with_params = |flags: u64| {
        let mut e = std::ptr::null_mut();
        let mut params = GraphInstantiateParams {
            flags,
            upload_stream: s,
            err_node_out: std::ptr::null_mut(),
            result_out: -1,
        };
        // SAFETY: valid out-pointer, graph and params.
        let r = unsafe { cuGraphInstantiateWithParams(&mut e, g, &mut params) };
        (r, params.result_out)
    };
    // Auto-free on launch, device launch, node priority: accepted alone and (but for the
    // pair below) together.
    for flags in [0, 1, 4, 8, 1 | 8, 4 | 8] {
        assert_eq!(with_flags(flags), CUDA_SUCCESS, "flags {flags:#x}");
    }
    // Device launch cannot auto-free; upload needs the params' stream; unknown bits.
    for flags in [1 | 4, 2, 16, 1 << 40] {
        assert_eq!(
            with_flags(flags),
            CUDA_ERROR_INVALID_VALUE,
            "flags {flags:#x}"
        );
    }
    assert_eq!(with_params(2), (CUDA_SUCCESS, 0));
    assert_eq!(with_params(1 | 4), (CUDA_ERROR_INVALID_VALUE, 1));
}
