//! Allocation and free hooks: every allocation the application makes enters the index
//! (and the trace) once the driver has made it; every free leaves the index before it is
//! forwarded. Frees of pointers the shim never saw go to the driver untouched.

use tensile_driver_abi::{CUdeviceptr, CUmemoryPool, CUresult, CUstream, CUDA_SUCCESS};
use tensile_trace::AllocKind;

use super::Call;
use crate::syms::pfn;

/// After a successful allocating call: read the pointer the driver wrote and track it.
///
/// # Safety
/// `dptr` must be the out-pointer of a driver call that returned `r`.
unsafe fn track<F>(
    call: &Call<F>,
    t_ns: u64,
    stream: u64,
    r: CUresult,
    dptr: *mut CUdeviceptr,
    bytes: u64,
    kind: AllocKind,
) {
    if r != CUDA_SUCCESS || dptr.is_null() || bytes == 0 {
        return;
    }
    // SAFETY: on success the driver stored the new pointer through `dptr`.
    let ptr = unsafe { dptr.read() };
    call.rt
        .tracker
        .allocated(call.rt.recorder.as_ref(), t_ns, stream, ptr, bytes, kind);
}

/// `cuMemAlloc_v2`.
///
/// # Safety
/// The driver's contract for `cuMemAlloc_v2`.
pub unsafe fn mem_alloc(
    call: Call<pfn::MemAlloc>,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
) -> CUresult {
    let t = call.rt.now_ns();
    // SAFETY: the caller's arguments, forwarded unchanged to the function they asked for.
    let r = unsafe { (call.real)(dptr, bytesize) };
    // SAFETY: `dptr` is this call's out-pointer.
    unsafe { track(&call, t, 0, r, dptr, bytesize as u64, AllocKind::Sync) };
    r
}

/// `cuMemAllocPitch_v2`.
///
/// # Safety
/// The driver's contract for `cuMemAllocPitch_v2`.
pub unsafe fn mem_alloc_pitch(
    call: Call<pfn::MemAllocPitch>,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: u32,
) -> CUresult {
    let t = call.rt.now_ns();
    // SAFETY: forwarded unchanged.
    let r = unsafe { (call.real)(dptr, pitch, width, height, element_size) };
    if r == CUDA_SUCCESS && !pitch.is_null() {
        // SAFETY: on success the driver stored the pitch through `pitch`.
        let bytes = (unsafe { pitch.read() } as u64).saturating_mul(height as u64);
        // SAFETY: `dptr` is this call's out-pointer.
        unsafe { track(&call, t, 0, r, dptr, bytes, AllocKind::Pitch) };
    }
    r
}

/// `cuMemAllocAsync[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuMemAllocAsync`.
pub unsafe fn mem_alloc_async(
    call: Call<pfn::MemAllocAsync>,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    let t = call.rt.now_ns();
    // SAFETY: forwarded unchanged.
    let r = unsafe { (call.real)(dptr, bytesize, stream) };
    // SAFETY: `dptr` is this call's out-pointer.
    unsafe {
        track(
            &call,
            t,
            call.stream(stream),
            r,
            dptr,
            bytesize as u64,
            AllocKind::Async,
        )
    };
    r
}

/// `cuMemAllocFromPoolAsync[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuMemAllocFromPoolAsync`.
pub unsafe fn mem_alloc_from_pool_async(
    call: Call<pfn::MemAllocFromPoolAsync>,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let t = call.rt.now_ns();
    // SAFETY: forwarded unchanged.
    let r = unsafe { (call.real)(dptr, bytesize, pool, stream) };
    // SAFETY: `dptr` is this call's out-pointer.
    unsafe {
        track(
            &call,
            t,
            call.stream(stream),
            r,
            dptr,
            bytesize as u64,
            AllocKind::Pool,
        )
    };
    r
}

/// Untracks `dptr`, forwards the free, and records or undoes the untracking.
fn free_with<F>(
    call: &Call<F>,
    dptr: CUdeviceptr,
    stream: u64,
    forward: impl FnOnce() -> CUresult,
) -> CUresult {
    let t = call.rt.now_ns();
    let tracked = call.rt.tracker.begin_free(dptr);
    let r = forward();
    if let Some(range) = tracked {
        call.rt.tracker.end_free(
            call.rt.recorder.as_ref(),
            t,
            stream,
            range,
            r == CUDA_SUCCESS,
        );
    }
    r
}

/// `cuMemFree_v2`.
///
/// # Safety
/// The driver's contract for `cuMemFree_v2`.
pub unsafe fn mem_free(call: Call<pfn::MemFree>, dptr: CUdeviceptr) -> CUresult {
    // SAFETY: forwarded unchanged.
    free_with(&call, dptr, 0, || unsafe { (call.real)(dptr) })
}

/// `cuMemFreeAsync[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuMemFreeAsync`.
pub unsafe fn mem_free_async(
    call: Call<pfn::MemFreeAsync>,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    free_with(&call, dptr, call.stream(stream), || unsafe {
        (call.real)(dptr, stream)
    })
}
