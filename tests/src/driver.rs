//! How the test workloads reach the driver: the ways real programs do.
//!
//! - [`Lookup::ProcAddress`]: `dlopen("libcuda.so.1")`, `dlsym(h, "cuGetProcAddress_v2")`,
//!   then every entry point by *base name* with a CUDA version and flags (libcudart,
//!   cuBLAS, cuBLASLt and cuDNN do this).
//! - [`Lookup::Dlsym`]: `dlsym(h, "<versioned name>")` for every entry point (cuBLAS does
//!   this for ~80 names; `cudarc` for all).
//! - [`Lookup::DefaultScope`]: `dlopen` with `RTLD_GLOBAL`, then `dlsym(RTLD_DEFAULT, ..)`:
//!   the same global-scope search the dynamic linker does for a program linked against
//!   libcuda, so the preloaded exports win exactly as they would at link time.
//!
//! Nothing here knows about libtensile; the workloads are ordinary driver programs.

use std::ffi::{c_char, c_uint, c_void, CString};

use tensile_driver_abi::*;

/// How entry points are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    ProcAddress { version: i32, flags: u64 },
    Dlsym { version: i32, flags: u64 },
    DefaultScope { version: i32, flags: u64 },
}

impl Lookup {
    /// Parses `proc:<version>:<flags>`, `dlsym:<version>:<flags>`, `default:<version>:<flags>`.
    pub fn parse(s: &str) -> Option<Lookup> {
        let mut it = s.split(':');
        let (kind, version, flags) = (
            it.next()?,
            it.next()?.parse().ok()?,
            it.next()?.parse().ok()?,
        );
        match kind {
            "proc" => Some(Lookup::ProcAddress { version, flags }),
            "dlsym" => Some(Lookup::Dlsym { version, flags }),
            "default" => Some(Lookup::DefaultScope { version, flags }),
            _ => None,
        }
    }

    /// Whether the per-thread-default-stream variants are asked for.
    pub fn per_thread(&self) -> bool {
        let (Lookup::ProcAddress { flags, .. }
        | Lookup::Dlsym { flags, .. }
        | Lookup::DefaultScope { flags, .. }) = *self;
        flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0
    }

    fn version_and_flags(&self) -> (i32, u64) {
        let (Lookup::ProcAddress { version, flags }
        | Lookup::Dlsym { version, flags }
        | Lookup::DefaultScope { version, flags }) = *self;
        (version, flags)
    }
}

/// `CUmemPoolProps` (cuda.h), for `cuMemPoolCreate`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemPoolProps {
    pub alloc_type: u32,
    pub handle_types: u32,
    pub location: CUmemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

macro_rules! driver_table {
    ($( $field:ident = $name:literal @ $min_version:literal : ($($t:ty),*) ; )*) => {
        /// The entry points the workloads call.
        #[allow(non_snake_case)]
        pub struct Driver {
            $( pub $field: unsafe extern "C" fn($($t),*) -> CUresult, )*
            /// The dlopen handle of libcuda.
            pub handle: *mut c_void,
            pub lookup: Lookup,
        }

        impl Driver {
            /// Loads libcuda and fetches every entry point the way `lookup` says.
            pub fn load(lookup: Lookup) -> Result<Driver, String> {
                let handle = open_driver(matches!(lookup, Lookup::DefaultScope { .. }))?;
                let (version, flags) = lookup.version_and_flags();
                let gpa = match lookup {
                    Lookup::ProcAddress { .. } => Some(proc_address_fn(handle)?),
                    _ => None,
                };
                Ok(Driver {
                    $( $field: {
                        // Entry points whose ABI changed after `$min_version` are asked at
                        // that version, so the signature here stays the one called.
                        let v = if $min_version > 0 { $min_version } else { version };
                        let p = fetch(handle, lookup, gpa, $name, v, flags)?;
                        // SAFETY: the driver's function for ($name, v, flags) has this
                        // signature (cudaTypedefs.h).
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> CUresult>(p) }
                    }, )*
                    handle,
                    lookup,
                })
            }
        }
    };
}

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> CUresult;

driver_table! {
    cuInit = "cuInit" @ 0 : (c_uint);
    cuDeviceGet = "cuDeviceGet" @ 0 : (*mut CUdevice, i32);
    cuDevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain" @ 0 : (*mut CUcontext, CUdevice);
    cuCtxSetCurrent = "cuCtxSetCurrent" @ 0 : (CUcontext);
    cuCtxSynchronize = "cuCtxSynchronize" @ 12000 : ();
    cuModuleLoadData = "cuModuleLoadData" @ 0 : (*mut CUmodule, *const c_void);
    cuModuleGetFunction = "cuModuleGetFunction" @ 0 : (*mut CUfunction, CUmodule, *const c_char);
    cuModuleUnload = "cuModuleUnload" @ 0 : (CUmodule);
    cuLibraryLoadData = "cuLibraryLoadData" @ 0 : (*mut CUlibrary, *const c_void, *mut c_void, *mut *mut c_void, c_uint, *mut c_void, *mut *mut c_void, c_uint);
    cuLibraryGetKernel = "cuLibraryGetKernel" @ 0 : (*mut CUkernel, CUlibrary, *const c_char);
    cuMemAlloc = "cuMemAlloc" @ 0 : (*mut CUdeviceptr, usize);
    cuMemAllocPitch = "cuMemAllocPitch" @ 0 : (*mut CUdeviceptr, *mut usize, usize, usize, c_uint);
    cuMemAllocAsync = "cuMemAllocAsync" @ 0 : (*mut CUdeviceptr, usize, CUstream);
    cuMemAllocFromPoolAsync = "cuMemAllocFromPoolAsync" @ 0 : (*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
    cuMemPoolCreate = "cuMemPoolCreate" @ 0 : (*mut CUmemoryPool, *const MemPoolProps);
    cuMemFree = "cuMemFree" @ 0 : (CUdeviceptr);
    cuMemFreeAsync = "cuMemFreeAsync" @ 0 : (CUdeviceptr, CUstream);
    cuMemGetInfo = "cuMemGetInfo" @ 0 : (*mut usize, *mut usize);
    cuIpcGetMemHandle = "cuIpcGetMemHandle" @ 0 : (*mut CUipcMemHandle, CUdeviceptr);
    cuIpcOpenMemHandle = "cuIpcOpenMemHandle" @ 0 : (*mut CUdeviceptr, CUipcMemHandle, c_uint);
    cuIpcCloseMemHandle = "cuIpcCloseMemHandle" @ 0 : (CUdeviceptr);
    cuLaunchKernel = "cuLaunchKernel" @ 0 : (CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void);
    cuLaunchKernelEx = "cuLaunchKernelEx" @ 0 : (*const CUlaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void);
    cuMemcpy = "cuMemcpy" @ 0 : (CUdeviceptr, CUdeviceptr, usize);
    cuMemcpyAsync = "cuMemcpyAsync" @ 0 : (CUdeviceptr, CUdeviceptr, usize, CUstream);
    cuMemcpyHtoD = "cuMemcpyHtoD" @ 0 : (CUdeviceptr, *const c_void, usize);
    cuMemcpyHtoDAsync = "cuMemcpyHtoDAsync" @ 0 : (CUdeviceptr, *const c_void, usize, CUstream);
    cuMemcpyDtoH = "cuMemcpyDtoH" @ 0 : (*mut c_void, CUdeviceptr, usize);
    cuMemcpyDtoHAsync = "cuMemcpyDtoHAsync" @ 0 : (*mut c_void, CUdeviceptr, usize, CUstream);
    cuMemcpyDtoD = "cuMemcpyDtoD" @ 0 : (CUdeviceptr, CUdeviceptr, usize);
    cuMemcpyDtoDAsync = "cuMemcpyDtoDAsync" @ 0 : (CUdeviceptr, CUdeviceptr, usize, CUstream);
    cuMemcpy2D = "cuMemcpy2D" @ 0 : (*const CUDA_MEMCPY2D);
    cuMemcpy2DAsync = "cuMemcpy2DAsync" @ 0 : (*const CUDA_MEMCPY2D, CUstream);
    cuMemsetD8 = "cuMemsetD8" @ 0 : (CUdeviceptr, u8, usize);
    cuMemsetD16 = "cuMemsetD16" @ 0 : (CUdeviceptr, u16, usize);
    cuMemsetD32 = "cuMemsetD32" @ 0 : (CUdeviceptr, u32, usize);
    cuMemsetD8Async = "cuMemsetD8Async" @ 0 : (CUdeviceptr, u8, usize, CUstream);
    cuMemsetD32Async = "cuMemsetD32Async" @ 0 : (CUdeviceptr, u32, usize, CUstream);
    cuStreamCreate = "cuStreamCreate" @ 0 : (*mut CUstream, c_uint);
    cuStreamDestroy = "cuStreamDestroy" @ 0 : (CUstream);
    cuStreamSynchronize = "cuStreamSynchronize" @ 0 : (CUstream);
    cuStreamWaitEvent = "cuStreamWaitEvent" @ 0 : (CUstream, CUevent, c_uint);
    cuEventCreate = "cuEventCreate" @ 0 : (*mut CUevent, c_uint);
    cuEventRecord = "cuEventRecord" @ 0 : (CUevent, CUstream);
    cuEventSynchronize = "cuEventSynchronize" @ 0 : (CUevent);
}

fn open_driver(global: bool) -> Result<*mut c_void, String> {
    let flags = libc::RTLD_NOW
        | if global {
            libc::RTLD_GLOBAL
        } else {
            libc::RTLD_LOCAL
        };
    // SAFETY: a C string literal.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), flags) };
    if h.is_null() {
        return Err("dlopen(libcuda.so.1) failed".into());
    }
    Ok(h)
}

fn proc_address_fn(handle: *mut c_void) -> Result<GetProcAddressV2, String> {
    // SAFETY: a live handle and a C string literal.
    let p = unsafe { libc::dlsym(handle, c"cuGetProcAddress_v2".as_ptr()) };
    if p.is_null() {
        return Err("dlsym(cuGetProcAddress_v2) failed".into());
    }
    // SAFETY: cuGetProcAddress_v2 has this signature.
    Ok(unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV2>(p) })
}

fn fetch(
    handle: *mut c_void,
    lookup: Lookup,
    gpa: Option<GetProcAddressV2>,
    name: &str,
    version: i32,
    flags: u64,
) -> Result<*mut c_void, String> {
    let p = match (lookup, gpa) {
        (Lookup::ProcAddress { .. }, Some(gpa)) => {
            let c = CString::new(name).map_err(|e| e.to_string())?;
            let (mut p, mut status) = (std::ptr::null_mut(), -1);
            // SAFETY: valid C string and out-pointers.
            let r = unsafe { gpa(c.as_ptr(), &mut p, version, flags, &mut status) };
            if r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS {
                return Err(format!(
                    "cuGetProcAddress_v2({name}, {version}, {flags}): {r} / {status}"
                ));
            }
            p
        }
        _ => {
            let symbol = match resolve_proc(name, version, flags) {
                ProcLookup::Found(e) => e.symbol,
                other => return Err(format!("{name}: {other:?}")),
            };
            let c = CString::new(symbol).map_err(|e| e.to_string())?;
            let scope = if matches!(lookup, Lookup::DefaultScope { .. }) {
                libc::RTLD_DEFAULT
            } else {
                handle
            };
            // SAFETY: a live handle (or RTLD_DEFAULT) and a C string.
            unsafe { libc::dlsym(scope, c.as_ptr()) }
        }
    };
    if p.is_null() {
        return Err(format!("{name} not found"));
    }
    Ok(p)
}

/// Panics with the call and the error unless `r` is `CUDA_SUCCESS`.
#[track_caller]
pub fn check(r: CUresult, what: &str) {
    assert_eq!(r, CUDA_SUCCESS, "{what} failed with CUDA error {r}");
}
