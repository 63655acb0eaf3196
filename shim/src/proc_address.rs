//! `cuGetProcAddress` and `cuGetProcAddress_v2`: how libcudart, cuBLAS, cuBLASLt and cuDNN
//! get every driver entry point, and so the main road into the shim.
//!
//! The real driver is asked first, unchanged; its answer stands unless it succeeded with a
//! function the shim manages. Which function that is follows from the question (base name,
//! CUDA version, per-thread flag) through [`tensile_driver_abi::resolve_proc`], which names
//! the versioned symbol (`cuMemcpyAsync` + per-thread → `cuMemcpyAsync_ptsz`). The answer
//! is then replaced by the shim's wrapper for exactly that symbol, which forwards to the
//! real function of that symbol. Unmanaged entry points are never wrapped.

use std::ffi::{c_char, c_void, CStr};

use tensile_driver_abi::{
    resolve_proc, CUresult, ProcLookup, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_INITIALIZED,
    CUDA_SUCCESS,
};

use crate::real::fn_ptr;
use crate::runtime::{self, Runtime};
use crate::syms::{pfn, Sym};

/// The address of the exported wrapper of each managed symbol (supplied by `ld-preload`,
/// where the wrappers live). Null: hand this caller the driver's own function.
pub type WrapperOf = fn(Sym) -> *mut c_void;

/// The override of `cuGetProcAddress_v2`.
///
/// # Safety
/// The driver's contract for `cuGetProcAddress_v2`.
pub unsafe fn get_proc_address_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
    wrappers: WrapperOf,
) -> CUresult {
    let Some(rt) = runtime::get() else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the slot holds the driver's cuGetProcAddress_v2 or null.
    let Some(real) =
        (unsafe { fn_ptr::<pfn::GetProcAddressV2>(rt.driver.get(Sym::cuGetProcAddress_v2)) })
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { real(symbol, pfn, version, flags, status) };
    // SAFETY: the same arguments, after the driver accepted them.
    unsafe { redirect(rt, r, symbol, pfn, version, flags, wrappers) };
    r
}

/// The override of `cuGetProcAddress` (the CUDA 11.3 ABI, without the status output).
///
/// # Safety
/// The driver's contract for `cuGetProcAddress`.
pub unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    wrappers: WrapperOf,
) -> CUresult {
    let Some(rt) = runtime::get() else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    // SAFETY: the slot holds the driver's cuGetProcAddress or null.
    let Some(real) =
        (unsafe { fn_ptr::<pfn::GetProcAddress>(rt.driver.get(Sym::cuGetProcAddress)) })
    else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: forwarded unchanged.
    let r = unsafe { real(symbol, pfn, version, flags) };
    // SAFETY: the same arguments, after the driver accepted them.
    unsafe { redirect(rt, r, symbol, pfn, version, flags, wrappers) };
    r
}

/// Replaces a successful answer for a managed symbol by its wrapper.
///
/// # Safety
/// `symbol` and `pfn` as the driver's `cuGetProcAddress` contract requires.
unsafe fn redirect(
    rt: &Runtime,
    r: CUresult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    wrappers: WrapperOf,
) {
    if r != CUDA_SUCCESS || symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: on success the driver wrote the function address through `pfn`.
    let found = unsafe { pfn.read() };
    if found.is_null() {
        return;
    }
    // SAFETY: the driver accepted `symbol`, so it is a NUL-terminated string.
    let Ok(name) = unsafe { CStr::from_ptr(symbol) }.to_str() else {
        return;
    };
    let ProcLookup::Found(entry) = resolve_proc(name, version, flags) else {
        tracing::trace!(
            name,
            version,
            flags,
            "cuGetProcAddress: not in the table, unchanged"
        );
        return;
    };
    let Some(sym) = Sym::from_name(entry.symbol.as_bytes()) else {
        return;
    };
    if rt.driver.get(sym) != found {
        tracing::debug!(
            name,
            version,
            flags,
            symbol = entry.symbol,
            "cuGetProcAddress answered with a function other than the exported symbol"
        );
    }
    rt.driver.adopt(sym, found);
    let wrapper = wrappers(sym);
    if wrapper.is_null() {
        // This caller gets the driver's own function (see `crate::callers`).
        let real = crate::callers::driver_function_for_library(found, rt.driver.get(sym));
        // SAFETY: `pfn` is the caller's out-pointer, written by the driver just now.
        unsafe { pfn.write(real) };
        return;
    }
    // SAFETY: `pfn` is the caller's out-pointer, written by the driver just now.
    unsafe { pfn.write(wrapper) };
    tracing::trace!(
        name,
        version,
        flags,
        symbol = entry.symbol,
        "cuGetProcAddress: wrapped"
    );
}
