//! The built cdylib exports every symbol of the simulator's table, and its
//! cuGetProcAddress_v2 hands out exactly those exported addresses.

use std::ffi::{c_char, c_int, c_void, CString};

use tensile_driver_abi::*;

type GetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut i32) -> CUresult;

#[test]
fn every_table_symbol_is_exported_and_lookups_return_the_exports() {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libcuda.so");
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: loading a library built by this package; RTLD_LOCAL keeps its symbols private.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {}", lib.display());
    let sym = |name: &str| {
        let c = CString::new(name).unwrap();
        // SAFETY: `h` is a live handle and `c` a valid name.
        unsafe { libc::dlsym(h, c.as_ptr()) as usize }
    };
    let names: Vec<&str> = cuda::implemented_symbols().keys().copied().collect();
    for name in &names {
        assert_ne!(sym(name), 0, "{name} is not exported by the cdylib");
    }
    assert_eq!(sym("cuNoSuchFunction"), 0);

    let gpa = sym("cuGetProcAddress_v2");
    // SAFETY: the symbol has this C signature.
    let gpa: GetProcAddress = unsafe { std::mem::transmute(gpa) };
    for (base, flags, symbol) in [
        ("cuMemAlloc", 0, "cuMemAlloc_v2"),
        ("cuLaunchKernel", 2, "cuLaunchKernel_ptsz"),
        ("cuMemcpyDtoH", 2, "cuMemcpyDtoH_v2_ptds"),
        ("cuGetProcAddress", 0, "cuGetProcAddress_v2"),
    ] {
        let c = CString::new(base).unwrap();
        let (mut pfn, mut status) = (std::ptr::null_mut(), -1);
        // SAFETY: valid arguments.
        let rc = unsafe { gpa(c.as_ptr(), &mut pfn, 13000, flags, &mut status) };
        assert_eq!(
            (rc, status),
            (CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS),
            "{base}"
        );
        assert_eq!(pfn as usize, sym(symbol), "{base} -> {symbol}");
    }
    // The reverse direction (no export outside the table) is checked over the sources by
    // the unit test in `api::proc`.
}
