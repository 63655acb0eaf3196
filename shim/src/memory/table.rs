//! [`Driver`] over a table of the driver's own function pointers, whoever looked them up.
//!
//! Two implementations share this: [`super::cuda::DlDriver`] (pointers from `dlsym` on a
//! `dlopen`ed `libcuda.so`, for tests) and `crate::real_memory::RealMemoryDriver` (pointers
//! from the shim's real driver table inside `libtensile.so`, where plain `dlsym` would hand
//! out the shim's own wrappers). What differs between them is where the pointers come from
//! (the lookup given to [`MemFns::resolve`]) and how a call gets its context current
//! ([`InContext`]); the calls and their result checks are written here once.
//!
//! Not here: loading a library, choosing or retaining a context.
//!
//! # Invariants
//! - Every pointer in [`MemFns`] is the driver's function of the exact versioned name it was
//!   resolved by, whose C prototype its Rust type spells out (from `cuda.h`), and the library
//!   is never unloaded, so the pointers stay valid for the process's life.

use std::ffi::{c_void, CStr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};

use tensile_driver_abi::{
    CUdeviceptr, CUevent, CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle,
    CUmemLocation, CUresult, CUstream, CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CU_EVENT_DISABLE_TIMING,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST_NUMA, CU_STREAM_NON_BLOCKING,
};

use super::driver::{Driver, Event, PhysHandle, PhysLocation, Stream};

type R = CUresult;

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
type PfnGetGranularity = unsafe extern "C" fn(*mut usize, *const CUmemAllocationProp, u32) -> R;
type PfnExportToShareable =
    unsafe extern "C" fn(*mut c_void, CUmemGenericAllocationHandle, u32, u64) -> R;
type PfnImportFromShareable =
    unsafe extern "C" fn(*mut CUmemGenericAllocationHandle, *mut c_void, u32) -> R;

/// The function named `$name` (a string literal) found by `$lookup` (a
/// `FnMut(&CStr) -> *mut c_void`), as the function pointer type the context expects, or
/// `Err($name)` when the driver lacks it.
///
/// Use it only where `$lookup` returns null or the address of the driver function of the
/// name asked for, valid for the process's life, and the expected type is that function's
/// C prototype.
macro_rules! resolve {
    ($lookup:expr, $name:literal) => {{
        match ::std::ffi::CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes()) {
            // SAFETY: by this macro's contract, null or the driver's function `$name`, whose
            // prototype is the type asked for.
            Ok(name) => unsafe { $crate::real::fn_ptr($lookup(name)) }.ok_or($name),
            Err(_) => Err($name),
        }
    }};
}
pub(crate) use resolve;

/// The driver entry points the memory manager uses.
pub struct MemFns {
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
    granularity: PfnGetGranularity,
    /// `cuMemExportToShareableHandle` and `cuMemImportFromShareableHandle` (CUDA 10.2; only
    /// memory shared with other processes needs them).
    export_shareable: Option<PfnExportToShareable>,
    import_shareable: Option<PfnImportFromShareable>,
    /// Set once the driver refused a shareable device unit: units are made plain after.
    unshareable: AtomicBool,
}

impl MemFns {
    /// Looks every entry point up with `lookup`; the error names the first one missing.
    ///
    /// # Safety
    /// `lookup(name)` must return null or the address of the driver's function `name`,
    /// valid for the life of the process.
    pub unsafe fn resolve(
        mut lookup: impl FnMut(&CStr) -> *mut c_void,
    ) -> Result<Self, &'static str> {
        Ok(Self {
            address_reserve: resolve!(lookup, "cuMemAddressReserve")?,
            address_free: resolve!(lookup, "cuMemAddressFree")?,
            create: resolve!(lookup, "cuMemCreate")?,
            release: resolve!(lookup, "cuMemRelease")?,
            map: resolve!(lookup, "cuMemMap")?,
            unmap: resolve!(lookup, "cuMemUnmap")?,
            set_access: resolve!(lookup, "cuMemSetAccess")?,
            copy_dtod: resolve!(lookup, "cuMemcpyDtoDAsync_v2")?,
            copy_htod: resolve!(lookup, "cuMemcpyHtoDAsync_v2")?,
            copy_dtoh: resolve!(lookup, "cuMemcpyDtoHAsync_v2")?,
            stream_create: resolve!(lookup, "cuStreamCreate")?,
            stream_destroy: resolve!(lookup, "cuStreamDestroy_v2")?,
            stream_synchronize: resolve!(lookup, "cuStreamSynchronize")?,
            stream_wait_event: resolve!(lookup, "cuStreamWaitEvent")?,
            event_create: resolve!(lookup, "cuEventCreate")?,
            event_destroy: resolve!(lookup, "cuEventDestroy_v2")?,
            event_record: resolve!(lookup, "cuEventRecord")?,
            event_query: resolve!(lookup, "cuEventQuery")?,
            event_synchronize: resolve!(lookup, "cuEventSynchronize")?,
            mem_get_info: resolve!(lookup, "cuMemGetInfo_v2")?,
            granularity: resolve!(lookup, "cuMemGetAllocationGranularity")?,
            export_shareable: resolve!(lookup, "cuMemExportToShareableHandle").ok(),
            import_shareable: resolve!(lookup, "cuMemImportFromShareableHandle").ok(),
            unshareable: AtomicBool::new(false),
        })
    }
}

/// How a [`TableDriver`] gets the right context current for each driver call.
pub trait InContext: Send + Sync {
    /// Runs `call` (one driver call) with the context current.
    fn in_context<T>(&self, call: impl FnOnce() -> Result<T, R>) -> Result<T, R>;
}

/// [`Driver`] over [`MemFns`], each call made in the context `C` provides.
pub struct TableDriver<C> {
    pub(crate) f: MemFns,
    pub(crate) context: C,
}

/// `Ok` for `CUDA_SUCCESS`, the code otherwise.
pub fn check(code: R) -> Result<(), R> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(code)
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

impl<C: InContext> TableDriver<C> {
    /// Runs `call` in the driver's context.
    #[inline]
    fn run<T>(&self, call: impl FnOnce() -> Result<T, R>) -> Result<T, R> {
        self.context.in_context(call)
    }
}

impl<C: InContext> Driver for TableDriver<C> {
    fn mem_address_reserve(&self, size: usize, alignment: usize) -> Result<CUdeviceptr, R> {
        let mut p: CUdeviceptr = 0;
        self.run(|| {
            // SAFETY: valid out-pointer; the driver validates the sizes.
            check(unsafe { (self.f.address_reserve)(&mut p, size, alignment, 0, 0) })
        })?;
        Ok(p)
    }

    fn mem_address_free(&self, ptr: CUdeviceptr, size: usize) -> Result<(), R> {
        // SAFETY: by-value arguments; the driver validates them.
        self.run(|| check(unsafe { (self.f.address_free)(ptr, size) }))
    }

    fn mem_create(&self, size: usize, loc: PhysLocation) -> Result<PhysHandle, R> {
        let mut prop = CUmemAllocationProp::pinned(location(loc));
        let mut h: CUmemGenericAllocationHandle = 0;
        if matches!(loc, PhysLocation::Device(_)) && !self.f.unshareable.load(Ordering::Relaxed) {
            // Any device unit may come to back memory shared with another process
            // (`crate::ipc`); PyTorch's expandable segments ask the same of every segment.
            prop.requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            // SAFETY: valid out-pointer and a fully initialized property struct on the stack.
            match self.run(|| check(unsafe { (self.f.create)(&mut h, size, &prop, 0) })) {
                Ok(()) => return Ok(PhysHandle(h)),
                Err(code) if code == CUDA_ERROR_OUT_OF_MEMORY => return Err(code),
                Err(code) => {
                    // A driver that cannot make shareable memory (not known on Linux, but
                    // refusing every unit would stop the manager): plain units from now on,
                    // whose export is then refused.
                    if !self.f.unshareable.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "tensile: the driver refused device memory exportable as a file \
                             descriptor (error {code}); sharing arena memory with other \
                             processes through CUDA IPC will be refused"
                        );
                    }
                    prop.requested_handle_types = 0;
                }
            }
        }
        // SAFETY: valid out-pointer and a fully initialized property struct on the stack.
        self.run(|| check(unsafe { (self.f.create)(&mut h, size, &prop, 0) }))?;
        Ok(PhysHandle(h))
    }

    fn mem_release(&self, handle: PhysHandle) -> Result<(), R> {
        // SAFETY: by-value argument; the driver validates the handle.
        self.run(|| check(unsafe { (self.f.release)(handle.0) }))
    }

    fn mem_map(&self, ptr: CUdeviceptr, size: usize, off: usize, h: PhysHandle) -> Result<(), R> {
        // SAFETY: by-value arguments; the driver validates them.
        self.run(|| check(unsafe { (self.f.map)(ptr, size, off, h.0, 0) }))
    }

    fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> Result<(), R> {
        // SAFETY: by-value arguments; the driver validates them.
        self.run(|| check(unsafe { (self.f.unmap)(ptr, size) }))
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
        self.run(|| check(unsafe { (self.f.set_access)(ptr, size, &desc, 1) }))
    }

    fn memcpy_dtod_async(
        &self,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: usize,
        s: Stream,
    ) -> Result<(), R> {
        // SAFETY: device addresses only; the driver validates them.
        self.run(|| check(unsafe { (self.f.copy_dtod)(dst, src, n, s.0 as CUstream) }))
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: CUdeviceptr,
        src: *const u8,
        n: usize,
        s: Stream,
    ) -> Result<(), R> {
        self.run(|| {
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
        self.run(|| {
            // SAFETY: the caller keeps `dst..dst+n` valid and untouched until the copy executed.
            check(unsafe { (self.f.copy_dtoh)(dst.cast(), src, n, s.0 as CUstream) })
        })
    }

    fn stream_create(&self) -> Result<Stream, R> {
        let mut s: CUstream = null_mut();
        self.run(|| {
            // SAFETY: valid out-pointer.
            check(unsafe { (self.f.stream_create)(&mut s, CU_STREAM_NON_BLOCKING) })
        })?;
        Ok(Stream(s as usize))
    }

    fn stream_destroy(&self, stream: Stream) -> Result<(), R> {
        // SAFETY: by-value handle; the driver validates it.
        self.run(|| check(unsafe { (self.f.stream_destroy)(stream.0 as CUstream) }))
    }

    fn stream_synchronize(&self, stream: Stream) -> Result<(), R> {
        // SAFETY: by-value handle; the driver validates it.
        self.run(|| check(unsafe { (self.f.stream_synchronize)(stream.0 as CUstream) }))
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<(), R> {
        self.run(|| {
            // SAFETY: by-value handles; the driver validates them.
            check(unsafe {
                (self.f.stream_wait_event)(stream.0 as CUstream, event.0 as CUevent, 0)
            })
        })
    }

    fn event_create(&self) -> Result<Event, R> {
        let mut e: CUevent = null_mut();
        self.run(|| {
            // SAFETY: valid out-pointer.
            check(unsafe { (self.f.event_create)(&mut e, CU_EVENT_DISABLE_TIMING) })
        })?;
        Ok(Event(e as usize))
    }

    fn event_destroy(&self, event: Event) -> Result<(), R> {
        // SAFETY: by-value handle; the driver validates it.
        self.run(|| check(unsafe { (self.f.event_destroy)(event.0 as CUevent) }))
    }

    fn event_record(&self, event: Event, stream: Stream) -> Result<(), R> {
        self.run(|| {
            // SAFETY: by-value handles; the driver validates them.
            check(unsafe { (self.f.event_record)(event.0 as CUevent, stream.0 as CUstream) })
        })
    }

    fn event_query(&self, event: Event) -> Result<bool, R> {
        // SAFETY: by-value handle; the driver validates it.
        self.run(
            || match unsafe { (self.f.event_query)(event.0 as CUevent) } {
                CUDA_SUCCESS => Ok(true),
                CUDA_ERROR_NOT_READY => Ok(false),
                code => Err(code),
            },
        )
    }

    fn event_synchronize(&self, event: Event) -> Result<(), R> {
        // SAFETY: by-value handle; the driver validates it.
        self.run(|| check(unsafe { (self.f.event_synchronize)(event.0 as CUevent) }))
    }

    fn mem_get_info(&self) -> Result<(usize, usize), R> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers to locals.
        self.run(|| check(unsafe { (self.f.mem_get_info)(&mut free, &mut total) }))?;
        Ok((free, total))
    }

    fn mem_export_fd(&self, handle: PhysHandle) -> Result<OwnedFd, R> {
        let export = self.f.export_shareable.ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
        let mut fd: i32 = -1;
        self.run(|| {
            // SAFETY: for a POSIX file descriptor the driver writes an `int` through the
            // pointer, which points to a local one.
            check(unsafe {
                export(
                    (&mut fd as *mut i32).cast(),
                    handle.0,
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            })
        })?;
        if fd < 0 {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: the driver returned a new descriptor, which the caller owns from now on.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn mem_import_fd(&self, fd: BorrowedFd<'_>) -> Result<PhysHandle, R> {
        let import = self.f.import_shareable.ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
        let mut h: CUmemGenericAllocationHandle = 0;
        // For a POSIX file descriptor the driver takes the descriptor's value as the pointer.
        let os_handle = fd.as_raw_fd() as usize as *mut c_void;
        self.run(|| {
            // SAFETY: a valid out-pointer; the descriptor stays open for the call.
            check(unsafe { import(&mut h, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) })
        })?;
        Ok(PhysHandle(h))
    }

    fn mem_granularity(&self, loc: PhysLocation) -> Result<usize, R> {
        let prop = CUmemAllocationProp::pinned(location(loc));
        let mut g = 0usize;
        // SAFETY: valid out-pointer and a fully initialized property struct on the stack;
        // option 0 is CU_MEM_ALLOC_GRANULARITY_MINIMUM.
        self.run(|| check(unsafe { (self.f.granularity)(&mut g, &prop, 0) }))?;
        Ok(g)
    }
}
