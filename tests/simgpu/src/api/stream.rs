//! Streams: creation, synchronization, queries, cross-stream waits and host functions.

use std::ffi::{c_int, c_uint, c_void};

use tensile_driver_abi::*;

use super::{current_ctx, enqueue, export, per_thread_pair, resolve_stream, st, Out};
use crate::handles::Registry;
use crate::ops::Op;
use crate::stream::{Dependency, Stream};

fn create(flags: c_uint, priority: c_int) -> Result<CUstream, CUresult> {
    if flags & !CU_STREAM_NON_BLOCKING != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current_ctx()?;
    let stream = ctx.create_stream(flags, priority.clamp(-5, 0))?;
    Ok(st()?.streams.insert(stream) as CUstream)
}

unsafe fn stream_create(ph: *mut CUstream, flags: c_uint) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(ph) }?;
    out.set(create(flags, 0)?);
    Ok(())
}
export!(cuStreamCreate, stream_create, (ph: *mut CUstream, flags: c_uint));

unsafe fn stream_create_with_priority(
    ph: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(ph) }?;
    out.set(create(flags, priority)?);
    Ok(())
}
export!(cuStreamCreateWithPriority, stream_create_with_priority, (ph: *mut CUstream, flags: c_uint, priority: c_int));

/// Returns at once; work already queued still runs (as on the driver).
unsafe fn stream_destroy(h: CUstream) -> Result<(), CUresult> {
    let stream = st()?
        .streams
        .remove(h as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if let Some(c) = stream.set_capture(None) {
        // The capture dies with its stream; ending it unregisters it.
        c.invalidate("its stream was destroyed");
        let _ = c.end();
    }
    stream.shutdown();
    Ok(())
}
export!(cuStreamDestroy_v2, stream_destroy, (h: CUstream));

/// Synchronizing or querying a capturing stream is always refused and invalidates the
/// capture (there is no work to wait for: it is being recorded).
fn refuse_capturing(stream: &Stream) -> Result<(), CUresult> {
    match stream.capture() {
        Some(c) => {
            c.invalidate("cuStreamSynchronize or cuStreamQuery of the capturing stream");
            Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        }
        None => Ok(()),
    }
}

unsafe fn stream_synchronize(pt: bool, h: CUstream) -> Result<(), CUresult> {
    let (ctx, stream) = resolve_stream(h, pt)?;
    refuse_capturing(&stream)?;
    crate::capture::check_unsafe_call()?;
    stream.synchronize();
    ctx.check()
}
per_thread_pair!(cuStreamSynchronize, cuStreamSynchronize_ptsz, stream_synchronize, (h: CUstream));

unsafe fn stream_query(pt: bool, h: CUstream) -> Result<(), CUresult> {
    let (ctx, stream) = resolve_stream(h, pt)?;
    refuse_capturing(&stream)?;
    crate::capture::check_unsafe_call()?;
    ctx.check()?;
    if stream.is_idle() {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_READY)
    }
}
per_thread_pair!(cuStreamQuery, cuStreamQuery_ptsz, stream_query, (h: CUstream));

unsafe fn stream_wait_event(
    pt: bool,
    h: CUstream,
    ev: CUevent,
    flags: c_uint,
) -> Result<(), CUresult> {
    if flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let event = st()?
        .events
        .get(ev as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let (ctx, stream) = resolve_stream(h, pt)?;
    if let Some(capture) = stream.capture() {
        return super::graph::capture_wait(&capture, event, flags);
    }
    ctx.check()?;
    let generation = event.current_generation();
    let waits = if generation > 0 {
        vec![Dependency::Event(event, generation)]
    } else {
        Vec::new()
    };
    ctx.submit(&stream, waits, Op::Nop);
    Ok(())
}
per_thread_pair!(cuStreamWaitEvent, cuStreamWaitEvent_ptsz, stream_wait_event, (h: CUstream, ev: CUevent, flags: c_uint));

unsafe fn launch_host_func(
    pt: bool,
    h: CUstream,
    f: CUhostFn,
    data: *mut c_void,
) -> Result<(), CUresult> {
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    enqueue(
        h,
        pt,
        Vec::new(),
        Op::HostFn {
            f,
            data: data as usize,
        },
    )
}
per_thread_pair!(cuLaunchHostFunc, cuLaunchHostFunc_ptsz, launch_host_func, (h: CUstream, f: CUhostFn, data: *mut c_void));

unsafe fn stream_get_ctx(pt: bool, h: CUstream, pctx: *mut CUcontext) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pctx) }?;
    let (ctx, _) = resolve_stream(h, pt)?;
    out.set(Registry::handle_of(&ctx) as CUcontext);
    Ok(())
}
per_thread_pair!(cuStreamGetCtx, cuStreamGetCtx_ptsz, stream_get_ctx, (h: CUstream, pctx: *mut CUcontext));

unsafe fn stream_get_flags(pt: bool, h: CUstream, flags: *mut c_uint) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(flags) }?;
    let (_, stream) = resolve_stream(h, pt)?;
    out.set(stream.flags);
    Ok(())
}
per_thread_pair!(cuStreamGetFlags, cuStreamGetFlags_ptsz, stream_get_flags, (h: CUstream, flags: *mut c_uint));

unsafe fn stream_get_priority(pt: bool, h: CUstream, priority: *mut c_int) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(priority) }?;
    let (_, stream) = resolve_stream(h, pt)?;
    out.set(stream.priority);
    Ok(())
}
per_thread_pair!(cuStreamGetPriority, cuStreamGetPriority_ptsz, stream_get_priority, (h: CUstream, priority: *mut c_int));

unsafe fn stream_get_id(pt: bool, h: CUstream, id: *mut u64) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(id) }?;
    let (_, stream) = resolve_stream(h, pt)?;
    out.set(stream.id);
    Ok(())
}
per_thread_pair!(cuStreamGetId, cuStreamGetId_ptsz, stream_get_id, (h: CUstream, id: *mut u64));
