//! The logic of the `dlsym` override.
//!
//! Every `dlsym` in the process comes here: the application's, every library's, glibc
//! helpers', Rust std's (weak symbols), even the shim's own. So the common path, any name
//! that is not a managed `cu*` symbol, must be indistinguishable from glibc's `dlsym`:
//! [`dlsym_route`] answers it without allocating, locking or logging, by handing back the
//! real `dlsym` for the C surface to *tail-jump* to. Jumping (rather than calling) keeps
//! the application's return address, which glibc uses to resolve `RTLD_NEXT` relative to
//! the caller; a call from here would resolve it relative to libtensile instead.
//!
//! Managed names go to [`dlsym_intercept`]: the real answer is looked up, and if it is
//! the real driver's function of that name (a handle of libcuda, `RTLD_DEFAULT`,
//! `RTLD_NEXT`) the shim's wrapper is returned instead.

use std::ffi::{c_char, c_void, CStr};

use crate::proc_address::WrapperOf;
use crate::real::{real_dlsym, DlsymFn};
use crate::runtime;
use crate::syms::Sym;

/// Decides where a `dlsym(handle, symbol)` call goes: the address of glibc's `dlsym` (pass
/// through), `intercept` (a managed name), or null (no `dlsym` can be found; the call then
/// returns null).
///
/// Never allocates, locks, logs or panics.
///
/// # Safety
/// `symbol` must be null or a NUL-terminated string (`dlsym`'s contract).
#[inline]
pub unsafe fn dlsym_route(symbol: *const c_char, intercept: *const c_void) -> *const c_void {
    let Some(real) = real_dlsym() else {
        return std::ptr::null();
    };
    let real = real as *const c_void;
    if symbol.is_null() {
        return real;
    }
    // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string. The second byte is
    // only read when the first is not the terminator.
    let is_cu = unsafe { *symbol == b'c' as c_char && *symbol.add(1) == b'u' as c_char };
    if !is_cu {
        return real;
    }
    // SAFETY: as above.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if Sym::from_name(name).is_some() {
        intercept
    } else {
        real
    }
}

/// `dlsym` for a managed name: the real answer, or the shim's wrapper when the real
/// answer is the real driver's function.
///
/// # Safety
/// `symbol` must be a NUL-terminated string naming a managed symbol (as routed by
/// [`dlsym_route`]); `handle` is passed to glibc unchanged.
pub unsafe fn dlsym_intercept(
    handle: *mut c_void,
    symbol: *const c_char,
    wrappers: WrapperOf,
) -> *mut c_void {
    let Some(real_dlsym) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarded unchanged to glibc.
    let found = unsafe { real_dlsym(handle, symbol) };
    // SAFETY: routed here only for NUL-terminated names.
    let name = unsafe { CStr::from_ptr(symbol) };
    let Some(sym) = Sym::from_name(name.to_bytes()) else {
        return found;
    };
    if found.is_null() {
        return found;
    }
    let wrapper = wrappers(sym);
    if wrapper.is_null() {
        // This caller gets the driver's own function (see `crate::callers`).
        return match runtime::get() {
            Some(rt) => crate::callers::driver_function_for_library(found, rt.driver.get(sym)),
            None => found,
        };
    }
    // Creating the runtime loads the driver, whose constructors may call dlsym: then this
    // returns None on the same thread and the real answer stands.
    let rt = runtime::get();
    if found == wrapper {
        // Found libtensile's own export (RTLD_DEFAULT, or a handle of the main program).
        // Answer as the driver would: not found if it lacks the function.
        return match rt {
            Some(rt) if rt.driver.get(sym).is_null() => std::ptr::null_mut(),
            _ => found,
        };
    }
    let Some(rt) = rt else {
        return found;
    };
    if rt.driver.get(sym) == found {
        tracing::trace!(symbol = sym.name(), "dlsym: wrapped");
        wrapper
    } else {
        tracing::debug!(
            symbol = sym.name(),
            "dlsym: not the real driver's function, unchanged"
        );
        found
    }
}

/// The real `dlsym`, for the C surface (as a plain function pointer).
pub fn real() -> Option<DlsymFn> {
    real_dlsym()
}
