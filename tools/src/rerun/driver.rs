//! The driver entry points the rerun player calls, found the way libcudart finds them:
//! `dlopen("libcuda.so.1")`, then `cuGetProcAddress_v2` for each by base name. Under
//! `LD_PRELOAD=libtensile.so` that lookup returns the library's hooks, exactly as for PyTorch.
//!
//! Not here: what to call when (that is [`super::player`]).

use std::ffi::{c_char, c_uint, c_void, CString};

use tensile_driver_abi::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUmodule, CUresult, CUstream,
    CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS,
};

/// The CUDA version the entry points are asked at (the ABI of every signature below).
const API_VERSION: i32 = 12000;

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> CUresult;

macro_rules! driver_table {
    ($( $field:ident = $name:literal : ($($t:ty),*) ; )*) => {
        /// The entry points the player calls.
        #[allow(non_snake_case)]
        pub struct Driver {
            $( pub $field: unsafe extern "C" fn($($t),*) -> CUresult, )*
        }

        impl Driver {
            /// Loads libcuda and looks every entry point up.
            pub fn load() -> Result<Driver, String> {
                let gpa = proc_address_fn()?;
                Ok(Driver {
                    $( $field: {
                        let p = fetch(gpa, $name)?;
                        // SAFETY: the driver's function for ($name, API_VERSION) has this
                        // signature (cudaTypedefs.h).
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> CUresult>(p)
                        }
                    }, )*
                })
            }
        }
    };
}

driver_table! {
    cuInit = "cuInit" : (c_uint);
    cuDeviceGet = "cuDeviceGet" : (*mut CUdevice, i32);
    cuDevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain" : (*mut CUcontext, CUdevice);
    cuCtxSetCurrent = "cuCtxSetCurrent" : (CUcontext);
    cuCtxSynchronize = "cuCtxSynchronize" : ();
    cuModuleLoadData = "cuModuleLoadData" : (*mut CUmodule, *const c_void);
    cuModuleGetFunction = "cuModuleGetFunction" : (*mut CUfunction, CUmodule, *const c_char);
    cuMemAlloc = "cuMemAlloc" : (*mut CUdeviceptr, usize);
    cuMemAllocAsync = "cuMemAllocAsync" : (*mut CUdeviceptr, usize, CUstream);
    cuMemFree = "cuMemFree" : (CUdeviceptr);
    cuMemFreeAsync = "cuMemFreeAsync" : (CUdeviceptr, CUstream);
    cuMemHostAlloc = "cuMemHostAlloc" : (*mut *mut c_void, usize, c_uint);
    cuMemcpyHtoD = "cuMemcpyHtoD" : (CUdeviceptr, *const c_void, usize);
    cuMemcpyHtoDAsync = "cuMemcpyHtoDAsync" : (CUdeviceptr, *const c_void, usize, CUstream);
    cuMemcpyDtoH = "cuMemcpyDtoH" : (*mut c_void, CUdeviceptr, usize);
    cuMemcpyDtoHAsync = "cuMemcpyDtoHAsync" : (*mut c_void, CUdeviceptr, usize, CUstream);
    cuLaunchKernel = "cuLaunchKernel" : (CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void);
    cuStreamCreate = "cuStreamCreate" : (*mut CUstream, c_uint);
    cuStreamSynchronize = "cuStreamSynchronize" : (CUstream);
    cuStreamWaitEvent = "cuStreamWaitEvent" : (CUstream, CUevent, c_uint);
    cuEventCreate = "cuEventCreate" : (*mut CUevent, c_uint);
    cuEventRecord = "cuEventRecord" : (CUevent, CUstream);
}

fn proc_address_fn() -> Result<GetProcAddressV2, String> {
    // SAFETY: a C string literal; the handle stays open for the life of the process.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err("cannot load libcuda.so.1 (dlopen failed)".into());
    }
    // SAFETY: a live handle and a C string literal.
    let p = unsafe { libc::dlsym(h, c"cuGetProcAddress_v2".as_ptr()) };
    if p.is_null() {
        return Err("libcuda.so.1 has no cuGetProcAddress_v2".into());
    }
    // SAFETY: cuGetProcAddress_v2 has this signature (cuda.h).
    Ok(unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV2>(p) })
}

fn fetch(gpa: GetProcAddressV2, name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|e| e.to_string())?;
    let (mut p, mut status) = (std::ptr::null_mut(), -1);
    // SAFETY: a valid C string and out-pointers that live across the call.
    let r = unsafe { gpa(c.as_ptr(), &mut p, API_VERSION, 0, &mut status) };
    if r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || p.is_null() {
        return Err(format!(
            "cuGetProcAddress({name}) failed: CUDA error {r}, status {status}"
        ));
    }
    Ok(p)
}

/// `Ok` for `CUDA_SUCCESS`, else an error naming the call.
pub fn check(r: CUresult, what: &str) -> Result<(), String> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed with CUDA error {r}"))
    }
}
