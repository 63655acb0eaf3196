//! Virtual memory management: data lives in the physical allocation, so remapping keeps it;
//! access rights and mappings are enforced for kernels and copies; the driver's argument
//! rules are checked.

mod common;

use std::ffi::c_void;

use common::*;
use cuda::api::copy::*;
use cuda::api::vmm::*;
use tensile_driver_abi::*;
use tensile_kernels::twins::pattern_value;
use tensile_kernels::ParamBuilder;

const WORDS: usize = GRAN / 4;

fn fill(p: CUdeviceptr, n: usize, seed: u32) -> CUresult {
    let params = ParamBuilder::new().ptr(p).u64(n as u64).u32(seed).build();
    launch_packed(function("fill_pattern"), std::ptr::null_mut(), &params)
}

fn copy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    let params = ParamBuilder::new().ptr(dst).ptr(src).u64(n as u64).build();
    launch_packed(function("copy_u32"), std::ptr::null_mut(), &params)
}

fn pattern(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u64).map(|i| pattern_value(seed, i)).collect()
}

#[test]
fn remapping_a_host_copy_at_the_same_address_keeps_the_data() {
    fresh_context();
    let va = reserve(2 * GRAN);
    let dev = create(GRAN, device_loc());
    ck(map(va, GRAN, dev));
    ck(set_access(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    ck(fill(va, WORDS, 21));
    ck(ctx_sync());

    // Swap out: copy the page into a host-NUMA allocation mapped elsewhere.
    let host = create(GRAN, host_loc());
    let staging = reserve(GRAN);
    ck(map(staging, GRAN, host));
    ck(set_access(
        staging,
        GRAN,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    ));
    // SAFETY: both ranges are mapped device memory.
    ck(unsafe { cuMemcpyDtoD_v2(staging, va, GRAN) });
    // A device-to-device copy returns before it runs: wait before remapping its source.
    ck(ctx_sync());

    // Map the host allocation at the tensor's address: a kernel reading it sees every value.
    ck(unmap(va, GRAN));
    ck(map(va, GRAN, host));
    ck(set_access(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    let out = alloc(GRAN);
    ck(copy(out, va, WORDS));
    same(
        &download_u32(out, WORDS),
        &pattern(21, WORDS),
        "read through the host mapping",
    );

    // Swap back in: the device allocation still holds its bytes.
    ck(unmap(va, GRAN));
    ck(map(va, GRAN, dev));
    ck(set_access(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    same(
        &download_u32(va, WORDS),
        &pattern(21, WORDS),
        "device page after remap",
    );

    // Writes through one mapping of a handle are seen through another.
    ck(fill(staging, 16, 22));
    let second = va + GRAN as u64;
    ck(map(second, GRAN, host));
    ck(set_access(second, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    same(
        &download_u32(second, 16),
        &pattern(22, 16),
        "second mapping of the host page",
    );
    // Unmapping both ranges (device first, then host) and releasing both handles is clean.
    ck(unmap(va, 2 * GRAN));
    ck(unmap(staging, GRAN));
    // SAFETY: plain driver calls.
    unsafe {
        ck(cuMemRelease(dev));
        ck(cuMemRelease(host));
        ck(cuMemAddressFree(va, 2 * GRAN));
        ck(cuMemAddressFree(staging, GRAN));
    }
}

#[test]
fn mapped_but_inaccessible_memory_faults_and_the_fault_is_sticky() {
    fresh_context();
    let va = reserve(GRAN);
    let h = create(GRAN, device_loc());
    ck(map(va, GRAN, h));
    let ok = alloc(4096);
    ck(fill(va, 16, 1)); // no cuMemSetAccess yet
    assert_eq!(ctx_sync(), CUDA_ERROR_ILLEGAL_ADDRESS);
    // Sticky: everything after fails the same way, even valid work.
    let mut p = 0;
    // SAFETY: valid out-pointer.
    let rc = unsafe { cuda::api::memory::cuMemAlloc_v2(&mut p, 4096) };
    assert_eq!(rc, CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(fill(ok, 16, 1), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(sync(std::ptr::null_mut()), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(try_download_u32(ok, 4), Err(CUDA_ERROR_ILLEGAL_ADDRESS));
}

#[test]
fn unmapped_memory_faults_in_kernels_and_copies() {
    fresh_context();
    let va = reserve(GRAN);
    let h = create(GRAN, device_loc());
    ck(map(va, GRAN, h));
    ck(set_access(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    ck(fill(va, 16, 1));
    ck(unmap(va, GRAN));
    // A synchronous copy from the unmapped range is an illegal address...
    assert_eq!(try_download_u32(va, 4), Err(CUDA_ERROR_ILLEGAL_ADDRESS));
    fresh_context();
    // ...and so is a kernel, in a new context.
    ck(fill(va, 16, 1));
    assert_eq!(ctx_sync(), CUDA_ERROR_ILLEGAL_ADDRESS);
}

#[test]
fn read_only_mappings_allow_reads_and_fault_writes() {
    fresh_context();
    let va = reserve(GRAN);
    let h = create(GRAN, device_loc());
    ck(map(va, GRAN, h));
    ck(set_access(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    ck(fill(va, WORDS, 3));
    // Access changes are host operations, not stream-ordered: wait for the writer first.
    ck(ctx_sync());
    ck(set_access(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READ));
    let mut flags = 0u64;
    // SAFETY: valid pointers.
    ck(unsafe { cuMemGetAccess(&mut flags, &device_loc(), va + 100) });
    assert_eq!(flags, u64::from(CU_MEM_ACCESS_FLAGS_PROT_READ));
    let out = alloc(GRAN);
    ck(copy(out, va, WORDS));
    same(
        &download_u32(out, WORDS),
        &pattern(3, WORDS),
        "read-only source",
    );
    ck(copy(va, out, 4));
    assert_eq!(ctx_sync(), CUDA_ERROR_ILLEGAL_ADDRESS);
}

#[test]
fn access_can_be_set_on_part_of_a_mapping() {
    fresh_context();
    let va = reserve(2 * GRAN);
    let h = create(2 * GRAN, device_loc());
    ck(map(va, 2 * GRAN, h));
    ck(set_access(
        va + GRAN as u64,
        GRAN,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    ));
    ck(fill(va + GRAN as u64, 8, 4));
    same(
        &download_u32(va + GRAN as u64, 8),
        &pattern(4, 8),
        "second half",
    );
    assert_eq!(try_download_u32(va, 8), Err(CUDA_ERROR_ILLEGAL_ADDRESS));
}

#[test]
fn driver_argument_rules_are_enforced() {
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        ck(cuda::api::device::cuInit(0));
        let prop = CUmemAllocationProp::pinned(device_loc());
        let mut g = 0usize;
        ck(cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        ));
        assert_eq!(g, GRAN);
        let mut va = 0;
        assert_eq!(
            cuMemAddressReserve(&mut va, GRAN + 1, 0, 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemAddressReserve(std::ptr::null_mut(), GRAN, 0, 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut h = 0;
        assert_eq!(
            cuMemCreate(&mut h, 4096, &prop, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        let bad = CUmemAllocationProp::pinned(CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 3,
        });
        assert_eq!(
            cuMemCreate(&mut h, GRAN, &bad, 0),
            CUDA_ERROR_INVALID_DEVICE
        );

        let va = reserve(4 * GRAN);
        let h = create(2 * GRAN, device_loc());
        let mut props = CUmemAllocationProp::pinned(host_loc());
        ck(cuMemGetAllocationPropertiesFromHandle(&mut props, h));
        assert_eq!(props.location, device_loc());
        assert_eq!(
            map(va + 4096, GRAN, h),
            CUDA_ERROR_INVALID_VALUE,
            "unaligned address"
        );
        assert_eq!(
            cuMemMap(va, GRAN, 2 * GRAN, h, 0),
            CUDA_ERROR_INVALID_VALUE,
            "offset past the end"
        );
        assert_eq!(
            map(va + 3 * GRAN as u64, 2 * GRAN, h),
            CUDA_ERROR_INVALID_VALUE,
            "outside the reservation"
        );
        assert_eq!(
            map(0x1000_0000, GRAN, h),
            CUDA_ERROR_INVALID_VALUE,
            "not reserved"
        );
        // The H200's driver maps only whole allocations (docs/gpu-results.md).
        assert_eq!(
            map(va, GRAN, h),
            CUDA_ERROR_NOT_SUPPORTED,
            "part of an allocation"
        );
        assert_eq!(
            cuMemMap(va, GRAN, GRAN, h, 0),
            CUDA_ERROR_NOT_SUPPORTED,
            "from an offset"
        );
        ck(map(va, 2 * GRAN, h));
        assert_eq!(
            map(va + GRAN as u64, GRAN, h),
            CUDA_ERROR_INVALID_VALUE,
            "already mapped"
        );
        assert_eq!(
            unmap(va, GRAN),
            CUDA_ERROR_INVALID_VALUE,
            "part of a mapping"
        );
        assert_eq!(
            set_access(va, 3 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
            CUDA_ERROR_INVALID_VALUE,
            "not fully mapped"
        );
        assert_eq!(
            set_access(va, GRAN, 2),
            CUDA_ERROR_INVALID_VALUE,
            "bad flags"
        );
        assert_eq!(
            cuMemAddressFree(va, 4 * GRAN),
            CUDA_ERROR_INVALID_VALUE,
            "still mapped"
        );
        let mut retained = 0;
        ck(cuMemRetainAllocationHandle(
            &mut retained,
            (va + 12345) as *mut c_void,
        ));
        assert_eq!(retained, h);
        ck(cuMemRelease(retained));
        ck(cuMemRelease(h));
        assert_eq!(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE, "released twice");
        // Released but still mapped: the mapping keeps working.
        ck(set_access(va, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
        ck(unmap(va, 2 * GRAN));
        assert_eq!(map(va, GRAN, h), CUDA_ERROR_INVALID_VALUE, "handle is gone");
        assert_eq!(
            cuMemAddressFree(va, GRAN),
            CUDA_ERROR_INVALID_VALUE,
            "not the whole reservation"
        );
        ck(cuMemAddressFree(va, 4 * GRAN));
    }
}

#[test]
fn one_access_may_span_mappings_of_different_handles() {
    fresh_context();
    let va = reserve(2 * GRAN);
    let (h1, h2) = (create(GRAN, device_loc()), create(GRAN, host_loc()));
    ck(map(va, GRAN, h1));
    ck(map(va + GRAN as u64, GRAN, h2));
    ck(set_access(va, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    ck(fill(va, 2 * WORDS, 30));
    same(
        &download_u32(va, 2 * WORDS),
        &pattern(30, 2 * WORDS),
        "across two mappings",
    );
    // A gap in the middle faults the whole access.
    ck(ctx_sync());
    ck(unmap(va + GRAN as u64, GRAN));
    assert_eq!(
        try_download_u32(va, 2 * WORDS),
        Err(CUDA_ERROR_ILLEGAL_ADDRESS)
    );
}

/// Bytes of `n` that differ from one offset to the next (not a multiple of any page).
fn bytes(seed: u32, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (pattern_value(seed, i as u64 / 4) >> ((i % 4) * 8)) as u8)
        .collect()
}

/// Copies into and between VMM mappings are made through the files behind them, piece by
/// piece: at unaligned offsets, across mappings of different handles and sides, across a
/// mapping split by `cuMemSetAccess` (whose second part starts inside its allocation), every
/// byte lands where it would through the addresses.
#[test]
fn copies_between_mappings_keep_every_byte_at_any_offset() {
    fresh_context();
    let g = GRAN as u64;
    let src = reserve(3 * GRAN);
    let (d1, h2) = (create(GRAN, device_loc()), create(2 * GRAN, host_loc()));
    ck(map(src, GRAN, d1));
    ck(map(src + g, 2 * GRAN, h2));
    ck(set_access(
        src,
        3 * GRAN,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    ));
    // Splits the host mapping's region twice, the access unchanged.
    ck(set_access(
        src + g + g / 2 + 4096,
        64 << 10,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    ));
    let data = bytes(41, 3 * GRAN);
    // SAFETY: `data` holds 3 * GRAN bytes; the range is mapped and writable.
    ck(unsafe { cuMemcpyHtoD_v2(src, data.as_ptr() as *const c_void, 3 * GRAN) });

    let dst = reserve(3 * GRAN);
    let d3 = create(3 * GRAN, device_loc());
    ck(map(dst, 3 * GRAN, d3));
    ck(set_access(
        dst,
        3 * GRAN,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    ));
    let (from, to, len) = (12_345u64, 777u64, 2 * GRAN + 54_321);
    // SAFETY: both ranges are mapped device memory, apart.
    ck(unsafe { cuMemcpyDtoD_v2(dst + to, src + from, len) });
    ck(ctx_sync());

    let mut out = vec![0u8; len];
    // SAFETY: `out` holds `len` bytes.
    ck(unsafe { cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, dst + to, len) });
    let want = &data[from as usize..from as usize + len];
    let first_bad = out.iter().zip(want).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "the copy differs at this byte");
    // The bytes around the copy are untouched (zero, as created).
    let mut edge = vec![1u8; to as usize];
    // SAFETY: `edge` holds `to` bytes.
    ck(unsafe { cuMemcpyDtoH_v2(edge.as_mut_ptr() as *mut c_void, dst, to as usize) });
    assert!(
        edge.iter().all(|&b| b == 0),
        "bytes before the copy changed"
    );
    // Read back through a kernel too: the mapping sees what was written to its file.
    let words = WORDS;
    let out32 = alloc(GRAN);
    ck(copy(out32, src + g, words));
    let through_kernel = download_u32(out32, words);
    let want32: Vec<u32> = data[GRAN..2 * GRAN]
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    same(&through_kernel, &want32, "host mapping read by a kernel");
}

/// `cuMemCreate` of device memory exportable as a POSIX file descriptor.
fn create_shareable(size: usize) -> CUmemGenericAllocationHandle {
    let mut h = 0;
    let mut prop = CUmemAllocationProp::pinned(device_loc());
    prop.requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // SAFETY: valid out-pointer and properties.
    ck(unsafe { cuMemCreate(&mut h, size, &prop, 0) });
    h
}

#[test]
fn an_allocation_exported_as_a_file_descriptor_and_imported_is_the_same_memory() {
    fresh_context();
    let h = create_shareable(GRAN);
    let mut props = CUmemAllocationProp::pinned(host_loc());
    // SAFETY: valid out-pointer.
    ck(unsafe { cuMemGetAllocationPropertiesFromHandle(&mut props, h) });
    assert_eq!(
        props.requested_handle_types,
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    );
    let mut fd: i32 = -1;
    // SAFETY: for a POSIX descriptor the driver writes an int through the pointer.
    ck(unsafe {
        cuMemExportToShareableHandle(
            (&mut fd as *mut i32).cast(),
            h,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    });
    assert!(fd >= 0);
    let mut imported = 0;
    // SAFETY: valid out-pointer; the descriptor's value is the handle.
    ck(unsafe {
        cuMemImportFromShareableHandle(
            &mut imported,
            fd as usize as *mut c_void,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    });
    // The import holds the memory on a descriptor of its own: the exported one may go.
    // SAFETY: the descriptor the export returned, closed once.
    assert_eq!(unsafe { libc::close(fd) }, 0);
    let (a, b) = (reserve(GRAN), reserve(GRAN));
    ck(map(a, GRAN, h));
    ck(map(b, GRAN, imported));
    ck(set_access(a, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    ck(set_access(b, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    ck(fill(a, WORDS, 31));
    ck(ctx_sync());
    same(
        &download_u32(b, WORDS),
        &pattern(31, WORDS),
        "read through the import",
    );
    // Released and unmapped on the exporting side, the memory lives on in the import.
    ck(unmap(a, GRAN));
    // SAFETY: plain driver call.
    ck(unsafe { cuMemRelease(h) });
    ck(fill(b, 16, 32));
    ck(ctx_sync());
    same(
        &download_u32(b, 16),
        &pattern(32, 16),
        "after the export went",
    );
    ck(unmap(b, GRAN));
    // SAFETY: plain driver call.
    ck(unsafe { cuMemRelease(imported) });
}

#[test]
fn only_allocations_created_shareable_are_exported() {
    fresh_context();
    let h = create(GRAN, device_loc());
    let mut fd: i32 = -1;
    // SAFETY: as above.
    let r = unsafe {
        cuMemExportToShareableHandle(
            (&mut fd as *mut i32).cast(),
            h,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    };
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    let mut imported = 0;
    // SAFETY: a value that is no descriptor; the driver checks it.
    let r = unsafe {
        cuMemImportFromShareableHandle(
            &mut imported,
            usize::MAX as *mut c_void,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    };
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    // SAFETY: plain driver call.
    ck(unsafe { cuMemRelease(h) });
}
