//! Two simulated devices (`TENSILE_SIM_DEVICE_COUNT=2`): each has its own capacity, contexts,
//! pools and engines. One test, because the settings are read once per process, at cuInit.

mod common;

use std::ffi::c_void;

use common::*;
use cuda::api::context::*;
use cuda::api::copy::*;
use cuda::api::device::*;
use cuda::api::event::*;
use cuda::api::memory::*;
use cuda::api::pool::*;
use cuda::api::vmm::*;
use tensile_driver_abi::*;

const MIB: usize = 1 << 20;
const CAPACITY: usize = 1 << 30;
/// Pointer attribute `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
const ATTR_DEVICE_ORDINAL: i32 = 9;

fn ctx_device() -> CUdevice {
    let mut d = -1;
    // SAFETY: valid out-pointer.
    ck(unsafe { cuCtxGetDevice(&mut d) });
    d
}

fn ordinal_of(p: CUdeviceptr) -> i32 {
    let mut v = -1i32;
    // SAFETY: the attribute is 4 bytes; `v` holds them.
    ck(unsafe { cuPointerGetAttribute(&mut v as *mut i32 as *mut c_void, ATTR_DEVICE_ORDINAL, p) });
    v
}

fn set_current(ctx: CUcontext) {
    // SAFETY: a live context handle.
    ck(unsafe { cuCtxSetCurrent(ctx) });
}

/// An event recorded on `stream`.
fn record(stream: CUstream) -> CUevent {
    let mut e = std::ptr::null_mut();
    // SAFETY: valid out-pointer, live stream.
    unsafe {
        ck(cuEventCreate(&mut e, 0));
        ck(cuEventRecord(e, stream));
    }
    e
}

fn elapsed_ms(from: CUevent, to: CUevent) -> f32 {
    let mut ms = 0f32;
    // SAFETY: live events and a valid out-pointer.
    unsafe {
        ck(cuEventSynchronize(to));
        ck(cuEventElapsedTime(&mut ms, from, to));
    }
    ms
}

/// Queues an upload of `host` (pinned, `bytes`) to `dev` on `stream` between two events.
fn timed_upload(
    stream: CUstream,
    dev: CUdeviceptr,
    host: *const c_void,
    bytes: usize,
) -> (CUevent, CUevent) {
    let start = record(stream);
    // SAFETY: `host` holds `bytes` bytes of pinned memory; `dev` as many on the device.
    ck(unsafe { cuMemcpyHtoDAsync_v2(dev, host, bytes, stream) });
    (start, record(stream))
}

#[test]
fn two_devices_have_their_own_memory_and_engines() {
    std::env::set_var("TENSILE_SIM_DEVICE_COUNT", "2");
    std::env::set_var("TENSILE_SIM_DEVICE_MEMORY", "1GiB");
    std::env::set_var("TENSILE_SIM_H2D_GBPS", "1"); // 64 MiB: 67 ms
                                                    // SAFETY: plain driver calls with valid pointers throughout.
    unsafe {
        ck(cuInit(0));
        let mut count = 0;
        ck(cuDeviceGetCount(&mut count));
        assert_eq!(count, 2);
        let mut dev = -1;
        ck(cuDeviceGet(&mut dev, 1));
        assert_eq!(dev, 1);
        assert_eq!(cuDeviceGet(&mut dev, 2), CUDA_ERROR_INVALID_DEVICE);
        let (mut uuid0, mut uuid1) = ([0u8; 16], [0u8; 16]);
        ck(cuDeviceGetUuid(&mut uuid0, 0));
        ck(cuDeviceGetUuid(&mut uuid1, 1));
        assert_ne!(uuid0, uuid1, "each device has its own UUID");
        for d in 0..2 {
            let mut total = 0;
            ck(cuDeviceTotalMem_v2(&mut total, d));
            assert_eq!(total, CAPACITY, "device {d}");
        }

        // Each device's memory is its own.
        let (mut ctx0, mut ctx1) = (std::ptr::null_mut(), std::ptr::null_mut());
        ck(cuCtxCreate_v2(&mut ctx0, 0, 0));
        ck(cuCtxCreate_v2(&mut ctx1, 0, 1));
        set_current(ctx0);
        assert_eq!(ctx_device(), 0);
        let on0 = alloc(600 * MIB);
        let mut p = 0;
        assert_eq!(
            cuMemAlloc_v2(&mut p, 600 * MIB),
            CUDA_ERROR_OUT_OF_MEMORY,
            "device 0 is full"
        );
        set_current(ctx1);
        assert_eq!(ctx_device(), 1);
        assert_eq!(mem_info(), (CAPACITY, CAPACITY), "device 1 is empty");
        let on1 = alloc(600 * MIB);
        assert_eq!(mem_info().0, CAPACITY - 600 * MIB);
        assert_eq!(ordinal_of(on0), 0);
        assert_eq!(ordinal_of(on1), 1);

        // VMM memory is charged to its location's device; there is no third device.
        let loc1 = CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 1,
        };
        let h = create(GRAN, loc1);
        assert_eq!(mem_info().0, CAPACITY - 600 * MIB - GRAN);
        let prop = CUmemAllocationProp::pinned(CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 2,
        });
        let mut h2 = 0;
        assert_eq!(
            cuMemCreate(&mut h2, GRAN, &prop, 0),
            CUDA_ERROR_INVALID_DEVICE
        );
        ck(cuMemRelease(h));
        assert_eq!(mem_info().0, CAPACITY - 600 * MIB);

        // Stream-ordered allocations come from the stream's device's pool.
        let (mut pool0, mut pool1) = (std::ptr::null_mut(), std::ptr::null_mut());
        ck(cuDeviceGetDefaultMemPool(&mut pool0, 0));
        ck(cuDeviceGetDefaultMemPool(&mut pool1, 1));
        assert_ne!(pool0, pool1);
        let s1 = new_stream(CU_STREAM_NON_BLOCKING);
        let mut a = 0;
        ck(cuMemAllocAsync(&mut a, 64 * MIB, s1));
        assert_eq!(ordinal_of(a), 1);
        assert_eq!(mem_info().0, CAPACITY - 664 * MIB);
        ck(cuMemFreeAsync(a, s1));
        ck(sync(s1));
        assert_eq!(mem_info().0, CAPACITY - 600 * MIB);

        // Primary contexts are per device.
        let mut primary1 = std::ptr::null_mut();
        ck(cuDevicePrimaryCtxRetain(&mut primary1, 1));
        let mut primary0 = std::ptr::null_mut();
        ck(cuDevicePrimaryCtxRetain(&mut primary0, 0));
        assert_ne!(primary0, primary1);
        let mut d = -1;
        ck(cuCtxGetDevice_v2(&mut d, primary1));
        assert_eq!(d, 1);
        ck(cuMemFree_v2(on1));
        set_current(ctx0);
        ck(cuMemFree_v2(on0));

        // Engines: uploads to two devices at once overlap; two to one device take turns.
        const BYTES: usize = 64 * MIB;
        let one_copy_ms = BYTES as f32 / 1e9 * 1e3;
        let mut host = std::ptr::null_mut();
        ck(cuMemAllocHost_v2(&mut host, BYTES));
        let words = std::slice::from_raw_parts_mut(host as *mut u32, BYTES / 4);
        for (i, w) in words.iter_mut().enumerate() {
            *w = (i as u32).wrapping_mul(2_654_435_761);
        }
        let want = words.to_vec();
        set_current(ctx0);
        let (d0, d0b, s0, s0b) = (
            alloc(BYTES),
            alloc(BYTES),
            new_stream(CU_STREAM_NON_BLOCKING),
            new_stream(CU_STREAM_NON_BLOCKING),
        );
        set_current(ctx1);
        let d1 = alloc(BYTES);

        let (a0, a1) = timed_upload(s1, d1, host, BYTES);
        set_current(ctx0);
        let (b0, b1) = timed_upload(s0, d0, host, BYTES);
        let (across_1, across_0) = (elapsed_ms(a0, a1), elapsed_ms(b0, b1));
        let (c0, c1) = timed_upload(s0, d0, host, BYTES);
        let (e0, e1) = timed_upload(s0b, d0b, host, BYTES);
        let (same_a, same_b) = (elapsed_ms(c0, c1), elapsed_ms(e0, e1));
        println!(
            "one copy {one_copy_ms:.0} ms; on two devices at once: {across_1:.0} and \
             {across_0:.0} ms; on one device at once: {same_a:.0} and {same_b:.0} ms"
        );
        assert!(
            across_1 < one_copy_ms * 1.3 && across_0 < one_copy_ms * 1.3,
            "each device's copy engine is its own"
        );
        assert!(
            same_a.max(same_b) > one_copy_ms * 1.7,
            "two uploads to one device take turns"
        );
        for d in [d0, d0b] {
            same(&download_u32(d, BYTES / 4), &want, "device 0 upload");
        }
        set_current(ctx1);
        same(&download_u32(d1, BYTES / 4), &want, "device 1 upload");
    }
}
