//! Initialization and contexts: errors before cuInit and without a current context, the
//! primary context, the context stack, device queries and error strings. One test, because
//! initialization happens once per process.

mod common;

use std::ffi::{c_char, CStr};

use common::*;
use cuda::api::context::*;
use cuda::api::device::*;
use cuda::api::memory::*;
use cuda::api::stream::*;
use tensile_driver_abi::*;

#[test]
fn initialization_contexts_and_device_queries() {
    // SAFETY: plain driver calls with valid (or deliberately NULL) pointers.
    unsafe {
        let mut p = 0;
        let mut dev = -1;
        let mut version = 0;
        ck(cuDriverGetVersion(&mut version));
        assert_eq!(version, 13000);
        assert_eq!(cuMemAlloc_v2(&mut p, 4096), CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(cuDeviceGet(&mut dev, 0), CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(cuInit(1), CUDA_ERROR_INVALID_VALUE);
        ck(cuInit(0));

        // No current context yet.
        let mut ctx = 1 as CUcontext;
        ck(cuCtxGetCurrent(&mut ctx));
        assert!(ctx.is_null());
        assert_eq!(cuMemAlloc_v2(&mut p, 4096), CUDA_ERROR_INVALID_CONTEXT);
        let mut s = std::ptr::null_mut();
        assert_eq!(cuStreamCreate(&mut s, 0), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuCtxGetDevice(&mut dev), CUDA_ERROR_INVALID_CONTEXT);

        // Device queries.
        let mut count = 0;
        ck(cuDeviceGetCount(&mut count));
        assert_eq!(count, 1);
        ck(cuDeviceGet(&mut dev, 0));
        assert_eq!(dev, 0);
        assert_eq!(cuDeviceGet(&mut dev, 1), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(
            cuDeviceGet(std::ptr::null_mut(), 0),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut name = [0 as c_char; 64];
        ck(cuDeviceGetName(name.as_mut_ptr(), 64, 0));
        assert_eq!(
            CStr::from_ptr(name.as_ptr()).to_str().unwrap(),
            "Tensile Simulated GPU"
        );
        let mut short = [0x55 as c_char; 8];
        ck(cuDeviceGetName(short.as_mut_ptr(), 8, 0));
        assert_eq!(CStr::from_ptr(short.as_ptr()).to_bytes(), b"Tensile");
        assert_eq!(
            device_attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
            1
        );
        assert_eq!(device_attribute(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT), 3);
        assert_eq!(
            device_attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            9
        );
        assert_eq!(
            device_attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            0
        );
        assert_eq!(
            device_attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED),
            1
        );
        assert_eq!(device_attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING), 1);
        let mut v = 0;
        assert_eq!(
            cuDeviceGetAttribute(&mut v, 100_000, 0),
            CUDA_ERROR_INVALID_VALUE
        );

        // The primary context: same handle every time.
        let (mut a, mut b) = (std::ptr::null_mut(), std::ptr::null_mut());
        ck(cuDevicePrimaryCtxRetain(&mut a, 0));
        ck(cuDevicePrimaryCtxRetain(&mut b, 0));
        assert_eq!(a, b);
        let (mut flags, mut active) = (9u32, 0);
        ck(cuDevicePrimaryCtxGetState(0, &mut flags, &mut active));
        assert_eq!((flags, active), (0, 1));
        ck(cuCtxSetCurrent(a));
        ck(cuCtxGetCurrent(&mut ctx));
        assert_eq!(ctx, a);
        ck(cuCtxGetDevice(&mut dev));
        let p = alloc(4096);

        // The stack: push a created context, pop back to the primary.
        let mut created = std::ptr::null_mut();
        ck(cuCtxCreate_v2(&mut created, 0, 0));
        assert_ne!(created, a);
        ck(cuCtxGetCurrent(&mut ctx));
        assert_eq!(ctx, created);
        let mut popped = std::ptr::null_mut();
        ck(cuCtxPopCurrent_v2(&mut popped));
        assert_eq!(popped, created);
        ck(cuCtxGetCurrent(&mut ctx));
        assert_eq!(ctx, a);
        ck(cuCtxPushCurrent_v2(created));
        ck(cuCtxDestroy_v2(created));
        ck(cuCtxGetCurrent(&mut ctx));
        assert_eq!(ctx, a, "destroying the current context pops it");
        assert_eq!(cuCtxSetCurrent(created), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(
            cuCtxDestroy_v2(a),
            CUDA_ERROR_INVALID_CONTEXT,
            "primary is not destroyed"
        );

        // Pointer queries on a device allocation.
        let mut base = 0;
        let mut size = 0;
        ck(cuMemGetAddressRange_v2(&mut base, &mut size, p + 100));
        assert_eq!((base, size), (p, 4096));
        let mut kind = 0u32;
        ck(cuPointerGetAttribute(
            &mut kind as *mut u32 as *mut _,
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            p,
        ));
        assert_eq!(kind, CU_MEMORYTYPE_DEVICE);
        let mut owner: CUcontext = std::ptr::null_mut();
        ck(cuPointerGetAttribute(
            &mut owner as *mut CUcontext as *mut _,
            CU_POINTER_ATTRIBUTE_CONTEXT,
            p,
        ));
        assert_eq!(owner, a);
        let local = 0u64;
        let host = &local as *const u64 as u64;
        assert_eq!(
            cuPointerGetAttribute(
                &mut kind as *mut u32 as *mut _,
                CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                host
            ),
            CUDA_ERROR_INVALID_VALUE
        );
        ck(cuMemFree_v2(p));
        assert_eq!(
            cuMemGetAddressRange_v2(&mut base, &mut size, p),
            CUDA_ERROR_NOT_FOUND
        );

        // Error strings.
        let mut text: *const c_char = std::ptr::null();
        ck(cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &mut text));
        assert_eq!(
            CStr::from_ptr(text).to_str().unwrap(),
            "CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        ck(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &mut text));
        assert_eq!(CStr::from_ptr(text).to_str().unwrap(), "out of memory");
        assert_eq!(cuGetErrorName(123_456, &mut text), CUDA_ERROR_INVALID_VALUE);

        ck(cuDevicePrimaryCtxRelease_v2(0));
        ck(cuDevicePrimaryCtxRelease_v2(0));
        assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_ERROR_INVALID_CONTEXT);
    }
}
