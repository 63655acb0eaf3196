//! Memory pools: the default pool, created pools, attributes (see [`crate::pool`] for what
//! is simplified).

use std::ffi::c_void;
use std::sync::Arc;

use tensile_driver_abi::*;

use super::{check_device, export, st, Out};
use crate::memory::vmm::check_location;
use crate::pool::{AttrValue, Pool};

/// The pool behind a handle the application passed (`CUDA_ERROR_INVALID_VALUE` if none).
fn pool_of(pool: CUmemoryPool) -> Result<Arc<Pool>, CUresult> {
    st()?
        .pools
        .get(pool as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

unsafe fn device_get_default_mem_pool(
    pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pool) }?;
    let device = check_device(dev)?;
    out.set(st()?.default_pools[device] as CUmemoryPool);
    Ok(())
}
export!(cuDeviceGetDefaultMemPool, device_get_default_mem_pool, (pool: *mut CUmemoryPool, dev: CUdevice));

unsafe fn device_get_mem_pool(pool: *mut CUmemoryPool, dev: CUdevice) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pool) }?;
    let device = check_device(dev)?;
    out.set(*st()?.current_pool(device) as CUmemoryPool);
    Ok(())
}
export!(cuDeviceGetMemPool, device_get_mem_pool, (pool: *mut CUmemoryPool, dev: CUdevice));

unsafe fn device_set_mem_pool(dev: CUdevice, pool: CUmemoryPool) -> Result<(), CUresult> {
    let device = check_device(dev)?;
    let s = st()?;
    let p = s.pools.get(pool as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE || p.location.id as usize != device {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    *s.current_pool(device) = pool as usize;
    Ok(())
}
export!(cuDeviceSetMemPool, device_set_mem_pool, (dev: CUdevice, pool: CUmemoryPool));

/// The leading fields of `CUmemPoolProps` (88 bytes in all; the rest is reserved).
#[repr(C)]
struct PoolPropsHead {
    alloc_type: u32,
    _handle_types: u32,
    location: CUmemLocation,
    _win32: *mut c_void,
    max_size: usize,
}

unsafe fn mem_pool_create(pool: *mut CUmemoryPool, props: *const c_void) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pool) }?;
    if props.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    st()?;
    // SAFETY: `props` points to a CUmemPoolProps, which starts with these fields.
    let head = unsafe { std::ptr::read_unaligned(props as *const PoolPropsHead) };
    if head.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_location(&head.location)?;
    let p = Arc::new(Pool::new(head.location, head.max_size as u64));
    out.set(st()?.pools.insert(p) as CUmemoryPool);
    Ok(())
}
export!(cuMemPoolCreate, mem_pool_create, (pool: *mut CUmemoryPool, props: *const c_void));

unsafe fn mem_pool_destroy(pool: CUmemoryPool) -> Result<(), CUresult> {
    let s = st()?;
    if s.default_pools.contains(&(pool as usize)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    s.pools
        .remove(pool as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    for (device, &default) in s.default_pools.iter().enumerate() {
        let mut current = s.current_pool(device);
        if *current == pool as usize {
            *current = default;
        }
    }
    Ok(())
}
export!(cuMemPoolDestroy, mem_pool_destroy, (pool: CUmemoryPool));

unsafe fn mem_pool_set_attribute(
    pool: CUmemoryPool,
    attr: i32,
    value: *mut c_void,
) -> Result<(), CUresult> {
    let p = pool_of(pool)?;
    let is_int = Pool::attr_is_int(attr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `value` points to an int or a cuuint64_t, per the attribute (API contract).
    let v = unsafe {
        if is_int {
            AttrValue::Int(std::ptr::read_unaligned(value as *const i32))
        } else {
            AttrValue::U64(std::ptr::read_unaligned(value as *const u64))
        }
    };
    p.set(attr, v)
}
export!(cuMemPoolSetAttribute, mem_pool_set_attribute, (pool: CUmemoryPool, attr: i32, value: *mut c_void));

unsafe fn mem_pool_get_attribute(
    pool: CUmemoryPool,
    attr: i32,
    value: *mut c_void,
) -> Result<(), CUresult> {
    let p = pool_of(pool)?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `value` has room for the attribute's type (API contract).
    unsafe {
        match p.get(attr)? {
            AttrValue::Int(v) => std::ptr::write_unaligned(value as *mut i32, v),
            AttrValue::U64(v) => std::ptr::write_unaligned(value as *mut u64, v),
        }
    }
    Ok(())
}
export!(cuMemPoolGetAttribute, mem_pool_get_attribute, (pool: CUmemoryPool, attr: i32, value: *mut c_void));

/// Pools cache nothing here, so there is never anything to trim.
unsafe fn mem_pool_trim_to(pool: CUmemoryPool, _keep: usize) -> Result<(), CUresult> {
    pool_of(pool).map(drop)
}
export!(cuMemPoolTrimTo, mem_pool_trim_to, (pool: CUmemoryPool, keep: usize));
