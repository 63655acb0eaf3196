//! `cuIpcGetMemHandle`, `cuIpcOpenMemHandle[_v2]` and `cuIpcCloseMemHandle`: arena memory
//! shared with other processes goes through [`crate::ipc`]; everything else is the
//! driver's, forwarded unchanged (a `cuMemAlloc` allocation made without a manager, a
//! handle the driver wrote, a pointer it opened).

use tensile_driver_abi::{
    CUdeviceptr, CUipcMemHandle, CUresult, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE,
    CUDA_SUCCESS,
};

use super::Call;
use crate::ipc::handle::{ExportHandle, Parsed};
use crate::ipc::{exporter, importer};
use crate::syms::pfn;

/// `cuIpcGetMemHandle`: for arena memory, the handle of its allocation, pinned on the
/// device while it is shared ([`exporter::export`]).
///
/// # Safety
/// The driver's contract for `cuIpcGetMemHandle`.
pub unsafe fn ipc_get_mem_handle(
    call: Call<pfn::IpcGetMemHandle>,
    handle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    let Some(m) = call.rt.memory_owning(dptr) else {
        // SAFETY: forwarded unchanged.
        return unsafe { (call.real)(handle, dptr) };
    };
    if handle.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match exporter::export(m, dptr) {
        Ok(h) => {
            // SAFETY: non-null, and valid for a write by the caller's contract.
            unsafe { handle.write(h) };
            CUDA_SUCCESS
        }
        Err(code) => code,
    }
}

/// `cuIpcOpenMemHandle[_v2]`: a libtensile handle is opened by mapping the exporter's
/// units here ([`importer::open`]); any other is the driver's.
///
/// # Safety
/// The driver's contract for `cuIpcOpenMemHandle`.
pub unsafe fn ipc_open_mem_handle(
    call: Call<pfn::IpcOpenMemHandle>,
    dptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: u32,
) -> CUresult {
    match ExportHandle::parse(&handle) {
        // SAFETY: forwarded unchanged.
        Parsed::Foreign => unsafe { (call.real)(dptr, handle, flags) },
        Parsed::OtherVersion(v) => {
            tracing::error!(
                "tensile: cuIpcOpenMemHandle of a libtensile handle of layout version {v}, \
                 which this build does not read (a process of another libtensile build \
                 exported it): CUDA_ERROR_INVALID_HANDLE"
            );
            CUDA_ERROR_INVALID_HANDLE
        }
        Parsed::Ours(h) => {
            if dptr.is_null() {
                return CUDA_ERROR_INVALID_VALUE;
            }
            match importer::open(&call.rt.driver, &h) {
                Ok(p) => {
                    // SAFETY: non-null, and valid for a write by the caller's contract.
                    unsafe { dptr.write(p) };
                    CUDA_SUCCESS
                }
                Err(code) => code,
            }
        }
    }
}

/// `cuIpcCloseMemHandle`: unmaps memory [`ipc_open_mem_handle`] mapped; other pointers go
/// to the driver.
///
/// # Safety
/// The driver's contract for `cuIpcCloseMemHandle`.
pub unsafe fn ipc_close_mem_handle(
    call: Call<pfn::IpcCloseMemHandle>,
    dptr: CUdeviceptr,
) -> CUresult {
    match importer::close(&call.rt.driver, dptr) {
        Some(r) => r,
        // SAFETY: forwarded unchanged.
        None => unsafe { (call.real)(dptr) },
    }
}
