//! The real CUDA driver: the real `dlsym`, the loaded `libcuda.so.1`, and a table of its
//! functions by managed symbol.
//!
//! libtensile overrides `dlsym`, so every lookup the shim itself makes must go through the
//! *real* one, found with `dlvsym(RTLD_NEXT, "dlsym", <glibc version>)` (glibc 2.34 moved
//! `dlsym` into libc.so.6 under the version `GLIBC_2.34`; older ones export `GLIBC_2.2.5`).
//! [`real_dlsym`] resolves it without allocating or locking, so it is safe to call from the
//! `dlsym` override at any time, even before the library's constructor ran.
//!
//! [`RealDriver`] is the table the hooks forward to. It does not decide anything.

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::kernels::{Introspection, NameFn, ParamInfoFn};
use crate::syms::Sym;

/// The C signature of `dlsym`.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

thread_local! {
    // Const-initialised and without destructor: lives in static TLS, touching it never
    // allocates.
    static RESOLVING: Cell<bool> = const { Cell::new(false) };
}

/// The real `dlsym`, or `None` if glibc has none we know (or this thread is resolving it
/// right now and re-entered, which only a malloc interposer calling `dlsym` could cause).
///
/// Never allocates, locks or logs on the fast path (after the first successful call).
#[inline]
pub fn real_dlsym() -> Option<DlsymFn> {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: only ever set to the address of glibc's `dlsym`.
        return Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) });
    }
    resolve_real_dlsym()
}

#[cold]
fn resolve_real_dlsym() -> Option<DlsymFn> {
    if RESOLVING.replace(true) {
        return None;
    }
    let mut found = null_mut();
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: plain C strings; `RTLD_NEXT` from this library finds the `dlsym` after
        // it in the search order, which is glibc's.
        found = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !found.is_null() {
            break;
        }
    }
    RESOLVING.set(false);
    if found.is_null() {
        return None;
    }
    // Several threads may race here; they all store the same address.
    REAL_DLSYM.store(found, Ordering::Release);
    // SAFETY: `found` is glibc's `dlsym`.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(found) })
}

/// Looks `name` up in `handle` with the real `dlsym`.
///
/// # Safety
/// `handle` must be `RTLD_DEFAULT`, `RTLD_NEXT` or a live `dlopen` handle.
pub unsafe fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: `name` is NUL-terminated; glibc validates the handle.
        Some(dlsym) => unsafe { dlsym(handle, name.as_ptr()) },
        None => null_mut(),
    }
}

/// The loaded real driver and the real function behind every managed symbol.
#[derive(Debug)]
pub struct RealDriver {
    handle: *mut c_void,
    slots: [AtomicPtr<c_void>; Sym::COUNT],
    /// The driver's own introspection functions, used to describe kernels.
    pub introspection: Introspection,
}

// SAFETY: the dlopen handle is only passed back to glibc, which is thread-safe; the slots
// are atomics.
unsafe impl Send for RealDriver {}
// SAFETY: as above.
unsafe impl Sync for RealDriver {}

/// The library the real driver lives in (the soname every CUDA program loads).
pub const DRIVER_LIBRARY: &CStr = c"libcuda.so.1";

impl RealDriver {
    /// Loads the real driver (or finds it already loaded) and resolves every managed
    /// symbol in it. Symbols the driver lacks stay empty.
    pub fn load() -> Result<Self, String> {
        // SAFETY: a plain C string. RTLD_GLOBAL keeps the driver's symbols visible to
        // later lookups exactly as if the application had loaded it.
        let handle =
            unsafe { libc::dlopen(DRIVER_LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a thread-local C string or null.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() {
                "unknown error".to_owned()
            } else {
                // SAFETY: non-null dlerror strings are NUL-terminated.
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!(
                "cannot load {}: {why}",
                DRIVER_LIBRARY.to_string_lossy()
            ));
        }
        // SAFETY: just opened, and never closed.
        Ok(unsafe { Self::from_handle(handle) })
    }

    /// The table for an already opened driver library.
    ///
    /// # Safety
    /// `handle` must be a live `dlopen` handle of a CUDA driver library, never closed.
    pub unsafe fn from_handle(handle: *mut c_void) -> Self {
        let slots = std::array::from_fn(|i| {
            let name = Sym::ALL[i].name();
            let cname = std::ffi::CString::new(name).unwrap_or_default();
            // SAFETY: `handle` is the live driver handle (caller's contract).
            AtomicPtr::new(unsafe { lookup(handle, &cname) })
        });
        // SAFETY: as above.
        let sym = |name: &CStr| unsafe { lookup(handle, name) };
        // SAFETY: each name is looked up in the driver, whose functions of these names
        // have exactly these C signatures (cuda.h).
        let introspection = unsafe {
            Introspection {
                kernel_param_info: fn_ptr::<ParamInfoFn>(sym(c"cuKernelGetParamInfo")),
                func_param_info: fn_ptr::<ParamInfoFn>(sym(c"cuFuncGetParamInfo")),
                kernel_name: fn_ptr::<NameFn>(sym(c"cuKernelGetName")),
                func_name: fn_ptr::<NameFn>(sym(c"cuFuncGetName")),
            }
        };
        RealDriver {
            handle,
            slots,
            introspection,
        }
    }

    /// The dlopen handle of the driver.
    pub fn handle(&self) -> *mut c_void {
        self.handle
    }

    /// The real function behind `sym` (null if the driver lacks it).
    #[inline]
    pub fn get(&self, sym: Sym) -> *mut c_void {
        self.slots[sym as usize].load(Ordering::Relaxed)
    }

    /// Records `real` as the function behind `sym` if none is known yet (the driver
    /// handed it out through `cuGetProcAddress` without exporting it).
    pub fn adopt(&self, sym: Sym, real: *mut c_void) {
        let _ = self.slots[sym as usize].compare_exchange(
            null_mut(),
            real,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Looks up any symbol of the driver with the real `dlsym`.
    pub fn symbol(&self, name: &CStr) -> *mut c_void {
        // SAFETY: the driver handle stays open for the life of the process.
        unsafe { lookup(self.handle, name) }
    }
}

/// Turns a looked-up address into a typed function pointer (`None` for null).
///
/// # Safety
/// `p` must be null or the address of a function with signature `F`, and `F` must be an
/// `extern "C"` function pointer type.
pub unsafe fn fn_ptr<F: Copy>(p: *mut c_void) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    // SAFETY: same size, and by the caller's contract a valid `F` when non-null.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_dlsym_is_found_and_works() {
        let dlsym = real_dlsym().expect("glibc exports a versioned dlsym");
        // SAFETY: RTLD_DEFAULT and a C string.
        let p = unsafe { dlsym(libc::RTLD_DEFAULT, c"strlen".as_ptr()) };
        assert!(!p.is_null());
        // SAFETY: RTLD_DEFAULT.
        assert!(unsafe { lookup(libc::RTLD_DEFAULT, c"no_such_symbol_anywhere") }.is_null());
    }
}
