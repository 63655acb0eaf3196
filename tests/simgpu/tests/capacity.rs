//! Device capacity from TENSILE_SIM_DEVICE_MEMORY: what counts against it, when it is given
//! back, and CUDA_ERROR_OUT_OF_MEMORY beyond it. One test, because the capacity is read once
//! per process at cuInit.

mod common;

use std::ffi::c_void;

use common::*;
use cuda::api::device::*;
use cuda::api::memory::*;
use cuda::api::pool::*;
use cuda::api::vmm::*;
use tensile_driver_abi::*;

const MIB: usize = 1 << 20;

#[test]
fn capacity_is_enforced_and_reported() {
    std::env::set_var("TENSILE_SIM_DEVICE_MEMORY", "64MiB");
    fresh_context();
    // SAFETY: plain driver calls with valid pointers throughout.
    unsafe {
        let mut total = 0;
        ck(cuDeviceTotalMem_v2(&mut total, 0));
        assert_eq!(total, 64 * MIB);
        assert_eq!(mem_info(), (64 * MIB, 64 * MIB));

        let big = alloc(48 * MIB);
        assert_eq!(mem_info().0, 16 * MIB);
        let mut p = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, 32 * MIB), CUDA_ERROR_OUT_OF_MEMORY);

        // Host memory does not count.
        let mut host = std::ptr::null_mut();
        ck(cuMemHostAlloc(&mut host, 32 * MIB, 0));
        let host_numa = create(32 * MIB, host_loc());
        assert_eq!(mem_info().0, 16 * MIB);

        // Device-located physical memory does, until released AND unmapped.
        let dev = create(16 * MIB, device_loc());
        assert_eq!(mem_info().0, 0);
        let prop = CUmemAllocationProp::pinned(device_loc());
        let mut h = 0;
        assert_eq!(
            cuMemCreate(&mut h, GRAN, &prop, 0),
            CUDA_ERROR_OUT_OF_MEMORY
        );
        let s = new_stream(0);
        assert_eq!(cuMemAllocAsync(&mut p, 4096, s), CUDA_ERROR_OUT_OF_MEMORY);
        let va = reserve(16 * MIB);
        ck(map(va, 16 * MIB, dev));
        ck(cuMemRelease(dev));
        assert_eq!(mem_info().0, 0, "released but still mapped");
        ck(unmap(va, 16 * MIB));
        assert_eq!(mem_info().0, 16 * MIB, "released and unmapped");

        // Stream-ordered allocations count against the pool and the device until the free
        // executes.
        let mut pool = std::ptr::null_mut();
        ck(cuDeviceGetMemPool(&mut pool, 0));
        let used = |pool: CUmemoryPool| {
            let mut v = 0u64;
            ck(cuMemPoolGetAttribute(
                pool,
                cuda::pool::ATTR_USED_MEM_CURRENT,
                &mut v as *mut u64 as *mut c_void,
            ));
            v
        };
        let base = used(pool);
        ck(cuMemAllocAsync(&mut p, 8 * MIB, s));
        assert_eq!(used(pool), base + 8 * MIB as u64);
        assert_eq!(mem_info().0, 8 * MIB);
        ck(cuMemFreeAsync(p, s));
        ck(sync(s));
        assert_eq!(used(pool), base);
        assert_eq!(mem_info().0, 16 * MIB);
        let mut high = 0u64;
        ck(cuMemPoolGetAttribute(
            pool,
            cuda::pool::ATTR_USED_MEM_HIGH,
            &mut high as *mut u64 as *mut c_void,
        ));
        assert!(high >= 8 * MIB as u64);
        let mut threshold = u64::MAX;
        ck(cuMemPoolSetAttribute(
            pool,
            cuda::pool::ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut c_void,
        ));
        let mut back = 0u64;
        ck(cuMemPoolGetAttribute(
            pool,
            cuda::pool::ATTR_RELEASE_THRESHOLD,
            &mut back as *mut u64 as *mut c_void,
        ));
        assert_eq!(back, u64::MAX);
        assert_eq!(
            cuMemPoolSetAttribute(
                pool,
                cuda::pool::ATTR_USED_MEM_CURRENT,
                &mut back as *mut u64 as *mut c_void
            ),
            CUDA_ERROR_INVALID_VALUE
        );

        ck(cuMemFree_v2(big));
        assert_eq!(mem_info().0, 64 * MIB);
        assert_eq!(cuMemFree_v2(big), CUDA_ERROR_INVALID_VALUE, "double free");
        ck(cuMemFreeHost(host));
        ck(cuMemRelease(host_numa));
    }
}
