//! Whether a hooked call's stream is capturing into a CUDA graph.
//!
//! Work queued on a capturing stream does not run: it becomes part of a graph that runs at
//! each `cuGraphLaunch`, possibly much later. The hooks must then neither serve stream-ordered
//! allocations from the arena (the driver turns them into graph memory nodes), nor make the
//! stream wait on, or record, any event of the shim's (a dependency on work outside the
//! capture is `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`, and an event recorded into a capture can
//! be neither queried nor waited for). This module only answers the question; what the hooks
//! do about it is in [`super::residency`] and [`super::alloc`].

use std::cell::Cell;
use std::sync::OnceLock;

use tensile_driver_abi::{
    CUresult, CUstream, CUstreamCaptureStatus, CUDA_SUCCESS, CU_STREAM_CAPTURE_STATUS_NONE,
    CU_STREAM_LEGACY,
};

use crate::real::fn_ptr;
use crate::runtime::Runtime;

type PfnStreamIsCapturing = unsafe extern "C" fn(CUstream, *mut CUstreamCaptureStatus) -> CUresult;

/// The real driver's `cuStreamIsCapturing` (looked up once; `None` before CUDA 10).
fn is_capturing_fn(rt: &Runtime) -> Option<PfnStreamIsCapturing> {
    static F: OnceLock<Option<PfnStreamIsCapturing>> = OnceLock::new();
    *F.get_or_init(|| {
        // SAFETY: the driver's function of that name has this prototype (cuda.h), or null.
        unsafe { fn_ptr(rt.driver.symbol(c"cuStreamIsCapturing")) }
    })
}

/// Whether work queued now on `stream` (the handle value as the hooks record it:
/// `CU_STREAM_PER_THREAD` for a per-thread default stream) would be captured rather than run.
/// The legacy stream never captures. A capture that has been invalidated still counts (the
/// driver refuses the work itself). A failed query counts as "not capturing".
pub fn is_capturing(rt: &Runtime, stream: u64) -> bool {
    if stream == 0 || stream == CU_STREAM_LEGACY as u64 {
        return false;
    }
    let Some(f) = is_capturing_fn(rt) else {
        return false;
    };
    let mut status: CUstreamCaptureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a stream handle value the application passed for its call (the per-thread
    // handle is a valid argument too), and a valid out-pointer to a local.
    let r = unsafe { f(stream as usize as CUstream, &mut status) };
    r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE
}

/// A hooked call's stream and, asked of the driver at most once, whether it is capturing:
/// a launch needs the answer both to pin its memory and to decide whether to time it.
pub struct CallStream {
    rt: &'static Runtime,
    handle: u64,
    capturing: Cell<Option<bool>>,
}

impl CallStream {
    /// `handle` as the hooks record it (see [`is_capturing`]).
    pub fn new(rt: &'static Runtime, handle: u64) -> CallStream {
        CallStream {
            rt,
            handle,
            capturing: Cell::new(None),
        }
    }

    /// The stream handle value.
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// [`is_capturing`] for this stream, queried on first use.
    pub fn is_capturing(&self) -> bool {
        match self.capturing.get() {
            Some(c) => c,
            None => {
                let c = is_capturing(self.rt, self.handle);
                self.capturing.set(Some(c));
                c
            }
        }
    }
}
