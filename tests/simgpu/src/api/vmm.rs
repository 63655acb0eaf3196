//! Virtual memory management entry points (see [`crate::memory::vmm`] for the semantics).

use std::ffi::c_void;

use tensile_driver_abi::*;

use super::{export, st, Out};
use crate::memory::vmm::check_location;
use crate::memory::Access;

unsafe fn address_reserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    align: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(ptr) }?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    out.set(st()?.space.reserve(size as u64, align as u64, addr)?);
    Ok(())
}
export!(cuMemAddressReserve, address_reserve, (ptr: *mut CUdeviceptr, size: usize, align: usize, addr: CUdeviceptr, flags: u64));

unsafe fn address_free(ptr: CUdeviceptr, size: usize) -> Result<(), CUresult> {
    st()?.space.address_free(ptr, size as u64)
}
export!(cuMemAddressFree, address_free, (ptr: CUdeviceptr, size: usize));

/// # Safety
/// `prop` must be NULL or point to a `CUmemAllocationProp`.
unsafe fn read_prop(prop: *const CUmemAllocationProp) -> Result<CUmemAllocationProp, CUresult> {
    if prop.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, points to a CUmemAllocationProp (API contract).
    let p = unsafe { std::ptr::read_unaligned(prop) };
    if p.type_ != CU_MEM_ALLOCATION_TYPE_PINNED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_location(&p.location)?;
    Ok(p)
}

unsafe fn mem_create(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(handle) }?;
    // SAFETY: API contract.
    let p = unsafe { read_prop(prop) }?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if p.requested_handle_types & !CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR != 0 {
        // Windows handles and fabric handles are not simulated.
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    out.set(
        st()?
            .space
            .create(size as u64, p.location, p.requested_handle_types)?,
    );
    Ok(())
}
export!(cuMemCreate, mem_create, (handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64));

unsafe fn mem_release(handle: CUmemGenericAllocationHandle) -> Result<(), CUresult> {
    st()?.space.release(handle)
}
export!(cuMemRelease, mem_release, (handle: CUmemGenericAllocationHandle));

unsafe fn mem_map(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> Result<(), CUresult> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    st()?.space.map(ptr, size as u64, offset as u64, handle)
}
export!(cuMemMap, mem_map, (ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64));

unsafe fn mem_unmap(ptr: CUdeviceptr, size: usize) -> Result<(), CUresult> {
    st()?.space.unmap(ptr, size as u64)
}
export!(cuMemUnmap, mem_unmap, (ptr: CUdeviceptr, size: usize));

fn access_of(flags: u32) -> Result<Access, CUresult> {
    match flags {
        CU_MEM_ACCESS_FLAGS_PROT_NONE => Ok(Access::None),
        CU_MEM_ACCESS_FLAGS_PROT_READ => Ok(Access::Read),
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE => Ok(Access::ReadWrite),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Only the device's access matters to kernels; descriptors for host locations are
/// validated and otherwise ignored.
unsafe fn mem_set_access(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> Result<(), CUresult> {
    if desc.is_null() || count == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let space = &st()?.space;
    let mut device_access = None;
    for i in 0..count {
        // SAFETY: `desc` holds `count` descriptors (API contract).
        let d = unsafe { std::ptr::read_unaligned(desc.add(i)) };
        let access = access_of(d.flags)?;
        if check_location(&d.location)? {
            device_access = Some(access);
        }
    }
    match device_access {
        Some(a) => space.set_access(ptr, size as u64, a),
        None => Ok(()),
    }
}
export!(cuMemSetAccess, mem_set_access, (ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize));

unsafe fn mem_get_access(
    flags: *mut u64,
    location: *const CUmemLocation,
    ptr: CUdeviceptr,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(flags) }?;
    if location.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, points to a CUmemLocation (API contract).
    let loc = unsafe { std::ptr::read_unaligned(location) };
    let on_device = check_location(&loc)?;
    let access = st()?.space.get_access(ptr)?;
    out.set(match (on_device, access) {
        (false, _) | (true, Access::None) => u64::from(CU_MEM_ACCESS_FLAGS_PROT_NONE),
        (true, Access::Read) => u64::from(CU_MEM_ACCESS_FLAGS_PROT_READ),
        (true, Access::ReadWrite) => u64::from(CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
    });
    Ok(())
}
export!(cuMemGetAccess, mem_get_access, (flags: *mut u64, location: *const CUmemLocation, ptr: CUdeviceptr));

unsafe fn mem_get_allocation_granularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: u32,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(granularity) }?;
    st()?;
    // SAFETY: API contract.
    unsafe { read_prop(prop) }?;
    if option > CU_MEM_ALLOC_GRANULARITY_RECOMMENDED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    out.set(crate::config::granularity() as usize);
    Ok(())
}
export!(cuMemGetAllocationGranularity, mem_get_allocation_granularity, (granularity: *mut usize, prop: *const CUmemAllocationProp, option: u32));

unsafe fn mem_get_allocation_properties(
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(prop) }?;
    let (location, _, handle_types) = st()?.space.properties(handle)?;
    let mut prop = CUmemAllocationProp::pinned(location);
    prop.requested_handle_types = handle_types;
    out.set(prop);
    Ok(())
}
export!(cuMemGetAllocationPropertiesFromHandle, mem_get_allocation_properties, (prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle));

unsafe fn mem_retain_allocation_handle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(handle) }?;
    out.set(st()?.space.retain_handle(addr as u64)?);
    Ok(())
}
export!(cuMemRetainAllocationHandle, mem_retain_allocation_handle, (handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void));

/// `cuMemExportToShareableHandle`: only POSIX file descriptors (written to the `int` that
/// `shareable` points to), only of allocations created with that type requested.
unsafe fn mem_export_to_shareable_handle(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: u32,
    flags: u64,
) -> Result<(), CUresult> {
    // SAFETY: API contract: for a POSIX file descriptor, `shareable` points to an `int`.
    let out = unsafe { Out::new(shareable.cast::<i32>()) }?;
    if flags != 0 || handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let fd = st()?.space.export_fd(handle)?;
    out.set(std::os::fd::IntoRawFd::into_raw_fd(fd));
    Ok(())
}
export!(cuMemExportToShareableHandle, mem_export_to_shareable_handle, (shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: u32, flags: u64));

/// `cuMemImportFromShareableHandle`: for a POSIX file descriptor, `os_handle` is the
/// descriptor's value (cast to a pointer), which stays the caller's. The allocation is on
/// the current context's device.
unsafe fn mem_import_from_shareable_handle(
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: u32,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(handle) }?;
    if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let raw = i32::try_from(os_handle as usize).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    if raw < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let device = super::current_ctx().map_or(0, |c| c.device as i32);
    // SAFETY: the caller passes an open descriptor, which stays open for this call.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
    out.set(st()?.space.import_fd(fd, device)?);
    Ok(())
}
export!(cuMemImportFromShareableHandle, mem_import_from_shareable_handle, (handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, handle_type: u32));
