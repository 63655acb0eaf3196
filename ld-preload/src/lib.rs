//! `libtensile.so`: the C ABI surface of libtensile, loaded with `LD_PRELOAD`.
//!
//! This crate is only the surface; the behaviour lives in `tensile_shim`. It exports:
//! - `dlsym`, because libcudart, cuBLAS, cuBLASLt and cuDNN reach the driver by looking up
//!   `cuGetProcAddress_v2` (and some `cu*` names) with `dlsym` on a handle of libcuda;
//! - `cuGetProcAddress` and `cuGetProcAddress_v2`, through which they fetch every entry
//!   point;
//! - every managed `cu*` symbol under its exact versioned name (`cuMemAlloc_v2`,
//!   `cuLaunchKernel_ptsz`, ...), for programs linked against libcuda directly;
//! - a constructor that reads the configuration and sets up logging.
//!
//! Every exported body is one call into `tensile_shim` inside `ffi_guard`: a panic never
//! crosses the C boundary, it becomes `CUDA_ERROR_UNKNOWN` and a log line.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use tensile_driver_abi::{CUresult, CUDA_ERROR_UNKNOWN};
use tensile_shim::{entry, interpose, proc_address, Sym};

mod dlsym;

/// Runs one hook; a panic becomes `CUDA_ERROR_UNKNOWN` and a log line naming `function`.
#[inline(always)]
fn ffi_guard(function: &'static str, hook: impl FnOnce() -> CUresult) -> CUresult {
    match catch_unwind(AssertUnwindSafe(hook)) {
        Ok(r) => r,
        Err(_) => {
            tensile_shim::log::hook_panicked(function);
            CUDA_ERROR_UNKNOWN
        }
    }
}

/// Expands the managed entry-point list into exported C functions and [`wrapper_of`].
macro_rules! define_exports {
    ($( $family:ident => $($hook:ident)::+ : ($($arg:ident : $ty:ty),* $(,)?)
        = [$($sym:ident),+ $(,)?]; )*) => {
        $( export_family!(($($arg : $ty),*), [$($sym),+]); )*

        /// The address of this library's export of each managed symbol.
        fn wrapper_of(sym: Sym) -> *mut c_void {
            match sym {
                $($(Sym::$sym => $sym as *mut c_void,)+)*
                Sym::cuGetProcAddress => cuGetProcAddress as *mut c_void,
                Sym::cuGetProcAddress_v2 => cuGetProcAddress_v2 as *mut c_void,
            }
        }
    };
}

/// One export per symbol of a family (a recursion: the argument list cannot be repeated
/// inside the symbol repetition).
macro_rules! export_family {
    (($($arg:ident : $ty:ty),*), []) => {};
    (($($arg:ident : $ty:ty),*), [$sym:ident $(, $rest:ident)*]) => {
        #[doc = concat!("The managed `", stringify!($sym), "`.")]
        ///
        /// # Safety
        /// The CUDA driver's contract for this function.
        #[no_mangle]
        #[allow(non_snake_case, clippy::too_many_arguments)]
        pub unsafe extern "C" fn $sym($($arg: $ty),*) -> CUresult {
            // SAFETY: the C caller's arguments, under the driver's contract.
            ffi_guard(stringify!($sym), || unsafe { entry::$sym($($arg),*) })
        }
        export_family!(($($arg : $ty),*), [$($rest),*]);
    };
}

tensile_shim::with_managed_entry_points!(define_exports);

/// The managed `cuGetProcAddress_v2`.
///
/// # Safety
/// The CUDA driver's contract for this function.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: i32,
    flags: u64,
    symbol_status: *mut i32,
) -> CUresult {
    ffi_guard("cuGetProcAddress_v2", || {
        // SAFETY: the C caller's arguments, under the driver's contract.
        unsafe {
            proc_address::get_proc_address_v2(
                symbol,
                pfn,
                cuda_version,
                flags,
                symbol_status,
                wrapper_of,
            )
        }
    })
}

/// The managed `cuGetProcAddress` (CUDA 11.3 ABI).
///
/// # Safety
/// The CUDA driver's contract for this function.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: i32,
    flags: u64,
) -> CUresult {
    ffi_guard("cuGetProcAddress", || {
        // SAFETY: the C caller's arguments, under the driver's contract.
        unsafe { proc_address::get_proc_address(symbol, pfn, cuda_version, flags, wrapper_of) }
    })
}

/// The wrapper set handed to cuBLAS, cuBLASLt and cuDNN (`tensile_shim::callers`): their
/// allocating entry points are the driver's own (null here), so their internal memory is
/// never served by the memory manager; `cuGetProcAddress*` are the library flavour, so what
/// they fetch through it follows the same rule. With `TENSILE_POLICY=off` nothing is
/// managed and they get the ordinary set (their allocations are then traced too).
fn wrapper_of_library(sym: Sym) -> *mut c_void {
    if tensile_shim::runtime::config().policy == tensile_shim::config::Policy::Off {
        return wrapper_of(sym);
    }
    match sym {
        Sym::cuGetProcAddress => get_proc_address_for_libraries as *mut c_void,
        Sym::cuGetProcAddress_v2 => get_proc_address_v2_for_libraries as *mut c_void,
        s if s.allocates() => std::ptr::null_mut(),
        s => wrapper_of(s),
    }
}

/// `cuGetProcAddress_v2` as handed to the libraries of [`wrapper_of_library`].
///
/// # Safety
/// The CUDA driver's contract for `cuGetProcAddress_v2`.
unsafe extern "C" fn get_proc_address_v2_for_libraries(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: i32,
    flags: u64,
    symbol_status: *mut i32,
) -> CUresult {
    ffi_guard("cuGetProcAddress_v2", || {
        // SAFETY: the C caller's arguments, under the driver's contract.
        unsafe {
            proc_address::get_proc_address_v2(
                symbol,
                pfn,
                cuda_version,
                flags,
                symbol_status,
                wrapper_of_library,
            )
        }
    })
}

/// `cuGetProcAddress` as handed to the libraries of [`wrapper_of_library`].
///
/// # Safety
/// The CUDA driver's contract for `cuGetProcAddress`.
unsafe extern "C" fn get_proc_address_for_libraries(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: i32,
    flags: u64,
) -> CUresult {
    ffi_guard("cuGetProcAddress", || {
        // SAFETY: the C caller's arguments, under the driver's contract.
        unsafe {
            proc_address::get_proc_address(symbol, pfn, cuda_version, flags, wrapper_of_library)
        }
    })
}

/// `dlsym` for a managed name (the trampoline in [`dlsym`] jumps here).
///
/// # Safety
/// `dlsym`'s contract.
unsafe extern "C" fn dlsym_managed(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: forwarded from the caller.
    unsafe { dlsym_with(handle, symbol, wrapper_of) }
}

/// `dlsym` for a managed name asked by cuBLAS or cuDNN (see [`wrapper_of_library`]).
///
/// # Safety
/// `dlsym`'s contract.
unsafe extern "C" fn dlsym_managed_library(
    handle: *mut c_void,
    symbol: *const c_char,
) -> *mut c_void {
    // SAFETY: forwarded from the caller.
    unsafe { dlsym_with(handle, symbol, wrapper_of_library) }
}

/// The managed `dlsym` with the wrapper set `wrappers`.
///
/// # Safety
/// `dlsym`'s contract, for a managed name.
unsafe fn dlsym_with(
    handle: *mut c_void,
    symbol: *const c_char,
    wrappers: proc_address::WrapperOf,
) -> *mut c_void {
    // SAFETY: routed here only for NUL-terminated managed names.
    let wrapped = catch_unwind(|| unsafe { interpose::dlsym_intercept(handle, symbol, wrappers) });
    match wrapped {
        Ok(p) => p,
        Err(_) => {
            tensile_shim::log::hook_panicked("dlsym");
            match interpose::real() {
                // SAFETY: the caller's arguments, to glibc's dlsym.
                Some(real) => unsafe { real(handle, symbol) },
                None => std::ptr::null_mut(),
            }
        }
    }
}

#[ctor::ctor]
fn on_load() {
    // A panic here would abort the host program before `main`.
    let _ = catch_unwind(tensile_shim::runtime::on_load);
}
