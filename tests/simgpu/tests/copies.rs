//! Copies and memsets: every direction, sync and async, 2D with pitched allocations, and
//! their argument and address checks.

mod common;

use std::ffi::c_void;

use common::*;
use cuda::api::copy::*;
use cuda::api::launch::cuLaunchKernelEx;
use cuda::api::memory::*;
use tensile_driver_abi::*;
use tensile_kernels::twins::pattern_value;

#[test]
fn memsets_fill_with_8_16_and_32_bit_patterns() {
    fresh_context();
    let p = alloc(64);
    let s = new_stream(0);
    // SAFETY: in-bounds device ranges.
    unsafe {
        ck(cuMemsetD32_v2(p, 0xdead_beef, 16));
        ck(cuMemsetD16Async(p + 8, 0x1234, 2, s));
        ck(cuMemsetD8Async(p + 12, 0xab, 1, s));
        ck(sync(s));
        ck(cuMemsetD8_v2_ptds(p + 60, 0x01, 4));
        assert_eq!(
            cuMemsetD32_v2(p + 2, 0, 1),
            CUDA_ERROR_INVALID_VALUE,
            "unaligned D32"
        );
        assert_eq!(
            cuMemsetD16_v2(p + 1, 0, 1),
            CUDA_ERROR_INVALID_VALUE,
            "unaligned D16"
        );
    }
    let got = download_u32(p, 16);
    assert_eq!(got[0..2], [0xdead_beef, 0xdead_beef]);
    assert_eq!(got[2], 0x1234_1234);
    assert_eq!(got[3], 0xdead_beab);
    assert_eq!(got[15], 0x0101_0101);
}

#[test]
fn copies_in_every_direction() {
    fresh_context();
    let n = 1000usize;
    let src: Vec<u32> = (0..n as u64).map(|i| pattern_value(40, i)).collect();
    let (a, b) = (alloc(n * 4), alloc(n * 4));
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let mut back = vec![0u32; n];
    // SAFETY: host buffers hold n * 4 bytes, device ranges are allocated.
    unsafe {
        // Unified cuMemcpy: host -> device -> device -> host.
        ck(cuMemcpy(a, src.as_ptr() as u64, n * 4));
        ck(cuMemcpyAsync(b, a, n * 4, s));
        ck(sync(s));
        ck(cuMemcpy_ptds(back.as_mut_ptr() as u64, b, n * 4));
        same(&back, &src, "unified copies");
        ck(cuMemcpyDtoDAsync_v2_ptsz(a, b, 0, std::ptr::null_mut()));
        ck(cuMemcpyHtoD_v2(a, std::ptr::null(), 0));
        assert_eq!(
            cuMemcpyHtoD_v2(a, std::ptr::null(), 4),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemcpyDtoHAsync_v2(std::ptr::null_mut(), a, 4, s),
            CUDA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn pitched_allocations_and_2d_copies() {
    fresh_context();
    let (w, h) = (100usize, 7usize);
    let (mut p, mut pitch) = (0, 0);
    // SAFETY: valid out-pointers.
    unsafe {
        ck(cuMemAllocPitch_v2(&mut p, &mut pitch, w, h, 4));
        assert_eq!(
            cuMemAllocPitch_v2(&mut p, &mut pitch, w, h, 3),
            CUDA_ERROR_INVALID_VALUE
        );
    }
    assert_eq!(pitch, 512);
    let host: Vec<u8> = (0..w * h).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; w * h];
    let mut c = CUDA_MEMCPY2D {
        src_x_in_bytes: 0,
        src_y: 0,
        src_memory_type: CU_MEMORYTYPE_HOST,
        src_host: host.as_ptr() as *const c_void,
        src_device: 0,
        src_array: std::ptr::null_mut(),
        src_pitch: w,
        dst_x_in_bytes: 0,
        dst_y: 0,
        dst_memory_type: CU_MEMORYTYPE_DEVICE,
        dst_host: std::ptr::null_mut(),
        dst_device: p,
        dst_array: std::ptr::null_mut(),
        dst_pitch: pitch,
        width_in_bytes: w,
        height: h,
    };
    // SAFETY: the descriptors point at live buffers of the stated shapes.
    unsafe {
        ck(cuMemcpy2D_v2(&c));
        c.src_memory_type = CU_MEMORYTYPE_DEVICE;
        c.src_device = p;
        c.src_pitch = pitch;
        c.dst_memory_type = CU_MEMORYTYPE_HOST;
        c.dst_host = back.as_mut_ptr() as *mut c_void;
        c.dst_pitch = w;
        ck(cuMemcpy2DAsync_v2(&c, std::ptr::null_mut()));
        ck(ctx_sync());
        c.width_in_bytes = pitch + 1;
        assert_eq!(
            cuMemcpy2D_v2(&c),
            CUDA_ERROR_INVALID_VALUE,
            "wider than the pitch"
        );
    }
    assert_eq!(back, host);
    // Row 1 starts at the pitch, not right after row 0.
    let row1 = download_u32(p + pitch as u64, 1)[0].to_ne_bytes();
    assert_eq!(row1, [host[w], host[w + 1], host[w + 2], host[w + 3]]);
}

#[test]
fn a_copy_past_the_end_of_an_allocation_faults() {
    fresh_context();
    let p = alloc(4096);
    // The guard page after the allocation is not device memory.
    assert_eq!(
        try_download_u32(p + 4092, 2),
        Err(CUDA_ERROR_ILLEGAL_ADDRESS)
    );
}

#[test]
fn launch_kernel_ex_with_kernel_params() {
    fresh_context();
    let x = alloc(4096);
    let f = function("fill_pattern");
    let (mut p, mut n, mut seed) = (x, 1024u64, 41u32);
    let mut args = [
        &mut p as *mut u64 as *mut c_void,
        &mut n as *mut u64 as *mut c_void,
        &mut seed as *mut u32 as *mut c_void,
    ];
    let config = CUlaunchConfig {
        grid_dim_x: 3,
        grid_dim_y: 1,
        grid_dim_z: 1,
        block_dim_x: 256,
        block_dim_y: 1,
        block_dim_z: 1,
        shared_mem_bytes: 0,
        h_stream: std::ptr::null_mut(),
        attrs: std::ptr::null_mut(),
        num_attrs: 0,
    };
    // SAFETY: valid config and parameters.
    unsafe {
        ck(cuLaunchKernelEx(
            &config,
            f,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        ));
        assert_eq!(
            cuLaunchKernelEx(std::ptr::null(), f, args.as_mut_ptr(), std::ptr::null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
    }
    let want: Vec<u32> = (0..1024).map(|i| pattern_value(41, i)).collect();
    same(&download_u32(x, 1024), &want, "cuLaunchKernelEx");
}

#[test]
fn registered_host_memory_is_visible_to_kernels() {
    fresh_context();
    let mut host = vec![0u32; 1024];
    let p = host.as_mut_ptr() as u64;
    // SAFETY: `host` stays alive and is unregistered before it is dropped.
    unsafe {
        ck(cuMemHostRegister_v2(p as *mut c_void, 4096, 0));
        assert_eq!(
            cuMemHostRegister_v2((p + 8) as *mut c_void, 16, 0),
            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        );
        let f = function("fill_pattern");
        ck(launch_packed(
            f,
            std::ptr::null_mut(),
            &tensile_kernels::args::fill_pattern(p, 1024, 42),
        ));
        ck(ctx_sync());
        ck(cuMemHostUnregister(p as *mut c_void));
        assert_eq!(
            cuMemHostUnregister(p as *mut c_void),
            CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        );
    }
    let want: Vec<u32> = (0..1024).map(|i| pattern_value(42, i)).collect();
    same(&host, &want, "kernel output in registered memory");
}

#[test]
fn two_dimensional_memsets_and_peer_copies() {
    let ctx = fresh_context();
    let (pitch, w, h) = (64usize, 10usize, 3usize);
    let p = alloc(pitch * h);
    let q = alloc(pitch * h);
    // SAFETY: in-bounds device ranges; valid context handles.
    unsafe {
        ck(cuMemsetD8_v2(p, 0, pitch * h));
        ck(cuMemsetD2D32_v2(p, pitch, 0x0102_0304, w / 2, h));
        ck(cuMemsetD2D16Async(
            p + 40,
            pitch,
            0xaaaa,
            2,
            h,
            std::ptr::null_mut(),
        ));
        assert_eq!(
            cuMemsetD2D32_v2(p, pitch, 0, 17, h),
            CUDA_ERROR_INVALID_VALUE,
            "row wider than pitch"
        );
        ck(cuMemcpyPeerAsync(
            q,
            ctx,
            p,
            ctx,
            pitch * h,
            std::ptr::null_mut(),
        ));
        ck(ctx_sync());
        assert_eq!(
            cuMemcpyPeer(q, std::ptr::null_mut(), p, ctx, 4),
            CUDA_ERROR_INVALID_CONTEXT
        );
    }
    let words = download_u32(q, pitch * h / 4);
    for row in 0..h {
        let r = &words[row * pitch / 4..(row + 1) * pitch / 4];
        assert_eq!(r[..5], [0x0102_0304; 5], "row {row}");
        assert_eq!(r[5..10], [0; 5], "row {row}");
        assert_eq!(r[10], 0xaaaa_aaaa, "row {row}");
        assert_eq!(r[11..], [0; 5], "row {row}");
    }
}

#[test]
fn async_copies_to_host_numa_mappings_are_stream_ordered_and_checked() {
    fresh_context();
    let va = reserve(GRAN);
    let h = create(GRAN, host_loc());
    ck(map(va, GRAN, h));
    let x = alloc(4096);
    ck(launch_packed(
        function("fill_pattern"),
        std::ptr::null_mut(),
        &tensile_kernels::args::fill_pattern(x, 1024, 43),
    ));
    // Mapped but without access: the copy faults (it does not touch the PROT_NONE pages from
    // the host and crash).
    // SAFETY: device and mapped addresses.
    unsafe {
        ck(cuMemcpyDtoHAsync_v2(
            va as *mut c_void,
            x,
            4096,
            std::ptr::null_mut(),
        ))
    };
    assert_eq!(ctx_sync(), CUDA_ERROR_ILLEGAL_ADDRESS);
    fresh_context();
    ck(set_access(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    let y = alloc(4096);
    ck(launch_packed(
        function("fill_pattern"),
        std::ptr::null_mut(),
        &tensile_kernels::args::fill_pattern(y, 1024, 44),
    ));
    // SAFETY: as above.
    unsafe {
        ck(cuMemcpyDtoHAsync_v2(
            va as *mut c_void,
            y,
            4096,
            std::ptr::null_mut(),
        ))
    };
    ck(ctx_sync());
    let want: Vec<u32> = (0..1024).map(|i| pattern_value(44, i)).collect();
    same(&download_u32(va, 1024), &want, "host-NUMA destination");
}

#[test]
fn managed_memory_is_shared_by_host_and_kernels_and_answers_its_attributes() {
    use tensile_kernels::ParamBuilder;
    fresh_context();
    let n = 1024usize;
    let mut p: CUdeviceptr = 0;
    // SAFETY: valid out-pointers throughout; the managed range holds `n` words.
    unsafe {
        assert_eq!(
            cuMemAllocManaged(&mut p, n * 4, 0),
            CUDA_ERROR_INVALID_VALUE,
            "no attach flag"
        );
        assert_eq!(
            cuMemAllocManaged(&mut p, n * 4, 3),
            CUDA_ERROR_INVALID_VALUE
        );
        ck(cuMemAllocManaged(&mut p, n * 4, 1));
        // The host writes it directly, a kernel overwrites part of it, the host reads it back.
        let words = std::slice::from_raw_parts_mut(p as *mut u32, n);
        words.fill(0xfeed_f00d);
    }
    let s = new_stream(CU_STREAM_NON_BLOCKING);
    let device = 0; // the only device
                    // SAFETY: the range is managed memory of this context; plain driver calls.
    unsafe {
        ck(cuMemAdvise(p, n * 4, 1, device));
        assert_eq!(cuMemAdvise(p, n * 4, 99, device), CUDA_ERROR_INVALID_VALUE);
        ck(cuMemPrefetchAsync(p, n * 4, device, s));
        let plain = alloc(64);
        assert_eq!(
            cuMemPrefetchAsync(plain, 64, device, s),
            CUDA_ERROR_INVALID_VALUE,
            "not managed"
        );
        assert_eq!(
            cuMemAdvise(p, n * 4 + 4096, 1, device),
            CUDA_ERROR_INVALID_VALUE,
            "past the end"
        );
    }
    let params = ParamBuilder::new()
        .ptr(p)
        .u64((n / 2) as u64)
        .u32(9)
        .build();
    ck(launch_packed(function("fill_pattern"), s, &params));
    ck(sync(s));
    // SAFETY: the kernel has finished; the range holds `n` words.
    let words = unsafe { std::slice::from_raw_parts(p as *const u32, n) };
    assert_eq!(words[0], pattern_value(9, 0));
    assert_eq!(words[n / 2 - 1], pattern_value(9, (n / 2 - 1) as u64));
    assert_eq!(words[n / 2], 0xfeed_f00d);
    let (mut managed, mut host_ptr) = (0u8, 0u64);
    // SAFETY: out-pointers sized for each attribute.
    unsafe {
        ck(cuPointerGetAttribute(
            (&mut managed as *mut u8).cast(),
            8, // CU_POINTER_ATTRIBUTE_IS_MANAGED
            p,
        ));
        ck(cuPointerGetAttribute(
            (&mut host_ptr as *mut u64).cast(),
            4, // CU_POINTER_ATTRIBUTE_HOST_POINTER
            p + 16,
        ));
        ck(cuMemFree_v2(p));
    }
    assert_eq!(managed, 1);
    assert_eq!(host_ptr, p + 16);
}
