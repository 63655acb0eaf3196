//! The memory manager's [`Driver`](crate::memory::Driver) over the real driver loaded by the
//! runtime.
//!
//! Inside `libtensile.so` the manager must not look functions up with plain `dlsym`: that
//! binds to libtensile's own `dlsym` override, which hands out the shim's wrappers, and a swap
//! copy would then re-enter the hooks. Every function here is looked up with the *real*
//! `dlsym` in the driver's handle ([`RealDriver::symbol`]), so it is the driver's own.
//!
//! The manager is called from the application's threads (the hooks, where the application's
//! context is current) and from the host pool's grower thread (where no context is). Each
//! call therefore makes the manager's context current if another one (or none) is, and puts
//! the previous one back afterwards. This module decides nothing about memory.
//!
//! Stream capture: while any thread captures in `CU_STREAM_CAPTURE_MODE_GLOBAL` (the default
//! of `cudaStreamBeginCapture` and of PyTorch), a "potentially unsafe" call (host memory
//! allocation, a synchronization, ...) from a thread not in relaxed mode fails with
//! `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the application's capture (see
//! `cuThreadExchangeStreamCaptureMode`). Every call of the manager therefore runs with the
//! calling thread switched to `CU_STREAM_CAPTURE_MODE_RELAXED`, and the caller's mode is put
//! back afterwards ([`RelaxedCapture`]).

use std::ffi::CStr;
use std::ptr::null_mut;

use tensile_driver_abi::{
    CUcontext, CUdevice, CUresult, CUstreamCaptureMode, CUDA_SUCCESS,
    CU_STREAM_CAPTURE_MODE_RELAXED,
};

use crate::memory::table::{check, resolve, InContext, MemFns, TableDriver};
use crate::real::RealDriver;

type R = CUresult;
type PfnCtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> R;
type PfnCtxSetCurrent = unsafe extern "C" fn(CUcontext) -> R;
type PfnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> R;
type PfnDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> R;
type PfnCtxSynchronize = unsafe extern "C" fn() -> R;
pub(crate) type PfnExchangeCaptureMode = unsafe extern "C" fn(*mut CUstreamCaptureMode) -> R;

/// The manager's context, and the driver functions that switch to it (the memory
/// operations are in [`MemFns`]).
pub struct ManagerContext {
    ctx_get_current: PfnCtxGetCurrent,
    ctx_set_current: PfnCtxSetCurrent,
    ctx_get_device: PfnCtxGetDevice,
    ctx_synchronize: PfnCtxSynchronize,
    /// `cuThreadExchangeStreamCaptureMode` (absent before CUDA 10.1: no modes to switch).
    exchange_capture_mode: Option<PfnExchangeCaptureMode>,
    ctx: usize,
    device: CUdevice,
    /// The device's UUID (`None`: the driver would not say).
    device_uuid: Option<[u8; 16]>,
}

/// The calling thread in relaxed capture mode until dropped; then its previous mode again.
pub struct RelaxedCapture {
    exchange: Option<PfnExchangeCaptureMode>,
    previous: CUstreamCaptureMode,
}

impl RelaxedCapture {
    /// Switches the calling thread to relaxed mode (nothing if `exchange` is `None`).
    pub(crate) fn enter(exchange: Option<PfnExchangeCaptureMode>) -> RelaxedCapture {
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        let exchange = exchange.filter(|f| {
            // SAFETY: a valid pointer to a local mode.
            unsafe { f(&mut mode) == CUDA_SUCCESS }
        });
        RelaxedCapture {
            exchange,
            previous: mode,
        }
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(f) = self.exchange {
            let mut mode = self.previous;
            // SAFETY: a valid pointer to a local mode.
            let _ = unsafe { f(&mut mode) };
        }
    }
}

/// [`Driver`](crate::memory::Driver) over the real driver, bound to one context.
pub type RealMemoryDriver = TableDriver<ManagerContext>;

/// Why the manager's driver could not be set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupError {
    /// The driver lacks this function (too old, or not a CUDA driver).
    Missing(&'static str),
    /// No context is current on the calling thread.
    NoContext,
    /// A driver call failed.
    Driver(&'static str, CUresult),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::Missing(s) => write!(f, "the driver has no {s}"),
            SetupError::NoContext => write!(f, "no CUDA context is current"),
            SetupError::Driver(s, code) => write!(f, "{s} failed with error {code}"),
        }
    }
}

impl ManagerContext {
    /// The context current on this thread (0: none, or the query failed).
    #[inline]
    fn current(&self) -> usize {
        let mut ctx: CUcontext = null_mut();
        // SAFETY: a valid out-pointer to a local.
        let r = unsafe { (self.ctx_get_current)(&mut ctx) };
        if r == CUDA_SUCCESS {
            ctx as usize
        } else {
            0
        }
    }
}

impl InContext for ManagerContext {
    /// Runs `call` with the manager's context current, restoring the caller's afterwards.
    #[inline]
    fn in_context<T>(&self, call: impl FnOnce() -> Result<T, R>) -> Result<T, R> {
        let _relaxed = RelaxedCapture::enter(self.exchange_capture_mode);
        let previous = self.current();
        if previous == self.ctx {
            return call();
        }
        // SAFETY: the context was current when this driver was made and is never destroyed
        // by the shim; the application destroying it ends every use of its memory anyway.
        check(unsafe { (self.ctx_set_current)(self.ctx as CUcontext) })?;
        let result = call();
        // SAFETY: `previous` was current on this thread a moment ago (or null).
        let _ = unsafe { (self.ctx_set_current)(previous as CUcontext) };
        result
    }
}

impl RealMemoryDriver {
    /// The driver's functions, bound to the context current on this thread.
    pub fn for_current_context(real: &RealDriver) -> Result<Self, SetupError> {
        // Only the real driver's own functions (see the module docs), never plain `dlsym`.
        let lookup = |name: &CStr| real.symbol(name);
        let missing = SetupError::Missing;
        let ctx_get_current: PfnCtxGetCurrent =
            resolve!(lookup, "cuCtxGetCurrent").map_err(missing)?;
        let ctx_set_current: PfnCtxSetCurrent =
            resolve!(lookup, "cuCtxSetCurrent").map_err(missing)?;
        let ctx_get_device: PfnCtxGetDevice =
            resolve!(lookup, "cuCtxGetDevice").map_err(missing)?;
        let ctx_synchronize: PfnCtxSynchronize =
            resolve!(lookup, "cuCtxSynchronize").map_err(missing)?;
        let exchange_capture_mode: Option<PfnExchangeCaptureMode> =
            resolve!(lookup, "cuThreadExchangeStreamCaptureMode").ok();
        // SAFETY: the real driver's function of each name, or null; the driver library is
        // never unloaded.
        let f = unsafe { MemFns::resolve(lookup) }.map_err(missing)?;
        let mut ctx: CUcontext = null_mut();
        // SAFETY: a valid out-pointer to a local.
        check(unsafe { ctx_get_current(&mut ctx) })
            .map_err(|e| SetupError::Driver("cuCtxGetCurrent", e))?;
        if ctx.is_null() {
            return Err(SetupError::NoContext);
        }
        let mut device: CUdevice = 0;
        // SAFETY: a valid out-pointer to a local; a context is current.
        check(unsafe { ctx_get_device(&mut device) })
            .map_err(|e| SetupError::Driver("cuCtxGetDevice", e))?;
        let get_uuid: Option<PfnDeviceGetUuid> = resolve!(lookup, "cuDeviceGetUuid_v2")
            .or_else(|_| resolve!(lookup, "cuDeviceGetUuid"))
            .ok();
        let device_uuid = get_uuid.and_then(|get| {
            let mut uuid = [0u8; 16];
            // SAFETY: a valid out-pointer to a local; `device` is the current context's.
            check(unsafe { get(&mut uuid, device) }).ok().map(|()| uuid)
        });
        Ok(TableDriver {
            f,
            context: ManagerContext {
                ctx_get_current,
                ctx_set_current,
                ctx_get_device,
                ctx_synchronize,
                exchange_capture_mode,
                ctx: ctx as usize,
                device,
                device_uuid,
            },
        })
    }

    /// The UUID of the manager's device, if the driver gave it.
    pub fn device_uuid(&self) -> Option<[u8; 16]> {
        self.context.device_uuid
    }

    /// The context the manager's work runs in.
    pub fn context(&self) -> usize {
        self.context.ctx
    }

    /// The device ordinal of that context.
    pub fn device(&self) -> CUdevice {
        self.context.device
    }

    /// The context current on this thread (0: none, or the query failed).
    #[inline]
    pub fn current_context(&self) -> usize {
        self.context.current()
    }

    /// The device of the context current on this thread (`None`: no context is current, or
    /// the query failed).
    pub fn current_device(&self) -> Option<CUdevice> {
        let mut device: CUdevice = 0;
        // SAFETY: a valid out-pointer to a local; with no context current the driver fails
        // the call, writing nothing.
        let r = unsafe { (self.context.ctx_get_device)(&mut device) };
        (r == CUDA_SUCCESS).then_some(device)
    }

    /// `cuCtxSynchronize` of the manager's context (what a synchronous free implies).
    pub fn synchronize(&self) -> Result<(), R> {
        let c = &self.context;
        // SAFETY: no arguments; the context is made current by `in_context`.
        c.in_context(|| check(unsafe { (c.ctx_synchronize)() }))
    }

    /// Switches the calling thread to relaxed capture mode until the guard is dropped.
    pub fn relaxed_capture(&self) -> RelaxedCapture {
        RelaxedCapture::enter(self.context.exchange_capture_mode)
    }

    /// Switches the calling thread (one of the shim's own) to relaxed capture mode for good.
    pub fn relax_thread_for_good(&self) {
        std::mem::forget(self.relaxed_capture());
    }

    /// Makes the manager's context current on the calling thread (for a thread of the
    /// shim's own, so that its calls need no switch).
    pub fn bind_current_thread(&self) -> Result<(), R> {
        let c = &self.context;
        // SAFETY: the context was current when this driver was made; see `in_context`.
        check(unsafe { (c.ctx_set_current)(c.ctx as CUcontext) })
    }
}
