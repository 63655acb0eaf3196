//! Names and descriptions of result codes, for `cuGetErrorName`/`cuGetErrorString` (the
//! strings are NUL-terminated statics because the API hands out `const char*`).

use std::ffi::CStr;

use tensile_driver_abi::*;

static TABLE: &[(CUresult, &CStr, &CStr)] = &[
    (CUDA_SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        CUDA_ERROR_INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        CUDA_ERROR_OUT_OF_MEMORY,
        c"CUDA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        CUDA_ERROR_NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        CUDA_ERROR_DEINITIALIZED,
        c"CUDA_ERROR_DEINITIALIZED",
        c"driver shutting down",
    ),
    (
        CUDA_ERROR_NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        CUDA_ERROR_INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        CUDA_ERROR_INVALID_IMAGE,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        CUDA_ERROR_INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        CUDA_ERROR_ALREADY_MAPPED,
        c"CUDA_ERROR_ALREADY_MAPPED",
        c"resource already mapped",
    ),
    (
        CUDA_ERROR_NOT_MAPPED,
        c"CUDA_ERROR_NOT_MAPPED",
        c"resource not mapped",
    ),
    (
        CUDA_ERROR_INVALID_PTX,
        c"CUDA_ERROR_INVALID_PTX",
        c"a PTX JIT compilation failed",
    ),
    (
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
        c"CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        c"the provided PTX was compiled with an unsupported toolchain.",
    ),
    (
        CUDA_ERROR_INVALID_SOURCE,
        c"CUDA_ERROR_INVALID_SOURCE",
        c"device kernel image is invalid",
    ),
    (
        CUDA_ERROR_INVALID_HANDLE,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        CUDA_ERROR_ILLEGAL_STATE,
        c"CUDA_ERROR_ILLEGAL_STATE",
        c"the operation cannot be performed in the present state",
    ),
    (
        CUDA_ERROR_NOT_FOUND,
        c"CUDA_ERROR_NOT_FOUND",
        c"named symbol not found",
    ),
    (
        CUDA_ERROR_NOT_READY,
        c"CUDA_ERROR_NOT_READY",
        c"device not ready",
    ),
    (
        CUDA_ERROR_ILLEGAL_ADDRESS,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        c"too many resources requested for launch",
    ),
    (
        CUDA_ERROR_LAUNCH_FAILED,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (
        CUDA_ERROR_NOT_PERMITTED,
        c"CUDA_ERROR_NOT_PERMITTED",
        c"operation not permitted",
    ),
    (
        CUDA_ERROR_NOT_SUPPORTED,
        c"CUDA_ERROR_NOT_SUPPORTED",
        c"operation not supported",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        c"operation not permitted when stream is capturing",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        c"operation failed due to a previous error during capture",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
        c"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
        c"capture was not ended in the same stream as it began",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
        c"CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
        c"dependency created on uncaptured work in another stream",
    ),
    (
        CUDA_ERROR_CAPTURED_EVENT,
        c"CUDA_ERROR_CAPTURED_EVENT",
        c"operation not permitted on an event last recorded in a capturing stream",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        c"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        c"attempt to terminate a thread-local capture sequence from another thread",
    ),
    (CUDA_ERROR_UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

/// (name, description) of a known code.
pub fn describe(code: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, s)| (*n, *s))
}
