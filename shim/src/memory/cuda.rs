//! [`Driver`] over a `libcuda.so.1` loaded with `dlopen`: the real driver or the simulated GPU.
//!
//! This is how the manager is tested against the simulated GPU (`tests/simgpu`) and, on a
//! machine with one, against the real driver, without the interposition layer. It is not the
//! driver table of `libtensile.so`: inside the interposer, `dlsym` is overridden and the real
//! entry points come from the shim's own table, which implements [`Driver`] itself.
//!
//! # Invariants
//! - Every function pointer in [`Fns`] was returned by `dlsym` on the library handle for the
//!   exact versioned symbol whose C prototype its Rust type spells out (from `cuda.h`), and
//!   the library is never unloaded, so the pointers stay valid for the process's life.
//! - Every call is made with the primary context of the device current on the calling thread
//!   ([`DlDriver::ensure_context`]), as the driver requires.

use std::cell::Cell;
use std::ffi::{c_void, CStr, CString};

use tensile_driver_abi::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUmemAccessDesc, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUmemLocation, CUresult, CUstream, CUDA_ERROR_NOT_READY,
    CUDA_SUCCESS, CU_EVENT_DISABLE_TIMING, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST_NUMA, CU_STREAM_NON_BLOCKING,
};

use super::driver::{Driver, Event, PhysHandle, PhysLocation, Stream};

type R = CUresult;

/// The driver entry points used, with their C prototypes.
type PfnInit = unsafe extern "C" fn(u32) -> R;
type PfnDeviceGet = unsafe extern "C" fn(*mut CUdevice, i32) -> R;
type PfnPrimaryCtxRetain = unsafe extern "C" fn(*mut CUcontext, CUdevice) -> R;
type PfnCtxSetCurrent = unsafe extern "C" fn(CUcontext) -> R;
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
type PfnStreamDestroy = unsafe extern "C" fn(CUstream) -> R;
type PfnStreamSynchronize = unsafe extern "C" fn(CUstream) -> R;
type PfnStreamWaitEvent = unsafe extern "C" fn(CUstream, CUevent, u32) -> R;
type PfnEventCreate = unsafe extern "C" fn(*mut CUevent, u32) -> R;
type PfnEventDestroy = unsafe extern "C" fn(CUevent) -> R;
type PfnEventRecord = unsafe extern "C" fn(CUevent, CUstream) -> R;
type PfnEventQuery = unsafe extern "C" fn(CUevent) -> R;
type PfnEventSynchronize = unsafe extern "C" fn(CUevent) -> R;
type PfnMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> R;

/// The driver entry points used.
struct Fns {
    init: PfnInit,
    device_get: PfnDeviceGet,
    primary_ctx_retain: PfnPrimaryCtxRetain,
    ctx_set_current: PfnCtxSetCurrent,
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
    stream_destroy: PfnStreamDestroy,
    stream_synchronize: PfnStreamSynchronize,
    stream_wait_event: PfnStreamWaitEvent,
    event_create: PfnEventCreate,
    event_destroy: PfnEventDestroy,
    event_record: PfnEventRecord,
    event_query: PfnEventQuery,
    event_synchronize: PfnEventSynchronize,
    mem_get_info: PfnMemGetInfo,
}

/// Why the library could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// `dlopen` failed; the text is `dlerror()`'s.
    Load(String),
    MissingSymbol(&'static str),
    /// A driver call during initialization failed.
    Driver(&'static str, CUresult),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Load(e) => write!(f, "cannot load the driver: {e}"),
            OpenError::MissingSymbol(s) => write!(f, "the driver has no `{s}`"),
            OpenError::Driver(call, code) => write!(f, "{call} failed with error {code}"),
        }
    }
}

/// A dynamically loaded driver with the primary context of one device.
pub struct DlDriver {
    f: Fns,
    ctx: usize,
    device: CUdevice,
}

// SAFETY: the driver API is thread-safe; the struct holds only function pointers and
// integer copies of driver handles, which any thread may pass back to the driver.
unsafe impl Send for DlDriver {}
// SAFETY: as above; no method mutates the struct.
unsafe impl Sync for DlDriver {}

thread_local! {
    /// The context this thread last made current through a `DlDriver` (0: none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

fn check(code: R) -> Result<(), R> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(code)
    }
}

impl DlDriver {
    /// Loads `path` (a file name searched the usual way, or a path), initializes the driver and
    /// retains the primary context of `ordinal`.
    pub fn open(path: &str, ordinal: i32) -> Result<Self, OpenError> {
        let c_path = CString::new(path).map_err(|_| OpenError::Load("bad path".into()))?;
        // SAFETY: `c_path` is a valid C string; dlopen has no other precondition.
        let lib = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            // SAFETY: dlerror returns null or a valid C string owned by libc.
            let msg = unsafe { libc::dlerror() };
            let text = if msg.is_null() {
                "unknown error".to_string()
            } else {
                // SAFETY: non-null, valid C string (checked just above).
                unsafe { CStr::from_ptr(msg) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(OpenError::Load(text));
        }
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                let name = concat!($name, "\0");
                // SAFETY: `lib` is a live handle and `name` is NUL-terminated.
                let p = unsafe { libc::dlsym(lib, name.as_ptr().cast()) };
                if p.is_null() {
                    return Err(OpenError::MissingSymbol($name));
                }
                // SAFETY: `p` is the address of the driver function `$name`, whose C
                // prototype is the field type this value is stored in (see `Fns`).
                unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
            }};
        }
        let f = Fns {
            init: sym!("cuInit", PfnInit),
            device_get: sym!("cuDeviceGet", PfnDeviceGet),
            primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain", PfnPrimaryCtxRetain),
            ctx_set_current: sym!("cuCtxSetCurrent", PfnCtxSetCurrent),
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
            stream_destroy: sym!("cuStreamDestroy_v2", PfnStreamDestroy),
            stream_synchronize: sym!("cuStreamSynchronize", PfnStreamSynchronize),
            stream_wait_event: sym!("cuStreamWaitEvent", PfnStreamWaitEvent),
            event_create: sym!("cuEventCreate", PfnEventCreate),
            event_destroy: sym!("cuEventDestroy_v2", PfnEventDestroy),
            event_record: sym!("cuEventRecord", PfnEventRecord),
            event_query: sym!("cuEventQuery", PfnEventQuery),
            event_synchronize: sym!("cuEventSynchronize", PfnEventSynchronize),
            mem_get_info: sym!("cuMemGetInfo_v2", PfnMemGetInfo),
        };
        // SAFETY: plain driver calls with valid out-pointers to locals.
        unsafe {
            check((f.init)(0)).map_err(|e| OpenError::Driver("cuInit", e))?;
            let mut device: CUdevice = 0;
            check((f.device_get)(&mut device, ordinal))
                .map_err(|e| OpenError::Driver("cuDeviceGet", e))?;
            let mut ctx: CUcontext = std::ptr::null_mut();
            check((f.primary_ctx_retain)(&mut ctx, device))
                .map_err(|e| OpenError::Driver("cuDevicePrimaryCtxRetain", e))?;
            Ok(Self {
                f,
                ctx: ctx as usize,
                device,
            })
        }
    }

    /// Makes the primary context current on this thread if this driver has not yet.
    fn ensure_context(&self) -> Result<(), R> {
        if CURRENT.get() == self.ctx {
            return Ok(());
        }
        // SAFETY: `ctx` is the primary context retained in `open`, never released.
        check(unsafe { (self.f.ctx_set_current)(self.ctx as CUcontext) })?;
        CURRENT.set(self.ctx);
        Ok(())
    }

    /// The device ordinal's handle (for `PhysLocation::Device`).
    pub fn device(&self) -> CUdevice {
        self.device
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

impl Driver for DlDriver {
    fn mem_address_reserve(&self, size: usize, alignment: usize) -> Result<CUdeviceptr, R> {
        self.ensure_context()?;
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the driver validates the sizes.
        check(unsafe { (self.f.address_reserve)(&mut p, size, alignment, 0, 0) })?;
        Ok(p)
    }

    fn mem_address_free(&self, ptr: CUdeviceptr, size: usize) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: by-value arguments; the driver validates them.
        check(unsafe { (self.f.address_free)(ptr, size) })
    }

    fn mem_create(&self, size: usize, loc: PhysLocation) -> Result<PhysHandle, R> {
        self.ensure_context()?;
        let prop = CUmemAllocationProp::pinned(location(loc));
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and a fully initialized property struct on the stack.
        check(unsafe { (self.f.create)(&mut h, size, &prop, 0) })?;
        Ok(PhysHandle(h))
    }

    fn mem_release(&self, handle: PhysHandle) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: by-value argument; the driver validates the handle.
        check(unsafe { (self.f.release)(handle.0) })
    }

    fn mem_map(&self, ptr: CUdeviceptr, size: usize, off: usize, h: PhysHandle) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: by-value arguments; the driver validates them.
        check(unsafe { (self.f.map)(ptr, size, off, h.0, 0) })
    }

    fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: by-value arguments; the driver validates them.
        check(unsafe { (self.f.unmap)(ptr, size) })
    }

    fn mem_set_access(&self, ptr: CUdeviceptr, size: usize, device: i32) -> Result<(), R> {
        self.ensure_context()?;
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one valid descriptor on the stack, count 1.
        check(unsafe { (self.f.set_access)(ptr, size, &desc, 1) })
    }

    fn memcpy_dtod_async(
        &self,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: usize,
        s: Stream,
    ) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: device addresses only; the driver validates them.
        check(unsafe { (self.f.copy_dtod)(dst, src, n, s.0 as CUstream) })
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: CUdeviceptr,
        src: *const u8,
        n: usize,
        s: Stream,
    ) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: the caller keeps `src..src+n` valid until the copy has executed.
        check(unsafe { (self.f.copy_htod)(dst, src.cast(), n, s.0 as CUstream) })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: CUdeviceptr,
        n: usize,
        s: Stream,
    ) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: the caller keeps `dst..dst+n` valid and untouched until the copy executed.
        check(unsafe { (self.f.copy_dtoh)(dst.cast(), src, n, s.0 as CUstream) })
    }

    fn stream_create(&self) -> Result<Stream, R> {
        self.ensure_context()?;
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { (self.f.stream_create)(&mut s, CU_STREAM_NON_BLOCKING) })?;
        Ok(Stream(s as usize))
    }

    fn stream_destroy(&self, s: Stream) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: by-value handle; the driver validates it.
        check(unsafe { (self.f.stream_destroy)(s.0 as CUstream) })
    }

    fn stream_synchronize(&self, s: Stream) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: by-value handle; the driver validates it.
        check(unsafe { (self.f.stream_synchronize)(s.0 as CUstream) })
    }

    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: by-value handles; the driver validates them.
        check(unsafe { (self.f.stream_wait_event)(s.0 as CUstream, e.0 as CUevent, 0) })
    }

    fn event_create(&self) -> Result<Event, R> {
        self.ensure_context()?;
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { (self.f.event_create)(&mut e, CU_EVENT_DISABLE_TIMING) })?;
        Ok(Event(e as usize))
    }

    fn event_destroy(&self, e: Event) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: by-value handle; the driver validates it.
        check(unsafe { (self.f.event_destroy)(e.0 as CUevent) })
    }

    fn event_record(&self, e: Event, s: Stream) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: by-value handles; the driver validates them.
        check(unsafe { (self.f.event_record)(e.0 as CUevent, s.0 as CUstream) })
    }

    fn event_query(&self, e: Event) -> Result<bool, R> {
        self.ensure_context()?;
        // SAFETY: by-value handle; the driver validates it.
        match unsafe { (self.f.event_query)(e.0 as CUevent) } {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(code),
        }
    }

    fn event_synchronize(&self, e: Event) -> Result<(), R> {
        self.ensure_context()?;
        // SAFETY: by-value handle; the driver validates it.
        check(unsafe { (self.f.event_synchronize)(e.0 as CUevent) })
    }

    fn mem_get_info(&self) -> Result<(usize, usize), R> {
        self.ensure_context()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        check(unsafe { (self.f.mem_get_info)(&mut free, &mut total) })?;
        Ok((free, total))
    }
}

/// The simulated GPU's `libcuda.so` built in this workspace, if it has been built
/// (`cargo build -p tensile-simgpu`): next to the test binary's target directory, or named
/// by `TENSILE_SIMGPU_LIB`.
pub fn find_simgpu() -> Option<std::path::PathBuf> {
    if let Ok(p) = std::env::var("TENSILE_SIMGPU_LIB") {
        return Some(p.into());
    }
    let exe = std::env::current_exe().ok()?;
    // target/<profile>/deps/<test binary> → target/<profile>/libcuda.so
    let profile_dir = exe.parent()?.parent()?;
    let lib = profile_dir.join("libcuda.so");
    lib.exists().then_some(lib)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::memory::{ManagerConfig, MemoryManager, ResidencyState};

    const MIB: usize = 1 << 20;

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| seed.wrapping_mul(29).wrapping_add((i % 253) as u8))
            .collect()
    }

    /// The manager on the simulated GPU: 4x the budget of data written and read back through
    /// real VMM mappings (memfd-backed), two streams, frees of swapped buffers.
    #[test]
    fn swaps_on_the_simulated_gpu_without_losing_a_byte() {
        let Some(lib) = find_simgpu() else {
            eprintln!(
                "SKIPPED: the simulated GPU is not built (cargo build -p tensile-simgpu, or set \
                 TENSILE_SIMGPU_LIB to its libcuda.so)"
            );
            return;
        };
        swap_round_trip(&lib.to_string_lossy(), 0);
    }

    /// The same on a real GPU, when asked to (`TENSILE_TEST_REAL_GPU=1`): the system's
    /// `libcuda.so.1`, so the VMM assumptions (host-NUMA frames mapped at two addresses,
    /// copies between them, per-page remaps) are checked on the hardware.
    #[test]
    fn swaps_on_a_real_gpu_when_asked() {
        if std::env::var("TENSILE_TEST_REAL_GPU").as_deref() != Ok("1") {
            eprintln!("SKIPPED: set TENSILE_TEST_REAL_GPU=1 to run on the machine's GPU");
            return;
        }
        // The real driver takes some device memory of its own for streams and events.
        swap_round_trip("libcuda.so.1", 64 * MIB);
    }

    /// `slack`: device memory the driver may use beyond what the manager creates.
    fn swap_round_trip(lib: &str, slack: usize) {
        let drv = match DlDriver::open(lib, 0) {
            Ok(d) => Arc::new(d),
            Err(e) => panic!("the driver {lib} did not load: {e}"),
        };
        let budget = 8 * MIB;
        let mut cfg = ManagerConfig::new(budget, 256 * MIB);
        cfg.arena_bytes = 1 << 30;
        cfg.device_chunk_bytes = 4 * MIB;
        cfg.host_chunk_bytes = 16 * MIB;
        cfg.evict_batch = 2;
        let (free0, _) = drv.mem_get_info().unwrap();
        let mm = MemoryManager::new(drv.clone(), cfg).unwrap();
        let streams = [drv.stream_create().unwrap(), drv.stream_create().unwrap()];
        let n = 8;
        let size = 4 * MIB - 1000;
        let bufs: Vec<_> = (0..n)
            .map(|i| mm.alloc(size, Some(streams[i % 2])).unwrap())
            .collect();
        let data: Vec<Vec<u8>> = (0..n).map(|i| pattern(i as u8, size)).collect();
        for (i, &b) in bufs.iter().enumerate() {
            let s = streams[i % 2];
            let t = mm.prepare_access(s, &[(b, size)]).unwrap();
            // SAFETY: `data` outlives the stream synchronize below.
            unsafe { drv.memcpy_htod_async(b, data[i].as_ptr(), size, s) }.unwrap();
            mm.note_access_done(t).unwrap();
            let (free, _) = drv.mem_get_info().unwrap();
            assert!(
                free0.saturating_sub(free) <= budget + slack,
                "the process holds more than its budget"
            );
        }
        // The first buffers left the device; a direct read of one still sees its bytes.
        assert!(matches!(
            mm.residency(bufs[0]),
            Some(ResidencyState::Host(_))
        ));
        for s in streams {
            drv.stream_synchronize(s).unwrap();
        }
        mm.free(bufs[1], Some(streams[0])).unwrap();
        for (i, &b) in bufs.iter().enumerate().rev().filter(|&(i, _)| i != 1) {
            let s = streams[(i + 1) % 2];
            let mut out = vec![0u8; size];
            let t = mm.prepare_access(s, &[(b, size)]).unwrap();
            // SAFETY: `out` lives until after the synchronize and is not touched before it.
            unsafe { drv.memcpy_dtoh_async(out.as_mut_ptr(), b, size, s) }.unwrap();
            mm.note_access_done(t).unwrap();
            drv.stream_synchronize(s).unwrap();
            assert!(out == data[i], "buffer {i} came back different");
        }
        let st = mm.stats();
        assert!(st.bytes_to_host >= (n * 4 * MIB - budget) as u64, "{st:?}");
        assert!(st.peak_resident_bytes <= budget as u64);
        drop(mm);
        for s in streams {
            drv.stream_destroy(s).unwrap();
        }
        let (free, _) = drv.mem_get_info().unwrap();
        assert!(free + slack >= free0, "everything went back to the device");
    }
}
