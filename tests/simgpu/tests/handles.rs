//! Stale or made-up handles are refused with the driver's error codes, never dereferenced.

mod common;

use std::ffi::c_void;

use common::*;
use cuda::api::context::*;
use cuda::api::event::*;
use cuda::api::launch::*;
use cuda::api::memory::*;
use cuda::api::module::*;
use cuda::api::pool::*;
use cuda::api::stream::*;
use tensile_driver_abi::*;

#[test]
fn made_up_handles_are_refused() {
    fresh_context();
    let bogus = 0xdead_beef_usize as *mut c_void;
    let (mut off, mut size) = (0usize, 0usize);
    let mut v = 0u64;
    // SAFETY: every pointer argument is valid; only the handles are made up.
    unsafe {
        assert_eq!(cuStreamSynchronize(bogus), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamQuery(bogus), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamDestroy_v2(bogus), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(
            cuStreamWaitEvent(std::ptr::null_mut(), bogus, 0),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            cuEventRecord(bogus, std::ptr::null_mut()),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(cuEventSynchronize(bogus), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuEventDestroy_v2(bogus), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuModuleUnload(bogus), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(
            cuFuncGetParamInfo(bogus, 0, &mut off, &mut size),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            cuKernelGetParamInfo(bogus, 0, &mut off, &mut size),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(cuLibraryUnload(bogus), CUDA_ERROR_INVALID_HANDLE);
        let mut params = [std::ptr::null_mut::<c_void>(); 1];
        assert_eq!(
            cuLaunchKernel(
                bogus,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut()
            ),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(cuCtxSetCurrent(bogus), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuCtxDestroy_v2(bogus), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuCtxPushCurrent_v2(bogus), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(
            cuMemPoolGetAttribute(
                bogus,
                cuda::pool::ATTR_USED_MEM_CURRENT,
                &mut v as *mut u64 as *mut c_void
            ),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut p = 0;
        assert_eq!(
            cuMemAllocFromPoolAsync(&mut p, 64, bogus, std::ptr::null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuMemFree_v2(0x1234_5000), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            cuMemFreeAsync(0x1234_5000, std::ptr::null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuMemFreeHost(bogus), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            cuda::api::vmm::cuMemRelease(0xdead),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuda::api::vmm::cuMemUnmap(0x4000_0000, GRAN),
            CUDA_ERROR_INVALID_VALUE
        );
    }
    // Nothing above broke the context.
    ck(ctx_sync());
}
