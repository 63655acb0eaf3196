//! Unload hooks: after a module or library is unloaded, its kernel handles are dead and
//! their addresses may be reused by new kernels, so every cached kernel description is
//! dropped.

use tensile_driver_abi::{CUlibrary, CUmodule, CUresult, CUDA_SUCCESS};

use super::Call;
use crate::syms::pfn;

fn unload_with<F>(call: &Call<F>, forward: impl FnOnce() -> CUresult) -> CUresult {
    let r = forward();
    if r == CUDA_SUCCESS {
        call.rt.tracker.kernels.invalidate();
    }
    r
}

/// `cuModuleUnload`.
///
/// # Safety
/// The driver's contract for `cuModuleUnload`.
pub unsafe fn module_unload(call: Call<pfn::ModuleUnload>, module: CUmodule) -> CUresult {
    // SAFETY: forwarded unchanged.
    unload_with(&call, || unsafe { (call.real)(module) })
}

/// `cuLibraryUnload`.
///
/// # Safety
/// The driver's contract for `cuLibraryUnload`.
pub unsafe fn library_unload(call: Call<pfn::LibraryUnload>, library: CUlibrary) -> CUresult {
    // SAFETY: forwarded unchanged.
    unload_with(&call, || unsafe { (call.real)(library) })
}
