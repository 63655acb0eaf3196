//! [`Driver`](super::Driver) over a `libcuda.so.1` loaded with `dlopen`: the real driver or the simulated GPU.
//!
//! This is how the manager is tested against the simulated GPU (`tests/simgpu`) and, on a
//! machine with one, against the real driver, without the interposition layer. It is not the
//! driver table of `libtensile.so`: inside the interposer, `dlsym` is overridden and the real
//! entry points come from the shim's own table (`crate::real_memory`).
//!
//! The calls themselves are [`super::table`]'s, shared with the interposer's driver; this
//! module only loads the library, looks the functions up and keeps the context current.
//!
//! # Invariants
//! - Every function pointer was returned by `dlsym` on the library handle for the exact
//!   versioned symbol whose C prototype its Rust type spells out (from `cuda.h`), and the
//!   library is never unloaded, so the pointers stay valid for the process's life.
//! - Every call is made with the primary context of the device current on the calling thread
//!   ([`PrimaryContext`]), as the driver requires.

use std::cell::Cell;
use std::ffi::{c_void, CStr, CString};

use tensile_driver_abi::{CUcontext, CUdevice, CUresult};

use super::table::{check, resolve, InContext, MemFns, TableDriver};

type R = CUresult;

/// The driver entry points used to set up and select the context, with their C prototypes
/// (the memory operations are in [`MemFns`]).
type PfnInit = unsafe extern "C" fn(u32) -> R;
type PfnDeviceGet = unsafe extern "C" fn(*mut CUdevice, i32) -> R;
type PfnPrimaryCtxRetain = unsafe extern "C" fn(*mut CUcontext, CUdevice) -> R;
type PfnCtxSetCurrent = unsafe extern "C" fn(CUcontext) -> R;

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

/// The primary context of one device, made current on a thread before its first call.
pub struct PrimaryContext {
    ctx_set_current: PfnCtxSetCurrent,
    ctx: usize,
    device: CUdevice,
}

/// A dynamically loaded driver with the primary context of one device.
pub type DlDriver = TableDriver<PrimaryContext>;

thread_local! {
    /// The context this thread last made current through a `DlDriver` (0: none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

impl InContext for PrimaryContext {
    /// Makes the primary context current on this thread if this driver has not yet.
    fn in_context<T>(&self, call: impl FnOnce() -> Result<T, R>) -> Result<T, R> {
        if CURRENT.get() != self.ctx {
            // SAFETY: `ctx` is the primary context retained in `open`, never released.
            check(unsafe { (self.ctx_set_current)(self.ctx as CUcontext) })?;
            CURRENT.set(self.ctx);
        }
        call()
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
        let lookup = |name: &CStr| -> *mut c_void {
            // SAFETY: `lib` is a live handle, never closed, and `name` is NUL-terminated.
            unsafe { libc::dlsym(lib, name.as_ptr()) }
        };
        let missing = OpenError::MissingSymbol;
        let init: PfnInit = resolve!(lookup, "cuInit").map_err(missing)?;
        let device_get: PfnDeviceGet = resolve!(lookup, "cuDeviceGet").map_err(missing)?;
        let primary_ctx_retain: PfnPrimaryCtxRetain =
            resolve!(lookup, "cuDevicePrimaryCtxRetain").map_err(missing)?;
        let ctx_set_current: PfnCtxSetCurrent =
            resolve!(lookup, "cuCtxSetCurrent").map_err(missing)?;
        // SAFETY: `lookup` returns null or the library's function of the name asked for.
        let f = unsafe { MemFns::resolve(lookup) }.map_err(missing)?;
        // SAFETY: plain driver calls with valid out-pointers to locals.
        unsafe {
            check(init(0)).map_err(|e| OpenError::Driver("cuInit", e))?;
            let mut device: CUdevice = 0;
            check(device_get(&mut device, ordinal))
                .map_err(|e| OpenError::Driver("cuDeviceGet", e))?;
            let mut ctx: CUcontext = std::ptr::null_mut();
            check(primary_ctx_retain(&mut ctx, device))
                .map_err(|e| OpenError::Driver("cuDevicePrimaryCtxRetain", e))?;
            Ok(TableDriver {
                f,
                context: PrimaryContext {
                    ctx_set_current,
                    ctx: ctx as usize,
                    device,
                },
            })
        }
    }

    /// The device ordinal's handle (for `PhysLocation::Device`).
    pub fn device(&self) -> CUdevice {
        self.context.device
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
    use crate::memory::{Driver, ManagerConfig, MemoryManager, ResidencyState};

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
