//! Allocation and free hooks, and `cuMemGetInfo`.
//!
//! With a memory manager running (policy `lru`/`plan`), allocations in its context are
//! served from its arena instead of the driver; otherwise they are forwarded. Either way
//! every allocation enters the index (and the trace) once made, and every free leaves the
//! index before it is carried out. Frees of pointers outside the arena go to the driver
//! untouched, so their errors (unknown pointer, double free) are the driver's; the manager
//! answers those of arena pointers with the same codes. The free of an arena allocation
//! another process has open through CUDA IPC waits for it (`crate::ipc::exporter`).
//!
//! Stream-ordered allocations on a capturing stream go to the driver untouched: there they
//! become graph memory nodes, allocated and freed as the graph runs, which the arena cannot
//! imitate (its free would record a fence into the capture, and could hand the block to
//! another allocation while the graph still uses it). Their frees then reach the driver too,
//! as the arena does not own the pointers. Freeing an *arena* allocation on a capturing
//! stream is refused with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: the free would happen at
//! every launch of the graph, which the arena cannot express.

use tensile_driver_abi::{
    CUdeviceptr, CUmemoryPool, CUresult, CUstream, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_SUCCESS,
};
use tensile_trace::AllocKind;

use super::Call;
use crate::managed::Managed;
use crate::memory::Stream;
use crate::syms::pfn;

/// The manager that serves an allocation made now on this thread, if any: the one of the
/// current context's device.
fn serving<F>(call: &Call<F>) -> Option<&'static Managed> {
    call.rt.memory_or_start()
}

/// The manager that serves a stream-ordered allocation on `stream` (a handle value), if
/// any: none for a capturing stream (see the module docs).
fn serving_on<F>(call: &Call<F>, stream: u64) -> Option<&'static Managed> {
    serving(call).filter(|_| !super::capture::is_capturing(call.rt, stream))
}

/// Serves an allocation from the manager: validates what the driver would, writes the
/// pointer. Returns the driver-style result.
///
/// # Safety
/// `dptr` must be null or valid for a write of a `CUdeviceptr`.
unsafe fn serve(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    alloc: impl FnOnce() -> Result<CUdeviceptr, CUresult>,
) -> CUresult {
    if dptr.is_null() || bytes == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match alloc() {
        Ok(p) => {
            // SAFETY: non-null, and valid for a write by the caller's contract.
            unsafe { dptr.write(p) };
            CUDA_SUCCESS
        }
        Err(code) => code,
    }
}

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
    let rt = call.rt;
    let id = rt
        .tracker
        .allocated(rt.records(), t_ns, stream, ptr, bytes, kind);
    rt.executor.allocated(&rt.tracker, id, ptr, bytes);
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
    let r = match serving(&call) {
        // SAFETY: `dptr` is the caller's out-pointer.
        Some(m) => unsafe { serve(dptr, bytesize, || m.mm.alloc(bytesize, None)) },
        // SAFETY: the caller's arguments, forwarded unchanged to the function they asked for.
        None => unsafe { (call.real)(dptr, bytesize) },
    };
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
    let r = match serving(&call) {
        Some(m) if !pitch.is_null() && !dptr.is_null() => {
            match m.mm.alloc_pitch(width, height, element_size) {
                Ok((p, row_pitch)) => {
                    // SAFETY: both non-null, and valid for writes by the caller's contract.
                    unsafe {
                        dptr.write(p);
                        pitch.write(row_pitch);
                    }
                    CUDA_SUCCESS
                }
                Err(code) => code,
            }
        }
        Some(_) => CUDA_ERROR_INVALID_VALUE,
        // SAFETY: forwarded unchanged.
        None => unsafe { (call.real)(dptr, pitch, width, height, element_size) },
    };
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
    let on = Stream(call.stream(stream) as usize);
    let r = match serving_on(&call, call.stream(stream)) {
        // SAFETY: `dptr` is the caller's out-pointer.
        Some(m) => unsafe { serve(dptr, bytesize, || m.mm.alloc(bytesize, Some(on))) },
        // SAFETY: forwarded unchanged.
        None => unsafe { (call.real)(dptr, bytesize, stream) },
    };
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
    let on = Stream(call.stream(stream) as usize);
    // The manager serves allocations from every pool alike: the pool's attributes (release
    // threshold, reuse policies) are about caching, which the arena does itself.
    let r = match serving_on(&call, call.stream(stream)) {
        // SAFETY: `dptr` is the caller's out-pointer.
        Some(m) if !pool.is_null() => unsafe {
            serve(dptr, bytesize, || m.mm.alloc(bytesize, Some(on)))
        },
        Some(_) => CUDA_ERROR_INVALID_VALUE,
        // SAFETY: forwarded unchanged.
        None => unsafe { (call.real)(dptr, bytesize, pool, stream) },
    };
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
        call.rt
            .tracker
            .end_free(call.rt.records(), t, stream, range, r == CUDA_SUCCESS);
    }
    r
}

/// `cuMemFree_v2`.
///
/// # Safety
/// The driver's contract for `cuMemFree_v2`.
pub unsafe fn mem_free(call: Call<pfn::MemFree>, dptr: CUdeviceptr) -> CUresult {
    free_with(&call, dptr, 0, || match call.rt.memory_owning(dptr) {
        Some(m) => {
            // `cuMemFree` synchronizes: work queued on any stream may still use the memory,
            // and the manager hands synchronously freed memory to the next allocation at
            // once. A failed synchronization (a broken context) does not keep the free from
            // happening; the error shows on the application's next call.
            if let Err(code) = m.driver.synchronize() {
                tracing::debug!("synchronizing before a free failed with error {code}");
            }
            if crate::ipc::exporter::free_is_deferred(dptr) {
                return CUDA_SUCCESS;
            }
            m.mm.free(dptr, None).err().unwrap_or(CUDA_SUCCESS)
        }
        // SAFETY: forwarded unchanged.
        _ => unsafe { (call.real)(dptr) },
    })
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
    let on = call.stream(stream);
    free_with(&call, dptr, on, || match call.rt.memory_owning(dptr) {
        Some(_) if super::capture::is_capturing(call.rt, on) => {
            tracing::warn!(
                "tensile: cuMemFreeAsync of managed memory {dptr:#x} on a capturing stream \
                 is not supported; refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
            );
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        }
        Some(_) if crate::ipc::exporter::free_is_deferred(dptr) => CUDA_SUCCESS,
        Some(m) => {
            m.mm.free(dptr, Some(Stream(on as usize)))
                .err()
                .unwrap_or(CUDA_SUCCESS)
        }
        // SAFETY: forwarded unchanged.
        _ => unsafe { (call.real)(dptr, stream) },
    })
}

/// `cuMemGetInfo_v2`: with a manager, free and total as the device budget sees them.
///
/// # Safety
/// The driver's contract for `cuMemGetInfo_v2`.
pub unsafe fn mem_get_info(
    call: Call<pfn::MemGetInfo>,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    match serving(&call) {
        Some(m) => {
            if free.is_null() || total.is_null() {
                return CUDA_ERROR_INVALID_VALUE;
            }
            let (f, t) = m.mm.mem_get_info();
            // SAFETY: both non-null, and valid for writes by the caller's contract.
            unsafe {
                free.write(f);
                total.write(t);
            }
            CUDA_SUCCESS
        }
        // SAFETY: forwarded unchanged.
        None => unsafe { (call.real)(free, total) },
    }
}
