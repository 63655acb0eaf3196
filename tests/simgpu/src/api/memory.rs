//! Linear device memory, stream-ordered allocation, pinned host memory and pointer queries.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use tensile_driver_abi::*;

use super::{current_ctx, export, per_thread_pair, resolve_stream, st, Out};
use crate::handles::Registry;
use crate::memory::{Access, Region, RegionKind};
use crate::ops::Op;
use crate::pool::Pool;

fn pool_of(index: Option<usize>) -> Option<Arc<Pool>> {
    index.and_then(|h| st().ok()?.pools.get(h))
}

unsafe fn mem_alloc(dptr: *mut CUdeviceptr, size: usize) -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    // SAFETY: API contract.
    let out = unsafe { Out::new(dptr) }?;
    let ctx = current_ctx()?;
    ctx.check()?;
    let (addr, _) = st()?.space.alloc_linear(
        size as u64,
        Registry::handle_of(&ctx),
        None,
        Some(ctx.device),
    )?;
    out.set(addr);
    Ok(())
}
export!(cuMemAlloc_v2, mem_alloc, (dptr: *mut CUdeviceptr, size: usize));

/// Rows are padded to a multiple of 512 bytes, like the driver on current GPUs.
unsafe fn mem_alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    // SAFETY: API contract.
    let (out, pitch_out) = unsafe { (Out::new(dptr)?, Out::new(pitch)?) };
    if !matches!(elem, 4 | 8 | 16) || width == 0 || height == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = width
        .checked_next_multiple_of(512)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let size = p.checked_mul(height).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let ctx = current_ctx()?;
    ctx.check()?;
    let (addr, _) = st()?.space.alloc_linear(
        size as u64,
        Registry::handle_of(&ctx),
        None,
        Some(ctx.device),
    )?;
    out.set(addr);
    pitch_out.set(p);
    Ok(())
}
export!(cuMemAllocPitch_v2, mem_alloc_pitch, (dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint));

/// Synchronizes the context first, as the driver's `cuMemFree` does.
unsafe fn mem_free(dptr: CUdeviceptr) -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    let ctx = current_ctx()?;
    ctx.synchronize();
    let (bytes, pool) = st()?.space.free_linear(dptr, false)?;
    if let Some(p) = pool_of(pool) {
        p.freed(bytes);
    }
    ctx.check()
}
export!(cuMemFree_v2, mem_free, (dptr: CUdeviceptr));

/// During capture the allocation becomes a graph memory node: made now, owned by the graph
/// (see `crate::capture`).
fn alloc_from_pool(
    pool_handle: usize,
    size: usize,
    h: CUstream,
    pt: bool,
) -> Result<CUdeviceptr, CUresult> {
    let (ctx, stream) = resolve_stream(h, pt)?;
    ctx.check()?;
    let capture = stream.capture();
    if capture.as_ref().is_some_and(|c| c.is_invalidated()) {
        return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    let s = st()?;
    let pool = s.pools.get(pool_handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let on_device = pool.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE;
    let (addr, charged) = s.space.alloc_linear(
        size as u64,
        Registry::handle_of(&ctx),
        Some(pool_handle),
        on_device.then_some(pool.location.id as usize),
    )?;
    pool.allocated(if on_device { charged } else { size as u64 });
    if let Some(c) = capture {
        c.memory.add(addr, Some(pool));
    }
    Ok(addr)
}

/// The memory is usable at once (allocation is not modelled as stream-ordered; frees are).
/// On a capturing stream it is a graph allocation (see `alloc_from_pool`).
unsafe fn mem_alloc_async(
    pt: bool,
    dptr: *mut CUdeviceptr,
    size: usize,
    h: CUstream,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(dptr) }?;
    let (ctx, _) = resolve_stream(h, pt)?;
    let pool = *st()?.current_pool(ctx.device);
    out.set(alloc_from_pool(pool, size, h, pt)?);
    Ok(())
}
per_thread_pair!(cuMemAllocAsync, cuMemAllocAsync_ptsz, mem_alloc_async, (dptr: *mut CUdeviceptr, size: usize, h: CUstream));

unsafe fn mem_alloc_from_pool_async(
    pt: bool,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    h: CUstream,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(dptr) }?;
    out.set(alloc_from_pool(pool as usize, size, h, pt)?);
    Ok(())
}
per_thread_pair!(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz, mem_alloc_from_pool_async, (dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, h: CUstream));

/// Stream-ordered: the memory stays valid for work queued before the free and becomes
/// invalid (unmapped) when the free executes on the stream.
unsafe fn mem_free_async(pt: bool, dptr: CUdeviceptr, h: CUstream) -> Result<(), CUresult> {
    let (ctx, stream) = resolve_stream(h, pt)?;
    ctx.check()?;
    if let Some(c) = stream.capture() {
        // A graph free node: the graph keeps its memory for its whole lifetime, so nothing
        // is freed at launch. Freeing memory the graph does not own is not simulated.
        if c.is_invalidated() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        return if c.memory.contains(dptr) {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_SUPPORTED)
        };
    }
    let pool = st()?.space.queue_free(dptr)?;
    ctx.submit(
        &stream,
        Vec::new(),
        Op::Free {
            addr: dptr,
            pool: pool_of(pool),
        },
    );
    Ok(())
}
per_thread_pair!(cuMemFreeAsync, cuMemFreeAsync_ptsz, mem_free_async, (dptr: CUdeviceptr, h: CUstream));

unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let (f, t) = unsafe { (Out::new(free)?, Out::new(total)?) };
    let device = current_ctx()?.device;
    let space = &st()?.space;
    f.set(space.device_free(device) as usize);
    t.set(space.capacity(device) as usize);
    Ok(())
}
export!(cuMemGetInfo_v2, mem_get_info, (free: *mut usize, total: *mut usize));

unsafe fn mem_host_alloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    // SAFETY: API contract.
    let out = unsafe { Out::new(pp) }?;
    if flags & !0xf != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current_ctx()?;
    let addr = st()?
        .space
        .alloc_host(size as u64, Registry::handle_of(&ctx))?;
    out.set(addr as *mut c_void);
    Ok(())
}
export!(cuMemHostAlloc, mem_host_alloc, (pp: *mut *mut c_void, size: usize, flags: c_uint));

unsafe fn mem_alloc_host(pp: *mut *mut c_void, size: usize) -> Result<(), CUresult> {
    // SAFETY: same contract.
    unsafe { mem_host_alloc(pp, size, 0) }
}
export!(cuMemAllocHost_v2, mem_alloc_host, (pp: *mut *mut c_void, size: usize));

unsafe fn mem_free_host(p: *mut c_void) -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    current_ctx()?;
    st()?.space.free_host(p as u64)
}
export!(cuMemFreeHost, mem_free_host, (p: *mut c_void));

const HOST_REGISTER_FLAGS: c_uint = 0xf; // PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY
const HOST_REGISTER_READ_ONLY: c_uint = 0x8;

unsafe fn mem_host_register(p: *mut c_void, size: usize, flags: c_uint) -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    if flags & !HOST_REGISTER_FLAGS != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current_ctx()?;
    let access = if flags & HOST_REGISTER_READ_ONLY != 0 {
        Access::Read
    } else {
        Access::ReadWrite
    };
    st()?
        .space
        .register_host(p as u64, size as u64, access, Registry::handle_of(&ctx))
}
export!(cuMemHostRegister_v2, mem_host_register, (p: *mut c_void, size: usize, flags: c_uint));

unsafe fn mem_host_unregister(p: *mut c_void) -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    current_ctx()?;
    st()?.space.unregister_host(p as u64)
}
export!(cuMemHostUnregister, mem_host_unregister, (p: *mut c_void));

unsafe fn mem_host_get_device_pointer(
    dptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(dptr) }?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    current_ctx()?;
    match st()?.space.region_of(p as u64) {
        Some(r) if !r.is_device() => {
            out.set(p as u64);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}
export!(cuMemHostGetDevicePointer_v2, mem_host_get_device_pointer, (dptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint));

unsafe fn mem_get_address_range(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> Result<(), CUresult> {
    current_ctx()?;
    let r = st()?.space.region_of(dptr).ok_or(CUDA_ERROR_NOT_FOUND)?;
    if !base.is_null() {
        // SAFETY: API contract; NULL outputs are skipped.
        unsafe { Out::new(base) }?.set(r.start);
    }
    if !size.is_null() {
        // SAFETY: as above.
        unsafe { Out::new(size) }?.set(r.len as usize);
    }
    Ok(())
}
export!(cuMemGetAddressRange_v2, mem_get_address_range, (base: *mut CUdeviceptr, size: *mut usize, dptr: CUdeviceptr));

/// Exports only what the driver's legacy IPC exports (`Space::ipc_exportable`); the handle
/// names the address (no other process can open it here: see [`ipc_open_mem_handle`]).
unsafe fn ipc_get_mem_handle(
    handle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(handle) }?;
    current_ctx()?;
    if !st()?.space.ipc_exportable(dptr) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut reserved = [0u8; 64];
    reserved[..8].copy_from_slice(&dptr.to_le_bytes());
    out.set(CUipcMemHandle { reserved });
    Ok(())
}
export!(cuIpcGetMemHandle, ipc_get_mem_handle, (handle: *mut CUipcMemHandle, dptr: CUdeviceptr));

/// `cuIpcOpenMemHandle[_v2]`: legacy IPC between processes is not simulated, so no handle
/// opens: a handle of this process's own (the driver refuses those too, with
/// `CUDA_ERROR_INVALID_CONTEXT`) and any other one (`CUDA_ERROR_INVALID_HANDLE`, what the
/// driver answers for a handle it does not know).
unsafe fn ipc_open_mem_handle(
    dptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    unsafe { Out::new(dptr) }?;
    current_ctx()?;
    if flags & !CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut named = [0u8; 8];
    named.copy_from_slice(&handle.reserved[..8]);
    let named = u64::from_le_bytes(named);
    if handle.reserved[8..].iter().all(|&b| b == 0) && st()?.space.ipc_exportable(named) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    Err(CUDA_ERROR_INVALID_HANDLE)
}
export!(cuIpcOpenMemHandle, ipc_open_mem_handle, (dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint));
export!(cuIpcOpenMemHandle_v2, ipc_open_mem_handle, (dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint));

/// `cuIpcCloseMemHandle`: nothing is ever opened ([`ipc_open_mem_handle`]), so every
/// pointer is one the driver does not know.
unsafe fn ipc_close_mem_handle(dptr: CUdeviceptr) -> Result<(), CUresult> {
    current_ctx()?;
    let _ = dptr;
    Err(CUDA_ERROR_INVALID_VALUE)
}
export!(cuIpcCloseMemHandle, ipc_close_mem_handle, (dptr: CUdeviceptr));

const ATTR_HOST_POINTER: i32 = 4;
const ATTR_BUFFER_ID: i32 = 7;
const ATTR_IS_MANAGED: i32 = 8;
const ATTR_DEVICE_ORDINAL: i32 = 9;
const ATTR_ALLOWED_HANDLE_TYPES: i32 = 14;
const ATTR_ACCESS_FLAGS: i32 = 16;
const ATTR_MEMPOOL_HANDLE: i32 = 17;

/// Bytes written for each supported pointer attribute (booleans are written as one byte).
fn attr_size(attr: i32) -> Option<usize> {
    Some(match attr {
        CU_POINTER_ATTRIBUTE_CONTEXT | CU_POINTER_ATTRIBUTE_DEVICE_POINTER | ATTR_HOST_POINTER => 8,
        ATTR_BUFFER_ID
        | CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
        | CU_POINTER_ATTRIBUTE_RANGE_SIZE => 8,
        ATTR_ALLOWED_HANDLE_TYPES | ATTR_MEMPOOL_HANDLE => 8,
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE | ATTR_DEVICE_ORDINAL | ATTR_ACCESS_FLAGS => 4,
        ATTR_IS_MANAGED | CU_POINTER_ATTRIBUTE_MAPPED => 1,
        _ => return None,
    })
}

/// The value of `attr` for pointer `ptr` in `r`, as little-endian bytes of `attr_size`.
fn attr_value(attr: i32, ptr: u64, r: &Region) -> Result<u64, CUresult> {
    Ok(match attr {
        CU_POINTER_ATTRIBUTE_CONTEXT => r.ctx as u64,
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE => u64::from(if r.is_device() {
            CU_MEMORYTYPE_DEVICE
        } else {
            CU_MEMORYTYPE_HOST
        }),
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER => ptr,
        ATTR_HOST_POINTER if !r.is_device() || is_managed(r) => ptr,
        ATTR_HOST_POINTER => return Err(CUDA_ERROR_INVALID_VALUE),
        ATTR_BUFFER_ID => r.start,
        ATTR_IS_MANAGED => u64::from(is_managed(r)),
        ATTR_DEVICE_ORDINAL => st()?.space.device_of(ptr).unwrap_or(0) as u64,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => r.start,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE => r.len,
        CU_POINTER_ATTRIBUTE_MAPPED => 1,
        ATTR_ALLOWED_HANDLE_TYPES => 0,
        ATTR_ACCESS_FLAGS => match r.access {
            Access::None => 0,
            Access::Read => 1,
            Access::ReadWrite => 3,
        },
        ATTR_MEMPOOL_HANDLE => match r.kind {
            RegionKind::Linear { pool: Some(p), .. } => p as u64,
            _ => 0,
        },
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

fn is_managed(r: &Region) -> bool {
    matches!(r.kind, RegionKind::Linear { managed: true, .. })
}

/// `CU_MEM_ATTACH_GLOBAL`, `CU_MEM_ATTACH_HOST`.
const ATTACH_GLOBAL: c_uint = 1;
const ATTACH_HOST: c_uint = 2;

/// Managed memory: one allocation the host and the device both use. On the simulated GPU all
/// memory is host memory, so it needs no migration; the driver's argument rules apply.
unsafe fn mem_alloc_managed(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    // SAFETY: API contract.
    let out = unsafe { Out::new(dptr) }?;
    if flags != ATTACH_GLOBAL && flags != ATTACH_HOST {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current_ctx()?;
    ctx.check()?;
    let addr = st()?
        .space
        .alloc_managed(size as u64, Registry::handle_of(&ctx))?;
    out.set(addr);
    Ok(())
}
export!(cuMemAllocManaged, mem_alloc_managed, (dptr: *mut CUdeviceptr, size: usize, flags: c_uint));

/// `CU_MEM_ADVISE_SET_READ_MOSTLY` (1) to `CU_MEM_ADVISE_UNSET_ACCESSED_BY` (6).
fn check_advice(ptr: CUdeviceptr, count: usize, advice: c_int) -> Result<(), CUresult> {
    current_ctx()?;
    if !(1..=6).contains(&advice) || count == 0 || !st()?.space.is_managed(ptr, count as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Advice changes where pages of managed memory live on a card; here it is checked and kept
/// nowhere.
unsafe fn mem_advise(
    ptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    _device: CUdevice,
) -> Result<(), CUresult> {
    check_advice(ptr, count, advice)
}
export!(cuMemAdvise, mem_advise, (ptr: CUdeviceptr, count: usize, advice: c_int, device: CUdevice));

unsafe fn mem_advise_v2(
    ptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    _location: CUmemLocation,
) -> Result<(), CUresult> {
    check_advice(ptr, count, advice)
}
export!(cuMemAdvise_v2, mem_advise_v2, (ptr: CUdeviceptr, count: usize, advice: c_int, location: CUmemLocation));

/// A prefetch of managed memory is ordered in its stream like any work (it moves no data
/// here: every byte is already where both sides can use it).
fn prefetch(pt: bool, ptr: CUdeviceptr, count: usize, h: CUstream) -> Result<(), CUresult> {
    let (ctx, stream) = resolve_stream(h, pt)?;
    ctx.check()?;
    if count == 0 || !st()?.space.is_managed(ptr, count as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    super::submit(&ctx, &stream, Vec::new(), Op::Nop)?;
    Ok(())
}

unsafe fn mem_prefetch_async(
    pt: bool,
    ptr: CUdeviceptr,
    count: usize,
    _device: CUdevice,
    h: CUstream,
) -> Result<(), CUresult> {
    prefetch(pt, ptr, count, h)
}
per_thread_pair!(cuMemPrefetchAsync, cuMemPrefetchAsync_ptsz, mem_prefetch_async, (ptr: CUdeviceptr, count: usize, device: CUdevice, h: CUstream));

unsafe fn mem_prefetch_async_v2(
    pt: bool,
    ptr: CUdeviceptr,
    count: usize,
    _location: CUmemLocation,
    flags: c_uint,
    h: CUstream,
) -> Result<(), CUresult> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    prefetch(pt, ptr, count, h)
}
per_thread_pair!(cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz, mem_prefetch_async_v2, (ptr: CUdeviceptr, count: usize, location: CUmemLocation, flags: c_uint, h: CUstream));

/// # Safety
/// `data` must hold `attr_size(attr)` writable bytes.
unsafe fn write_attr(data: *mut c_void, attr: i32, value: u64) -> Result<(), CUresult> {
    let n = attr_size(attr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let bytes = value.to_le_bytes();
    // SAFETY: the caller provides `n` bytes at `data` for this attribute (API contract).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data as *mut u8, n) };
    Ok(())
}

unsafe fn pointer_get_attribute(
    data: *mut c_void,
    attr: i32,
    ptr: CUdeviceptr,
) -> Result<(), CUresult> {
    if data.is_null() || attr_size(attr).is_none() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    st()?;
    let r = st()?.space.region_of(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let v = attr_value(attr, ptr, &r)?;
    // SAFETY: `data` is non-NULL and sized for `attr` (API contract).
    unsafe { write_attr(data, attr, v) }
}
export!(cuPointerGetAttribute, pointer_get_attribute, (data: *mut c_void, attr: i32, ptr: CUdeviceptr));

/// Unlike the single form, an unknown pointer is not an error: its attributes read as 0.
unsafe fn pointer_get_attributes(
    n: c_uint,
    attrs: *const i32,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> Result<(), CUresult> {
    if attrs.is_null() || data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    st()?;
    let region = st()?.space.region_of(ptr);
    for i in 0..n as usize {
        // SAFETY: both arrays hold `n` elements (API contract).
        let (attr, out) = unsafe { (*attrs.add(i), *data.add(i)) };
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = match &region {
            Some(r) => attr_value(attr, ptr, r).unwrap_or(0),
            None => 0,
        };
        // SAFETY: `out` is sized for `attr` (API contract).
        unsafe { write_attr(out, attr, v) }?;
    }
    Ok(())
}
export!(cuPointerGetAttributes, pointer_get_attributes, (n: c_uint, attrs: *const i32, data: *mut *mut c_void, ptr: CUdeviceptr));
