//! Copies and memsets. Synchronous forms run on the default stream (legacy, or per-thread for
//! `_ptds`) and return after completion when host memory is involved (device-to-device copies
//! and memsets of device memory return at once, as on the driver); asynchronous forms queue
//! on the given stream.
//! Device ranges are checked when the operation executes: a bad one is a fault
//! (`CUDA_ERROR_ILLEGAL_ADDRESS`, sticky).

use std::ffi::c_void;

use tensile_driver_abi::*;

use super::{current_ctx, enqueue, per_thread_pair, resolve_stream, run_default, st};
use crate::memory::HostPtr;
use crate::ops::{Copy2D, Op, Side};

/// Device if `addr` is in a registered range, else a host pointer (unified addressing).
fn classify(addr: u64) -> Result<Side, CUresult> {
    Ok(if st()?.space.region_of(addr).is_some() {
        Side::Device(addr)
    } else {
        Side::Host(HostPtr(addr as usize))
    })
}

/// The host side of a copy. Host memory the device can access (pinned, registered, or a
/// host-NUMA VMM mapping) goes through the checked path like device memory; anything else is
/// pageable memory of the application.
fn host(p: *const c_void) -> Result<Side, CUresult> {
    if p.is_null() {
        Err(CUDA_ERROR_INVALID_VALUE)
    } else {
        classify(p as u64)
    }
}

/// Whether one side of a copy is device-located memory.
fn on_device(side: Side) -> Result<bool, CUresult> {
    Ok(match side {
        Side::Device(a) => st()?.space.is_device_memory(a),
        Side::Host(_) => false,
    })
}

/// Queues (`stream = Some`) or runs on the default stream a copy of `len` bytes. The
/// synchronous forms (`stream = None`) return after completion unless both sides are device
/// memory, as on the driver.
///
/// Asynchronous copies involving pageable host memory (`Side::Host`: memory the simulator
/// does not track) behave as on the driver:
/// a pageable source is staged at the call, so the caller may reuse it at once; a copy to a
/// pageable destination returns only once it has completed.
///
/// # Safety
/// Host sides must be valid for `len` bytes (the API contract).
unsafe fn submit(
    pt: bool,
    stream: Option<CUstream>,
    dst: Result<Side, CUresult>,
    src: Result<Side, CUresult>,
    len: usize,
) -> Result<(), CUresult> {
    // A zero-length copy is a no-op, whatever its pointers (only the context is checked).
    if len == 0 {
        return match stream {
            Some(h) => resolve_stream(h, pt).map(|_| ()),
            None => current_ctx().map(|_| ()),
        };
    }
    let (dst, src) = (dst?, src?);
    let Some(h) = stream else {
        let wait = !(on_device(src)? && on_device(dst)?);
        let op = Op::Copy {
            dst,
            src,
            len: len as u64,
        };
        return run_default(pt, op, wait);
    };
    let (ctx, stream) = resolve_stream(h, pt)?;
    ctx.check()?;
    let op = match src {
        Side::Host(HostPtr(p)) => {
            // SAFETY: the caller's source holds `len` bytes (API contract).
            let data = unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec();
            Op::Upload { dst, data }
        }
        _ => Op::Copy {
            dst,
            src,
            len: len as u64,
        },
    };
    let to_pageable = matches!(dst, Side::Host(_));
    let ticket = super::submit(&ctx, &stream, Vec::new(), op)?;
    if to_pageable && ticket > 0 {
        stream.wait_for(ticket);
        ctx.check()?;
    }
    Ok(())
}

unsafe fn memcpy(pt: bool, dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> Result<(), CUresult> {
    // SAFETY: forwarded under the API contract of the host pointers.
    unsafe { submit(pt, None, classify(dst), classify(src), n) }
}
per_thread_pair!(cuMemcpy, cuMemcpy_ptds, memcpy, (dst: CUdeviceptr, src: CUdeviceptr, n: usize));

unsafe fn memcpy_async(
    pt: bool,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    h: CUstream,
) -> Result<(), CUresult> {
    // SAFETY: forwarded under the API contract of the host pointers.
    unsafe { submit(pt, Some(h), classify(dst), classify(src), n) }
}
per_thread_pair!(cuMemcpyAsync, cuMemcpyAsync_ptsz, memcpy_async, (dst: CUdeviceptr, src: CUdeviceptr, n: usize, h: CUstream));

unsafe fn memcpy_htod(
    pt: bool,
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> Result<(), CUresult> {
    // SAFETY: forwarded under the API contract of the host pointers.
    unsafe { submit(pt, None, Ok(Side::Device(dst)), host(src), n) }
}
per_thread_pair!(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds, memcpy_htod, (dst: CUdeviceptr, src: *const c_void, n: usize));

unsafe fn memcpy_dtoh(
    pt: bool,
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
) -> Result<(), CUresult> {
    // SAFETY: forwarded under the API contract of the host pointers.
    unsafe { submit(pt, None, host(dst), Ok(Side::Device(src)), n) }
}
per_thread_pair!(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, memcpy_dtoh, (dst: *mut c_void, src: CUdeviceptr, n: usize));

unsafe fn memcpy_dtod(
    pt: bool,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
) -> Result<(), CUresult> {
    // SAFETY: forwarded under the API contract of the host pointers.
    unsafe { submit(pt, None, Ok(Side::Device(dst)), Ok(Side::Device(src)), n) }
}
per_thread_pair!(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds, memcpy_dtod, (dst: CUdeviceptr, src: CUdeviceptr, n: usize));

unsafe fn memcpy_htod_async(
    pt: bool,
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    h: CUstream,
) -> Result<(), CUresult> {
    // SAFETY: forwarded under the API contract of the host pointers.
    unsafe { submit(pt, Some(h), Ok(Side::Device(dst)), host(src), n) }
}
per_thread_pair!(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz, memcpy_htod_async, (dst: CUdeviceptr, src: *const c_void, n: usize, h: CUstream));

unsafe fn memcpy_dtoh_async(
    pt: bool,
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    h: CUstream,
) -> Result<(), CUresult> {
    // SAFETY: forwarded under the API contract of the host pointers.
    unsafe { submit(pt, Some(h), host(dst), Ok(Side::Device(src)), n) }
}
per_thread_pair!(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz, memcpy_dtoh_async, (dst: *mut c_void, src: CUdeviceptr, n: usize, h: CUstream));

unsafe fn memcpy_dtod_async(
    pt: bool,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    h: CUstream,
) -> Result<(), CUresult> {
    // SAFETY: forwarded under the API contract of the host pointers.
    unsafe { submit(pt, Some(h), Ok(Side::Device(dst)), Ok(Side::Device(src)), n) }
}
per_thread_pair!(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz, memcpy_dtod_async, (dst: CUdeviceptr, src: CUdeviceptr, n: usize, h: CUstream));

/// One side of a `CUDA_MEMCPY2D`, at its (x, y) origin.
fn side_2d(
    kind: CUmemorytype,
    host_ptr: usize,
    device: u64,
    x: usize,
    y: usize,
    pitch: usize,
) -> Result<Side, CUresult> {
    let off = y
        .checked_mul(pitch)
        .and_then(|o| o.checked_add(x))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match kind {
        CU_MEMORYTYPE_HOST if host_ptr != 0 => classify((host_ptr + off) as u64),
        CU_MEMORYTYPE_DEVICE => Ok(Side::Device(device + off as u64)),
        CU_MEMORYTYPE_UNIFIED => classify(device + off as u64),
        CU_MEMORYTYPE_ARRAY => Err(CUDA_ERROR_NOT_SUPPORTED),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// # Safety
/// `p` must be NULL or point to a `CUDA_MEMCPY2D`.
unsafe fn copy_2d(
    pt: bool,
    p: *const CUDA_MEMCPY2D,
    stream: Option<CUstream>,
) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and points to a CUDA_MEMCPY2D (API contract).
    let c = unsafe { std::ptr::read_unaligned(p) };
    if c.height > 1 && (c.width_in_bytes > c.src_pitch || c.width_in_bytes > c.dst_pitch) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let src = side_2d(
        c.src_memory_type,
        c.src_host as usize,
        c.src_device,
        c.src_x_in_bytes,
        c.src_y,
        c.src_pitch,
    )?;
    let dst = side_2d(
        c.dst_memory_type,
        c.dst_host as usize,
        c.dst_device,
        c.dst_x_in_bytes,
        c.dst_y,
        c.dst_pitch,
    )?;
    let op = Op::Copy2D(Copy2D {
        src,
        src_pitch: c.src_pitch as u64,
        dst,
        dst_pitch: c.dst_pitch as u64,
        width: c.width_in_bytes as u64,
        height: c.height as u64,
    });
    match stream {
        Some(h) => enqueue(h, pt, Vec::new(), op),
        None => run_default(pt, op, !(on_device(src)? && on_device(dst)?)),
    }
}

unsafe fn memcpy_2d(pt: bool, p: *const CUDA_MEMCPY2D) -> Result<(), CUresult> {
    // SAFETY: same contract.
    unsafe { copy_2d(pt, p, None) }
}
per_thread_pair!(cuMemcpy2D_v2, cuMemcpy2D_v2_ptds, memcpy_2d, (p: *const CUDA_MEMCPY2D));
per_thread_pair!(cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds, memcpy_2d, (p: *const CUDA_MEMCPY2D));

unsafe fn memcpy_2d_async(pt: bool, p: *const CUDA_MEMCPY2D, h: CUstream) -> Result<(), CUresult> {
    // SAFETY: same contract.
    unsafe { copy_2d(pt, p, Some(h)) }
}
per_thread_pair!(cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz, memcpy_2d_async, (p: *const CUDA_MEMCPY2D, h: CUstream));

fn memset(
    pt: bool,
    stream: Option<CUstream>,
    dst: u64,
    pattern: Vec<u8>,
    count: usize,
) -> Result<(), CUresult> {
    if !dst.is_multiple_of(pattern.len() as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if count == 0 {
        // SAFETY: no host memory is involved.
        return unsafe { submit(pt, stream, Ok(Side::Device(dst)), Ok(Side::Device(dst)), 0) };
    }
    let op = Op::Memset {
        dst,
        pattern,
        count: count as u64,
    };
    match stream {
        Some(h) => enqueue(h, pt, Vec::new(), op),
        None => run_default(pt, op, !st()?.space.is_device_memory(dst)),
    }
}

/// A memset element (`cuMemsetD8/16/32*`): its value as the bytes it repeats.
trait Element: Copy {
    fn pattern(self) -> Vec<u8>;
}

impl Element for u8 {
    fn pattern(self) -> Vec<u8> {
        vec![self]
    }
}

impl Element for u16 {
    fn pattern(self) -> Vec<u8> {
        self.to_ne_bytes().to_vec()
    }
}

impl Element for u32 {
    fn pattern(self) -> Vec<u8> {
        self.to_ne_bytes().to_vec()
    }
}

unsafe fn memset_d<T: Element>(pt: bool, dst: CUdeviceptr, v: T, n: usize) -> Result<(), CUresult> {
    memset(pt, None, dst, v.pattern(), n)
}
per_thread_pair!(cuMemsetD8_v2, cuMemsetD8_v2_ptds, memset_d::<u8>, (dst: CUdeviceptr, v: u8, n: usize));
per_thread_pair!(cuMemsetD16_v2, cuMemsetD16_v2_ptds, memset_d::<u16>, (dst: CUdeviceptr, v: u16, n: usize));
per_thread_pair!(cuMemsetD32_v2, cuMemsetD32_v2_ptds, memset_d::<u32>, (dst: CUdeviceptr, v: u32, n: usize));

unsafe fn memset_d_async<T: Element>(
    pt: bool,
    dst: CUdeviceptr,
    v: T,
    n: usize,
    h: CUstream,
) -> Result<(), CUresult> {
    memset(pt, Some(h), dst, v.pattern(), n)
}
per_thread_pair!(cuMemsetD8Async, cuMemsetD8Async_ptsz, memset_d_async::<u8>, (dst: CUdeviceptr, v: u8, n: usize, h: CUstream));
per_thread_pair!(cuMemsetD16Async, cuMemsetD16Async_ptsz, memset_d_async::<u16>, (dst: CUdeviceptr, v: u16, n: usize, h: CUstream));
per_thread_pair!(cuMemsetD32Async, cuMemsetD32Async_ptsz, memset_d_async::<u32>, (dst: CUdeviceptr, v: u32, n: usize, h: CUstream));

/// A 2D memset of `height` rows of `width` elements, `pitch` bytes apart (device memory,
/// checked when it runs).
fn memset_2d(
    pt: bool,
    stream: Option<CUstream>,
    dst: u64,
    pitch: usize,
    pattern: Vec<u8>,
    width: usize,
    height: usize,
) -> Result<(), CUresult> {
    let elem = pattern.len();
    if !dst.is_multiple_of(elem as u64)
        || !pitch.is_multiple_of(elem)
        || (height > 1 && width * elem > pitch)
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if width == 0 || height == 0 {
        return memset(pt, stream, dst, pattern, 0);
    }
    let op = Op::Memset2D {
        dst,
        pitch: pitch as u64,
        pattern,
        width: width as u64,
        height: height as u64,
    };
    match stream {
        Some(h) => enqueue(h, pt, Vec::new(), op),
        None => run_default(pt, op, !st()?.space.is_device_memory(dst)),
    }
}

unsafe fn memset_d2d<T: Element>(
    pt: bool,
    dst: CUdeviceptr,
    pitch: usize,
    v: T,
    w: usize,
    h: usize,
) -> Result<(), CUresult> {
    memset_2d(pt, None, dst, pitch, v.pattern(), w, h)
}
per_thread_pair!(cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds, memset_d2d::<u8>, (dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize));
per_thread_pair!(cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds, memset_d2d::<u16>, (dst: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize));
per_thread_pair!(cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds, memset_d2d::<u32>, (dst: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize));

unsafe fn memset_d2d_async<T: Element>(
    pt: bool,
    dst: CUdeviceptr,
    pitch: usize,
    v: T,
    w: usize,
    h: usize,
    s: CUstream,
) -> Result<(), CUresult> {
    memset_2d(pt, Some(s), dst, pitch, v.pattern(), w, h)
}
per_thread_pair!(cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz, memset_d2d_async::<u8>, (dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize, s: CUstream));
per_thread_pair!(cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz, memset_d2d_async::<u16>, (dst: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize, s: CUstream));
per_thread_pair!(cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz, memset_d2d_async::<u32>, (dst: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize, s: CUstream));

/// Both contexts must be valid; with one device, a peer copy is a device-to-device copy.
fn check_peer_contexts(dst_ctx: CUcontext, src_ctx: CUcontext) -> Result<(), CUresult> {
    let s = st()?;
    for c in [dst_ctx, src_ctx] {
        s.contexts
            .get(c as usize)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    }
    Ok(())
}

unsafe fn memcpy_peer(
    pt: bool,
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
) -> Result<(), CUresult> {
    check_peer_contexts(dst_ctx, src_ctx)?;
    // SAFETY: no host memory is involved.
    unsafe { submit(pt, None, Ok(Side::Device(dst)), Ok(Side::Device(src)), n) }
}
per_thread_pair!(cuMemcpyPeer, cuMemcpyPeer_ptds, memcpy_peer, (dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize));

unsafe fn memcpy_peer_async(
    pt: bool,
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    h: CUstream,
) -> Result<(), CUresult> {
    check_peer_contexts(dst_ctx, src_ctx)?;
    // SAFETY: no host memory is involved.
    unsafe { submit(pt, Some(h), Ok(Side::Device(dst)), Ok(Side::Device(src)), n) }
}
per_thread_pair!(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz, memcpy_peer_async, (dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, h: CUstream));
