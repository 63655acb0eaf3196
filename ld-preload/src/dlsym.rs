//! The exported `dlsym`.
//!
//! glibc resolves `dlsym(RTLD_NEXT, name)` relative to the object that *called* `dlsym`,
//! which it finds from the return address. An override that called the real `dlsym` from
//! its own body would make every `RTLD_NEXT` lookup in the process relative to libtensile,
//! and an interposer further down the chain looking up "the next `malloc`" would get its
//! own. So on x86-64 `dlsym` is a trampoline: it asks [`route`] where the call should go
//! and *jumps* there with the caller's arguments and return address intact: to glibc's
//! `dlsym` for every name the shim does not manage, to the managed path otherwise.

use std::ffi::{c_char, c_void};
use std::panic::catch_unwind;

use tensile_shim::interpose;

/// Where a `dlsym(_, symbol)` call goes: glibc's `dlsym`, the managed path (the library
/// flavour when the caller, found from `return_address`, is cuBLAS or cuDNN: see
/// `tensile_shim::callers`), or null. Never unwinds (the trampoline has no unwind
/// information).
extern "C" fn route(symbol: *const c_char, return_address: *const c_void) -> *const c_void {
    let managed = super::dlsym_managed as *const c_void;
    catch_unwind(|| {
        // SAFETY: `symbol` is dlsym's argument: null or a NUL-terminated string.
        let to = unsafe { interpose::dlsym_route(symbol, managed) };
        // Only managed names pay for finding the caller.
        if to == managed
            && tensile_shim::callers::caller_is_forwarded_library(return_address as usize)
        {
            super::dlsym_managed_library as *const c_void
        } else {
            to
        }
    })
    .unwrap_or(std::ptr::null())
}

/// `dlsym`, as a tail-jumping trampoline (see the module docs).
///
/// # Safety
/// `dlsym`'s contract.
#[cfg(target_arch = "x86_64")]
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // Keep the arguments, realign the stack to 16 bytes for the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "mov rdi, rsi",
        // The caller's return address, above the two saved registers and the padding.
        "mov rsi, [rsp + 24]",
        "call {route}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        // rax: where to go with the original arguments and return address; null: none.
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "ret",
        route = sym route,
    )
}

/// `dlsym` on other architectures: a plain call, so `RTLD_NEXT` lookups that pass
/// through resolve relative to libtensile (see the module docs). Not tested.
///
/// # Safety
/// `dlsym`'s contract.
#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let target = route(symbol, std::ptr::null());
    if target.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `route` returns glibc's dlsym or `dlsym_managed`, both with dlsym's signature.
    let f: tensile_shim::real::DlsymFn = unsafe { std::mem::transmute(target) };
    // SAFETY: the caller's arguments.
    unsafe { f(handle, symbol) }
}
