//! The memory manager's [`Driver`] over the real driver loaded by the runtime.
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

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

use tensile_driver_abi::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUmemAccessDesc, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUmemLocation, CUresult, CUstream, CUDA_ERROR_NOT_READY,
    CUDA_SUCCESS, CU_EVENT_DISABLE_TIMING, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST_NUMA, CU_STREAM_NON_BLOCKING,
};

use crate::memory::{Driver, Event, PhysHandle, PhysLocation, Stream};
use crate::real::{fn_ptr, RealDriver};

type R = CUresult;
type PfnCtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> R;
type PfnCtxSetCurrent = unsafe extern "C" fn(CUcontext) -> R;
type PfnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> R;
type PfnAddressReserve =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64) -> R;
type PfnAddressFree = unsafe extern "C" fn(CUdeviceptr, usize) -> R;
type PfnCreate = unsafe extern "C" fn(
    *mut CUmemGenericAllocationHandle,
    usize,
    *const CUmemAllocationProp,
    u64,
) -> R;
type PfnRelease = unsafe extern "C" fn(CUmemGenericAllocationHandle) -> R;
type PfnMap =
    unsafe extern "C" fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) -> R;
type PfnUnmap = unsafe extern "C" fn(CUdeviceptr, usize) -> R;
type PfnSetAccess = unsafe extern "C" fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize) -> R;
type PfnCopyDtod = unsafe extern "C" fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> R;
type PfnCopyHtod = unsafe extern "C" fn(CUdeviceptr, *const c_void, usize, CUstream) -> R;
type PfnCopyDtoh = unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, CUstream) -> R;
type PfnStreamCreate = unsafe extern "C" fn(*mut CUstream, u32) -> R;
type PfnStream = unsafe extern "C" fn(CUstream) -> R;
type PfnStreamWaitEvent = unsafe extern "C" fn(CUstream, CUevent, u32) -> R;
type PfnEventCreate = unsafe extern "C" fn(*mut CUevent, u32) -> R;
type PfnEvent = unsafe extern "C" fn(CUevent) -> R;
type PfnEventRecord = unsafe extern "C" fn(CUevent, CUstream) -> R;
type PfnMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> R;
type PfnCtxSynchronize = unsafe extern "C" fn() -> R;

/// The driver functions the manager (and the hooks that serve allocations) use.
struct Fns {
    ctx_get_current: PfnCtxGetCurrent,
    ctx_set_current: PfnCtxSetCurrent,
    ctx_get_device: PfnCtxGetDevice,
    ctx_synchronize: PfnCtxSynchronize,
    address_reserve: PfnAddressReserve,
    address_free: PfnAddressFree,
    create: PfnCreate,
    release: PfnRelease,
    map: PfnMap,
    unmap: PfnUnmap,
    set_access: PfnSetAccess,
    copy_dtod: PfnCopyDtod,
    copy_htod: PfnCopyHtod,
    copy_dtoh: PfnCopyDtoh,
    stream_create: PfnStreamCreate,
    stream_destroy: PfnStream,
    stream_synchronize: PfnStream,
    stream_wait_event: PfnStreamWaitEvent,
    event_create: PfnEventCreate,
    event_destroy: PfnEvent,
    event_record: PfnEventRecord,
    event_query: PfnEvent,
    event_synchronize: PfnEvent,
    mem_get_info: PfnMemGetInfo,
}

/// [`Driver`] over the real driver, bound to one context.
pub struct RealMemoryDriver {
    f: Fns,
    ctx: usize,
    device: CUdevice,
}

// SAFETY: the driver API is thread-safe; the struct holds function pointers and integer
// copies of driver handles, which any thread may pass back to the driver.
unsafe impl Send for RealMemoryDriver {}
// SAFETY: as above; no method mutates the struct.
unsafe impl Sync for RealMemoryDriver {}

fn check(code: R) -> Result<(), R> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(code)
    }
}

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

impl RealMemoryDriver {
    /// The driver's functions, bound to the context current on this thread.
    pub fn for_current_context(real: &RealDriver) -> Result<Self, SetupError> {
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                let Ok(name) = CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes()) else {
                    return Err(SetupError::Missing($name));
                };
                // SAFETY: the real driver's function of this name has the C prototype `$ty`
                // (cuda.h), and the driver library is never unloaded.
                match unsafe { fn_ptr::<$ty>(real.symbol(name)) } {
                    Some(p) => p,
                    None => return Err(SetupError::Missing($name)),
                }
            }};
        }
        let f = Fns {
            ctx_get_current: sym!("cuCtxGetCurrent", PfnCtxGetCurrent),
            ctx_set_current: sym!("cuCtxSetCurrent", PfnCtxSetCurrent),
            ctx_get_device: sym!("cuCtxGetDevice", PfnCtxGetDevice),
            ctx_synchronize: sym!("cuCtxSynchronize", PfnCtxSynchronize),
            address_reserve: sym!("cuMemAddressReserve", PfnAddressReserve),
            address_free: sym!("cuMemAddressFree", PfnAddressFree),
            create: sym!("cuMemCreate", PfnCreate),
            release: sym!("cuMemRelease", PfnRelease),
            map: sym!("cuMemMap", PfnMap),
            unmap: sym!("cuMemUnmap", PfnUnmap),
            set_access: sym!("cuMemSetAccess", PfnSetAccess),
            copy_dtod: sym!("cuMemcpyDtoDAsync_v2", PfnCopyDtod),
            copy_htod: sym!("cuMemcpyHtoDAsync_v2", PfnCopyHtod),
            copy_dtoh: sym!("cuMemcpyDtoHAsync_v2", PfnCopyDtoh),
            stream_create: sym!("cuStreamCreate", PfnStreamCreate),
            stream_destroy: sym!("cuStreamDestroy_v2", PfnStream),
            stream_synchronize: sym!("cuStreamSynchronize", PfnStream),
            stream_wait_event: sym!("cuStreamWaitEvent", PfnStreamWaitEvent),
            event_create: sym!("cuEventCreate", PfnEventCreate),
            event_destroy: sym!("cuEventDestroy_v2", PfnEvent),
            event_record: sym!("cuEventRecord", PfnEventRecord),
            event_query: sym!("cuEventQuery", PfnEvent),
            event_synchronize: sym!("cuEventSynchronize", PfnEvent),
            mem_get_info: sym!("cuMemGetInfo_v2", PfnMemGetInfo),
        };
        let mut ctx: CUcontext = null_mut();
        // SAFETY: a valid out-pointer to a local.
        check(unsafe { (f.ctx_get_current)(&mut ctx) })
            .map_err(|e| SetupError::Driver("cuCtxGetCurrent", e))?;
        if ctx.is_null() {
            return Err(SetupError::NoContext);
        }
        let mut device: CUdevice = 0;
        // SAFETY: a valid out-pointer to a local; a context is current.
        check(unsafe { (f.ctx_get_device)(&mut device) })
            .map_err(|e| SetupError::Driver("cuCtxGetDevice", e))?;
        Ok(Self {
            f,
            ctx: ctx as usize,
            device,
        })
    }

    /// The context the manager's work runs in.
    pub fn context(&self) -> usize {
        self.ctx
    }

    /// The device ordinal of that context.
    pub fn device(&self) -> CUdevice {
        self.device
    }

    /// The context current on this thread (0: none, or the query failed).
    #[inline]
    pub fn current_context(&self) -> usize {
        let mut ctx: CUcontext = null_mut();
        // SAFETY: a valid out-pointer to a local.
        let r = unsafe { (self.f.ctx_get_current)(&mut ctx) };
        if r == CUDA_SUCCESS {
            ctx as usize
        } else {
            0
        }
    }

    /// `cuCtxSynchronize` of the manager's context (what a synchronous free implies).
    pub fn synchronize(&self) -> Result<(), R> {
        // SAFETY: no arguments; the context is made current by `in_context`.
        self.in_context(|| check(unsafe { (self.f.ctx_synchronize)() }))
    }

    /// Makes the manager's context current on the calling thread (for a thread of the
    /// shim's own, so that its calls need no switch).
    pub fn bind_current_thread(&self) -> Result<(), R> {
        // SAFETY: the context was current when this driver was made; see `in_context`.
        check(unsafe { (self.f.ctx_set_current)(self.ctx as CUcontext) })
    }

    /// Runs `call` with the manager's context current, restoring the caller's afterwards.
    #[inline]
    fn in_context<T>(&self, call: impl FnOnce() -> Result<T, R>) -> Result<T, R> {
        let previous = self.current_context();
        if previous == self.ctx {
            return call();
        }
        // by the shim; the application destroying it ends every use of its memory anyway.
        // SAFETY: the context was current when this driver was made and is never destroyed
        check(unsafe { (self.f.ctx_set_current)(self.ctx as CUcontext) })?;
        let result = call();
        // SAFETY: `previous` was current on this thread a moment ago (or null).
        let _ = unsafe { (self.f.ctx_set_current)(previous as CUcontext) };
        result
    }
}

fn location(loc: PhysLocation) -> CUmemLocation {
    match loc {
        PhysLocation::Device(id) => CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id,
        },
        PhysLocation::HostNuma(id) => CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_HOST_NUMA,
            id,
        },
    }
}

impl Driver for RealMemoryDriver {
    fn mem_address_reserve(&self, size: usize, alignment: usize) -> Result<CUdeviceptr, R> {
        let mut p: CUdeviceptr = 0;
        self.in_context(|| {
            // SAFETY: valid out-pointer; the driver validates the sizes.
            check(unsafe { (self.f.address_reserve)(&mut p, size, alignment, 0, 0) })
        })?;
        Ok(p)
    }

    fn mem_address_free(&self, ptr: CUdeviceptr, size: usize) -> Result<(), R> {
        // SAFETY: by-value arguments; the driver validates them.
        self.in_context(|| check(unsafe { (self.f.address_free)(ptr, size) }))
    }

    fn mem_create(&self, size: usize, loc: PhysLocation) -> Result<PhysHandle, R> {
        let prop = CUmemAllocationProp::pinned(location(loc));
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and a fully initialized property struct on the stack.
        self.in_context(|| check(unsafe { (self.f.create)(&mut h, size, &prop, 0) }))?;
        Ok(PhysHandle(h))
    }

    fn mem_release(&self, handle: PhysHandle) -> Result<(), R> {
        // SAFETY: by-value argument; the driver validates the handle.
        self.in_context(|| check(unsafe { (self.f.release)(handle.0) }))
    }

    fn mem_map(&self, ptr: CUdeviceptr, size: usize, off: usize, h: PhysHandle) -> Result<(), R> {
        // SAFETY: by-value arguments; the driver validates them.
        self.in_context(|| check(unsafe { (self.f.map)(ptr, size, off, h.0, 0) }))
    }

    fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> Result<(), R> {
        // SAFETY: by-value arguments; the driver validates them.
        self.in_context(|| check(unsafe { (self.f.unmap)(ptr, size) }))
    }

    fn mem_set_access(&self, ptr: CUdeviceptr, size: usize, device: i32) -> Result<(), R> {
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one valid descriptor on the stack, count 1.
        self.in_context(|| check(unsafe { (self.f.set_access)(ptr, size, &desc, 1) }))
    }

    fn memcpy_dtod_async(
        &self,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: usize,
        s: Stream,
    ) -> Result<(), R> {
        // SAFETY: device addresses only; the driver validates them.
        self.in_context(|| check(unsafe { (self.f.copy_dtod)(dst, src, n, s.0 as CUstream) }))
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: CUdeviceptr,
        src: *const u8,
        n: usize,
        s: Stream,
    ) -> Result<(), R> {
        self.in_context(|| {
            // SAFETY: the caller keeps `src..src+n` valid until the copy has executed.
            check(unsafe { (self.f.copy_htod)(dst, src.cast(), n, s.0 as CUstream) })
        })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: CUdeviceptr,
        n: usize,
        s: Stream,
    ) -> Result<(), R> {
        self.in_context(|| {
            // SAFETY: the caller keeps `dst..dst+n` valid and untouched until the copy executed.
            check(unsafe { (self.f.copy_dtoh)(dst.cast(), src, n, s.0 as CUstream) })
        })
    }

    fn stream_create(&self) -> Result<Stream, R> {
        let mut s: CUstream = null_mut();
        self.in_context(|| {
            // SAFETY: valid out-pointer.
            check(unsafe { (self.f.stream_create)(&mut s, CU_STREAM_NON_BLOCKING) })
        })?;
        Ok(Stream(s as usize))
    }

    fn stream_destroy(&self, stream: Stream) -> Result<(), R> {
        // SAFETY: a stream this driver created.
        self.in_context(|| check(unsafe { (self.f.stream_destroy)(stream.0 as CUstream) }))
    }

    fn stream_synchronize(&self, stream: Stream) -> Result<(), R> {
        // SAFETY: a stream handle; the driver validates it.
        self.in_context(|| check(unsafe { (self.f.stream_synchronize)(stream.0 as CUstream) }))
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<(), R> {
        self.in_context(|| {
            // SAFETY: handles; the driver validates them.
            check(unsafe {
                (self.f.stream_wait_event)(stream.0 as CUstream, event.0 as CUevent, 0)
            })
        })
    }

    fn event_create(&self) -> Result<Event, R> {
        let mut e: CUevent = null_mut();
        self.in_context(|| {
            // SAFETY: valid out-pointer.
            check(unsafe { (self.f.event_create)(&mut e, CU_EVENT_DISABLE_TIMING) })
        })?;
        Ok(Event(e as usize))
    }

    fn event_destroy(&self, event: Event) -> Result<(), R> {
        // SAFETY: an event this driver created.
        self.in_context(|| check(unsafe { (self.f.event_destroy)(event.0 as CUevent) }))
    }

    fn event_record(&self, event: Event, stream: Stream) -> Result<(), R> {
        self.in_context(|| {
            // SAFETY: handles; the driver validates them.
            check(unsafe { (self.f.event_record)(event.0 as CUevent, stream.0 as CUstream) })
        })
    }

    fn event_query(&self, event: Event) -> Result<bool, R> {
        // SAFETY: an event handle; the driver validates it.
        self.in_context(
            || match unsafe { (self.f.event_query)(event.0 as CUevent) } {
                CUDA_SUCCESS => Ok(true),
                CUDA_ERROR_NOT_READY => Ok(false),
                e => Err(e),
            },
        )
    }

    fn event_synchronize(&self, event: Event) -> Result<(), R> {
        // SAFETY: an event handle; the driver validates it.
        self.in_context(|| check(unsafe { (self.f.event_synchronize)(event.0 as CUevent) }))
    }

    fn mem_get_info(&self) -> Result<(usize, usize), R> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers to locals.
        self.in_context(|| check(unsafe { (self.f.mem_get_info)(&mut free, &mut total) }))?;
        Ok((free, total))
    }
}
