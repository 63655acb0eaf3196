//! cuGetProcAddress answers every look-up a real runtime makes without crashing, resolves
//! versioned and per-thread names to this library's exports, and refuses unknown names.

use std::ffi::{c_void, CString};

use cuda::api::proc::{cuGetExportTable, cuGetProcAddress, cuGetProcAddress_v2};
use cuda::implemented_symbols;
use tensile_driver_abi::*;

const LOOKUPS: &str = include_str!("../../../driver-abi/tests/data/cudart-13.5-driver-lookups.txt");

fn ask(name: &str, version: i32, flags: u64) -> (CUresult, usize, i32) {
    let c = CString::new(name).unwrap();
    let mut pfn: *mut c_void = std::ptr::dangling_mut::<c_void>();
    let mut status = -1;
    // SAFETY: valid string and out-pointers.
    let rc = unsafe { cuGetProcAddress_v2(c.as_ptr(), &mut pfn, version, flags, &mut status) };
    (rc, pfn as usize, status)
}

#[test]
fn every_runtime_lookup_gets_an_answer() {
    let mut found = 0;
    let mut asked = 0;
    for line in LOOKUPS
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let mut f = line.split_whitespace();
        let name = f.next().unwrap();
        let version: i32 = f.next().unwrap().parse().unwrap();
        let flags: u64 = f.next().unwrap().parse().unwrap();
        let (rc, pfn, status) = ask(name, version, flags);
        asked += 1;
        match resolve_proc(name, version, flags) {
            ProcLookup::Found(e) => match implemented_symbols().get(e.symbol) {
                Some(&addr) => {
                    assert_eq!(
                        (rc, status, pfn),
                        (CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS, addr),
                        "{line}"
                    );
                    found += 1;
                }
                None => assert_eq!(
                    (rc, status, pfn),
                    (
                        CUDA_ERROR_NOT_FOUND,
                        CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
                        0
                    ),
                    "{line}"
                ),
            },
            ProcLookup::VersionNotSufficient => assert_eq!(
                (rc, status, pfn),
                (
                    CUDA_ERROR_NOT_FOUND,
                    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
                    0
                ),
                "{line}"
            ),
            ProcLookup::NotFound => panic!("driver-abi does not know {line}"),
        }
    }
    assert!(asked > 400);
    assert!(found > 100, "only {found} of {asked} implemented");
}

#[test]
fn versioned_and_per_thread_names_resolve_to_the_right_export() {
    let cases = [
        ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
        ("cuMemcpyHtoD", 13000, 2, "cuMemcpyHtoD_v2_ptds"),
        ("cuMemcpyAsync", 13000, 2, "cuMemcpyAsync_ptsz"),
        ("cuMemcpyAsync", 13000, 0, "cuMemcpyAsync"),
        ("cuLaunchKernel", 13000, 2, "cuLaunchKernel_ptsz"),
        ("cuStreamSynchronize", 13000, 1, "cuStreamSynchronize"),
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
        ("cuCtxCreate", 13000, 0, "cuCtxCreate_v4"),
        ("cuMemFree", 13000, 2, "cuMemFree_v2"),
        ("cuEventRecord", 13000, 2, "cuEventRecord_ptsz"),
    ];
    for (name, version, flags, symbol) in cases {
        let (rc, pfn, status) = ask(name, version, flags);
        assert_eq!(
            (rc, status),
            (CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS),
            "{name}"
        );
        assert_eq!(pfn, implemented_symbols()[symbol], "{name} -> {symbol}");
    }
    // The pointer handed out is callable.
    let (_, pfn, _) = ask("cuDriverGetVersion", 13000, 0);
    // SAFETY: the table maps this name to `cuDriverGetVersion`, which has this signature.
    let f: unsafe extern "C" fn(*mut i32) -> CUresult = unsafe { std::mem::transmute(pfn) };
    let mut v = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(&mut v) }, CUDA_SUCCESS);
    assert_eq!(v, 13000);
}

#[test]
fn unknown_unimplemented_and_invalid_questions() {
    assert_eq!(
        ask("cuNoSuchFunction", 13000, 0),
        (
            CUDA_ERROR_NOT_FOUND,
            0,
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        )
    );
    assert_eq!(
        ask("", 13000, 0),
        (
            CUDA_ERROR_NOT_FOUND,
            0,
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        )
    );
    // Known to the driver, not simulated.
    assert_eq!(
        ask("cuGraphCreate", 13000, 0),
        (
            CUDA_ERROR_NOT_FOUND,
            0,
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        )
    );
    assert_eq!(
        ask("cuMemAllocAsync", 11000, 0),
        (
            CUDA_ERROR_NOT_FOUND,
            0,
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        )
    );
    assert_eq!(ask("cuMemAlloc", 13000, 4).0, CUDA_ERROR_INVALID_VALUE);
    let name = CString::new("cuInit").unwrap();
    let mut pfn = std::ptr::null_mut();
    // SAFETY: NULL arguments must be refused, the rest are valid.
    unsafe {
        assert_eq!(
            cuGetProcAddress_v2(std::ptr::null(), &mut pfn, 13000, 0, std::ptr::null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuGetProcAddress_v2(
                name.as_ptr(),
                std::ptr::null_mut(),
                13000,
                0,
                std::ptr::null_mut()
            ),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuGetProcAddress_v2(name.as_ptr(), &mut pfn, 13000, 0, std::ptr::null_mut()),
            CUDA_SUCCESS
        );
        assert_eq!(pfn as usize, implemented_symbols()["cuInit"]);
        pfn = std::ptr::null_mut();
        assert_eq!(
            cuGetProcAddress(name.as_ptr(), &mut pfn, 13000, 0),
            CUDA_SUCCESS
        );
        assert_eq!(pfn as usize, implemented_symbols()["cuInit"]);
        let mut table = std::ptr::dangling::<c_void>();
        assert_eq!(
            cuGetExportTable(&mut table, std::ptr::null()),
            CUDA_ERROR_NOT_FOUND
        );
        assert!(table.is_null());
    }
}

#[test]
fn every_implemented_symbol_is_a_driver_symbol() {
    let known: std::collections::HashSet<&str> = proc_table().iter().map(|e| e.symbol).collect();
    for name in implemented_symbols().keys() {
        assert!(known.contains(name), "{name} is not a CUDA driver symbol");
    }
}
