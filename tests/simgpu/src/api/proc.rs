//! `cuGetProcAddress`: resolving a (base name, CUDA version, flags) question to one of this
//! library's exports, through the driver-abi table generated from `cudaTypedefs.h`.
//!
//! A name the table resolves but this simulator does not implement answers
//! `CUDA_ERROR_NOT_FOUND` with `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`, silently: real
//! runtimes probe hundreds of names. A name that exists only in newer versions answers
//! `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use tensile_driver_abi::*;

use super::context::*;
use super::copy::*;
use super::device::*;
use super::event::*;
use super::graph::*;
use super::guard;
use super::launch::*;
use super::memory::*;
use super::module::*;
use super::pool::*;
use super::stream::*;
use super::vmm::*;

macro_rules! implemented {
    ($($name:ident),* $(,)?) => {
        /// Every exported symbol, by name.
        fn build_table() -> HashMap<&'static str, usize> {
            let mut m = HashMap::new();
            $( m.insert(stringify!($name), $name as *const () as usize); )*
            m
        }
    };
}

implemented!(
    cuMemsetD2D8_v2,
    cuMemsetD2D8_v2_ptds,
    cuMemsetD2D16_v2,
    cuMemsetD2D16_v2_ptds,
    cuMemsetD2D32_v2,
    cuMemsetD2D32_v2_ptds,
    cuMemsetD2D8Async,
    cuMemsetD2D8Async_ptsz,
    cuMemsetD2D16Async,
    cuMemsetD2D16Async_ptsz,
    cuMemsetD2D32Async,
    cuMemsetD2D32Async_ptsz,
    cuMemcpyPeer,
    cuMemcpyPeer_ptds,
    cuMemcpyPeerAsync,
    cuMemcpyPeerAsync_ptsz,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernel_ptsz,
    cuCtxCreate_v2,
    cuCtxCreate_v4,
    cuCtxDestroy_v2,
    cuCtxGetApiVersion,
    cuCtxGetCacheConfig,
    cuCtxGetCurrent,
    cuCtxGetDevice,
    cuCtxGetDevice_v2,
    cuCtxGetFlags,
    cuCtxGetId,
    cuCtxGetLimit,
    cuCtxGetStreamPriorityRange,
    cuCtxPopCurrent_v2,
    cuCtxPushCurrent_v2,
    cuCtxSetCacheConfig,
    cuCtxSetCurrent,
    cuCtxSetFlags,
    cuCtxSetLimit,
    cuCtxSynchronize,
    cuCtxSynchronize_v2,
    cuDeviceComputeCapability,
    cuDeviceGet,
    cuDeviceGetAttribute,
    cuDeviceGetCount,
    cuDeviceGetDefaultMemPool,
    cuDeviceGetMemPool,
    cuDeviceGetName,
    cuDeviceGetPCIBusId,
    cuDeviceGetUuid,
    cuDeviceGetUuid_v2,
    cuDevicePrimaryCtxGetState,
    cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset_v2,
    cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxSetFlags_v2,
    cuDeviceSetMemPool,
    cuDeviceTotalMem_v2,
    cuDriverGetVersion,
    cuEventCreate,
    cuEventDestroy_v2,
    cuEventElapsedTime,
    cuEventElapsedTime_v2,
    cuEventQuery,
    cuEventRecord,
    cuEventRecordWithFlags,
    cuEventRecordWithFlags_ptsz,
    cuEventRecord_ptsz,
    cuEventSynchronize,
    cuFuncGetAttribute,
    cuFuncGetModule,
    cuFuncGetName,
    cuFuncGetParamCount,
    cuFuncGetParamInfo,
    cuFuncSetAttribute,
    cuFuncSetCacheConfig,
    cuGetErrorName,
    cuGetErrorString,
    cuGetExportTable,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    cuInit,
    cuKernelGetAttribute,
    cuKernelGetFunction,
    cuKernelGetName,
    cuKernelGetParamCount,
    cuKernelGetParamInfo,
    cuLaunchHostFunc,
    cuLaunchHostFunc_ptsz,
    cuLaunchKernel,
    cuLaunchKernelEx,
    cuLaunchKernelEx_ptsz,
    cuLaunchKernel_ptsz,
    cuLibraryGetKernel,
    cuLibraryLoadData,
    cuLibraryUnload,
    cuMemAddressFree,
    cuMemAddressReserve,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemAllocHost_v2,
    cuMemAllocPitch_v2,
    cuMemAlloc_v2,
    cuMemAllocManaged,
    cuMemAdvise,
    cuMemAdvise_v2,
    cuMemPrefetchAsync,
    cuMemPrefetchAsync_ptsz,
    cuMemPrefetchAsync_v2,
    cuMemPrefetchAsync_v2_ptsz,
    cuMemCreate,
    cuMemFreeAsync,
    cuMemFreeAsync_ptsz,
    cuMemFreeHost,
    cuMemFree_v2,
    cuMemGetAccess,
    cuMemGetAddressRange_v2,
    cuIpcGetMemHandle,
    cuIpcOpenMemHandle,
    cuIpcOpenMemHandle_v2,
    cuIpcCloseMemHandle,
    cuMemExportToShareableHandle,
    cuMemImportFromShareableHandle,
    cuMemGetAllocationGranularity,
    cuMemGetAllocationPropertiesFromHandle,
    cuMemGetInfo_v2,
    cuMemHostAlloc,
    cuMemHostGetDevicePointer_v2,
    cuMemHostRegister_v2,
    cuMemHostUnregister,
    cuMemMap,
    cuMemPoolCreate,
    cuMemPoolDestroy,
    cuMemPoolGetAttribute,
    cuMemPoolSetAttribute,
    cuMemPoolTrimTo,
    cuMemRelease,
    cuMemRetainAllocationHandle,
    cuMemSetAccess,
    cuMemUnmap,
    cuMemcpy,
    cuMemcpy2DAsync_v2,
    cuMemcpy2DAsync_v2_ptsz,
    cuMemcpy2DUnaligned_v2,
    cuMemcpy2DUnaligned_v2_ptds,
    cuMemcpy2D_v2,
    cuMemcpy2D_v2_ptds,
    cuMemcpyAsync,
    cuMemcpyAsync_ptsz,
    cuMemcpyDtoDAsync_v2,
    cuMemcpyDtoDAsync_v2_ptsz,
    cuMemcpyDtoD_v2,
    cuMemcpyDtoD_v2_ptds,
    cuMemcpyDtoHAsync_v2,
    cuMemcpyDtoHAsync_v2_ptsz,
    cuMemcpyDtoH_v2,
    cuMemcpyDtoH_v2_ptds,
    cuMemcpyHtoDAsync_v2,
    cuMemcpyHtoDAsync_v2_ptsz,
    cuMemcpyHtoD_v2,
    cuMemcpyHtoD_v2_ptds,
    cuMemcpy_ptds,
    cuMemsetD16Async,
    cuMemsetD16Async_ptsz,
    cuMemsetD16_v2,
    cuMemsetD16_v2_ptds,
    cuMemsetD32Async,
    cuMemsetD32Async_ptsz,
    cuMemsetD32_v2,
    cuMemsetD32_v2_ptds,
    cuMemsetD8Async,
    cuMemsetD8Async_ptsz,
    cuMemsetD8_v2,
    cuMemsetD8_v2_ptds,
    cuModuleGetFunction,
    cuModuleGetLoadingMode,
    cuModuleLoadData,
    cuModuleLoadDataEx,
    cuModuleUnload,
    cuPointerGetAttribute,
    cuPointerGetAttributes,
    cuStreamCreate,
    cuStreamCreateWithPriority,
    cuStreamDestroy_v2,
    cuStreamGetCtx,
    cuStreamGetCtx_ptsz,
    cuStreamGetFlags,
    cuStreamGetFlags_ptsz,
    cuStreamGetId,
    cuStreamGetId_ptsz,
    cuStreamGetPriority,
    cuStreamGetPriority_ptsz,
    cuStreamIsCapturing,
    cuStreamIsCapturing_ptsz,
    cuStreamQuery,
    cuStreamQuery_ptsz,
    cuStreamSynchronize,
    cuStreamSynchronize_ptsz,
    cuStreamWaitEvent,
    cuStreamWaitEvent_ptsz,
    cuStreamBeginCapture,
    cuStreamBeginCapture_ptsz,
    cuStreamBeginCapture_v2,
    cuStreamBeginCapture_v2_ptsz,
    cuStreamEndCapture,
    cuStreamEndCapture_ptsz,
    cuStreamGetCaptureInfo,
    cuStreamGetCaptureInfo_ptsz,
    cuStreamGetCaptureInfo_v2,
    cuStreamGetCaptureInfo_v2_ptsz,
    cuStreamGetCaptureInfo_v3,
    cuStreamGetCaptureInfo_v3_ptsz,
    cuThreadExchangeStreamCaptureMode,
    cuGraphInstantiate,
    cuGraphInstantiateWithFlags,
    cuGraphInstantiateWithParams,
    cuGraphInstantiateWithParams_ptsz,
    cuGraphLaunch,
    cuGraphLaunch_ptsz,
    cuGraphUpload,
    cuGraphUpload_ptsz,
    cuGraphExecDestroy,
    cuGraphDestroy,
);

/// The exports of this library, symbol name -> address.
pub fn implemented_symbols() -> &'static HashMap<&'static str, usize> {
    static TABLE: OnceLock<HashMap<&'static str, usize>> = OnceLock::new();
    TABLE.get_or_init(build_table)
}

/// The answer to one question: the symbol's address, or the query result saying why not.
pub fn lookup(
    name: &str,
    version: i32,
    flags: u64,
) -> Result<usize, CUdriverProcAddressQueryResult> {
    match resolve_proc(name, version, flags) {
        ProcLookup::Found(entry) => implemented_symbols()
            .get(entry.symbol)
            .copied()
            .ok_or(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        ProcLookup::VersionNotSufficient => Err(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
        ProcLookup::NotFound => Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
    }
}

/// # Safety
/// `symbol`: NULL or NUL-terminated; `pfn`, `status`: NULL or writable.
unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> Result<(), CUresult> {
    if symbol.is_null() || pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and NUL-terminated (API contract).
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let (result, address, code) = match lookup(name, version, flags) {
        Ok(addr) => (CU_GET_PROC_ADDRESS_SUCCESS, addr, Ok(())),
        Err(why) => (why, 0, Err(CUDA_ERROR_NOT_FOUND)),
    };
    // SAFETY: `pfn` is non-NULL and writable (API contract).
    unsafe { pfn.write_unaligned(address as *mut c_void) };
    if !status.is_null() {
        // SAFETY: non-NULL and writable (API contract).
        unsafe { status.write_unaligned(result) };
    }
    code
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    guard(|| {
        // SAFETY: forwarded under this entry point's API contract.
        unsafe { get_proc_address(symbol, pfn, version, flags, status) }
    })
}

/// The CUDA 11.3 form, without the status output.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    guard(|| {
        // SAFETY: forwarded under this entry point's API contract.
        unsafe { get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut()) }
    })
}

/// NVIDIA's private export tables are not simulated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    _id: *const c_void,
) -> CUresult {
    guard(|| {
        if !table.is_null() {
            // SAFETY: non-NULL and writable (API contract).
            unsafe { table.write_unaligned(std::ptr::null()) };
        }
        Err(CUDA_ERROR_NOT_FOUND)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table lists exactly the functions the `api` modules export.
    #[test]
    fn table_lists_every_export() {
        let sources = [
            include_str!("context.rs"),
            include_str!("copy.rs"),
            include_str!("device.rs"),
            include_str!("event.rs"),
            include_str!("graph.rs"),
            include_str!("launch.rs"),
            include_str!("memory.rs"),
            include_str!("module.rs"),
            include_str!("pool.rs"),
            include_str!("proc.rs"),
            include_str!("stream.rs"),
            include_str!("vmm.rs"),
        ];
        let mut exported = std::collections::BTreeSet::new();
        for src in sources {
            let code = src.split("#[cfg(test)]").next().unwrap_or(src);
            let words: Vec<&str> = code
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '!'))
                .filter(|w| !w.is_empty())
                .collect();
            for (i, w) in words.iter().enumerate() {
                match *w {
                    "export!" => {
                        exported.insert(words[i + 1]);
                    }
                    "per_thread_pair!" => {
                        exported.insert(words[i + 1]);
                        exported.insert(words[i + 2]);
                    }
                    "fn" if words[i + 1].starts_with("cu") && i >= 1 && words[i - 1] == "C" => {
                        exported.insert(words[i + 1]);
                    }
                    _ => {}
                }
            }
        }
        let table: std::collections::BTreeSet<&str> =
            implemented_symbols().keys().copied().collect();
        let missing: Vec<_> = exported.difference(&table).collect();
        let extra: Vec<_> = table.difference(&exported).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "not in table: {missing:?}; not exported: {extra:?}"
        );
    }
}
