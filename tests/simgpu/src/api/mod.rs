//! The exported C entry points, under the exact (versioned) symbol names of the real driver.
//!
//! Every export wraps its body in [`guard`], so no panic crosses the C boundary (a panic
//! becomes `CUDA_ERROR_UNKNOWN`). Output pointers are checked for NULL before anything
//! happens. Pointers the application passes are otherwise trusted exactly as the real
//! driver trusts them (a host buffer of the stated length, a NUL-terminated name): that is
//! the C contract of each function, documented in `cuda.h`, and the reason the exports are
//! `unsafe`.
//!
//! The `_ptsz`/`_ptds` variants differ only in what a NULL stream means: the calling
//! thread's per-thread default stream instead of the legacy one.

#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod context;
pub mod copy;
pub mod device;
pub mod event;
pub mod graph;
pub mod launch;
pub mod memory;
pub mod module;
pub mod pool;
pub mod proc;
pub mod stream;
pub mod vmm;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use tensile_driver_abi::*;

use crate::context::{self as ctxmod, Context};
use crate::ops::Op;
use crate::state::{self, State};
use crate::stream::{Dependency, Stream};

/// Runs an entry point's body, turning a panic into `CUDA_ERROR_UNKNOWN`.
pub fn guard(f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// An output parameter, checked non-NULL on construction.
pub struct Out<T>(*mut T);

impl<T> Out<T> {
    /// # Safety
    /// A non-NULL `p` must be valid for a write of `T` (the API contract).
    pub unsafe fn new(p: *mut T) -> Result<Self, CUresult> {
        if p.is_null() {
            Err(CUDA_ERROR_INVALID_VALUE)
        } else {
            Ok(Self(p))
        }
    }

    pub fn set(self, v: T) {
        // SAFETY: non-NULL (checked in `new`) and valid for writes (`new`'s contract).
        unsafe { self.0.write_unaligned(v) }
    }
}

/// The state, once `cuInit` has run.
pub fn st() -> Result<&'static State, CUresult> {
    state::get()
}

/// `dev` as an index into the devices (`CUDA_ERROR_INVALID_DEVICE` if there is none).
pub fn check_device(dev: CUdevice) -> Result<usize, CUresult> {
    st()?.device(dev)
}

/// The current context (after checking initialization).
pub fn current_ctx() -> Result<Arc<Context>, CUresult> {
    st()?;
    ctxmod::current()
}

/// Resolves a stream handle; `per_thread`: a NULL handle names the per-thread stream.
pub fn resolve_stream(
    h: CUstream,
    per_thread: bool,
) -> Result<(Arc<Context>, Arc<Stream>), CUresult> {
    let s = st()?;
    match h as usize {
        0 if per_thread => {
            let ctx = ctxmod::current()?;
            let stream = ctx.per_thread_stream()?;
            Ok((ctx, stream))
        }
        0 | CU_STREAM_LEGACY => {
            let ctx = ctxmod::current()?;
            let legacy = ctx.legacy.clone();
            Ok((ctx, legacy))
        }
        CU_STREAM_PER_THREAD => {
            let ctx = ctxmod::current()?;
            let stream = ctx.per_thread_stream()?;
            Ok((ctx, stream))
        }
        handle => {
            let stream = s.streams.get(handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let ctx = stream.ctx.upgrade().ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if ctx.destroyed.load(std::sync::atomic::Ordering::Acquire) {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            Ok((ctx, stream))
        }
    }
}

/// Queues `op` on a stream (after `waits`); fails at once if the context is broken.
pub fn enqueue(
    h: CUstream,
    per_thread: bool,
    waits: Vec<Dependency>,
    op: Op,
) -> Result<(), CUresult> {
    let (ctx, stream) = resolve_stream(h, per_thread)?;
    ctx.check()?;
    submit(&ctx, &stream, waits, op)?;
    Ok(())
}

/// Queues `op` on `stream`, or appends it to the stream's capture: returns its ticket (0 for a
/// captured op, which nothing needs to wait for). `waits` must be empty for a capturing
/// stream (`cuStreamWaitEvent` handles capture itself).
pub fn submit(
    ctx: &Context,
    stream: &Arc<Stream>,
    waits: Vec<Dependency>,
    op: Op,
) -> Result<u64, CUresult> {
    match stream.capture() {
        Some(capture) => {
            debug_assert!(waits.is_empty());
            capture.append(crate::capture::Node::Op(op))?;
            Ok(0)
        }
        None => Ok(ctx.submit(stream, waits, op)),
    }
}

/// Runs `op` on the default stream (legacy, or per-thread) and waits for it, like the
/// driver's synchronous copies and memsets that involve host memory.
pub fn run_sync(per_thread: bool, op: Op) -> Result<(), CUresult> {
    run_default(per_thread, op, true)
}

/// Queues `op` on the default stream (legacy, or per-thread); waits for it if `wait`. The
/// driver's "synchronous" copies between device memory and memsets of device memory do not
/// wait (see the CUDA documentation's "API synchronization behavior").
///
/// These synchronous calls are "potentially unsafe" during stream capture: refused (and the
/// capture invalidated) as the calling thread's capture mode says, and always refused on a
/// capturing per-thread default stream.
pub fn run_default(per_thread: bool, op: Op, wait: bool) -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    let (ctx, stream) = resolve_stream(std::ptr::null_mut(), per_thread)?;
    ctx.check()?;
    if let Some(c) = stream.capture() {
        c.invalidate("a synchronous copy or memset on the capturing stream");
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    let ticket = ctx.submit(&stream, Vec::new(), op);
    if wait {
        stream.wait_for(ticket);
        ctx.check()
    } else {
        Ok(())
    }
}

/// Declares a legacy export and its per-thread-default-stream twin over one implementation
/// taking `per_thread: bool` first.
macro_rules! per_thread_pair {
    ($legacy:ident, $pt:ident, $imp:path, ($($arg:ident: $ty:ty),* $(,)?)) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $legacy($($arg: $ty),*) -> CUresult {
            $crate::calls::count(stringify!($legacy));
            $crate::api::guard(|| {
                // SAFETY: forwarded under this entry point's API contract.
                unsafe { $imp(false, $($arg),*) }
            })
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $pt($($arg: $ty),*) -> CUresult {
            $crate::calls::count(stringify!($pt));
            $crate::api::guard(|| {
                // SAFETY: forwarded under this entry point's API contract.
                unsafe { $imp(true, $($arg),*) }
            })
        }
    };
}
pub(crate) use per_thread_pair;

/// Declares one export over an `unsafe fn` implementation with the same arguments.
macro_rules! export {
    ($name:ident, $imp:path, ($($arg:ident: $ty:ty),* $(,)?)) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            $crate::calls::count(stringify!($name));
            $crate::api::guard(|| {
                // SAFETY: forwarded under this entry point's API contract.
                unsafe { $imp($($arg),*) }
            })
        }
    };
}
pub(crate) use export;
