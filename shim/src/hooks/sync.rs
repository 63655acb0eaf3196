//! Host-wait hooks: forwarded unchanged, recorded in the trace (the analyzer uses them to
//! see where the host stalls on the device).

use std::sync::atomic::{AtomicBool, Ordering};

use tensile_driver_abi::{
    CUcontext, CUevent, CUresult, CUstream, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_SUCCESS,
};
use tensile_trace::{Record, Sync, SyncScope};

use super::Call;
use crate::syms::pfn;

/// Says once, when the device reports an illegal address while swapped-out pages are left
/// unmapped (`TENSILE_SWAPPED=unmapped`), that an access the shim did not foresee may be the
/// cause: the application's own error names only the address.
fn explain_fault(config: &crate::config::Config, r: CUresult) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if r == CUDA_ERROR_ILLEGAL_ADDRESS
        && config.swapped_unmapped
        && !SAID.swap(true, Ordering::Relaxed)
    {
        tracing::error!(
            "tensile: the GPU reported an illegal address while swapped-out pages are left \
             unmapped (TENSILE_SWAPPED=unmapped): a kernel may have touched memory the shim \
             did not see it use; run with TENSILE_SWAPPED=host (the default) to have such \
             accesses served from the host copy instead"
        );
    }
}

fn sync_with<F>(call: &Call<F>, scope: SyncScope, forward: impl FnOnce() -> CUresult) -> CUresult {
    let t = call.rt.now_ns();
    let r = forward();
    explain_fault(&call.rt.config, r);
    if r == CUDA_SUCCESS {
        if let Some(rec) = call.rt.records() {
            rec.record(Record::Sync(Sync { t_ns: t, scope }));
        }
        // Work the host waited for has finished: its launch times can be read now.
        call.rt.collect_launch_times();
    }
    r
}

/// `cuStreamSynchronize[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuStreamSynchronize`.
pub unsafe fn stream_synchronize(call: Call<pfn::StreamSynchronize>, stream: CUstream) -> CUresult {
    // SAFETY: forwarded unchanged.
    sync_with(&call, SyncScope::Stream(call.stream(stream)), || unsafe {
        (call.real)(stream)
    })
}

/// `cuCtxSynchronize`.
///
/// # Safety
/// The driver's contract for `cuCtxSynchronize`.
pub unsafe fn ctx_synchronize(call: Call<pfn::CtxSynchronize>) -> CUresult {
    // SAFETY: forwarded unchanged.
    sync_with(&call, SyncScope::Context, || unsafe { (call.real)() })
}

/// `cuCtxSynchronize_v2` (CUDA 13: names the context).
///
/// # Safety
/// The driver's contract for `cuCtxSynchronize_v2`.
pub unsafe fn ctx_synchronize_v2(call: Call<pfn::CtxSynchronizeV2>, ctx: CUcontext) -> CUresult {
    // SAFETY: forwarded unchanged.
    sync_with(&call, SyncScope::Context, || unsafe { (call.real)(ctx) })
}

/// `cuEventSynchronize`.
///
/// # Safety
/// The driver's contract for `cuEventSynchronize`.
pub unsafe fn event_synchronize(call: Call<pfn::EventSynchronize>, event: CUevent) -> CUresult {
    // SAFETY: forwarded unchanged.
    sync_with(&call, SyncScope::Event(event as usize as u64), || unsafe {
        (call.real)(event)
    })
}
