//! Events: create, record, query, synchronize, elapsed time, destroy.

use std::ffi::c_uint;
use std::sync::Arc;

use tensile_driver_abi::*;

use super::{current_ctx, export, per_thread_pair, st, Out};
use crate::context;
use crate::event::Event;
use crate::ops::Op;

/// BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS
const EVENT_FLAGS: c_uint = 0x7;

fn lookup(ev: CUevent) -> Result<Arc<Event>, CUresult> {
    st()?
        .events
        .get(ev as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// The sticky error of the current context, if there is one and it is broken.
fn current_fault() -> Result<(), CUresult> {
    match context::current() {
        Ok(c) => c.check(),
        Err(_) => Ok(()),
    }
}

unsafe fn event_create(ph: *mut CUevent, flags: c_uint) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(ph) }?;
    if flags & !EVENT_FLAGS != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    current_ctx()?;
    out.set(st()?.events.insert(Arc::new(Event::new(flags))) as CUevent);
    Ok(())
}
export!(cuEventCreate, event_create, (ph: *mut CUevent, flags: c_uint));

unsafe fn event_record(pt: bool, ev: CUevent, h: CUstream) -> Result<(), CUresult> {
    let event = lookup(ev)?;
    let (ctx, stream) = super::resolve_stream(h, pt)?;
    ctx.check()?;
    if let Some(capture) = stream.capture() {
        capture.append(crate::capture::Node::Record(event.clone()))?;
        event.mark_captured(capture.id);
        return Ok(());
    }
    let generation = event.begin_record();
    ctx.submit(&stream, Vec::new(), Op::Record(event, generation));
    Ok(())
}
per_thread_pair!(cuEventRecord, cuEventRecord_ptsz, event_record, (ev: CUevent, h: CUstream));

unsafe fn event_record_with_flags(
    pt: bool,
    ev: CUevent,
    h: CUstream,
    flags: c_uint,
) -> Result<(), CUresult> {
    if flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: same arguments and contract.
    unsafe { event_record(pt, ev, h) }
}
per_thread_pair!(cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz, event_record_with_flags, (ev: CUevent, h: CUstream, flags: c_uint));

/// An event whose latest record went into a capture has nothing to query or wait for:
/// `CUDA_ERROR_CAPTURED_EVENT`, and the capture (if still active) is invalidated. Querying
/// or waiting for any other event is a potentially unsafe call during a capture (PyTorch's
/// NCCL watchdog invalidated global captures with `cudaEventQuery` until it switched its
/// thread's capture mode: pytorch/pytorch#104555, #105182).
fn refuse_captured(event: &Event) -> Result<(), CUresult> {
    match event.captured_in() {
        Some(id) => {
            crate::capture::invalidate_by_id(id, "a query or wait of an event recorded in it");
            Err(CUDA_ERROR_CAPTURED_EVENT)
        }
        None => Ok(()),
    }
}

unsafe fn event_query(ev: CUevent) -> Result<(), CUresult> {
    let event = lookup(ev)?;
    refuse_captured(&event)?;
    crate::capture::check_unsafe_call()?;
    current_fault()?;
    if event.is_done() {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_READY)
    }
}
export!(cuEventQuery, event_query, (ev: CUevent));

unsafe fn event_synchronize(ev: CUevent) -> Result<(), CUresult> {
    let event = lookup(ev)?;
    refuse_captured(&event)?;
    crate::capture::check_unsafe_call()?;
    event.wait();
    current_fault()
}
export!(cuEventSynchronize, event_synchronize, (ev: CUevent));

unsafe fn event_elapsed_time(ms: *mut f32, start: CUevent, end: CUevent) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(ms) }?;
    let (a, b) = (lookup(start)?, lookup(end)?);
    if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let ((ra, ta), (rb, tb)) = (a.timestamp(), b.timestamp());
    if !ra || !rb {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let (ta, tb) = match (ta, tb) {
        (Some(ta), Some(tb)) => (ta, tb),
        _ => return Err(CUDA_ERROR_NOT_READY),
    };
    // Nanoseconds on the card's clock (see `card.rs`): modelled time, not when the stream's
    // worker happened to get to each record.
    let millis = (i128::from(tb) - i128::from(ta)) as f64 / 1e6;
    out.set(millis as f32);
    Ok(())
}
export!(cuEventElapsedTime, event_elapsed_time, (ms: *mut f32, start: CUevent, end: CUevent));
export!(cuEventElapsedTime_v2, event_elapsed_time, (ms: *mut f32, start: CUevent, end: CUevent));

unsafe fn event_destroy(ev: CUevent) -> Result<(), CUresult> {
    st()?
        .events
        .remove(ev as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(())
}
export!(cuEventDestroy_v2, event_destroy, (ev: CUevent));
