//! Copy hooks: make managed memory on either side device-resident, forward, then record
//! which allocations the copy read and wrote.
//!
//! Copies are accesses too: a swapped-out tensor must be brought back before a copy reads
//! or writes it, and the planner needs to see them.

use std::ffi::c_void;

use tensile_driver_abi::{
    CUcontext, CUdeviceptr, CUresult, CUstream, CUDA_MEMCPY2D, CUDA_SUCCESS, CU_MEMORYTYPE_DEVICE,
    CU_MEMORYTYPE_UNIFIED,
};
use tensile_trace::CopyKind;

use super::{implicit_stream, residency, stream_value, Call};
use crate::syms::pfn;

/// What one copy touches.
#[derive(Debug, Clone, Copy)]
struct CopyDesc {
    kind: CopyKind,
    dst: Option<u64>,
    src: Option<u64>,
    bytes: u64,
    /// Bytes from `dst` / `src` to one past the last byte touched on that side (more than
    /// `bytes` for pitched 2D copies).
    dst_span: u64,
    src_span: u64,
    stream: u64,
    asynchronous: bool,
}

fn copy_with<F>(call: &Call<F>, d: CopyDesc, forward: impl FnOnce() -> CUresult) -> CUresult {
    let t = call.rt.now_ns();
    let side = |p: Option<u64>, span: u64| p.map_or((0, 0), |p| (p, span as usize));
    let ranges = [side(d.dst, d.dst_span), side(d.src, d.src_span)];
    let what = || format!("{} of {} bytes", call.sym.name(), d.bytes);
    let r = residency::forward_pinned(call.rt, d.stream, &ranges, what, forward);
    if r == CUDA_SUCCESS {
        if !d.asynchronous {
            // A synchronous copy waited for earlier work: collect its launch times.
            call.rt.collect_launch_times();
        }
        if let Some(rec) = call.rt.records() {
            call.rt.tracker.copied(
                rec,
                t,
                d.stream,
                d.kind,
                d.dst,
                d.src,
                d.bytes,
                d.asynchronous,
            );
        }
    }
    r
}

/// The copy of `bytes` contiguous bytes between `dst` and `src` (`None`: host memory).
/// `stream` is the stream argument of an asynchronous variant; `None` for a synchronous one,
/// which runs on the call's implicit stream.
fn desc<F>(
    call: &Call<F>,
    kind: CopyKind,
    dst: Option<u64>,
    src: Option<u64>,
    bytes: usize,
    stream: Option<CUstream>,
) -> CopyDesc {
    CopyDesc {
        kind,
        dst,
        src,
        bytes: bytes as u64,
        dst_span: bytes as u64,
        src_span: bytes as u64,
        stream: stream.map_or_else(|| implicit_stream(call.sym), |s| stream_value(call.sym, s)),
        asynchronous: stream.is_some(),
    }
}

/// A contiguous copy (see [`desc`]) forwarded by `forward`.
fn copy<F>(
    call: &Call<F>,
    kind: CopyKind,
    dst: Option<u64>,
    src: Option<u64>,
    bytes: usize,
    stream: Option<CUstream>,
    forward: impl FnOnce() -> CUresult,
) -> CUresult {
    copy_with(call, desc(call, kind, dst, src, bytes, stream), forward)
}

/// `cuMemcpy[_ptds]` (unified addressing: either side may be host or device).
///
/// # Safety
/// The driver's contract for `cuMemcpy`.
pub unsafe fn memcpy(
    call: Call<pfn::Memcpy>,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let forward = || unsafe { (call.real)(dst, src, bytes) };
    copy(
        &call,
        CopyKind::Any,
        Some(dst),
        Some(src),
        bytes,
        None,
        forward,
    )
}

/// `cuMemcpyAsync[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuMemcpyAsync`.
pub unsafe fn memcpy_async(
    call: Call<pfn::MemcpyAsync>,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let forward = || unsafe { (call.real)(dst, src, bytes, stream) };
    copy(
        &call,
        CopyKind::Any,
        Some(dst),
        Some(src),
        bytes,
        Some(stream),
        forward,
    )
}

/// `cuMemcpyHtoD_v2[_ptds]`.
///
/// # Safety
/// The driver's contract for `cuMemcpyHtoD_v2`.
pub unsafe fn memcpy_htod(
    call: Call<pfn::MemcpyHtoD>,
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let forward = || unsafe { (call.real)(dst, src, bytes) };
    copy(
        &call,
        CopyKind::HostToDevice,
        Some(dst),
        None,
        bytes,
        None,
        forward,
    )
}

/// `cuMemcpyHtoDAsync_v2[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuMemcpyHtoDAsync_v2`.
pub unsafe fn memcpy_htod_async(
    call: Call<pfn::MemcpyHtoDAsync>,
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let forward = || unsafe { (call.real)(dst, src, bytes, stream) };
    copy(
        &call,
        CopyKind::HostToDevice,
        Some(dst),
        None,
        bytes,
        Some(stream),
        forward,
    )
}

/// `cuMemcpyDtoH_v2[_ptds]`.
///
/// # Safety
/// The driver's contract for `cuMemcpyDtoH_v2`.
pub unsafe fn memcpy_dtoh(
    call: Call<pfn::MemcpyDtoH>,
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let forward = || unsafe { (call.real)(dst, src, bytes) };
    copy(
        &call,
        CopyKind::DeviceToHost,
        None,
        Some(src),
        bytes,
        None,
        forward,
    )
}

/// `cuMemcpyDtoHAsync_v2[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuMemcpyDtoHAsync_v2`.
pub unsafe fn memcpy_dtoh_async(
    call: Call<pfn::MemcpyDtoHAsync>,
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let forward = || unsafe { (call.real)(dst, src, bytes, stream) };
    copy(
        &call,
        CopyKind::DeviceToHost,
        None,
        Some(src),
        bytes,
        Some(stream),
        forward,
    )
}

/// `cuMemcpyDtoD_v2[_ptds]`.
///
/// # Safety
/// The driver's contract for `cuMemcpyDtoD_v2`.
pub unsafe fn memcpy_dtod(
    call: Call<pfn::MemcpyDtoD>,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let forward = || unsafe { (call.real)(dst, src, bytes) };
    copy(
        &call,
        CopyKind::DeviceToDevice,
        Some(dst),
        Some(src),
        bytes,
        None,
        forward,
    )
}

/// `cuMemcpyDtoDAsync_v2[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuMemcpyDtoDAsync_v2`.
pub unsafe fn memcpy_dtod_async(
    call: Call<pfn::MemcpyDtoDAsync>,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let forward = || unsafe { (call.real)(dst, src, bytes, stream) };
    copy(
        &call,
        CopyKind::DeviceToDevice,
        Some(dst),
        Some(src),
        bytes,
        Some(stream),
        forward,
    )
}

/// `cuMemcpyPeer[_ptds]`.
///
/// # Safety
/// The driver's contract for `cuMemcpyPeer`.
pub unsafe fn memcpy_peer(
    call: Call<pfn::MemcpyPeer>,
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    bytes: usize,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let forward = || unsafe { (call.real)(dst, dst_ctx, src, src_ctx, bytes) };
    copy(
        &call,
        CopyKind::DeviceToDevice,
        Some(dst),
        Some(src),
        bytes,
        None,
        forward,
    )
}

/// `cuMemcpyPeerAsync[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuMemcpyPeerAsync`.
pub unsafe fn memcpy_peer_async(
    call: Call<pfn::MemcpyPeerAsync>,
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwarded unchanged.
    let forward = || unsafe { (call.real)(dst, dst_ctx, src, src_ctx, bytes, stream) };
    copy(
        &call,
        CopyKind::DeviceToDevice,
        Some(dst),
        Some(src),
        bytes,
        Some(stream),
        forward,
    )
}

/// What a `CUDA_MEMCPY2D` touches (`stream` as for [`desc`]). Array endpoints are not device allocations the shim
/// tracks; they count as untracked.
///
/// # Safety
/// `p` must be null or point to a valid `CUDA_MEMCPY2D`.
unsafe fn desc_2d<F>(
    call: &Call<F>,
    p: *const CUDA_MEMCPY2D,
    stream: Option<CUstream>,
) -> Option<CopyDesc> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and valid by the caller's contract.
    let c = unsafe { p.read() };
    let on_device = |t| t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED;
    let (dst_dev, src_dev) = (on_device(c.dst_memory_type), on_device(c.src_memory_type));
    // The first byte touched on each side: the rows start at (x, y) in pitched memory.
    let dst = dst_dev.then(|| {
        c.dst_device
            .wrapping_add((c.dst_y * c.dst_pitch + c.dst_x_in_bytes) as u64)
    });
    let src = src_dev.then(|| {
        c.src_device
            .wrapping_add((c.src_y * c.src_pitch + c.src_x_in_bytes) as u64)
    });
    let kind = match (dst_dev, src_dev) {
        (true, true) => CopyKind::DeviceToDevice,
        (true, false) => CopyKind::HostToDevice,
        (false, true) => CopyKind::DeviceToHost,
        (false, false) => CopyKind::Any,
    };
    let bytes = c.width_in_bytes.saturating_mul(c.height);
    // Rows after the first start one pitch further each.
    let span = |pitch: usize| {
        (c.height.saturating_sub(1).saturating_mul(pitch)).saturating_add(c.width_in_bytes) as u64
    };
    let mut d = desc(call, kind, dst, src, bytes, stream);
    d.dst_span = if c.height == 0 { 0 } else { span(c.dst_pitch) };
    d.src_span = if c.height == 0 { 0 } else { span(c.src_pitch) };
    Some(d)
}

/// `cuMemcpy2D_v2[_ptds]` and `cuMemcpy2DUnaligned_v2[_ptds]`.
///
/// # Safety
/// The driver's contract for `cuMemcpy2D_v2`.
pub unsafe fn memcpy_2d(call: Call<pfn::Memcpy2D>, copy: *const CUDA_MEMCPY2D) -> CUresult {
    // SAFETY: `copy` is the caller's descriptor.
    match unsafe { desc_2d(&call, copy, None) } {
        // SAFETY: forwarded unchanged.
        Some(d) => copy_with(&call, d, || unsafe { (call.real)(copy) }),
        // SAFETY: forwarded unchanged (the driver rejects the null descriptor).
        None => unsafe { (call.real)(copy) },
    }
}

/// `cuMemcpy2DAsync_v2[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuMemcpy2DAsync_v2`.
pub unsafe fn memcpy_2d_async(
    call: Call<pfn::Memcpy2DAsync>,
    copy: *const CUDA_MEMCPY2D,
    stream: CUstream,
) -> CUresult {
    // SAFETY: `copy` is the caller's descriptor.
    match unsafe { desc_2d(&call, copy, Some(stream)) } {
        // SAFETY: forwarded unchanged.
        Some(d) => copy_with(&call, d, || unsafe { (call.real)(copy, stream) }),
        // SAFETY: forwarded unchanged (the driver rejects the null descriptor).
        None => unsafe { (call.real)(copy, stream) },
    }
}
