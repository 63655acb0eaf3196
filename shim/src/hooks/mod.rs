//! The managed entry points: what the shim does around each driver call it wraps.
//!
//! Every hook receives a [`Call`]: the runtime, the real driver function for the exact
//! versioned symbol the application asked for (so a `_ptsz` wrapper forwards to `_ptsz`),
//! and which symbol that was. Hooks track and trace around each call; with a memory manager
//! running, allocations, frees and `cuMemGetInfo` in its arena are served by it and every
//! launch, copy and memset first makes the managed memory it touches device-resident
//! ([`residency`]). Everything else is forwarded unchanged.
//!
//! Which symbols map to which hook is in [`crate::syms`]; the C surface is `ld-preload`.

use std::ffi::c_void;

use tensile_driver_abi::{
    CUresult, CUstream, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_INITIALIZED, CU_STREAM_PER_THREAD,
};

use crate::real::fn_ptr;
use crate::runtime::{self, Runtime};
use crate::syms::Sym;

pub mod alloc;
pub mod capture;
pub mod copy;
pub mod ipc;
pub mod launch;
pub mod memset;
pub mod module;
pub mod residency;
pub mod sync;

/// One intercepted call: where to forward it, and the runtime.
#[derive(Clone, Copy)]
pub struct Call<F> {
    pub rt: &'static Runtime,
    /// The real driver function for `sym`.
    pub real: F,
    pub sym: Sym,
}

impl<F: Copy> Call<F> {
    /// Prepares a call of `sym`. Fails with the driver error the application sees when
    /// there is no runtime (the real driver cannot be loaded) or the driver lacks `sym`.
    ///
    /// # Safety
    /// `F` must be the C function pointer type of `sym`.
    #[inline]
    pub unsafe fn new(sym: Sym) -> Result<Self, CUresult> {
        let Some(rt) = runtime::get() else {
            return Err(CUDA_ERROR_NOT_INITIALIZED);
        };
        // SAFETY: the slot of `sym` holds null or the driver's function of that name,
        // whose type is `F` by the caller's contract.
        match unsafe { fn_ptr::<F>(rt.driver.get(sym)) } {
            Some(real) => Ok(Call { rt, real, sym }),
            None => {
                tracing::warn!("the real driver has no {}; failing the call", sym.name());
                Err(CUDA_ERROR_NOT_FOUND)
            }
        }
    }

    /// The stream a call used, as the trace names it: the handle value the application
    /// passed, except that the null stream of a per-thread variant is recorded as
    /// `CU_STREAM_PER_THREAD` (that is what it means there).
    #[inline]
    pub fn stream(&self, stream: CUstream) -> u64 {
        stream_value(self.sym, stream)
    }
}

/// See [`Call::stream`].
pub fn stream_value(sym: Sym, stream: CUstream) -> u64 {
    if stream.is_null() && sym.per_thread() {
        CU_STREAM_PER_THREAD as u64
    } else {
        stream as usize as u64
    }
}

/// The stream of a call without a stream argument (synchronous copies and memsets): the
/// per-thread default stream for `_ptds` variants, the legacy one otherwise.
pub fn implicit_stream(sym: Sym) -> u64 {
    stream_value(sym, std::ptr::null_mut::<c_void>())
}
