//! Helpers shared by the simulator's integration tests: they call the exported entry points
//! directly through the rlib, exactly as a C program would through the cdylib.
#![allow(dead_code)]

use std::ffi::{c_void, CString};

use cuda::api::context::*;
use cuda::api::copy::*;
use cuda::api::device::*;
use cuda::api::launch::*;
use cuda::api::memory::*;
use cuda::api::module::*;
use cuda::api::stream::*;
use tensile_driver_abi::*;

/// Compares two word vectors without printing thousands of values on failure.
#[track_caller]
pub fn same(got: &[u32], want: &[u32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at {i}: got {:#x}, want {:#x}",
            got[i], want[i]
        );
    }
}

/// Panics with the error's name unless `code` is CUDA_SUCCESS.
#[track_caller]
pub fn ck(code: CUresult) {
    assert_eq!(code, CUDA_SUCCESS, "CUDA error {code}");
}

/// cuInit + a fresh (non-primary) context current on this thread, so that a fault in one
/// test never breaks another.
pub fn fresh_context() -> CUcontext {
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        ck(cuInit(0));
        let mut ctx = std::ptr::null_mut();
        ck(cuCtxCreate_v2(&mut ctx, 0, 0));
        ctx
    }
}

/// The committed kernels, loaded as a module; returns the function `name`.
pub fn function(name: &str) -> CUfunction {
    let ptx = CString::new(tensile_kernels::PTX).unwrap();
    let name = CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and out-pointers.
    unsafe {
        let mut module = std::ptr::null_mut();
        ck(cuModuleLoadData(&mut module, ptx.as_ptr() as *const c_void));
        let mut f = std::ptr::null_mut();
        ck(cuModuleGetFunction(&mut f, module, name.as_ptr()));
        f
    }
}

pub fn alloc(bytes: usize) -> CUdeviceptr {
    let mut p = 0;
    // SAFETY: valid out-pointer.
    ck(unsafe { cuMemAlloc_v2(&mut p, bytes) });
    p
}

pub fn upload_u32(dst: CUdeviceptr, data: &[u32]) {
    // SAFETY: `data` is a live slice of the given byte length.
    ck(unsafe { cuMemcpyHtoD_v2(dst, data.as_ptr() as *const c_void, data.len() * 4) });
}

pub fn download_u32(src: CUdeviceptr, n: usize) -> Vec<u32> {
    let mut v = vec![0u32; n];
    // SAFETY: `v` holds n * 4 bytes.
    ck(unsafe { cuMemcpyDtoH_v2(v.as_mut_ptr() as *mut c_void, src, n * 4) });
    v
}

pub fn try_download_u32(src: CUdeviceptr, n: usize) -> Result<Vec<u32>, CUresult> {
    let mut v = vec![0u32; n];
    // SAFETY: `v` holds n * 4 bytes.
    match unsafe { cuMemcpyDtoH_v2(v.as_mut_ptr() as *mut c_void, src, n * 4) } {
        CUDA_SUCCESS => Ok(v),
        e => Err(e),
    }
}

/// Launches `f` on `stream` with a packed parameter buffer (the `extra` form).
pub fn launch_packed(f: CUfunction, stream: CUstream, params: &[u8]) -> CUresult {
    let mut buf = params.to_vec();
    let mut size = buf.len();
    let mut extra = [
        CU_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
        buf.as_mut_ptr() as *mut c_void,
        CU_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
        &mut size as *mut usize as *mut c_void,
        CU_LAUNCH_PARAM_END as *mut c_void,
    ];
    // SAFETY: `extra` is a valid END-terminated list pointing at live locals.
    unsafe {
        cuLaunchKernel(
            f,
            4,
            1,
            1,
            128,
            1,
            1,
            0,
            stream,
            std::ptr::null_mut(),
            extra.as_mut_ptr(),
        )
    }
}

/// Launches `f` with one pointer per parameter (the `kernelParams` form).
pub fn launch_args(f: CUfunction, stream: CUstream, args: &mut [*mut c_void]) -> CUresult {
    // SAFETY: each element points at a live local of the parameter's size.
    unsafe {
        cuLaunchKernel(
            f,
            2,
            1,
            1,
            64,
            1,
            1,
            0,
            stream,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
}

pub fn new_stream(flags: u32) -> CUstream {
    let mut s = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    ck(unsafe { cuStreamCreate(&mut s, flags) });
    s
}

pub fn sync(stream: CUstream) -> CUresult {
    // SAFETY: plain driver call.
    unsafe { cuStreamSynchronize(stream) }
}

pub fn ctx_sync() -> CUresult {
    // SAFETY: plain driver call.
    unsafe { cuCtxSynchronize() }
}

pub fn mem_info() -> (usize, usize) {
    let (mut free, mut total) = (0, 0);
    // SAFETY: valid out-pointers.
    ck(unsafe { cuMemGetInfo_v2(&mut free, &mut total) });
    (free, total)
}

pub fn device_attribute(attr: i32) -> i32 {
    let mut v = 0;
    // SAFETY: valid out-pointer.
    ck(unsafe { cuDeviceGetAttribute(&mut v, attr, 0) });
    v
}

pub const GRAN: usize = 2 << 20;

pub fn device_loc() -> CUmemLocation {
    CUmemLocation {
        type_: CU_MEM_LOCATION_TYPE_DEVICE,
        id: 0,
    }
}

pub fn host_loc() -> CUmemLocation {
    CUmemLocation {
        type_: CU_MEM_LOCATION_TYPE_HOST_NUMA,
        id: 0,
    }
}

pub fn reserve(size: usize) -> CUdeviceptr {
    let mut va = 0;
    // SAFETY: valid out-pointer.
    ck(unsafe { cuda::api::vmm::cuMemAddressReserve(&mut va, size, 0, 0, 0) });
    va
}

pub fn create(size: usize, loc: CUmemLocation) -> CUmemGenericAllocationHandle {
    let mut h = 0;
    let prop = CUmemAllocationProp::pinned(loc);
    // SAFETY: valid out-pointer and properties.
    ck(unsafe { cuda::api::vmm::cuMemCreate(&mut h, size, &prop, 0) });
    h
}

pub fn map(va: CUdeviceptr, size: usize, h: CUmemGenericAllocationHandle) -> CUresult {
    // SAFETY: plain driver call.
    unsafe { cuda::api::vmm::cuMemMap(va, size, 0, h, 0) }
}

pub fn set_access(va: CUdeviceptr, size: usize, flags: u32) -> CUresult {
    let desc = CUmemAccessDesc {
        location: device_loc(),
        flags,
    };
    // SAFETY: one valid descriptor.
    unsafe { cuda::api::vmm::cuMemSetAccess(va, size, &desc, 1) }
}

pub fn unmap(va: CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: plain driver call.
    unsafe { cuda::api::vmm::cuMemUnmap(va, size) }
}
