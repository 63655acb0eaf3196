//! C types and constants of the driver API (values from CUDA 13's `cuda.h`).
#![allow(non_camel_case_types, non_upper_case_globals, missing_docs)]

use std::ffi::c_void;

/// A driver result code. Kept as an integer: see the crate docs.
pub type CUresult = u32;
pub type CUdevice = i32;
pub type CUdeviceptr = u64;
pub type CUmemGenericAllocationHandle = u64;
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUhostFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_ALREADY_MAPPED: CUresult = 208;
pub const CUDA_ERROR_NOT_MAPPED: CUresult = 211;
pub const CUDA_ERROR_INVALID_PTX: CUresult = 218;
pub const CUDA_ERROR_UNSUPPORTED_PTX_VERSION: CUresult = 222;
pub const CUDA_ERROR_INVALID_SOURCE: CUresult = 300;
pub const CUDA_ERROR_OPERATING_SYSTEM: CUresult = 304;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const CUDA_ERROR_LAUNCH_FAILED: CUresult = 719;
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;
pub const CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: CUresult = 903;
pub const CUDA_ERROR_STREAM_CAPTURE_ISOLATION: CUresult = 905;
pub const CUDA_ERROR_CAPTURED_EVENT: CUresult = 907;
pub const CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: CUresult = 908;

/// `CUstreamCaptureMode`.
pub type CUstreamCaptureMode = u32;
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: CUstreamCaptureMode = 0;
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: CUstreamCaptureMode = 1;
pub const CU_STREAM_CAPTURE_MODE_RELAXED: CUstreamCaptureMode = 2;
/// `CUstreamCaptureStatus`.
pub type CUstreamCaptureStatus = u32;
pub const CU_STREAM_CAPTURE_STATUS_NONE: CUstreamCaptureStatus = 0;
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: CUstreamCaptureStatus = 1;
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: CUstreamCaptureStatus = 2;
/// `CU_EVENT_WAIT_EXTERNAL`: a wait captured as an external event wait node.
pub const CU_EVENT_WAIT_EXTERNAL: u32 = 0x1;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` are handle values, not real streams.
pub const CU_STREAM_LEGACY: usize = 0x1;
pub const CU_STREAM_PER_THREAD: usize = 0x2;

pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
pub type CUdriverProcAddressQueryResult = i32;
pub const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

/// Markers of the `extra` argument of `cuLaunchKernel` (`void*` values in C).
pub const CU_LAUNCH_PARAM_END: usize = 0x00;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;

pub type CUdevice_attribute = i32;
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: i32 = 1;
pub const CU_DEVICE_ATTRIBUTE_WARP_SIZE: i32 = 10;
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: i32 = 16;
pub const CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: i32 = 40;
pub const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: i32 = 41;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: i32 = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: i32 = 76;
pub const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: i32 = 102;
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: i32 = 115;

pub type CUpointer_attribute = i32;
pub const CU_POINTER_ATTRIBUTE_CONTEXT: i32 = 1;
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: i32 = 2;
pub const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: i32 = 3;
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: i32 = 11;
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: i32 = 12;
pub const CU_POINTER_ATTRIBUTE_MAPPED: i32 = 13;

pub type CUmemorytype = u32;
pub const CU_MEMORYTYPE_HOST: u32 = 1;
pub const CU_MEMORYTYPE_DEVICE: u32 = 2;
pub const CU_MEMORYTYPE_ARRAY: u32 = 3;
pub const CU_MEMORYTYPE_UNIFIED: u32 = 4;

pub type CUmemLocationType = u32;
pub const CU_MEM_LOCATION_TYPE_INVALID: u32 = 0;
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: u32 = 2;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: u32 = 3;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: u32 = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: u32 = 0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: u32 = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: u32 = 3;
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: u32 = 0;
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: u32 = 1;
/// `CUmemAllocationHandleType`: which shareable handles a physical allocation may be
/// exported as (`CUmemAllocationProp::requested_handle_types`, a bit set).
pub type CUmemAllocationHandleType = u32;
pub const CU_MEM_HANDLE_TYPE_NONE: u32 = 0;
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: u32 = 1;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: the one flag of `cuIpcOpenMemHandle`.
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 1;

pub const CU_EVENT_DEFAULT: u32 = 0;
pub const CU_EVENT_BLOCKING_SYNC: u32 = 1;
pub const CU_EVENT_DISABLE_TIMING: u32 = 2;
pub const CU_STREAM_DEFAULT: u32 = 0;
pub const CU_STREAM_NON_BLOCKING: u32 = 1;

/// `CUmemLocation` (the `id` union is an `int` in every variant that matters here).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemLocation {
    pub type_: CUmemLocationType,
    pub id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemAllocFlags {
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp` (v1).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAllocationProp {
    pub type_: u32,
    pub requested_handle_types: u32,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: CUmemAllocFlags,
}

impl CUmemAllocationProp {
    /// Pinned memory at `location`, no shareable handle: what both the shim and tests create.
    pub fn pinned(location: CUmemLocation) -> Self {
        Self {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: 0,
            location,
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: CUmemAllocFlags::default(),
        }
    }
}

/// `CUmemAccessDesc` (v1).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: u32,
}

/// `CUlaunchAttribute`: an id, padding to 8 bytes, and a 64-byte value union.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUlaunchAttribute {
    pub id: u32,
    pub pad: [u8; 4],
    pub value: [u64; 8],
}

/// `CUlaunchConfig`, the first argument of `cuLaunchKernelEx`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUlaunchConfig {
    pub grid_dim_x: u32,
    pub grid_dim_y: u32,
    pub grid_dim_z: u32,
    pub block_dim_x: u32,
    pub block_dim_y: u32,
    pub block_dim_z: u32,
    pub shared_mem_bytes: u32,
    pub h_stream: CUstream,
    pub attrs: *mut CUlaunchAttribute,
    pub num_attrs: u32,
}

/// `CUipcMemHandle`: an opaque handle another process opens to use an allocation.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [u8; 64],
}

/// `CUDA_MEMCPY2D` (v2).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_MEMCPY2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: CUmemorytype,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: CUmemorytype,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // Layouts checked against cuda.h on x86-64 (what `offsetof` gives there).
    #[test]
    fn struct_layouts_match_cuda_h() {
        assert_eq!(size_of::<CUmemLocation>(), 8);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, win32_handle_meta_data), 16);
        assert_eq!(size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(size_of::<CUlaunchAttribute>(), 72);
        assert_eq!(offset_of!(CUlaunchConfig, h_stream), 32);
        assert_eq!(offset_of!(CUlaunchConfig, attrs), 40);
        assert_eq!(size_of::<CUlaunchConfig>(), 56);
        assert_eq!(size_of::<CUDA_MEMCPY2D>(), 128);
    }
}
