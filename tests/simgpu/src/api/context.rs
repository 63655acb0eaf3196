//! Contexts: the primary context, created contexts, and the current-context stack.
//!
//! Simplification: the primary context, once created, lives for the rest of the process
//! (releasing it to zero references keeps it, and `cuDevicePrimaryCtxReset` waits for its
//! work and clears its sticky error rather than freeing its allocations).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tensile_driver_abi::*;

use super::{check_device, current_ctx, export, st, Out};
use crate::context::{self as ctxmod, Context};
use crate::handles::Registry;

/// `device`'s primary context, created on first use.
pub fn primary(device: usize) -> Result<Arc<Context>, CUresult> {
    let s = st()?;
    let mut p = s.primary(device);
    if let Some(c) = &p.ctx {
        return Ok(c.clone());
    }
    let ctx = Context::new(true, p.flags, &s.space, device)?;
    s.contexts.insert(ctx.clone());
    p.ctx = Some(ctx.clone());
    Ok(ctx)
}

unsafe fn primary_ctx_retain(pctx: *mut CUcontext, dev: CUdevice) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pctx) }?;
    let device = check_device(dev)?;
    let ctx = primary(device)?;
    st()?.primary(device).refs += 1;
    out.set(Registry::handle_of(&ctx) as CUcontext);
    Ok(())
}
export!(cuDevicePrimaryCtxRetain, primary_ctx_retain, (pctx: *mut CUcontext, dev: CUdevice));

unsafe fn primary_ctx_release(dev: CUdevice) -> Result<(), CUresult> {
    let device = check_device(dev)?;
    let mut p = st()?.primary(device);
    if p.refs == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    p.refs -= 1;
    Ok(())
}
export!(cuDevicePrimaryCtxRelease_v2, primary_ctx_release, (dev: CUdevice));

unsafe fn primary_ctx_reset(dev: CUdevice) -> Result<(), CUresult> {
    let device = check_device(dev)?;
    let ctx = st()?.primary(device).ctx.clone();
    if let Some(ctx) = ctx {
        ctx.synchronize();
        ctx.fault.store(0, Ordering::Release);
    }
    Ok(())
}
export!(cuDevicePrimaryCtxReset_v2, primary_ctx_reset, (dev: CUdevice));

unsafe fn primary_ctx_get_state(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let (f, a) = unsafe { (Out::new(flags)?, Out::new(active)?) };
    let device = check_device(dev)?;
    let p = st()?.primary(device);
    f.set(p.flags);
    a.set(i32::from(p.refs > 0));
    Ok(())
}
export!(cuDevicePrimaryCtxGetState, primary_ctx_get_state, (dev: CUdevice, flags: *mut c_uint, active: *mut c_int));

unsafe fn primary_ctx_set_flags(dev: CUdevice, flags: c_uint) -> Result<(), CUresult> {
    let device = check_device(dev)?;
    st()?.primary(device).flags = flags;
    Ok(())
}
export!(cuDevicePrimaryCtxSetFlags_v2, primary_ctx_set_flags, (dev: CUdevice, flags: c_uint));

fn create(flags: c_uint, dev: CUdevice) -> Result<CUcontext, CUresult> {
    let device = check_device(dev)?;
    let s = st()?;
    let ctx = Context::new(false, flags, &s.space, device)?;
    let h = s.contexts.insert(ctx.clone());
    ctxmod::push_current(ctx);
    Ok(h as CUcontext)
}

unsafe fn ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pctx) }?;
    out.set(create(flags, dev)?);
    Ok(())
}
export!(cuCtxCreate_v2, ctx_create, (pctx: *mut CUcontext, flags: c_uint, dev: CUdevice));

/// `cuCtxCreate_v4`: the create-params struct (execution affinity, CIG) is accepted only
/// when NULL.
unsafe fn ctx_create_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pctx) }?;
    if !params.is_null() {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    out.set(create(flags, dev)?);
    Ok(())
}
export!(cuCtxCreate_v4, ctx_create_v4, (pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice));

fn lookup(ctx: CUcontext) -> Result<Arc<Context>, CUresult> {
    st()?
        .contexts
        .get(ctx as usize)
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

unsafe fn ctx_destroy(ctx: CUcontext) -> Result<(), CUresult> {
    let c = lookup(ctx)?;
    if c.primary {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    st()?.contexts.remove(ctx as usize);
    c.shut_down();
    ctxmod::forget(&c);
    Ok(())
}
export!(cuCtxDestroy_v2, ctx_destroy, (ctx: CUcontext));

unsafe fn ctx_set_current(ctx: CUcontext) -> Result<(), CUresult> {
    st()?;
    if ctx.is_null() {
        ctxmod::set_current(None);
        return Ok(());
    }
    ctxmod::set_current(Some(lookup(ctx)?));
    Ok(())
}
export!(cuCtxSetCurrent, ctx_set_current, (ctx: CUcontext));

unsafe fn ctx_get_current(pctx: *mut CUcontext) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pctx) }?;
    st()?;
    out.set(ctxmod::current_raw().map_or(std::ptr::null_mut(), |c| {
        Registry::handle_of(&c) as CUcontext
    }));
    Ok(())
}
export!(cuCtxGetCurrent, ctx_get_current, (pctx: *mut CUcontext));

unsafe fn ctx_push_current(ctx: CUcontext) -> Result<(), CUresult> {
    ctxmod::push_current(lookup(ctx)?);
    Ok(())
}
export!(cuCtxPushCurrent_v2, ctx_push_current, (ctx: CUcontext));

unsafe fn ctx_pop_current(pctx: *mut CUcontext) -> Result<(), CUresult> {
    st()?;
    let popped = ctxmod::pop_current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if !pctx.is_null() {
        // SAFETY: API contract; NULL is allowed and skipped.
        unsafe { Out::new(pctx) }?.set(Registry::handle_of(&popped) as CUcontext);
    }
    Ok(())
}
export!(cuCtxPopCurrent_v2, ctx_pop_current, (pctx: *mut CUcontext));

unsafe fn ctx_get_device(dev: *mut CUdevice) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(dev) }?;
    out.set(current_ctx()?.device as CUdevice);
    Ok(())
}
export!(cuCtxGetDevice, ctx_get_device, (dev: *mut CUdevice));

unsafe fn ctx_get_device_v2(dev: *mut CUdevice, ctx: CUcontext) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(dev) }?;
    let ctx = if ctx.is_null() {
        current_ctx()?
    } else {
        lookup(ctx)?
    };
    out.set(ctx.device as CUdevice);
    Ok(())
}
export!(cuCtxGetDevice_v2, ctx_get_device_v2, (dev: *mut CUdevice, ctx: CUcontext));

unsafe fn ctx_synchronize() -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    let ctx = current_ctx()?;
    ctx.synchronize();
    ctx.check()
}
export!(cuCtxSynchronize, ctx_synchronize, ());

unsafe fn ctx_synchronize_v2(ctx: CUcontext) -> Result<(), CUresult> {
    crate::capture::check_unsafe_call()?;
    let ctx = if ctx.is_null() {
        current_ctx()?
    } else {
        lookup(ctx)?
    };
    ctx.synchronize();
    ctx.check()
}
export!(cuCtxSynchronize_v2, ctx_synchronize_v2, (ctx: CUcontext));

unsafe fn ctx_get_flags(flags: *mut c_uint) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(flags) }?;
    out.set(current_ctx()?.flags.load(Ordering::Relaxed));
    Ok(())
}
export!(cuCtxGetFlags, ctx_get_flags, (flags: *mut c_uint));

unsafe fn ctx_set_flags(flags: c_uint) -> Result<(), CUresult> {
    current_ctx()?.flags.store(flags, Ordering::Relaxed);
    Ok(())
}
export!(cuCtxSetFlags, ctx_set_flags, (flags: c_uint));

unsafe fn ctx_get_api_version(ctx: CUcontext, version: *mut c_uint) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(version) }?;
    if ctx.is_null() {
        current_ctx()?;
    } else {
        lookup(ctx)?;
    }
    out.set(3020);
    Ok(())
}
export!(cuCtxGetApiVersion, ctx_get_api_version, (ctx: CUcontext, version: *mut c_uint));

unsafe fn ctx_get_id(ctx: CUcontext, id: *mut u64) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(id) }?;
    let c = if ctx.is_null() {
        current_ctx()?
    } else {
        lookup(ctx)?
    };
    out.set(c.id);
    Ok(())
}
export!(cuCtxGetId, ctx_get_id, (ctx: CUcontext, id: *mut u64));

unsafe fn ctx_get_stream_priority_range(
    least: *mut c_int,
    greatest: *mut c_int,
) -> Result<(), CUresult> {
    current_ctx()?;
    if !least.is_null() {
        // SAFETY: API contract; NULL outputs are skipped.
        unsafe { Out::new(least) }?.set(0);
    }
    if !greatest.is_null() {
        // SAFETY: as above.
        unsafe { Out::new(greatest) }?.set(-5);
    }
    Ok(())
}
export!(cuCtxGetStreamPriorityRange, ctx_get_stream_priority_range, (least: *mut c_int, greatest: *mut c_int));

/// Limits are reported with H100-like defaults; setting one is accepted and ignored.
unsafe fn ctx_get_limit(value: *mut usize, limit: c_int) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(value) }?;
    current_ctx()?;
    out.set(match limit {
        0 => 1024,    // stack size
        1 => 1 << 20, // printf fifo
        2 => 8 << 20, // malloc heap
        3 => 2,       // dev runtime sync depth
        4 => 2048,    // pending launch count
        5 => 32,      // max L2 fetch granularity
        6 => 0,       // persisting L2
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    });
    Ok(())
}
export!(cuCtxGetLimit, ctx_get_limit, (value: *mut usize, limit: c_int));

unsafe fn ctx_set_limit(limit: c_int, _value: usize) -> Result<(), CUresult> {
    current_ctx()?;
    if (0..=6).contains(&limit) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}
export!(cuCtxSetLimit, ctx_set_limit, (limit: c_int, value: usize));

unsafe fn ctx_get_cache_config(config: *mut c_int) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(config) }?;
    current_ctx()?;
    out.set(0);
    Ok(())
}
export!(cuCtxGetCacheConfig, ctx_get_cache_config, (config: *mut c_int));

unsafe fn ctx_set_cache_config(_config: c_int) -> Result<(), CUresult> {
    current_ctx().map(|_| ())
}
export!(cuCtxSetCacheConfig, ctx_set_cache_config, (config: c_int));
