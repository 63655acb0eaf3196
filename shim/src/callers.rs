//! Which library is calling: the application's allocations are managed, but the ones that
//! cuBLAS, cuBLASLt and cuDNN make for themselves are forwarded to the driver.
//!
//! GPU_FACTS.md found that serving those libraries' internal allocations from VMM memory
//! broke them (`cublasCreate` failed, cuDNN found no engine). They reach the driver through
//! their own `dlsym` of `cuGetProcAddress*` or of the `cu*` names, so the lookup can tell
//! who asks from the return address of that `dlsym` and hand such a library a wrapper set
//! whose allocating entry points are the driver's own ([`crate::syms::Sym::allocates`]).
//! Everything else (launches, copies, frees) stays wrapped, so the application's tensors
//! they touch are still made resident. This module only names the callers.

use std::ffi::{c_void, CStr};

/// File-name prefixes of the libraries whose own allocations are forwarded.
pub const FORWARDED_LIBRARIES: &[&str] = &["libcublas", "libcudnn"];

/// Whether the file at `path` is one of [`FORWARDED_LIBRARIES`] (`libcublasLt.so.13`,
/// `/usr/lib/libcudnn_ops.so.9`, ...).
pub fn is_forwarded_library(path: &[u8]) -> bool {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    FORWARDED_LIBRARIES
        .iter()
        .any(|prefix| name.starts_with(prefix.as_bytes()))
}

/// Whether the code at address `return_address` belongs to one of [`FORWARDED_LIBRARIES`].
/// (An address, not a pointer: it is only looked up, never read.)
///
/// Takes the dynamic loader's lock (`dladdr`), as `dlsym` itself does; call it only for
/// managed names, never on the path every `dlsym` takes.
pub fn caller_is_forwarded_library(return_address: usize) -> bool {
    if return_address == 0 {
        return false;
    }
    // SAFETY: an all-zero Dl_info is a valid value to be overwritten.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr accepts any address and writes only `info`.
    let found = unsafe { libc::dladdr(return_address as *const c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: a non-null dli_fname is a NUL-terminated string owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) };
    is_forwarded_library(path.to_bytes())
}

/// Whether `p` lies in the object this code is linked into (`libtensile.so` when
/// preloaded): then it is one of the shim's exports, not the driver's function.
pub fn is_own_export(p: usize) -> bool {
    fn base_of(p: usize) -> Option<usize> {
        // SAFETY: an all-zero Dl_info is a valid value to be overwritten.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr accepts any address and writes only `info`.
        let found = unsafe { libc::dladdr(p as *const c_void, &mut info) };
        (found != 0).then_some(info.dli_fbase as usize)
    }
    let here = is_own_export as *const () as usize;
    p != 0 && base_of(p).is_some_and(|b| Some(b) == base_of(here))
}

/// What a forwarded library gets for `sym` when the lookup answered `found`: the real
/// driver's function (`real`) if `found` is that or one of the shim's own exports (a driver
/// that resolves `cuGetProcAddress` through the global scope finds the preloaded exports
/// first, as the simulated GPU does), else `found` unchanged (another library's function).
pub fn driver_function_for_library(found: *mut c_void, real: *mut c_void) -> *mut c_void {
    if !real.is_null() && (found == real || is_own_export(found as usize)) {
        real
    } else {
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names() {
        for yes in [
            &b"libcublas.so.13"[..],
            b"/opt/x/lib/libcublasLt.so.13.0.1",
            b"libcudnn_ops.so.9",
            b"/a/b/libcudnn_graph.so.9",
        ] {
            assert!(
                is_forwarded_library(yes),
                "{}",
                String::from_utf8_lossy(yes)
            );
        }
        for no in [
            &b"libcudart.so.13"[..],
            b"/usr/lib/libtorch_cuda.so",
            b"/opt/libcublas/libc.so.6",
            b"",
        ] {
            assert!(!is_forwarded_library(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn own_exports_are_told_from_other_functions() {
        let own = library_names as *const c_void;
        let libc_fn = libc::strlen as *const c_void;
        assert!(is_own_export(own as usize));
        assert!(!is_own_export(libc_fn as usize));
        assert!(!is_own_export(0));
        let real = 0x1000 as *mut c_void;
        assert_eq!(driver_function_for_library(own.cast_mut(), real), real);
        assert_eq!(driver_function_for_library(real, real), real);
        assert_eq!(
            driver_function_for_library(libc_fn.cast_mut(), real),
            libc_fn.cast_mut()
        );
        assert_eq!(
            driver_function_for_library(own.cast_mut(), std::ptr::null_mut()),
            own.cast_mut()
        );
    }

    #[test]
    fn this_test_binary_is_not_a_forwarded_library() {
        assert!(!caller_is_forwarded_library(
            library_names as *const () as usize
        ));
        assert!(!caller_is_forwarded_library(0));
    }
}
